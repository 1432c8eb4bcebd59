"""Fixtures of the API tests: callers holding a token with roles (Celery is kept out by
``enqueued`` of tests/console/conftest.py)."""

from __future__ import annotations

from collections.abc import Callable

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
