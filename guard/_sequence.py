"""The order of a guarded step, in one place for every driver.

A host (``Guard.run``, the framework integrations, a loop of one's own) tells a
:class:`Sequencer` what happened, in the order it happened, and asks it what comes next, in
the manner of tenacity's ``iter(state)``::

    seq = Sequencer(guard, inspect=inspect)
    while (step := seq.next()).next is not Next.DONE:
        if step.next is Next.MODEL:      # ask for a model call, then call the model
            seq.model(reserve=...) or seq.proposed(plan(observation))
        elif step.next is Next.ENTER:    # an admitted call: execute, reuse or stop
            decision = seq.enter(step.ticket)
            if decision.action is Action.EXECUTE:
                seq.returned(step.ticket, run(step.ticket.call))   # or seq.raised(...)
        elif step.next is Next.WAIT:     # the model call's calls are done
            pause = seq.pause()          # milliseconds to wait first, or the stop report
    step.report                          # how the task ended

The order is: a model call is admitted (``model``), then its proposal is given
(``proposed``: the calls as one batch, or a :class:`~guard.Finish`); each admitted call is
entered (``enter``) and, if it executes, its outcome reported (``returned`` or ``raised``);
when every entered call is reported, ``pause`` says how long to wait before the next model
call. A host that does not run the calls one by one (a framework running them in parallel)
enters them in any order; a host that gets the order wrong gets :exc:`OutOfOrder` (a
``ValueError``), and nothing moves.

Three rules live here and nowhere else, so that every driver ends a loop the same way:

- **A reuse is settled at its entry**: ``enter`` reports a reused call's stored result
  itself, so the decision a host gets back is already final.
- **A tool's exception** ends the task ``FAILED``/``executor_error`` (a write's outcome is
  lost: ``UNKNOWN`` unless a trusted lookup settles it), every attempt of an outer retry
  layer charged as an execution (``raised(..., attempts=n)``); a layer that tries a read
  again asks ``again`` first, which stops the task when the deadline or the execution
  budget has no room for one more attempt.
- **A run that ends without the model's final answer** (a tool's output ended it, or the
  framework stopped on its own) ends ``PARTIAL``/``goal_unverified``: nobody said the goal
  was met, so nothing can verify it (``end()`` without a finish). With the model's answer,
  ``end(Finish(answer))`` is the guard's ``finish``: ``COMPLETED`` only if verified.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from enum import StrEnum
from typing import TYPE_CHECKING, Any, NamedTuple

from ._checks import describe
from ._report import Report
from ._settlement import Lookup
from ._ticket import Action, Decision, Status, Ticket
from ._values import Call, Finish, Kind, Nudge, Reason, Result, State

if TYPE_CHECKING:
    from ._protocol import StepGuard

Inspect = Callable[[Result | None, Call | Finish], Any]
"""A trusted inspector: ``Evidence`` from the application's own records."""

__all__ = ["ENDED_WITHOUT_ANSWER", "Inspect", "Next", "OutOfOrder", "Sequencer", "Step"]

ENDED_WITHOUT_ANSWER = "the run ended without the model's final answer"
"""The detail of a run that ended ``PARTIAL``/``goal_unverified`` with no final answer."""

_RETRY_WAIT_MS = 1  # what a charged failed attempt asks for: it is never waited, the task stops


class Next(StrEnum):
    """What the host does next."""

    MODEL = "model"  # ask for a model call (model), call the model, give its proposal
    PROPOSAL = "proposal"  # the model call was admitted: give what it proposed (proposed)
    ENTER = "enter"  # an admitted call waits at the executor's entry (enter)
    RESULT = "result"  # an executing call waits for its outcome (returned / raised)
    WAIT = "wait"  # the model call's calls are done: ask how long to wait (pause)
    DONE = "done"  # the task has stopped: the report says how


class Step(NamedTuple):
    """What comes next, and what it is about: the call to enter or report, or the report."""

    next: Next
    ticket: Ticket | None = None
    report: Report | None = None


class OutOfOrder(ValueError):
    """The host gave a step the sequencer did not expect now; ``expected`` is what it
    expected instead. Nothing moved."""

    def __init__(self, message: str, expected: Step, *, wait_ms: float | None = None) -> None:
        super().__init__(message)
        self.expected = expected
        self.wait_ms = wait_ms  # the wait that is due, when the refused step skipped it


_MODEL = Step(Next.MODEL)
_PROPOSAL = Step(Next.PROPOSAL)
_WAIT = Step(Next.WAIT)


class Sequencer:
    """Where one task's host stands in the order of a step, over any :class:`StepGuard`.

    ``inspect`` is the trusted inspector (``None``: the observed-evidence policy) and
    ``lookup`` the trusted lookup by operation key, both given to every step that takes
    them; a host whose tools each have their own lookup gives it per call instead
    (``enter``, ``returned`` and ``raised`` take ``lookup=``).
    """

    __slots__ = (
        "_batch", "_entered", "_guard", "_inspect", "_lookup", "_planning", "_reports_reuse",
        "_waited",
    )  # fmt: skip

    def __init__(
        self,
        guard: StepGuard,
        *,
        inspect: Inspect | None = None,
        lookup: Lookup | None = None,
        reports_reuse: bool = False,
    ) -> None:
        self._guard = guard
        self._inspect = inspect
        self._lookup = lookup
        # A host that reports a reused call itself (returned(ticket, None)): the console for
        # an attached client, whose inspector's word comes with that report.
        self._reports_reuse = reports_reuse
        self._planning = False  # a model call was admitted; its proposal is awaited
        self._batch: list[Ticket] = []  # the admitted calls of the current model call
        self._entered: set[Ticket] = set()  # executing, outcome not yet reported
        self._waited = True  # the pause after the batch was asked for (none is due)

    @classmethod
    def resume(
        cls,
        guard: StepGuard,
        tickets: Iterable[Ticket],
        position: Mapping[str, Any] | None = None,
        **options: Any,
    ) -> Sequencer:
        """A sequencer standing where an earlier one of the same task stood, for a host that
        keeps the guard between requests (``Guard.restore``): ``tickets`` are the current
        model call's admitted calls as the guard has them again (``Guard.tickets``), and
        ``position`` what :meth:`position` said then (``None``: no proposal awaited, and the
        pause due when there are tickets). An executing call (or, with ``reports_reuse``,
        one reusing its result) waits for its outcome. ``options`` are the constructor's."""
        seq = cls(guard, **options)
        seq._batch = list(tickets)
        waiting = (Status.EXECUTING, Status.REUSING) if seq._reports_reuse else (Status.EXECUTING,)
        seq._entered = {ticket for ticket in seq._batch if ticket.status in waiting}
        position = position or {}
        seq._planning = bool(position.get("planning", False))
        seq._waited = bool(position.get("waited", not seq._batch))
        return seq

    def position(self) -> dict[str, bool]:
        """Where the host stands beyond what the guard keeps (JSON-ready, for :meth:`resume`):
        a proposal awaited, and whether the pause after the last calls was asked."""
        return {"planning": self._planning, "waited": self._waited}

    def check(self, step: Next, ticket: Ticket | None = None) -> None:
        """Raise :exc:`OutOfOrder` unless ``step`` (about ``ticket`` for ENTER and RESULT)
        may come now; nothing moves. Each step checks the same before it moves anything; a
        host with work of its own before the step (reading a request) asks here first."""
        if step is Next.RESULT:
            if ticket not in self._entered:
                done = ticket is not None and ticket.status in (Status.RAN, Status.REUSED)
                said = "has its outcome already" if done else "is not executing"
                raise self._out_of_order(f"call {_index(ticket)} {said}")
            return
        if self._guard.report is not None:
            return  # the step answers the stop report
        if step is Next.MODEL or step is Next.WAIT:
            for waiting in self._entered:
                raise self._out_of_order(f"report the outcome of call {waiting.index} first")
        elif step is Next.PROPOSAL:
            if not self._planning:
                raise self._out_of_order("a proposal needs its own model() first")
        elif step is Next.ENTER and (
            ticket is None or ticket not in self._batch or ticket.status is not Status.ADMITTED
        ):
            raise self._out_of_order(f"call {_index(ticket)} is not waiting for its entry")

    @property
    def guard(self) -> StepGuard:
        return self._guard

    @property
    def report(self) -> Report | None:
        """The stop report once the task has stopped, else ``None``."""
        return self._guard.report

    @property
    def batch(self) -> tuple[Ticket, ...]:
        """The admitted calls of the current model call, in order."""
        return tuple(self._batch)

    def next(self) -> Step:
        """What the host does next (see :class:`Next`)."""
        if (report := self._guard.report) is not None and not self._entered:
            return Step(Next.DONE, report=report)
        if self._planning:
            return _PROPOSAL
        for ticket in self._batch:
            if ticket.status is Status.ADMITTED:
                return Step(Next.ENTER, ticket)
        for ticket in self._entered:
            return Step(Next.RESULT, ticket)
        return _MODEL if self._waited else _WAIT

    # -- the model call --------------------------------------------------------------------

    def model(self, *, reserve: int = 0) -> Report | None:
        """Ask for one model call (``reserve``: its maximum cost): ``None`` if it may
        happen, else the stop report. A call of the last batch that was never entered did
        not run; one that is executing must be reported first. A host that did not ask
        :meth:`pause` after the last calls has it asked here: the model call goes on when
        no wait is due, stops when the pause stops the task (a wait past the deadline, a
        stop asked for), and is refused (:exc:`OutOfOrder`, with ``wait_ms``) when a wait
        is due: the host asks :meth:`pause` and waits first."""
        if (report := self._guard.report) is not None:
            return report
        self.check(Next.MODEL)
        if not self._waited:
            pause = self._guard.before_wait()  # nothing moves unless it stops the task
            if isinstance(pause, Report):
                return pause
            if pause > 0:
                message = f"wait {pause:.0f} ms before the next model call (pause() first)"
                raise OutOfOrder(message, _WAIT, wait_ms=pause)
            self._waited = True
        stop = self._guard.before_model(reserve=reserve)
        self._batch = []
        self._planning = stop is None
        return stop

    def proposed(self, proposal: Any, *, enter: bool = False) -> list[Ticket] | Nudge | Report:
        """What the admitted model call proposed: one call or several (the admitted
        tickets, a nudge to show the model instead, or the stop report), or a
        :class:`~guard.Finish` (the stop report: ``COMPLETED`` only if verified).

        ``enter=True`` promises that the calls are entered at once, with nothing between
        (the guard's ``before_tools(enter=)``: a remote guard decides a single call's
        entry with its admission, in one request)."""
        self.check(Next.PROPOSAL)
        self._planning = False
        if isinstance(proposal, Finish):
            return self._guard.finish(proposal, self._inspect)
        admitted = self._guard.before_tools(proposal, enter=enter)
        if isinstance(admitted, list):
            self._batch = admitted
            self._waited = False
        return admitted

    def approved(self, admitted: list[Ticket] | Nudge | Report | None) -> None:
        """The call a person approved, as the guard admitted it without a model call
        (``Guard.before_approved``): its ticket is entered next, before any model call."""
        if isinstance(admitted, list):
            if self._batch or self._planning:
                raise self._out_of_order("an approved call opens a phase, before any step")
            self._batch = admitted
            self._waited = False

    def planner_failed(self, error: BaseException) -> Report:
        """The model call (or the estimate of its cost) raised instead of proposing."""
        self._planning = False
        return self._guard.planner_failed(error)

    # -- the calls -------------------------------------------------------------------------

    def enter(self, ticket: Ticket, *, lookup: Lookup | None = None) -> Decision:
        """At the executor's entry of an admitted call: ``EXECUTE`` (run it, then report
        it), ``REUSE`` (its stored result, already reported: give it to the model; the
        decision's ``report`` is set if that stopped the task) or ``STOP``."""
        if (report := self._guard.report) is not None:  # a sibling of the call stopped it
            return Decision(Action.STOP, ticket, report=report)
        self.check(Next.ENTER, ticket)
        lookup = lookup or self._lookup
        decision = self._guard.before_tool(ticket, lookup=lookup)
        if decision.action is Action.EXECUTE:
            self._entered.add(ticket)
        elif decision.action is Action.REUSE and self._reports_reuse:
            self._entered.add(ticket)  # its host reports it (returned(ticket, None))
        elif decision.action is Action.REUSE:
            stop = self._guard.after_tool(ticket, inspect=self._inspect, lookup=lookup)
            if stop is not None:
                return decision._replace(report=stop)
        return decision

    def again(self, ticket: Ticket, attempts: int) -> Report | None:
        """An outer retry layer would try an executing read once more, after ``attempts``
        attempts: ``None`` if the deadline and the execution budget have room for one more
        (every attempt is charged when the call is reported), else the stop report (the
        attempts so far charged)."""
        self._executing(ticket)
        if ticket.call.effect == "write":
            raise ValueError("a write is never tried again: its outcome is the ledger's")
        left = self._guard.remaining()
        executions, time_left = left.get("executions"), left.get("deadline_ms")
        reason: Reason | None = None
        if time_left is not None and time_left <= 0:
            reason = Reason.DEADLINE
        elif executions is not None and executions - (attempts - 1) < 1:
            reason = Reason.EXECUTION_BUDGET
        if reason is None:
            return None
        self._charge(ticket, "", attempts)
        detail = f"a retry of {ticket.call.tool} (attempt {attempts + 1}) did not fit"
        return self._guard.halt(State.PARTIAL, reason, detail)

    def returned(
        self, ticket: Ticket, result: Any, *, lookup: Lookup | None = None
    ) -> Report | None:
        """What an executing call returned (a :class:`~guard.Result`; anything else stops
        the task ``bad_result``): the stop report if the task stops here."""
        self._executing(ticket)
        self._entered.discard(ticket)
        lookup = lookup or self._lookup
        return self._guard.after_tool(ticket, result, inspect=self._inspect, lookup=lookup)

    def raised(
        self,
        ticket: Ticket,
        error: BaseException,
        *,
        attempts: int = 1,
        lookup: Lookup | None = None,
    ) -> Report | None:
        """An executing call raised ``error`` (after ``attempts`` attempts of an outer
        retry layer, each an execution): the task stops ``FAILED``/``executor_error``
        unless the guard's own rules settle it (a write a lookup proves harmless after a
        transient error may be asked again)."""
        self._executing(ticket)
        if attempts <= 1 or ticket.call.effect == "write":
            self._entered.discard(ticket)
            return self._guard.after_tool(
                ticket, error=error, inspect=self._inspect, lookup=lookup or self._lookup
            )
        described = describe(error)
        self._charge(ticket, described, attempts)
        detail = f"{described} (after {attempts} attempts)"
        return self._guard.halt(State.FAILED, Reason.EXECUTOR_ERROR, detail)

    def interrupted(self, ticket: Ticket, error: BaseException) -> Report | None:
        """The host is interrupted while the call executes (``KeyboardInterrupt``, a
        cancelled coroutine): its outcome is lost, a write left ``UNKNOWN`` for a person.
        The host lets the interrupt go on."""
        self._executing(ticket)
        self._entered.discard(ticket)
        return self._guard.after_tool(ticket, error=error, inspect=self._inspect)

    def pause(self) -> float | Report:
        """After every call of the model call is reported (or the first stop): how long
        to wait before the next model call (milliseconds, 0: none), or the stop report.
        Asked once per model call's calls; a host that asks before every model call (a
        framework hook) gets 0, or the report, when no wait is due."""
        self.check(Next.WAIT)
        if self._waited:  # no calls since the last wait: nothing asked for one
            report = self._guard.report
            return 0 if report is None else report
        self._waited = True
        return self._guard.before_wait()

    # -- the end ---------------------------------------------------------------------------

    def end(self, finish: Finish | None = None) -> Report:
        """The run is over: the stop report. A task not yet stopped ends with ``finish``,
        the model's final answer (``COMPLETED`` only if verified), or without one
        ``PARTIAL``/``goal_unverified`` (:data:`ENDED_WITHOUT_ANSWER`)."""
        if (report := self._guard.report) is not None:
            return report
        if finish is not None and self._planning:
            self._planning = False
            return self._guard.finish(finish, self._inspect)
        if finish is not None:
            raise self._out_of_order("a final answer needs its own model() first")
        self._planning = False
        return self._guard.halt(State.PARTIAL, Reason.GOAL_UNVERIFIED, ENDED_WITHOUT_ANSWER)

    def halt(self, state: State, reason: Reason, detail: str = "") -> Report:
        """Stop now for a reason the host found (the guard's ``halt``)."""
        self._planning = False
        return self._guard.halt(state, reason, detail)

    # -- internals -------------------------------------------------------------------------

    def _executing(self, ticket: Ticket) -> None:
        self.check(Next.RESULT, ticket)

    def _charge(self, ticket: Ticket, error: str, attempts: int) -> None:
        """Report a read's failed attempts so far, every one charged as an execution."""
        self._entered.discard(ticket)
        data = {"error": error, "attempts": attempts}
        result = Result(Kind.RETRYABLE, data, wait_ms=_RETRY_WAIT_MS, attempts=attempts)
        self._guard.after_tool(ticket, result, inspect=self._inspect, lookup=self._lookup)

    def _out_of_order(self, message: str) -> OutOfOrder:
        return OutOfOrder(message, self.next())


def _index(ticket: Ticket | None) -> str:
    return "?" if ticket is None else str(ticket.index)
