"""The task state machine: every move from the state it starts from, or loudly not at all."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone

from console import lifecycle
from console.models import Operation, OperationEvent, Phase, StopReport, Task, TaskState, TraceEvent
from console.store import open_store
from guard import Reason, State

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
