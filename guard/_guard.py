"""The guard: decides before each model call and each tool execution whether it may happen.

:class:`Guard` is what a host holds: it composes the parts and hands each public step to
the one that does it. The parts that decide rules are the budget (``_budget``), the loop
detector (``_detector``), the settlement of writes against the ledger (``_settlement``),
the approval gate (``_approval``), the evidence read from results (``_observed``) and the
plain input checks (``_checks``); what was done is recorded in ``_report``. The steps ask
them in order: a model call and the admission of its batch of calls (``_model_call``, over
``_admission``), each call's entry and its outcome (``_execution``, over ``_outcome``), and
the end (``_ending``: every refusal becomes the one stop report, and the summary turn).
``_checkpoint`` takes and gives back the parts' checkpoints, ``_ticket`` holds what the
steps hand the host, and ``_driver`` is ``run``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ._approval import NeedsApproval
from ._checkpoint import Checkpoints, history_of, opened
from ._checks import Cancel, describe, transient_error
from ._driver import Execute, Inspect, Plan, Reserve, Summarise, drive
from ._ending import Ending
from ._execution import ExecutionStep
from ._ledger import InMemoryLedger, Ledger
from ._model_call import ModelCallStep
from ._parts import Parts
from ._report import Report
from ._settlement import Lookup
from ._ticket import Decision, Ticket
from ._values import Approval, Effect, Finish, Limits, Nudge, Reason, State, Usage

__all__ = ["Guard"]


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
    (name → ``"read"``/``"write"``) makes unknown tools and wrong effects a ``bad_call``;
    ``transient`` tells an error worth one more try (a write only when a trusted lookup
    proved it did not happen; default: a lost connection or a timeout).
    ``needs_approval(call)`` names the calls a person must approve before they run, and
    ``approvals`` are the answers people gave (:class:`~guard.Approval`) for this phase.
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
        transient: Callable[[BaseException], bool] = transient_error,
        needs_approval: NeedsApproval | None = None,
        approvals: Iterable[Approval] = (),
    ) -> None:
        self.limits = limits if limits is not None else Limits()
        self.ledger: Ledger = ledger if ledger is not None else InMemoryLedger()
        self._wait = wait
        used = used if used is not None else Usage()
        self._parts = parts = Parts(
            self.limits,
            self.ledger,
            now,
            used,
            revision,
            nudge=nudge,
            cancel=cancel,
            needs_approval=needs_approval,
            approvals=approvals,
        )
        self._cancel, self._record, self._budget = parts.cancel, parts.record, parts.budget
        self._ending = ending = Ending(parts)
        self._model_calls = calls = ModelCallStep(parts, ending, tools)
        self._execution = ExecutionStep(parts, ending, transient)
        self._checkpoints = Checkpoints(parts, calls, ending)

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
        """The verified revision: the business progress ``inspect`` reported so far (with
        no inspector, the count of new results and committed writes)."""
        return self._parts.detector.revision

    @property
    def tickets(self) -> tuple[Ticket, ...]:
        """The admitted calls of the current model call, in order (a host that keeps the
        guard between requests finds a ticket here again after :meth:`restore`)."""
        return tuple(self._parts.batch.tickets)

    def remaining(self) -> dict[str, int | None]:
        """Budget left per dimension (``None``: that dimension has no limit)."""
        return self._budget.remaining()

    def spend_tokens(self, tokens: int) -> None:
        """Charge model usage reported by the planner to the token budget."""
        self._budget.spend_tokens(tokens)

    def cancel(self) -> None:
        """Ask the guard to stop; honoured at the next model call or tool execution."""
        self._cancel.set()

    def checkpoint(self, *, history: bool = True, steps: bool = False) -> dict[str, Any]:
        """JSON-ready state to rebuild this guard in another process with :meth:`restore`:
        each part's own checkpoint under its name (the budget's is ``usage``, what was spent:
        a host whose own counters are never behind may put those in its place).

        Counters and the detector's memory both travel, so a crash, a redelivery or a new
        worker neither resets a budget nor forgets a repeat. ``history=False`` leaves out
        what grows with the phase (see :meth:`history`): a host that keeps it elsewhere
        (a trace) hands it back to :meth:`restore`.
        """
        return self._checkpoints.take(history=history, steps=steps)

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
        history: Mapping[str, Any] | Callable[[], Mapping[str, Any]] | None = None,
        **options: Any,
    ) -> Guard:
        """A guard that goes on from ``checkpoint`` (see :meth:`checkpoint`; version 1
        checkpoints of earlier releases are read too).

        ``history`` gives back what ``checkpoint(history=False)`` left out, in the shape of
        :meth:`history`; or a callable returning it, called only when the guard needs it
        (to make its stop report, or a checkpoint with ``history=True``) and no more once
        it has answered: a host that restores for every step reads what grows with the
        phase only when it stops. What the callable returns must be the phase's history up
        to the checkpoint; what the guard does after the restore is added to it. A callable
        that raises leaves the stop report without the earlier history (the ledger and the
        host's records keep it), and raises out of ``checkpoint(history=True)``.
        ``options`` are the constructor's keyword arguments except ``used`` and
        ``revision``, which come from the checkpoint. Raises ``ValueError`` if the
        checkpoint is malformed or of an unknown version.
        """
        try:
            parts, used, revision = opened(checkpoint, history)
            guard = cls(limits, used=used, revision=revision, **options)
            guard._checkpoints.give_back(parts, checkpoint, history)
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"malformed checkpoint: {exc!r}") from exc
        return guard

    # -- driver --------------------------------------------------------------------------

    def run(
        self,
        plan: Plan,
        execute: Execute,
        inspect: Inspect | None,
        *,
        lookup: Lookup | None = None,
        reserve: Reserve | None = None,
        summarise: Summarise | None = None,
    ) -> Report:
        """Drive ``plan`` / ``execute`` / ``inspect`` until the guard stops; never raises.

        ``inspect=None`` says the host has no trusted inspector: progress is then read from
        the tools' own results (the observed-evidence policy, see :meth:`after_tool`).

        ``lookup(operation_key)`` is optional: it may settle a write whose outcome was lost
        (return a :class:`Settlement`) before the task stops as ``NEEDS_HUMAN``.
        ``reserve(observation)`` gives each model call's maximum cost for the spend budget
        (kept as spent: ``run`` does not learn the real cost; a host that does settles it
        with the steps). ``summarise(prompt)`` is the opt-in summary turn: after a stop for
        a budget, the deadline or no progress, one model call with no tools, whose reply
        goes into the report. An approved call given in ``approvals`` runs first, and a
        rejected one is the model's first observation.
        """
        return drive(self, plan, execute, inspect, lookup, reserve=reserve, summarise=summarise)

    # -- steps ---------------------------------------------------------------------------

    def before_model(self, *, reserve: int = 0) -> Report | None:
        """Check, then count, one model call. Returns the report if it must not happen.

        ``reserve`` is the call's maximum cost in the spend budget's unit (see
        :class:`~guard.Price`): it must fit in what is left, and it counts as spent until
        :meth:`settle_spend` gives the real cost.
        """
        return self._model_calls.start(reserve)

    def settle_spend(self, cost: int) -> None:
        """The last model call's real cost replaces what :meth:`before_model` reserved."""
        self._budget.settle_spend(cost)

    def before_approved(self) -> list[Ticket] | Nudge | Report | None:
        """In a phase opened by an approval that carries its call: admit that call, once,
        without a model call (it is not asked for again). ``None`` when there is none; else
        what :meth:`before_tools` answers for it."""
        return self._model_calls.approved()

    def rejection(self) -> Nudge | None:
        """In a phase opened after a person rejected a call: what to tell the model, once
        (its first observation), else ``None``."""
        return self._parts.approvals.rejection()

    def before_tools(self, proposal: Any, *, enter: bool = False) -> list[Ticket] | Nudge | Report:
        """Admit the calls of one model call, each checked before any of them runs.

        Returns the admitted tickets in order, a :class:`Nudge` to show the model instead
        (nothing runs), or the stop report. Counts one request per call examined.

        ``enter=True`` is the host's promise that it calls :meth:`before_tool` for a
        one-call proposal at once: a guard asked over the network (``guard.remote``) then
        decides the entry with the admission, in one request. Here, where asking costs
        nothing, :meth:`before_tool` decides it as always, at the same moment.
        """
        return self._model_calls.admit(proposal)

    def before_tool(self, ticket: Ticket, *, lookup: Lookup | None = None) -> Decision:
        """Decide, at the executor's entry, whether this admitted call may run now.

        For a write this claims the operation key in the ledger: ``EXECUTE`` means this
        caller owns the only execution; ``REUSE`` hands back the committed result (or a
        ``PENDING`` one while another execution holds the key). A write claimed back from
        ``NOT_COMMITTED`` runs only if ``lookup`` (the tool's trusted lookup, when it has
        one) does not find the action already done.
        """
        return self._execution.enter(ticket, lookup)

    def after_tool(
        self,
        ticket: Ticket,
        result: Any = None,
        *,
        error: BaseException | None = None,
        inspect: Inspect | None,
        lookup: Lookup | None = None,
    ) -> Report | None:
        """Record what one executed (or reused) call returned; the report if it stops here.

        Pass the tool's return value as ``result``, or the exception it raised as ``error``.

        ``inspect`` verifies the step from trusted records; ``inspect=None`` (a host with no
        inspector, such as a framework agent) reads progress from the result instead, the
        observed-evidence policy: a ``SUCCESS`` read whose result was never seen before in
        the task raises the revision by one and spends one of ``Limits.explore`` (a result
        seen before, or one past that budget, does not count); a write that returns
        ``SUCCESS`` is ``COMMITTED`` on the tool's own word (unless ``lookup`` finds
        nothing: then ``UNKNOWN``) and raises the revision; any other write result settles
        as ever (a lookup, else ``UNKNOWN``). Use one or the other for a whole task: the
        revisions of the two do not mix. Beside an inspector, a ``SUCCESS`` read whose
        result was never seen before still counts as exploration (one of
        ``Limits.explore``; ``explore=0``: none): not progress, but the count of requests
        without progress starts again from it.

        A call that was executing when another call of its batch stopped the task (a host
        that runs a batch at once) is still settled: its write must not stay ``IN_FLIGHT``.
        """
        return self._execution.record(ticket, result, error, inspect, lookup)

    def planner_failed(self, error: BaseException) -> Report:
        """The model call raised instead of proposing: stop ``FAILED/planner_error``."""
        return self.halt(State.FAILED, Reason.PLANNER_ERROR, describe(error))

    def summary_turn(self, *, reserve: int = 0) -> str | None:
        """After a stop for a budget, the deadline or no progress (:data:`SUMMARY_REASONS`):
        the prompt of one last model call with no tools allowed (why the task stopped),
        handed out once per stop; else ``None`` (still running, another reason, already
        taken, or its maximum cost ``reserve`` does not fit in the spend budget). The call
        may go beyond the budget that ran out, never beyond the spend budget; ``reserve``
        counts as spent until :meth:`record_summary` charges the real cost."""
        return self._ending.summary_turn(reserve)

    def record_summary(self, reply: Any, *, tokens: int = 0, cost: int | None = None) -> Report:
        """Keep the summary turn's ``reply`` (text, or a :class:`~guard.Finish` with its
        answer) in the stop report and charge its ``tokens`` and ``cost``, beyond the budget
        that ran out (``cost`` replaces the turn's reservation; without it the reservation
        stays spent). A tool call in the reply is not run: the report says so instead."""
        return self._ending.record_summary(reply, tokens, cost)

    def halt(self, state: State, reason: Reason, detail: str = "") -> Report:
        """Stop now for a reason found outside the guard: the host's word, for instance
        a ledger that records lazily finding that it could not. Sticky like every stop."""
        return self._model_calls.halt(state, reason, detail)

    def before_wait(self) -> float | Report:
        """Milliseconds to wait before the next model call (0: none), or the stop report."""
        return self._model_calls.pause()

    def finish(self, finish: Finish, inspect: Inspect | None) -> Report:
        """The model says it is done: ``COMPLETED`` only if ``inspect`` verifies the goal.
        With no inspector (``inspect=None``) nothing can verify it: the model's word ends
        the task ``PARTIAL``/``goal_unverified``, the work done kept in the report."""
        return self._model_calls.finish(finish, inspect)
