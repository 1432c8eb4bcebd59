"""Who may call the API: bearer tokens only, and the console's roles."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from console import services
from console.api import tokens
from console.models import ApiToken, AuditEntry, Task, TaskState
from console.records.roles import Role

from .helpers import JSON, ApiClient, Caller, bearer, error, unknown_operation

pytestmark = pytest.mark.django_db

Start = Callable[..., Task]


# -- who may call ------------------------------------------------------------------------------


def test_a_request_without_a_token_is_refused_with_a_bearer_challenge(db: None) -> None:
    response = ApiClient().get("/api/tasks")

    assert "token is required" in error(response, 401)
    assert response["WWW-Authenticate"].startswith("Bearer")


@pytest.mark.parametrize(
    "header",
    ["Bearer lg_not-a-token-we-issued", "Bearer ", "Basic dXNlcjpwYXNz", "lg_no-scheme"],
)
def test_an_unknown_or_malformed_token_is_refused(
    caller: Callable[..., Caller], header: str
) -> None:
    caller(Role.ADMIN)  # a real token exists; these are not it

    response = ApiClient(headers={"authorization": header}).get("/api/tasks")

    error(response, 401)
    assert response["WWW-Authenticate"].startswith("Bearer")


def test_a_token_revoked_elsewhere_stops_working_once_its_kept_check_runs_out(
    admin: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert admin.get("/api/tasks").status_code == 200

    # As another process revokes it (a command, another web worker): nothing here is told.
    ApiToken.objects.filter(id=admin.token.id).update(revoked_at=timezone.now())
    later = tokens._clock() + tokens.TOKEN_CHECK_SECONDS
    monkeypatch.setattr(tokens, "_clock", lambda: later)

    response = admin.get("/api/tasks")
    assert "revoked" in error(response, 401)
    assert 'error="invalid_token"' in response["WWW-Authenticate"]


def test_a_token_of_a_deactivated_user_no_longer_works(admin: Caller) -> None:
    User.objects.filter(id=admin.user.id).update(is_active=False)

    assert "deactivated" in error(admin.get("/api/tasks"), 401)


def test_a_signed_in_browser_without_a_token_is_refused_not_redirected(
    caller: Callable[..., Caller], start: Start
) -> None:
    admin = caller(Role.ADMIN)
    task = start("test_reader", {"pages": 1})
    browser = ApiClient(enforce_csrf_checks=True)
    browser.force_login(admin.user)
    assert browser.get("/tasks/").status_code == 200  # the session itself works

    read = browser.get("/api/tasks")
    stop = browser.post(f"/api/tasks/{task.id}/stop", '{"reason": "x"}', content_type=JSON)

    error(read, 401)
    error(stop, 401)
    task.refresh_from_db()
    assert task.state == TaskState.QUEUED


def test_a_post_with_a_token_needs_no_csrf_cookie(admin: Caller, enqueued: list[int]) -> None:
    client = bearer(admin.secret, enforce_csrf_checks=True)

    response = client.post("/api/tasks", '{"agent": "test_reader"}', content_type=JSON)

    assert response.status_code == 201


def test_a_token_acts_as_its_user_even_when_a_session_says_otherwise(
    caller: Callable[..., Caller], start: Start
) -> None:
    viewer = caller(Role.VIEWER)
    admin = caller(Role.ADMIN)
    task = start("test_reader", {"pages": 1})
    viewer.client.force_login(admin.user)

    response = viewer.post(f"/api/tasks/{task.id}/stop", {"reason": "x"})

    assert "stop permission" in error(response, 403)


# -- roles -------------------------------------------------------------------------------------

EVERY_ROLE = frozenset(Role)
ALLOWED = {
    "list tasks": EVERY_ROLE,
    "read a task": EVERY_ROLE,
    "list operations": EVERY_ROLE,
    "start": {Role.OPERATOR, Role.ADMIN},
    "stop": {Role.OPERATOR, Role.ADMIN},
    "resolve": {Role.RECONCILER, Role.ADMIN},
    "resume": {Role.APPROVER, Role.ADMIN},
}


def _attempt(action: str, who: Caller, start: Start) -> tuple[Any, int]:
    """Try ``action`` in a state where it can succeed; returns the response and the status
    that success has."""
    task = start("test_notices", {"count": 1, "prefix": action.replace(" ", "-")})
    if action == "list tasks":
        return who.get("/api/tasks"), 200
    if action == "read a task":
        return who.get(f"/api/tasks/{task.id}"), 200
    if action == "list operations":
        return who.get("/api/operations"), 200
    if action == "start":
        return who.post("/api/tasks", {"agent": "test_reader", "input": {"pages": 1}}), 201
    if action == "stop":
        return who.post(f"/api/tasks/{task.id}/stop", {"reason": "wrong customer"}), 200
    if action == "resolve":
        op = unknown_operation(task)
        body = {"committed": False, "evidence": "no refund in the ledger"}
        return who.post(f"/api/operations/{op.key}/resolve", body), 200
    assert action == "resume"
    services.task_stop(task_id=task.id, actor=who.user, reason="pause")
    return who.post(f"/api/tasks/{task.id}/resume", {"reason": "go on"}), 200


@pytest.mark.parametrize("role", list(Role))
@pytest.mark.parametrize("action", list(ALLOWED))
def test_each_role_may_do_through_the_api_exactly_what_it_may_do_in_the_console(
    caller: Callable[..., Caller], start: Start, enqueued: list[int], role: Role, action: str
) -> None:
    who = caller(role)
    audited = AuditEntry.objects.count()

    response, success = _attempt(action, who, start)

    if role in ALLOWED[action]:
        assert response.status_code == success, response.content
    else:
        assert "permission" in error(response, 403)
        # A refused action leaves no trace of having happened.
        setup = 1 if action == "resume" else 0  # the stop that made the task resumable
        assert AuditEntry.objects.count() == audited + setup


def test_a_user_without_any_role_cannot_even_read(caller: Callable[..., Caller]) -> None:
    nobody = caller()

    assert "read permission" in error(nobody.get("/api/tasks"), 403)
    assert "read permission" in error(nobody.get("/api/operations"), 403)
