"""The attached driver of one step: the task's guard restored from its checkpoint, the step
run through the sequencer, its save made last with the answer (:class:`_Driver`).

The handlers of the steps are in ``steps``, the calls a lost client left in ``lost``, the
reading of the request's fields in ``fields``; the request's life around the driver (the
task row locked, a retried request answered, the lease taken) in ``requests``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.contrib.auth.models import User
from django.db import DatabaseError

from console.drivers import trace
from console.drivers.attached.fields import (
    _IN_PROTOCOL_WORDS,
    MAX_AMOUNT,
    MAX_TOKENS,
    _count,
    _inspector,
    _refusal,
    _stored,
)
from console.drivers.attached.lost import _audit_settled
from console.drivers.ledger import DatabaseLedger
from console.lifecycle import (
    approvals_for,
    guard_of,
    limits_of,
    of_this_phase,
    operator_stop_detail,
    usage_of,
)
from console.models import StopReport, Task
from console.records.redaction import redact
from console.services import InvalidInput, ServiceError
from console.store import Answer, Step, StepStore
from guard import Call, Reason, Report, Settlement
from guard.steps import OutOfOrder, Sequencer, Ticket

if TYPE_CHECKING:  # the table's entries name the driver: named for the type only
    from console.drivers.attached.steps import ProtocolStep


PROTOCOL = 1
"""The protocol version this console speaks."""


class ProtocolRefused(ServiceError):
    """A step the protocol refuses; ``code`` is its machine-readable reason (an API error
    code, docs/protocol.md "Errors")."""

    def __init__(self, code: str, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.retry_after = retry_after
        """For ``lease_held``: the seconds the holder's lease has left (``Retry-After``)."""


def lease_seconds() -> float:
    return float(settings.LOOPGUARD_ATTACHED_LEASE_SECONDS)


@dataclass(frozen=True)
class _Answered:
    """How a step's answer is kept: under its request id, with its body's hash."""

    request_id: str
    step: str
    body_hash: str
    kept: bool = True

    def of(self, answer: dict[str, Any]) -> Answer | None:
        """``answer`` with its request id, as stored (a heartbeat's is not)."""
        answer["request_id"] = self.request_id
        if not self.kept:
            return None
        return Answer(self.request_id, self.step, self.body_hash, answer)


def _options(task: Task, ledger: DatabaseLedger) -> dict[str, Any]:
    """The guard's options for a step of ``task`` (its row locked for the whole step, so
    the stop fact read with it is current)."""
    options: dict[str, Any] = {
        "now": _wall_ms,
        "wait": _no_wait,
        "ledger": ledger,
        "cancel": lambda: task.stop_requested_at is not None,
        "tools": dict(task.tools),
        "transient": _transient,
    }
    if task.approval_tools:
        # Only a task that asked for approval has answers to read (one query a step then):
        # the others' steps stay as they were.
        options["needs_approval"] = _needing_approval(frozenset(task.approval_tools))
        options["approvals"] = approvals_for(task)
    return options


def _needing_approval(tools: frozenset[str]) -> Callable[[Call], bool]:
    """The gate's policy for an attached task: every call to one of ``tools`` waits for a
    person. An approved call is not run by the console: the client proposes it again in the
    resumed phase and the gate admits exactly that call, once (``Guard.before_approved`` is
    never asked here, so nothing is handed out to run unproposed)."""

    def needs(call: Call) -> bool:
        return call.tool in tools

    return needs


def _stopped(task: Task) -> dict[str, Any]:
    latest = StopReport.objects.filter(task_id=task.id).order_by("-phase", "-id").first()
    report: dict[str, Any] = (
        dict(latest.report) if latest is not None else {"state": task.state, "reason": task.reason}
    )
    remaining = report.get("remaining_budget") or {}
    return _answer(task, task.state, remaining, report)


def _answer(
    task: Task, state: str, remaining: Mapping[str, Any], stop: Mapping[str, Any] | None
) -> dict[str, Any]:
    return {
        "protocol": PROTOCOL,
        "task": task.id,
        "phase": task.phase,
        "state": str(state),
        "remaining": dict(remaining),
        "stop": None if stop is None else dict(stop),
    }


def _limits_left(task: Task) -> dict[str, int | None]:
    limits = limits_of(task)
    return dict(limits.remaining(usage_of(task)))


def _wall_ms() -> float:
    return time.time() * 1000.0


def _transient(error: BaseException) -> bool:
    return bool(getattr(error, "transient", False))


def _no_wait(ms: float) -> None:
    """The client waits (``wait`` answers how long): the server never sleeps."""


@dataclass
class _Clock:
    """When the phase's steps happened, on the wall clock (milliseconds), kept with the
    checkpoint: the model call's start and each call's entry, for the trace's latencies."""

    model_at: float | None = None
    entered: dict[str, float] | None = None
    orphans: tuple[int, ...] = ()
    """The calls a lost client left running, by ticket, until they are reported."""
    orphaned_by: str = ""
    """The lease of the client that left them."""

    def to_dict(self, saved_at: float) -> dict[str, Any]:
        return {
            "saved_at": saved_at,
            "model_at": self.model_at,
            "entered": self.entered or {},
            "orphans": list(self.orphans),
            "orphaned_by": self.orphaned_by,
        }


class _Driver:
    """One step of one attached task, with its guard restored from the checkpoint.

    The step itself is its handler's (``steps``, found through ``PROTOCOL_STEPS``), and what
    becomes of the calls a lost client left is ``lost``'s: both are functions taking this
    driver, which keeps the step's state and its save, answer and stop."""

    def __init__(
        self,
        task: Task,
        store: StepStore,
        *,
        actor: User,
        handover: bool = False,
        assume: bool = False,
    ) -> None:
        self.task = task
        self.store = store
        self.actor = actor
        self.handover = handover
        self.now = _wall_ms()
        self.ledger = DatabaseLedger(store=store)
        # A write's claim (of a fresh key) or record is made by the step's save, in its
        # statement: one round trip fewer. Refused there, the request runs the step again.
        self.ledger.assume = assume and store.carries_moves
        self.events: list[dict[str, Any]] = []
        self.pending: Step | None = None
        """The step's save, made once its answer is known (:meth:`run`)."""
        self.in_progress: list[str] = []
        # What this step's usage charged: the model call's, for its trace event.
        self.tokens = 0
        self.cost: int | None = None
        checkpoint = task.checkpoint if isinstance(task.checkpoint, dict) else {}
        options = _options(task, self.ledger)
        if of_this_phase(task):
            clock = checkpoint.get("attached") or {}
            # The time since the last step (the model thinking, a tool running) counts.
            gap = max(0, round(self.now - float(clock.get("saved_at") or self.now)))
            self.in_progress = _met_the_ledger(checkpoint["guard"].get("steps"))
            self.guard = guard_of(task, options, history=self._history, elapsed_ms=gap)
            self.clock = _Clock(clock.get("model_at"), dict(clock.get("entered") or {}))
            orphans = set(clock.get("orphans") or ())
            self.clock.orphaned_by = str(clock.get("orphaned_by") or "")
            if handover:
                # Whatever was running when this lease was taken was left by a client that
                # is gone (or whose lease ran out): its outcome is interrupted, never waited for.
                orphans = {ticket.index for ticket in self.guard.tickets}
                self.clock.orphaned_by = str(clock.get("lease") or "")
            self.clock.orphans = tuple(
                ticket.index
                for ticket in self.guard.tickets
                if ticket.index in orphans and str(ticket.status) in _RUNNING
            )
        else:
            self.guard = guard_of(task, options, history=self._history)
            self.clock = _Clock()
        self.settled: list[tuple[str, Settlement]] = []
        """Writes a client's lookup settled in this step, for the audit log (:meth:`run`)."""
        this_phase = of_this_phase(task)
        saved = (checkpoint.get("attached") or {}) if this_phase else {}
        steps = ((checkpoint.get("guard") or {}).get("steps") or {}) if this_phase else {}
        # The guard keeps whether a proposal is awaited; the pause asked is the driver's.
        self.position = {"planning": bool(steps.get("planning", False))}
        if "sequence" in saved:
            self.position["waited"] = bool(saved["sequence"].get("waited"))
        self.fields: Mapping[str, Any] = {}
        self.about: Ticket | None = None
        """The call the step names, once it is read (:meth:`_ticket`)."""

    @cached_property
    def seq(self) -> Sequencer:
        """Where the task stands in the order of a step: the sequencer, restored from the
        guard and the position saved with the checkpoint, judges the client's step. Made
        when a step first asks, after the calls a lost client left are settled."""
        inspect = _inspector(self.fields.get("evidence"))
        return Sequencer.resume(
            self.guard, self.guard.tickets, self.position, inspect=inspect, reports_reuse=True
        )

    # -- the step ----------------------------------------------------------------------------

    def run(
        self, step: ProtocolStep, fields: Mapping[str, Any], answered: _Answered
    ) -> dict[str, Any]:
        """Answer ``step``; its save, made last, stores the answer with it."""
        self.fields = fields
        try:
            if step.kept:
                self._charge(fields.get("usage"))
            answer = step.handler(self, fields)
        except _OutOfOrder as exc:
            raise ProtocolRefused(exc.code, str(exc)) from None
        except OutOfOrder as exc:
            code, message = _refusal(step.name, self.about, exc)
            raise ProtocolRefused(code, message) from None
        kept = answered.of(answer)
        pending, self.pending = self.pending, None
        if pending is not None:
            pending.answer = kept
            pending.assumes = self.ledger.take_assumed()
            self.store.save(pending)
        elif kept is not None:
            self.ledger.flush()
            self.store.remember(kept)
        _audit_settled(self)
        return answer

    # -- helpers -----------------------------------------------------------------------------

    def _charge(self, usage: Any) -> None:
        """What the model call since the last step spent, charged before the step."""
        if usage is None:
            return
        if not isinstance(usage, Mapping) or set(usage) - {"tokens", "cost"}:
            raise InvalidInput('usage is {"tokens": n, "cost": c}, each a whole number ≥ 0')
        tokens = _count(usage.get("tokens", 0), "usage.tokens", MAX_TOKENS)
        cost = usage.get("cost")
        if cost is not None:
            cost = _count(cost, "usage.cost", MAX_AMOUNT)
        if tokens:
            self.guard.spend_tokens(tokens)
        if cost is not None:
            try:
                self.guard.settle_spend(cost)
            except ValueError:  # no model call's reservation is waiting for its cost
                raise _OutOfOrder(
                    "step_out_of_order",
                    "usage.cost: no model call is waiting for its cost (each model step's "
                    "cost is sent once, with the step after it)",
                ) from None
        self.tokens, self.cost = tokens, usage.get("cost")

    def _ticket(self, raw: Any) -> Ticket:
        if not isinstance(raw, int) or isinstance(raw, bool):
            raise InvalidInput("ticket must be the number of an admitted call")
        for ticket in self.guard.tickets:
            if ticket.index == raw:
                self.about = ticket
                return ticket
        raise _OutOfOrder("unknown_call", f"the current model call has no call {raw}")

    def _guarded(self, step: Any) -> Any:
        """Run a guard step; a step the guard finds out of order is the client's error,
        said in the protocol's words (the guard's name its Python methods)."""
        try:
            return step()
        except OutOfOrder:
            raise  # the sequencer's word (run says it in the protocol's)
        except ValueError as exc:
            if self.ledger.unavailable is not None:
                raise DatabaseError(str(self.ledger.unavailable)) from self.ledger.unavailable
            said = str(exc)
            raise _OutOfOrder("step_out_of_order", _IN_PROTOCOL_WORDS.get(said, said)) from None

    def _model_event(self, proposal: Any, *, detail: str = "") -> dict[str, Any]:
        started = self.clock.model_at
        latency = 0 if started is None else max(0, round(self.now - float(started)))
        event = trace.model_event(proposal, latency, self.tokens, self.guard.revision, detail)
        if self.cost is not None:
            event["cost"] = self.cost
        return event

    def _request(
        self, ticket: Ticket, decision: str, latency: float | None, shown: str, **why: str
    ) -> dict[str, Any]:
        return trace.request_event(
            ticket, decision, latency, args_preview=shown, revision=self.guard.revision, **why
        )

    def _checkpoint(self) -> dict[str, Any]:
        # Without what grows with the phase (every key it touched, its latest completed
        # requests): the trace has it, read back only for a stop report (_history).
        saved = self.guard.checkpoint(history=False, steps=True)
        if "steps" in saved:
            saved["steps"]["batch"] = [_stored(raw) for raw in saved["steps"]["batch"]]
        clock = self.clock.to_dict(_wall_ms()) | {"lease": self.store.owner}
        if "seq" in self.__dict__:  # asked in this step: where it stands now
            clock["sequence"] = self.seq.position()
        elif "waited" in self.position:
            clock["sequence"] = dict(self.position)
        return {"phase": self.task.phase, "guard": saved, "attached": clock}

    def _history(self) -> dict[str, list[Any]]:
        """The phase's history up to this step, which the guard asks for only to make its
        stop report: the trace's, and the keys of the calls in progress that met the ledger
        before this step (their request events come with their results)."""
        try:
            history = self.store.history(self.task.phase)
        except DatabaseError as exc:
            self.ledger.unavailable = exc  # not a verdict: the step rolls back (_stop)
            raise
        history["touched"] = [*history["touched"], *self.in_progress]
        return history

    def _save(self, *, durable: bool = True) -> None:
        """Save the step, with the answer (:meth:`run` makes the save last, so that the
        answer rides on it); ``durable=False`` lets this request's commit return before
        its WAL reaches the disk (PostgreSQL), for a step that a synchronous one follows
        before anything is run on its word."""
        usage = self.guard.usage.to_dict()
        checkpoint = self._checkpoint()
        step = Step(usage, self.guard.revision, tuple(self.events), checkpoint, durable=durable)
        if self.pending is not None:  # pragma: no cover - each step saves once
            raise RuntimeError("a step saved twice")
        self.pending = step
        self.events = []

    def _stop(self, report: Report) -> dict[str, Any]:
        if self.ledger.unavailable is not None:
            # The guard stopped because the ledger could not be read: not a verdict. The
            # step rolls back and the client asks again.
            failed = self.ledger.unavailable
            raise DatabaseError(f"the ledger failed ({failed})") from failed
        self.ledger.flush()  # a move assumed is made first, as the guard took it
        # The step's trace events and counters now; the checkpoint goes with the finish.
        self.store.save(Step(self.guard.usage.to_dict(), self.guard.revision, tuple(self.events)))
        self.events = []
        self.store.finish(report, checkpoint=self._checkpoint())
        stored = redact(report.to_dict())
        if report.reason is Reason.OPERATOR_STOP and not report.detail:
            stored["detail"] = operator_stop_detail(self.task)  # as the stored report says
        return _answer(self.task, report.state, report.remaining, stored)

    def _answer(self, **fields: Any) -> dict[str, Any]:
        return _answer(self.task, self.task.state, self.guard.remaining(), None) | fields


class _OutOfOrder(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def _met_the_ledger(steps: Any) -> list[str]:
    """The operation keys of a checkpoint's calls in progress that met the ledger: each
    call entered (claimed, or found committed), and each write of a batch of several
    (looked up whole at its admission)."""
    if not isinstance(steps, Mapping):
        return []
    batch = steps.get("batch") or []
    entered = ("executing", "reusing", "ran", "reused")
    return [
        str(raw["operation_key"])
        for raw in batch
        if raw.get("operation_key")
        and raw.get("effect") == "write"  # a read's key is never claimed nor looked up
        and (raw.get("status") in entered or len(batch) > 1)
    ]


_RUNNING = ("executing", "reusing")
"""A call's statuses while its client runs it (or reuses its stored result)."""
