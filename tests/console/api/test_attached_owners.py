"""Whose an attached task is: only the person whose token started it drives it, and nobody
else learns its lease (docs/protocol.md, "Who may do what").

Personas: A (agent role) starts and drives a task; B (agent role, a token of their own) is
another team's agent on the same console; an operator, a reconciler and an admin keep what
their roles give them.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import pytest
from django.core import mail
from django.utils import timezone

from console import services
from console.drivers import runner
from console.models import AuditEntry, Operation, OperationState, Task, TaskState
from console.records.roles import Role

from .helpers import Caller, error
from .test_attached import Client

STEPS = {
    "model": {},
    "tools": {"calls": [{"tool": "lookup", "args": {"n": 1}}]},
    "call": {"ticket": 0},
    "result": {"ticket": 0, "result": {"kind": "SUCCESS", "data": "forged"}},
    "wait": {},
    "finish": {"answer": "done by someone else"},
    "failed": {"error": "B says the model failed"},
    "halt": {"state": "FAILED", "reason": "executor_error", "detail": "B's text"},
    "heartbeat": {},
}


@pytest.fixture
def owner(caller: Callable[..., Caller]) -> Client:
    client = Client(caller(Role.AGENT, username="team-a-bot"), lease="owner-host:1:secret01")
    assert client.start().status_code == 201
    return client


@pytest.fixture
def other(caller: Callable[..., Caller], owner: Client) -> Client:
    """B, aiming at A's task with A's own lease (as if it had been shown)."""
    client = Client(caller(Role.AGENT, username="team-b-bot"), lease=owner.lease)
    client.task = owner.task
    return client


def _nowhere(client: Client, step: str) -> Client:
    """The same client, aiming at a task that does not exist."""
    ghost = Client(client.caller, lease=client.lease)
    ghost.task = 987_654_321
    return ghost


@pytest.mark.parametrize("step", STEPS)
def test_another_persons_step_gets_the_answer_of_a_task_that_does_not_exist(
    owner: Client, other: Client, step: str
) -> None:
    owner.step("model")
    before = Task.objects.values().get(id=owner.task)

    refused = other.send(step, **STEPS[step])
    missing = _nowhere(other, step).send(step, **STEPS[step])

    assert refused.status_code == missing.status_code == 404
    assert refused.json()["code"] == missing.json()["code"] == "not_found"
    shown = refused.json()["error"].replace(str(owner.task), "N")
    assert shown == missing.json()["error"].replace("987654321", "N")
    assert owner.lease not in refused.content.decode()
    assert Task.objects.values().get(id=owner.task) == before  # nothing moved, no lease taken


def test_a_halt_with_the_owners_lease_from_another_token_changes_nothing(
    owner: Client, other: Client
) -> None:
    error(other.send("halt", **STEPS["halt"]), 404)
    task = Task.objects.get(id=owner.task)
    assert (task.state, task.detail) == (TaskState.RUNNING, "")
    assert owner.step("model")["allowed"] is True  # A goes on as if nothing happened


def test_after_the_owners_lease_lapses_nobody_else_can_take_the_task_over(
    owner: Client, other: Client
) -> None:
    Task.objects.filter(id=owner.task).update(
        lease_expires_at=timezone.now() - timedelta(seconds=1)
    )
    runner.sweep(lambda task_id: None)
    assert Task.objects.get(id=owner.task).state == TaskState.QUEUED
    stranger = Client(other.caller, lease="b-host:2:fresh")
    stranger.task = owner.task
    for step in ("heartbeat", "model", "finish"):
        error(stranger.send(step, **STEPS[step]), 404)
    assert Task.objects.get(id=owner.task).state == TaskState.QUEUED
    again = Client(owner.caller, lease="owner-host:2:after-a-crash")  # A's new process
    again.task = owner.task
    assert again.step("heartbeat")["state"] == TaskState.RUNNING
    assert again.step("model")["allowed"] is True


def test_a_retried_start_with_another_persons_request_id_makes_their_own_task(
    owner: Client, other: Client
) -> None:
    response = other.caller.post("/api/attached", owner.last)
    assert response.status_code == 201  # the same request id is someone else's: a new task
    assert response.json()["task"] != owner.task
    assert Task.objects.get(id=response.json()["task"]).created_by == other.caller.user


def test_a_lease_held_refusal_names_no_lease_and_says_how_long_to_wait(owner: Client) -> None:
    second = Client(owner.caller, lease="owner-host:9:second-process")  # A's own, too early
    second.task = owner.task
    refused = second.send("model")
    message = error(refused, 409)
    assert refused.json()["code"] == "lease_held"
    assert owner.lease not in refused.content.decode()
    assert "more seconds" in message
    assert 1 <= int(refused["Retry-After"]) <= 10  # the tests' lease is 10 s


def test_operators_and_reconcilers_keep_their_powers_over_an_attached_task(
    owner: Client, caller: Callable[..., Caller]
) -> None:
    owner.call("refund", {"cents": 5}, key="order/5/refund")
    operator = caller(Role.OPERATOR)
    stopping = operator.post(f"/api/tasks/{owner.task}/stop", {"reason": "enough"})
    assert stopping.status_code == 202
    stopped = owner.step("result", ticket=0, error={"type": "Timeout", "message": "lost",
                                                    "transient": True})  # fmt: skip
    assert stopped["state"] in (TaskState.NEEDS_HUMAN, TaskState.CANCELLED)
    assert Operation.objects.get(key="order/5/refund").state == OperationState.UNKNOWN
    reconciler = caller(Role.RECONCILER)
    settled = reconciler.post(
        "/api/operations/order/5/refund/resolve",
        {"committed": True, "evidence": "refund r-5 in the desk"},
    )
    assert settled.status_code == 200, settled.content
    assert Operation.objects.get(key="order/5/refund").state == OperationState.COMMITTED


def test_no_page_answer_or_notice_anyone_reads_shows_the_lease(
    owner: Client, caller: Callable[..., Caller], client: object
) -> None:
    owner.call("lookup", {"n": 1})
    admin = caller(Role.ADMIN)
    services.task_stop(task_id=owner.task, actor=admin.user, reason="checking what is shown")
    readings = [
        admin.get(f"/api/tasks/{owner.task}"),
        admin.get("/api/tasks"),
        admin.get("/api/operations"),
    ]
    for response in readings:
        assert response.status_code == 200
        assert owner.lease not in response.content.decode()
    from django.test import Client as Browser

    browser = Browser()
    browser.force_login(admin.user)
    for page in (f"/tasks/{owner.task}/", f"/tasks/{owner.task}/live", "/tasks/", "/", "/audit/",
                 "/operations/", "/metrics"):
        response = browser.get(page)
        assert response.status_code == 200, page
        assert owner.lease not in response.content.decode(), page
    audit = AuditEntry.objects.filter(task_id=owner.task)
    assert audit.exists() and all(owner.lease not in str(entry.after) for entry in audit)
    assert all(owner.lease not in message.body for message in mail.outbox)
