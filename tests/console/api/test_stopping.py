"""Stopping a task: once, with a reason; a running task is left to its driver."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from console.models import AuditEntry, Task, TaskState
from console.records.roles import Role

from .helpers import Caller, error

pytestmark = pytest.mark.django_db

Start = Callable[..., Task]


def test_stopping_twice_stops_once_and_the_second_is_a_409(
    caller: Callable[..., Caller], start: Start
) -> None:
    operator = caller(Role.OPERATOR)
    task = start("test_reader", {"pages": 1})

    first = operator.post(f"/api/tasks/{task.id}/stop", {"reason": "wrong customer"})
    second = operator.post(f"/api/tasks/{task.id}/stop", {"reason": "again"})

    assert first.status_code == 200
    assert (first.json()["task"]["state"], first.json()["task"]["reason"]) == (
        "CANCELLED", "operator_stop"
    )
    assert "already stopped" in error(second, 409)
    assert AuditEntry.objects.filter(task=task, action="stop").count() == 1


def test_stopping_a_running_task_is_accepted_and_left_to_its_driver(
    admin: Caller, start: Start
) -> None:
    task = start("test_reader", {"pages": 1})
    Task.objects.filter(id=task.id).update(state=TaskState.RUNNING, lease_owner="w:1")

    response = admin.post(f"/api/tasks/{task.id}/stop", {"reason": "runaway"})

    assert response.status_code == 202
    shown = response.json()["task"]
    assert shown["state"] == "RUNNING"
    assert shown["stop_requested_at"] is not None
    again = admin.post(f"/api/tasks/{task.id}/stop", {"reason": "again"})
    assert "already stopping" in error(again, 409)


def test_a_stop_without_a_reason_is_a_400_and_changes_nothing(admin: Caller, start: Start) -> None:
    task = start("test_reader", {"pages": 1})

    assert "reason is required" in error(admin.post(f"/api/tasks/{task.id}/stop", {}), 400)
    assert "reason must be a string" in error(
        admin.post(f"/api/tasks/{task.id}/stop", {"reason": ["x"]}), 400
    )
    assert Task.objects.get(id=task.id).state == TaskState.QUEUED
