"""The task list and the reconciliation queue refresh themselves, cheaply when nothing
changed, and never under a reconciler's typing."""

from __future__ import annotations

import re

import pytest
from django.test import Client

from console import services
from console.models import Task

from .support import KEY, SignIn, Start, World, body, unknown_operation

pytestmark = pytest.mark.django_db

HTMX = {"HTTP_HX_REQUEST": "true"}


def _poll_url(html: str, region: str) -> str:
    found = re.search(rf'id="{region}"[^>]*hx-get="([^"]+)"', html)
    assert found, f"#{region} does not poll"
    return found.group(1).replace("&amp;", "&")


def _poll(client: Client, url: str, region: str) -> tuple[int, str]:
    answer = client.get(url, HTTP_HX_TARGET=region, **HTMX)
    return answer.status_code, answer.content.decode()


def test_the_task_list_polls_and_an_unchanged_list_is_answered_with_no_content(
    signed_in: SignIn, world: World
) -> None:
    client = signed_in("viewer")
    page = body(client.get("/tasks/?state=QUEUED"))
    assert 'hx-trigger="every 5s"' in page

    # The whole page carries no version: its first poll brings the list once, versioned.
    status, first = _poll(client, _poll_url(page, "results"), "results")
    assert status == 200 and first.lstrip().startswith('<section id="results"')
    assert "state=QUEUED" in _poll_url(first, "results")  # the filters stay

    status, again = _poll(client, _poll_url(first, "results"), "results")
    assert (status, again) == (204, "")


def test_the_task_list_comes_back_when_a_task_on_it_changes(
    signed_in: SignIn, world: World
) -> None:
    client = signed_in("viewer")
    status, first = _poll(client, "/tasks/?v=", "results")
    assert status == 200
    Task.objects.filter(id=world.queued.id).update(model_calls=7)

    status, changed = _poll(client, _poll_url(first, "results"), "results")

    assert status == 200
    assert _poll_url(changed, "results") != _poll_url(first, "results")


def test_the_queue_says_when_it_changed_without_swapping_the_forms(
    signed_in: SignIn, start: Start, people: dict[str, object]
) -> None:
    unknown_operation(start("test_notices", {"count": 1}))
    client = signed_in("reconciler")
    page = body(client.get("/operations/"))
    url = _poll_url(page, "queue-live")

    assert _poll(client, url, "queue-live") == (204, "")

    services.operation_mark_not_committed(
        key=KEY,
        actor=people["reconciler"],  # type: ignore[arg-type]
        evidence="not in the desk",
    )
    status, banner = _poll(client, url, "queue-live")

    assert status == 200
    assert "The queue has changed since this page was loaded" in banner
    assert 'name="evidence"' not in banner  # only the notice: the rows stay as they are
    assert _poll(client, _poll_url(banner, "queue-live"), "queue-live") == (204, "")


def test_a_refused_resolve_keeps_the_queue_quiet_while_the_reconciler_mends_the_form(
    signed_in: SignIn, start: Start
) -> None:
    unknown_operation(start("test_notices", {"count": 1}))
    client = signed_in("reconciler")
    form = {"decision": "committed", "evidence": "seen", "result": "NaN"}

    refused = body(client.post(f"/operations/{KEY}/resolve", form))

    assert "was not changed" in refused
    # Nothing changed in the queue: its poll must not say otherwise.
    assert _poll(client, _poll_url(refused, "queue-live"), "queue-live") == (204, "")
