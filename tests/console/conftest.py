"""Fixtures for the console's tests: people with roles, tasks started without a worker."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import User

from console.demo.desk import seed_demo_data
from console.models import Approval, Task
from console.services import task_start

from .held import hold_refund


@pytest.fixture
def operator(django_user_model: type[User]) -> User:
    return django_user_model.objects.create_user("olga", password="pw-olga")


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
