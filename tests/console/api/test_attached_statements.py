"""What an attached step request sends to PostgreSQL: the task's lock, then the step's save
with its answer, and no lookup of a stored answer before a request that is new; a retry is
told by its answer's insert conflicting, its step run again rolls back whole, and the
stored answer is what it gets."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from console.models import Operation, StepRequest, Task, TraceEvent
from console.records.roles import Role

from .helpers import Caller
from .test_attached import Client

LOOKUP = "SELECT step, body_hash, answer FROM console_steprequest"


@pytest.fixture
def started(caller: Callable[..., Caller]) -> Client:
    client = Client(caller(Role.AGENT))
    assert client.start().status_code == 201
    return client


def _statements(client: Client, step: str, **fields: Any) -> tuple[Any, list[str]]:
    """``step`` sent, and the statements it sent (savepoints and the token's left out)."""
    with CaptureQueriesContext(connection) as captured:
        response = client.send(step, **fields)
    sent = [
        query["sql"]
        for query in captured.captured_queries
        if "SAVEPOINT" not in query["sql"] and "console_apitoken" not in query["sql"]
    ]
    return response, sent


def test_a_new_step_request_locks_its_task_and_saves_with_its_answer_looking_nothing_up(
    started: Client,
) -> None:
    started.step("model")

    response, sent = _statements(
        started, "tools", calls=[{"tool": "lookup", "args": {"q": 1}}], usage={"tokens": 3}
    )

    assert response.status_code == 200, response.content
    assert not [sql for sql in sent if LOOKUP in sql]
    opened, saved = sent
    assert "FOR UPDATE" in opened and "console_steprequest" not in opened
    assert "UPDATE console_task" in saved and "INSERT INTO console_steprequest" in saved
    stored = StepRequest.objects.get(task_id=started.task, request_id=started.last["request_id"])
    assert stored.step == "tools" and stored.answer == response.json()


def test_a_retried_request_gets_its_stored_answer_and_its_step_run_again_leaves_nothing(
    started: Client,
) -> None:
    started.step("model")
    calls = [{"tool": "refund", "args": {"order": 7}, "operation_key": "refund/7"}]
    first = started.step("tools", calls=calls, usage={"tokens": 3}, request_id="admit-1")
    (ticket,) = first["admitted"]
    entered = started.step("call", ticket=ticket["ticket"], request_id="enter-1")
    task = Task.objects.get(id=started.task)

    for request_id, step, fields, answer in (
        ("admit-1", "tools", {"calls": calls, "usage": {"tokens": 3}}, first),
        ("enter-1", "call", {"ticket": ticket["ticket"]}, entered),
    ):
        response, sent = _statements(started, step, request_id=request_id, **fields)

        assert response.status_code == 200 and response.json() == answer
        assert LOOKUP in sent[-1]  # read once the step run again rolled back
        rows = StepRequest.objects.filter(task_id=started.task, request_id=request_id)
        assert rows.count() == 1 and rows.get().answer == answer
    again = Task.objects.get(id=started.task)
    assert (again.requests, again.tokens, again.next_seq) == (
        task.requests, task.tokens, task.next_seq
    )
    assert Operation.objects.get(key="refund/7").attempts == 1  # claimed once


def test_a_refused_request_leaves_its_id_free(started: Client) -> None:
    started.step("model")
    refused = started.send("result", ticket=1, request_id="too-soon")  # nothing admitted yet
    assert refused.status_code == 409, refused.content

    assert not StepRequest.objects.filter(task_id=started.task, request_id="too-soon").exists()


def test_a_step_reads_its_task_without_the_goals_input_and_reads_nothing_more_later(
    caller: Callable[..., Caller],
) -> None:
    client = Client(caller(Role.AGENT))
    assert client.start(input={"document": "x" * 60_000}).status_code == 201  # near its bound
    client.step("model")

    response, sent = _statements(
        client, "tools", calls=[{"tool": "lookup", "args": {"q": 1}}], usage={"tokens": 3}
    )

    assert response.status_code == 200, response.content
    opened, _ = sent  # no statement of its own for a column left out
    read = opened.split("FROM console_task")[0]
    assert "checkpoint" in read and "input" not in read


def test_a_retried_request_that_stopped_the_task_meets_its_own_answer_and_gets_it(
    started: Client,
) -> None:
    started.step("model")
    stopped = started.step("finish", answer="done", request_id="finish-1")
    assert stopped["stop"] is not None

    # Run again, the step finds the task stopped and goes to store the same stop's
    # answer: the insert conflicts with the first one, and that one is the answer.
    response, sent = _statements(started, "finish", answer="done", request_id="finish-1")

    assert response.status_code == 200 and response.json() == stopped
    assert any("INSERT INTO console_steprequest" in sql for sql in sent)
    assert LOOKUP in sent[-1]
    assert StepRequest.objects.filter(task_id=started.task, request_id="finish-1").count() == 1


# -- a write's ledger move in the save that stores the step's answer ----------------------------


REFUND = {"tool": "refund", "args": {"order": 7}, "operation_key": "refund/7"}


def test_a_writes_entry_claims_its_key_in_the_save_that_stores_its_answer(
    started: Client,
) -> None:
    started.step("model")

    response, sent = _statements(started, "tools", calls=[REFUND], enter=True)

    assert response.status_code == 200 and response.json()["action"] == "execute"
    opened, saved = sent
    assert "FOR UPDATE" in opened
    assert "INSERT INTO console_operation" in saved and "INSERT INTO console_steprequest" in saved
    op = Operation.objects.get(key="refund/7")
    assert (op.state, op.attempts, op.task_id) == ("IN_FLIGHT", 1, started.task)
    assert list(op.history.values_list("from_state", "to_state")) == [("", "IN_FLIGHT")]


def test_a_writes_result_records_it_in_the_save_that_stores_its_answer(started: Client) -> None:
    started.step("model")
    started.step("tools", calls=[REFUND], enter=True)
    result = {"kind": "SUCCESS", "data": {"refund": "r-7"}}

    response, sent = _statements(started, "result", ticket=0, result=result, then="model")

    assert response.status_code == 200 and response.json()["allowed"] is True
    opened, saved = sent
    assert "FOR UPDATE" in opened and "console_operation" not in opened
    assert "UPDATE console_operation" in saved and "INSERT INTO console_steprequest" in saved
    op = Operation.objects.get(key="refund/7")
    assert op.state == "COMMITTED" and op.result["data"] == {"refund": "r-7"}
    assert [h.to_state for h in op.history.order_by("id")] == ["IN_FLIGHT", "COMMITTED"]


def test_a_key_claimed_before_is_asked_of_the_ledger_once_the_save_could_not_claim_it(
    caller: Callable[..., Caller], started: Client
) -> None:
    other = Client(caller(Role.AGENT, username="other"))
    assert other.start(input={"other": True}).status_code == 201
    other.step("model")
    assert other.step("tools", calls=[REFUND], enter=True)["action"] == "execute"
    other.step("result", ticket=0, result={"kind": "SUCCESS", "data": {"refund": "r-7"}})
    started.step("model")
    before = Task.objects.get(id=started.task)

    response, sent = _statements(started, "tools", calls=[REFUND], enter=True)

    answer = response.json()
    assert answer["action"] == "reuse" and answer["result"]["data"] == {"refund": "r-7"}
    # The save that assumed a fresh key made nothing; the step ran again, the ledger asked.
    _, assumed, opened, claim, *_, saved = sent
    assert "INSERT INTO console_operation" in assumed and "FOR UPDATE" in opened
    assert "INSERT INTO console_operation" in claim and "INSERT INTO console_operation" not in saved
    assert Operation.objects.get(key="refund/7").attempts == 1
    task = Task.objects.get(id=started.task)
    events = TraceEvent.objects.filter(task_id=started.task, seq__gte=before.next_seq)
    assert events.count() == task.next_seq - before.next_seq == 1  # the model call's, once
    assert (task.requests, task.executions) == (before.requests + 1, before.executions)


def test_a_record_the_save_cannot_make_leaves_it_to_the_ledger_as_before(
    started: Client,
) -> None:
    started.step("model")
    started.step("tools", calls=[REFUND], enter=True)
    # Settled meanwhile (a person, from trusted evidence): no longer IN_FLIGHT to record.
    Operation.objects.filter(key="refund/7").update(state="UNKNOWN")
    result = {"kind": "SUCCESS", "data": {"refund": "r-7"}}

    response, sent = _statements(started, "result", ticket=0, result=result, then="model")

    stop = response.json()["stop"]
    assert (stop["state"], stop["reason"]) == ("NEEDS_HUMAN", "unknown_commit")
    assert "UPDATE console_operation" in sent[1]  # the save that assumed the record
    op = Operation.objects.get(key="refund/7")
    assert op.state == "UNKNOWN" and op.result is None
    requests = TraceEvent.objects.filter(task_id=started.task, kind="request")
    assert requests.count() == 1  # the result's, once


def test_a_record_refused_while_the_stop_report_is_made_stops_the_task_as_the_ledger_says(
    started: Client,
) -> None:
    started.step("model")
    started.step("tools", calls=[REFUND], enter=True)
    Operation.objects.filter(key="refund/7").update(state="UNKNOWN")
    result = {"kind": "SUCCESS", "data": {"refund": "r-7"}}
    done = {"revision": 1, "done": True, "committed": True}

    # The goal met: the stop report reads the ledger, which makes the assumed record first
    # and is refused; the report swallows a ledger error, the step must not be saved.
    stop = started.step("result", ticket=0, result=result, evidence=done)["stop"]

    assert (stop["state"], stop["reason"]) == ("NEEDS_HUMAN", "unknown_commit")
    assert Operation.objects.get(key="refund/7").state == "UNKNOWN"
