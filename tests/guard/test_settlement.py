"""Settlement of writes: a lost write settled by a trusted lookup, or left ``UNKNOWN``
for a human."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from guard import (
    Call,
    Finish,
    InMemoryLedger,
    Kind,
    OperationState,
    Reason,
    Result,
    Settlement,
    State,
)
from guard._checks import Cancellation, Refusal
from guard._settlement import SettlementStep, look_up
from guard.steps import IN_FLIGHT_WAIT_MS, fingerprint

from .support import (
    NOTICE_KEY,
    Clock,
    Executor,
    Inspector,
    Planner,
    Records,
    Script,
    make_guard,
    notice,
    read,
    tools,
)

# -- lookup of lost writes ----------------------------------------------------------------


def lost_write(records: Records, error: Exception | None = None) -> Script:
    def send_notice(call: Call) -> Result:
        raise error or TimeoutError("no response from the notice service")

    return Script(
        Planner(notice(), Finish()), tools(send_notice=send_notice), Inspector(records.inspect)
    )


def test_a_lost_write_settled_as_committed_by_lookup_goes_on_without_a_human() -> None:
    records = Records()
    ledger = InMemoryLedger()
    asked: list[str] = []
    found = Result(Kind.SUCCESS, {"notice_id": "n-9"})

    def lookup(key: str) -> Settlement:
        asked.append(key)
        records.revision, records.done = 1, True
        return Settlement(committed=True, result=found, evidence="n-9 in the outbox")

    guard = make_guard(Clock(), ledger=ledger)
    script = lost_write(records)

    report = script.run(guard, lookup=lookup)

    assert asked == [NOTICE_KEY]
    assert report.state is not State.NEEDS_HUMAN
    assert report.uncertain == ()
    entry = ledger.get(NOTICE_KEY)
    assert entry is not None
    assert (entry.state, entry.result) == (OperationState.COMMITTED, found)
    assert script.execute.entries == 1


def test_a_lost_write_settled_by_lookup_hands_its_result_to_the_model() -> None:
    records = Records()
    found = Result(Kind.SUCCESS, {"notice_id": "n-9"})
    guard = make_guard(Clock())
    script = lost_write(records)

    script.run(guard, lookup=lambda key: Settlement(committed=True, result=found))

    assert script.plan.observations[1] == found


def test_a_write_that_failed_for_good_and_did_not_happen_fails_and_may_be_retried() -> None:
    ledger = InMemoryLedger()
    guard = make_guard(Clock(), ledger=ledger)
    script = lost_write(Records(), ValueError("the notice service refused the template"))

    report = script.run(guard, lookup=lambda key: Settlement(committed=False, evidence="absent"))

    assert report.state is State.FAILED
    entry = ledger.get(NOTICE_KEY)
    assert entry is not None and entry.state is OperationState.NOT_COMMITTED
    assert report.uncertain == ()


def _raise(key: str) -> Any:
    raise RuntimeError("lookup service down")


@pytest.mark.parametrize(
    "lookup",
    [
        _raise,
        lambda key: "committed",
        lambda key: None,
        lambda key: True,
        lambda key: Settlement(committed=None),
        lambda key: Settlement(committed="yes"),  # type: ignore[arg-type]
        lambda key: Settlement(committed=True, result="receipt"),  # type: ignore[arg-type]
    ],
    ids=["raises", "text", "none", "bare-bool", "cannot-tell", "odd-flag", "junk-result"],
)
def test_a_lost_write_that_lookup_cannot_settle_stays_unknown_for_a_human(
    lookup: Callable[[str], Any],
) -> None:
    ledger = InMemoryLedger()
    guard = make_guard(Clock(), ledger=ledger)
    script = lost_write(Records())

    report = script.run(guard, lookup=lookup)

    assert report.state is State.NEEDS_HUMAN
    entry = ledger.get(NOTICE_KEY)
    assert entry is not None and entry.state is OperationState.UNKNOWN
    assert [op.key for op in report.uncertain] == [NOTICE_KEY]
    assert script.execute.entries == 1


def test_a_write_the_inspector_cannot_confirm_is_settled_by_lookup() -> None:
    records = Records()  # knows nothing about commits: committed=None
    ledger = InMemoryLedger()
    guard = make_guard(Clock(), ledger=ledger)
    script = Script(
        Planner(notice(), Finish()),
        Executor(Result(Kind.SUCCESS, {"notice_id": "n-1"})),
        Inspector(records.inspect),
    )

    report = script.run(guard, lookup=lambda key: Settlement(committed=True))

    assert report.state is not State.NEEDS_HUMAN
    entry = ledger.get(NOTICE_KEY)
    assert entry is not None and entry.state is OperationState.COMMITTED


def test_a_write_verified_as_not_committed_runs_again_with_the_same_key_and_input() -> None:
    records, ledger = Records(), InMemoryLedger()
    answers = iter([Result(Kind.RETRYABLE, wait_ms=10), Result(Kind.SUCCESS, {"notice_id": "n-1"})])

    def send_notice(call: Call) -> Result:
        answer = next(answers)
        # The outbox is the trusted record: the first try left nothing, the second landed.
        records.committed[NOTICE_KEY] = answer.kind is Kind.SUCCESS
        return answer

    guard = make_guard(Clock(), ledger=ledger)
    script = Script(
        Planner(notice(), notice(), Finish()),
        tools(send_notice=send_notice),
        Inspector(records.inspect),
    )

    report = script.run(guard)

    assert script.execute.calls == [notice(), notice()]
    entry = ledger.get(NOTICE_KEY)
    assert entry is not None
    assert (entry.state, entry.attempts) == (OperationState.COMMITTED, 2)
    assert report.uncertain == ()


# -- the settlement step itself -----------------------------------------------------------


def settlement(ledger: InMemoryLedger | None = None, *, stop: bool = False) -> SettlementStep:
    cancel = Cancellation(lambda: stop)
    return SettlementStep(ledger if ledger is not None else InMemoryLedger(), cancel)


NOTICE_FP = fingerprint("send_notice", dict(notice().args))


def test_a_claimed_write_executes_once_and_a_second_claim_is_told_to_wait() -> None:
    step = settlement()

    assert step.claim(NOTICE_KEY, NOTICE_FP, room=True) is None
    waiting = step.claim(NOTICE_KEY, NOTICE_FP, room=True)

    assert isinstance(waiting, Result)
    assert (waiting.kind, waiting.wait_ms) == (Kind.PENDING, IN_FLIGHT_WAIT_MS)
    assert waiting.data["operation_key"] == NOTICE_KEY
    assert step.in_flight(NOTICE_KEY)
    assert step.checkpoint() == {"touched": [NOTICE_KEY]}


def test_without_room_to_execute_only_a_committed_result_can_be_handed_back() -> None:
    ledger = InMemoryLedger()
    step = settlement(ledger)

    refused = step.claim(NOTICE_KEY, NOTICE_FP, room=False)
    assert isinstance(refused, Refusal) and refused.reason is Reason.EXECUTION_BUDGET
    ledger.claim(NOTICE_KEY, NOTICE_FP)
    ledger.record(NOTICE_KEY, NOTICE_FP, Result(Kind.SUCCESS, {"notice_id": "n-1"}))
    reused = step.claim(NOTICE_KEY, NOTICE_FP, room=False)
    assert not isinstance(reused, Refusal) and reused is not None
    assert reused.result == Result(Kind.SUCCESS, {"notice_id": "n-1"})


def test_the_same_key_twice_in_one_model_call_reuses_or_conflicts_without_the_ledger() -> None:
    step = settlement()
    step.begin_batch()

    assert step.admit(notice(), NOTICE_FP, look=False, batch=True) is False
    assert step.admit(notice(), NOTICE_FP, look=False, batch=True) is True
    conflict = step.admit(notice("Other text"), "another", look=False, batch=True)
    assert isinstance(conflict, Refusal) and conflict.reason is Reason.OPERATION_CONFLICT


def test_a_lost_write_is_left_unknown_and_a_lost_read_simply_fails() -> None:
    ledger = InMemoryLedger()
    step = settlement(ledger)
    step.claim(NOTICE_KEY, NOTICE_FP, room=True)

    lost_write = step.lose(notice(), NOTICE_FP, "timeout", None, settle=True)
    lost_read = step.lose(read("read_inbox"), "fp", "timeout", None, settle=True)

    assert lost_write == Refusal(State.NEEDS_HUMAN, Reason.EXECUTOR_ERROR, "timeout")
    entry = ledger.get(NOTICE_KEY)
    assert entry is not None and entry.state is OperationState.UNKNOWN
    assert lost_read == Refusal(State.FAILED, Reason.EXECUTOR_ERROR, "timeout")


def test_a_write_lost_after_the_operator_stopped_is_reported_as_the_stop() -> None:
    step = settlement(stop=True)
    step.claim(NOTICE_KEY, NOTICE_FP, room=True)

    lost = step.lose(notice(), NOTICE_FP, "interrupted", None, settle=False)

    assert lost == Refusal(State.NEEDS_HUMAN, Reason.OPERATOR_STOP, "interrupted")


@pytest.mark.parametrize(
    "answer",
    [
        RuntimeError("lookup down"),
        "committed",
        Settlement(committed=True, result=Result("DONE")),  # type: ignore[arg-type]
    ],
    ids=["raises", "not-a-settlement", "odd-result"],
)
def test_a_lookup_that_fails_or_answers_oddly_settles_nothing(answer: Any) -> None:
    def lookup(key: str) -> Any:
        if isinstance(answer, Exception):
            raise answer
        return answer

    assert look_up(lookup, NOTICE_KEY) is None
