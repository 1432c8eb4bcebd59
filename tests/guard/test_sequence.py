"""The sequencer's order of a step, and a sequencer restored where a host left one
(a host that keeps the guard between requests, as the console does for attached clients)."""

from __future__ import annotations

import pytest

from guard import Call, Finish, Guard, Kind, Limits, Result
from guard.steps import Action, Next, OutOfOrder, Sequencer


def _guard() -> Guard:
    return Guard(Limits(deadline_ms=10_000, model_calls=5, requests=5, executions=5), now=lambda: 0)


def test_a_step_out_of_order_is_refused_naming_the_step_that_was_due() -> None:
    seq = Sequencer(_guard())
    with pytest.raises(OutOfOrder) as refused:
        seq.proposed(Call("lookup", {"n": 1}))
    assert refused.value.expected.next is Next.MODEL
    assert seq.model() is None
    (ticket,) = seq.proposed(Call("lookup", {"n": 1}))  # type: ignore[misc]
    with pytest.raises(OutOfOrder) as early:
        seq.returned(ticket, Result(Kind.SUCCESS, 1))
    assert early.value.expected.next is Next.ENTER and early.value.expected.ticket is ticket
    assert seq.enter(ticket).action is Action.EXECUTE
    with pytest.raises(OutOfOrder) as twice:
        seq.enter(ticket)
    assert twice.value.expected.next is Next.RESULT
    with pytest.raises(OutOfOrder):
        seq.model()  # a call is executing: its outcome first
    assert seq.guard.usage.model_calls == 1  # nothing moved


def test_a_restored_sequencer_goes_on_where_the_saved_one_stood() -> None:
    guard = _guard()
    seq = Sequencer(guard)
    seq.model()
    (ticket,) = seq.proposed(Call("lookup", {"n": 1}))  # type: ignore[misc]
    seq.enter(ticket)
    saved, position = guard.checkpoint(steps=True), seq.position()
    again = Guard.restore(saved, guard.limits, now=lambda: 0)
    resumed = Sequencer.resume(again, again.tickets, position)
    (executing,) = again.tickets
    assert resumed.next() == (Next.RESULT, executing, None)
    with pytest.raises(OutOfOrder):
        resumed.model()
    assert resumed.returned(executing, Result(Kind.SUCCESS, 1)) is None
    assert resumed.next().next is Next.WAIT
    with pytest.raises(OutOfOrder) as given:
        resumed.returned(executing, Result(Kind.SUCCESS, 2))
    assert "outcome already" in str(given.value)


def test_a_host_that_reports_reuses_itself_is_asked_for_their_outcome() -> None:
    guard = _guard()
    write = Call("refund", {"cents": 3}, "write", "order/3/refund")
    first = Sequencer(guard)
    first.model()
    (ticket,) = first.proposed(write)  # type: ignore[misc]
    first.enter(ticket)
    first.returned(ticket, Result(Kind.SUCCESS, "r-1"))
    assert first.pause() == 0
    seq = Sequencer.resume(guard, guard.tickets, first.position(), reports_reuse=True)
    seq.model()
    (again,) = seq.proposed(write)  # type: ignore[misc]
    assert seq.enter(again).action is Action.REUSE
    assert seq.next() == (Next.RESULT, again, None)  # its host reports it
    assert seq.returned(again, None) is None
    assert seq.next().next is Next.WAIT


def test_a_model_call_without_the_pause_asks_it_itself() -> None:
    seq = Sequencer(_guard())
    seq.model()
    (ticket,) = seq.proposed(Call("lookup", {"n": 1}))  # type: ignore[misc]
    seq.enter(ticket)
    seq.returned(ticket, Result(Kind.SUCCESS, 1))
    assert seq.position() == {"planning": False, "waited": False}
    assert seq.model() is None
    assert seq.position() == {"planning": True, "waited": True}
    assert seq.end(Finish("done")).state == "PARTIAL"  # no inspector: unverified


def test_a_model_call_that_skips_a_due_wait_is_refused_until_the_pause_is_asked() -> None:
    seq = Sequencer(_guard())
    seq.model()
    (ticket,) = seq.proposed(Call("job", {"id": 7}))  # type: ignore[misc]
    seq.enter(ticket)
    seq.returned(ticket, Result(Kind.PENDING, wait_ms=250))
    with pytest.raises(OutOfOrder) as early:
        seq.model()
    assert early.value.expected.next is Next.WAIT and early.value.wait_ms == 250
    assert seq.guard.usage.model_calls == 1  # nothing moved: the poll was not counted
    assert seq.pause() == 250
    assert seq.model() is None
    assert seq.guard.usage.model_calls == 2
