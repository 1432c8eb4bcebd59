"""Every action needs its CSRF token, and a valid token does not lend a role."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from console.models import AuditEntry, Operation, OperationState, Task, TaskState

from .support import (
    KEY,
    SignIn,
    World,
    audit_count,
    body,
    csrf_token,
    resolve_form,
)

pytestmark = pytest.mark.django_db


@dataclass
class Action:
    persona: str  # who may do it
    form_page: str  # where that person finds the form
    url: str
    data: dict[str, str]
    happened: Callable[[], bool]


def _actions(w: World) -> dict[str, Action]:
    return {
        "start": Action(
            "operator",
            "/tasks/new",
            "/tasks/new",
            {"agent": "test_reader", "input": '{"pages": 9}', "reason": "csrf check"},
            lambda: Task.objects.filter(input={"pages": 9}).exists(),
        ),
        "stop": Action(
            "operator",
            f"/tasks/{w.queued.id}/stop",
            f"/tasks/{w.queued.id}/stop",
            {"reason": "runaway"},
            lambda: Task.objects.get(id=w.queued.id).state != TaskState.QUEUED,
        ),
        "resume": Action(
            "approver",
            f"/tasks/{w.stopped.id}/resume",
            f"/tasks/{w.stopped.id}/resume",
            {"reason": "fixed"},
            lambda: Task.objects.get(id=w.stopped.id).phase == 2,
        ),
        "resolve": Action(
            "reconciler",
            "/operations/",
            f"/operations/{KEY}/resolve",
            resolve_form(w.op),
            lambda: Operation.objects.get(id=w.op.id).state != OperationState.UNKNOWN,
        ),
        "lookup": Action(
            "reconciler",
            "/operations/",
            f"/operations/{KEY}/lookup",
            {},
            lambda: AuditEntry.objects.filter(action="lookup").exists(),
        ),
    }


ACTIONS = ("start", "stop", "resume", "resolve", "lookup")


@pytest.mark.parametrize("action", ACTIONS)
def test_an_action_posted_without_its_csrf_token_is_refused_and_changes_nothing(
    signed_in: SignIn, world: World, action: str
) -> None:
    a = _actions(world)[action]
    client = signed_in(a.persona, csrf=True)
    assert client.get(a.form_page).status_code == 200  # the browser has its CSRF cookie

    response = client.post(a.url, a.data)

    assert response.status_code == 403
    assert not a.happened()
    assert audit_count() == 0


@pytest.mark.parametrize("action", ACTIONS)
def test_an_action_posted_with_the_token_from_its_page_works(
    signed_in: SignIn, world: World, action: str
) -> None:
    a = _actions(world)[action]
    client = signed_in(a.persona, csrf=True)
    token = csrf_token(body(client.get(a.form_page)))

    response = client.post(a.url, {**a.data, "csrfmiddlewaretoken": token})

    assert response.status_code in (200, 302)
    assert a.happened()
    assert audit_count() == 1


def test_an_htmx_post_carries_the_token_the_page_puts_on_its_body(
    signed_in: SignIn, world: World
) -> None:
    client = signed_in("reconciler", csrf=True)
    html = body(client.get("/operations/"))
    found = re.search(r'hx-headers=\'\{"X-CSRFToken": "([^"]+)"\}\'', html)
    assert found

    response = client.post(
        f"/operations/{KEY}/lookup",
        headers={"HX-Request": "true", "X-CSRFToken": found.group(1)},
    )

    assert response.status_code == 200
    assert "<html" not in body(response)
    assert f'id="lookup-{world.op.id}"' in body(response)


@pytest.mark.parametrize("action", ACTIONS)
def test_a_viewer_forging_an_action_with_a_valid_token_is_refused_and_changes_nothing(
    signed_in: SignIn, world: World, action: str
) -> None:
    a = _actions(world)[action]
    client = signed_in("viewer", csrf=True)
    token = csrf_token(body(client.get("/")))  # the sign-out form carries one

    response = client.post(a.url, {**a.data, "csrfmiddlewaretoken": token})

    assert response.status_code == 403
    assert not a.happened()
    assert audit_count() == 0
