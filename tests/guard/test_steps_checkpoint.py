"""A host that keeps the guard between requests (a step protocol over HTTP) checkpoints a
step in progress with ``checkpoint(steps=True)`` and finds its tickets again after
``restore``: nothing admitted is lost, nothing is admitted twice."""

from __future__ import annotations

import json

import pytest

from guard import Call, Evidence, Guard, InMemoryLedger, Kind, Limits, OperationState, Result
from guard.steps import Action

from .support import Clock, make_guard, roomy

WRITE = Call("send", {"n": 1}, "write", "k1")
READ = Call("read", {"page": 1})


def _committed(result: object, step: object) -> Evidence:
    return Evidence(1, False, committed=True)


def _again(guard: Guard, ledger: InMemoryLedger, clock: Clock) -> Guard:
    """The guard rebuilt from a JSON round trip of its checkpoint, as another request would."""
    saved = json.loads(json.dumps(guard.checkpoint(steps=True)))
    return Guard.restore(saved, guard.limits, now=clock.now, wait=clock.wait, ledger=ledger)


def test_a_batch_admitted_in_one_request_is_claimed_and_settled_in_the_next_ones() -> None:
    clock, ledger = Clock(), InMemoryLedger()
    guard = make_guard(clock, roomy(), ledger=ledger)
    assert guard.before_model() is None
    assert isinstance(guard.before_tools([WRITE, READ]), list)

    second = _again(guard, ledger, clock)
    write, read = second.tickets
    assert (write.call, read.call) == (WRITE, READ)
    assert second.before_tool(write).action is Action.EXECUTE

    third = _again(second, ledger, clock)
    write, read = third.tickets
    assert third.after_tool(write, Result(Kind.SUCCESS, {"sent": 1}), inspect=_committed) is None
    entry = ledger.get("k1")
    assert entry is not None and entry.state is OperationState.COMMITTED
    assert third.before_tool(read).action is Action.EXECUTE
    assert third.usage.executions == 2


def test_an_execution_never_reported_is_lost_after_a_restore_too() -> None:
    clock, ledger = Clock(), InMemoryLedger()
    guard = make_guard(clock, roomy(), ledger=ledger)
    assert guard.before_model() is None
    [ticket] = guard.before_tools(WRITE)  # type: ignore[misc]
    assert guard.before_tool(ticket).action is Action.EXECUTE

    again = _again(guard, ledger, clock)
    report = again.before_model()  # the host asks for a model call without the result

    assert report is not None and report.state == "NEEDS_HUMAN"
    assert report.detail == "no result was reported"
    entry = ledger.get("k1")
    assert entry is not None and entry.state is OperationState.UNKNOWN


def test_a_proposal_awaited_and_a_reservation_held_travel_too() -> None:
    clock, ledger = Clock(), InMemoryLedger()
    guard = make_guard(clock, Limits(spend=100), ledger=ledger)
    assert guard.before_model(reserve=60) is None

    again = _again(guard, ledger, clock)
    again.settle_spend(20)  # the reservation held in the first request is settled in this one

    assert again.usage.spend == 20
    assert isinstance(again.before_tools(READ), list)  # the proposal was awaited


def test_without_steps_the_checkpoint_stays_as_it_was() -> None:
    guard = make_guard(Clock(), roomy())
    assert guard.before_model() is None
    assert "steps" not in guard.checkpoint()
    assert "steps" in guard.checkpoint(steps=True)


def test_a_malformed_step_in_progress_is_refused() -> None:
    guard = make_guard(Clock(), roomy())
    assert guard.before_model() is None
    guard.before_tools(READ)
    saved = guard.checkpoint(steps=True)
    saved["steps"]["batch"][0]["effect"] = "delete"

    with pytest.raises(ValueError):
        Guard.restore(saved, guard.limits)
