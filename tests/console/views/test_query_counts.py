"""Each page costs a fixed number of queries, however long its lists."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from console import selectors
from console.models import AuditEntry

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
