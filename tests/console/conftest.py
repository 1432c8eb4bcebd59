"""Fixtures for the console's tests: people with roles, tasks started without a worker,
Celery kept out."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.contrib.auth.models import User

from console.api.tokens import api_token_issue
from console.demo.desk import seed_demo_data
from console.models import Approval, Task
from console.records.roles import Role, assign
from console.services import task_start

from .api.helpers import ApiClient, Caller, bearer
from .held import hold_refund


@pytest.fixture
def operator(django_user_model: type[User]) -> User:
    return django_user_model.objects.create_user("olga", password="pw-olga")


@pytest.fixture
def person(db: None) -> Callable[[Role], User]:
    """Make a new person holding only ``role`` (each call a person of their own)."""
    count = itertools.count()

    def make(role: Role) -> User:
        user = User.objects.create_user(f"{role}-{next(count)}")
        assign(user, (role,))
        return user

    return make


@pytest.fixture
def api(person: Callable[[Role], User]) -> Callable[[Role], ApiClient]:
    """A client holding a token of a new person with ``role``; its answers are checked
    against the OpenAPI document."""

    def make(role: Role) -> ApiClient:
        _, secret = api_token_issue(user=person(role), name="tests")
        return bearer(secret)

    return make


@pytest.fixture
def caller(db: None) -> Callable[..., Caller]:
    """Make a caller of the API: a person with ``roles`` (named after them unless
    ``username`` is given) holding a token of their own."""

    def make(*roles: Role, username: str = "") -> Caller:
        user = User.objects.create_user(username or "-".join(roles) or "nobody")
        assign(user, roles)
        token, secret = api_token_issue(user=user, name="tests")
        return Caller(user, token, secret, bearer(secret))

    return make


@pytest.fixture
def enqueued(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Task ids the services hand to Celery, kept here instead of going to Redis."""
    from console.tasks import run_task

    ids: list[int] = []
    monkeypatch.setattr(run_task, "delay", ids.append)
    yield ids


@pytest.fixture
def seeded(db: None) -> None:
    seed_demo_data()


@pytest.fixture
def start(db: None) -> Callable[..., Task]:
    """Start a task without enqueueing it: the test drives it in-process."""

    def _start(agent: str, input: dict[str, Any] | None = None, **limits: Any) -> Task:
        return task_start(
            agent=agent, input=input or {}, limits=limits or None, enqueue=lambda task_id: None
        )

    return _start


@pytest.fixture
def held(seeded: None, start: Callable[..., Task]) -> Approval:
    """A refund over the limit, held for approval as the runner holds it."""
    return hold_refund(start)
