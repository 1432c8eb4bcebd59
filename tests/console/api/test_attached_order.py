"""Steps out of order (guard.steps.Sequencer judges them): each is a 409 naming the step
that was due, and the task's state, counters, trace and ledger are as they were."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from console.models import Operation, Task, TraceEvent
from console.records.roles import Role

from .helpers import Caller
from .test_attached import Client

LOOKUP = {"tool": "lookup", "args": {"n": 1}}
REFUND = {"tool": "refund", "args": {"cents": 3}, "operation_key": "order/3/refund"}


@pytest.fixture
def started(caller: Callable[..., Caller]) -> Client:
    client = Client(caller(Role.AGENT))
    assert client.start().status_code == 201
    return client


def _seen(client: Client) -> tuple[Any, ...]:
    task = Task.objects.get(id=client.task)
    shown = client.caller.get(f"/api/tasks/{client.task}").json()["task"]
    return (
        task.state, task.model_calls, task.requests, task.executions, task.tokens,
        task.checkpoint, TraceEvent.objects.filter(task_id=task.id).count(),
        list(Operation.objects.values_list("key", "state", "attempts")),
        shown["state"],
    )  # fmt: skip


def _refused(client: Client, step: str, code: str, **fields: Any) -> str:
    before = _seen(client)
    response = client.send(step, **fields)
    assert response.status_code == 409, response.content
    assert response.json()["code"] == code
    assert _seen(client) == before
    return str(response.json()["error"])


def test_a_result_before_any_call_entered_is_refused(started: Client) -> None:
    started.step("model")
    started.step("tools", calls=[LOOKUP, REFUND])
    message = _refused(started, "result", "call_not_allowed", ticket=1, result={"kind": "SUCCESS"})
    assert "never allowed to run" in message


def test_a_call_entered_twice_is_refused_naming_its_result_as_due(started: Client) -> None:
    assert started.call("refund", REFUND["args"], REFUND["operation_key"])["action"] == "execute"
    message = _refused(started, "call", "step_out_of_order", ticket=0)
    assert "report the result of call 0 (refund)" in message


def test_a_model_step_while_a_call_is_unsettled_is_refused(started: Client) -> None:
    started.call("refund", REFUND["args"], REFUND["operation_key"])
    message = _refused(started, "model", "step_out_of_order", usage={"tokens": 5})
    assert "report the result of call 0 (refund)" in message


@pytest.mark.parametrize("evidence", [None, {"revision": 1, "done": True}])
def test_a_finish_while_calls_are_pending_is_refused(
    started: Client, evidence: dict[str, Any] | None
) -> None:
    started.step("model")
    started.step("tools", calls=[LOOKUP])
    fields = {} if evidence is None else {"evidence": evidence}
    message = _refused(started, "finish", "step_out_of_order", answer="done", **fields)
    assert "call step for call 0 (lookup)" in message


def test_a_retried_request_gets_its_answer_and_is_not_judged_again(started: Client) -> None:
    started.call("lookup", {"n": 1})
    body = {"ticket": 0, "result": {"kind": "SUCCESS", "data": 1}}
    first = started.step("result", request_id="r-once", **body)
    before = _seen(started)
    again = started.send("result", request_id="r-once", **body)
    assert again.status_code == 200 and again.json() == first
    assert _seen(started) == before
    _refused(started, "result", "result_given", **body)  # a new request: judged, refused


def test_a_model_step_after_the_last_result_asks_the_wait_itself(started: Client) -> None:
    started.call("lookup", {"n": 1})
    started.step("result", ticket=0, result={"kind": "SUCCESS", "data": 1})
    assert started.step("model")["allowed"] is True
    assert started.step("wait")["wait_ms"] == 0  # asked already: nothing more is due


def test_a_model_step_that_skips_a_due_wait_is_refused_naming_it(started: Client) -> None:
    started.call("lookup", {"n": 1})
    started.step("result", ticket=0, result={"kind": "PENDING", "wait_ms": 400})
    message = _refused(started, "model", "step_out_of_order")
    assert "wait step is due first: wait 400 ms before the next model call" in message
    assert started.step("wait")["wait_ms"] == 400
    assert started.step("model")["allowed"] is True
