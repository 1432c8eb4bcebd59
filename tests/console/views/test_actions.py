"""Who may act (start, stop, reconcile, look up, approve), and the controls each role is shown."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from console.models import AuditEntry, OperationState, Phase, Task

from .support import (
    KEY,
    MAY,
    READERS,
    START_FORM,
    SignIn,
    World,
    audit_count,
    body,
    may_not,
    resolve_form,
)

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("persona", MAY["start"])
def test_operators_and_admins_may_start_a_task(signed_in: SignIn, persona: str) -> None:
    client = signed_in(persona)

    page = client.get("/tasks/new")
    response = client.post("/tasks/new", START_FORM)

    assert page.status_code == 200
    task = Task.objects.get()
    assert response.status_code == 302
    assert response.url == f"/tasks/{task.id}/"
    assert (task.agent, task.input, task.state) == ("test_reader", {"pages": 2}, "QUEUED")
    entry = AuditEntry.objects.get(task=task)
    assert (entry.actor.username, entry.action, entry.reason) == (persona, "start", "nightly")


@pytest.mark.parametrize("persona", may_not("start"))
def test_no_one_else_may_start_a_task(signed_in: SignIn, persona: str) -> None:
    client = signed_in(persona)

    assert client.get("/tasks/new").status_code == 403
    assert client.post("/tasks/new", START_FORM).status_code == 403
    assert not Task.objects.exists()
    assert audit_count() == 0


def test_starting_a_task_from_the_form_queues_it_for_a_worker(
    signed_in: SignIn,
    enqueued: list[int],
    django_capture_on_commit_callbacks: Callable[..., Any],
) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        response = signed_in("operator").post("/tasks/new", START_FORM, follow=True)

    task = Task.objects.get()
    assert enqueued == [task.id]
    assert f"Task {task.id} started." in body(response)


@pytest.mark.parametrize("persona", MAY["stop"])
def test_operators_and_admins_may_stop_a_task(
    signed_in: SignIn, world: World, persona: str
) -> None:
    client = signed_in(persona)
    url = f"/tasks/{world.queued.id}/stop"

    page = client.get(url)
    response = client.post(url, {"reason": "wrong customer"}, follow=True)

    assert page.status_code == 200
    assert "Stop the task" in body(page)
    world.reload()
    assert (world.queued.state, world.queued.reason) == ("CANCELLED", "operator_stop")
    assert response.redirect_chain == [(f"/tasks/{world.queued.id}/", 302)]
    assert f"Task {world.queued.id} stopped." in body(response)
    entry = AuditEntry.objects.get(action="stop")
    assert (entry.actor.username, entry.reason) == (persona, "wrong customer")


@pytest.mark.parametrize("persona", may_not("stop"))
def test_no_one_else_may_stop_a_task(signed_in: SignIn, world: World, persona: str) -> None:
    client = signed_in(persona)
    url = f"/tasks/{world.queued.id}/stop"

    assert client.get(url).status_code == 403
    assert client.post(url, {"reason": "let me"}).status_code == 403
    world.reload()
    assert world.queued.state == "QUEUED"
    assert world.queued.stop_requested_at is None
    assert audit_count() == 0


@pytest.mark.parametrize("persona", MAY["reconcile"])
def test_reconcilers_and_admins_may_resolve_an_uncertain_write(
    signed_in: SignIn, world: World, persona: str
) -> None:
    response = signed_in(persona).post(
        f"/operations/{KEY}/resolve", resolve_form(world.op), follow=True
    )

    world.reload()
    assert world.op.state == OperationState.NOT_COMMITTED
    assert world.op.evidence == "no notice with this key in the desk"
    assert response.redirect_chain == [("/operations/", 302)]
    assert f"{KEY} marked not committed." in body(response)
    entry = AuditEntry.objects.get(action="mark_not_committed")
    assert (entry.actor.username, entry.operation) == (persona, world.op)


@pytest.mark.parametrize("persona", MAY["reconcile"])
def test_reconcilers_and_admins_may_mark_a_write_committed_with_its_result(
    signed_in: SignIn, world: World, persona: str
) -> None:
    form = resolve_form(world.op, "committed", result='{"notice": 17}')

    response = signed_in(persona).post(f"/operations/{KEY}/resolve", form, follow=True)

    world.reload()
    assert world.op.state == OperationState.COMMITTED
    assert world.op.result["data"] == {"notice": 17}
    assert f"{KEY} marked committed." in body(response)


@pytest.mark.parametrize("persona", may_not("reconcile"))
def test_no_one_else_may_resolve_an_uncertain_write(
    signed_in: SignIn, world: World, persona: str
) -> None:
    response = signed_in(persona).post(f"/operations/{KEY}/resolve", resolve_form(world.op))

    assert response.status_code == 403
    world.reload()
    assert world.op.state == OperationState.UNKNOWN
    assert audit_count() == 0


@pytest.mark.parametrize("persona", MAY["reconcile"])
def test_reconcilers_and_admins_may_look_a_write_up_in_the_business_system(
    signed_in: SignIn, world: World, persona: str
) -> None:
    response = signed_in(persona).post(f"/operations/{KEY}/lookup")

    assert response.status_code == 200
    html = body(response)
    assert "It did not happen." in html  # no notice with this key exists in the desk
    assert "Nothing was changed" in html
    world.reload()
    assert world.op.state == OperationState.UNKNOWN  # a lookup informs, it does not settle
    entry = AuditEntry.objects.get()
    assert (entry.actor.username, entry.action, entry.after["committed"]) == (
        persona,
        "lookup",
        False,
    )


def test_a_lookup_posted_without_htmx_comes_back_as_a_whole_page(
    signed_in: SignIn, world: World
) -> None:
    # The lookup button is a plain form too (method and action): without JavaScript the
    # person must land on a page with the console around it, not on a bare fragment.
    response = signed_in("reconciler").post(f"/operations/{KEY}/lookup")

    assert response.status_code == 200
    assert "<html" in body(response)
    assert "It did not happen." in body(response)


@pytest.mark.parametrize("persona", may_not("reconcile"))
def test_no_one_else_may_run_a_lookup(signed_in: SignIn, world: World, persona: str) -> None:
    response = signed_in(persona).post(f"/operations/{KEY}/lookup")

    assert response.status_code == 403
    assert audit_count() == 0


@pytest.mark.parametrize("persona", MAY["approve"])
def test_approvers_and_admins_may_approve_a_resumption(
    signed_in: SignIn, world: World, persona: str
) -> None:
    client = signed_in(persona)
    url = f"/tasks/{world.stopped.id}/resume"

    page = client.get(url)
    response = client.post(url, {"reason": "the customer confirmed"}, follow=True)

    assert page.status_code == 200
    assert "Approve resumption" in body(page)
    world.reload()
    assert (world.stopped.state, world.stopped.phase) == ("QUEUED", 2)
    assert f"Task {world.stopped.id} resumes in a new phase." in body(response)
    phase = Phase.objects.get(task=world.stopped, number=2)
    assert (phase.approved_by.username, phase.approval_note) == (persona, "the customer confirmed")
    assert AuditEntry.objects.get(action="approve_resumption").actor.username == persona


@pytest.mark.parametrize("persona", may_not("approve"))
def test_no_one_else_may_approve_a_resumption(
    signed_in: SignIn, world: World, persona: str
) -> None:
    client = signed_in(persona)
    url = f"/tasks/{world.stopped.id}/resume"

    assert client.get(url).status_code == 403
    assert client.post(url, {"reason": "let me"}).status_code == 403
    world.reload()
    assert (world.stopped.state, world.stopped.phase) == ("CANCELLED", 1)
    assert audit_count() == 0


CONTROLS_OF = {
    "viewer": set(),
    "operator": {"start", "stop"},
    "reconciler": {"resolve", "lookup"},
    "approver": {"approve"},
    "agent": set(),  # it drives its own tasks over the API, not through these pages
    "admin": {"start", "stop", "resolve", "lookup", "approve"},
}


@pytest.mark.parametrize("persona", READERS)
def test_each_role_is_shown_exactly_the_buttons_and_forms_it_may_use(
    signed_in: SignIn, world: World, persona: str
) -> None:
    client = signed_in(persona)
    dashboard = body(client.get("/"))
    live_task = body(client.get(f"/tasks/{world.queued.id}/"))
    stopped_task = body(client.get(f"/tasks/{world.stopped.id}/"))
    queue = body(client.get("/operations/"))

    shown = {
        "start": 'href="/tasks/new"' in dashboard,
        "stop": f'href="/tasks/{world.queued.id}/stop"' in live_task,
        "approve": f'href="/tasks/{world.stopped.id}/resume"' in stopped_task,
        "resolve": f'action="/operations/{KEY}/resolve"' in queue,
        "lookup": f'action="/operations/{KEY}/lookup"' in queue,
    }
    assert {name for name, visible in shown.items() if visible} == CONTROLS_OF[persona]
    # Nobody is offered to stop a task that has already stopped.
    assert f"/tasks/{world.stopped.id}/stop" not in stopped_task


def test_a_viewer_reading_the_reconciliation_queue_is_told_settling_needs_another_role(
    signed_in: SignIn, world: World
) -> None:
    queue = body(signed_in("viewer").get("/operations/"))

    assert KEY in queue
    assert "settling an operation needs the reconciler role" in queue
    assert "<form" not in queue.split("<main", 1)[1]  # only the sign-out form, in the header
