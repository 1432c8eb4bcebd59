"""Fixtures of the console's page tests: a signed-in browser per persona, and a world."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client

from console.records.roles import assign

from .support import (
    KEY,
    PERSONAS,
    START_FORM,
    SignIn,
    Start,
    World,
    finish,
    resolve_form,
    unknown_operation,
)


@pytest.fixture(autouse=True)
def celery_kept_out(enqueued: list[int]) -> None:
    """No page test hands a task to Celery: ``enqueued`` keeps the ids instead."""


@pytest.fixture
def people(db: None) -> dict[str, User]:
    found = {}
    for name, roles in PERSONAS.items():
        user = User.objects.create_user(name, password=f"pw-{name}")
        assign(user, roles)
        found[name] = user
    return found


@pytest.fixture
def signed_in(people: dict[str, User]) -> SignIn:
    """A browser with ``name`` signed in; ``csrf=True`` checks CSRF like a real browser."""

    def sign_in(name: str, *, csrf: bool = False) -> Client:
        client = Client(enforce_csrf_checks=csrf)
        client.force_login(people[name])
        return client

    return sign_in


@pytest.fixture
def world(start: Start) -> World:
    queued = start("test_reader", {"pages": 2})
    stopped = finish(start("test_reader", {"pages": 3}), "CANCELLED", "operator_stop")
    uncertain = start("test_notices", {"count": 1})
    op = unknown_operation(uncertain)
    uncertain.refresh_from_db()
    return World(queued, stopped, uncertain, op)


@pytest.fixture
def history(signed_in: SignIn, world: World) -> World:
    """A few human actions: a start, a stop with a formula for a reason, a settlement."""
    signed_in("operator").post("/tasks/new", START_FORM)
    signed_in("operator").post(
        f"/tasks/{world.queued.id}/stop", {"reason": '=HYPERLINK("http://evil.example")'}
    )
    signed_in("reconciler").post(f"/operations/{KEY}/resolve", resolve_form(world.op))
    return world
