"""What an attached step request sends to PostgreSQL: the task row read without its lock,
with the answer stored under the request id in the same statement (a retry is answered
from it), then the step's save with its answer, made only while the row is still as read
(a compare-and-set on its version, no transaction held open). A row changed meanwhile, or
a step that needs more than its one save (a stop, the lease, the ledger read), runs the
step again holding the row's lock: the lock, then the save."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection
from django.db.models import F
from django.test.utils import CaptureQueriesContext

from console.models import Operation, StepRequest, Task, TraceEvent
from console.records.roles import Role
from console.store import Answer, NeedsLock, Saved, Step, StepStore
from console.store.postgresql import _Unlocked

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


def test_a_new_step_request_reads_its_task_and_saves_with_its_answer_looking_nothing_up_apart(
    started: Client,
) -> None:
    started.step("model")

    response, sent = _statements(
        started, "tools", calls=[{"tool": "lookup", "args": {"q": 1}}], usage={"tokens": 3}
    )

    assert response.status_code == 200, response.content
    assert not [sql for sql in sent if LOOKUP in sql]
    read, saved = sent
    assert "FOR UPDATE" not in read and "xmin" in read
    assert "LEFT JOIN console_steprequest" in read  # a retry's answer, in the same statement
    assert "UPDATE console_task" in saved and "INSERT INTO console_steprequest" in saved
    assert "xmin" in saved  # made only while the row is as read
    stored = StepRequest.objects.get(task_id=started.task, request_id=started.last["request_id"])
    assert stored.step == "tools" and stored.answer == response.json()


def test_a_retried_request_gets_its_stored_answer_from_its_read_and_runs_nothing_again(
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
        (read,) = sent  # the task row, and the answer stored under the request id
        assert "LEFT JOIN console_steprequest" in read
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


def test_a_refusal_is_given_holding_the_lock(started: Client) -> None:
    started.step("model")

    response, sent = _statements(started, "result", ticket=1)  # nothing admitted yet

    assert response.status_code == 409, response.content
    read, opened, *_ = sent  # final for the client: decided on the row as it stands
    assert "FOR UPDATE" not in read and "FOR UPDATE" in opened


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


def test_a_retried_request_that_stopped_the_task_gets_its_own_answer_from_its_read(
    started: Client,
) -> None:
    started.step("model")
    stopped = started.step("finish", answer="done", request_id="finish-1")
    assert stopped["stop"] is not None

    response, sent = _statements(started, "finish", answer="done", request_id="finish-1")

    assert response.status_code == 200 and response.json() == stopped
    assert not any("INSERT INTO console_steprequest" in sql for sql in sent)
    assert StepRequest.objects.filter(task_id=started.task, request_id="finish-1").count() == 1


def test_a_stop_is_made_holding_the_lock_after_the_read(started: Client) -> None:
    started.step("model")

    response, sent = _statements(started, "finish", answer="done")

    assert response.json()["stop"]["state"] == "PARTIAL"
    read, opened, *_ = sent  # the step came to a stop: run again, holding the row's lock
    assert "FOR UPDATE" not in read and "FOR UPDATE" in opened
    assert Task.objects.get(id=started.task).state == "PARTIAL"


# -- a write's ledger move in the save that stores the step's answer ----------------------------


REFUND = {"tool": "refund", "args": {"order": 7}, "operation_key": "refund/7"}


def test_a_writes_entry_claims_its_key_in_the_save_that_stores_its_answer(
    started: Client,
) -> None:
    started.step("model")

    response, sent = _statements(started, "tools", calls=[REFUND], enter=True)

    assert response.status_code == 200 and response.json()["action"] == "execute"
    read, saved = sent
    assert "FOR UPDATE" not in read
    assert "INSERT INTO console_operation" in saved and "INSERT INTO console_steprequest" in saved
    assert "xmin" in saved  # the claim's gate: the row as read, locked by the statement
    op = Operation.objects.get(key="refund/7")
    assert (op.state, op.attempts, op.task_id) == ("IN_FLIGHT", 1, started.task)
    assert list(op.history.values_list("from_state", "to_state")) == [("", "IN_FLIGHT")]


def test_a_writes_result_records_it_in_the_save_that_stores_its_answer(started: Client) -> None:
    started.step("model")
    started.step("tools", calls=[REFUND], enter=True)
    result = {"kind": "SUCCESS", "data": {"refund": "r-7"}}

    response, sent = _statements(started, "result", ticket=0, result=result, then="model")

    assert response.status_code == 200 and response.json()["allowed"] is True
    read, saved = sent
    assert "FOR UPDATE" not in read and "console_operation" not in read
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
    # The save that assumed a fresh key made nothing; the step ran again, holding the row's
    # lock, with the ledger asked.
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


# -- a step run without the row's lock: the races it may lose -----------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_step_whose_row_changed_since_its_read_runs_again_holding_the_lock_and_claims_once(
    started: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    started.step("model")
    before = Task.objects.get(id=started.task)
    save = _Unlocked.save

    def raced(store: _Unlocked, step: Step, **kwargs: Any) -> Saved:
        # Another request of the task commits between this one's read and its save.
        Task.objects.filter(id=store.task_id).update(lease_expires_at=F("lease_expires_at"))
        return save(store, step, **kwargs)

    monkeypatch.setattr(_Unlocked, "save", raced)

    response, sent = _statements(started, "tools", calls=[REFUND], enter=True)

    assert response.json()["action"] == "execute"
    # The read, the race's update, the save that found the row changed; then the lock.
    read, _, lost, begin, opened, saved, commit = sent
    assert "LEFT JOIN console_steprequest" in read and (begin, commit) == ("BEGIN", "COMMIT")
    assert "xmin" in lost and "FOR UPDATE" in opened and "INSERT INTO console_operation" in saved
    op = Operation.objects.get(key="refund/7")
    assert op.attempts == 1 and op.history.count() == 1
    task = Task.objects.get(id=started.task)
    assert (task.requests, task.executions) == (before.requests + 1, before.executions + 1)
    events = TraceEvent.objects.filter(task_id=started.task, seq__gte=before.next_seq)
    assert events.count() == task.next_seq - before.next_seq == 1  # the model call's, once
    assert StepRequest.objects.filter(task_id=started.task).exclude(step="start").count() == 2


@pytest.mark.django_db(transaction=True)
def test_a_retry_whose_original_answered_after_its_read_fails_its_save_whole_and_gets_that(
    started: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    started.step("model")
    before = Task.objects.get(id=started.task)
    save = _Unlocked.save
    original = {
        "protocol": 1, "task": started.task, "phase": 1, "state": "RUNNING",
        "remaining": {"model_calls": 123}, "stop": None, "request_id": "admit-1",
    }  # fmt: skip

    def answered_meanwhile(store: _Unlocked, step: Step, **kwargs: Any) -> Saved:
        # The original request's answer, committed after this retry read the task without
        # it (a row that changed nothing else: the compare-and-set alone would not see it).
        assert step.answer is not None
        StepRequest.objects.create(
            task_id=store.task_id,
            request_id=step.answer.request_id,
            step=step.answer.step,
            body_hash=step.answer.body_hash,
            answer=original,
        )
        return save(store, step, **kwargs)

    monkeypatch.setattr(_Unlocked, "save", answered_meanwhile)

    response = started.send("tools", calls=[REFUND], enter=True, request_id="admit-1")

    assert response.status_code == 200 and response.json() == original
    assert not Operation.objects.filter(key="refund/7").exists()  # nothing of it stands
    task = Task.objects.get(id=started.task)
    assert (task.requests, task.next_seq) == (before.requests, before.next_seq)


def test_a_ledger_read_the_guard_swallows_still_sends_the_step_to_the_lock(
    started: Client,
) -> None:
    started.step("model")
    batch = [REFUND, {**REFUND, "args": {"order": 8}, "operation_key": "refund/8"}]

    # A batch's writes are looked up whole at its admission: the guard stops on a ledger it
    # cannot read, but that stop is never saved without the lock.
    response, sent = _statements(started, "tools", calls=batch)

    assert [t["ticket"] for t in response.json()["admitted"]] == [0, 1]
    assert "FOR UPDATE" not in sent[0] and "FOR UPDATE" in sent[1]
    assert Task.objects.get(id=started.task).state == "RUNNING"


def test_an_unlocked_step_s_store_writes_nothing_but_the_step_s_last_save() -> None:
    """Every method of the step store refuses on an unlocked step's (NeedsLock), except its
    last save and what goes with it: a method added to the store must be placed here."""
    allowed = {"save", "go_on", "answered"}
    methods = {
        name
        for name, value in vars(StepStore).items()
        if callable(value) and not name.startswith("_")
    }
    assert allowed <= methods
    for name in sorted(methods - allowed):
        assert name in vars(_Unlocked), f"_Unlocked.{name} would run without the row's lock"
        store = _Unlocked(1, "lease", "1")
        args, kwargs = _arguments(getattr(StepStore, name))
        with pytest.raises(NeedsLock):
            getattr(store, name)(*args, **kwargs)
    refused = _Unlocked(1, "lease", "1")
    with pytest.raises(NeedsLock):
        refused.get("key")
    with pytest.raises(NeedsLock):  # once refused, its save is too
        refused.save(Step({}, 0, answer=Answer("r", "model", "h", {})))


def _arguments(method: Callable[..., Any]) -> tuple[list[Any], dict[str, Any]]:
    """Placeholder arguments for ``method`` (refused before any is read)."""
    needed = [
        p for p in list(inspect.signature(method).parameters.values())[1:] if p.default is p.empty
    ]
    args = [None for p in needed if p.kind is p.POSITIONAL_OR_KEYWORD]
    return args, {p.name: None for p in needed if p.kind is p.KEYWORD_ONLY}
