"""The runner drives one task at a time, persists every step and survives what goes wrong."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import DatabaseError, connection, connections
from django.utils import timezone

from console import services
from console.demo.models import Notice
from console.drivers import runner
from console.drivers.ledger import DatabaseLedger
from console.models import (
    Operation,
    OperationState,
    Phase,
    StopReport,
    Task,
    TaskState,
    TraceEvent,
)
from console.store import postgresql, statements
from tests.console.doubt import settle_sent_and_resume
from tests.databases import cut_own_session

pytestmark = pytest.mark.django_db(transaction=True)

Start = Callable[..., Task]


def _events(task: Task) -> list[tuple[str, str, str]]:
    return list(
        TraceEvent.objects.filter(task=task).order_by("seq").values_list("kind", "decision", "tool")
    )


def test_a_task_runs_to_completion_with_every_step_in_its_trace(start: Start) -> None:
    task = start("test_reader", {"pages": 3})

    outcome = runner.drive(task.id)

    task.refresh_from_db()
    assert outcome == "COMPLETED/goal_met"
    assert (task.state, task.reason) == (TaskState.COMPLETED, "goal_met")
    assert (task.model_calls, task.requests, task.executions, task.revision) == (3, 3, 3, 3)
    assert task.tokens == 30  # the planner reported 10 per model call
    assert _events(task) == [
        ("model_call", "planned", ""),
        ("request", "executed", "read_page"),
        ("model_call", "planned", ""),
        ("request", "executed", "read_page"),
        ("model_call", "planned", ""),
        ("request", "executed", "read_page"),
        ("stop", "", ""),
    ]
    seqs = list(TraceEvent.objects.filter(task=task).order_by("seq").values_list("seq", flat=True))
    assert seqs == list(range(1, 8))
    report = StopReport.objects.get(task=task)
    assert report.report["state"] == "COMPLETED"
    assert report.report["remaining_budget"]["model_calls"] == task.limits["model_calls"] - 3
    assert task.lease_owner == ""
    assert Phase.objects.get(task=task, number=1).state == "COMPLETED"


def test_a_second_driver_finds_the_lease_held_and_does_nothing(start: Start) -> None:
    task = start("test_reader", {"pages": 2})
    Task.objects.filter(id=task.id).update(
        lease_owner="elsewhere:1", lease_expires_at=timezone.now() + timedelta(minutes=1)
    )

    outcome = runner.drive(task.id)

    task.refresh_from_db()
    assert outcome.startswith("another driver holds the lease")
    assert task.state == TaskState.QUEUED
    assert task.executions == 0
    assert not TraceEvent.objects.filter(task=task).exists()


def test_a_finished_task_is_not_driven_again(start: Start) -> None:
    task = start("test_reader", {"pages": 1})
    runner.drive(task.id)
    before = TraceEvent.objects.filter(task=task).count()

    outcome = runner.drive(task.id)

    assert outcome == "nothing to do: the task is COMPLETED"
    assert TraceEvent.objects.filter(task=task).count() == before


def test_a_lost_write_settled_by_its_lookup_goes_on_without_a_human(start: Start) -> None:
    task = start("test_notices", {"count": 2, "lose": 1})

    runner.drive(task.id)

    task.refresh_from_db()
    assert (task.state, task.reason) == (TaskState.COMPLETED, "goal_met")
    assert Notice.objects.filter(idempotency_key__startswith=f"task-{task.id}-").count() == 2
    assert set(Operation.objects.filter(task=task).values_list("state", flat=True)) == {
        OperationState.COMMITTED
    }


def test_resumption_after_reconciliation_keeps_counters_and_never_repeats_the_write(
    start: Start, operator: User
) -> None:
    task = start("test_notices", {"count": 2, "lose": 1, "auto_lookup": False})
    runner.drive(task.id)
    task.refresh_from_db()
    key = f"task-{task.id}-notice-1"
    assert (task.state, task.reason) == (TaskState.NEEDS_HUMAN, "executor_error")
    assert Operation.objects.get(key=key).state == OperationState.UNKNOWN
    spent = (task.model_calls, task.requests, task.executions)

    with pytest.raises(services.Refused, match=key):
        services.task_approve_resumption(
            task_id=task.id, actor=operator, reason="go on", enqueue=lambda i: None
        )
    settle_sent_and_resume(task, key, operator)
    runner.drive(task.id)

    task.refresh_from_db()
    assert (task.state, task.reason) == (TaskState.COMPLETED, "goal_met")
    assert task.phase == 2
    assert task.model_calls > spent[0] and task.executions > spent[2]
    phase2 = Phase.objects.get(task=task, number=2)
    assert phase2.usage_at_start["model_calls"] == spent[0]
    assert phase2.usage_at_start["executions"] == spent[2]
    assert Notice.objects.filter(idempotency_key=key).count() == 1
    assert Operation.objects.get(key=key).attempts == 1  # never claimed again


def test_budgets_carry_over_and_a_spent_budget_needs_an_explicit_grant(
    start: Start, operator: User
) -> None:
    task = start("test_reader", {"pages": 5}, model_calls=2)
    runner.drive(task.id)
    task.refresh_from_db()
    assert (task.state, task.reason, task.model_calls) == (TaskState.PARTIAL, "model_budget", 2)

    with pytest.raises(services.Refused, match="ran out of model calls"):
        services.task_approve_resumption(
            task_id=task.id, actor=operator, reason="more", enqueue=lambda i: None
        )
    services.task_approve_resumption(
        task_id=task.id,
        actor=operator,
        reason="two more",
        grant={"model_calls": 2},
        enqueue=lambda i: None,
    )
    runner.drive(task.id)

    task.refresh_from_db()
    assert (task.state, task.reason) == (TaskState.PARTIAL, "model_budget")
    assert (task.model_calls, task.executions, task.revision) == (4, 4, 4)
    assert task.limits["model_calls"] == 4


def test_a_stop_recorded_before_the_driver_starts_runs_nothing(
    start: Start, operator: User
) -> None:
    task = start("test_reader", {"pages": 3})
    Task.objects.filter(id=task.id).update(stop_requested_at=timezone.now())

    outcome = runner.drive(task.id)

    task.refresh_from_db()
    assert outcome == "stopped before it ran"
    assert (task.state, task.reason, task.executions) == (
        TaskState.CANCELLED,
        "operator_stop",
        0,
    )


def test_an_operator_stop_wakes_a_waiting_driver_within_a_second(
    start: Start, operator: User
) -> None:
    task = start("test_waiter", {"wait_ms": 20_000}, deadline_ms=120_000)
    thread = threading.Thread(target=_drive_in_thread, args=(task.id,))
    thread.start()
    try:
        _until(lambda: TraceEvent.objects.filter(task=task, kind="wait").exists())
        executions = Task.objects.get(id=task.id).executions
        stopped_at = time.monotonic()
        services.task_stop(task_id=task.id, actor=operator, reason="taking too long")
        _until(lambda: Task.objects.get(id=task.id).state == TaskState.CANCELLED, timeout=5)
        latency = time.monotonic() - stopped_at
    finally:
        thread.join(timeout=10)
    task.refresh_from_db()
    assert latency < 1.0
    assert task.reason == "operator_stop"
    assert task.executions == executions


def test_an_unreachable_database_at_the_claim_means_nothing_executes(
    start: Start, monkeypatch: pytest.MonkeyPatch
) -> None:
    task = start("test_notices", {"count": 2})
    real_claim = DatabaseLedger.claim
    cut: list[str] = []

    def claim_after_losing_the_connection(self: DatabaseLedger, key: str, fp: str) -> Any:
        if not cut and key.endswith("-notice-2"):
            cut.append(key)
            cut_own_session()
        return real_claim(self, key, fp)

    monkeypatch.setattr(DatabaseLedger, "claim", claim_after_losing_the_connection)
    with pytest.raises(DatabaseError):
        runner.drive(task.id)
    connection.close()  # the database is back: a new connection works

    second = f"task-{task.id}-notice-2"
    assert not Notice.objects.filter(idempotency_key=second).exists()
    assert not Operation.objects.filter(key=second).exists()

    # The dead driver's lease runs out; recovery resumes from the checkpoint.
    Task.objects.filter(id=task.id).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    resumed: list[int] = []
    counts = runner.sweep(enqueue=resumed.append)
    assert counts["resumed"] == 1 and resumed == [task.id]
    runner.drive(task.id)

    task.refresh_from_db()
    assert (task.state, task.reason, task.recoveries) == (TaskState.COMPLETED, "goal_met", 1)
    assert Notice.objects.filter(idempotency_key__startswith=f"task-{task.id}-").count() == 2


def test_recovery_turns_an_in_flight_write_into_unknown_and_never_runs_it_again(
    start: Start,
) -> None:
    task = start("test_notices", {"count": 1})
    owner = "crashed:1"
    Task.objects.filter(id=task.id).update(
        state=TaskState.RUNNING,
        lease_owner=owner,
        lease_expires_at=timezone.now() - timedelta(seconds=1),
    )
    claim = DatabaseLedger(task_id=task.id, owner=owner).claim(f"task-{task.id}-notice-1", "f" * 64)
    assert claim.status == "claimed"

    counts = runner.sweep(enqueue=lambda task_id: None)

    task.refresh_from_db()
    assert counts == {"client_lost": 0, "recovered": 1, "resumed": 0, "requeued": 0}
    assert (task.state, task.reason) == (TaskState.NEEDS_HUMAN, "unknown_commit")
    assert Operation.objects.get(task=task).state == OperationState.UNKNOWN
    assert runner.drive(task.id) == "nothing to do: the task is NEEDS_HUMAN"
    assert not Notice.objects.exists()
    assert StopReport.objects.get(task=task).report["operation_state"] == "UNKNOWN"


def test_a_write_another_task_is_executing_is_waited_for_and_its_result_reused(
    start: Start,
) -> None:
    key = "shared-incident-7-notice"
    first = start("test_shared_notice", {"key": key, "hold_ms": 1500})
    holder = threading.Thread(target=_drive_in_thread, args=(first.id,))
    holder.start()
    try:
        _until(lambda: Operation.objects.filter(key=key, state=OperationState.IN_FLIGHT).exists())
        second = start("test_shared_notice", {"key": key})

        outcome = runner.drive(second.id)
    finally:
        holder.join(timeout=30)

    second.refresh_from_db()
    assert outcome == "COMPLETED/goal_met"
    assert second.executions == 0  # it ran nothing itself
    assert Notice.objects.filter(idempotency_key=key).count() == 1
    assert Operation.objects.get(key=key).task_id == first.id
    requests = list(
        TraceEvent.objects.filter(task=second, kind="request")
        .order_by("seq")
        .values_list("decision", "result_kind")
    )
    # Told to wait while the first one ran (once or more), then handed its result.
    assert requests[0] == ("reused", "PENDING")
    assert requests[-1] == ("reused", "SUCCESS")
    assert {kind for _, kind in requests[:-1]} == {"PENDING"}
    assert TraceEvent.objects.filter(task=second, kind="wait").exists()


def test_a_write_whose_database_went_away_before_it_happened_is_tried_again(
    start: Start,
) -> None:
    task = start("test_notices", {"count": 1, "cut": 1})

    outcome = runner.drive(task.id)

    task.refresh_from_db()
    key = f"task-{task.id}-notice-1"
    assert outcome == "COMPLETED/goal_met"
    assert Notice.objects.filter(idempotency_key=key).count() == 1
    operation = Operation.objects.get(key=key)
    assert (operation.state, operation.attempts) == (OperationState.COMMITTED, 2)
    assert task.executions == 2  # the retry drew from the same budget
    kinds = list(
        TraceEvent.objects.filter(task=task, kind="request")
        .order_by("seq")
        .values_list("decision", "result_kind")
    )
    assert kinds == [("executed", "RETRYABLE"), ("executed", "SUCCESS")]
    # The operation's history says it was verified not committed before it ran again.
    moves = list(operation.history.order_by("id").values_list("from_state", "to_state"))
    assert ("IN_FLIGHT", "NOT_COMMITTED") in moves
    assert moves[-1] == ("IN_FLIGHT", "COMMITTED")


def test_a_write_wrongly_marked_not_committed_is_not_sent_again_on_resumption(
    start: Start, operator: User
) -> None:
    key = "incident-8-first-notice"
    task = start("test_shared_notice", {"key": key, "lose": True, "auto_lookup": False})
    assert runner.drive(task.id) == "NEEDS_HUMAN/executor_error"  # the response was lost
    # A person marks it not committed against the lookup's word (an override), and approves.
    services.operation_mark_not_committed(
        key=key,
        actor=operator,
        evidence="no notice in my inbox",
        override="I trust my inbox more than the desk",
    )
    services.task_approve_resumption(
        task_id=task.id, actor=operator, reason="try again", enqueue=lambda task_id: None
    )

    outcome = runner.drive(task.id)

    # The retry's claim asked the lookup once more, which found the notice: not sent again.
    assert outcome == "NEEDS_HUMAN/unknown_commit"
    assert Notice.objects.filter(idempotency_key=key).count() == 1
    operation = Operation.objects.get(key=key)
    assert (operation.state, operation.attempts) == (OperationState.UNKNOWN, 2)
    task.refresh_from_db()
    assert "marked not committed" in task.detail


def _drive_in_thread(task_id: int) -> None:
    try:
        runner.drive(task_id)
    finally:
        connections.close_all()


def _until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > end:
            raise AssertionError("timed out waiting")
        time.sleep(0.02)


def test_credentials_quoted_in_a_tool_error_are_masked_before_anything_is_stored(
    start: Start, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.console.agents import SlowReader

    def leaky(self: SlowReader, call: Any) -> Any:
        raise ConnectionError(
            "401 for Authorization: Bearer sk-live-abcdefghijklmnop password=hunter2"
        )

    monkeypatch.setattr(SlowReader, "_read", leaky)
    task = start("test_reader", {"pages": 1})

    runner.drive(task.id)

    task.refresh_from_db()
    stored = [
        task.detail,
        json.dumps(StopReport.objects.get(task=task).report),
        *TraceEvent.objects.filter(task=task).values_list("detail", flat=True),
    ]
    assert (task.state, task.reason) == (TaskState.FAILED, "executor_error")
    assert any("ConnectionError" in text for text in stored)  # the error itself is kept
    for text in stored:
        assert "hunter2" not in text
        assert "sk-live-abcdefghijklmnop" not in text


# -- the step's statements: what rides on what, and what that must not change --------------


def test_a_stop_recorded_while_the_model_thinks_refuses_the_write_it_proposed(
    start: Start, operator: User, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.console.agents import NoticeWriter

    real_plan = NoticeWriter.plan

    def plan_then_stop(self: NoticeWriter, observation: Any) -> Any:
        proposal = real_plan(self, observation)
        if getattr(proposal, "operation_key", "").endswith("-notice-2"):
            services.task_stop(task_id=self.task_id, actor=operator, reason="stop it")
        return proposal

    monkeypatch.setattr(NoticeWriter, "plan", plan_then_stop)
    task = start("test_notices", {"count": 3})

    runner.drive(task.id)

    task.refresh_from_db()
    assert (task.state, task.reason) == (TaskState.CANCELLED, "operator_stop")
    assert task.executions == 1
    assert list(Operation.objects.filter(task=task).values_list("key", flat=True)) == [
        f"task-{task.id}-notice-1"
    ]
    assert not Notice.objects.filter(idempotency_key=f"task-{task.id}-notice-2").exists()
    # The model call that proposed the refused write is in the trace, before the stop.
    assert _events(task)[-3:] == [
        ("model_call", "planned", ""),
        ("request", "blocked", "send_notice"),
        ("stop", "", ""),
    ]


def test_a_stop_pressed_after_the_runner_last_looked_is_refused_by_the_write_s_claim(
    start: Start, operator: User, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stop lands between the model call and the claim of its write, after every look
    the runner takes: the claim's own statement sees it and answers STOPPING, and the
    guard ends the task there. Nothing was sent, nothing claimed, nothing lost."""
    real_claim = postgresql.PostgresStore.claim
    answers: list[str] = []

    def stop_then_claim(self: postgresql.PostgresStore, key: str, *args: Any, **kw: Any) -> Any:
        services.task_stop(task_id=self.task_id, actor=operator, reason="stop it now")
        claim = real_claim(self, key, *args, **kw)
        answers.append(claim.status)
        return claim

    monkeypatch.setattr(postgresql.PostgresStore, "claim", stop_then_claim)
    task = start("test_notices", {"count": 2})

    outcome = runner.drive(task.id)

    task.refresh_from_db()
    assert outcome == "CANCELLED/operator_stop"
    assert answers == ["stopping"]  # one claim, and it is the claim that saw the stop
    assert (task.state, task.reason, task.executions) == (TaskState.CANCELLED, "operator_stop", 0)
    assert not Notice.objects.filter(idempotency_key__startswith=f"task-{task.id}-").exists()
    assert not Operation.objects.filter(task=task).exists()
    report = StopReport.objects.get(task=task).report
    assert (report["state"], report["reason"]) == ("CANCELLED", "operator_stop")
    assert "stop it now" in report["detail"]
    assert _events(task)[-3:] == [
        ("model_call", "planned", ""),
        ("request", "blocked", "send_notice"),
        ("stop", "", ""),
    ]


def test_a_stop_recorded_while_the_model_thinks_refuses_the_read_it_proposed(
    start: Start, operator: User, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.console.agents import SlowReader

    real_plan = SlowReader.plan

    def plan_then_stop(self: SlowReader, observation: Any) -> Any:
        proposal = real_plan(self, observation)
        if self.memory.get("read") == 2:
            services.task_stop(task_id=self.task_id, actor=operator, reason="stop it")
        return proposal

    monkeypatch.setattr(SlowReader, "plan", plan_then_stop)
    task = start("test_reader", {"pages": 5})

    runner.drive(task.id)

    task.refresh_from_db()
    assert (task.state, task.reason) == (TaskState.CANCELLED, "operator_stop")
    assert (task.executions, task.checkpoint["agent"]["read"]) == (2, 2)
    assert _events(task)[-3:] == [
        ("model_call", "planned", ""),
        ("request", "blocked", "read_page"),
        ("stop", "", ""),
    ]


@pytest.mark.parametrize("count", [1, 2], ids=["its-last-write", "a-write-before-more"])
def test_a_write_settled_by_a_human_while_it_ran_stops_the_task_for_a_human(
    start: Start,
    operator: User,
    monkeypatch: pytest.MonkeyPatch,
    settings: Any,
    count: int,
) -> None:
    """The driver's lease ran out inside the tool and a reconciler marked the write not
    committed; the tool then returned and inspect saw it committed. Whether the guard
    stopped on that step (the task's last write) or would go on, the record fails and the
    task waits for a human: the reconciler's fact is not overwritten."""
    from tests.console.agents import NoticeWriter

    settings.LOOPGUARD_LEASE_SECONDS = 30  # no renewal while the test expires the lease
    real_send = NoticeWriter._send

    def send_while_reconciled(self: NoticeWriter, call: Any) -> Any:
        result = real_send(self, call)
        Task.objects.filter(id=self.task_id).update(
            lease_expires_at=timezone.now() - timedelta(seconds=1)
        )
        # Against the lookup's word (it finds the notice just sent): an override.
        services.operation_mark_not_committed(
            key=str(call.operation_key),
            actor=operator,
            evidence="nothing in the desk",
            override="looked before the desk had it",
        )
        return result

    monkeypatch.setattr(NoticeWriter, "_send", send_while_reconciled)
    task = start("test_notices", {"count": count})

    runner.drive(task.id)

    task.refresh_from_db()
    key = f"task-{task.id}-notice-1"
    assert (task.state, task.reason) == (TaskState.NEEDS_HUMAN, "unknown_commit")
    assert "NOT_COMMITTED, cannot become COMMITTED" in task.detail
    assert Operation.objects.get(key=key).state == OperationState.NOT_COMMITTED
    assert task.executions == 1
    report = StopReport.objects.get(task=task).report
    assert [(op["key"], op["state"]) for op in report["operations"]] == [(key, "NOT_COMMITTED")]


def test_the_checkpoint_stays_small_however_many_operations_a_phase_touches(
    start: Start,
) -> None:
    task = start("test_notices", {"count": 30}, model_calls=40, requests=40, executions=40)

    runner.drive(task.id)

    task.refresh_from_db()
    assert (task.state, task.reason) == (TaskState.COMPLETED, "goal_met")
    assert len(json.dumps(task.checkpoint)) < 1500
    report = StopReport.objects.get(task=task).report
    assert len(report["operations"]) == 30  # the report still names every one


def test_a_resumed_phase_remembers_the_operations_it_touched_before_the_crash(
    start: Start, monkeypatch: pytest.MonkeyPatch
) -> None:
    task = start("test_notices", {"count": 3})
    real_claim = DatabaseLedger.claim

    def claim_after_losing_the_connection(self: DatabaseLedger, key: str, fp: str) -> Any:
        if key.endswith("-notice-3") and not Task.objects.get(id=task.id).recoveries:
            cut_own_session()
        return real_claim(self, key, fp)

    monkeypatch.setattr(DatabaseLedger, "claim", claim_after_losing_the_connection)
    with pytest.raises(DatabaseError):
        runner.drive(task.id)
    connection.close()
    Task.objects.filter(id=task.id).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    runner.sweep(enqueue=lambda task_id: None)

    runner.drive(task.id)

    task.refresh_from_db()
    assert (task.state, task.reason, task.recoveries) == (TaskState.COMPLETED, "goal_met", 1)
    report = StopReport.objects.get(task=task).report
    keys = [f"task-{task.id}-notice-{n}" for n in (1, 2, 3)]
    assert [op["key"] for op in report["operations"]] == keys
    assert [step["operation_key"] for step in report["completed"]] == keys
    assert report["completed_total"] == 3


@pytest.mark.parametrize("prepared", [True, False], ids=["prepared", "not-prepared"])
def test_the_runner_prepares_its_statements_unless_told_not_to(
    start: Start, settings: Any, prepared: bool
) -> None:
    settings.LOOPGUARD_PREPARED_STATEMENTS = prepared
    writes = start("test_notices", {"count": 2})
    reads = start("test_reader", {"pages": 2})

    assert runner.drive(writes.id) == "COMPLETED/goal_met"
    assert runner.drive(reads.id) == "COMPLETED/goal_met"

    with connection.cursor() as cursor:  # the drivers ran on this thread's connection
        cursor.execute("SELECT count(*) FROM pg_prepared_statements")
        (count,) = cursor.fetchone()
    assert (count > 0) is prepared


@pytest.mark.parametrize(
    ("think_ms", "model_calls_in_trace_during_each_read"),
    # A drive's first model call is always saved before its read.
    [(0, [1, 1, 2]), (120, [1, 2, 3])],
    ids=["quick-model-event-saved-with-the-read", "slow-model-event-shown-during-the-read"],
)
def test_after_a_slow_model_call_the_live_trace_shows_the_read_while_it_runs(
    start: Start,
    monkeypatch: pytest.MonkeyPatch,
    think_ms: int,
    model_calls_in_trace_during_each_read: list[int],
) -> None:
    from tests.console.agents import SlowReader

    real_read = SlowReader._read
    seen: list[int] = []

    def read_and_look(self: SlowReader, call: Any) -> Any:
        seen.append(TraceEvent.objects.filter(task_id=self.task_id, kind="model_call").count())
        return real_read(self, call)

    monkeypatch.setattr(SlowReader, "_read", read_and_look)
    task = start("test_reader", {"pages": 3, "think_ms": think_ms, "tokens": 0})

    assert runner.drive(task.id) == "COMPLETED/goal_met"

    assert seen == model_calls_in_trace_during_each_read
    assert [kind for kind, _, _ in _events(task)] == ["model_call", "request"] * 3 + ["stop"]


def test_tokens_a_model_call_reported_are_saved_before_its_read_runs(
    start: Start, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A quick model call's event may wait for the read's save, but not its tokens: they
    are not counted ahead, and a crash inside the read must not give them back."""
    from tests.console.agents import SlowReader

    real_read = SlowReader._read
    tokens_in_row: list[int] = []

    def read_and_look(self: SlowReader, call: Any) -> Any:
        tokens_in_row.append(Task.objects.get(id=self.task_id).tokens)
        return real_read(self, call)

    monkeypatch.setattr(SlowReader, "_read", read_and_look)
    task = start("test_reader", {"pages": 3, "tokens": 7})

    assert runner.drive(task.id) == "COMPLETED/goal_met"

    assert tokens_in_row == [7, 14, 21]


def test_a_stop_recorded_while_the_model_thinks_past_the_deadline_is_named_as_the_reason(
    start: Start, operator: User, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.console.agents import NoticeWriter

    real_plan = NoticeWriter.plan

    def plan_stop_and_overrun(self: NoticeWriter, observation: Any) -> Any:
        proposal = real_plan(self, observation)
        if getattr(proposal, "operation_key", "").endswith("-notice-2"):
            services.task_stop(task_id=self.task_id, actor=operator, reason="stop it")
            time.sleep(0.6)  # past the deadline by the time the write reaches its entry
        return proposal

    monkeypatch.setattr(NoticeWriter, "plan", plan_stop_and_overrun)
    task = start("test_notices", {"count": 3}, deadline_ms=400)

    runner.drive(task.id)

    task.refresh_from_db()
    assert (task.state, task.reason) == (TaskState.CANCELLED, "operator_stop")
    assert not Notice.objects.filter(idempotency_key=f"task-{task.id}-notice-2").exists()


def test_a_verified_write_whose_save_is_cut_off_is_still_recorded_committed(
    start: Start, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The record rides on the save after the tool. If the database drops that statement,
    the driver records the write on its own before giving up, so recovery resumes the task
    instead of sending it to a human with an UNKNOWN operation."""
    task = start("test_notices", {"count": 2})
    real_fetch_one = statements.fetch_one
    cut: list[str] = []

    def fetch_one_cut_at_the_first_record(sql: str, params: Any) -> Any:
        if not cut and "moved AS" in sql:
            cut.append(sql)
            cut_own_session()
        return real_fetch_one(sql, params)

    monkeypatch.setattr(postgresql, "fetch_one", fetch_one_cut_at_the_first_record)
    with pytest.raises(DatabaseError):
        runner.drive(task.id)
    connection.close()

    first = f"task-{task.id}-notice-1"
    assert cut
    assert Operation.objects.get(key=first).state == OperationState.COMMITTED
    Task.objects.filter(id=task.id).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    assert runner.sweep(enqueue=lambda task_id: None)["resumed"] == 1
    runner.drive(task.id)

    task.refresh_from_db()
    assert (task.state, task.reason, task.recoveries) == (TaskState.COMPLETED, "goal_met", 1)
    assert Notice.objects.filter(idempotency_key__startswith=f"task-{task.id}-").count() == 2


def test_only_the_pre_execution_save_skips_the_wait_for_the_disk(start: Start) -> None:
    """The save after a model call commits asynchronously, for its own transaction only:
    the session's claims and saves after it still wait for the disk."""
    sent: list[str] = []

    def record(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        sent.append(sql)
        return execute(sql, params, many, context)

    task = start("test_reader", {"pages": 2})  # its model calls report tokens: saved at once
    with connection.execute_wrapper(record):
        assert runner.drive(task.id) == "COMPLETED/goal_met"
    with connection.cursor() as cursor:  # the driver's session, after it
        cursor.execute("SHOW synchronous_commit")
        (setting,) = cursor.fetchone()

    asynchronous = [sql for sql in sent if "synchronous_commit" in sql]
    assert len(asynchronous) == 2  # one per model call that proposed a read
    assert all("INSERT INTO console_traceevent" in sql for sql in asynchronous)
    assert not any("console_operation" in sql for sql in asynchronous)
    assert setting == "on"
