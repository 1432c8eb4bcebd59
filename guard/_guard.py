"""The guard: decides before each model call and each tool execution whether it may happen.

:class:`Guard` composes its parts and says in which order they are asked: the budget
(``_budget``), the loop detector (``_detector``), the settlement of writes against the
ledger (``_settlement``), the plain input checks (``_checks``) and the record of what was
done (``_report``). Each part decides its own rules and records what happened to them; the
guard turns their refusals into the one stop report. ``_checkpoint`` lays out the parts'
checkpoints, ``_ticket`` holds what the steps hand the host, and ``_driver`` is ``run``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from ._budget import Budget, usage_from
from ._checkpoint import compose, history_of, parts_of
from ._checks import (
    Cancel,
    Cancellation,
    Refusal,
    as_calls,
    count,
    describe,
    evidence_problem,
    plain,
    positive_ms,
    present,
    result_problem,
)
from ._detector import Detector
from ._driver import Execute, Inspect, Plan, drive
from ._fingerprint import fingerprint
from ._ledger import InMemoryLedger, Ledger
from ._report import Record, Report
from ._settlement import Lookup, SettlementStep
from ._ticket import Action, Decision, Status, Ticket, about, execute
from ._values import (
    Call,
    Effect,
    Evidence,
    Finish,
    Kind,
    Limits,
    Nudge,
    Reason,
    Result,
    State,
    Usage,
)

__all__ = ["Guard"]


_WAITING = (Kind.RETRYABLE, Kind.PENDING)


def _monotonic_ms() -> float:
    return time.monotonic() * 1000.0


def _sleep_ms(ms: float) -> None:
    time.sleep(ms / 1000.0)


class Guard:
    """A deterministic loop guard for one task.

    Drive it with :meth:`run`, or step by step from another agent framework::

        if (stop := guard.before_model()) is not None: ...
        admitted = guard.before_tools(proposal)        # list[Ticket] | Nudge | Report
        for ticket in admitted:
            decision = guard.before_tool(ticket)       # EXECUTE / REUSE / STOP
            ...                                        # run the tool on EXECUTE only
            guard.after_tool(ticket, result, inspect=inspect)
        pause = guard.before_wait()                    # milliseconds to wait, or Report

    Once it has stopped it stays stopped: every method returns the same :class:`Report`.

    ``now``/``wait`` are the clock (ms) and the way to wait for ``RETRYABLE``/``PENDING``;
    ``ledger`` holds the operations (share one between tasks); ``revision`` and ``used``
    carry a task's verified progress and spent budget into a new phase; ``cancel`` is an
    event (``is_set()``) or callable checked before every model call, execution and wait;
    ``nudge`` turns the first repeat or cycle into a :class:`Nudge` for the model; ``tools``
    (name → ``"read"``/``"write"``) makes unknown tools and wrong effects a ``bad_call``.
    """

    def __init__(
        self,
        limits: Limits | None = None,
        *,
        now: Callable[[], float] = _monotonic_ms,
        wait: Callable[[float], None] = _sleep_ms,
        ledger: Ledger | None = None,
        revision: int = 0,
        used: Usage | None = None,
        cancel: Cancel | None = None,
        nudge: bool = False,
        tools: Mapping[str, Effect] | None = None,
    ) -> None:
        self.limits = limits if limits is not None else Limits()
        self.ledger: Ledger = ledger if ledger is not None else InMemoryLedger()
        self._wait = wait
        self._tools = None if tools is None else dict(tools)
        self._cancel = Cancellation(cancel)
        self._budget = Budget(self.limits, now, used if used is not None else Usage())
        self._detector = Detector(self.limits, revision, nudge=nudge)
        self._settlement = SettlementStep(self.ledger, self._cancel)
        self._record = Record()
        self._batch: list[Ticket] = []  # the calls of the current model call
        self._wait_ms: float = 0  # the longest wait they asked for
        self._planning = False  # a model call was admitted and its proposal is awaited

    # -- state ---------------------------------------------------------------------------

    @property
    def report(self) -> Report | None:
        """The stop report once the guard has stopped, else ``None``."""
        return self._record.report

    @property
    def usage(self) -> Usage:
        """What this task has spent so far, including earlier phases."""
        return self._budget.usage()

    @property
    def revision(self) -> int:
        """The verified revision: the business progress ``inspect`` reported so far."""
        return self._detector.revision

    def remaining(self) -> dict[str, int | None]:
        """Budget left per dimension (``None``: that dimension has no limit)."""
        return self._budget.remaining()

    def spend_tokens(self, tokens: int) -> None:
        """Charge model usage reported by the planner to the token budget."""
        if not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < 0:
            raise ValueError(f"tokens must be a non-negative int, got {tokens!r}")
        self._budget.spend_tokens(tokens)

    def cancel(self) -> None:
        """Ask the guard to stop; honoured at the next model call or tool execution."""
        self._cancel.set()

    def checkpoint(self, *, history: bool = True) -> dict[str, Any]:
        """JSON-ready state to rebuild this guard in another process with :meth:`restore`:
        each part's own checkpoint under its name (the budget's is ``usage``, what was spent:
        a host whose own counters are never behind may put those in its place).

        Counters and the detector's memory both travel, so a crash, a redelivery or a new
        worker neither resets a budget nor forgets a repeat. ``history=False`` leaves out
        what grows with the phase (see :meth:`history`): a host that keeps it elsewhere
        (a trace) hands it back to :meth:`restore`.
        """
        parts = {
            "usage": self._budget.checkpoint(),
            "detector": self._detector.checkpoint(),
            "settlement": self._settlement.checkpoint(),
            "record": self._record.checkpoint(),
        }
        return compose(parts, history=history)

    def history(self) -> dict[str, Any]:
        """What grows with the phase: the operation keys it touched (``touched``, in
        first-touched order) and its latest completed requests (``completed``, each
        ``[tool, fingerprint, operation_key, reused, revision]``, at most
        ``COMPLETED_KEPT``)."""
        return history_of(self.checkpoint())

    @classmethod
    def restore(
        cls,
        checkpoint: Mapping[str, Any],
        limits: Limits | None = None,
        *,
        history: Mapping[str, Any] | None = None,
        **options: Any,
    ) -> Guard:
        """A guard that goes on from ``checkpoint`` (see :meth:`checkpoint`; version 1
        checkpoints of earlier releases are read too).

        ``history`` gives back what ``checkpoint(history=False)`` left out, in the shape of
        :meth:`history`. ``options`` are the constructor's keyword arguments except
        ``used`` and ``revision``, which come from the checkpoint. Raises ``ValueError`` if
        the checkpoint is malformed or of an unknown version.
        """
        try:
            parts = parts_of(checkpoint, history)
            detector = parts["detector"]
            guard = cls(
                limits,
                used=usage_from(parts["usage"]),
                revision=count(detector["revision"]),
                **options,
            )
            guard._detector.load(detector)
            guard._settlement.load(parts["settlement"])
            guard._record.load(parts["record"])
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"malformed checkpoint: {exc!r}") from exc
        return guard

    # -- driver --------------------------------------------------------------------------

    def run(
        self, plan: Plan, execute: Execute, inspect: Inspect, *, lookup: Lookup | None = None
    ) -> Report:
        """Drive ``plan`` / ``execute`` / ``inspect`` until the guard stops; never raises.

        ``lookup(operation_key)`` is optional: it may settle a write whose outcome was lost
        (return a :class:`Settlement`) before the task stops as ``NEEDS_HUMAN``.
        """
        return drive(self, plan, execute, inspect, lookup)

    # -- steps ---------------------------------------------------------------------------

    def before_model(self) -> Report | None:
        """Check, then count, one model call. Returns the report if it must not happen."""
        if self._record.report is not None:
            return self._record.report
        for ticket in self._batch:
            if ticket.status is Status.EXECUTING:
                # The caller never reported this execution's outcome: treat it as lost.
                stop = self._lost(ticket, "no result was reported", None)
                if stop is not None:
                    return stop
        self._batch = []
        self._wait_ms = 0
        if self._cancel.requested():
            return self._stop(State.CANCELLED, Reason.OPERATOR_STOP)
        refused = self._budget.start_model_call()
        if refused is not None:
            return self._stop(State.PARTIAL, refused)
        self._planning = True
        return None

    def before_tools(self, proposal: Any) -> list[Ticket] | Nudge | Report:
        """Admit the calls of one model call, each checked before any of them runs.

        Returns the admitted tickets in order, a :class:`Nudge` to show the model instead
        (nothing runs), or the stop report. Counts one request per call examined.
        """
        if self._record.report is not None:
            return self._record.report
        self._expect_proposal()
        calls = as_calls(proposal, self._tools)
        if isinstance(calls, str):
            return self._stop(State.FAILED, Reason.BAD_CALL, detail=calls)
        budget, detector, settlement = self._budget, self._detector, self._settlement
        several = len(calls) > 1
        if several:
            settlement.begin_batch()
        tickets: list[Ticket] = []
        for index, call in enumerate(calls):
            refused = budget.start_request()
            if refused is not None:
                return self._stop(State.PARTIAL, refused, call=call)
            try:
                fp = fingerprint(call.tool, plain(call.args))
            except Exception as exc:  # BadArguments, or a Mapping that cannot be read
                return self._stop(State.FAILED, Reason.BAD_ARGS, call=call, detail=describe(exc))
            reuse: Refusal | bool = False
            if call.effect == "write":
                # One call alone meets the ledger's answers at its claim, with nothing run in
                # between; a batch, or a call with no room left to run, is looked at now.
                look = several or not budget.has_room(admitting=True)
                reuse = settlement.admit(call, fp, look=look, batch=several)
                if reuse is not False and reuse is not True:
                    state, reason, detail, named = reuse
                    fp_named = fp if named else None
                    return self._stop(state, reason, detail=detail, call=call, fp=fp_named)
            poll = detector.admit(call, fp)
            if poll is not False and poll is not True:
                if isinstance(poll, Nudge):
                    return poll
                return self._stop(poll.state, poll.reason, call=call, fp=fp)
            if not reuse and not budget.admit_execution():
                return self._stop(State.PARTIAL, Reason.EXECUTION_BUDGET, call=call, fp=fp)
            tickets.append(Ticket(index, call, fp, poll))
        polls = detector.end_admission()
        if polls:
            budget.count_polls(polls)
        self._batch = tickets
        return tickets

    def before_tool(self, ticket: Ticket) -> Decision:
        """Decide, at the executor's entry, whether this admitted call may run now.

        For a write this claims the operation key in the ledger: ``EXECUTE`` means this
        caller owns the only execution; ``REUSE`` hands back the committed result.
        """
        if self._record.report is not None:
            return Decision(Action.STOP, ticket, report=self._record.report)
        if ticket not in self._batch or ticket.status is not Status.ADMITTED:
            raise ValueError("before_tool() needs a fresh ticket from the current before_tools()")
        if self._cancel.requested():
            return self._refuse(ticket, Refusal(State.CANCELLED, Reason.OPERATOR_STOP))
        budget = self._budget
        if budget.past_deadline():
            return self._refuse(ticket, Refusal(State.PARTIAL, Reason.DEADLINE))
        room = budget.has_room()
        call = ticket.call
        if call.effect == "write":
            key = present(call.operation_key)
            claimed = self._settlement.claim(key, ticket.fingerprint, room=room)
            if claimed is not None:
                if isinstance(claimed, Refusal):
                    return self._refuse(ticket, claimed)
                ticket.status = Status.REUSING
                ticket.result = claimed.result or Result(Kind.SUCCESS)
                return Decision(Action.REUSE, ticket, result=ticket.result)
        elif not room:
            return self._refuse(ticket, Refusal(State.PARTIAL, Reason.EXECUTION_BUDGET))
        budget.enter()
        ticket.status = Status.EXECUTING
        return execute(ticket)

    def after_tool(
        self,
        ticket: Ticket,
        result: Any = None,
        *,
        error: BaseException | None = None,
        inspect: Inspect,
        lookup: Lookup | None = None,
    ) -> Report | None:
        """Record what one executed (or reused) call returned; the report if it stops here.

        Pass the tool's return value as ``result``, or the exception it raised as ``error``.
        """
        if self._record.report is not None:
            return self._record.report
        if ticket.status is Status.REUSING:
            ticket.status = Status.REUSED
            return self._verified(ticket, present(ticket.result), inspect, committed=None)
        if ticket.status is not Status.EXECUTING:
            raise ValueError("after_tool() needs a ticket that before_tool() let execute")
        ticket.status = Status.RAN
        write = ticket.call.effect == "write"
        if error is not None:
            if write:
                return self._lost(ticket, describe(error), lookup, inspect)
            if self._cancel.requested():
                return self._stop(State.CANCELLED, Reason.OPERATOR_STOP, ticket=ticket)
            return self._stop(State.FAILED, Reason.EXECUTOR_ERROR, ticket, describe(error))
        problem = result_problem(result)
        if problem is not None or not isinstance(result, Result):
            problem = problem or "not a Result"
            if write:
                return self._lost(ticket, problem, lookup, inspect, Reason.BAD_RESULT)
            return self._stop(State.FAILED, Reason.BAD_RESULT, ticket, problem)
        ticket.result = result
        if result.attempts != 1:
            self._budget.charge_retries(result.attempts)  # the adapter's own retries count too
        return self._verified(ticket, result, inspect, committed=None, lookup=lookup)

    def planner_failed(self, error: BaseException) -> Report:
        """The model call raised instead of proposing: stop ``FAILED/planner_error``."""
        if self._record.report is not None:
            return self._record.report
        self._planning = False
        return self._stop(State.FAILED, Reason.PLANNER_ERROR, detail=describe(error))

    def halt(self, state: State, reason: Reason, detail: str = "") -> Report:
        """Stop now for a reason found outside the guard: the host's word, for instance
        a ledger that records lazily finding that it could not. Sticky like every stop."""
        state, reason = State(state), Reason(reason)  # refused before anything changes
        if self._record.report is not None:
            return self._record.report
        self._planning = False
        return self._stop(state, reason, detail=detail)

    def before_wait(self) -> float | Report:
        """Milliseconds to wait before the next model call (0: none), or the stop report."""
        if self._record.report is not None:
            return self._record.report
        pause = self._wait_ms
        if pause <= 0:
            return 0
        if self._cancel.requested():
            return self._stop(State.CANCELLED, Reason.OPERATOR_STOP)
        if self._budget.wait_crosses_deadline(pause):
            return self._stop(
                State.PARTIAL, Reason.DEADLINE, detail=f"waiting {pause} ms would cross it"
            )
        return pause

    def finish(self, finish: Finish, inspect: Inspect) -> Report:
        """The model says it is done: ``COMPLETED`` only if ``inspect`` verifies the goal."""
        if self._record.report is not None:
            return self._record.report
        self._expect_proposal()
        try:
            evidence = inspect(None, finish)
        except Exception as exc:
            return self._stop(State.FAILED, Reason.INVALID_EVIDENCE, detail=describe(exc))
        problem = evidence_problem(evidence, self._detector.revision)
        if problem is not None:
            return self._stop(State.FAILED, Reason.INVALID_EVIDENCE, detail=problem)
        self._detector.revision = evidence.revision
        if evidence.done:
            return self._stop(State.COMPLETED, Reason.GOAL_MET)
        return self._stop(State.PARTIAL, Reason.GOAL_UNVERIFIED)

    # -- internals -----------------------------------------------------------------------

    def _verified(
        self,
        ticket: Ticket,
        result: Result,
        inspect: Inspect,
        *,
        committed: bool | None,
        lookup: Lookup | None = None,
    ) -> Report | None:
        """Inspect a result, settle its operation, then apply progress and stop rules."""
        call, fp = ticket.call, ticket.fingerprint
        uncertain = call.effect == "write" and ticket.status is Status.RAN and committed is None
        evidence: Any = None
        try:
            evidence = inspect(result, call)
        except Exception as exc:
            problem: str | None = describe(exc)
        else:
            problem = evidence_problem(evidence, self._detector.revision)
        if problem is not None or not isinstance(evidence, Evidence):
            problem = problem or "no evidence"
            if uncertain:
                return self._lost(ticket, problem, None, None, Reason.INVALID_EVIDENCE)
            return self._stop(State.FAILED, Reason.INVALID_EVIDENCE, ticket, problem)
        if uncertain:
            refused = self._settlement.settle(call, fp, result, evidence.committed, lookup)
            if refused is not None:
                return self._stop(refused.state, refused.reason, ticket, refused.detail)
        kind = result.kind
        if kind == Kind.FATAL:
            return self._stop(State.FAILED, Reason.FATAL, ticket)
        if kind == Kind.PRECONDITION:
            return self._stop(State.NEEDS_HUMAN, Reason.PRECONDITION, ticket)
        detector = self._detector
        stalled = detector.observe(call, fp, ticket.poll, kind, evidence.revision)
        if kind == Kind.SUCCESS:
            reused = ticket.status is Status.REUSED
            self._record.complete(call.tool, fp, call.operation_key, reused, detector.revision)
        if evidence.done:
            return self._stop(State.COMPLETED, Reason.GOAL_MET, ticket)
        if stalled:
            return self._stop(State.PARTIAL, Reason.NO_PROGRESS, ticket)
        if kind in _WAITING:
            wait_ms: Any = result.wait_ms
            if not positive_ms(wait_ms):
                return self._stop(State.FAILED, Reason.INVALID_WAIT, ticket, f"wait_ms={wait_ms!r}")
            self._wait_ms = max(self._wait_ms, wait_ms)
        return None

    def _lost(
        self,
        ticket: Ticket,
        detail: str,
        lookup: Lookup | None,
        inspect: Inspect | None = None,
        reason: Reason = Reason.EXECUTOR_ERROR,
    ) -> Report | None:
        """A call's outcome is lost: a lookup may settle a write (then it is verified as
        usual, with ``inspect``); otherwise the task stops."""
        ticket.status = Status.RAN
        outcome = self._settlement.lose(
            ticket.call,
            ticket.fingerprint,
            detail,
            lookup,
            settle=inspect is not None,
            reason=reason,
        )
        if isinstance(outcome, Refusal):
            return self._stop(outcome.state, outcome.reason, ticket, outcome.detail)
        ticket.result = outcome
        return self._verified(ticket, outcome, present(inspect), committed=True)

    def _refuse(self, ticket: Ticket, refusal: Refusal) -> Decision:
        report = self._stop(refusal.state, refusal.reason, ticket, refusal.detail)
        return Decision(Action.STOP, ticket, report=report)

    def _expect_proposal(self) -> None:
        if not self._planning:
            raise ValueError("each proposal needs its own before_model() first")
        self._planning = False
        self._batch = []

    def _stop(
        self,
        state: State,
        reason: Reason,
        ticket: Ticket | None = None,
        detail: str = "",
        *,
        call: Call | None = None,
        fp: str | None = None,
    ) -> Report:
        """Record the terminal state once; later stops return the first report."""
        if self._record.report is not None:
            return self._record.report
        for other in self._batch:
            if other.status is Status.ADMITTED:
                other.status = Status.NOT_RUN
        operations = self._settlement.operations()
        usage = self._budget.usage()
        return self._record.stop(
            state,
            reason,
            usage=usage,
            remaining=self.limits.remaining(usage),
            revision=self._detector.revision,
            operations=operations,
            call=about(ticket, call, fp),
            batch=tuple(t.describe() for t in self._batch),
            detail=detail,
        )
