"""Attached tasks on the console's pages: shown like any task, marked attached and by which
client (escaped), found by the name their client gave them."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User

from console import services
from console.drivers import attached
from console.models import Task
from tests.console.doubt import unknown_operation

from .support import XSS, XSS_ESCAPED, SignIn, body

pytestmark = pytest.mark.django_db


def _attach(people: dict[str, User], *, agent: str = "incident-bot", client: str = "") -> Task:
    answer, _ = attached.attached_start(
        actor=people["agent"],
        request_id=f"start-{agent}",
        lease="pages:1",
        agent=agent,
        client=client or "incident-service/2 (langchain)",
        tools={"read_incident": "read", "notify": "write"},
        fingerprint=f"start-{agent}",
    )
    return Task.objects.get(id=answer["task"])


def test_an_attached_task_is_marked_with_its_client_on_its_page_the_list_and_the_dashboard(
    signed_in: SignIn, people: dict[str, User]
) -> None:
    task = _attach(people)
    client = signed_in("viewer")
    page = body(client.get(f"/tasks/{task.id}/"))
    assert "attached · driven by incident-service/2 (langchain)" in page
    listing = body(client.get("/tasks/"))
    assert f'href="/tasks/{task.id}/"' in listing
    assert 'title="attached: driven by incident-service/2 (langchain)">attached<' in listing


def test_a_clients_name_is_escaped_wherever_it_is_shown(
    signed_in: SignIn, people: dict[str, User]
) -> None:
    task = _attach(people, client=XSS)
    client = signed_in("viewer")
    for url in (f"/tasks/{task.id}/", "/tasks/"):
        html = body(client.get(url))
        assert XSS not in html and XSS_ESCAPED in html


def test_the_task_list_filters_by_an_attached_agents_name(
    signed_in: SignIn, people: dict[str, User]
) -> None:
    mine, other = _attach(people, agent="incident-bot"), _attach(people, agent="refund-bot")
    listing = body(signed_in("viewer").get("/tasks/", {"agent": "incident-bot"}))
    assert f'href="/tasks/{mine.id}/"' in listing
    assert f'href="/tasks/{other.id}/"' not in listing
    assert '<option value="refund-bot"' in body(signed_in("viewer").get("/tasks/"))


def test_looking_an_attached_tasks_write_up_says_its_tool_runs_in_the_client(
    people: dict[str, User],
) -> None:
    task = _attach(people)
    op = unknown_operation(task, "incident-7-first-notice")
    _, found = services.operation_look_up(key=op.key, actor=people["reconciler"])
    assert "runs in the attached client" in found["error"]
