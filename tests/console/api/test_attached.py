"""The step protocol of attached tasks (docs/protocol.md), through the API on real
PostgreSQL: every answer is checked against the OpenAPI document by the test client."""

from __future__ import annotations

import itertools
import json
import threading
import time
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from console import services
from console.drivers import attached, runner
from console.models import (
    EventKind,
    Operation,
    OperationEvent,
    OperationState,
    StepRequest,
    Task,
    TaskState,
    TraceEvent,
)
from console.records.roles import Role
from console.store import NeedsLock
from console.store.postgresql import PostgresStore

from .helpers import Caller, error

TOOLS = {"lookup": "read", "refund": "write"}
LIMITS = {"deadline_ms": 60_000, "model_calls": 8, "requests": 8, "executions": 6, "same": 2}


class Client:
    """An attached agent's process, speaking the protocol by hand."""

    def __init__(self, caller: Caller, *, lease: str = "") -> None:
        self.caller = caller
        self.lease = lease or f"test:{uuid.uuid4().hex[:8]}"
        self.task = 0
        self.ids = itertools.count(1)
        self.last: dict[str, Any] = {}

    def start(self, **fields: Any) -> Any:
        body = {
            "protocol": 1,
            "request_id": f"start-{uuid.uuid4().hex}",
            "lease": self.lease,
            "agent": "desk-bot",
            "client": "tests/1",
            "tools": TOOLS,
            "limits": LIMITS,
            **fields,
        }
        response = self.caller.post("/api/attached", body)
        if response.status_code in (200, 201):
            self.task = response.json()["task"]
        self.last = body
        return response

    def send(self, step: str, *, request_id: str = "", **fields: Any) -> Any:
        body = {
            "protocol": 1,
            "request_id": request_id or f"r-{next(self.ids)}-{uuid.uuid4().hex[:8]}",
            "lease": self.lease,
            "step": step,
            **fields,
        }
        self.last = body
        return self.caller.post(f"/api/attached/{self.task}/steps", body)

    def step(self, step: str, **fields: Any) -> dict[str, Any]:
        response = self.send(step, **fields)
        assert response.status_code == 200, response.content
        answer: dict[str, Any] = response.json()
        return answer

    def call(self, tool: str, args: dict[str, Any], key: str | None = None) -> dict[str, Any]:
        """A model call proposing one call, up to that call's decision."""
        assert self.step("model")["allowed"] is True
        call: dict[str, Any] = {"tool": tool, "args": args}
        if key is not None:
            call["operation_key"] = key
        tools = self.step("tools", calls=[call], usage={"tokens": 30})
        if tools["stop"] is not None:
            return tools
        (ticket,) = tools["admitted"]
        return self.step("call", ticket=ticket["ticket"])


@pytest.fixture
def agent(caller: Callable[..., Caller]) -> Client:
    return Client(caller(Role.AGENT))


@pytest.fixture
def started(agent: Client) -> Client:
    response = agent.start()
    assert response.status_code == 201, response.content
    return agent


def _task(client: Client) -> Task:
    return Task.objects.get(id=client.task)


# -- starting ----------------------------------------------------------------------------------


def test_a_start_creates_a_running_task_marked_attached_by_its_client(agent: Client) -> None:
    response = agent.start(input={"order": 42})
    assert response.status_code == 201
    answer = response.json()
    task = _task(agent)
    assert answer["state"] == "RUNNING" and answer["stop"] is None
    assert answer["remaining"]["model_calls"] == 8
    assert task.client == "tests/1" and task.agent == "desk-bot" and task.tools == TOOLS
    assert task.lease_owner == agent.lease
    shown = agent.caller.get(f"/api/tasks/{task.id}").json()["task"]
    assert shown["client"] == "tests/1"


def test_a_retried_start_finds_the_task_it_created(agent: Client) -> None:
    first = agent.start()
    again = agent.caller.post("/api/attached", agent.last)
    assert again.status_code == 200
    assert again.json()["task"] == first.json()["task"]
    assert Task.objects.count() == 1


def test_a_start_request_id_used_for_another_body_is_refused(agent: Client) -> None:
    agent.start()
    other = {**agent.last, "agent": "another-bot"}
    assert "another task" in error(agent.caller.post("/api/attached", other), 409)
    assert Task.objects.count() == 1


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"tools": {}}, "tools must name every tool"),
        ({"tools": {"refund": "delete"}}, '"read" or "write"'),
        ({"agent": "desk bot!"}, "letters, digits"),
        ({"protocol": 2}, "protocol must be 1"),
        ({"limits": {"model_calls": -1}}, "invalid limits"),
    ],
)
def test_a_malformed_start_is_refused_and_creates_nothing(
    agent: Client, fields: dict[str, Any], words: str
) -> None:
    response = agent.start(**fields)
    assert response.status_code == 400, response.content
    assert words in response.json()["error"]
    assert not Task.objects.exists()


def test_a_token_without_the_agent_role_may_not_attach(caller: Callable[..., Caller]) -> None:
    operator = Client(caller(Role.OPERATOR))
    assert "drive" in error(operator.start(), 403)
    assert not Task.objects.exists()


# -- a loop, step by step ----------------------------------------------------------------------


def test_a_read_runs_on_execute_and_its_result_is_in_the_trace(started: Client) -> None:
    decision = started.call("lookup", {"order": 42})
    assert decision["action"] == "execute"
    result = {"kind": "SUCCESS", "data": {"status": "shipped"}}
    assert started.step("result", ticket=0, result=result)["stop"] is None
    assert started.step("wait")["wait_ms"] == 0
    events = list(TraceEvent.objects.filter(task_id=started.task).order_by("seq"))
    assert [e.kind for e in events] == [EventKind.MODEL_CALL, EventKind.REQUEST]
    assert events[0].tokens == 30
    assert events[1].decision == "executed" and "shipped" in events[1].result_preview
    task = _task(started)
    assert (task.model_calls, task.requests, task.executions, task.tokens) == (1, 1, 1, 30)


def test_a_finish_without_evidence_is_partial_and_with_it_completed(
    caller: Callable[..., Caller],
) -> None:
    unverified, verified = Client(caller(Role.AGENT)), Client(caller(Role.AGENT, username="b"))
    for client in (unverified, verified):
        client.start()
        client.step("model")
    stop = unverified.step("finish", answer="done")["stop"]
    assert (stop["state"], stop["reason"]) == ("PARTIAL", "goal_unverified")
    evidence = {"revision": 1, "done": True}
    stop = verified.step("finish", answer="done", evidence=evidence)["stop"]
    assert (stop["state"], stop["reason"]) == ("COMPLETED", "goal_met")
    assert _task(verified).state == TaskState.COMPLETED


def test_the_same_call_again_and_again_is_stopped_same_call(started: Client) -> None:
    answers = []
    for _ in range(4):
        decision = started.call("lookup", {"order": 42})
        answers.append(decision)
        if decision["stop"] is not None:
            break
        started.step("result", ticket=0, result={"kind": "SUCCESS", "data": {"status": "late"}})
        started.step("wait")
    stop = answers[-1]["stop"]
    assert (stop["state"], stop["reason"]) == ("PARTIAL", "same_call")
    assert _task(started).executions == 2
    # Terminal is sticky: every later step answers the same report.
    later = started.step("model")
    assert later["stop"] == stop and later["state"] == "PARTIAL"


def test_a_write_is_claimed_before_execute_and_committed_by_its_result(started: Client) -> None:
    decision = started.call("refund", {"order": 42, "cents": 500}, key="order/42/refund")
    assert decision["action"] == "execute"
    op = Operation.objects.get(key="order/42/refund")
    assert op.state == OperationState.IN_FLIGHT and op.task_id == started.task
    started.step("result", ticket=0, result={"kind": "SUCCESS", "data": {"refund": "r-1"}})
    op.refresh_from_db()
    assert op.state == OperationState.COMMITTED and op.result["data"] == {"refund": "r-1"}


def test_a_second_agent_asking_for_a_committed_write_reuses_its_result(
    caller: Callable[..., Caller],
) -> None:
    first, second = Client(caller(Role.AGENT)), Client(caller(Role.AGENT, username="other"))
    first.start(input={"n": 1})
    second.start(input={"n": 2})
    args, key = {"order": 42, "cents": 500}, "order/42/refund"
    assert first.call("refund", args, key)["action"] == "execute"
    pending = second.call("refund", args, key)
    assert pending["action"] == "reuse" and pending["result"]["kind"] == "PENDING"
    second.step("result", ticket=0)
    first.step("result", ticket=0, result={"kind": "SUCCESS", "data": {"refund": "r-1"}})
    second.step("wait")
    reused = second.call("refund", args, key)
    assert reused["action"] == "reuse" and reused["result"]["data"] == {"refund": "r-1"}
    assert Operation.objects.get(key=key).attempts == 1


def test_a_retried_call_gets_the_same_answer_and_never_claims_twice(started: Client) -> None:
    started.step("model")
    started.step(
        "tools", calls=[{"tool": "refund", "args": {"cents": 1}, "operation_key": "k-1"}]
    )
    first = started.send("call", request_id="claim-1", ticket=0)
    again = started.send("call", request_id="claim-1", ticket=0)
    assert first.json() == again.json() and first.json()["action"] == "execute"
    op = Operation.objects.get(key="k-1")
    assert op.attempts == 1
    assert OperationEvent.objects.filter(operation=op).count() == 1
    assert StepRequest.objects.filter(task_id=started.task, request_id="claim-1").count() == 1


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("enter", [False, True])
def test_a_retry_that_arrives_while_its_request_runs_gets_the_same_answer(
    started: Client, monkeypatch: pytest.MonkeyPatch, enter: bool
) -> None:
    """Holding the row (a step that takes the lock: its read without it is refused here),
    the retry waits for the task row; once the first request commits, it must find that
    request's answer, not decide the step again (it would be refused as decided). The same
    race without the lock: tests/console/api/test_attached_unlocked_races.py."""
    started.step("model")
    if connection.vendor == "postgresql":

        def locking(store: Any, request_id: str) -> None:
            raise NeedsLock("this test holds the row")

        monkeypatch.setattr(PostgresStore, "read_step", locking)
    refund = {"tool": "refund", "args": {"cents": 3}, "operation_key": "order/3/refund"}
    if enter:
        step, fields = "tools", {"calls": [refund], "enter": True}
    else:
        started.step("tools", calls=[refund])
        step, fields = "call", {"ticket": 0}
    body = {"protocol": 1, "request_id": "r-x", "lease": started.lease, "step": step, **fields}
    decide = attached._Driver.run

    def slowly(driver: Any, *args: Any, **kwargs: Any) -> Any:
        answer = decide(driver, *args, **kwargs)
        if threading.current_thread().name == "first":
            time.sleep(0.5)  # the claim made, the row held: the retry arrives now
        return answer

    monkeypatch.setattr(attached._Driver, "run", slowly)
    answers: dict[str, Any] = {}

    def send(name: str) -> None:
        try:
            answers[name] = attached.attached_step(
                actor=started.caller.user, task_id=started.task, request_id="r-x",
                lease=started.lease, step=step, fields=dict(fields),
                fingerprint=attached.body_hash(body),
            )  # fmt: skip
        except Exception as exc:  # the assertion below says which
            answers[name] = exc
        finally:
            connection.close()

    first = threading.Thread(target=send, args=("first",), name="first")
    first.start()
    time.sleep(0.2)
    retry = threading.Thread(target=send, args=("retry",), name="retry")
    retry.start()
    first.join()
    retry.join()

    assert answers["retry"] == answers["first"]
    assert answers["first"]["action"] == "execute"
    op = Operation.objects.get(key="order/3/refund")
    assert (op.state, op.attempts) == (OperationState.IN_FLIGHT, 1)
    assert StepRequest.objects.filter(task_id=started.task, request_id="r-x").count() == 1


def test_a_request_id_reused_for_another_step_is_refused(started: Client) -> None:
    started.send("model", request_id="same")
    assert error(started.send("wait", request_id="same"), 409)
    assert started.send("wait", request_id="same").json()["code"] == "request_id_reused"


def test_a_write_whose_result_is_lost_is_unknown_and_the_task_waits_for_a_person(
    started: Client,
) -> None:
    started.call("refund", {"cents": 9}, key="order/9/refund")
    lost = {"type": "TimeoutError", "message": "read timed out", "transient": True}
    stop = started.step("result", ticket=0, error=lost)["stop"]
    assert stop["state"] == "NEEDS_HUMAN"
    assert "TimeoutError: read timed out" in stop["detail"]
    assert stop["operation_key"] == "order/9/refund" and stop["operation_state"] == "UNKNOWN"
    assert Operation.objects.get(key="order/9/refund").state == OperationState.UNKNOWN


def test_a_batch_is_decided_call_by_call(started: Client) -> None:
    started.step("model")
    calls = [
        {"tool": "lookup", "args": {"order": 1}},
        {"tool": "lookup", "args": {"order": 2}},
    ]
    admitted = started.step("tools", calls=calls)["admitted"]
    assert [t["ticket"] for t in admitted] == [0, 1]
    for ticket in (0, 1):
        assert started.step("call", ticket=ticket)["action"] == "execute"
    for ticket in (0, 1):
        data = {"order": ticket}
        started.step("result", ticket=ticket, result={"kind": "SUCCESS", "data": data})
    assert _task(started).executions == 2


# -- Stop, leases, resumption ------------------------------------------------------------------


def test_an_operators_stop_is_answered_at_the_next_step(
    started: Client, caller: Callable[..., Caller]
) -> None:
    operator = caller(Role.OPERATOR)
    started.call("lookup", {"order": 1})
    started.step("result", ticket=0, result={"kind": "SUCCESS", "data": 1})
    services.task_stop(task_id=started.task, actor=operator.user, reason="enough")
    stop = started.step("wait")["stop"]
    assert (stop["state"], stop["reason"]) == ("CANCELLED", "operator_stop")
    assert started.step("model")["stop"] == stop


def test_an_operators_stop_refuses_the_claim_of_a_call_admitted_before_it(
    started: Client, caller: Callable[..., Caller]
) -> None:
    started.step("model")
    started.step("tools", calls=[{"tool": "refund", "args": {}, "operation_key": "k-2"}])
    services.task_stop(task_id=started.task, actor=caller(Role.OPERATOR).user, reason="no")
    answer = started.step("call", ticket=0)
    assert answer["stop"]["reason"] == "operator_stop"
    assert not Operation.objects.filter(key="k-2").exists()


def test_another_lease_may_not_drive_a_task_whose_client_is_alive(
    started: Client, caller: Callable[..., Caller]
) -> None:
    intruder = Client(started.caller, lease="someone-else")
    intruder.task = started.task
    response = intruder.send("model")
    assert error(response, 409) and response.json()["code"] == "lease_held"
    assert _task(started).model_calls == 0


def test_a_vanished_clients_write_becomes_unknown_when_its_lease_expires(
    started: Client,
) -> None:
    started.call("refund", {"cents": 3}, key="order/3/refund")
    # The client vanishes mid-write; its lease runs out and the sweep finds it.
    Task.objects.filter(id=started.task).update(
        lease_expires_at=timezone.now() - timedelta(seconds=1)
    )
    enqueued: list[int] = []
    counts = runner.sweep(enqueued.append)
    assert counts["recovered"] == 1 and enqueued == []
    task = _task(started)
    assert task.state == TaskState.QUEUED  # waiting for its client (and its lookup)
    assert Operation.objects.get(key="order/3/refund").state == OperationState.UNKNOWN
    # The client that ran it comes back with its SUCCESS after its lease ran out: nobody
    # else can have run it (UNKNOWN never runs again), so its word settles it, audited.
    answer = started.step("result", ticket=0, result={"kind": "SUCCESS", "data": "r-3"})
    assert answer["stop"] is None
    op = Operation.objects.get(key="order/3/refund")
    assert op.state == OperationState.COMMITTED
    assert "after its lease ran out" in op.history.order_by("id").last().evidence


def test_a_late_failure_from_the_client_that_ran_a_write_leaves_it_for_a_person(
    started: Client,
) -> None:
    started.call("refund", {"cents": 3}, key="order/3/refund")
    Task.objects.filter(id=started.task).update(
        lease_expires_at=timezone.now() - timedelta(seconds=1)
    )
    runner.sweep(lambda task_id: None)
    error = {"type": "Timeout", "message": "the desk did not answer", "transient": True}
    stop = started.step("result", ticket=0, error=error)["stop"]
    assert (stop["state"], stop["reason"]) == ("NEEDS_HUMAN", "unknown_commit")
    assert Operation.objects.get(key="order/3/refund").state == OperationState.UNKNOWN


def test_a_workers_drive_leaves_an_attached_task_to_its_client(started: Client) -> None:
    assert runner.drive(started.task).startswith("attached")
    assert _task(started).lease_owner == started.lease


def test_after_reconciliation_and_resumption_a_new_process_reuses_the_committed_write(
    started: Client, caller: Callable[..., Caller], enqueued: list[int]
) -> None:
    args, key = {"order": 7, "cents": 700}, "order/7/refund"
    started.call("refund", args, key)
    lost = {"type": "ConnectionError", "message": "reset", "transient": True}
    started.step("result", ticket=0, error=lost)
    reconciler, approver = caller(Role.RECONCILER), caller(Role.APPROVER)
    services.operation_mark_committed(
        key=key, actor=reconciler.user, evidence="refund r-7 in the desk", result={"refund": "r-7"}
    )
    services.task_approve_resumption(task_id=started.task, actor=approver.user, reason="ok")
    assert _task(started).state == TaskState.QUEUED and enqueued == []
    # A new process, with the task id only.
    again = Client(started.caller, lease="new-process")
    again.task = started.task
    reused = again.call("refund", args, key)
    assert reused["phase"] == 2 and reused["action"] == "reuse"
    assert reused["result"]["data"] == {"refund": "r-7"}
    task = _task(again)
    assert task.model_calls == 2 and task.executions == 1  # the counters carried over
    assert Operation.objects.get(key=key).attempts == 1


# -- bad input changes nothing -----------------------------------------------------------------


def _unchanged(client: Client) -> tuple[Any, ...]:
    task = _task(client)
    return (task.state, task.model_calls, task.requests, task.executions, task.checkpoint)


@pytest.mark.parametrize(
    ("step", "fields", "code"),
    [
        ("tools", {"calls": [{"tool": "lookup", "args": {}}]}, "step_out_of_order"),
        ("call", {"ticket": 0}, "unknown_call"),
        ("result", {"ticket": 0, "result": {"kind": "SUCCESS"}}, "unknown_call"),
        ("dance", {}, "invalid_input"),
        ("model", {"reserve": -1}, "invalid_input"),
        ("model", {"usage": {"tokens": "many"}}, "invalid_input"),
        ("model", {"protocol": 7}, "unsupported_protocol"),
        ("model", {"extra": 1}, "invalid_input"),
        ("halt", {"state": "CANCELLED", "reason": "operator_stop"}, "invalid_input"),
    ],
)
def test_a_step_that_does_not_fit_is_refused_and_changes_nothing(
    started: Client, step: str, fields: dict[str, Any], code: str
) -> None:
    before = _unchanged(started)
    response = started.send(step, **fields)
    assert response.status_code in (400, 409), response.content
    assert response.json()["code"] == code
    assert _unchanged(started) == before


def test_results_for_calls_never_allowed_or_given_twice_are_refused(started: Client) -> None:
    started.step("model")
    calls = [{"tool": "lookup", "args": {"n": 1}}, {"tool": "lookup", "args": {"n": 2}}]
    started.step("tools", calls=calls)
    never = started.send("result", ticket=1, result={"kind": "SUCCESS"})
    assert never.status_code == 409 and never.json()["code"] == "call_not_allowed"
    started.step("call", ticket=0)
    started.step("result", ticket=0, result={"kind": "SUCCESS", "data": 1})
    twice = started.send("result", ticket=0, result={"kind": "SUCCESS", "data": 2})
    assert twice.status_code == 409 and twice.json()["code"] == "result_given"
    assert _task(started).executions == 1


def test_a_model_step_with_a_result_unreported_is_out_of_order(started: Client) -> None:
    started.call("lookup", {"n": 1})
    premature = started.send("model")
    assert premature.status_code == 409 and premature.json()["code"] == "step_out_of_order"
    assert "report the result of call 0" in premature.json()["error"]


def test_text_the_database_cannot_hold_is_a_400(started: Client) -> None:
    started.step("model")
    response = started.send("tools", calls=[{"tool": "lookup", "args": {"q": "a\x00b"}}])
    assert response.status_code == 400 and "NUL" in response.json()["error"]


def test_an_unknown_task_is_404_and_a_hosted_one_409(
    started: Client, start: Callable[..., Task]
) -> None:
    started.task = 999_999
    assert started.send("model").status_code == 404
    hosted = start("test_reader", {"pages": 1})
    started.task = hosted.id
    assert started.send("model").status_code == 404  # someone else's: as if it were not there
    Task.objects.filter(id=hosted.id).update(created_by=started.caller.user)
    response = started.send("model")  # the person's own hosted task: the workers drive it
    assert response.status_code == 409 and response.json()["code"] == "not_attached"


def test_a_tool_the_client_did_not_declare_is_a_bad_call(started: Client) -> None:
    started.step("model")
    stop = started.step("tools", calls=[{"tool": "delete_everything", "args": {}}])["stop"]
    assert stop["reason"] == "bad_call"


def test_a_write_without_an_operation_key_is_stopped_before_anything_is_claimed(
    started: Client,
) -> None:
    started.step("model")
    stop = started.step("tools", calls=[{"tool": "refund", "args": {"cents": 1}}])["stop"]
    assert stop["reason"] == "missing_operation_key"
    assert not Operation.objects.exists()


def test_what_is_not_a_result_is_a_bad_result(started: Client) -> None:
    started.call("lookup", {"n": 1})
    wrong = {"kind": "<not a result>", "data": "<object at 0x1>"}
    stop = started.step("result", ticket=0, result=wrong)["stop"]
    assert (stop["state"], stop["reason"]) == ("FAILED", "bad_result")


def test_an_inspector_that_failed_in_the_client_stops_as_untrusted_evidence(
    started: Client,
) -> None:
    started.call("lookup", {"n": 1})
    evidence = {"error": "RuntimeError: the records did not answer"}
    stop = started.step("result", ticket=0, result={"kind": "SUCCESS"}, evidence=evidence)["stop"]
    assert stop["reason"] == "invalid_evidence"
    assert "the records did not answer" in stop["detail"]


def test_a_heartbeat_renews_the_lease_and_says_whether_a_stop_is_asked(
    started: Client, caller: Callable[..., Caller]
) -> None:
    before = _task(started).lease_expires_at
    beat = started.step("heartbeat")
    assert beat["stop_requested"] is False and beat["lease_seconds"] == 10.0
    assert _task(started).lease_expires_at > before
    services.task_stop(task_id=started.task, actor=caller(Role.OPERATOR).user, reason="x")
    assert started.step("heartbeat")["stop_requested"] is True
    assert not StepRequest.objects.filter(task_id=started.task, step="heartbeat").exists()


def _stopped_mid_batch(
    client: Client, caller: Callable[..., Caller]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Two writes admitted at once; the first told to execute; an operator's Stop; then
    the second's call, which answers the stop. The first write is still running in the
    client. Returns the two calls' answers."""
    client.step("model")
    calls = [
        {"tool": "refund", "args": {"cents": 2}, "operation_key": "mine"},
        {"tool": "refund", "args": {"cents": 3}, "operation_key": "next"},
    ]
    client.step("tools", calls=calls)
    first = client.step("call", ticket=0)
    # The client runs its batch at once; meanwhile an operator presses Stop.
    services.task_stop(task_id=client.task, actor=caller(Role.OPERATOR).user, reason="halt")
    return first, client.step("call", ticket=1)


def test_a_write_running_when_its_sibling_stopped_the_task_is_still_settled(
    started: Client, caller: Callable[..., Caller]
) -> None:
    first, stop = _stopped_mid_batch(started, caller)
    assert first["action"] == "execute"
    stop = stop["stop"]
    assert stop["reason"] == "operator_stop"
    assert Operation.objects.get(key="mine").state == OperationState.IN_FLIGHT
    late = started.step("result", ticket=0, result={"kind": "SUCCESS", "data": "refunded"})
    assert late["stop"]["reason"] == "operator_stop"  # the stop stands
    mine = Operation.objects.get(key="mine")
    assert mine.state == OperationState.COMMITTED and mine.result["data"] == "refunded"
    again = started.step("result", ticket=0, result={"kind": "SUCCESS", "data": "twice"})
    assert again["state"] == "CANCELLED"
    assert Operation.objects.get(key="mine").result["data"] == "refunded"  # settled once
    assert not Operation.objects.filter(key="next").exists()


# -- what review found -------------------------------------------------------------------------


def test_keys_and_tool_names_that_look_like_secrets_stay_exact_across_steps(
    caller: Callable[..., Caller],
) -> None:
    client = Client(caller(Role.AGENT))
    client.start(tools={"pk_lookup_customer": "read", "refund": "write"})
    key = "order-sk-1234567890abcdef-refund"
    client.step("model")
    calls = [
        {"tool": "pk_lookup_customer", "args": {"id": 1}},
        {"tool": "refund", "args": {"cents": 5}, "operation_key": key},
    ]
    client.step("tools", calls=calls)
    client.step("call", ticket=0)
    client.step("result", ticket=0, result={"kind": "SUCCESS", "data": "found"})
    assert client.step("call", ticket=1)["action"] == "execute"  # restored from the checkpoint
    assert Operation.objects.filter(key=key, state=OperationState.IN_FLIGHT).exists()
    tools = set(TraceEvent.objects.filter(task_id=client.task).values_list("tool", flat=True))
    assert "pk_lookup_customer" in tools


def test_secrets_in_arguments_are_kept_neither_in_the_answers_nor_the_checkpoint(
    started: Client,
) -> None:
    started.step("model")
    call = {"tool": "lookup", "args": {"order": 1, "api_token": "s3cr3t-value"}}
    admitted = started.step("tools", calls=[call])["admitted"]
    assert "s3cr3t-value" not in str(admitted)
    stored = StepRequest.objects.filter(task_id=started.task, step="tools").get()
    assert "s3cr3t-value" not in str(stored.answer)
    assert "s3cr3t-value" not in str(_task(started).checkpoint)


def test_a_write_an_attached_client_may_still_be_running_is_not_settled_by_a_person(
    started: Client, caller: Callable[..., Caller]
) -> None:
    _stopped_mid_batch(started, caller)  # the task is CANCELLED, "mine" still running
    reconciler = caller(Role.RECONCILER).user
    with pytest.raises(services.Refused, match="being executed"):
        services.operation_mark_not_committed(key="mine", actor=reconciler, evidence="none")
    # Once a lease has passed since the stop, its client is gone: a person may settle it.
    Task.objects.filter(id=started.task).update(
        finished_at=timezone.now() - timedelta(seconds=11)
    )
    services.operation_mark_not_committed(
        key="mine", actor=reconciler, evidence="not in the desk", override="checked by hand"
    )
    assert Operation.objects.get(key="mine").state == OperationState.NOT_COMMITTED


def test_a_late_result_from_another_lease_settles_nothing(
    started: Client, caller: Callable[..., Caller]
) -> None:
    _stopped_mid_batch(started, caller)
    stranger = Client(started.caller, lease="stranger")
    stranger.task = started.task
    stranger.step("result", ticket=0, result={"kind": "SUCCESS", "data": "forged"})
    assert Operation.objects.get(key="mine").state == OperationState.IN_FLIGHT


@pytest.mark.parametrize(
    ("fields", "code"),
    [
        ({"usage": {"cost": 5}}, "step_out_of_order"),  # no model call waits for its cost
        ({"usage": {"tokens": 3_000_000_000}}, "invalid_input"),
        ({"result": {"kind": "SUCCESS", "attempts": 10**12}}, "invalid_input"),
        ({"result": {"kind": "SUCCESS", "wait_ms": 10**400}}, "invalid_input"),
        ({"result": {"kind": "SUCCESS"}, "evidence": {"revision": 10**20, "done": False}},
         "invalid_input"),
    ],
)
def test_numbers_beyond_what_the_console_keeps_are_refused_and_change_nothing(
    started: Client, fields: dict[str, Any], code: str
) -> None:
    if "result" in fields:
        started.call("lookup", {"n": 1})
    before = _unchanged(started)
    response = started.send("result" if "result" in fields else "wait", ticket=0, **fields)
    assert response.status_code in (400, 409), response.content
    assert response.json()["code"] == code
    assert _unchanged(started) == before
    started.step("heartbeat")  # the task still answers: nothing was poisoned


def test_a_new_process_goes_on_after_its_predecessor_vanished_during_a_read(
    started: Client,
) -> None:
    started.call("lookup", {"n": 1})  # told to execute; then the process vanishes
    Task.objects.filter(id=started.task).update(
        lease_expires_at=timezone.now() - timedelta(seconds=1)
    )
    runner.sweep(lambda task_id: None)
    assert _task(started).state == TaskState.QUEUED
    again = Client(started.caller, lease="new-process")
    again.task = started.task
    # Not a 409: the read nobody reported was interrupted, and the model may ask again.
    assert again.step("model")["allowed"] is True
    event = TraceEvent.objects.filter(task_id=started.task, kind=EventKind.REQUEST).last()
    assert event is not None and "interrupted" in event.detail


# -- fewer round trips: then -------------------------------------------------------------------


def test_the_last_result_with_then_model_allows_the_next_model_call(started: Client) -> None:
    started.call("lookup", {"n": 1})
    answer = started.step("result", ticket=0, result={"kind": "SUCCESS", "data": 1}, then="model")
    assert (answer["wait_ms"], answer["allowed"]) == (0, True)
    assert _task(started).model_calls == 2  # the next one, counted as it is allowed
    tools = started.step("tools", calls=[{"tool": "lookup", "args": {"n": 2}}])
    assert [t["ticket"] for t in tools["admitted"]] == [0]


def test_then_model_waits_first_when_a_result_asks_for_a_wait(started: Client) -> None:
    started.call("lookup", {"n": 1})
    result = {"kind": "RETRYABLE", "wait_ms": 250}
    answer = started.step("result", ticket=0, result=result, then="model")
    assert answer["wait_ms"] == 250 and "allowed" not in answer
    assert _task(started).model_calls == 1  # the client waits, then asks with a model step
    assert started.step("model")["allowed"] is True


def test_then_on_a_result_that_is_not_the_last_answers_nothing_ahead(started: Client) -> None:
    started.step("model")
    calls = [{"tool": "lookup", "args": {"n": 1}}, {"tool": "lookup", "args": {"n": 2}}]
    started.step("tools", calls=calls)
    started.step("call", ticket=0)
    answer = started.step("result", ticket=0, result={"kind": "SUCCESS"}, then="model")
    assert "wait_ms" not in answer and "allowed" not in answer
    assert started.send("result", ticket=1, then="later").status_code == 409  # not allowed yet
    started.step("call", ticket=1)
    bad = started.send("result", ticket=1, result={"kind": "SUCCESS"}, then="later")
    assert bad.status_code == 400 and "then must be" in bad.json()["error"]


def test_a_result_whose_then_cannot_be_answered_is_refused_before_it_settles_anything(
    started: Client,
) -> None:
    started.call("refund", {"cents": 4}, key="order/4/refund")
    result = {"kind": "SUCCESS", "data": {"refund": "r-4"}}

    refused = started.send("result", ticket=0, result=result, then="model", reserve=-1)

    assert "reserve must be" in error(refused, 400)
    assert Operation.objects.get(key="order/4/refund").state == OperationState.IN_FLIGHT
    # The same result, asked again as it should have been, still settles it.
    started.step("result", ticket=0, result=result, then="model")
    assert Operation.objects.get(key="order/4/refund").state == OperationState.COMMITTED


# -- budgets: money reserved before it is spent, retries in one budget ---------------------------


def test_a_model_calls_reservation_is_stored_before_it_is_allowed_and_refused_when_it_cannot_fit(
    caller: Callable[..., Caller],
) -> None:
    client = Client(caller(Role.AGENT))
    client.start(limits={**LIMITS, "spend": 100})
    assert client.step("model", reserve=60)["allowed"] is True
    assert _task(client).spend == 60  # in the database before the paid call goes out
    client.step("tools", calls=[{"tool": "lookup", "args": {"n": 1}}], usage={"cost": 10})
    assert _task(client).spend == 10  # the real cost replaced the reservation
    client.step("call", ticket=0)
    client.step("result", ticket=0, result={"kind": "SUCCESS", "data": 1})
    stop = client.step("model", reserve=95)["stop"]
    assert (stop["state"], stop["reason"]) == ("PARTIAL", "spend_budget")
    assert _task(client).spend == 10  # a call that did not fit reserved nothing


def test_a_tools_own_retries_are_charged_to_the_tasks_execution_budget(started: Client) -> None:
    started.call("lookup", {"n": 1})
    started.step("result", ticket=0, result={"kind": "SUCCESS", "data": 1, "attempts": 3})
    assert _task(started).executions == 3
    started.step("wait")
    started.call("lookup", {"n": 2})
    started.step("result", ticket=0, result={"kind": "SUCCESS", "data": 2, "attempts": 4})
    assert _task(started).executions == 7  # every attempt counts, past the budget of 6
    started.step("wait")
    refused = started.call("lookup", {"n": 3})
    assert refused["stop"]["reason"] == "execution_budget"  # nothing more may run
    assert _task(started).executions == 7


# -- fewer round trips: a call entered with its admission ----------------------------------------


def _enter(client: Client, call: dict[str, Any], **fields: Any) -> dict[str, Any]:
    """A model call proposing ``call``, entered with its admission: one request."""
    assert client.step("model")["allowed"] is True
    return client.step("tools", calls=[call], enter=True, **fields)


def test_a_call_entered_with_its_admission_is_claimed_in_that_request(started: Client) -> None:
    refund = {"tool": "refund", "args": {"cents": 5}, "operation_key": "order/5/refund"}

    answer = _enter(started, refund)

    assert answer["action"] == "execute" and [t["ticket"] for t in answer["admitted"]] == [0]
    op = Operation.objects.get(key="order/5/refund")
    assert op.state == OperationState.IN_FLIGHT and op.task_id == started.task
    result = {"kind": "SUCCESS", "data": {"refund": "r-5"}}
    assert started.step("result", ticket=0, result=result, then="model")["allowed"] is True
    op.refresh_from_db()
    assert op.state == OperationState.COMMITTED
    steps = StepRequest.objects.filter(task_id=started.task).exclude(step="start")
    assert sorted(steps.values_list("step", flat=True)) == ["model", "result", "tools"]
    task = _task(started)
    assert (task.requests, task.executions) == (1, 1)


def test_a_committed_write_entered_with_its_admission_is_reused_not_run(
    caller: Callable[..., Caller],
) -> None:
    first, second = Client(caller(Role.AGENT)), Client(caller(Role.AGENT, username="other"))
    first.start(input={"n": 1})
    second.start(input={"n": 2})
    refund = {"tool": "refund", "args": {"cents": 7}, "operation_key": "order/7/refund"}
    assert _enter(first, refund)["action"] == "execute"
    first.step("result", ticket=0, result={"kind": "SUCCESS", "data": {"refund": "r-7"}})

    reused = _enter(second, refund)

    assert reused["action"] == "reuse" and reused["result"]["data"] == {"refund": "r-7"}
    assert Operation.objects.get(key="order/7/refund").attempts == 1
    assert _task(second).executions == 0


def test_an_entry_decided_with_the_admission_stops_at_an_uncertain_write(
    started: Client,
) -> None:
    started.call("refund", {"cents": 9}, key="order/9/refund")
    lost = {"type": "TimeoutError", "message": "read timed out", "transient": False}
    started.step("result", ticket=0, error=lost)
    other = Client(started.caller, lease="test:second")
    other.start(input={"again": True})
    refund = {"tool": "refund", "args": {"cents": 9}, "operation_key": "order/9/refund"}

    answer = _enter(other, refund)

    assert (answer["stop"]["state"], answer["stop"]["reason"]) == ("NEEDS_HUMAN", "unknown_commit")
    assert "action" not in answer
    op = Operation.objects.get(key="order/9/refund")
    assert (op.state, op.attempts) == (OperationState.UNKNOWN, 1)  # never claimed again


def test_a_stop_recorded_while_the_model_thinks_refuses_a_call_entered_with_its_admission(
    started: Client, caller: Callable[..., Caller]
) -> None:
    assert started.step("model")["allowed"] is True
    services.task_stop(task_id=started.task, actor=caller(Role.OPERATOR).user, reason="no")
    refund = {"tool": "refund", "args": {"cents": 2}, "operation_key": "order/2/refund"}

    answer = started.step("tools", calls=[refund], enter=True)

    assert (answer["stop"]["state"], answer["stop"]["reason"]) == ("CANCELLED", "operator_stop")
    assert "action" not in answer
    assert not Operation.objects.filter(key="order/2/refund").exists()
    assert _task(started).executions == 0


def test_a_retried_admission_with_entry_gets_the_same_answer_and_claims_once(
    started: Client,
) -> None:
    started.step("model")
    body = {"calls": [{"tool": "refund", "args": {"cents": 1}, "operation_key": "k-1"}]}

    first = started.send("tools", request_id="admit-1", enter=True, **body)
    again = started.send("tools", request_id="admit-1", enter=True, **body)

    assert first.json() == again.json() and first.json()["action"] == "execute"
    op = Operation.objects.get(key="k-1")
    assert op.attempts == 1 and OperationEvent.objects.filter(operation=op).count() == 1


@pytest.mark.parametrize(
    ("calls", "enter", "words"),
    [
        (2, True, "exactly one call"),
        (1, "yes", "enter must be true or false"),
    ],
)
def test_an_entry_that_cannot_be_decided_with_the_admission_is_refused_and_changes_nothing(
    started: Client, calls: int, enter: Any, words: str
) -> None:
    started.step("model")
    proposal = [{"tool": "lookup", "args": {"n": n}} for n in range(calls)]

    response = started.send("tools", calls=proposal, enter=enter)

    assert words in error(response, 400)
    assert _task(started).requests == 0
    assert not TraceEvent.objects.filter(task_id=started.task, kind=EventKind.REQUEST).exists()


# -- a long phase: what grows with it stays out of every step ----------------------------------


def test_a_long_phase_keeps_its_checkpoint_small_and_its_report_whole(
    caller: Callable[..., Caller],
) -> None:
    client = Client(caller(Role.AGENT))
    steps = 60
    limits = {"deadline_ms": 600_000, "model_calls": 200, "requests": 200, "executions": 200}
    client.start(limits={**limits, "same": 2, "stagnant": 3})
    sizes = []
    assert client.step("model")["allowed"] is True
    for n in range(1, steps + 1):
        call = {"tool": "refund", "args": {"n": n}, "operation_key": f"order/{n}/refund"}
        assert client.step("tools", calls=[call], enter=True)["action"] == "execute"
        result = {"kind": "SUCCESS", "data": {"refund": n}}
        evidence = {"revision": n, "done": False, "committed": True}
        client.step("result", ticket=0, result=result, evidence=evidence, then="model")
        sizes.append(len(json.dumps(_task(client).checkpoint)))
    # A write claimed in one step, its outcome lost in the next: only the step that
    # claimed it knew it, and the report must still name it.
    lost_call = {"tool": "refund", "args": {"n": 0}, "operation_key": "order/0/refund"}
    assert client.step("tools", calls=[lost_call], enter=True)["action"] == "execute"
    lost = {"type": "ConnectionError", "message": "reset", "transient": False}
    stop = client.step("result", ticket=0, error=lost)["stop"]

    assert max(sizes) - min(sizes) < 100  # the same size after 60 writes as after one
    assert stop["state"] == "NEEDS_HUMAN"
    keys = [op["key"] for op in stop["operations"]]
    assert keys == [f"order/{n}/refund" for n in range(1, steps + 1)] + ["order/0/refund"]
    assert stop["operations"][-1]["state"] == "UNKNOWN"
    assert stop["completed_total"] == steps
    assert [step["operation_key"] for step in stop["completed"]] == [
        f"order/{n}/refund" for n in range(steps - 49, steps + 1)
    ]


def _held_elsewhere(caller: Callable[..., Caller], key: str) -> None:
    """Another agent's write of ``key``, claimed and still running."""
    other = Client(caller(Role.AGENT, username="elsewhere"))
    other.start(input={"elsewhere": True})
    assert other.call("refund", {"n": 9}, key)["action"] == "execute"


def test_a_write_admitted_and_never_asked_for_is_in_the_trace_and_the_report(
    started: Client, caller: Callable[..., Caller]
) -> None:
    _held_elsewhere(caller, "shared")
    started.step("model")
    write = {"tool": "refund", "args": {"n": 9}, "operation_key": "shared"}
    started.step("tools", calls=[write, {"tool": "lookup", "args": {"q": 1}}])
    started.step("call", ticket=1)
    started.step("result", ticket=1, result={"kind": "SUCCESS", "data": {}})

    assert started.step("model")["allowed"] is True  # the write was dropped, never asked for
    stop = started.step("halt", state="NEEDS_HUMAN", reason="executor_error")["stop"]

    not_run = TraceEvent.objects.get(task_id=started.task, decision="not_run")
    assert (not_run.tool, not_run.operation_key) == ("refund", "shared")
    # Its admission looked the key up, as the guard that keeps its whole history reports.
    assert [(op["key"], op["state"]) for op in stop["operations"]] == [("shared", "IN_FLIGHT")]


def test_a_read_that_carries_an_operation_key_puts_no_operation_in_the_report(
    started: Client, caller: Callable[..., Caller]
) -> None:
    _held_elsewhere(caller, "shared")
    assert started.call("lookup", {"q": 1}, "shared")["action"] == "execute"
    started.step("result", ticket=0, result={"kind": "SUCCESS", "data": {}})
    started.step("model")

    stop = started.step("halt", state="NEEDS_HUMAN", reason="executor_error")["stop"]

    assert stop["operations"] == []  # a read is never claimed: the key is not its operation
