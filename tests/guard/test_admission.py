"""The admission step: a model call's calls are checked whole, before any of them runs, and
the first refusal names the call it is about."""

from __future__ import annotations

from typing import Any

from guard import Call, InMemoryLedger, Kind, Nudge, Reason, Result, State, Usage
from guard._admission import AdmissionStep, Refused
from guard._budget import Budget
from guard._checks import Cancellation
from guard._detector import Detector
from guard._settlement import SettlementStep
from guard.steps import fingerprint

from .support import NOTICE_KEY, Clock, notice, read, roomy


def admission(
    ledger: InMemoryLedger | None = None, *, nudge: bool = False, **changes: Any
) -> tuple[AdmissionStep, Budget]:
    """An admission step over fresh parts, with one model call already counted."""
    limits = roomy(**changes)
    budget = Budget(limits, Clock().now, Usage())
    detector = Detector(limits, 0, nudge=nudge)
    settlement = SettlementStep(
        ledger if ledger is not None else InMemoryLedger(), Cancellation(None)
    )
    assert budget.start_model_call() is None
    return AdmissionStep(budget, detector, settlement, None), budget


def test_each_call_of_a_model_call_gets_a_ticket_in_order_and_counts_one_request() -> None:
    step, budget = admission()
    calls = [read("read_inbox", folder="open"), notice()]

    tickets = step.admit(calls)

    assert isinstance(tickets, list)
    assert [(t.index, t.call) for t in tickets] == [(0, calls[0]), (1, calls[1])]
    assert tickets[1].fingerprint == fingerprint("send_notice", dict(notice().args))
    assert budget.usage().requests == 2
    assert budget.usage().executions == 0  # admitted, not run


def test_a_malformed_proposal_is_refused_about_no_call() -> None:
    step, budget = admission()

    refused = step.admit("read the inbox")

    assert isinstance(refused, Refused)
    assert (refused.refusal.state, refused.refusal.reason) == (State.FAILED, Reason.BAD_CALL)
    assert refused.describe() is None
    assert budget.usage().requests == 0


def test_a_batch_larger_than_the_execution_budget_is_refused_at_the_call_that_does_not_fit() -> (
    None
):
    step, _ = admission(executions=1)
    calls = [read("read_inbox"), read("read_queue")]

    refused = step.admit(calls)

    assert isinstance(refused, Refused)
    assert refused.refusal.reason is Reason.EXECUTION_BUDGET
    assert refused.describe() == {
        "tool": "read_queue",
        "fingerprint": fingerprint("read_queue", {}),
        "operation_key": None,
    }


def test_a_write_without_an_operation_key_is_refused_without_naming_its_fingerprint() -> None:
    step, _ = admission()

    refused = step.admit(notice(key=None))

    assert isinstance(refused, Refused)
    assert refused.refusal.reason is Reason.MISSING_OPERATION_KEY
    assert refused.describe() == {"tool": "send_notice", "fingerprint": None, "operation_key": None}


def test_a_committed_write_needs_no_execution_to_be_admitted() -> None:
    ledger = InMemoryLedger()
    fp = fingerprint("send_notice", dict(notice().args))
    ledger.claim(NOTICE_KEY, fp)
    ledger.record(NOTICE_KEY, fp, Result(Kind.SUCCESS))
    step, _ = admission(ledger, executions=0)

    refused = step.admit([notice(), read("read_inbox")])  # a batch is looked at in the ledger

    assert isinstance(refused, Refused)
    assert refused.refusal.reason is Reason.EXECUTION_BUDGET
    assert refused.call == read("read_inbox")  # the write needed no execution; the read did


def test_a_repeat_within_one_model_call_is_nudged_once_when_nudging_is_on() -> None:
    step, _ = admission(nudge=True, same=1)
    call = Call("read_inbox", {"folder": "open"})

    nudged = step.admit([call, call])

    assert isinstance(nudged, Nudge)
    assert (nudged.tool, nudged.reason) == ("read_inbox", Reason.SAME_CALL)
