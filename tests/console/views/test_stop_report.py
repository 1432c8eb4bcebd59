"""The stop report reads without its JSON, and its JSON says which task, who and when."""

from __future__ import annotations

import json

import pytest

from console import services
from console.drivers import runner
from console.models import Task

from .support import SignIn, Start, body, finish

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_guard_stop_shows_its_budgets_spent_and_left_and_who_stopped_it(
    signed_in: SignIn, start: Start
) -> None:
    task = start("test_reader", {"pages": 9}, model_calls=3)
    runner.drive(task.id)  # runs out of model calls

    html = body(signed_in("viewer").get(f"/tasks/{task.id}/"))

    assert "Budgets when it stopped" in html
    # One row per budget: model calls all spent, nothing left; polls are per job.
    assert '<td>Model calls</td><td class="num">3</td><td class="num">0</td>' in html
    assert '<td>Polls</td><td class="num">0</td><td class="num"><span class="muted">per job' in html
    assert "<dt>Stopped by</dt><dd>the guard</dd>" in html
    assert "in phase 1" in html


def test_an_operator_stop_names_who_asked_when_and_why(
    signed_in: SignIn, start: Start, people: dict[str, object]
) -> None:
    task = start("test_reader", {"pages": 2})
    services.task_stop(task_id=task.id, actor=people["operator"], reason="wrong customer")  # type: ignore[arg-type]

    html = body(signed_in("viewer").get(f"/tasks/{task.id}/"))

    assert "<dt>Stopped by</dt><dd>operator, who asked at " in html
    assert "“wrong customer”" in html


def test_the_exported_report_says_which_task_agent_phase_when_and_who(
    signed_in: SignIn, start: Start, people: dict[str, object]
) -> None:
    task = start("test_reader", {"pages": 2})
    services.task_stop(task_id=task.id, actor=people["operator"], reason="wrong customer")  # type: ignore[arg-type]
    task = Task.objects.get(id=task.id)

    exported = json.loads(body(signed_in("viewer").get(f"/tasks/{task.id}/report.json")))

    assert (exported["task_id"], exported["agent"], exported["phase"]) == (
        task.id,
        "test_reader",
        1,
    )
    assert exported["stopped_by"] == "operator"
    assert exported["stop_note"] == "wrong customer"
    assert exported["stopped_at"].endswith("+00:00")  # UTC, whatever the viewer's zone
    assert exported["created_at"].endswith("+00:00")
    assert (exported["state"], exported["reason"]) == ("CANCELLED", "operator_stop")
    assert "remaining_budget" in exported  # the guard's report itself follows


def test_a_report_of_a_task_no_one_stopped_names_no_one(signed_in: SignIn, start: Start) -> None:
    task = finish(start("test_reader", {"pages": 1}), "PARTIAL", "no_progress")

    exported = json.loads(body(signed_in("viewer").get(f"/tasks/{task.id}/report.json")))

    assert exported["stopped_by"] is None
    assert exported["stop_note"] == ""
