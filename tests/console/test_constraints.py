"""The database itself refuses a state, reason or kind outside the closed sets.

The checks are written as one array literal on PostgreSQL (``console.models.OneOf``);
these tests hold what they refuse and what they let through, whatever their form.
"""

from __future__ import annotations

import pytest
from django.db import IntegrityError, connection, transaction

from console.models import STOP_REASONS, EventKind, Operation, Task, TaskState, TraceEvent

pytestmark = pytest.mark.django_db


def _task(**fields: object) -> Task:
    return Task.objects.create(
        agent="ledger_writer", input={}, input_fingerprint="f", limits={}, **fields
    )


def _refused(make: object) -> str:
    with pytest.raises(IntegrityError) as caught, transaction.atomic():
        make()  # type: ignore[operator]
    return str(caught.value)


def test_the_checks_are_array_literals_on_postgresql() -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conname = %s",
            ["task_reason_valid"],
        )
        (definition,) = cursor.fetchone()

    assert "ANY ('{" in definition
    assert "goal_met" in definition


def test_every_state_and_every_stop_reason_is_accepted() -> None:
    for state in TaskState.values:
        reason = "" if state in ("QUEUED", "RUNNING") else "goal_met"
        assert _task(state=state, reason=reason).pk
    for reason in STOP_REASONS:
        assert _task(state="PARTIAL", reason=reason).pk


def test_an_unknown_state_or_reason_is_refused() -> None:
    # An unknown state breaks two checks; PostgreSQL names the first it evaluates.
    refused = _refused(lambda: _task(state="DONE"))
    assert "task_state_valid" in refused or "task_reason_matches_state" in refused
    assert "task_reason_valid" in _refused(lambda: _task(state="PARTIAL", reason="tired"))
    # A near miss, in case a comparison ever became a prefix or a case-blind match.
    assert "task_reason_valid" in _refused(lambda: _task(state="PARTIAL", reason="goal_me"))
    assert "task_reason_valid" in _refused(lambda: _task(state="PARTIAL", reason="GOAL_MET"))


def test_a_stopped_task_needs_a_reason_and_a_running_one_has_none() -> None:
    assert "task_reason_matches_state" in _refused(lambda: _task(state="FAILED", reason=""))
    assert "task_reason_matches_state" in _refused(
        lambda: _task(state="RUNNING", reason="goal_met")
    )


def test_an_unknown_trace_kind_and_operation_state_are_refused() -> None:
    task = _task()
    for seq, kind in enumerate(EventKind.values, start=10):
        TraceEvent.objects.create(task=task, phase=1, seq=seq, kind=kind)

    assert "trace_kind_valid" in _refused(
        lambda: TraceEvent.objects.create(task=task, phase=1, seq=1, kind="thought")
    )
    assert "operation_state_valid" in _refused(
        lambda: Operation.objects.create(key="k-1", fingerprint="f", state="DONE", task=task)
    )
