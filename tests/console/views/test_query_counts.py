"""Each page costs a fixed number of queries, however long its lists."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from console import selectors
from console.models import AuditEntry, Task

from .support import (
    SignIn,
    Start,
    World,
    add_events,
    body,
    finish,
    trace_rows,
    unknown_operation,
)

pytestmark = pytest.mark.django_db


def _queries(client: Client, url: str) -> int:
    with CaptureQueriesContext(connection) as context:
        response = client.get(url)
        assert response.status_code == 200
    return len(context.captured_queries)


def test_the_task_list_costs_as_many_queries_for_60_tasks_as_for_5(
    signed_in: SignIn, start: Start, django_assert_max_num_queries: Any
) -> None:
    client = signed_in("viewer")
    for n in range(5):
        finish(start("test_reader", {"pages": n}), "CANCELLED", "operator_stop")
    few = _queries(client, "/tasks/")

    for n in range(5, 60):
        start("test_reader", {"pages": n})
    many = _queries(client, "/tasks/")

    assert many == few
    with django_assert_max_num_queries(few):
        html = body(client.get("/tasks/"))
    assert "60 tasks" in html
    assert html.count('<td><a href="/tasks/') == 50  # one page


def test_the_task_page_costs_as_many_queries_for_300_trace_events_as_for_5(
    signed_in: SignIn, world: World
) -> None:
    client = signed_in("viewer")
    task = world.queued
    signed_in("operator").post(f"/tasks/{task.id}/stop", {"reason": "r"})
    add_events(task, 5)
    few = _queries(client, f"/tasks/{task.id}/")

    add_events(task, 295)
    many = _queries(client, f"/tasks/{task.id}/")

    assert many == few
    html = body(client.get(f"/tasks/{task.id}/"))
    assert len(trace_rows(html)) == selectors.TRACE_WINDOW  # the latest window; older: a link away
    assert "Earlier events" in html


def test_the_reconciliation_queue_costs_as_many_queries_for_12_writes_as_for_2(
    signed_in: SignIn, start: Start
) -> None:
    client = signed_in("reconciler")
    for n in range(2):
        unknown_operation(start("test_notices", {"count": 1, "n": n}), f"notice-{n}")
    few = _queries(client, "/operations/")

    for n in range(2, 12):
        unknown_operation(start("test_notices", {"count": 1, "n": n}), f"notice-{n}")
    many = _queries(client, "/operations/")

    assert many == few


def test_the_audit_log_and_dashboard_cost_the_same_queries_for_150_entries_as_for_5(
    signed_in: SignIn, world: World, people: dict[str, User]
) -> None:
    client = signed_in("viewer")

    def add(count: int) -> None:
        AuditEntry.objects.bulk_create(
            AuditEntry(actor=people["operator"], action="stop", task=world.queued, reason="r")
            for _ in range(count)
        )

    add(5)
    few = (_queries(client, "/audit/"), _queries(client, "/"))
    add(145)
    many = (_queries(client, "/audit/"), _queries(client, "/"))

    assert many == few


def _held_refunds(start: Start, first: int, last: int) -> None:
    """Refunds over the limit, each held for approval as the runner holds it."""
    from console.drivers import runner

    for n in range(first, last):
        task = start(
            "support_desk",
            {"order": 42, "amount_cents": 1500 + n, "reason": "r", "approve_above_cents": 1000},
        )
        assert runner.drive(task.id) == "NEEDS_HUMAN/approval_required"


def test_the_approval_queue_and_the_dashboard_cost_as_many_queries_for_12_calls_as_for_6(
    signed_in: SignIn, seeded: None, start: Start
) -> None:
    # Six fill the dashboard's box, which then counts the rest (as the reconciliation box).
    client = signed_in("approver")
    _held_refunds(start, 0, 6)
    few = (_queries(client, "/approvals/"), _queries(client, "/"))

    _held_refunds(start, 6, 12)
    many = (_queries(client, "/approvals/"), _queries(client, "/"))

    assert many == few
    html = body(client.get("/"))
    assert "5 of 12, the oldest first" in html  # the dashboard's box lists the oldest few


def test_the_task_page_of_a_held_call_costs_one_query_more_than_another(
    signed_in: SignIn, seeded: None, start: Start
) -> None:
    client = signed_in("approver")
    _held_refunds(start, 0, 1)
    held = Task.objects.get(agent="support_desk")
    other = finish(start("test_reader", {"pages": 1}), "CANCELLED", "operator_stop")

    assert _queries(client, f"/tasks/{held.id}/") == _queries(client, f"/tasks/{other.id}/") + 1
