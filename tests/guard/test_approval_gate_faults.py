"""The approval gate fails closed: a ledger that cannot be read, an uncertain entry that a
reconciler may yet settle, a policy that raises for a call a person approved."""

from __future__ import annotations

from guard import Approval, Call, Evidence, InMemoryLedger, Kind, Reason, Result, State
from guard.steps import Operation, fingerprint

from .support import Clock, Notices, make_guard, notice, roomy, scripted


class FlakyLedger(InMemoryLedger):
    """Its reads fail the first ``failures`` times."""

    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures

    def get(self, key: str) -> Operation | None:
        if self.failures:
            self.failures -= 1
            raise ConnectionError("the ledger is unreachable")
        return super().get(key)


def test_a_write_needing_approval_is_held_when_the_ledger_cannot_be_read() -> None:
    notices = Notices()
    guard = make_guard(Clock(), roomy(), ledger=FlakyLedger(1), needs_approval=lambda c: True)
    script = scripted([notice()], [notices.send], [Evidence(1, False, committed=True)])

    report = script.run(guard)

    assert (report.state, report.reason) == (State.NEEDS_HUMAN, Reason.APPROVAL_REQUIRED)
    assert notices.sent == {}


def test_a_write_whose_entry_is_uncertain_still_waits_for_a_person() -> None:
    # Not sent to the claim on the ledger's word: a reconciler may yet settle it
    # NOT_COMMITTED, and the claim would then run it unasked.
    ledger = InMemoryLedger()
    call = notice()
    fp = fingerprint(call.tool, call.args)
    ledger.claim(str(call.operation_key), fp)
    ledger.mark_unknown(str(call.operation_key), fp)
    guard = make_guard(Clock(), roomy(), ledger=ledger, needs_approval=lambda c: True)

    report = scripted([call], [Result(Kind.SUCCESS)], [Evidence(1, False)]).run(guard)

    assert (report.state, report.reason) == (State.NEEDS_HUMAN, Reason.APPROVAL_REQUIRED)


def test_an_approved_call_runs_even_when_the_policy_now_raises() -> None:
    def broken(call: Call) -> bool:
        raise RuntimeError("the policy's service is down")

    call = notice()
    approval = Approval(
        fingerprint(call.tool, call.args), call.operation_key, True, call=call, tool=call.tool
    )
    notices = Notices()
    guard = make_guard(Clock(), roomy(), needs_approval=broken, approvals=[approval])
    script = scripted([call], [notices.send], [Evidence(1, True, committed=True)])

    report = script.run(guard)

    assert len(notices.sent) == 1
    assert report.reason is not Reason.APPROVAL_REQUIRED
    assert (report.state, report.reason) == (State.COMPLETED, Reason.GOAL_MET)
