"""A write left in doubt, as the console's page and API tests both need one."""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.utils import timezone

from console import lifecycle
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
