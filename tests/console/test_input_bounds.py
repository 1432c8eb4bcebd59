"""One bound per field, the same at every door (issue 21, "No 500 on any input").

Each test is a finding of the outside probe: a value that was a server error, was stored
other than it was sent, or was taken at one door and refused at another. The bounds are
``console.records.inputs``' constants, documented in docs/protocol.md and docs/api.md.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from console import services
from console.models import AuditEntry, Operation, OperationState, StepRequest, Task, TraceEvent
from console.records.inputs import (
    KEPT_DEPTH,
    MAX_ANSWER_BYTES,
    MAX_ARGS_BYTES,
    MAX_KEY_CHARS,
    MAX_NAME_CHARS,
    MAX_RESULT_BYTES,
    MAX_TEXT_CHARS,
    json_size,
)
from console.records.roles import Role

from .api.helpers import ApiClient, nested, unknown_operation

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("enqueued")]

KEY = "order/42/refund"
TOOLS = {"lookup": "read", "refund": "write"}


def sized(most: int, **around: Any) -> dict[str, Any]:
    """An object of exactly ``most`` bytes as JSON: ``around`` and a string ``s`` filling it."""
    value = {**around, "s": ""}
    value["s"] = "x" * (most - json_size(value))
    assert json_size(value) == most
    return value



class Agent:
    """An attached agent's process speaking the step protocol by hand."""

    def __init__(self, client: ApiClient) -> None:
        self.client = client
        self.ids = itertools.count(1)
        self.task = 0

    def start(self, **fields: Any) -> Any:
        body = {
            "protocol": 1,
            "request_id": f"start-{next(self.ids)}",
            "lease": "bounds:1",
            "agent": "desk-bot",
            "client": "tests/1",
            "tools": TOOLS,
            **fields,
        }
        response = self.client.post(
            "/api/attached", json.dumps(body), content_type="application/json"
        )
        if response.status_code == 201:
            self.task = response.json()["task"]
        return response

    def send(self, step: str, **fields: Any) -> Any:
        body = {"protocol": 1, "request_id": f"r-{next(self.ids)}", "lease": "bounds:1"}
        body |= {"step": step, **fields}
        url = f"/api/attached/{self.task}/steps"
        return self.client.post(url, json.dumps(body), content_type="application/json")

    def step(self, step: str, **fields: Any) -> dict[str, Any]:
        response = self.send(step, **fields)
        assert response.status_code == 200, response.content[:300]
        answer: dict[str, Any] = response.json()
        return answer

    def entered(self, tool: str = "refund", key: str = "order/1/refund") -> None:
        """A model call whose one call the client runs now (answered execute)."""
        self.step("model")
        call = {"tool": tool, "args": {"order": 1}, "operation_key": key}
        assert self.step("tools", calls=[call], enter=True)["action"] == "execute"


@pytest.fixture
def agent(api: Callable[[Role], ApiClient]) -> Agent:
    return Agent(api(Role.AGENT))


@pytest.fixture
def started(agent: Agent) -> Agent:
    assert agent.start().status_code == 201
    return agent


def refused(response: Any, code: str = "invalid_input") -> str:
    assert response.status_code == 400, response.content[:300]
    assert response.json()["code"] == code
    message: str = response.json()["error"]
    return message


def unchanged(agent: Agent) -> tuple[Any, ...]:
    task = Task.objects.get(id=agent.task)
    return (
        task.state,
        task.checkpoint,
        TraceEvent.objects.count(),
        StepRequest.objects.count(),
        list(Operation.objects.values_list("key", "state")),
    )


# -- names and keys: refused, never a server error, never cut ----------------------------------


@pytest.mark.parametrize("length", [MAX_NAME_CHARS + 1, 100_000])
def test_a_client_longer_than_its_column_is_a_400_not_a_server_error(
    agent: Agent, length: int
) -> None:
    message = refused(agent.start(client="c" * length))

    assert f"client must be 1 to {MAX_NAME_CHARS} printable characters" in message
    assert not Task.objects.exists()


def test_a_client_of_the_longest_length_is_shown_whole(agent: Agent) -> None:
    assert agent.start(client="c" * MAX_NAME_CHARS).status_code == 201

    assert Task.objects.get(id=agent.task).client == "c" * MAX_NAME_CHARS


def test_a_blank_client_is_refused_rather_than_starting_a_hosted_task(
    agent: Agent, enqueued: list[int]
) -> None:
    refused(agent.start(agent="test_reader", client="   "))

    assert not Task.objects.exists() and enqueued == []


@pytest.mark.parametrize("version", [1.0, True, "1"])
def test_a_protocol_that_is_not_the_integer_1_is_unsupported(started: Agent, version: Any) -> None:
    tasks = Task.objects.count()

    refused(started.start(protocol=version), "unsupported_protocol")
    refused(started.send("model", protocol=version), "unsupported_protocol")
    assert Task.objects.count() == tasks
    assert Task.objects.get(id=started.task).model_calls == 0


@pytest.mark.parametrize("enter", [False, True])
def test_an_operation_key_longer_than_any_key_is_refused_not_cut(
    started: Agent, enter: bool
) -> None:
    started.step("model")
    before = unchanged(started)
    call = {"tool": "refund", "args": {"order": 1}, "operation_key": "k" * (MAX_KEY_CHARS + 1)}

    message = refused(started.send("tools", calls=[call], enter=enter))

    assert f"longer than {MAX_KEY_CHARS} characters" in message
    assert unchanged(started) == before and not Operation.objects.exists()


def test_a_tool_name_longer_than_any_declared_one_is_refused(started: Agent) -> None:
    started.step("model")
    before = unchanged(started)

    call = {"tool": "t" * (MAX_NAME_CHARS + 1), "args": {}}
    refused(started.send("tools", calls=[call]))
    assert unchanged(started) == before


# -- one depth and one size per value, at every door --------------------------------------------


def test_arguments_nested_deeper_than_kept_are_refused_as_a_reconcilers_result_is(
    started: Agent, api: Callable[[Role], ApiClient]
) -> None:
    started.step("model")
    op = unknown_operation(services.task_start(agent="test_notices", input={"count": 1}), KEY)
    before = unchanged(started)
    too_deep = {"a": nested(KEPT_DEPTH)}  # an item below KEPT_DEPTH + 1 levels

    args = refused(started.send("tools", calls=[{"tool": "lookup", "args": too_deep}]))
    result = {"kind": "SUCCESS", "data": nested(KEPT_DEPTH)}
    body = json.dumps({"committed": True, "evidence": "seen", "result": result})
    settled = api(Role.RECONCILER).post(
        f"/api/operations/{KEY}/resolve", body, content_type="application/json"
    )

    assert f"nested more than {KEPT_DEPTH} levels deep" in args
    assert f"nested more than {KEPT_DEPTH} levels deep" in refused(settled)
    assert unchanged(started) == before
    op.refresh_from_db()
    assert op.state == OperationState.UNKNOWN


def test_arguments_as_deep_as_kept_and_as_large_as_their_bound_are_stored_whole(
    started: Agent,
) -> None:
    started.step("model")
    args = sized(MAX_ARGS_BYTES, deep=nested(KEPT_DEPTH - 1))

    (ticket,) = started.step("tools", calls=[{"tool": "lookup", "args": args}])["admitted"]

    assert ticket["args"] == args


@pytest.mark.parametrize("size", [MAX_ARGS_BYTES + 1, 700 * 1024])
def test_arguments_larger_than_their_bound_are_refused(started: Agent, size: int) -> None:
    started.step("model")
    before = unchanged(started)

    call = {"tool": "lookup", "args": sized(size)}
    message = refused(started.send("tools", calls=[call]))

    assert f"calls[0].args is larger than {MAX_ARGS_BYTES // 1024} KiB" in message
    assert unchanged(started) == before


def test_a_result_nested_deeper_than_kept_is_refused_rather_than_stored_cut(
    started: Agent,
) -> None:
    started.entered()
    before = unchanged(started)

    result = {"kind": "SUCCESS", "data": nested(KEPT_DEPTH)}
    message = refused(started.send("result", ticket=0, result=result))

    assert f"nested more than {KEPT_DEPTH} levels deep" in message
    assert unchanged(started) == before


def test_a_result_larger_than_its_bound_is_refused_at_every_door(
    started: Agent, api: Callable[[Role], ApiClient], person: Callable[[Role], User]
) -> None:
    started.entered()
    op = unknown_operation(services.task_start(agent="test_notices", input={"count": 1}), KEY)
    before = unchanged(started)
    large = sized(MAX_RESULT_BYTES + 1, kind="SUCCESS")
    browser = Client()
    browser.force_login(person(Role.RECONCILER))

    step = refused(started.send("result", ticket=0, result=large))
    body = json.dumps({"committed": True, "evidence": "seen", "result": large})
    settled = api(Role.RECONCILER).post(
        f"/api/operations/{KEY}/resolve", body, content_type="application/json"
    )
    form = {"decision": "committed", "evidence": "seen", "result": json.dumps(large)}
    page = browser.post(f"/operations/{KEY}/resolve", form)

    bound = f"larger than {MAX_RESULT_BYTES // 1024} KiB"
    assert bound in step and bound in refused(settled)
    assert page.status_code in (200, 302) and bound in page.content.decode()
    assert unchanged(started) == before
    op.refresh_from_db()
    assert op.state == OperationState.UNKNOWN and op.result is None
    assert not AuditEntry.objects.filter(operation=op).exists()


def test_a_result_at_its_bound_is_stored_whole(started: Agent) -> None:
    started.entered()
    result: dict[str, Any] = {"kind": "SUCCESS", "data": ""}
    result["data"] = "x" * (MAX_RESULT_BYTES - json_size(result))

    started.step("result", ticket=0, result=result)

    stored = Operation.objects.get(key="order/1/refund").result
    assert stored is not None and stored["data"] == result["data"]


@pytest.mark.parametrize("size", [MAX_ANSWER_BYTES + 1, 900 * 1024])
def test_a_finish_answer_larger_than_its_bound_is_refused(started: Agent, size: int) -> None:
    started.step("model")
    before = unchanged(started)

    message = refused(started.send("finish", answer=sized(size)))

    assert f"answer is larger than {MAX_ANSWER_BYTES // 1024} KiB" in message
    assert unchanged(started) == before


# -- words: at most MAX_TEXT_CHARS, refused rather than cut --------------------------------------


@pytest.mark.parametrize(
    ("step", "fields"),
    [
        ("failed", {"error": "e" * (MAX_TEXT_CHARS + 1)}),
        ("halt", {"state": "FAILED", "reason": "executor_error", "detail": "d" * 5000}),
        ("finish", {"evidence": {"error": "i" * (MAX_TEXT_CHARS + 1)}}),
    ],
)
def test_words_a_client_reports_beyond_the_text_bound_are_refused_not_cut(
    started: Agent, step: str, fields: dict[str, Any]
) -> None:
    started.step("model")
    before = unchanged(started)

    message = refused(started.send(step, **fields))

    assert f"at most {MAX_TEXT_CHARS:,} are taken" in message
    assert unchanged(started) == before


def test_an_errors_message_and_type_beyond_their_bounds_are_refused(started: Agent) -> None:
    started.entered()
    before = unchanged(started)
    long_message = {"type": "TimeoutError", "message": "m" * (MAX_TEXT_CHARS + 1)}
    long_type = {"type": "T" * (MAX_NAME_CHARS + 1), "message": "timed out"}

    refused(started.send("result", ticket=0, error=long_message))
    refused(started.send("result", ticket=0, error=long_type))
    assert unchanged(started) == before


def test_a_start_reason_beyond_the_text_bound_is_refused_at_every_door(
    agent: Agent, api: Callable[[Role], ApiClient]
) -> None:
    reason = "r" * (MAX_TEXT_CHARS + 1)
    body = json.dumps({"agent": "test_reader", "input": {"pages": 1}, "reason": reason})

    refused(agent.start(reason=reason))
    refused(api(Role.OPERATOR).post("/api/tasks", body, content_type="application/json"))
    assert not Task.objects.exists()


# -- flags and evidence of the wrong type: the client's error, not a verdict --------------------


def test_a_transient_flag_that_is_not_a_boolean_is_refused_rather_than_read_as_false(
    started: Agent,
) -> None:
    started.entered()
    before = unchanged(started)

    error = {"type": "TimeoutError", "message": "timed out", "transient": "true"}
    assert "error.transient must be true or false" in refused(
        started.send("result", ticket=0, error=error)
    )
    assert unchanged(started) == before


@pytest.mark.parametrize(
    "evidence",
    [
        {"revision": "1", "done": False},
        {"revision": True, "done": False},
        {"revision": 1, "done": 1},
        {"revision": 1, "done": False, "committed": "yes"},
        {"error": 7},
    ],
)
def test_malformed_evidence_is_a_400_and_changes_nothing(
    started: Agent, evidence: dict[str, Any]
) -> None:
    started.step("model")
    before = unchanged(started)

    refused(started.send("finish", answer="done", evidence=evidence))
    assert unchanged(started) == before


def test_a_call_whose_effect_is_false_is_refused_rather_than_given_the_declared_one(
    started: Agent,
) -> None:
    started.step("model")
    before = unchanged(started)

    call = {"tool": "refund", "args": {}, "effect": False, "operation_key": "order/1/refund"}
    refused(started.send("tools", calls=[call]))
    assert unchanged(started) == before


# -- the console's start form ----------------------------------------------------------------


def test_the_start_form_refuses_input_nested_50000_deep_with_a_message(
    person: Callable[[Role], User],
) -> None:
    browser = Client()
    browser.force_login(person(Role.OPERATOR))
    form = {"agent": "test_reader", "input": "[" * 50_000 + "]" * 50_000, "limits": ""}

    page = browser.post("/tasks/new", form)

    assert page.status_code == 200
    assert "nested more than" in page.context["form"].errors["input"][0]
    assert not Task.objects.exists()
