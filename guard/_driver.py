"""The reference driver: ``Guard.run`` over the guard's own steps, as any host would write it."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ._checks import describe
from ._report import Report
from ._settlement import Lookup
from ._ticket import Action
from ._values import Call, Finish, Nudge, Reason, Result, State

if TYPE_CHECKING:
    from ._guard import Guard

__all__ = ["Execute", "Inspect", "Plan", "Reserve", "Summarise", "drive"]

Plan = Callable[[Any], Any]
Reserve = Callable[[Any], int]
"""The next model call's maximum cost, given the observation it will see."""
Summarise = Callable[[str], Any]
"""The summary turn: one model call with no tools, given why the task stopped."""
Execute = Callable[[Call], Any]
Inspect = Callable[[Result | None, Call | Finish], Any]


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

    Only the step methods decide; the driver reaches inside the guard for two things no
    step covers: the injected ``wait``, and a write lost to an interrupt."""
    report, observation = _drive(guard, plan, execute, inspect, lookup, reserve)
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


def _drive(
    guard: Guard,
    plan: Plan,
    execute: Execute,
    inspect: Inspect | None,
    lookup: Lookup | None,
    reserve: Reserve | None,
) -> tuple[Report, Any]:
    """The loop of :func:`drive`: its report, and the model's last observation (what the
    summary turn follows)."""
    observation: Any = guard.rejection()  # a phase after a rejection tells the model first
    approved = guard.before_approved()  # a phase after an approval runs that call first
    while True:
        if approved is not None:
            admitted, approved = approved, None
            proposal: Any = None  # one call: its result is the observation
        else:
            try:
                if reserve is None:
                    stop = guard.before_model()
                else:  # ValueError: not an amount
                    stop = guard.before_model(reserve=reserve(observation))
            except Exception as exc:
                return guard.planner_failed(exc), observation
            if stop is not None:
                return stop, observation
            try:
                proposal = plan(observation)
            except Exception as exc:
                return guard.planner_failed(exc), observation
            if isinstance(proposal, Finish):
                return guard.finish(proposal, inspect), observation
            admitted = guard.before_tools(proposal)
        if not isinstance(admitted, list):  # one test for the common case: calls to run
            if isinstance(admitted, Nudge):
                observation = admitted
                continue
            return admitted, observation
        results: list[Any] = []  # the tickets' results: after_tool() set each one it let by
        for ticket in admitted:
            decision = guard.before_tool(ticket, lookup=lookup)
            if decision.report is not None:
                return decision.report, observation
            outcome: Any = decision.result
            error: Exception | None = None
            if decision.action is Action.EXECUTE:
                try:
                    outcome = execute(ticket.call)
                except Exception as exc:
                    error = exc
                except BaseException:
                    # Interrupted mid-execution: the write may or may not have happened.
                    guard._lost(ticket, "interrupted")
                    raise
            stop = guard.after_tool(ticket, outcome, error=error, inspect=inspect, lookup=lookup)
            if stop is not None:
                return stop, observation
            results.append(ticket.result)
        pause = guard.before_wait()
        if pause:  # 0 (no wait) is the common case
            if isinstance(pause, Report):
                return pause, observation
            try:
                guard._wait(pause)
            except Exception as exc:
                if guard._cancel.requested():
                    return guard.halt(State.CANCELLED, Reason.OPERATOR_STOP), observation
                failed = guard.halt(State.FAILED, Reason.EXECUTOR_ERROR, describe(exc))
                return failed, observation
        several = isinstance(proposal, (list, tuple))  # a tuple: no union object made per step
        observation = results if several else results[0]
