"""Starting a task, and what the API refuses of any body or method."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from console.models import AuditEntry, Task, TaskState
from console.records.roles import Role

from .helpers import JSON, Caller, error

pytestmark = pytest.mark.django_db

Start = Callable[..., Task]


def test_starting_a_task_creates_it_audits_it_and_enqueues_it_once_committed(
    caller: Callable[..., Caller],
    enqueued: list[int],
    django_capture_on_commit_callbacks: Callable[..., Any],
) -> None:
    operator = caller(Role.OPERATOR)

    with django_capture_on_commit_callbacks(execute=True):
        response = operator.post(
            "/api/tasks",
            {"agent": "test_reader", "input": {"pages": 2}, "limits": {"model_calls": 7}},
        )

    assert response.status_code == 201
    shown = response.json()["task"]
    assert response["Location"] == f"/api/tasks/{shown['id']}"
    assert (shown["agent"], shown["state"], shown["limits"]["model_calls"]) == (
        "test_reader", "QUEUED", 7
    )
    assert enqueued == [shown["id"]]
    entry = AuditEntry.objects.get(task_id=shown["id"])
    assert (entry.actor, entry.action) == (operator.user, "start")
    assert "through the API" in entry.reason


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({}, "agent is required"),
        ({"agent": "no_such_agent"}, "no agent named"),
        ({"agent": "test_reader", "input": [1, 2]}, "input must be a JSON object"),
        ({"agent": "test_reader", "limits": {"model_calls": -1}}, "invalid limits"),
        ({"agent": "test_reader", "inputs": {}}, "unknown field(s): inputs"),
        ({"agent": 7}, "agent must be a string"),
    ],
)
def test_a_malformed_start_is_a_400_that_says_what_is_wrong_and_creates_nothing(
    admin: Caller, body: dict[str, Any], message: str
) -> None:
    assert message in error(admin.post("/api/tasks", body), 400)
    assert not Task.objects.exists()


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ('{"agent": "test_reader",', "not valid JSON"),
        ('{"agent": NaN}', "not valid JSON"),
        (b'{"agent": "\xff"}', "not valid JSON"),
        ('["test_reader"]', "must be a JSON object"),
    ],
)
def test_a_body_that_is_not_a_json_object_is_a_400_that_says_so(
    admin: Caller, raw: str | bytes, message: str
) -> None:
    assert message in error(admin.post("/api/tasks", raw), 400)
    assert not Task.objects.exists()


def test_a_body_over_one_mebibyte_is_refused_with_413(admin: Caller) -> None:
    body = {"agent": "test_reader", "input": {"blob": "x" * (1024 * 1024)}}

    assert "larger than 1 MiB" in error(admin.post("/api/tasks", body), 413)
    assert not Task.objects.exists()


def test_only_the_listed_methods_are_answered(admin: Caller, start: Start) -> None:
    task = start("test_reader", {"pages": 1})

    put = admin.client.put("/api/tasks", "{}", content_type=JSON)
    delete = admin.client.delete(f"/api/tasks/{task.id}")
    get_stop = admin.get(f"/api/tasks/{task.id}/stop")
    post_queue = admin.post("/api/operations", {})

    assert "use GET, POST" in error(put, 405)
    assert (put["Allow"], delete["Allow"], get_stop["Allow"], post_queue["Allow"]) == (
        "GET, POST", "GET", "POST", "GET"
    )
    for response in (delete, get_stop, post_queue):
        error(response, 405)
    assert Task.objects.get(id=task.id).state == TaskState.QUEUED
