"""What a task row says of itself, by one rule each: whether its driver's lease is alive (a
query and a loaded row give the same answer, and lapsed is its other side), and what the
task allows (read from ``TASK_MOVES``)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import pytest
from django.utils import timezone

from console.models import (
    ACTIVE_STATES,
    TASK_MOVES,
    UNSETTLED_STATES,
    Operation,
    OperationState,
    Task,
    TaskState,
    lease_alive,
    lease_lapsed,
)

pytestmark = pytest.mark.django_db

Start = Callable[..., Task]


@pytest.mark.parametrize("owner", ["", "driver-a"], ids=["no-owner", "owner"])
@pytest.mark.parametrize("expires_in", [None, -60, 0, 60], ids=str)
@pytest.mark.parametrize("state", TaskState.values)
def test_a_lease_is_alive_by_the_same_rule_in_a_query_and_on_a_loaded_row(
    start: Start, state: str, expires_in: int | None, owner: str
) -> None:
    task = start("test_reader", {"pages": 1})
    at = timezone.now()
    expires = None if expires_in is None else at + timedelta(seconds=expires_in)
    Task.objects.filter(id=task.id).update(
        state=state,
        reason="" if state in ACTIVE_STATES else "goal_unverified",
        lease_owner=owner,
        lease_expires_at=expires,
    )
    Operation.objects.create(
        key="k-1", fingerprint="f" * 64, state=OperationState.IN_FLIGHT, tool="t", task=task
    )
    row = Task.objects.get(id=task.id)

    alive = Task.objects.filter(lease_alive(at), id=task.id).exists()
    lapsed = Task.objects.filter(lease_lapsed(at), id=task.id).exists()

    assert alive is (bool(owner) and expires_in is not None and expires_in > 0)
    assert (row.lease_alive_until(at) is not None) is alive
    assert row.lease_alive_until(at) == (expires if alive else None)
    # From an operation, through its task: the same answer.
    assert Operation.objects.filter(lease_alive(at, via="task__"), key="k-1").exists() is alive
    # A running task's lease (an owner, an expiry) is alive or lapsed, never both; no other
    # task is lapsed.
    if state == TaskState.RUNNING and owner and expires is not None:
        assert lapsed is not alive
    assert lapsed is (state == TaskState.RUNNING and expires is not None and expires <= at)


@pytest.mark.parametrize(
    ("state", "reason"),
    [
        (TaskState.QUEUED, ""),
        (TaskState.RUNNING, ""),
        (TaskState.NEEDS_HUMAN, "restart_loop"),
        (TaskState.NEEDS_HUMAN, "approval_required"),
        (TaskState.NEEDS_HUMAN, "unknown_commit"),
        (TaskState.PARTIAL, "goal_unverified"),
        (TaskState.CANCELLED, "operator_stop"),
        (TaskState.COMPLETED, "goal_met"),
    ],
)
def test_what_a_task_offers_an_operator_is_what_its_moves_allow(state: str, reason: str) -> None:
    task = Task(state=state, reason=reason)

    offered = {
        name
        for name, may in (
            ("stop", task.can_stop),
            ("cancel", task.can_cancel),
            ("resume", task.can_resume),
            ("answer", task.waits_for_approval),
        )
        if may
    }

    expected: dict[tuple[str, str], set[str]] = {
        (TaskState.QUEUED, ""): {"stop"},
        (TaskState.RUNNING, ""): {"stop"},
        (TaskState.NEEDS_HUMAN, "restart_loop"): {"cancel", "resume"},
        (TaskState.NEEDS_HUMAN, "approval_required"): {"answer"},
        (TaskState.NEEDS_HUMAN, "unknown_commit"): {"resume"},
        (TaskState.PARTIAL, "goal_unverified"): {"resume"},
        (TaskState.CANCELLED, "operator_stop"): {"resume"},
        (TaskState.COMPLETED, "goal_met"): set(),
    }
    assert offered == expected[(state, reason)]
    # Each offer is a move the table lets the task make.
    moves = {"stop": ("request_stop", "cancel"), "cancel": ("cancel",), "resume": ("resume",)}
    moves["answer"] = ("close", "resume")
    for name in offered:
        assert any(TASK_MOVES[move].leaves(state, reason) for move in moves[name]), name


def test_the_reconciliation_queue_s_index_holds_exactly_the_unsettled_operations() -> None:
    # Its WHERE is a migration's text; the queries it serves filter by UNSETTLED_STATES.
    index = next(i for i in Operation._meta.indexes if i.name == "operation_unsettled")
    assert index.condition is not None
    (lookup, states), *rest = index.condition.children
    assert (lookup, set(states), rest) == ("state__in", set(UNSETTLED_STATES), [])
    assert sorted(UNSETTLED_STATES) == [OperationState.IN_FLIGHT, OperationState.UNKNOWN]
