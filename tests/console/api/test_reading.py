"""Reading tasks: the list with its filters and pages, one task with its trace."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from console import selectors, services
from console.models import Task

from .helpers import Caller, error, unknown_operation

pytestmark = pytest.mark.django_db

Start = Callable[..., Task]


def test_the_task_list_filters_and_pages_like_the_console(
    admin: Caller, start: Start, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(selectors, "TASKS_PER_PAGE", 2)
    readers = [start("test_reader", {"pages": n}) for n in range(1, 4)]
    waiter = start("test_waiter", {})
    services.task_stop(task_id=readers[0].id, actor=admin.user, reason="not needed")

    first = admin.get("/api/tasks", agent="test_reader").json()
    second = admin.get("/api/tasks", agent="test_reader", page="2").json()
    cancelled = admin.get("/api/tasks", state="CANCELLED").json()
    by_id = admin.get("/api/tasks", q=f"#{waiter.id}").json()

    assert [t["id"] for t in first["tasks"]] == [readers[2].id, readers[1].id]  # newest first
    assert first["page"] == {
        "number": 1, "pages": 2, "per_page": 2, "count": 3, "next": 2, "previous": None
    }
    assert [t["id"] for t in second["tasks"]] == [readers[0].id]
    assert second["page"]["next"] is None
    assert [(t["id"], t["reason"]) for t in cancelled["tasks"]] == [
        (readers[0].id, "operator_stop")
    ]
    assert [t["id"] for t in by_id["tasks"]] == [waiter.id]
    shown = first["tasks"][0]
    assert shown["agent"] == "test_reader"
    assert shown["state"] == "QUEUED"
    assert shown["phase"] == 1
    assert shown["counters"] == {
        "model_calls": 0, "requests": 0, "executions": 0, "tokens": 0, "spend": 0,
        "explored": 0, "elapsed_ms": 0,
    }
    assert shown["limits"]["model_calls"] == readers[2].limits["model_calls"]
    assert {"created_at", "updated_at", "url"} <= set(shown)


def test_a_bad_filter_is_a_400_rather_than_every_task(admin: Caller) -> None:
    assert "unknown state" in error(admin.get("/api/tasks", state="DONE"), 400)
    assert "page" in error(admin.get("/api/tasks", page="two"), 400)
    assert "start at 1" in error(admin.get("/api/tasks", page="0"), 400)


def test_a_task_shows_its_gauges_operations_phases_stop_report_and_trace(
    admin: Caller, start: Start
) -> None:
    task = start("test_notices", {"count": 1}, model_calls=10)
    Task.objects.filter(id=task.id).update(model_calls=9)
    op = unknown_operation(task)

    body = admin.get(f"/api/tasks/{task.id}").json()

    assert (body["task"]["state"], body["task"]["reason"]) == ("NEEDS_HUMAN", "unknown_commit")
    gauge = next(g for g in body["gauges"] if g["name"] == "model_calls")
    assert (gauge["used"], gauge["limit"], gauge["percent"], gauge["level"]) == (9, 10, 90, "warn")
    assert body["operations"] == [
        {
            "key": op.key,
            "resolve_url": "/api/operations/order/42/refund/resolve",
            "task": task.id,
            "state": "UNKNOWN",
            "tool": op.tool,
            "args_preview": op.args_preview,
            "attempts": 1,
            "evidence": "",
            "claimed_at": body["operations"][0]["claimed_at"],
            "updated_at": body["operations"][0]["updated_at"],
        }
    ]
    assert [(p["number"], p["state"], p["reason"]) for p in body["phases"]] == [
        (1, "NEEDS_HUMAN", "unknown_commit")
    ]
    assert body["stop_report"]["reason"] == "unknown_commit"
    assert body["stop_report"]["report"]["state"] == "NEEDS_HUMAN"
    assert [e["kind"] for e in body["events"]] == ["stop"]
    assert body["last_seq"] == body["events"][-1]["seq"]


def test_a_client_following_a_trace_gets_only_events_it_has_not_seen(
    admin: Caller, start: Start
) -> None:
    task = start("test_reader", {"pages": 1})
    seen = admin.get(f"/api/tasks/{task.id}").json()
    assert (seen["events"], seen["last_seq"]) == ([], 0)

    services.task_stop(task_id=task.id, actor=admin.user, reason="enough")
    new = admin.get(f"/api/tasks/{task.id}", after=str(seen["last_seq"])).json()
    again = admin.get(f"/api/tasks/{task.id}", after=str(new["last_seq"])).json()

    assert [(e["kind"], e["reason"]) for e in new["events"]] == [("stop", "operator_stop")]
    assert (again["events"], again["last_seq"]) == ([], new["last_seq"])
    assert "whole number" in error(admin.get(f"/api/tasks/{task.id}", after="-1"), 400)


def test_an_unknown_task_or_operation_is_a_404_whatever_the_action(admin: Caller) -> None:
    assert "no task 987654" in error(admin.get("/api/tasks/987654"), 404)
    error(admin.post("/api/tasks/987654/stop", {"reason": "x"}), 404)
    error(admin.post("/api/tasks/987654/resume", {"reason": "x"}), 404)
    resolve = {"committed": True, "evidence": "x"}
    assert "no operation" in error(admin.post("/api/operations/no/such/resolve", resolve), 404)
    assert "no API endpoint" in error(admin.get("/api/tasks/abc"), 404)
    error(admin.get(f"/api/tasks/{10**30}"), 404)  # beyond any id, not a database error
