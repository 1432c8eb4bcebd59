"""The JSON API: bearer tokens only, the console's roles, the console's services, JSON errors."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.db import transaction
from django.test import Client
from django.utils import timezone

from console import runner, selectors, services
from console.api_views import api_token_issue
from console.ledger import DatabaseLedger
from console.models import (
    ApiToken,
    AuditEntry,
    Operation,
    OperationEvent,
    OperationState,
    Task,
    TaskState,
)
from console.roles import Role, assign

pytestmark = pytest.mark.django_db

Start = Callable[..., Task]
JSON = "application/json"


@dataclass
class Caller:
    """Someone calling the API: a user with roles, one token, a client that sends it."""

    user: User
    token: ApiToken
    secret: str
    client: Client

    def get(self, url: str, **query: Any) -> Any:
        return self.client.get(url, query)

    def post(self, url: str, body: Any = None) -> Any:
        data = body if isinstance(body, str | bytes) else json.dumps(body or {})
        return self.client.post(url, data=data, content_type=JSON)


@pytest.fixture
def caller(db: None) -> Callable[..., Caller]:
    def make(*roles: Role, username: str = "") -> Caller:
        user = User.objects.create_user(username or "-".join(roles) or "nobody")
        assign(user, roles)
        token, secret = api_token_issue(user=user, name="tests")
        client = Client(headers={"authorization": f"Bearer {secret}"})
        return Caller(user, token, secret, client)

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


def _unknown_operation(task: Task, key: str = "order/42/refund") -> Operation:
    """A write whose driver vanished mid-execution: the task is NEEDS_HUMAN/unknown_commit."""
    Task.objects.filter(id=task.id).update(
        state=TaskState.RUNNING, lease_owner="gone:1", lease_expires_at=timezone.now()
    )
    DatabaseLedger(task_id=task.id, owner="gone:1").claim(key, "a" * 64)
    task.refresh_from_db()
    with transaction.atomic():
        runner.recover(task, why="test")
    return Operation.objects.get(key=key)


def _error(response: Any, status: int) -> str:
    """The response's error message, after checking it is a JSON error with ``status``."""
    assert response.status_code == status, response.content
    assert response["Content-Type"] == JSON
    return str(response.json()["error"])


# -- who may call ------------------------------------------------------------------------------


def test_a_request_without_a_token_is_refused_with_a_bearer_challenge(db: None) -> None:
    response = Client().get("/api/tasks")

    assert "token is required" in _error(response, 401)
    assert response["WWW-Authenticate"].startswith("Bearer")


@pytest.mark.parametrize(
    "header",
    ["Bearer lg_not-a-token-we-issued", "Bearer ", "Basic dXNlcjpwYXNz", "lg_no-scheme"],
)
def test_an_unknown_or_malformed_token_is_refused(
    caller: Callable[..., Caller], header: str
) -> None:
    caller(Role.ADMIN)  # a real token exists; these are not it

    response = Client(headers={"authorization": header}).get("/api/tasks")

    _error(response, 401)
    assert response["WWW-Authenticate"].startswith("Bearer")


def test_a_revoked_token_stops_working_at_once(admin: Caller) -> None:
    assert admin.get("/api/tasks").status_code == 200

    ApiToken.objects.filter(id=admin.token.id).update(revoked_at=timezone.now())

    response = admin.get("/api/tasks")
    assert "revoked" in _error(response, 401)
    assert 'error="invalid_token"' in response["WWW-Authenticate"]


def test_a_token_of_a_deactivated_user_no_longer_works(admin: Caller) -> None:
    User.objects.filter(id=admin.user.id).update(is_active=False)

    assert "deactivated" in _error(admin.get("/api/tasks"), 401)


def test_a_signed_in_browser_without_a_token_is_refused_not_redirected(
    caller: Callable[..., Caller], start: Start
) -> None:
    admin = caller(Role.ADMIN)
    task = start("test_reader", {"pages": 1})
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(admin.user)
    assert browser.get("/tasks/").status_code == 200  # the session itself works

    read = browser.get("/api/tasks")
    stop = browser.post(f"/api/tasks/{task.id}/stop", '{"reason": "x"}', content_type=JSON)

    _error(read, 401)
    _error(stop, 401)
    task.refresh_from_db()
    assert task.state == TaskState.QUEUED


def test_a_post_with_a_token_needs_no_csrf_cookie(admin: Caller, enqueued: list[int]) -> None:
    client = Client(enforce_csrf_checks=True, headers={"authorization": f"Bearer {admin.secret}"})

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

    assert "stop permission" in _error(response, 403)


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
        op = _unknown_operation(task)
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
        assert "permission" in _error(response, 403)
        # A refused action leaves no trace of having happened.
        setup = 1 if action == "resume" else 0  # the stop that made the task resumable
        assert AuditEntry.objects.count() == audited + setup


def test_a_user_without_any_role_cannot_even_read(caller: Callable[..., Caller]) -> None:
    nobody = caller()

    assert "read permission" in _error(nobody.get("/api/tasks"), 403)
    assert "read permission" in _error(nobody.get("/api/operations"), 403)


# -- tokens ------------------------------------------------------------------------------------


def test_only_a_hash_of_the_secret_is_stored(admin: Caller) -> None:
    row = ApiToken.objects.filter(id=admin.token.id).values().get()

    assert row["key_hash"] == hashlib.sha256(admin.secret.encode()).hexdigest()
    assert row["prefix"] == admin.secret[:8]
    assert all(admin.secret not in str(value) for value in row.values())


def test_using_a_token_records_when_it_was_last_used(admin: Caller) -> None:
    assert admin.token.last_used_at is None

    admin.get("/api/tasks")

    admin.token.refresh_from_db()
    first = admin.token.last_used_at
    assert first is not None
    # Written at most once a minute, so a busy client does not write on every read...
    admin.get("/api/tasks")
    admin.token.refresh_from_db()
    assert admin.token.last_used_at == first
    # ...but an hour later it moves.
    ApiToken.objects.filter(id=admin.token.id).update(last_used_at=first - timedelta(hours=1))
    admin.get("/api/tasks")
    admin.token.refresh_from_db()
    assert admin.token.last_used_at is not None and admin.token.last_used_at > first


def test_the_command_prints_a_working_token_once_and_stores_only_its_hash(
    django_user_model: type[User],
) -> None:
    ana = django_user_model.objects.create_user("ana")
    assign(ana, [Role.VIEWER])
    out = StringIO()

    call_command("create_api_token", "ana", "--name", "ci", stdout=out)

    secret = out.getvalue().strip().splitlines()[-1]
    assert secret.startswith("lg_")
    token = ApiToken.objects.get(user=ana)
    assert (token.name, token.prefix) == ("ci", secret[:8])
    assert token.key_hash == hashlib.sha256(secret.encode()).hexdigest()
    client = Client(headers={"authorization": f"Bearer {secret}"})
    assert client.get("/api/tasks").status_code == 200


def test_the_command_refuses_an_unknown_user_and_a_second_live_token_of_the_same_name(
    django_user_model: type[User],
) -> None:
    django_user_model.objects.create_user("ana")
    call_command("create_api_token", "ana", "--name", "ci", stdout=StringIO())

    with pytest.raises(CommandError, match="no user"):
        call_command("create_api_token", "bob", "--name", "ci", stdout=StringIO())
    with pytest.raises(CommandError, match="already has a live token"):
        call_command("create_api_token", "ana", "--name", "ci", stdout=StringIO())
    ApiToken.objects.update(revoked_at=timezone.now())
    call_command("create_api_token", "ana", "--name", "ci", stdout=StringIO())  # a replacement
    assert ApiToken.objects.filter(user__username="ana").count() == 2


# -- reading tasks -----------------------------------------------------------------------------


def test_the_task_list_filters_and_pages_like_the_console(
    admin: Caller, start: Start, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(selectors, "TASKS_PER_PAGE", 2)
    readers = [start("test_reader", {"pages": n}) for n in range(1, 4)]
    waiter = start("test_waiter", {})
    services.task_stop(task_id=readers[0].id, actor=admin.user, reason="not needed")

    first = admin.get("/api/tasks", agent="test_reader").json()
    second = admin.get("/api/tasks", agent="test_reader", page="2").json()
    cancelled = admin.get("/api/tasks", state="CANCELLED").json()
    by_id = admin.get("/api/tasks", q=f"#{waiter.id}").json()

    assert [t["id"] for t in first["tasks"]] == [readers[2].id, readers[1].id]  # newest first
    assert first["page"] == {
        "number": 1, "pages": 2, "per_page": 2, "count": 3, "next": 2, "previous": None
    }
    assert [t["id"] for t in second["tasks"]] == [readers[0].id]
    assert second["page"]["next"] is None
    assert [(t["id"], t["reason"]) for t in cancelled["tasks"]] == [
        (readers[0].id, "operator_stop")
    ]
    assert [t["id"] for t in by_id["tasks"]] == [waiter.id]
    shown = first["tasks"][0]
    assert shown["agent"] == "test_reader"
    assert shown["state"] == "QUEUED"
    assert shown["phase"] == 1
    assert shown["counters"] == {
        "model_calls": 0, "requests": 0, "executions": 0, "tokens": 0, "elapsed_ms": 0
    }
    assert shown["limits"]["model_calls"] == readers[2].limits["model_calls"]
    assert {"created_at", "updated_at", "url"} <= set(shown)


def test_a_bad_filter_is_a_400_rather_than_every_task(admin: Caller) -> None:
    assert "unknown state" in _error(admin.get("/api/tasks", state="DONE"), 400)
    assert "page" in _error(admin.get("/api/tasks", page="two"), 400)
    assert "start at 1" in _error(admin.get("/api/tasks", page="0"), 400)


def test_a_task_shows_its_gauges_operations_phases_stop_report_and_trace(
    admin: Caller, start: Start
) -> None:
    task = start("test_notices", {"count": 1}, model_calls=10)
    Task.objects.filter(id=task.id).update(model_calls=9)
    op = _unknown_operation(task)

    body = admin.get(f"/api/tasks/{task.id}").json()

    assert (body["task"]["state"], body["task"]["reason"]) == ("NEEDS_HUMAN", "unknown_commit")
    gauge = next(g for g in body["gauges"] if g["name"] == "model_calls")
    assert (gauge["used"], gauge["limit"], gauge["percent"], gauge["level"]) == (9, 10, 90, "warn")
    assert body["operations"] == [
        {
            "key": op.key,
            "resolve_url": "/api/operations/order/42/refund/resolve",
            "task": task.id,
            "state": "UNKNOWN",
            "tool": op.tool,
            "args_preview": op.args_preview,
            "attempts": 1,
            "evidence": "",
            "claimed_at": body["operations"][0]["claimed_at"],
            "updated_at": body["operations"][0]["updated_at"],
        }
    ]
    assert [(p["number"], p["state"], p["reason"]) for p in body["phases"]] == [
        (1, "NEEDS_HUMAN", "unknown_commit")
    ]
    assert body["stop_report"]["reason"] == "unknown_commit"
    assert body["stop_report"]["report"]["state"] == "NEEDS_HUMAN"
    assert [e["kind"] for e in body["events"]] == ["stop"]
    assert body["last_seq"] == body["events"][-1]["seq"]


def test_a_client_following_a_trace_gets_only_events_it_has_not_seen(
    admin: Caller, start: Start
) -> None:
    task = start("test_reader", {"pages": 1})
    seen = admin.get(f"/api/tasks/{task.id}").json()
    assert (seen["events"], seen["last_seq"]) == ([], 0)

    services.task_stop(task_id=task.id, actor=admin.user, reason="enough")
    new = admin.get(f"/api/tasks/{task.id}", after=str(seen["last_seq"])).json()
    again = admin.get(f"/api/tasks/{task.id}", after=str(new["last_seq"])).json()

    assert [(e["kind"], e["reason"]) for e in new["events"]] == [("stop", "operator_stop")]
    assert (again["events"], again["last_seq"]) == ([], new["last_seq"])
    assert "whole number" in _error(admin.get(f"/api/tasks/{task.id}", after="-1"), 400)


def test_an_unknown_task_or_operation_is_a_404_whatever_the_action(admin: Caller) -> None:
    assert "no task 987654" in _error(admin.get("/api/tasks/987654"), 404)
    _error(admin.post("/api/tasks/987654/stop", {"reason": "x"}), 404)
    _error(admin.post("/api/tasks/987654/resume", {"reason": "x"}), 404)
    resolve = {"committed": True, "evidence": "x"}
    assert "no operation" in _error(admin.post("/api/operations/no/such/resolve", resolve), 404)
    assert "no API endpoint" in _error(admin.get("/api/tasks/abc"), 404)
    _error(admin.get(f"/api/tasks/{10**30}"), 404)  # beyond any id, not a database error


# -- starting ----------------------------------------------------------------------------------


def test_starting_a_task_creates_it_audits_it_and_enqueues_it_once_committed(
    caller: Callable[..., Caller],
    enqueued: list[int],
    django_capture_on_commit_callbacks: Callable[..., Any],
) -> None:
    operator = caller(Role.OPERATOR)

    with django_capture_on_commit_callbacks(execute=True):
        response = operator.post(
            "/api/tasks",
            {"agent": "test_reader", "input": {"pages": 2}, "limits": {"model_calls": 7}},
        )

    assert response.status_code == 201
    shown = response.json()["task"]
    assert response["Location"] == f"/api/tasks/{shown['id']}"
    assert (shown["agent"], shown["state"], shown["limits"]["model_calls"]) == (
        "test_reader", "QUEUED", 7
    )
    assert enqueued == [shown["id"]]
    entry = AuditEntry.objects.get(task_id=shown["id"])
    assert (entry.actor, entry.action) == (operator.user, "start")
    assert "through the API" in entry.reason


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({}, "agent is required"),
        ({"agent": "no_such_agent"}, "no agent named"),
        ({"agent": "test_reader", "input": [1, 2]}, "input must be a JSON object"),
        ({"agent": "test_reader", "limits": {"model_calls": -1}}, "invalid limits"),
        ({"agent": "test_reader", "inputs": {}}, "unknown field(s): inputs"),
        ({"agent": 7}, "agent must be a string"),
    ],
)
def test_a_malformed_start_is_a_400_that_says_what_is_wrong_and_creates_nothing(
    admin: Caller, body: dict[str, Any], message: str
) -> None:
    assert message in _error(admin.post("/api/tasks", body), 400)
    assert not Task.objects.exists()


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ('{"agent": "test_reader",', "not valid JSON"),
        ('{"agent": NaN}', "not valid JSON"),
        (b'{"agent": "\xff"}', "not valid JSON"),
        ('["test_reader"]', "must be a JSON object"),
    ],
)
def test_a_body_that_is_not_a_json_object_is_a_400_that_says_so(
    admin: Caller, raw: str | bytes, message: str
) -> None:
    assert message in _error(admin.post("/api/tasks", raw), 400)
    assert not Task.objects.exists()


def test_a_body_over_one_mebibyte_is_refused_with_413(admin: Caller) -> None:
    body = {"agent": "test_reader", "input": {"blob": "x" * (1024 * 1024)}}

    assert "larger than 1 MiB" in _error(admin.post("/api/tasks", body), 413)
    assert not Task.objects.exists()


def test_only_the_listed_methods_are_answered(admin: Caller, start: Start) -> None:
    task = start("test_reader", {"pages": 1})

    put = admin.client.put("/api/tasks", "{}", content_type=JSON)
    delete = admin.client.delete(f"/api/tasks/{task.id}")
    get_stop = admin.get(f"/api/tasks/{task.id}/stop")
    post_queue = admin.post("/api/operations", {})

    assert "use GET, POST" in _error(put, 405)
    assert (put["Allow"], delete["Allow"], get_stop["Allow"], post_queue["Allow"]) == (
        "GET, POST", "GET", "POST", "GET"
    )
    for response in (delete, get_stop, post_queue):
        _error(response, 405)
    assert Task.objects.get(id=task.id).state == TaskState.QUEUED


# -- stopping ----------------------------------------------------------------------------------


def test_stopping_twice_stops_once_and_the_second_is_a_409(
    caller: Callable[..., Caller], start: Start
) -> None:
    operator = caller(Role.OPERATOR)
    task = start("test_reader", {"pages": 1})

    first = operator.post(f"/api/tasks/{task.id}/stop", {"reason": "wrong customer"})
    second = operator.post(f"/api/tasks/{task.id}/stop", {"reason": "again"})

    assert first.status_code == 200
    assert (first.json()["task"]["state"], first.json()["task"]["reason"]) == (
        "CANCELLED", "operator_stop"
    )
    assert "already stopped" in _error(second, 409)
    assert AuditEntry.objects.filter(task=task, action="stop").count() == 1


def test_stopping_a_running_task_is_accepted_and_left_to_its_driver(
    admin: Caller, start: Start
) -> None:
    task = start("test_reader", {"pages": 1})
    Task.objects.filter(id=task.id).update(state=TaskState.RUNNING, lease_owner="w:1")

    response = admin.post(f"/api/tasks/{task.id}/stop", {"reason": "runaway"})

    assert response.status_code == 202
    shown = response.json()["task"]
    assert shown["state"] == "RUNNING"
    assert shown["stop_requested_at"] is not None
    again = admin.post(f"/api/tasks/{task.id}/stop", {"reason": "again"})
    assert "already stopping" in _error(again, 409)


def test_a_stop_without_a_reason_is_a_400_and_changes_nothing(admin: Caller, start: Start) -> None:
    task = start("test_reader", {"pages": 1})

    assert "reason is required" in _error(admin.post(f"/api/tasks/{task.id}/stop", {}), 400)
    assert "reason must be a string" in _error(
        admin.post(f"/api/tasks/{task.id}/stop", {"reason": ["x"]}), 400
    )
    assert Task.objects.get(id=task.id).state == TaskState.QUEUED


# -- reconciling -------------------------------------------------------------------------------


def test_the_operations_endpoint_lists_the_reconciliation_queue(
    admin: Caller, start: Start
) -> None:
    task = start("test_notices", {"count": 1})
    op = _unknown_operation(task)

    queue = admin.get("/api/operations").json()["operations"]

    assert [(o["key"], o["state"], o["task"]) for o in queue] == [(op.key, "UNKNOWN", task.id)]


def test_resolving_an_operation_settles_it_once_and_a_second_resolve_is_a_409(
    caller: Callable[..., Caller], start: Start
) -> None:
    reconciler = caller(Role.RECONCILER)
    op = _unknown_operation(start("test_notices", {"count": 1}))
    url = f"/api/operations/{op.key}/resolve"

    first = reconciler.post(
        url, {"committed": True, "evidence": "refund R-17 in the ledger", "result": {"id": 17}}
    )
    second = reconciler.post(url, {"committed": False, "evidence": "changed my mind"})

    assert first.status_code == 200
    shown = first.json()["operation"]
    assert (shown["key"], shown["state"], shown["evidence"]) == (
        "order/42/refund", "COMMITTED", "refund R-17 in the ledger"
    )
    assert "already COMMITTED" in _error(second, 409)
    op.refresh_from_db()
    assert op.state == OperationState.COMMITTED
    assert op.result["data"] == {"id": 17}
    assert OperationEvent.objects.filter(operation=op, to_state="COMMITTED").count() == 1
    entry = AuditEntry.objects.get(operation=op)
    assert (entry.actor, entry.action) == (reconciler.user, "mark_committed")
    assert reconciler.get("/api/operations").json()["operations"] == []


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"evidence": "x"}, "committed must be true"),
        ({"committed": "yes", "evidence": "x"}, "committed must be true"),
        ({"committed": False}, "evidence is required"),
        ({"committed": False, "evidence": "x", "result": {"id": 1}}, "only goes with committed"),
    ],
)
def test_a_malformed_resolve_is_a_400_and_the_operation_stays_unknown(
    admin: Caller, start: Start, body: dict[str, Any], message: str
) -> None:
    op = _unknown_operation(start("test_notices", {"count": 1}))

    assert message in _error(admin.post(f"/api/operations/{op.key}/resolve", body), 400)
    op.refresh_from_db()
    assert op.state == OperationState.UNKNOWN


def test_an_operation_still_being_executed_is_a_409_with_the_reason(
    admin: Caller, start: Start
) -> None:
    task = start("test_notices", {"count": 1})
    Task.objects.filter(id=task.id).update(
        state=TaskState.RUNNING, lease_owner="w:1",
        lease_expires_at=timezone.now() + timedelta(minutes=1),
    )
    DatabaseLedger(task_id=task.id, owner="w:1").claim("order-1-refund", "b" * 64)

    response = admin.post(
        "/api/operations/order-1-refund/resolve", {"committed": False, "evidence": "?"}
    )

    assert "being executed right now" in _error(response, 409)
    assert Operation.objects.get(key="order-1-refund").state == OperationState.IN_FLIGHT


# -- resuming ----------------------------------------------------------------------------------


def test_resuming_waits_for_reconciliation_then_opens_a_new_phase(
    caller: Callable[..., Caller], start: Start, enqueued: list[int]
) -> None:
    approver = caller(Role.APPROVER)
    reconciler = caller(Role.RECONCILER)
    task = start("test_notices", {"count": 1})
    op = _unknown_operation(task)
    url = f"/api/tasks/{task.id}/resume"

    refused = approver.post(url, {"reason": "looks fine"})
    reconciler.post(f"/api/operations/{op.key}/resolve", {"committed": False, "evidence": "none"})
    resumed = approver.post(url, {"reason": "the refund never went out"})
    again = approver.post(url, {"reason": "double click"})

    assert f"reconcile first: {op.key}" in _error(refused, 409)
    assert resumed.status_code == 200
    assert (resumed.json()["task"]["state"], resumed.json()["task"]["phase"]) == ("QUEUED", 2)
    assert "not stopped" in _error(again, 409)
    assert AuditEntry.objects.filter(task=task, action="approve_resumption").count() == 1


def test_a_task_out_of_budget_resumes_only_with_an_explicit_grant(
    admin: Caller, start: Start
) -> None:
    task = start("test_reader", {"pages": 1}, model_calls=4)
    Task.objects.filter(id=task.id).update(
        state=TaskState.PARTIAL, reason="model_budget", model_calls=4
    )
    url = f"/api/tasks/{task.id}/resume"

    without = admin.post(url, {"reason": "more"})
    malformed = admin.post(url, {"reason": "more", "grant": {"model_calls": "five"}})
    granted = admin.post(url, {"reason": "more", "grant": {"model_calls": 5}})

    assert "grant an explicit amount" in _error(without, 409)
    assert "whole number" in _error(malformed, 400)
    assert granted.status_code == 200
    shown = granted.json()["task"]
    assert shown["limits"]["model_calls"] == 9
    assert shown["counters"]["model_calls"] == 4  # what was spent carries over


def test_a_revoked_token_is_refused_from_then_on_and_its_name_can_be_reused(
    django_user_model: type[User],
) -> None:
    ana = django_user_model.objects.create_user("ana")
    assign(ana, [Role.VIEWER])
    out = StringIO()
    call_command("create_api_token", "ana", "--name", "ci", stdout=out)
    secret = out.getvalue().strip().splitlines()[-1]
    client = Client(headers={"authorization": f"Bearer {secret}"})
    assert client.get("/api/tasks").status_code == 200

    said = StringIO()
    call_command("revoke_api_token", "ana", "--name", "ci", stdout=said)

    assert "revoked API token 'ci' of ana" in said.getvalue()
    refused = client.get("/api/tasks")
    assert refused.status_code == 401
    assert "revoked" in refused.json()["error"]
    assert ApiToken.objects.get(user=ana).revoked_at is not None  # kept, not deleted
    call_command("create_api_token", "ana", "--name", "ci", stdout=StringIO())
    assert ApiToken.objects.filter(user=ana, revoked_at__isnull=True).count() == 1


def test_revoking_a_token_that_is_not_live_says_which_ones_are(
    django_user_model: type[User],
) -> None:
    django_user_model.objects.create_user("ana")
    call_command("create_api_token", "ana", "--name", "ci", stdout=StringIO())
    call_command("create_api_token", "ana", "--name", "laptop", stdout=StringIO())
    call_command("revoke_api_token", "ana", "--name", "laptop", stdout=StringIO())

    with pytest.raises(CommandError, match=r"no live token named 'laptop' \(live tokens: 'ci'\)"):
        call_command("revoke_api_token", "ana", "--name", "laptop", stdout=StringIO())
    nobody = r"bob has no live token named 'ci' \(live tokens: none\)"
    with pytest.raises(CommandError, match=nobody):
        call_command("revoke_api_token", "bob", "--name", "ci", stdout=StringIO())
    assert ApiToken.objects.filter(revoked_at__isnull=True).count() == 1
