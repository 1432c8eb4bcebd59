"""The outcome step: what each call came to, as the inspector verifies it, decides whether
the task goes on; a write is settled with the same evidence."""

from __future__ import annotations

from typing import Any

from guard import Evidence, Finish, InMemoryLedger, Kind, OperationState, Reason, Result, State
from guard._checks import Cancellation
from guard._detector import Detector
from guard._outcome import OutcomeStep
from guard._report import Record
from guard._settlement import SettlementStep
from guard._ticket import Status
from guard.steps import Ticket, fingerprint

from .support import NOTICE_KEY, notice, read, roomy


def outcome(ledger: InMemoryLedger | None = None) -> tuple[OutcomeStep, Detector, Record]:
    limits = roomy()
    detector = Detector(limits, 0, nudge=False)
    record = Record()
    settlement = SettlementStep(
        ledger if ledger is not None else InMemoryLedger(), Cancellation(None)
    )
    return OutcomeStep(detector, settlement, record), detector, record


def ran(call: Any) -> Ticket:
    """A ticket whose call was let run (its status as ``after_tool`` leaves it)."""
    ticket = Ticket(0, call, fingerprint(call.tool, dict(call.args)), False)
    ticket.status = Status.RAN
    return ticket


def evidence(found: Any) -> Any:
    return lambda result, call: found


def test_a_verified_rise_in_the_revision_is_recorded_and_the_task_goes_on() -> None:
    step, detector, record = outcome()

    refused = step.verify(
        ran(read("read_page", page=1)), Result(Kind.SUCCESS), evidence(Evidence(1, False))
    )

    assert refused is None
    assert detector.revision == 1
    assert record.total == 1


def test_a_verified_goal_stops_the_task_completed() -> None:
    step, _, _ = outcome()

    refused = step.verify(ran(read("read_page")), Result(Kind.SUCCESS), evidence(Evidence(1, True)))

    assert refused is not None and (refused.state, refused.reason) == (
        State.COMPLETED,
        Reason.GOAL_MET,
    )


def test_a_permanent_error_stops_before_anything_is_observed() -> None:
    step, detector, record = outcome()

    refused = step.verify(ran(read("read_page")), Result(Kind.FATAL), evidence(Evidence(1, False)))

    assert refused is not None and refused.reason is Reason.FATAL
    assert (detector.revision, detector.repeats, record.total) == (0, {}, 0)


def test_the_longest_wait_of_a_model_call_is_kept_and_a_wait_without_a_length_stops() -> None:
    step, _, _ = outcome()
    job = read("fetch_job_status", job=7)

    assert (
        step.verify(ran(job), Result(Kind.PENDING, wait_ms=30), evidence(Evidence(0, False)))
        is None
    )
    assert (
        step.verify(ran(job), Result(Kind.RETRYABLE, wait_ms=10), evidence(Evidence(0, False)))
        is None
    )
    assert step.wait_ms == 30
    refused = step.verify(ran(job), Result(Kind.PENDING), evidence(Evidence(0, False)))
    assert refused is not None and refused.reason is Reason.INVALID_WAIT


def test_a_write_whose_evidence_cannot_be_read_is_left_unknown_for_a_human() -> None:
    ledger = InMemoryLedger()
    ticket = ran(notice())
    ledger.claim(NOTICE_KEY, ticket.fingerprint)
    step, _, _ = outcome(ledger)

    refused = step.verify(ticket, Result(Kind.SUCCESS), evidence("not evidence"))

    assert refused is not None
    assert (refused.state, refused.reason) == (State.NEEDS_HUMAN, Reason.INVALID_EVIDENCE)
    entry = ledger.get(NOTICE_KEY)
    assert entry is not None and entry.state is OperationState.UNKNOWN


def test_a_write_verified_committed_is_recorded_in_the_ledger() -> None:
    ledger = InMemoryLedger()
    ticket = ran(notice())
    ledger.claim(NOTICE_KEY, ticket.fingerprint)
    step, _, _ = outcome(ledger)

    assert (
        step.verify(ticket, Result(Kind.SUCCESS), evidence(Evidence(1, False, committed=True)))
        is None
    )

    entry = ledger.get(NOTICE_KEY)
    assert entry is not None and entry.state is OperationState.COMMITTED


def test_a_lost_outcome_without_a_lookup_stops_the_task_and_the_write_stays_unknown() -> None:
    ledger = InMemoryLedger()
    ticket = ran(notice())
    ledger.claim(NOTICE_KEY, ticket.fingerprint)
    step, _, _ = outcome(ledger)

    refused = step.lose(ticket, "timeout")

    assert refused is not None
    assert (refused.state, refused.reason, refused.detail) == (
        State.NEEDS_HUMAN,
        Reason.EXECUTOR_ERROR,
        "timeout",
    )
    entry = ledger.get(NOTICE_KEY)
    assert entry is not None and entry.state is OperationState.UNKNOWN


def test_a_finish_completes_only_when_the_goal_is_verified() -> None:
    step, detector, _ = outcome()

    unverified = step.finish(Finish(), evidence(Evidence(2, False)))
    met = step.finish(Finish(), evidence(Evidence(2, True)))

    assert (unverified.state, unverified.reason) == (State.PARTIAL, Reason.GOAL_UNVERIFIED)
    assert (met.state, met.reason) == (State.COMPLETED, Reason.GOAL_MET)
    assert detector.revision == 2
