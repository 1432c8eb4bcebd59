"""Services move state only from the state the person saw, and audit it in the same breath."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from django.contrib.auth.models import User
from django.db import DatabaseError, connection, transaction
from django.utils import timezone

from console import services
from console.models import (
    AuditEntry,
    Operation,
    OperationEvent,
    OperationState,
    StopReport,
    Task,
    TaskState,
)
from tests.console import doubt

pytestmark = pytest.mark.django_db

Start = Callable[..., Task]
KEY = "incident-42-first-notice"


def test_starting_a_task_enqueues_it_once_the_transaction_commits(
    operator: User, django_capture_on_commit_callbacks: Callable[..., object]
) -> None:
    enqueued: list[int] = []
    with django_capture_on_commit_callbacks(execute=True):  # type: ignore[attr-defined]
        task = services.task_start(
            agent="test_reader", input={"pages": 2}, actor=operator, enqueue=enqueued.append
        )
    assert enqueued == [task.id]
    assert task.state == TaskState.QUEUED
    entry = AuditEntry.objects.get(task=task)
    assert (entry.actor, entry.action) == (operator, "start")


@pytest.mark.parametrize(
    ("agent", "payload", "limits", "message"),
    [
        ("no_such_agent", {}, None, "no agent named"),
        ("test_reader", {"x": float("nan")}, None, "not a JSON number"),
        ("test_reader", {"blob": "x" * 70_000}, None, "larger than"),
        ("test_reader", {}, {"model_calls": -1}, "invalid limits"),
        ("test_reader", {}, {"laps": 3}, "unknown limit"),
    ],
)
def test_a_malformed_start_is_refused_with_a_clear_message_and_creates_nothing(
    agent: str, payload: dict[str, object], limits: dict[str, int] | None, message: str
) -> None:
    with pytest.raises(services.InvalidInput, match=message):
        services.task_start(agent=agent, input=payload, limits=limits, enqueue=lambda i: None)
    assert not Task.objects.exists()


def test_secrets_in_a_task_input_are_redacted_before_they_are_stored() -> None:
    task = services.task_start(
        agent="test_reader",
        input={"pages": 1, "api_key": "sk-live-abcdefghijklmnop", "note": "Bearer abcdefghij"},
        enqueue=lambda i: None,
    )
    task.refresh_from_db()
    assert task.input == {"pages": 1, "api_key": "[redacted]", "note": "[redacted]"}


def test_the_same_goal_started_again_and_again_is_held_for_an_operator(operator: User) -> None:
    enqueued: list[int] = []
    tasks = [
        services.task_start(agent="test_reader", input={"pages": 1}, enqueue=enqueued.append)
        for _ in range(4)
    ]
    held = tasks[-1]
    assert [t.state for t in tasks[:3]] == [TaskState.QUEUED] * 3
    assert (held.state, held.reason) == (TaskState.NEEDS_HUMAN, "restart_loop")
    assert StopReport.objects.get(task=held).report["reason"] == "restart_loop"
    other = services.task_start(agent="test_reader", input={"pages": 2}, enqueue=lambda i: None)
    assert other.state == TaskState.QUEUED  # another goal is not held

    resumed = services.task_approve_resumption(
        task_id=held.id, actor=operator, reason="the trigger is fixed", enqueue=enqueued.append
    )
    assert resumed.state == TaskState.QUEUED


def test_stopping_a_queued_task_cancels_it_at_once_with_an_audit_entry(
    start: Start, operator: User
) -> None:
    task = start("test_reader", {"pages": 2})

    services.task_stop(task_id=task.id, actor=operator, reason="wrong customer")

    task.refresh_from_db()
    assert (task.state, task.reason) == (TaskState.CANCELLED, "operator_stop")
    entry = AuditEntry.objects.get(task=task, action="stop")
    assert entry.reason == "wrong customer"
    assert (entry.before["state"], entry.after["state"]) == ("QUEUED", "CANCELLED")
    assert StopReport.objects.get(task=task).report["state"] == "CANCELLED"


def test_stopping_a_running_task_records_the_fact_for_its_driver(
    start: Start, operator: User
) -> None:
    task = start("test_reader", {"pages": 2})
    Task.objects.filter(id=task.id).update(state=TaskState.RUNNING, lease_owner="w:1")

    services.task_stop(task_id=task.id, actor=operator, reason="runaway")

    task.refresh_from_db()
    assert task.state == TaskState.RUNNING  # the driver ends it at its next check
    assert task.stop_requested_at is not None
    assert task.stop_requested_by == operator
    with pytest.raises(services.StaleState, match="already stopping"):
        services.task_stop(task_id=task.id, actor=operator, reason="again")


def test_stopping_a_stopped_task_is_a_stale_action_not_a_second_stop(
    start: Start, operator: User
) -> None:
    task = start("test_reader", {"pages": 1})
    services.task_stop(task_id=task.id, actor=operator, reason="first")
    with pytest.raises(services.StaleState, match="already stopped"):
        services.task_stop(task_id=task.id, actor=operator, reason="second")
    assert AuditEntry.objects.filter(task=task, action="stop").count() == 1


def test_a_stop_needs_a_reason_and_an_unknown_task_is_not_found(
    start: Start, operator: User
) -> None:
    task = start("test_reader", {"pages": 1})
    with pytest.raises(services.InvalidInput, match="reason"):
        services.task_stop(task_id=task.id, actor=operator, reason="  ")
    with pytest.raises(services.NotFound):
        services.task_stop(task_id=987654, actor=operator, reason="x")


def test_marking_an_unknown_operation_committed_adds_a_fact_and_an_audit_entry(
    start: Start, operator: User
) -> None:
    task = start("test_notices", {"count": 1})
    op = doubt.unknown_operation(task, KEY)

    services.operation_mark_committed(
        key=op.key, actor=operator, evidence="desk notice #17", result={"notice": 17}
    )

    op.refresh_from_db()
    assert op.state == OperationState.COMMITTED
    assert op.evidence == "desk notice #17"
    assert op.result["data"] == {"notice": 17}
    history = list(
        OperationEvent.objects.filter(operation=op)
        .order_by("id")
        .values_list("from_state", "to_state")
    )
    assert history == [("", "IN_FLIGHT"), ("IN_FLIGHT", "UNKNOWN"), ("UNKNOWN", "COMMITTED")]
    entry = AuditEntry.objects.get(operation=op)
    assert (entry.action, entry.before, entry.after) == (
        "mark_committed",
        {"state": "UNKNOWN"},
        {"state": "COMMITTED"},
    )
    with pytest.raises(services.StaleState, match="already COMMITTED"):
        services.operation_mark_not_committed(key=op.key, actor=operator, evidence="late")


def test_an_operation_still_being_executed_cannot_be_settled_by_a_human(
    start: Start, operator: User
) -> None:
    task = start("test_notices", {"count": 1})
    doubt.in_flight_operation(task, "order-1-refund")

    with pytest.raises(services.Refused, match="being executed"):
        services.operation_mark_not_committed(key="order-1-refund", actor=operator, evidence="?")
    assert Operation.objects.get(key="order-1-refund").state == OperationState.IN_FLIGHT


def test_settling_needs_evidence_and_an_existing_key(start: Start, operator: User) -> None:
    task = start("test_notices", {"count": 1})
    op = doubt.unknown_operation(task, KEY)
    with pytest.raises(services.InvalidInput, match="evidence"):
        services.operation_mark_committed(key=op.key, actor=operator, evidence="")
    with pytest.raises(services.NotFound):
        services.operation_mark_committed(key="nope", actor=operator, evidence="x")


def test_resumption_is_refused_for_running_and_completed_tasks(
    start: Start, operator: User
) -> None:
    task = start("test_reader", {"pages": 1})
    with pytest.raises(services.StaleState, match="not stopped"):
        services.task_approve_resumption(task_id=task.id, actor=operator, reason="x")
    Task.objects.filter(id=task.id).update(state=TaskState.COMPLETED, reason="goal_met")
    with pytest.raises(services.StaleState, match="nothing to resume"):
        services.task_approve_resumption(task_id=task.id, actor=operator, reason="x")


@pytest.mark.parametrize("state", TaskState.values)
def test_resumption_is_approved_exactly_where_the_task_says_it_can_resume(
    start: Start, operator: User, state: str
) -> None:
    task = start("test_reader", {"pages": 1})
    reason = "" if state in (TaskState.QUEUED, TaskState.RUNNING) else "operator_stop"
    Task.objects.filter(id=task.id).update(state=state, reason=reason)
    seen = Task.objects.get(id=task.id)

    try:
        services.task_approve_resumption(
            task_id=task.id, actor=operator, reason="x", enqueue=lambda task_id: None
        )
        approved = True
    except services.StaleState:
        approved = False

    assert approved is seen.can_resume


@pytest.mark.parametrize("stopping", [False, True], ids=["", "stop-recorded"])
@pytest.mark.parametrize(
    ("state", "reason"),
    [
        (TaskState.QUEUED, ""),
        (TaskState.RUNNING, ""),
        (TaskState.PARTIAL, "goal_unverified"),
        (TaskState.NEEDS_HUMAN, "restart_loop"),  # held before it ran: cancelled
        (TaskState.NEEDS_HUMAN, "unknown_commit"),  # stopped after it ran: stays stopped
        (TaskState.NEEDS_HUMAN, "approval_required"),
    ],
)
def test_a_stop_is_taken_exactly_where_the_task_says_it_can_stop(
    start: Start, operator: User, state: str, reason: str, stopping: bool
) -> None:
    task = start("test_reader", {"pages": 1})
    Task.objects.filter(id=task.id).update(
        state=state,
        reason=reason,
        stop_requested_at=timezone.now() if stopping else None,
    )
    seen = Task.objects.get(id=task.id)

    try:
        services.task_stop(task_id=task.id, actor=operator, reason="stop it")
        stopped = True
    except services.StaleState:
        stopped = False

    assert stopped is (seen.can_stop or seen.can_cancel)


def test_a_grant_must_name_a_budget_and_a_whole_amount(start: Start, operator: User) -> None:
    task = start("test_reader", {"pages": 1})
    Task.objects.filter(id=task.id).update(state=TaskState.PARTIAL, reason="model_budget")
    with pytest.raises(services.InvalidInput, match="not a budget"):
        services.task_approve_resumption(
            task_id=task.id, actor=operator, reason="x", grant={"same": 5}
        )
    with pytest.raises(services.InvalidInput, match="whole number"):
        services.task_approve_resumption(
            task_id=task.id, actor=operator, reason="x", grant={"model_calls": -2}
        )


def test_the_audit_log_refuses_to_be_edited_or_deleted_even_from_outside_the_app(
    start: Start, operator: User
) -> None:
    task = start("test_reader", {"pages": 1})
    services.task_stop(task_id=task.id, actor=operator, reason="r")
    entry = AuditEntry.objects.get(task=task)
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        AuditEntry.objects.filter(id=entry.id).update(reason="rewritten")
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        AuditEntry.objects.filter(id=entry.id).delete()
    entry.refresh_from_db()
    assert entry.reason == "r"


@pytest.mark.parametrize(
    "table", ["console_traceevent", "console_operationevent", "console_stopreport"]
)
def test_history_tables_refuse_updates_and_deletes_in_the_database(
    start: Start, operator: User, table: str
) -> None:
    task = start("test_notices", {"count": 1})
    # Writes an operation history, a stop report and a trace event.
    doubt.unknown_operation(task, KEY)
    for statement in (f"UPDATE {table} SET id = id", f"DELETE FROM {table}"):  # noqa: S608
        with (
            pytest.raises(DatabaseError, match="append-only"),
            transaction.atomic(),
            connection.cursor() as cursor,
        ):
            cursor.execute(statement)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT count(*) FROM {table}")  # noqa: S608
        assert cursor.fetchone()[0] > 0


def test_cancelling_a_task_held_for_a_restart_loop_adds_its_own_stop_report(
    operator: User,
) -> None:
    tasks = [
        services.task_start(agent="test_reader", input={"pages": 9}, enqueue=lambda i: None)
        for _ in range(4)
    ]
    held = tasks[-1]
    services.task_stop(task_id=held.id, actor=operator, reason="the trigger was a mistake")

    held.refresh_from_db()
    reports = list(
        StopReport.objects.filter(task=held).order_by("id").values_list("reason", flat=True)
    )
    assert (held.state, held.reason) == (TaskState.CANCELLED, "operator_stop")
    assert reports == ["restart_loop", "operator_stop"]
