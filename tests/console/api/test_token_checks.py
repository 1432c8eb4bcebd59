"""A token's check, kept in the process for TOKEN_CHECK_SECONDS: a request within it sends
no statement for the token, and a token revoked, or a person deactivated or stripped of a
role, stops working within that bound (here, through this process's own services and
saves, at once). The bound's clock is moved on by the tests, not waited for."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from console.api import tokens
from console.api.tokens import TOKEN_CHECK_SECONDS, api_token_revoke
from console.models import ApiToken
from console.records.roles import Role, assign

from .helpers import Caller, error

pytestmark = pytest.mark.django_db


class Clock:
    """The bound's clock, moved on by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    moved = Clock()
    monkeypatch.setattr(tokens, "_clock", moved)
    tokens.api_token_forget_checks()  # nothing kept from another test's clock
    return moved


def _token_statements(caller: Caller) -> tuple[int, int]:
    """A request's status, and how many statements it sent about the token."""
    with CaptureQueriesContext(connection) as captured:
        status = caller.get("/api/tasks").status_code
    return status, sum("console_apitoken" in q["sql"] for q in captured.captured_queries)


def test_a_request_within_the_bound_of_a_passed_check_sends_nothing_for_its_token(
    caller: Callable[..., Caller], clock: Clock
) -> None:
    viewer = caller(Role.VIEWER)
    assert viewer.get("/api/tasks").status_code == 200  # checked, and its first use noted

    clock.now += TOKEN_CHECK_SECONDS - 0.5
    assert _token_statements(viewer) == (200, 0)

    clock.now += 0.5  # the bound: checked against the database again
    assert _token_statements(viewer) == (200, 1)


def test_a_token_revoked_by_another_process_stops_working_within_the_bound(
    caller: Callable[..., Caller], clock: Clock
) -> None:
    viewer = caller(Role.VIEWER)
    assert viewer.get("/api/tasks").status_code == 200

    # Another process's revocation: an UPDATE this one hears nothing of.
    ApiToken.objects.filter(id=viewer.token.id).update(revoked_at=timezone.now())
    clock.now += TOKEN_CHECK_SECONDS

    assert "revoked" in error(viewer.get("/api/tasks"), 401)


def test_a_token_revoked_through_this_process_stops_working_at_once(
    caller: Callable[..., Caller], clock: Clock
) -> None:
    viewer = caller(Role.VIEWER)
    assert viewer.get("/api/tasks").status_code == 200

    api_token_revoke(username=viewer.user.username, name=viewer.token.name)

    assert "revoked" in error(viewer.get("/api/tasks"), 401)


def test_a_person_deactivated_or_stripped_of_a_role_here_is_refused_at_once(
    caller: Callable[..., Caller], clock: Clock
) -> None:
    viewer, other = caller(Role.VIEWER), caller(Role.VIEWER, username="other")
    assert viewer.get("/api/tasks").status_code == 200
    assert other.get("/api/tasks").status_code == 200

    assign(other.user, [])
    person = User.objects.get(id=viewer.user.id)
    person.is_active = False
    person.save()

    assert "deactivated" in error(viewer.get("/api/tasks"), 401)
    assert "permission" in error(other.get("/api/tasks"), 403)


def test_a_refused_token_is_not_kept(caller: Callable[..., Caller], clock: Clock) -> None:
    viewer = caller(Role.VIEWER)
    ApiToken.objects.filter(id=viewer.token.id).update(revoked_at=timezone.now())
    assert viewer.get("/api/tasks").status_code == 401

    ApiToken.objects.filter(id=viewer.token.id).update(revoked_at=None)  # as if never revoked

    assert viewer.get("/api/tasks").status_code == 200
