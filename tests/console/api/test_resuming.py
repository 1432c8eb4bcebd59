"""Approving a new phase: after reconciliation, with a grant where a budget ran out."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from console.models import AuditEntry, Task, TaskState
from console.records.roles import Role

from .helpers import Caller, error, unknown_operation

pytestmark = pytest.mark.django_db

Start = Callable[..., Task]


def test_resuming_waits_for_reconciliation_then_opens_a_new_phase(
    caller: Callable[..., Caller], start: Start, enqueued: list[int]
) -> None:
    approver = caller(Role.APPROVER)
    reconciler = caller(Role.RECONCILER)
    task = start("test_notices", {"count": 1})
    op = unknown_operation(task)
    url = f"/api/tasks/{task.id}/resume"

    refused = approver.post(url, {"reason": "looks fine"})
    reconciler.post(f"/api/operations/{op.key}/resolve", {"committed": False, "evidence": "none"})
    resumed = approver.post(url, {"reason": "the refund never went out"})
    again = approver.post(url, {"reason": "double click"})

    assert f"reconcile first: {op.key}" in error(refused, 409)
    assert resumed.status_code == 200
    assert (resumed.json()["task"]["state"], resumed.json()["task"]["phase"]) == ("QUEUED", 2)
    assert "not stopped" in error(again, 409)
    assert AuditEntry.objects.filter(task=task, action="approve_resumption").count() == 1


def test_a_task_out_of_budget_resumes_only_with_an_explicit_grant(
    admin: Caller, start: Start
) -> None:
    task = start("test_reader", {"pages": 1}, model_calls=4)
    Task.objects.filter(id=task.id).update(
        state=TaskState.PARTIAL, reason="model_budget", model_calls=4
    )
    url = f"/api/tasks/{task.id}/resume"

    without = admin.post(url, {"reason": "more"})
    malformed = admin.post(url, {"reason": "more", "grant": {"model_calls": "five"}})
    granted = admin.post(url, {"reason": "more", "grant": {"model_calls": 5}})

    assert "grant an explicit amount" in error(without, 409)
    assert "whole number" in error(malformed, 400)
    assert granted.status_code == 200
    shown = granted.json()["task"]
    assert shown["limits"]["model_calls"] == 9
    assert shown["counters"]["model_calls"] == 4  # what was spent carries over
