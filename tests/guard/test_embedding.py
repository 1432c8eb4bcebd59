"""What an embedding application relies on: tool registries, checkpoints, ledger-side stops."""

import json

import pytest

from guard import Call, Evidence, Guard, InMemoryLedger, Kind, Limits, Reason, Result, State
from guard.steps import Claim, ClaimStatus


def _steady(result: Result | None, step: object) -> Evidence:
    return Evidence(0, False, committed=True)


def test_a_call_to_a_tool_the_application_does_not_have_is_a_bad_call() -> None:
    ran: list[Call] = []
    guard = Guard(Limits(), tools={"lookup_order": "read"})
    report = guard.run(
        lambda o: Call("drop_tables", {}), lambda c: ran.append(c) or Result(Kind.SUCCESS), _steady
    )
    assert (report.state, report.reason) == (State.FAILED, Reason.BAD_CALL)
    assert "drop_tables" in report.detail
    assert ran == []


def test_a_write_tool_called_as_a_read_is_a_bad_call_so_it_cannot_skip_the_ledger() -> None:
    ran: list[Call] = []
    guard = Guard(Limits(), tools={"refund": "write"})
    report = guard.run(
        lambda o: Call("refund", {"order": 1}, effect="read"),
        lambda c: ran.append(c) or Result(Kind.SUCCESS),
        _steady,
    )
    assert (report.state, report.reason) == (State.FAILED, Reason.BAD_CALL)
    assert "write" in report.detail
    assert ran == []


def test_a_guard_restored_from_a_json_checkpoint_remembers_budgets_and_repeats() -> None:
    ran: list[Call] = []

    def execute(call: Call) -> Result:
        ran.append(call)
        return Result(Kind.SUCCESS)

    limits = Limits(model_calls=10, same=2, stagnant=10)
    first = Guard(limits)
    for _ in range(2):
        assert first.before_model() is None
        (ticket,) = first.before_tools(Call("status", {"id": 7}))  # type: ignore[misc]
        first.before_tool(ticket)
        assert first.after_tool(ticket, execute(ticket.call), inspect=_steady) is None
    checkpoint = json.loads(json.dumps(first.checkpoint()))

    second = Guard.restore(checkpoint, limits)
    report = second.run(lambda o: Call("status", {"id": 7}), execute, _steady)

    assert (report.state, report.reason) == (State.PARTIAL, Reason.SAME_CALL)
    assert len(ran) == 2  # the restored guard refused the third identical call
    assert report.model_calls == 3
    assert report.requests == 3


def test_a_malformed_checkpoint_is_refused_with_a_clear_error() -> None:
    with pytest.raises(ValueError, match="malformed checkpoint"):
        Guard.restore({"version": 1, "usage": {"model_calls": -1}})
    with pytest.raises(ValueError, match="version"):
        Guard.restore({"version": 99})


class _StopAwareLedger(InMemoryLedger):
    """A ledger that, like the console's, keeps the task's stop fact and answers a claim
    ``STOPPING`` once it is recorded."""

    def __init__(self) -> None:
        super().__init__()
        self.stop_recorded = False  # the fact, in the "database"

    def claim(self, key: str, fingerprint: str) -> Claim:
        if self.stop_recorded:
            return Claim(ClaimStatus.STOPPING)
        return super().claim(key, fingerprint)


def test_a_claim_refused_because_of_a_recorded_stop_ends_cancelled_with_nothing_claimed() -> None:
    ledger = _StopAwareLedger()
    ran: list[Call] = []
    guard = Guard(Limits(), ledger=ledger)  # no cancel signal: the ledger's answer is the door
    assert guard.before_model() is None
    (ticket,) = guard.before_tools(Call("refund", {"o": 1}, "write", "order-1-refund"))  # type: ignore[misc]
    # The operator's stop commits after the guard's admission and before the claim.
    ledger.stop_recorded = True
    decision = guard.before_tool(ticket)

    assert decision.report is not None
    assert (decision.report.state, decision.report.reason) == (
        State.CANCELLED,
        Reason.OPERATOR_STOP,
    )
    assert ledger.get("order-1-refund") is None
    assert ran == []
    # The stop stands: the guard plans nothing more.
    assert guard.before_model() == decision.report


def test_a_ledger_that_fails_at_the_claim_is_not_taken_for_a_stop() -> None:
    class _Failing(InMemoryLedger):
        def claim(self, key: str, fingerprint: str) -> Claim:
            raise RuntimeError("the ledger is down")

    guard = Guard(Limits(), ledger=_Failing())
    assert guard.before_model() is None
    (ticket,) = guard.before_tools(Call("refund", {"o": 1}, "write", "order-1-refund"))  # type: ignore[misc]
    decision = guard.before_tool(ticket)

    assert decision.report is not None
    assert (decision.report.state, decision.report.reason) == (State.FAILED, Reason.EXECUTOR_ERROR)
