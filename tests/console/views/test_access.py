"""Who may read the console: signing in, the roles that read, the refusal page."""

from __future__ import annotations

import pytest
from django.test import Client

from console.models import OperationState

from .support import (
    KEY,
    READ_PAGES,
    READERS,
    SignIn,
    World,
    audit_count,
    body,
    pages_of,
)

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("page", [*READ_PAGES, "stop", "resume", "new"])
def test_someone_not_signed_in_is_sent_to_the_login_page_from_every_page(
    world: World, page: str
) -> None:
    urls = {
        **pages_of(world),
        "stop": f"/tasks/{world.queued.id}/stop",
        "resume": f"/tasks/{world.stopped.id}/resume",
        "new": "/tasks/new",
    }

    response = Client().get(urls[page])

    assert response.status_code == 302
    assert response.url.startswith("/login?next=")


@pytest.mark.parametrize("action", ["resolve", "lookup"])
def test_someone_not_signed_in_cannot_post_an_action_and_is_sent_to_log_in(
    world: World, action: str
) -> None:
    response = Client().post(
        f"/operations/{KEY}/{action}", {"decision": "committed", "evidence": "trust me"}
    )

    assert response.status_code == 302
    assert response.url.startswith("/login?next=")
    world.reload()
    assert world.op.state == OperationState.UNKNOWN
    assert audit_count() == 0


def test_the_health_check_answers_without_signing_in(db: None) -> None:
    response = Client().get("/healthz")

    assert response.status_code == 200
    assert response.json()["status"] == "ok"


def test_the_login_page_itself_is_open(db: None) -> None:
    response = Client().get("/login")

    assert response.status_code == 200
    assert "Sign in" in body(response)


@pytest.mark.parametrize("page", READ_PAGES)
@pytest.mark.parametrize("persona", READERS)
def test_every_role_reads_every_page(
    signed_in: SignIn, world: World, persona: str, page: str
) -> None:
    response = signed_in(persona).get(pages_of(world)[page])

    assert response.status_code == 200


@pytest.mark.parametrize("page", READ_PAGES)
def test_someone_signed_in_without_a_role_reads_nothing(
    signed_in: SignIn, world: World, page: str
) -> None:
    response = signed_in("nobody").get(pages_of(world)[page])

    assert response.status_code == 403
    assert world.queued.agent not in body(response)


def test_the_refusal_page_says_what_is_missing(signed_in: SignIn, world: World) -> None:
    response = signed_in("nobody").get("/tasks/")

    assert response.status_code == 403
    assert "Your roles do not include this action" in body(response)
