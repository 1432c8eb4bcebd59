"""The guard: decides before each model call and each tool execution whether it may happen."""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from enum import StrEnum
from typing import Any, NamedTuple, Protocol

from ._fingerprint import fingerprint
from ._ledger import ClaimStatus, InMemoryLedger, Ledger, Operation
from ._report import Report
from ._values import (
    Call,
    Effect,
    Evidence,
    Finish,
    Kind,
    Limits,
    Nudge,
    OperationState,
    Reason,
    Result,
    Settlement,
    State,
    Usage,
)

__all__ = ["COMPLETED_KEPT", "HISTORY", "Action", "Decision", "Guard", "Ticket"]

_KINDS = frozenset(Kind)
_WAITING = (Kind.RETRYABLE, Kind.PENDING)

Proposal = Call | Finish | Sequence[Call]
Plan = Callable[[Any], Any]
Execute = Callable[[Call], Any]
Inspect = Callable[[Result | None, Call | Finish], Any]
Lookup = Callable[[str], Any]


class _IsSet(Protocol):
    def is_set(self) -> bool: ...


Cancel = Callable[[], bool] | _IsSet


class Action(StrEnum):
    """What the caller must do with one admitted call."""

    EXECUTE = "execute"
    REUSE = "reuse"
    STOP = "stop"


class _Status(StrEnum):
    ADMITTED = "admitted"
    EXECUTING = "executing"
    REUSING = "reusing"
    RAN = "ran"
    REUSED = "reused"
    NOT_RUN = "not_run"


class Ticket:
    """One call of the current model call, admitted by :meth:`Guard.before_tools`."""

    __slots__ = ("call", "fingerprint", "index", "poll", "result", "status")

    def __init__(self, index: int, call: Call, fingerprint: str, poll: bool) -> None:
        self.index = index
        self.call = call
        self.fingerprint = fingerprint
        self.poll = poll
        self.result: Result | None = None
        self.status = _Status.ADMITTED

    def describe(self) -> dict[str, Any]:
        """A JSON-ready line for the stop report's batch."""
        return {
            "index": self.index,
            "tool": self.call.tool,
            "fingerprint": self.fingerprint,
            "operation_key": self.call.operation_key,
            "status": str(self.status),
            "kind": None if self.result is None else str(self.result.kind),
        }


class Decision(NamedTuple):
    """The answer of :meth:`Guard.before_tool`: execute, reuse ``result``, or stop."""

    action: Action
    ticket: Ticket
    result: Result | None = None
    report: Report | None = None


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
        self._now = now
        self._wait = wait
        self._cancel = cancel
        self._nudge = nudge
        self._tools = None if tools is None else dict(tools)
        used = used if used is not None else Usage()
        self.model_calls = used.model_calls
        self.requests = used.requests
        self.executions = used.executions
        self.tokens = used.tokens
        self.polls = used.polls
        self.revision = revision
        self._start = now() - used.elapsed_ms
        self._deadline = self._start + self.limits.deadline_ms
        self._cancelled = False
        self._nudged = False
        self._stagnant = 0
        # The last few fingerprints (a list, kept short by hand: cycle checks slice it).
        self._recent: list[str] = []
        self._recent_kept = 2 * self.limits.max_period
        self._repeats: dict[str, int] = {}
        self._pending: dict[str, int] = {}  # fingerprint of a PENDING job -> polls so far
        self._touched: dict[str, None] = {}  # operation keys, in first-touched order
        # The latest completed requests (the stop report's "completed"), and how many in all:
        # a long run's report and checkpoint stay small.
        self._completed: deque[tuple[str, str, str | None, bool, int]] = deque(
            maxlen=COMPLETED_KEPT
        )
        self._completed_total = 0
        self._batch: list[Ticket] = []
        self._wait_ms: float = 0
        self._planning = False  # a model call was admitted and its proposal is awaited
        self._report: Report | None = None

    # -- state ---------------------------------------------------------------------------

    @property
    def report(self) -> Report | None:
        """The stop report once the guard has stopped, else ``None``."""
        return self._report

    @property
    def usage(self) -> Usage:
        """What this task has spent so far, including earlier phases."""
        return Usage(
            model_calls=self.model_calls,
            requests=self.requests,
            executions=self.executions,
            tokens=self.tokens,
            polls=self.polls,
            elapsed_ms=self._elapsed(),
        )

    def checkpoint(self, *, history: bool = True) -> dict[str, Any]:
        """JSON-ready state to rebuild this guard in another process with :meth:`restore`.

        Counters and the detectors' memory both travel, so a crash, a redelivery or a new
        worker neither resets a budget nor forgets a repeat. ``history=False`` leaves out
        what grows with the phase (see :meth:`history`): a host that keeps it elsewhere
        (a trace) hands it back to :meth:`restore`.
        """
        if not history:
            saved = self.checkpoint()
            for name in HISTORY:
                del saved[name]
            return saved
        return {
            "version": _CHECKPOINT_VERSION,
            "usage": self.usage.to_dict(),
            "revision": self.revision,
            "stagnant": self._stagnant,
            "recent": list(self._recent),
            "repeats": dict(self._repeats),
            "pending": dict(self._pending),
            "nudged": self._nudged,
            "touched": list(self._touched),
            "completed": [list(step) for step in self._completed],
            "completed_total": self._completed_total,
        }

    @classmethod
    def restore(
        cls,
        checkpoint: Mapping[str, Any],
        limits: Limits | None = None,
        *,
        history: Mapping[str, Any] | None = None,
        **options: Any,
    ) -> Guard:
        """A guard that goes on from ``checkpoint`` (see :meth:`checkpoint`).

        ``history`` gives back what ``checkpoint(history=False)`` left out, in the shape of
        :meth:`history`. ``options`` are the constructor's keyword arguments except
        ``used`` and ``revision``, which come from the checkpoint. Raises ``ValueError`` if
        the checkpoint is malformed.
        """
        if history is not None:
            checkpoint = {**checkpoint, **{name: history[name] for name in HISTORY}}
        try:
            if checkpoint["version"] != _CHECKPOINT_VERSION:
                raise ValueError(f"checkpoint version {checkpoint['version']!r} is not supported")
            guard = cls(
                limits,
                used=Usage(**{k: _count(v) for k, v in checkpoint["usage"].items()}),
                revision=_count(checkpoint["revision"]),
                **options,
            )
            guard._stagnant = _count(checkpoint["stagnant"])
            guard._recent.extend(_text(fp) for fp in checkpoint["recent"])
            guard._repeats = {_text(k): _count(v) for k, v in checkpoint["repeats"].items()}
            guard._pending = {_text(k): _count(v) for k, v in checkpoint["pending"].items()}
            guard._nudged = bool(checkpoint["nudged"])
            guard._touched = {_text(key): None for key in checkpoint["touched"]}
            guard._completed_total = _count(checkpoint.get("completed_total", 0))
            guard._completed.extend(
                (_text(t), _text(fp), key if key is None else _text(key), bool(r), _count(rev))
                for t, fp, key, r, rev in checkpoint["completed"]
            )
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"malformed checkpoint: {exc!r}") from exc
        return guard

    def history(self) -> dict[str, Any]:
        """What grows with the phase: the operation keys it touched (``touched``, in
        first-touched order) and its latest completed requests (``completed``, each
        ``[tool, fingerprint, operation_key, reused, revision]``, at most
        ``COMPLETED_KEPT``)."""
        saved = self.checkpoint()
        return {name: saved[name] for name in HISTORY}

    def remaining(self) -> dict[str, int | None]:
        """Budget left per dimension (``None``: that dimension has no limit)."""
        return self.limits.remaining(self.usage)

    def spend_tokens(self, tokens: int) -> None:
        """Charge model usage reported by the planner to the token budget."""
        if not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < 0:
            raise ValueError(f"tokens must be a non-negative int, got {tokens!r}")
        self.tokens += tokens

    def cancel(self) -> None:
        """Ask the guard to stop; honoured at the next model call or tool execution."""
        self._cancelled = True

    # -- driver --------------------------------------------------------------------------

    def run(
        self,
        plan: Plan,
        execute: Execute,
        inspect: Inspect,
        *,
        lookup: Lookup | None = None,
    ) -> Report:
        """Drive ``plan`` / ``execute`` / ``inspect`` until the guard stops; never raises.

        ``lookup(operation_key)`` is optional: it may settle a write whose outcome was lost
        (return a :class:`Settlement`) before the task stops as ``NEEDS_HUMAN``.
        """
        observation: Any = None
        while True:
            stop = self.before_model()
            if stop is not None:
                return stop
            try:
                proposal = plan(observation)
            except Exception as exc:
                return self.planner_failed(exc)
            if isinstance(proposal, Finish):
                return self.finish(proposal, inspect)
            admitted = self.before_tools(proposal)
            if isinstance(admitted, Report):
                return admitted
            if isinstance(admitted, Nudge):
                observation = admitted
                continue
            results: list[Result] = []
            for ticket in admitted:
                decision = self.before_tool(ticket)
                if decision.report is not None:
                    return decision.report
                outcome: Any = decision.result
                error: Exception | None = None
                if decision.action is Action.EXECUTE:
                    try:
                        outcome = execute(ticket.call)
                    except Exception as exc:
                        error = exc
                    except BaseException:
                        # Interrupted mid-execution: the write may or may not have happened.
                        self._settle_lost(ticket, "interrupted", None)
                        raise
                stop = self.after_tool(ticket, outcome, error=error, inspect=inspect, lookup=lookup)
                if stop is not None:
                    return stop
                results.append(_present(ticket.result))
            pause = self.before_wait()
            if isinstance(pause, Report):
                return pause
            if pause:
                try:
                    self._wait(pause)
                except Exception as exc:
                    if self._cancel_requested():
                        return self._stop(State.CANCELLED, Reason.OPERATOR_STOP)
                    return self._stop(State.FAILED, Reason.EXECUTOR_ERROR, detail=_describe(exc))
            is_batch = not isinstance(proposal, Call)
            observation = results if is_batch else results[0]

    # -- steps ---------------------------------------------------------------------------

    def before_model(self) -> Report | None:
        """Check, then count, one model call. Returns the report if it must not happen."""
        if self._report is not None:
            return self._report
        for ticket in self._batch:
            if ticket.status is _Status.EXECUTING:
                # The caller never reported this execution's outcome: treat it as lost.
                stop = self._settle_lost(ticket, "no result was reported", None)
                if stop is not None:
                    return stop
        self._batch = []
        self._wait_ms = 0
        if self._cancel_requested():
            return self._stop(State.CANCELLED, Reason.OPERATOR_STOP)
        if self._now() >= self._deadline:
            return self._stop(State.PARTIAL, Reason.DEADLINE)
        if self.limits.tokens is not None and self.tokens >= self.limits.tokens:
            return self._stop(State.PARTIAL, Reason.TOKEN_BUDGET)
        if self.model_calls >= self.limits.model_calls:
            return self._stop(State.PARTIAL, Reason.MODEL_BUDGET)
        self.model_calls += 1
        self._planning = True
        return None

    def before_tools(self, proposal: Any) -> list[Ticket] | Nudge | Report:
        """Admit the calls of one model call, each checked before any of them runs.

        Returns the admitted tickets in order, a :class:`Nudge` to show the model instead
        (nothing runs), or the stop report. Counts one request per call examined.
        """
        if self._report is not None:
            return self._report
        self._expect_proposal()
        calls = _as_calls(proposal, self._tools)
        if isinstance(calls, str):
            return self._stop(State.FAILED, Reason.BAD_CALL, detail=calls)
        limits = self.limits
        tickets: list[Ticket] = []
        # One call (the usual case) reads the history as it is; a batch adds to a copy.
        recent = self._recent if len(calls) == 1 else list(self._recent)
        repeats: dict[str, int] = {}
        polls: dict[str, int] = {}
        keys: dict[str, str] = {}
        executions = self.executions
        for index, call in enumerate(calls):
            if self.requests >= limits.requests:
                return self._stop(State.PARTIAL, Reason.REQUEST_BUDGET, call=call)
            self.requests += 1
            try:
                fp = fingerprint(call.tool, _plain(call.args))
            except Exception as exc:  # BadArguments, or a Mapping that cannot be read
                return self._stop(State.FAILED, Reason.BAD_ARGS, call=call, detail=_describe(exc))
            reuse = False
            if call.effect == "write":
                key = call.operation_key
                if not key:
                    return self._stop(State.NEEDS_HUMAN, Reason.MISSING_OPERATION_KEY, call=call)
                if key in keys:
                    # A second request for the same action in one model call: it will meet
                    # the first one's ledger entry and reuse its result.
                    if keys[key] != fp:
                        return self._conflict(call, fp)
                    reuse = True
                else:
                    keys[key] = fp
                    # With one call nothing can run between admission and the claim, which
                    # gives the same answers; a batch is checked whole before anything runs.
                    if len(calls) > 1 or executions >= limits.executions:
                        blocked = self._peek(call, fp)
                        if isinstance(blocked, Report):
                            return blocked
                        reuse = blocked
            poll = fp in self._pending
            if poll:
                # Polling a PENDING job is bounded by its own budget, exempt tool or not.
                polled = self._pending[fp] + polls.get(fp, 0)
                if polled >= limits.polls:
                    return self._stop(State.PARTIAL, Reason.POLL_BUDGET, call=call, fp=fp)
                polls[fp] = polls.get(fp, 0) + 1
            elif call.tool not in limits.exempt:
                seen = self._repeats.get(fp, 0) + repeats.get(fp, 0)
                if seen >= limits.same:
                    return self._detected(Reason.SAME_CALL, call, fp, seen, [])
                cycle = _cycle(recent, fp, limits.max_period)
                if cycle:
                    return self._detected(Reason.SHORT_CYCLE, call, fp, 2, cycle)
                repeats[fp] = repeats.get(fp, 0) + 1
                if recent is not self._recent:
                    recent.append(fp)
            if not reuse:
                if executions >= limits.executions:
                    return self._stop(State.PARTIAL, Reason.EXECUTION_BUDGET, call=call, fp=fp)
                executions += 1
            tickets.append(Ticket(index, call, fp, poll))
        if polls:
            for fp, count in polls.items():
                self._pending[fp] += count
                self.polls += count
        self._batch = tickets
        return tickets

    def before_tool(self, ticket: Ticket) -> Decision:
        """Decide, at the executor's entry, whether this admitted call may run now.

        For a write this claims the operation key in the ledger: ``EXECUTE`` means this
        caller owns the only execution; ``REUSE`` hands back the committed result.
        """
        if self._report is not None:
            return Decision(Action.STOP, ticket, report=self._report)
        if ticket not in self._batch or ticket.status is not _Status.ADMITTED:
            raise ValueError("before_tool() needs a fresh ticket from the current before_tools()")
        call, fp = ticket.call, ticket.fingerprint
        if self._cancel_requested():
            return self._refuse(ticket, State.CANCELLED, Reason.OPERATOR_STOP)
        if self._now() >= self._deadline:
            return self._refuse(ticket, State.PARTIAL, Reason.DEADLINE)
        if call.effect == "write":
            key = _present(call.operation_key)
            try:
                if self.executions >= self.limits.executions:
                    entry = self.ledger.get(key)
                    if entry is None or not _reusable(entry, fp):
                        return self._refuse(ticket, State.PARTIAL, Reason.EXECUTION_BUDGET)
                    return self._reuse(ticket, entry)
                claim = self.ledger.claim(key, fp)
            except Exception as exc:
                if self._cancel_requested():
                    # A ledger may refuse the claim because the stop was recorded in the
                    # same transaction: that is a cancellation, and nothing was claimed.
                    return self._refuse(ticket, State.CANCELLED, Reason.OPERATOR_STOP)
                return self._refuse(
                    ticket, State.FAILED, Reason.EXECUTOR_ERROR, detail=f"ledger: {exc!r}"
                )
            self._touched[key] = None
            if claim.status is ClaimStatus.COMMITTED:
                return self._reuse(ticket, claim.operation)
            if claim.status is not ClaimStatus.CLAIMED:
                state, reason = _CLAIM_STOPS[claim.status]
                return self._refuse(ticket, state, reason)
        elif self.executions >= self.limits.executions:
            return self._refuse(ticket, State.PARTIAL, Reason.EXECUTION_BUDGET)
        self.executions += 1
        ticket.status = _Status.EXECUTING
        return Decision(Action.EXECUTE, ticket)

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
        if self._report is not None:
            return self._report
        if ticket.status is _Status.REUSING:
            ticket.status = _Status.REUSED
            return self._verified(ticket, _present(ticket.result), inspect, committed=None)
        if ticket.status is not _Status.EXECUTING:
            raise ValueError("after_tool() needs a ticket that before_tool() let execute")
        ticket.status = _Status.RAN
        call = ticket.call
        write = call.effect == "write"
        if error is not None:
            if write:
                return self._settle_lost(ticket, _describe(error), lookup, inspect)
            if self._cancel_requested():
                return self._stop(State.CANCELLED, Reason.OPERATOR_STOP, ticket=ticket)
            return self._stop(State.FAILED, Reason.EXECUTOR_ERROR, ticket, _describe(error))
        problem = _result_problem(result)
        if problem is not None or not isinstance(result, Result):
            problem = problem or "not a Result"
            if write:
                return self._settle_lost(ticket, problem, lookup, inspect, Reason.BAD_RESULT)
            return self._stop(State.FAILED, Reason.BAD_RESULT, ticket, problem)
        ticket.result = result
        self.executions += result.attempts - 1  # the adapter's own retries are executions too
        return self._verified(ticket, result, inspect, committed=None, lookup=lookup)

    def planner_failed(self, error: BaseException) -> Report:
        """The model call raised instead of proposing: stop ``FAILED/planner_error``."""
        if self._report is not None:
            return self._report
        self._planning = False
        return self._stop(State.FAILED, Reason.PLANNER_ERROR, detail=_describe(error))

    def halt(self, state: State, reason: Reason, detail: str = "") -> Report:
        """Stop now for a reason found outside the guard: the host's word, for instance
        a ledger that records lazily finding that it could not. Sticky like every stop."""
        state, reason = State(state), Reason(reason)  # refused before anything changes
        if self._report is not None:
            return self._report
        self._planning = False
        return self._stop(state, reason, detail=detail)

    def before_wait(self) -> float | Report:
        """Milliseconds to wait before the next model call (0: none), or the stop report."""
        if self._report is not None:
            return self._report
        pause = self._wait_ms
        if pause <= 0:
            return 0
        if self._cancel_requested():
            return self._stop(State.CANCELLED, Reason.OPERATOR_STOP)
        if pause >= self._deadline - self._now():  # compared, not added: pause may be huge
            return self._stop(
                State.PARTIAL, Reason.DEADLINE, detail=f"waiting {pause} ms would cross it"
            )
        return pause

    def finish(self, finish: Finish, inspect: Inspect) -> Report:
        """The model says it is done: ``COMPLETED`` only if ``inspect`` verifies the goal."""
        if self._report is not None:
            return self._report
        self._expect_proposal()
        try:
            evidence = inspect(None, finish)
        except Exception as exc:
            return self._stop(State.FAILED, Reason.INVALID_EVIDENCE, detail=_describe(exc))
        problem = self._evidence_problem(evidence)
        if problem is not None:
            return self._stop(State.FAILED, Reason.INVALID_EVIDENCE, detail=problem)
        self.revision = evidence.revision
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
        uncertain = call.effect == "write" and ticket.status is _Status.RAN and committed is None
        evidence: Any = None
        try:
            evidence = inspect(result, call)
        except Exception as exc:
            problem: str | None = _describe(exc)
        else:
            problem = self._evidence_problem(evidence)
        if problem is not None or not isinstance(evidence, Evidence):
            problem = problem or "no evidence"
            if uncertain:
                return self._settle_lost(ticket, problem, None, None, Reason.INVALID_EVIDENCE)
            return self._stop(State.FAILED, Reason.INVALID_EVIDENCE, ticket, problem)
        if uncertain:
            stop = self._settle(ticket, result, evidence.committed, lookup)
            if stop is not None:
                return stop
        if result.kind == Kind.FATAL:
            return self._stop(State.FAILED, Reason.FATAL, ticket)
        if result.kind == Kind.PRECONDITION:
            return self._stop(State.NEEDS_HUMAN, Reason.PRECONDITION, ticket)
        if result.kind == Kind.PENDING:
            self._pending.setdefault(fp, 0)
        else:
            self._pending.pop(fp, None)
        if evidence.revision > self.revision:
            self.revision = evidence.revision
            self._stagnant = 0
            self._repeats.clear()
            self._recent.clear()
        elif not ticket.poll:
            self._stagnant += 1
        if not ticket.poll and call.tool not in self.limits.exempt:
            self._repeats[fp] = self._repeats.get(fp, 0) + 1
            self._recent.append(fp)
            if len(self._recent) > self._recent_kept:
                del self._recent[0]
        if result.kind == Kind.SUCCESS:
            reused = ticket.status is _Status.REUSED
            self._completed.append((call.tool, fp, call.operation_key, reused, self.revision))
            self._completed_total += 1
        if evidence.done:
            return self._stop(State.COMPLETED, Reason.GOAL_MET, ticket)
        if self._stagnant >= self.limits.stagnant:
            return self._stop(State.PARTIAL, Reason.NO_PROGRESS, ticket)
        if result.kind in _WAITING:
            wait_ms: Any = result.wait_ms
            if not _positive_ms(wait_ms):
                return self._stop(
                    State.FAILED, Reason.INVALID_WAIT, ticket, f"wait_ms={wait_ms!r}"
                )
            self._wait_ms = max(self._wait_ms, wait_ms)
        return None

    def _settle(
        self, ticket: Ticket, result: Result, committed: bool | None, lookup: Lookup | None
    ) -> Report | None:
        """Write the commit state of an executed write to the ledger."""
        key = _present(ticket.call.operation_key)
        if committed is None and lookup is not None:
            settlement = _look_up(lookup, key)
            if settlement is not None and settlement.committed is not None:
                committed = settlement.committed
        try:
            if committed is True:
                self.ledger.record(key, ticket.fingerprint, result)
                return None
            if committed is False and result.kind != Kind.SUCCESS:
                self.ledger.resolve(key, committed=False, evidence="verified by inspect")
                return None
        except Exception as exc:
            return self._stop(State.NEEDS_HUMAN, Reason.UNKNOWN_COMMIT, ticket, f"ledger: {exc!r}")
        if committed is False:
            # The tool says it succeeded, the records say nothing happened: nobody knows.
            return self._settle_lost(
                ticket, "SUCCESS but not committed", None, None, Reason.INVALID_EVIDENCE
            )
        return self._settle_lost(ticket, "commit not verified", None, None, Reason.UNKNOWN_COMMIT)

    def _settle_lost(
        self,
        ticket: Ticket,
        detail: str,
        lookup: Lookup | None,
        inspect: Inspect | None = None,
        reason: Reason = Reason.EXECUTOR_ERROR,
    ) -> Report | None:
        """A write's outcome is uncertain: mark it ``UNKNOWN`` unless a lookup settles it."""
        ticket.status = _Status.RAN
        key = ticket.call.operation_key
        if ticket.call.effect != "write" or key is None:
            return self._stop(State.FAILED, reason, ticket, detail)
        settlement = _look_up(lookup, key) if lookup is not None else None
        if self._cancel_requested():
            reason = Reason.OPERATOR_STOP  # why it stopped; the write's fate is in the ledger
        settled = False
        try:
            if settlement is not None and settlement.committed is True and inspect is not None:
                result = settlement.result or Result(Kind.SUCCESS)
                evidence = settlement.evidence
                self.ledger.resolve(key, committed=True, result=result, evidence=evidence)
                ticket.result = result
                settled = True
            elif settlement is not None and settlement.committed is False:
                self.ledger.resolve(key, committed=False, evidence=settlement.evidence)
                state = State.CANCELLED if reason is Reason.OPERATOR_STOP else State.FAILED
                return self._stop(state, reason, ticket, detail)
            else:
                self.ledger.mark_unknown(key, ticket.fingerprint)
        except Exception as exc:
            detail = f"{detail}; ledger: {exc!r}"
        if settled and inspect is not None:
            return self._verified(ticket, _present(ticket.result), inspect, committed=True)
        return self._stop(State.NEEDS_HUMAN, reason, ticket, detail)

    def _peek(self, call: Call, fp: str) -> bool | Report:
        """Look at the ledger before admitting a write: True if it will be reused."""
        key = _present(call.operation_key)
        try:
            entry = self.ledger.get(key)
        except Exception as exc:
            return self._stop(State.FAILED, Reason.EXECUTOR_ERROR, call=call, detail=repr(exc))
        if entry is None:
            return False
        self._touched[key] = None
        if entry.fingerprint != fp:
            return self._conflict(call, fp)
        if entry.state is OperationState.IN_FLIGHT:
            return self._stop(State.NEEDS_HUMAN, Reason.OPERATION_IN_FLIGHT, call=call, fp=fp)
        if entry.state is OperationState.UNKNOWN:
            return self._stop(State.NEEDS_HUMAN, Reason.UNKNOWN_COMMIT, call=call, fp=fp)
        return entry.state is OperationState.COMMITTED

    def _conflict(self, call: Call, fp: str) -> Report:
        return self._stop(State.NEEDS_HUMAN, Reason.OPERATION_CONFLICT, call=call, fp=fp)

    def _detected(
        self, reason: Reason, call: Call, fp: str, seen: int, cycle: list[str]
    ) -> Nudge | Report:
        """A repeat or cycle: nudge the model once if allowed, otherwise stop."""
        if not self._nudge or self._nudged:
            return self._stop(State.PARTIAL, reason, call=call, fp=fp)
        self._nudged = True
        return Nudge(_nudge_text(reason, call, seen, len(cycle)), call.tool, fp, reason)

    def _reuse(self, ticket: Ticket, entry: Operation) -> Decision:
        ticket.status = _Status.REUSING
        ticket.result = entry.result or Result(Kind.SUCCESS)
        return Decision(Action.REUSE, ticket, result=ticket.result)

    def _refuse(
        self, ticket: Ticket, state: State, reason: Reason, *, detail: str = ""
    ) -> Decision:
        return Decision(Action.STOP, ticket, report=self._stop(state, reason, ticket, detail))

    def _expect_proposal(self) -> None:
        if not self._planning:
            raise ValueError("each proposal needs its own before_model() first")
        self._planning = False
        self._batch = []

    def _cancel_requested(self) -> bool:
        if self._cancelled:
            return True
        signal = self._cancel
        if signal is None:
            return False
        try:
            flag = signal.is_set() if not callable(signal) else signal()
        except Exception:
            flag = True  # a cancel signal that cannot be read is not a licence to go on
        if flag:
            self._cancelled = True
        return bool(flag)

    def _evidence_problem(self, evidence: Any) -> str | None:
        # The common case in exact types, tested first: this runs after every request.
        if (
            type(evidence) is Evidence
            and type(evidence.revision) is int
            and evidence.revision >= self.revision
            and type(evidence.done) is bool
            and (evidence.committed is None or type(evidence.committed) is bool)
        ):
            return None
        if not isinstance(evidence, Evidence):
            return f"inspect returned {type(evidence).__name__}, not Evidence"
        revision = evidence.revision
        if not isinstance(revision, int) or isinstance(revision, bool):
            return f"revision {revision!r} is not an int"
        if revision < self.revision:
            return f"revision went back from {self.revision} to {revision}"
        done: Any = evidence.done
        committed: Any = evidence.committed
        if not isinstance(done, bool):
            return f"done {done!r} is not a bool"
        if committed is not None and not isinstance(committed, bool):
            return f"committed {committed!r} is not a bool or None"
        return None

    def _operations(self) -> list[Operation]:
        """The current entries of every operation this guard touched, for the report."""
        keys = list(self._touched)
        if not keys:
            return []
        get_many = getattr(self.ledger, "get_many", None)  # optional: one read for all
        try:
            if callable(get_many):
                found = get_many(keys)
                return [found[key] for key in keys if key in found]
            return [entry for key in keys if (entry := self.ledger.get(key)) is not None]
        except Exception:  # the report must still be made; the ledger keeps the truth
            return []

    def _elapsed(self) -> int:
        return max(0, int(self._now() - self._start))

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
        if self._report is not None:
            return self._report
        for other in self._batch:
            if other.status is _Status.ADMITTED:
                other.status = _Status.NOT_RUN
        about: dict[str, Any] | None = None
        if ticket is not None:
            about = ticket.describe()
        elif call is not None:
            about = {
                "tool": call.tool if isinstance(call.tool, str) else repr(call.tool),
                "fingerprint": fp,
                "operation_key": call.operation_key,
            }
        operations = self._operations()
        self._report = Report(
            state=state,
            reason=reason,
            model_calls=self.model_calls,
            requests=self.requests,
            executions=self.executions,
            revision=self.revision,
            operations=tuple(operations),
            tokens=self.tokens,
            polls=self.polls,
            elapsed_ms=self._elapsed(),
            remaining=self.remaining(),
            completed=tuple(
                dict(zip(_COMPLETED_FIELDS, step, strict=True)) for step in self._completed
            ),
            completed_total=self._completed_total,
            call=about,
            batch=tuple(t.describe() for t in self._batch),
            detail=detail,
        )
        return self._report


_CHECKPOINT_VERSION = 1
COMPLETED_KEPT = 50
HISTORY = ("touched", "completed")
"""The parts of a checkpoint that grow with the phase (see :meth:`Guard.history`)."""


def _count(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise TypeError(f"{value!r} is not a count")
    return value


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{value!r} is not a string")
    return value


_COMPLETED_FIELDS = ("tool", "fingerprint", "operation_key", "reused", "revision")

_CLAIM_STOPS = {
    ClaimStatus.CONFLICT: (State.NEEDS_HUMAN, Reason.OPERATION_CONFLICT),
    ClaimStatus.IN_FLIGHT: (State.NEEDS_HUMAN, Reason.OPERATION_IN_FLIGHT),
    ClaimStatus.UNKNOWN: (State.NEEDS_HUMAN, Reason.UNKNOWN_COMMIT),
}


def _present[T](value: T | None) -> T:
    """``value``, which the guard's own bookkeeping guarantees is set at this point."""
    if value is None:
        raise RuntimeError("guard invariant broken: a value the guard set is missing")
    return value


def _reusable(entry: Operation, fp: str) -> bool:
    return entry.state is OperationState.COMMITTED and entry.fingerprint == fp


def _as_calls(proposal: Any, tools: Mapping[str, Effect] | None) -> list[Call] | str:
    """The proposal as a list of well-formed calls, or what is wrong with it.

    With ``tools`` (name → effect), a call must name a known tool with its real effect: the
    effect of a tool is the application's fact, not the model's claim.
    """
    if (  # the common case, in exact types: one well-formed call
        type(proposal) is Call
        and tools is None
        and type(proposal.tool) is str
        and proposal.tool
        and type(proposal.args) is dict
        and proposal.effect in ("read", "write")
        and (proposal.operation_key is None or type(proposal.operation_key) is str)
    ):
        return [proposal]
    calls: list[Any]
    if isinstance(proposal, Call):
        calls = [proposal]
    elif isinstance(proposal, list | tuple):
        calls = list(proposal)
        if not calls:
            return "an empty list of calls"
    else:
        return f"the planner returned {type(proposal).__name__}, not Call, list or Finish"
    for call in calls:
        if not isinstance(call, Call):  # the list itself may hold anything
            return f"{type(call).__name__} is not a Call"
        # The fields are typed, but planners are other people's code: check them anyway.
        tool: Any = call.tool
        args: Any = call.args
        effect: Any = call.effect
        key: Any = call.operation_key
        if not isinstance(tool, str) or not tool:
            return f"tool {tool!r} is not a non-empty string"
        if not isinstance(args, Mapping):
            return f"args of {tool} is {type(args).__name__}, not an object"
        if effect not in ("read", "write"):
            return f"effect {effect!r} of {tool} is neither 'read' nor 'write'"
        if key is not None and not isinstance(key, str):
            return f"operation_key {key!r} of {tool} is not a string"
        if tools is not None:
            if tool not in tools:
                return f"there is no tool named {tool!r}"
            if tools[tool] != effect:
                return f"{tool} is a {tools[tool]} tool, not a {effect}"
    return calls


def _plain(args: Mapping[str, Any]) -> Any:
    return args if isinstance(args, dict) else dict(args)


def _cycle(recent: list[str], fp: str, max_period: int) -> list[str]:
    """The repeating block if ``recent + [fp]`` ends with the same block twice, else ``[]``.

    Only periods from 2 up are cycles (period 1 is a plain repeat), and only blocks that
    are not themselves repetitions, so that each cycle is reported at its shortest period.
    """
    for period in range(2, max_period + 1):
        span = 2 * period - 1
        if len(recent) < span:
            break
        tail = recent[-span:]
        tail.append(fp)
        block = tail[:period]
        if block == tail[period:] and _primitive(block):
            return block
    return []


def _primitive(block: list[str]) -> bool:
    size = len(block)
    return all(
        block != block[p:] + block[:p] for p in range(1, size // 2 + 1) if size % p == 0
    )


def _result_problem(result: Any) -> str | None:
    if (
        type(result) is Result
        and type(result.kind) is Kind  # exact type: hashable, and one of the set
        and type(result.attempts) is int
        and result.attempts >= 1
    ):
        return None
    if result is None:
        return "the tool returned no result"
    if not isinstance(result, Result):
        return f"the tool returned {type(result).__name__}, not Result"
    kind: Any = result.kind
    if not isinstance(kind, str) or kind not in _KINDS:
        return f"unknown result kind {_safe_repr(kind)}"
    attempts = result.attempts
    if not isinstance(attempts, int) or isinstance(attempts, bool) or attempts < 1:
        return f"attempts {attempts!r} is not a positive int"
    return None


def _positive_ms(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return value > 0  # no float conversion: an int may be larger than any float
    return isinstance(value, float) and math.isfinite(value) and value > 0


def _safe_repr(value: Any) -> str:
    try:
        return repr(value)[:200]
    except Exception:
        return f"<{type(value).__name__}>"


def _look_up(lookup: Lookup, key: str) -> Settlement | None:
    try:
        found = lookup(key)
    except Exception:
        return None
    if not isinstance(found, Settlement) or found.committed not in (True, False, None):
        return None
    if found.result is not None and _result_problem(found.result) is not None:
        return None
    return found


def _describe(exc: BaseException) -> str:
    name = type(exc).__name__
    try:
        text = str(exc)
    except Exception:  # an exception that cannot describe itself still stops the task
        text = ""
    return f"{name}: {text[:500]}" if text else name


def _nudge_text(reason: Reason, call: Call, seen: int, period: int) -> str:
    if call.effect == "write":
        # Never invite a retry of a write: its recorded outcome stands.
        return (
            f"You have already requested {call.tool} for operation {call.operation_key} "
            f"{seen} times. Its recorded outcome stands and it will not run again. Go on "
            "with the next step, or say what is blocking you."
        )
    if reason is Reason.SHORT_CYCLE:
        return (
            f"You are going round a cycle of {period} tool calls ending in {call.tool} and "
            "nothing verified has changed. Change your approach, or say what is blocking you."
        )
    return (
        f"You have called {call.tool} with exactly these arguments {seen} times and nothing "
        "verified has changed. Do not repeat it: change your approach, or say what is "
        "blocking you."
    )
