"""The reference driver: ``Guard.run`` (and ``RemoteGuard.run``) over the sequencer, as any
host would write its loop."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ._checks import describe, present
from ._report import Report
from ._sequence import Inspect, Next, Sequencer
from ._settlement import Lookup
from ._ticket import Action
from ._values import Call, Nudge, Reason, State

if TYPE_CHECKING:
    from ._guard import Guard

__all__ = ["Execute", "Inspect", "Plan", "Reserve", "Summarise", "drive", "loop"]

Plan = Callable[[Any], Any]
Reserve = Callable[[Any], int]
"""The next model call's maximum cost, given the observation it will see."""
Summarise = Callable[[str], Any]
"""The summary turn: one model call with no tools, given why the task stopped."""
Execute = Callable[[Call], Any]

# Read on every step: bound once here, since looking a member up on its enum costs each time.
_ENTER, _MODEL, _WAIT, _EXECUTE = Next.ENTER, Next.MODEL, Next.WAIT, Action.EXECUTE


def drive(
    guard: Guard,
    plan: Plan,
    execute: Execute,
    inspect: Inspect | None,
    lookup: Lookup | None,
    *,
    reserve: Reserve | None = None,
    summarise: Summarise | None = None,
) -> Report:
    """Drive ``plan`` / ``execute`` / ``inspect`` under ``guard`` until it stops; never
    raises (but lets an interrupt through, its write marked lost). See ``Guard.run``.

    A phase opened by a person's answer begins with it (a rejection is the model's first
    observation, an approved call runs first); then :func:`loop`; then, if asked, the
    summary turn. The driver reaches inside the guard for the injected ``wait`` only."""
    seq = Sequencer(guard, inspect=inspect, lookup=lookup)
    observation: Any = guard.rejection()
    approved = guard.before_approved()
    if isinstance(approved, Nudge):
        observation = approved
    seq.approved(approved)
    report, observation = loop(
        seq,
        plan,
        execute,
        observation,
        reserve=reserve,
        wait=guard._wait,
        cancelled=guard._cancel.requested,
    )
    if summarise is None:
        return report
    try:
        cost = 0 if reserve is None else reserve(observation)
        prompt = guard.summary_turn(reserve=cost)
    except Exception:
        return report  # its cost cannot be told: no paid call without a reservation
    if prompt is None:
        return report
    try:
        reply = summarise(prompt)
    except Exception as exc:
        reply = f"(the summary turn failed: {describe(exc)})"
    return guard.record_summary(reply)


def loop(
    seq: Sequencer,
    plan: Plan,
    execute: Execute,
    observation: Any = None,
    *,
    reserve: Reserve | None = None,
    wait: Callable[[float], None],
    cancelled: Callable[[], bool],
) -> tuple[Report, Any]:
    """Plan, execute and wait as ``seq`` says until the task stops, over any step-wise
    guard (the local one, ``guard.remote``): the report, and the model's last
    observation (what a summary turn follows). ``wait(ms)`` waits what a result asked
    for; a wait that raises stops the task (``cancelled()``: an operator's stop)."""
    several = False  # the model call proposed a list of calls: its observation is a list
    results: list[Any] = []  # the reported calls' results, in order
    while True:
        step = seq.next()
        what = step.next
        if what is _ENTER:
            ticket = present(step.ticket)
            decision = seq.enter(ticket)
            if decision.action is _EXECUTE:
                try:
                    outcome = execute(ticket.call)
                except Exception as exc:
                    seq.raised(ticket, exc)
                except BaseException as exc:
                    seq.interrupted(ticket, exc)  # the write may or may not have happened
                    raise
                else:
                    seq.returned(ticket, outcome)
            results.append(ticket.result)
        elif what is _MODEL:
            try:
                stop = seq.model(reserve=0 if reserve is None else reserve(observation))
            except Exception as exc:  # the estimate of its cost failed: not an amount
                return seq.planner_failed(exc), observation
            if stop is not None:
                return stop, observation
            try:
                proposal = plan(observation)
            except Exception as exc:
                return seq.planner_failed(exc), observation
            # The calls are entered at once, one after the other: a remote guard may decide
            # a single call's entry with its admission.
            admitted = seq.proposed(proposal, enter=True)
            if isinstance(admitted, Nudge):
                observation = admitted
            several = isinstance(proposal, (list, tuple))  # a tuple: no union made per step
            results = []
        elif what is _WAIT:
            pause = seq.pause()
            if isinstance(pause, Report):
                return pause, observation
            if pause:  # 0 (no wait) is the common case
                try:
                    wait(pause)
                except Exception as exc:
                    if cancelled():
                        return seq.halt(State.CANCELLED, Reason.OPERATOR_STOP), observation
                    failed = seq.halt(State.FAILED, Reason.EXECUTOR_ERROR, describe(exc))
                    return failed, observation
            observation = results if several else results[0]
        else:  # DONE (nothing in this loop leaves a call executing or a proposal awaited)
            return present(step.report), observation
