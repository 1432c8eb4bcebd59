"""Attached steps run on the task row read without its lock, raced (issue 20, attached cut 2):
real threads, real row locks on PostgreSQL. Each test holds the unlocked save back at the
moment that matters (both requests have read the row and decided; a Stop holds the row),
then lets the real save run and checks what a client and the ledger end with."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection, transaction

from console import services
from console.drivers import attached
from console.models import Operation, StepRequest, Task
from console.records.roles import Role
from console.store import Saved, Step
from console.store.postgresql import _Unlocked

from .helpers import Caller
from .test_attached import Client

OK = {"kind": "SUCCESS", "data": {}}


@pytest.fixture
def started(caller: Callable[..., Caller]) -> Client:
    client = Client(caller(Role.AGENT))
    assert client.start().status_code == 201
    return client


def _body(client: Client, request_id: str, step: str, fields: dict[str, Any]) -> dict[str, Any]:
    return {"protocol": 1, "request_id": request_id, "lease": client.lease, "step": step, **fields}


def _answer(client: Client, request_id: str, step: str, **fields: Any) -> dict[str, Any]:
    """One step request as the API makes it (the same function, the same checks)."""
    return attached.attached_step(
        actor=client.caller.user,
        task_id=client.task,
        request_id=request_id,
        lease=client.lease,
        step=step,
        fields=fields,
        fingerprint=attached.body_hash(_body(client, request_id, step, fields)),
    )


def _in_threads(work: dict[str, Callable[[], dict[str, Any]]]) -> dict[str, Any]:
    """Each piece of work in a thread of its own (its own connection); what each answered,
    or the exception it raised."""
    answers: dict[str, Any] = {}

    def run(name: str, job: Callable[[], dict[str, Any]]) -> None:
        try:
            answers[name] = job()
        except Exception as exc:  # told to the test as an answer
            answers[name] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=item) for item in work.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return answers


def _both_read_first(monkeypatch: pytest.MonkeyPatch) -> None:
    """Hold each unlocked save until the other request has read the row and decided too."""
    barrier = threading.Barrier(2, timeout=10)
    save = _Unlocked.save

    def held(store: _Unlocked, step: Step, **kwargs: Any) -> Saved:
        barrier.wait()
        return save(store, step, **kwargs)

    monkeypatch.setattr(_Unlocked, "save", held)


@pytest.mark.django_db(transaction=True)
def test_two_calls_of_one_batch_that_read_before_either_saves_each_claim_once(
    started: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    started.step("model")
    calls = [{"tool": "refund", "args": {"order": n}, "operation_key": f"race/{n}"} for n in (1, 2)]
    assert [t["ticket"] for t in started.step("tools", calls=calls)["admitted"]] == [0, 1]
    before = Task.objects.get(id=started.task).executions
    _both_read_first(monkeypatch)

    answers = _in_threads(
        {f"call {n}": (lambda n=n: _answer(started, f"call-{n}", "call", ticket=n)) for n in (0, 1)}
    )
    monkeypatch.undo()

    assert [answers[f"call {n}"]["action"] for n in (0, 1)] == ["execute", "execute"], answers
    for key in ("race/1", "race/2"):
        operation = Operation.objects.get(key=key)
        assert (operation.state, operation.attempts, operation.history.count()) == (
            "IN_FLIGHT",
            1,
            1,
        )
    assert Task.objects.get(id=started.task).executions == before + 2  # no update lost
    started.step("result", ticket=0, result=OK)
    started.step("result", ticket=1, result=OK)
    assert set(Operation.objects.values_list("state", flat=True)) == {"COMMITTED"}


@pytest.mark.django_db(transaction=True)
def test_a_retry_and_its_original_that_both_read_first_get_one_answer_and_one_claim(
    started: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    started.step("model")
    refund = {"tool": "refund", "args": {"order": 6}, "operation_key": "race/6"}
    _both_read_first(monkeypatch)

    answers = _in_threads(
        {
            name: (lambda: _answer(started, "same-id", "tools", calls=[refund], enter=True))
            for name in ("original", "retry")
        }
    )

    assert answers["original"] == answers["retry"], answers
    assert answers["original"]["action"] == "execute"
    operation = Operation.objects.get(key="race/6")
    assert (operation.attempts, operation.history.count()) == (1, 1)
    assert StepRequest.objects.filter(task_id=started.task, request_id="same-id").count() == 1


@pytest.mark.django_db(transaction=True)
def test_a_stop_committed_while_an_unlocked_claim_waits_for_the_row_claims_nothing(
    started: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    started.step("model")
    started.step("tools", calls=[{"tool": "refund", "args": {"order": 5}, "operation_key": "r/5"}])
    holding = threading.Event()
    save = _Unlocked.save

    def stop_holding_the_row() -> dict[str, Any]:
        with transaction.atomic():
            services.task_stop(task_id=started.task, actor=started.caller.user, reason="halt")
            holding.set()
            time.sleep(0.7)  # the claim's save waits for the row meanwhile
        return {}

    def stopped_meanwhile(store: _Unlocked, step: Step, **kwargs: Any) -> Saved:
        stopper = threading.Thread(target=lambda: _in_threads({"stop": stop_holding_the_row}))
        stopper.start()
        assert holding.wait(5)
        try:
            return save(store, step, **kwargs)  # waits for the row, finds it changed
        finally:
            stopper.join(10)

    monkeypatch.setattr(_Unlocked, "save", stopped_meanwhile)
    answer = started.step("call", ticket=0)

    assert answer.get("action") is None, answer  # never "execute"
    assert answer["stop"] is not None and answer["stop"]["reason"] == "operator_stop"
    assert not Operation.objects.filter(key="r/5").exists()


@pytest.mark.django_db
def test_inside_a_transaction_a_retry_that_meets_its_answer_is_given_it(
    started: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The API runs each request in autocommit; a caller's transaction around one (here the
    # test's) must not turn a retry's failed save into an aborted transaction.
    started.step("model")
    refund = {"tool": "refund", "args": {"order": 7}, "operation_key": "race/7"}
    fields: dict[str, Any] = {"calls": [refund], "enter": True}
    first = {"protocol": 1, "task": started.task, "phase": 1, "state": "RUNNING"}
    save = _Unlocked.save

    def answered_meanwhile(store: _Unlocked, step: Step, **kwargs: Any) -> Saved:
        # The original commits its answer between this retry's read and its save.
        assert step.answer is not None
        StepRequest.objects.create(
            task_id=store.task_id,
            request_id="in-tx",
            step=step.answer.step,
            body_hash=step.answer.body_hash,
            answer={**first, "request_id": "in-tx"},
        )
        return save(store, step, **kwargs)

    monkeypatch.setattr(_Unlocked, "save", answered_meanwhile)
    with transaction.atomic():
        answer = _answer(started, "in-tx", "tools", **fields)

    assert answer == {**first, "request_id": "in-tx"}
    assert not Operation.objects.filter(key="race/7").exists()  # the retry claimed nothing
