"""The database ledger keeps invariant 2 on real PostgreSQL: one claim per operation key.

Each test drives ``DatabaseLedger`` directly against the test database; the race at the
end runs eight separate OS processes, each with its own connection, claiming the same keys
at the same moment.
"""

from __future__ import annotations

import json
import subprocess
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connections, transaction
from django.utils import timezone

from console import services
from console.drivers.ledger import DatabaseLedger
from console.models import (
    Operation,
    OperationEvent,
    OperationState,
    Task,
    TaskState,
    TraceEvent,
)
from console.records.roles import Role, assign
from console.store import LeaseLost, Step
from guard import Call, Kind, Result
from guard.steps import ClaimStatus, LedgerError
from tests.databases import on_test_database
from tests.processes import start_python
from tests.waiting import CLAIMER, release_together

pytestmark = pytest.mark.django_db(transaction=True)

OWNER = "worker-a:1:0001"
KEY = "incident-42-first-notice"
FP = "f" * 64
OTHER_FP = "0" * 64


def running_task(owner: str = OWNER, **fields: Any) -> Task:
    """A task some driver (``owner``) holds the lease on, as the runner leaves it."""
    return Task.objects.create(
        agent="test_notices",
        input_fingerprint="t",
        limits={},
        state=TaskState.RUNNING,
        lease_owner=owner,
        lease_expires_at=timezone.now() + timedelta(seconds=30),
        **fields,
    )


def ledger_for(task: Task, owner: str = OWNER) -> DatabaseLedger:
    ledger = DatabaseLedger(task_id=task.id, owner=owner)
    ledger.describe(Call("send_notice", {"text": "hello", "api_key": "sk-live"}, "write", KEY))
    return ledger


def history(key: str) -> list[tuple[str, str]]:
    return list(
        OperationEvent.objects.filter(operation__key=key)
        .order_by("id")
        .values_list("from_state", "to_state")
    )


# -- claims ---------------------------------------------------------------------------------


def test_a_fresh_claim_inserts_one_in_flight_row_and_its_history() -> None:
    task = running_task()

    claim = ledger_for(task).claim(KEY, FP)

    assert claim.status is ClaimStatus.CLAIMED
    assert claim.operation.state == OperationState.IN_FLIGHT
    row = Operation.objects.get(key=KEY)
    assert (row.state, row.fingerprint, row.attempts, row.task_id) == ("IN_FLIGHT", FP, 1, task.id)
    assert row.tool == "send_notice"
    assert "sk-live" not in row.args_preview
    assert history(KEY) == [("", "IN_FLIGHT")]


def test_a_committed_operation_returns_its_stored_result_without_a_new_claim() -> None:
    ledger = ledger_for(running_task())
    ledger.claim(KEY, FP)
    ledger.record(KEY, FP, Result(Kind.SUCCESS, {"sent": KEY}))

    again = ledger.claim(KEY, FP)

    assert again.status is ClaimStatus.COMMITTED
    assert again.operation.result == Result(Kind.SUCCESS, {"sent": KEY})
    row = Operation.objects.get(key=KEY)
    assert (row.state, row.attempts) == ("COMMITTED", 1)
    assert history(KEY) == [("", "IN_FLIGHT"), ("IN_FLIGHT", "COMMITTED")]


@pytest.mark.parametrize("state", ["IN_FLIGHT", "UNKNOWN", "COMMITTED", "NOT_COMMITTED"])
def test_the_same_key_with_other_input_is_a_conflict_and_changes_nothing(state: str) -> None:
    ledger = ledger_for(running_task())
    ledger.claim(KEY, FP)
    if state == "UNKNOWN":
        ledger.mark_unknown(KEY, FP)
    elif state == "COMMITTED":
        ledger.record(KEY, FP, Result(Kind.SUCCESS))
    elif state == "NOT_COMMITTED":
        ledger.resolve(KEY, committed=False, evidence="no notice in the outbox")
    events = history(KEY)

    claim = ledger.claim(KEY, OTHER_FP)

    assert claim.status is ClaimStatus.CONFLICT
    row = Operation.objects.get(key=KEY)
    assert (row.state, row.fingerprint, row.attempts) == (state, FP, 1)
    assert history(KEY) == events


@pytest.mark.parametrize(
    ("state", "answer"),
    [("IN_FLIGHT", ClaimStatus.IN_FLIGHT), ("UNKNOWN", ClaimStatus.UNKNOWN)],
)
def test_an_uncertain_operation_is_never_claimed_again(state: str, answer: ClaimStatus) -> None:
    first = ledger_for(running_task())
    first.claim(KEY, FP)
    if state == "UNKNOWN":
        first.mark_unknown(KEY, FP)
    # Even another task's driver, holding its own lease, may not run it.
    second = ledger_for(running_task(owner="worker-b:2:0002"), owner="worker-b:2:0002")

    for ledger in (first, second, first):
        assert ledger.claim(KEY, FP).status is answer

    row = Operation.objects.get(key=KEY)
    assert (row.state, row.attempts) == (state, 1)
    assert len(history(KEY)) == (1 if state == "IN_FLIGHT" else 2)


def test_a_not_committed_operation_is_claimed_again_with_the_same_input() -> None:
    ledger = ledger_for(running_task())
    ledger.claim(KEY, FP)
    ledger.mark_unknown(KEY, FP)
    ledger.resolve(KEY, committed=False, evidence="no notice in the outbox")

    retried = ledger.claim(KEY, FP)

    assert retried.status is ClaimStatus.CLAIMED
    assert retried.operation.attempts == 2
    row = Operation.objects.get(key=KEY)
    assert (row.state, row.attempts, row.result) == ("IN_FLIGHT", 2, None)
    assert row.evidence == "no notice in the outbox"  # the fact that allowed the retry stays
    assert history(KEY) == [
        ("", "IN_FLIGHT"),
        ("IN_FLIGHT", "UNKNOWN"),
        ("UNKNOWN", "NOT_COMMITTED"),
        ("NOT_COMMITTED", "IN_FLIGHT"),
    ]
    # Claimed once more, it is in flight again: a third claim is refused.
    assert ledger.claim(KEY, FP).status is ClaimStatus.IN_FLIGHT
    assert Operation.objects.get(key=KEY).attempts == 2


def test_a_not_committed_operation_moves_to_the_task_that_reclaims_it() -> None:
    first_task = running_task()
    ledger_for(first_task).claim(KEY, FP)
    ledger_for(first_task).resolve(KEY, committed=False, evidence="bounced")
    second_task = running_task(owner="worker-b:2:0002")

    claim = ledger_for(second_task, owner="worker-b:2:0002").claim(KEY, FP)

    assert claim.status is ClaimStatus.CLAIMED
    assert Operation.objects.get(key=KEY).task_id == second_task.id


# -- transitions ----------------------------------------------------------------------------


def test_recording_a_result_stores_it_redacted_and_writes_one_history_row() -> None:
    ledger = ledger_for(running_task())
    ledger.claim(KEY, FP)

    entry = ledger.record(KEY, FP, Result(Kind.SUCCESS, {"sent": KEY, "token": "abc123"}))

    assert entry.state == OperationState.COMMITTED
    row = Operation.objects.get(key=KEY)
    assert row.result == {
        "kind": "SUCCESS",
        "data": {"sent": KEY, "token": "[redacted]"},
        "wait_ms": None,
        "attempts": 1,
    }
    assert history(KEY)[-1] == ("IN_FLIGHT", "COMMITTED")


def test_every_planted_secret_is_redacted_in_the_stored_result_and_plain_values_are_kept() -> None:
    ledger = ledger_for(running_task())
    ledger.claim(KEY, FP)
    planted = {
        "P-I-N": "1234",  # a secret name spelled with separators
        "X.Api_Key": "k",
        "note": "call with Bearer abcdefgh12345678 please",
        "keys": ["sk-abcdefghijklmnop", "ghp_abcdefghijklmnop", "AKIAABCDEFGHIJKLMNOP"],
        "jwt": "eyJhbGciOiJI.eyJzdWIiOiIx.c2lnbmF0dXJl",
        "log": "login failed: password=hunter2, retry",
        "nul": "a\x00b",
        "plain": {"page": 3, "items": [{"id": "orders-3-1", "line": 7}], "ok": True, "x": 1.5},
        1: "a number as a key",
    }

    ledger.record(KEY, FP, Result(Kind.SUCCESS, planted))

    stored = Operation.objects.get(key=KEY).result["data"]
    text = json.dumps(stored)
    for secret in ("1234", "abcdefgh12345678", "abcdefghijklmnop", "ABCDEFGHIJKLMNOP", "hunter2"):
        assert secret not in text
    assert "eyJ" not in text
    assert (stored["P-I-N"], stored["X.Api_Key"]) == ("[redacted]", "[redacted]")
    assert stored["note"] == "call with [redacted] please"
    assert stored["nul"] == "a\ufffdb"
    assert stored["plain"] == planted["plain"]
    assert stored["1"] == "a number as a key"


def test_the_operations_of_a_stop_report_are_read_with_their_stored_results() -> None:
    ledger = ledger_for(running_task())
    ledger.claim(KEY, FP)
    ledger.record(KEY, FP, Result(Kind.SUCCESS, {"sent": KEY}))
    ledger.claim("incident-42-second-notice", OTHER_FP)

    entries = ledger.get_many([KEY, "incident-42-second-notice", "never-claimed"])

    assert sorted(entries) == [KEY, "incident-42-second-notice"]
    assert entries[KEY].state == OperationState.COMMITTED
    assert entries[KEY].result == Result(Kind.SUCCESS, {"sent": KEY})
    second = entries["incident-42-second-notice"]
    assert (second.state, second.result, second.attempts) == (OperationState.IN_FLIGHT, None, 1)


def test_a_lost_response_marks_the_operation_unknown() -> None:
    ledger = ledger_for(running_task())
    ledger.claim(KEY, FP)

    entry = ledger.mark_unknown(KEY, FP)

    assert entry.state == OperationState.UNKNOWN
    assert Operation.objects.get(key=KEY).state == "UNKNOWN"
    assert history(KEY) == [("", "IN_FLIGHT"), ("IN_FLIGHT", "UNKNOWN")]


def test_resolving_an_unknown_operation_as_committed_keeps_the_result_and_the_evidence() -> None:
    task = running_task()
    ledger = ledger_for(task)
    ledger.claim(KEY, FP)
    ledger.mark_unknown(KEY, FP)

    entry = ledger.resolve(
        KEY, committed=True, result=Result(Kind.SUCCESS, {"id": 7}), evidence="found notice 7"
    )

    assert entry.state == OperationState.COMMITTED
    assert entry.result == Result(Kind.SUCCESS, {"id": 7})
    row = Operation.objects.get(key=KEY)
    assert (row.state, row.evidence) == ("COMMITTED", "found notice 7")
    last = OperationEvent.objects.filter(operation=row).order_by("id").last()
    assert last is not None
    assert (last.from_state, last.to_state, last.evidence, last.task_id) == (
        "UNKNOWN",
        "COMMITTED",
        "found notice 7",
        task.id,
    )


@pytest.mark.parametrize(
    "move",
    [
        pytest.param(lambda ledger: ledger.record(KEY, FP, Result(Kind.SUCCESS)), id="record"),
        pytest.param(lambda ledger: ledger.mark_unknown(KEY, FP), id="mark_unknown"),
        pytest.param(lambda ledger: ledger.resolve(KEY, committed=False), id="resolve"),
    ],
)
def test_a_transition_from_a_settled_state_is_refused_loudly(
    move: Callable[[DatabaseLedger], Any],
) -> None:
    ledger = ledger_for(running_task())
    ledger.claim(KEY, FP)
    ledger.record(KEY, FP, Result(Kind.SUCCESS, {"first": True}))

    with pytest.raises(LedgerError, match="is COMMITTED"):
        move(ledger)

    row = Operation.objects.get(key=KEY)
    assert (row.state, row.result["data"]) == ("COMMITTED", {"first": True})
    assert len(history(KEY)) == 2


def test_recording_a_result_for_other_input_or_a_missing_key_is_refused() -> None:
    ledger = ledger_for(running_task())
    ledger.claim(KEY, FP)

    with pytest.raises(LedgerError, match="another input"):
        ledger.record(KEY, OTHER_FP, Result(Kind.SUCCESS))
    with pytest.raises(LedgerError, match="no operation"):
        ledger.mark_unknown("no-such-key", FP)

    assert Operation.objects.get(key=KEY).state == "IN_FLIGHT"
    assert not Operation.objects.filter(key="no-such-key").exists()


def test_get_returns_the_entry_or_none() -> None:
    ledger = ledger_for(running_task())
    assert ledger.get(KEY) is None
    ledger.claim(KEY, FP)

    entry = ledger.get(KEY)

    assert entry is not None
    assert (entry.key, entry.fingerprint, entry.state, entry.attempts) == (
        KEY,
        FP,
        OperationState.IN_FLIGHT,
        1,
    )


# -- the gate: stop and lease, in the claim's own transaction --------------------------------


def carrying(ledger: DatabaseLedger, task: Task) -> Step:
    """The driver's save of a model call (its event and counters), given to ``ledger`` to
    carry on its next claim, as the runner sends it when the model proposed one write."""
    event = {"kind": "model_call", "at": timezone.now(), "decision": "planned"}
    usage = {"model_calls": 1, "requests": 1, "executions": 1, "tokens": 0, "spend": 0}
    step = Step({**usage, "explored": 0, "polls": 0, "elapsed_ms": 0}, 0, (event,))
    assert ledger.store.next_seq == task.next_seq
    ledger.carry = step
    return step


def saved_events(task: Task) -> list[str]:
    return list(TraceEvent.objects.filter(task=task).values_list("kind", flat=True))


@pytest.mark.parametrize("carried", [False, True], ids=["claim", "claim-carrying-a-save"])
def test_a_claim_after_the_stop_is_recorded_answers_stopping_and_inserts_nothing(
    carried: bool,
) -> None:
    task = running_task(stop_requested_at=timezone.now())
    ledger = ledger_for(task)
    step = carrying(ledger, task) if carried else None

    assert ledger.claim(KEY, FP).status is ClaimStatus.STOPPING

    assert not Operation.objects.filter(key=KEY).exists()
    assert not OperationEvent.objects.exists()
    # The model call that proposed the write is saved all the same, before the stop.
    assert saved_events(task) == (["model_call"] if carried else [])
    assert (step is not None and step.saved is not None) is carried


def test_a_claim_carrying_a_save_commits_both_or_neither() -> None:
    task = running_task()
    ledger = ledger_for(task)
    step = carrying(ledger, task)

    claim = ledger.claim(KEY, FP)

    assert claim.status is ClaimStatus.CLAIMED
    assert step.saved is not None
    task.refresh_from_db()
    assert (task.model_calls, task.requests, task.executions, task.next_seq) == (1, 1, 1, 2)
    assert saved_events(task) == ["model_call"]
    assert history(KEY) == [("", "IN_FLIGHT")]


def test_a_not_committed_operation_is_not_reclaimed_once_the_stop_is_recorded() -> None:
    task = running_task()
    ledger = ledger_for(task)
    ledger.claim(KEY, FP)
    ledger.resolve(KEY, committed=False, evidence="bounced")
    Task.objects.filter(id=task.id).update(stop_requested_at=timezone.now())

    assert ledger.claim(KEY, FP).status is ClaimStatus.STOPPING

    row = Operation.objects.get(key=KEY)
    assert (row.state, row.attempts) == ("NOT_COMMITTED", 1)


@pytest.mark.parametrize("carried", [False, True], ids=["claim", "claim-carrying-a-save"])
@pytest.mark.parametrize("holder", ["worker-b:2:0002", ""])
def test_a_claim_by_a_driver_that_does_not_hold_the_lease_raises_and_inserts_nothing(
    holder: str, carried: bool
) -> None:
    task = running_task(owner=holder)
    ledger = ledger_for(task, owner=OWNER)
    if carried:
        carrying(ledger, task)

    with pytest.raises(
        LeaseLost,
        match="no longer driven by this driver" if carried else (holder and "another") or "nobody",
    ):
        ledger.claim(KEY, FP)

    assert not Operation.objects.exists()
    assert not OperationEvent.objects.exists()
    assert saved_events(task) == []
    task.refresh_from_db()
    assert (task.model_calls, task.next_seq) == (0, 1)


def test_a_claim_for_a_task_that_does_not_exist_raises_lease_lost() -> None:
    with pytest.raises(LeaseLost, match="does not exist"):
        DatabaseLedger(task_id=999_999, owner=OWNER).claim(KEY, FP)

    assert not Operation.objects.exists()


@pytest.mark.parametrize("carried", [False, True], ids=["claim", "claim-carrying-a-save"])
def test_an_operator_stop_waits_for_a_claim_in_progress_and_the_next_claim_sees_it(
    carried: bool,
) -> None:
    """The claim holds the task row (FOR SHARE, or its save's UPDATE): a stop lands before
    it or after it."""
    task = running_task()
    operator = User.objects.create_user("olivia", password="x")
    assign(operator, [Role.OPERATOR])
    claimed = threading.Event()
    release = threading.Event()
    stopped = threading.Event()
    errors: list[BaseException] = []

    def claim_and_hold() -> None:
        try:
            # The outer transaction stretches the claim's own one, as a slow commit would.
            with transaction.atomic():
                ledger = ledger_for(task)
                if carried:
                    carrying(ledger, task)
                ledger.claim(KEY, FP)
                claimed.set()
                release.wait(10)
        except BaseException as exc:
            errors.append(exc)
            claimed.set()
        finally:
            connections.close_all()

    def stop() -> None:
        try:
            services.task_stop(task_id=task.id, actor=operator, reason="wrong customer")
            stopped.set()
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    claimer = threading.Thread(target=claim_and_hold)
    claimer.start()
    assert claimed.wait(10)
    stopper = threading.Thread(target=stop)
    stopper.start()
    blocked = not stopped.wait(0.5)
    release.set()
    claimer.join(10)
    stopper.join(10)

    assert errors == []
    assert blocked, "the stop went through while a claim held the task row"
    assert stopped.is_set()
    assert Operation.objects.get(key=KEY).state == "IN_FLIGHT"
    assert ledger_for(task).claim("incident-42-second-notice", FP).status is ClaimStatus.STOPPING
    assert not Operation.objects.filter(key="incident-42-second-notice").exists()


# -- the race: eight processes, one winner per key ----------------------------------------

PROCESSES = 8
FRESH_KEYS = [f"race-fresh-{n}" for n in range(50)]
RETRY_KEYS = [f"race-retry-{n}" for n in range(10)]
SLOT_S = 0.04


def start_claimer(task: Task, keys: list[str]) -> subprocess.Popen[str]:
    args = [str(task.id), task.lease_owner, FP, str(SLOT_S), json.dumps(keys)]
    return start_python(CLAIMER, *args, env=on_test_database())


@pytest.mark.slow
def test_of_eight_processes_claiming_each_key_at_once_exactly_one_wins() -> None:
    # A retry race too: keys already settled NOT_COMMITTED are taken back by one claimer.
    earlier = running_task(owner="earlier:0:0000")
    settle = DatabaseLedger(task_id=earlier.id, owner="earlier:0:0000")
    for key in RETRY_KEYS:
        settle.claim(key, FP)
        settle.resolve(key, committed=False, evidence="verified: nothing was sent")
    # One task per process, each held by its own driver: eight drivers, one business action.
    tasks = [running_task(owner=f"racer-{n}:{n}:{n:04}") for n in range(PROCESSES)]
    keys = FRESH_KEYS + RETRY_KEYS
    processes = [start_claimer(task, keys) for task in tasks]
    answers = release_together(processes, delay=0.2, timeout=30)
    for key in keys:
        seen = sorted(answer[key] for answer in answers)
        assert seen == ["claimed"] + ["in_flight"] * (PROCESSES - 1), (key, seen)
    rows = {row.key: row for row in Operation.objects.filter(key__in=keys)}
    assert Operation.objects.filter(key__startswith="race-").count() == len(keys)
    for key in keys:
        winner = next(n for n, answer in enumerate(answers) if answer[key] == "claimed")
        row = rows[key]
        assert (row.state, row.task_id) == ("IN_FLIGHT", tasks[winner].id)
        assert row.attempts == (2 if key in RETRY_KEYS else 1)
        claims = OperationEvent.objects.filter(operation=row, to_state="IN_FLIGHT")
        assert claims.count() == (2 if key in RETRY_KEYS else 1)
