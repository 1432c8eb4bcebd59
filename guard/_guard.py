"""The guard: decides before each model call and each tool execution whether it may happen.

:class:`Guard` composes its parts and says in which order they are asked: the budget
(``_budget``), the loop detector (``_detector``), the settlement of writes against the
ledger (``_settlement``), the plain input checks (``_checks``) and the record of what was
done (``_report``). Two steps ask several of them for one host step: the admission of a
model call's calls (``_admission``) and the outcome of each call (``_outcome``). Each part
decides its own rules and records what happened to them; the guard turns their refusals
into the one stop report. ``_checkpoint`` lays out the parts' checkpoints, ``_ticket`` holds
what the steps hand the host, and ``_driver`` is ``run``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ._admission import AdmissionStep, Refused
from ._approval import ApprovalGate, NeedsApproval, pending_of
from ._budget import Budget, usage_from
from ._checkpoint import compose, history_of, load, parts_of
from ._checks import (
    Cancel,
    Cancellation,
    Refusal,
    count,
    describe,
    present,
    result_problem,
    safe_repr,
    text,
    transient_error,
)
from ._detector import Detector
from ._driver import Execute, Inspect, Plan, Reserve, Summarise, drive
from ._ledger import InMemoryLedger, Ledger
from ._observed import Observer
from ._outcome import OutcomeStep
from ._report import RESUME_CONDITIONS, SUMMARY_REASONS, Record, Report
from ._settlement import Lookup, SettlementStep
from ._ticket import Action, Decision, Status, Ticket, execute, reuse, stopped
from ._values import Approval, Call, Effect, Finish, Limits, Nudge, Reason, Result, State, Usage

__all__ = ["Guard"]

_NO_HISTORY: Mapping[str, Any] = {"touched": [], "completed": []}


_UNPLANNED = "each proposal needs its own before_model() first"
_CANCELLED = Refusal(State.CANCELLED, Reason.OPERATOR_STOP)
_PAST_DEADLINE = Refusal(State.PARTIAL, Reason.DEADLINE)
_NO_ROOM = Refusal(State.PARTIAL, Reason.EXECUTION_BUDGET)


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
        self._transient = transient
        self._cancel = Cancellation(cancel)
        self._budget = Budget(self.limits, now, used if used is not None else Usage())
        self._detector = Detector(self.limits, revision, nudge=nudge)
        self._settlement = SettlementStep(self.ledger, self._cancel)
        self._record = Record()
        self._admission = AdmissionStep(self._budget, self._detector, self._settlement, tools)
        self._observer = Observer(self._budget, self._detector)
        self._outcome = OutcomeStep(self._detector, self._settlement, self._record, self._observer)
        self._approvals = ApprovalGate(needs_approval, approvals)
        self._summarised = False  # the stop's one summary turn was handed out
        # Where the history left out of a restored checkpoint is, asked for only when a
        # report or a whole checkpoint needs it (restore(history=callable)).
        self._earlier: Callable[[], Mapping[str, Any]] | None = None
        self._batch: list[Ticket] = []  # the calls of the current model call
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
        """The verified revision: the business progress ``inspect`` reported so far (with
        no inspector, the count of new results and committed writes)."""
        return self._detector.revision

    @property
    def tickets(self) -> tuple[Ticket, ...]:
        """The admitted calls of the current model call, in order (a host that keeps the
        guard between requests finds a ticket here again after :meth:`restore`)."""
        return tuple(self._batch)

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
        if history:
            self._recall(strict=True)
        saved = compose(
            self._budget,
            self._detector,
            self._settlement,
            self._record,
            self._approvals,
            self._observer,
            history=history,
        )
        if steps and (self._planning or self._batch):
            saved["steps"] = {
                "planning": self._planning,
                "batch": [ticket.to_dict() for ticket in self._batch],
                "wait_ms": self._outcome.wait_ms,
                "spend_held": self._budget.held(),
            }
        return saved

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
        later: Callable[[], Mapping[str, Any]] | None = None
        given: Mapping[str, Any] | None
        if callable(history):
            later, given = history, _NO_HISTORY
        else:
            given = history
        try:
            parts = parts_of(checkpoint, given)
            used, revision = usage_from(parts["usage"]), count(parts["detector"]["revision"])
            guard = cls(limits, used=used, revision=revision, **options)
            load(
                parts,
                guard._detector,
                guard._settlement,
                guard._record,
                guard._approvals,
                guard._observer,
            )
            if "steps" in checkpoint:
                guard._resume_steps(checkpoint["steps"])
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"malformed checkpoint: {exc!r}") from exc
        guard._earlier = later
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
        if (stop := self._between_calls()) is not None:
            return stop
        refused = self._budget.start_model_call(reserve)
        if refused is not None:
            detail = ""
            if refused is Reason.SPEND_BUDGET:
                left = self._budget.remaining().get("spend")
                detail = f"the call may cost {reserve}; {left} left"
            return self._stop(Refusal(State.PARTIAL, refused, detail))
        self._planning = True
        return None

    def settle_spend(self, cost: int) -> None:
        """The last model call's real cost replaces what :meth:`before_model` reserved."""
        self._budget.settle_spend(cost)

    def before_approved(self) -> list[Ticket] | Nudge | Report | None:
        """In a phase opened by an approval that carries its call: admit that call, once,
        without a model call (it is not asked for again). ``None`` when there is none; else
        what :meth:`before_tools` answers for it."""
        if self._record.report is not None:
            return self._record.report
        call = self._approvals.runnable()
        if call is None:
            return None
        if (stop := self._between_calls()) is not None:
            return stop
        if self._budget.start_unplanned() is not None:
            return self._stop(_PAST_DEADLINE)
        self._planning = True
        return self.before_tools(call)

    def rejection(self) -> Nudge | None:
        """In a phase opened after a person rejected a call: what to tell the model, once
        (its first observation), else ``None``."""
        return self._approvals.rejection()

    def before_tools(self, proposal: Any, *, enter: bool = False) -> list[Ticket] | Nudge | Report:
        """Admit the calls of one model call, each checked before any of them runs.

        Returns the admitted tickets in order, a :class:`Nudge` to show the model instead
        (nothing runs), or the stop report. Counts one request per call examined.

        ``enter=True`` is the host's promise that it calls :meth:`before_tool` for a
        one-call proposal at once: a guard asked over the network (``guard.remote``) then
        decides the entry with the admission, in one request. Here, where asking costs
        nothing, :meth:`before_tool` decides it as always, at the same moment.
        """
        if self._record.report is not None:
            return self._record.report
        if not self._planning:
            raise ValueError(_UNPLANNED)
        self._planning = False  # and the batch is still empty: before_model() emptied it
        admitted = self._admission.admit(proposal)
        if isinstance(admitted, list):
            self._batch = admitted
            return admitted
        return admitted if isinstance(admitted, Nudge) else self._stop(admitted.refusal, admitted)

    def before_tool(self, ticket: Ticket, *, lookup: Lookup | None = None) -> Decision:
        """Decide, at the executor's entry, whether this admitted call may run now.

        For a write this claims the operation key in the ledger: ``EXECUTE`` means this
        caller owns the only execution; ``REUSE`` hands back the committed result (or a
        ``PENDING`` one while another execution holds the key). A write claimed back from
        ``NOT_COMMITTED`` runs only if ``lookup`` (the tool's trusted lookup, when it has
        one) does not find the action already done.
        """
        if self._record.report is not None:
            return Decision(Action.STOP, ticket, report=self._record.report)
        if ticket not in self._batch or ticket.status is not Status.ADMITTED:
            raise ValueError("before_tool() needs a fresh ticket from the current before_tools()")
        if self._cancel.requested():
            return self._refuse(ticket, _CANCELLED)
        refused = self._budget.entry()  # the deadline first, then room for one more execution
        if refused is Reason.DEADLINE:
            return self._refuse(ticket, _PAST_DEADLINE)
        call = ticket.call
        if self._approvals.active and (held := self._held(ticket, room=refused is None)):
            return self._refuse(ticket, held)
        if call.effect == "write":
            key = present(call.operation_key)
            claimed = self._settlement.claim(
                key, ticket.fingerprint, room=refused is None, lookup=lookup
            )
            if claimed is not None:
                if isinstance(claimed, Refusal):
                    return self._refuse(ticket, claimed)
                if isinstance(claimed, Result):  # PENDING: another execution holds it
                    return reuse(ticket, claimed)
                return reuse(ticket, claimed.result)
        elif refused is not None:
            return self._refuse(ticket, _NO_ROOM)
        self._budget.enter()
        return execute(ticket)

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
        if self._record.report is not None and ticket.status is not Status.EXECUTING:
            return self._record.report
        if inspect is None:
            # The lookup is asked about a write's own SUCCESS; an outcome that was lost
            # meets the lookup in the settlement instead, once.
            returned = error is None and result_problem(result) is None
            inspect = self._observer.about(ticket, lookup if returned else None)
        if ticket.status is Status.REUSING:
            ticket.status = Status.REUSED
            refused = self._outcome.verify(ticket, present(ticket.result), inspect)
        elif ticket.status is not Status.EXECUTING:
            raise ValueError("after_tool() needs a ticket that before_tool() let execute")
        elif error is not None:
            ticket.status = Status.RAN
            if ticket.call.effect != "write" and self._cancel.requested():
                return self._stop(_CANCELLED, ticket)
            transient = self._transient(error)
            refused = self._outcome.lose(
                ticket, describe(error), lookup, inspect, transient=transient
            )
        elif (problem := result_problem(result)) is not None:  # else it is a Result
            refused = self._outcome.lose(ticket, problem, lookup, inspect, Reason.BAD_RESULT)
        else:
            ticket.status = Status.RAN
            ticket.result = result
            if result.attempts != 1:
                self._budget.charge_retries(result.attempts)  # the adapter's own retries count too
            refused = self._outcome.verify(ticket, result, inspect, lookup=lookup)
        # Settled after the task stopped (a batch run at once): the first stop stands.
        return self._record.report if refused is None else self._stop(refused, ticket)

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
        report = self._record.report
        if report is None or self._summarised or report.reason not in SUMMARY_REASONS:
            return None
        if not self._budget.reserve_past_stop(reserve):
            return None
        self._summarised = True
        return (
            f"The task was stopped ({report.reason}): {RESUME_CONDITIONS[report.reason]} "
            "No tool may be called any more. Tell the user, in a few sentences, what was "
            "done, what was not, and why."
        )

    def record_summary(self, reply: Any, *, tokens: int = 0, cost: int | None = None) -> Report:
        """Keep the summary turn's ``reply`` (text, or a :class:`~guard.Finish` with its
        answer) in the stop report and charge its ``tokens`` and ``cost``, beyond the budget
        that ran out (``cost`` replaces the turn's reservation; without it the reservation
        stays spent). A tool call in the reply is not run: the report says so instead."""
        report = self._record.report
        if report is None or not self._summarised or report.summary is not None:
            raise ValueError("record_summary() needs the summary_turn() of this stop")
        self._budget.spend_tokens(tokens)
        if cost is not None:
            self._budget.settle_spend(cost)
        if isinstance(reply, Finish):
            reply = reply.answer
        if isinstance(reply, str):
            summary = reply.strip()
        elif isinstance(reply, Call) or (
            isinstance(reply, list | tuple) and all(isinstance(c, Call) for c in reply)
        ):
            calls = [reply] if isinstance(reply, Call) else list(reply)
            names = ", ".join(str(c.tool) for c in calls)
            summary = f"(the summary turn asked for {names}; no tool may run after a stop)"
        else:
            summary = "" if reply is None else safe_repr(reply)
        return self._record.summarise(summary, self._budget)

    def halt(self, state: State, reason: Reason, detail: str = "") -> Report:
        """Stop now for a reason found outside the guard: the host's word, for instance
        a ledger that records lazily finding that it could not. Sticky like every stop."""
        state, reason = State(state), Reason(reason)  # refused before anything changes
        if self._record.report is not None:
            return self._record.report
        self._planning = False
        return self._stop(Refusal(state, reason, detail))

    def before_wait(self) -> float | Report:
        """Milliseconds to wait before the next model call (0: none), or the stop report."""
        if self._record.report is not None:
            return self._record.report
        pause = self._outcome.wait_ms
        if pause <= 0:
            return 0
        if self._cancel.requested():
            return self._stop(_CANCELLED)
        if self._budget.wait_crosses_deadline(pause):
            detail = f"waiting {pause} ms would cross it"
            return self._stop(Refusal(State.PARTIAL, Reason.DEADLINE, detail))
        return pause

    def finish(self, finish: Finish, inspect: Inspect | None) -> Report:
        """The model says it is done: ``COMPLETED`` only if ``inspect`` verifies the goal.
        With no inspector (``inspect=None``) nothing can verify it: the model's word ends
        the task ``PARTIAL``/``goal_unverified``, the work done kept in the report."""
        if self._record.report is not None:
            return self._record.report
        if not self._planning:
            raise ValueError(_UNPLANNED)
        self._planning = False
        if inspect is None:
            inspect = self._observer.about(None)
        return self._stop(self._outcome.finish(finish, inspect))

    # -- internals -----------------------------------------------------------------------

    def _resume_steps(self, raw: Mapping[str, Any]) -> None:
        """Take back a step in progress from ``checkpoint(steps=True)``."""
        self._planning = bool(raw["planning"])
        self._batch = [Ticket.from_dict(item) for item in raw["batch"]]
        self._outcome.wait_ms = float(raw["wait_ms"])
        self._budget.hold(raw.get("spend_held"))

    def _recall(self, *, strict: bool = False) -> None:
        """Put back the history a restore left with the host (``restore(history=callable)``),
        once, before what was done since. A source that fails is asked again next time; a
        stop report is made without it (``strict=False``: the ledger keeps the truth), a
        whole checkpoint is not (the error goes on)."""
        source = self._earlier
        if source is None:
            return
        try:
            earlier = source()
            touched = [text(key) for key in earlier["touched"]]
            self._record.recall(earlier["completed"])  # checked whole, or nothing moves
        except Exception:
            if strict:
                raise
            return
        self._settlement.recall(touched)
        self._earlier = None

    def _between_calls(self) -> Report | None:
        """Before new calls (planned or approved): an execution never reported is lost,
        the last batch is done, a stop asked for is honoured."""
        if self._record.report is not None:
            return self._record.report
        for ticket in self._batch:
            if ticket.status is Status.EXECUTING:
                # The caller never reported this execution's outcome: treat it as lost.
                return self._lost(ticket, "no result was reported")
        self._batch = []
        self._outcome.wait_ms = 0
        if self._cancel.requested():
            return self._stop(_CANCELLED)
        return None

    def _held(self, ticket: Ticket, *, room: bool) -> Refusal | None:
        """Why an admitted call must wait for (or was refused by) a person, if it must: the
        approval gate, after every other check and before the claim. A write whose key the
        ledger holds committed for this very call only reuses its result: nothing runs, so
        nothing needs approving."""
        if not room:
            return None  # only a reuse could follow, or the stop for the execution budget
        call = ticket.call
        held = self._approvals.check(call, ticket.fingerprint)
        if not isinstance(held, Refusal):
            return None
        if held.reason is Reason.APPROVAL_REQUIRED and call.effect == "write":
            # A write that would only reuse its result, or that the ledger refuses anyway
            # (another input under its key, an uncertain entry), is not a person's to
            # approve: its claim says what becomes of it.
            looked = self._settlement.look(present(call.operation_key), ticket.fingerprint)
            # Only a reuse, or another input under the key (which no answer changes), may
            # skip the gate: a ledger that cannot be read, or an uncertain entry that a
            # reconciler may yet settle "not committed", still waits for a person.
            if looked is True or (
                isinstance(looked, Refusal) and looked.reason is Reason.OPERATION_CONFLICT
            ):
                return None
        return held

    def _lost(self, ticket: Ticket, detail: str) -> Report:
        """A call's outcome is lost and nobody can look it up: the task stops (a write is
        left ``UNKNOWN``)."""
        return self._stop(present(self._outcome.lose(ticket, detail)), ticket)

    def _refuse(self, ticket: Ticket, refusal: Refusal) -> Decision:
        return Decision(Action.STOP, ticket, report=self._stop(refusal, ticket))

    def _stop(self, refusal: Refusal, subject: Ticket | Refused | None = None) -> Report:
        """Record the terminal state once, about ``subject`` (a ticket, or a call refused
        while it was admitted); later stops return the first report."""
        if self._record.report is not None:
            return self._record.report
        self._recall()
        batch = stopped(self._batch)  # first: the report's call then shows it was not run
        pending = None
        if refusal.reason is Reason.APPROVAL_REQUIRED and isinstance(subject, Ticket):
            pending = pending_of(subject.call, subject.fingerprint)
        return self._record.close(
            refusal,
            call=None if subject is None else subject.describe(),
            batch=batch,
            budget=self._budget,
            revision=self._detector.revision,
            settlement=self._settlement,
            pending=pending,
        )
