"""The task state machine: every move from the state it starts from, or loudly not at all."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from console import lifecycle
from console.models import (
    APPROVAL_MOVES,
    NOTICE_MOVES,
    RESTART_LOOP,
    Approval,
    ApprovalState,
    Notice,
    NoticeState,
    NotificationChannel,
    Operation,
    OperationEvent,
    Phase,
    StopReport,
    Task,
    TaskState,
    TraceEvent,
)
from console.store import open_store
from guard import Call, Guard, Kind, Limits, Nudge, Reason, Result, State

pytestmark = pytest.mark.django_db

Start = Callable[..., Task]


def _running(task: Task, owner: str = "driver-a") -> Task:
    with transaction.atomic():
        taken = lifecycle.start_drive(task.id, owner, lease_seconds=30)
    assert isinstance(taken, Task)
    return taken


def test_a_driver_that_lost_the_lease_cannot_record_its_stop(start: Start) -> None:
    task = _running(start("test_reader", {"pages": 2}))
    Task.objects.filter(id=task.id).update(lease_owner="driver-b")
    report = lifecycle.report_from_task(task, State.COMPLETED, Reason.GOAL_MET)

    with pytest.raises(lifecycle.LostRace, match="no longer driven by this driver"):
        lifecycle.finish_drive(task.id, "driver-a", report)

    assert Task.objects.get(id=task.id).state == TaskState.RUNNING
    assert not StopReport.objects.filter(task=task).exists()
    assert not TraceEvent.objects.filter(task=task, kind="stop").exists()


def test_a_stop_requested_on_a_task_that_finished_meanwhile_is_refused(
    start: Start, operator: User
) -> None:
    seen = _running(start("test_reader", {"pages": 2}))
    report = lifecycle.report_from_task(seen, State.COMPLETED, Reason.GOAL_MET)
    lifecycle.finish_drive(seen.id, "driver-a", report)

    with pytest.raises(lifecycle.LostRace, match="no longer RUNNING"):
        lifecycle.request_stop(seen, actor=operator, note="too late")

    task = Task.objects.get(id=seen.id)
    assert (task.state, task.stop_requested_at) == (TaskState.COMPLETED, None)


def test_a_resumption_approved_twice_from_the_same_view_opens_one_phase(
    start: Start, operator: User
) -> None:
    task = start("test_reader", {"pages": 2})
    with transaction.atomic():
        lifecycle.cancel(task, actor=operator, note="wrong input")
    seen = Task.objects.get(id=task.id)
    lifecycle.resume(seen, actor=operator, note="fixed", grant={}, limits=seen.limits)

    with pytest.raises(lifecycle.LostRace):
        lifecycle.resume(seen, actor=operator, note="fixed", grant={}, limits=seen.limits)

    assert Phase.objects.filter(task=task).count() == 2
    assert Task.objects.get(id=task.id).state == TaskState.QUEUED


@pytest.mark.parametrize("state", [TaskState.QUEUED, TaskState.COMPLETED])
def test_a_move_from_a_state_the_table_does_not_allow_is_refused(start: Start, state: str) -> None:
    task = start("test_reader", {"pages": 2})
    Task.objects.filter(id=task.id).update(
        state=state, reason="" if state == TaskState.QUEUED else "goal_met"
    )
    task.refresh_from_db()

    with pytest.raises(lifecycle.LostRace, match="cannot requeue"):
        lifecycle.requeue(task)

    assert Task.objects.get(id=task.id).state == state


def test_a_lost_driver_is_recovered_before_a_new_one_takes_over(start: Start) -> None:
    task = _running(start("test_reader", {"pages": 2}), owner="gone")
    Task.objects.filter(id=task.id).update(lease_expires_at=timezone.now() - timedelta(seconds=1))

    taken = _running(task, owner="driver-b")

    assert (taken.state, taken.lease_owner, taken.recoveries) == (TaskState.RUNNING, "driver-b", 1)


def test_the_moves_start_from_the_states_the_product_promises() -> None:
    moves = lifecycle.TASK_MOVES
    assert moves["finish"][0] == {TaskState.RUNNING}
    assert TaskState.COMPLETED not in moves["resume"][0]  # completed is final
    assert moves["cancel"][1] == {TaskState.CANCELLED}
    # Cancelled before it ran: queued, or held; a task that stopped after running keeps its end.
    assert moves["cancel"].leaves(TaskState.QUEUED, "")
    assert moves["cancel"].leaves(TaskState.NEEDS_HUMAN, RESTART_LOOP)
    assert not moves["cancel"].leaves(TaskState.NEEDS_HUMAN, Reason.UNKNOWN_COMMIT)
    # Only a task that waits for a call's answer is closed by its rejection.
    assert moves["close"].leaves(TaskState.NEEDS_HUMAN, Reason.APPROVAL_REQUIRED)
    assert not moves["close"].leaves(TaskState.NEEDS_HUMAN, Reason.PRECONDITION)


STOPPED_FOR = [
    RESTART_LOOP,
    Reason.UNKNOWN_COMMIT,
    Reason.APPROVAL_REQUIRED,
    Reason.PRECONDITION,
    "client_lost",
]


@pytest.mark.parametrize("reason", STOPPED_FOR)
def test_a_stopped_task_is_cancelled_only_if_it_was_held_before_it_ran(
    start: Start, operator: User, reason: str
) -> None:
    task = start("test_reader", {"pages": 1})
    Task.objects.filter(id=task.id).update(state=TaskState.NEEDS_HUMAN, reason=reason)
    seen = Task.objects.get(id=task.id)

    try:
        with transaction.atomic():
            lifecycle.cancel(seen, actor=operator, note="not wanted")
        cancelled = True
    except lifecycle.LostRace:
        cancelled = False

    assert cancelled is (reason == RESTART_LOOP)
    assert cancelled is seen.can_cancel  # the page offers Cancel exactly there
    task.refresh_from_db()
    if cancelled:
        assert (task.state, task.reason) == (TaskState.CANCELLED, Reason.OPERATOR_STOP)
    else:
        assert (task.state, task.reason, task.stop_requested_at) == (
            TaskState.NEEDS_HUMAN,
            reason,
            None,
        )
        assert not StopReport.objects.filter(task=task).exists()


@pytest.mark.parametrize("reason", STOPPED_FOR)
def test_only_a_task_waiting_for_a_call_s_answer_is_closed_by_a_rejection(
    start: Start, reason: str
) -> None:
    task = start("test_reader", {"pages": 1})
    Task.objects.filter(id=task.id).update(state=TaskState.NEEDS_HUMAN, reason=reason)
    seen = Task.objects.get(id=task.id)

    try:
        with transaction.atomic():
            lifecycle.close(seen, detail="a person rejected the call")
        closed = True
    except lifecycle.LostRace:
        closed = False

    assert closed is (reason == Reason.APPROVAL_REQUIRED) is seen.waits_for_approval
    task.refresh_from_db()
    assert task.state == (TaskState.PARTIAL if closed else TaskState.NEEDS_HUMAN)


def test_an_operation_moves_only_from_a_state_its_move_may_leave_and_from_the_state_seen(
    start: Start,
) -> None:
    task = start("test_notices", {"count": 1})
    store = open_store(task.id, "driver-a")
    store.take_lease(30)
    store.claim("k-1", "f" * 64, tool="send_notice", args="{}")
    seen = Operation.objects.get(key="k-1")  # IN_FLIGHT, as a slow reader saw it
    lifecycle.operation_move(Operation.objects.get(key="k-1"), "lose", task_id=task.id)

    with pytest.raises(lifecycle.LostRace, match="UNKNOWN, cannot become COMMITTED"):
        lifecycle.operation_move(Operation.objects.get(key="k-1"), "record", task_id=task.id)
    with pytest.raises(lifecycle.LostRace, match="no longer IN_FLIGHT"):
        lifecycle.operation_move(seen, "lose", task_id=task.id)

    assert Operation.objects.get(key="k-1").state == "UNKNOWN"
    moves = OperationEvent.objects.filter(operation__key="k-1").values_list(
        "from_state", "to_state"
    )
    assert list(moves.order_by("id")) == [("", "IN_FLIGHT"), ("IN_FLIGHT", "UNKNOWN")]


# -- approvals and notices -------------------------------------------------------------------


def _approval(task: Task, state: str) -> Approval:
    answered = state != ApprovalState.PENDING
    return Approval.objects.create(
        task=task,
        phase=1,
        tool="refund",
        effect="write",
        fingerprint="f" * 64,
        state=state,
        decided_at=timezone.now() if answered else None,
        reason="answered before" if answered else "",
    )


@pytest.mark.parametrize("state", ApprovalState.values)
@pytest.mark.parametrize("move", sorted(APPROVAL_MOVES))
def test_an_approval_is_answered_from_exactly_the_states_its_table_allows(
    start: Start, operator: User, move: str, state: str
) -> None:
    approval = _approval(start("test_reader", {"pages": 1}), state)
    sources, target = APPROVAL_MOVES[move]

    try:
        lifecycle.approval_move(approval, move, actor=operator, reason="checked the order")
        moved = True
    except lifecycle.LostRace:
        moved = False

    row = Approval.objects.get(id=approval.id)
    assert moved is (state in sources)
    assert row.state == (target if moved else state)
    assert row.reason == ("checked the order" if moved else approval.reason)
    assert row.decided_by_id == (operator.id if moved else None)


def test_an_approval_answered_meanwhile_keeps_its_first_answer(
    start: Start, operator: User
) -> None:
    approval = _approval(start("test_reader", {"pages": 1}), ApprovalState.PENDING)
    stale = Approval.objects.get(id=approval.id)  # a second person's view, still pending
    lifecycle.approval_move(approval, "approve", actor=operator, reason="fine")

    with pytest.raises(lifecycle.LostRace, match="no longer PENDING"):
        lifecycle.approval_move(stale, "reject", actor=operator, reason="no", on_reject="end")

    row = Approval.objects.get(id=approval.id)
    assert (row.state, row.reason, row.on_reject) == (ApprovalState.APPROVED, "fine", "")


def _notice(state: str, attempts: int = 1) -> Notice:
    channel = NotificationChannel.objects.create(
        name="ops", transport="email", address="ops@example.com", kinds=["needs_human"]
    )
    return Notice.objects.create(
        channel=channel, kind="needs_human", payload={}, state=state, attempts=attempts
    )


@pytest.mark.parametrize("state", NoticeState.values)
@pytest.mark.parametrize("move", sorted(NOTICE_MOVES))
def test_a_notice_moves_from_exactly_the_states_its_table_allows(move: str, state: str) -> None:
    notice = _notice(state)
    sources, target = NOTICE_MOVES[move]

    moved = lifecycle.notice_move(notice, move)

    assert moved is (state in sources)
    assert Notice.objects.get(id=notice.id).state == (target if moved else state)


def test_a_worker_whose_claim_was_taken_over_moves_the_notice_no_more() -> None:
    mine = _notice(NoticeState.SENDING, attempts=1)
    theirs = Notice.objects.get(id=mine.id)
    # My claim ran out; another worker claims the notice for the next try.
    assert lifecycle.notice_move(theirs, "claim", attempts=2)

    assert not lifecycle.notice_move(mine, "sent", sent_at=timezone.now(), claimed_until=None)

    row = Notice.objects.get(id=mine.id)
    assert (row.state, row.attempts, row.sent_at) == (NoticeState.SENDING, 2, None)


def test_a_notice_of_a_removed_channel_is_not_claimed() -> None:
    notice = _notice(NoticeState.PENDING, attempts=0)
    NotificationChannel.objects.filter(id=notice.channel_id).update(active=False)

    claimed = lifecycle.notice_move(notice, "claim", when=Q(channel__active=True), attempts=1)

    assert not claimed
    row = Notice.objects.get(id=notice.id)
    assert (row.state, row.attempts) == (NoticeState.PENDING, 0)


def test_both_drivers_restore_a_guard_by_one_rule_its_phase_and_the_rows_counters(
    start: Start,
) -> None:
    task = start("test_reader", {"pages": 2})
    # A guard of phase 1 that has seen one call twice: a third is a repeat it remembers.
    seen = Guard(Limits(same=2))
    for _ in range(2):
        assert seen.before_model() is None
        (ticket,) = seen.before_tools(Call("read_page", {"page": 1}, "read"))
        seen.before_tool(ticket)
        seen.after_tool(ticket, Result(Kind.SUCCESS, "page 1"), inspect=None)
    task.checkpoint = {"phase": task.phase, "guard": seen.checkpoint(history=False)}
    task.model_calls, task.elapsed_ms = 5, 1_000  # the row is never behind the checkpoint
    no_history = {"touched": [], "completed": []}

    same = lifecycle.guard_of(task, {"nudge": True}, history=lambda: no_history, elapsed_ms=250)
    assert lifecycle.of_this_phase(task)
    assert (same.usage.model_calls, same.usage.elapsed_ms) == (5, 1_250)
    assert same.before_model() is None
    assert isinstance(same.before_tools(Call("read_page", {"page": 1}, "read")), Nudge)

    task.phase += 1  # an approved resumption: the checkpoint is of the phase before
    fresh = lifecycle.guard_of(task, {"nudge": True}, history=lambda: no_history)
    assert not lifecycle.of_this_phase(task)
    assert fresh.usage.model_calls == 5  # budgets carry over,
    assert fresh.before_model() is None  # repeat memory starts afresh
    assert isinstance(fresh.before_tools(Call("read_page", {"page": 1}, "read")), list)
