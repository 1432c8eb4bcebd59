"""A write left in doubt, a person settling it and resuming the task, and a write still
being executed, as the console's page, API, service and runner tests need them."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone

from console import lifecycle, services
from console.drivers.ledger import DatabaseLedger
from console.models import Operation, Task, TaskState
from guard import Call


def unknown_operation(task: Task, key: str, args: dict[str, Any] | None = None) -> Operation:
    """A write whose worker died mid-execution: ``send_notice`` under ``key``, claimed, then
    left ``UNKNOWN`` by recovery (the task ``NEEDS_HUMAN``/``unknown_commit``)."""
    Task.objects.filter(id=task.id).update(
        state=TaskState.RUNNING, lease_owner="gone:1", lease_expires_at=timezone.now()
    )
    ledger = DatabaseLedger(task_id=task.id, owner="gone:1")
    ledger.describe(Call("send_notice", args or {"text": "notice 1"}, "write", key))
    ledger.claim(key, "a" * 64)
    task.refresh_from_db()
    with transaction.atomic():
        lifecycle.recover(task, why="the worker died")
    return Operation.objects.get(key=key)


def settle_sent_and_resume(task: Task, key: str, actor: User) -> None:
    """A person settles the lost notice ``key`` as sent (its row is in the desk) and approves
    ``task``'s resumption, not enqueued: the test drives the next phase itself."""
    services.operation_mark_committed(
        key=key, actor=actor, evidence="notice row 1 exists in the desk", result={"sent": key}
    )
    services.task_approve_resumption(
        task_id=task.id, actor=actor, reason="notice verified", enqueue=lambda i: None
    )


def in_flight_operation(task: Task, key: str) -> Operation:
    """A write a live worker is executing right now: ``key`` claimed by the worker that
    holds ``task``'s lease for another minute (``IN_FLIGHT``, nobody may settle it)."""
    Task.objects.filter(id=task.id).update(
        state=TaskState.RUNNING,
        lease_owner="w:1",
        lease_expires_at=timezone.now() + timedelta(minutes=1),
    )
    DatabaseLedger(task_id=task.id, owner="w:1").claim(key, "b" * 64)
    return Operation.objects.get(key=key)
