"""Fixtures of the API tests: callers holding a token with roles, Celery kept out."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from django.contrib.auth.models import User

from console.api.tokens import api_token_issue
from console.records.roles import Role, assign

from .helpers import Caller, bearer


@pytest.fixture
def caller(db: None) -> Callable[..., Caller]:
    def make(*roles: Role, username: str = "") -> Caller:
        user = User.objects.create_user(username or "-".join(roles) or "nobody")
        assign(user, roles)
        token, secret = api_token_issue(user=user, name="tests")
        return Caller(user, token, secret, bearer(secret))

    return make


@pytest.fixture
def admin(caller: Callable[..., Caller]) -> Caller:
    return caller(Role.ADMIN)


@pytest.fixture
def enqueued(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Task ids the services hand to Celery, kept here instead of going to Redis."""
    from console.tasks import run_task

    ids: list[int] = []
    monkeypatch.setattr(run_task, "delay", ids.append)
    yield ids
