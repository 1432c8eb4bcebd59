"""Pages offer what the task itself says is allowed (``can_stop``, ``can_cancel``,
``can_resume``), and show and grant every budget the guard declares (``DIMENSIONS``)."""

from __future__ import annotations

import pytest
from django.utils import timezone

from console.models import Task
from console.selectors import GAUGED
from guard.steps import DIMENSIONS

from .support import SignIn, Start, World, body, finish, running

pytestmark = pytest.mark.django_db

STOPPING = "stopping"  # running, with a stop recorded


@pytest.mark.parametrize(
    ("state", "reason", "allowed"),
    [
        ("QUEUED", "", {"stop"}),
        ("RUNNING", "", {"stop"}),
        (STOPPING, "", set()),
        ("COMPLETED", "goal_met", set()),
        ("PARTIAL", "no_progress", {"resume"}),
        ("FAILED", "fatal", {"resume"}),
        ("CANCELLED", "operator_stop", {"resume"}),
        ("NEEDS_HUMAN", "unknown_commit", {"resume"}),
        ("NEEDS_HUMAN", "restart_loop", {"cancel", "resume"}),
    ],
)
def test_a_task_says_what_may_be_done_with_it_in_each_state(
    state: str, reason: str, allowed: set[str]
) -> None:
    stop_requested_at = timezone.now() if state == STOPPING else None
    task = Task(state="RUNNING" if state == STOPPING else state, reason=reason,
                stop_requested_at=stop_requested_at)

    may = {"stop": task.can_stop, "cancel": task.can_cancel, "resume": task.can_resume}

    assert {name for name, yes in may.items() if yes} == allowed


def test_the_stop_page_of_a_task_already_stopping_says_so_and_offers_no_second_stop(
    signed_in: SignIn, world: World
) -> None:
    task = running(world.queued)
    client = signed_in("operator")
    client.post(f"/tasks/{task.id}/stop", {"reason": "runaway"})

    page = body(client.get(f"/tasks/{task.id}/stop"))

    assert "A stop is already recorded: this task ends before its next step." in page
    assert "Stop the task" not in page
    assert "already stopped" not in page


def test_the_task_page_shows_every_budget_with_a_gauge_by_its_name_for_people(
    signed_in: SignIn, world: World
) -> None:
    page = body(signed_in("viewer").get(f"/tasks/{world.stopped.id}/"))

    for dimension in GAUGED:
        assert f"<span>{dimension.label}</span>" in page
    # The poll budget bounds each PENDING job, not the task: a task-wide bar would mislead.
    assert "<span>polls</span>" not in page


def test_the_resume_form_offers_a_grant_of_every_budget(signed_in: SignIn, start: Start) -> None:
    task = finish(start("test_reader", {"pages": 5}), "PARTIAL", "poll_budget")

    page = body(signed_in("approver").get(f"/tasks/{task.id}/resume"))

    assert "This task ran out of polls." in page
    for dimension in DIMENSIONS:
        assert f'name="grant_{dimension.limit}"' in page
        assert f"More {dimension.label}:" in page  # in words, not the field's name


def test_the_dashboard_shows_every_budget_of_a_running_task(
    signed_in: SignIn, world: World
) -> None:
    running(world.queued)

    board = body(signed_in("viewer").get("/"))

    for dimension in GAUGED:
        assert f"<th>{dimension.label[0].upper()}{dimension.label[1:]}</th>" in board
        assert f'aria-label="{dimension.label} 0%"' in board
