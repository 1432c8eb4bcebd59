"""Fixtures of the API tests: an admin holding a token (``caller`` and ``enqueued`` are
tests/console/conftest.py's)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from console.records.roles import Role

from .helpers import Caller


@pytest.fixture
def admin(caller: Callable[..., Caller]) -> Caller:
    return caller(Role.ADMIN)
