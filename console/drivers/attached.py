"""Attached tasks: the step protocol's driver (docs/protocol.md).

An attached agent runs its own loop in its own process and asks before each model call and
tool call. Each request is one step of the same ``guard.Guard`` the hosted runner drives,
over the same step store, in one transaction that holds the task's row:

1. lock the task row (a Stop, a resumption or another request of the task waits for it);
2. a request id answered before gets its stored answer (a retry never claims twice);
3. take or renew the client's lease (``lifecycle.start_drive``: a lost driver's leftovers
   are settled first, as for a dead worker);
4. restore the guard from the task's checkpoint, run the one step, save its trace events,
   counters and checkpoint (``StepStore.save``), record a stop (``StepStore.finish``);
5. store the answer under the request id, and commit.

A write's claim is the store's own gated statement inside that transaction, so it is
atomic with the stop fact exactly as the runner's; and the client hears ``execute`` only
after the claim is committed. A failure anywhere rolls the whole step back: the client
retries it with the same request id and the step happens once.

Elapsed time is the wall clock's: the checkpoint says when it was taken, and the time
since then (the model thinking, a tool running in the client) counts toward the deadline.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from functools import cached_property, partial
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.db import DatabaseError, transaction
from django.utils import timezone

from console import services
from console.drivers import trace
from console.drivers.ledger import DatabaseLedger
from console.lifecycle import (
    audit_automatic_settle,
    guard_of,
    limits_of,
    of_this_phase,
    operator_stop_detail,
    usage_of,
)
from console.models import Decision, EventKind, Operation, StepRequest, StopReport, Task, TaskState
from console.records.inputs import (
    MAX_ARGS_BYTES,
    MAX_NAME_CHARS,
    MAX_RESULT_BYTES,
    MAX_TEXT_CHARS,
    InputRefused,
    check_bounded,
    key_problem,
)
from console.records.redaction import preview, redact, redact_text
from console.services import InvalidInput, NotFound, ServiceError
from console.store import Answer, Step, StepStore, open_store
from guard import (
    Call,
    Evidence,
    Finish,
    Kind,
    Nudge,
    OperationState,
    Reason,
    Report,
    Result,
    Settlement,
    State,
)
from guard.steps import RETRY_WAIT_MS, Action, Next, OutOfOrder, Sequencer, Ticket, canonical_json

PROTOCOL = 1
"""The protocol version this console speaks."""

MAX_CALLS = 64
# What one step may report, bounded where the database's columns are (a trace event's
# tokens are a 32-bit integer; the task's counters 64-bit).
MAX_TOKENS = 10**9  # of one model call
MAX_AMOUNT = 10**15  # a reservation or a cost, in the spend budget's minor unit
MAX_ATTEMPTS = 10_000  # a tool's own tries in one execution
MAX_WAIT_MS = 7 * 24 * 3600 * 1000  # a week
MAX_REVISION = 2**53
# Reasons a client may stop its own task for (what the integrations find outside the
# guard); the console's own (an operator's stop, approvals) are not the client's to claim.
HALT_REASONS = frozenset(Reason) - {
    Reason.OPERATOR_STOP,
    Reason.APPROVAL_REQUIRED,
    Reason.APPROVAL_REJECTED,
}

__all__ = [
    "HALT_REASONS",
    "MAX_CALLS",
    "PROTOCOL",
    "PROTOCOL_STEPS",
    "STEPS",
    "ProtocolRefused",
    "ProtocolStep",
    "attached_start",
    "attached_step",
    "body_hash",
]


class ProtocolRefused(ServiceError):
    """A step the protocol refuses; ``code`` is its machine-readable reason (an API error
    code, docs/protocol.md "Errors")."""

    def __init__(self, code: str, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.retry_after = retry_after
        """For ``lease_held``: the seconds the holder's lease has left (``Retry-After``)."""


def body_hash(body: Mapping[str, Any]) -> str:
    """What tells a retried request from another one under the same request id."""
    return hashlib.sha256(canonical_json(dict(body)).encode()).hexdigest()


def lease_seconds() -> float:
    return float(settings.LOOPGUARD_ATTACHED_LEASE_SECONDS)


# -- start -------------------------------------------------------------------------------------


def attached_start(
    *,
    actor: User,
    request_id: str,
    lease: str,
    agent: str,
    client: str,
    tools: Mapping[str, str],
    input: Mapping[str, Any] | None = None,
    limits: Mapping[str, Any] | None = None,
    reason: str = "",
    fingerprint: str,
) -> tuple[dict[str, Any], bool]:
    """Create an attached task driven by ``lease`` (or, for a retried start, find the one it
    created); returns its answer and whether it is new."""
    problem = services.agent_name_problem(agent)
    if problem is not None:
        raise InvalidInput(problem)
    client = redact_text(client)  # what a client says of itself is shown: secrets masked
    with transaction.atomic():
        # A retried start (the same request id) waits for the first and finds its task.
        services.lock_goal(
            hashlib.sha256(f"attached\x00{actor.pk}\x00{request_id}".encode()).hexdigest()
        )
        prior = (
            StepRequest.objects.filter(step="start", request_id=request_id)
            .filter(task__created_by=actor)
            .order_by("id")
            .first()
        )
        if prior is not None:
            if prior.body_hash != fingerprint:
                raise ProtocolRefused(
                    "request_id_reused", f"request {request_id} started another task"
                )
            replayed = dict(prior.answer)
            if Task.objects.filter(id=prior.task_id, lease_owner=lease).exists():
                return replayed, False
            # Asked again by another lease (a new process that never saw the answer): the
            # task is there; the client takes it over with a heartbeat.
            return replayed | {"attach": True}, False
        task = services.task_start(
            agent=agent,
            input=input,
            limits=limits,
            actor=actor,
            reason=reason or f"attached by {client}",
            client=client,
            tools=tools,
        )
        if task.is_terminal:  # held for a restart loop before it ran
            answer = _stopped(task)
        else:
            store = open_store(task.id, lease)
            taken = store.take_lease(lease_seconds())
            if isinstance(taken, str):  # pragma: no cover - nobody else knows the task yet
                raise ProtocolRefused("lease_held", taken)
            task = taken
            answer = _answer(task, task.state, _limits_left(task), None)
        answer |= {"lease_seconds": lease_seconds(), "url": f"/tasks/{task.id}/"}
        StepRequest.objects.create(
            task_id=task.id,
            request_id=request_id,
            step="start",
            body_hash=fingerprint,
            answer=answer,
        )
    return answer, True


# -- steps -------------------------------------------------------------------------------------


def attached_step(
    *,
    actor: User,
    task_id: int,
    request_id: str,
    lease: str,
    step: str,
    fields: Mapping[str, Any],
    fingerprint: str,
) -> dict[str, Any]:
    """Answer one step request of an attached task (see the module's docstring)."""
    entry = PROTOCOL_STEPS.get(step)
    if entry is None:
        raise InvalidInput(f"step must be one of {', '.join(STEPS)}")
    store = open_store(task_id, lease)
    with transaction.atomic():
        opened = store.open_step(request_id if entry.kept else None)
        if opened is None:
            raise NotFound(f"there is no task {task_id}")
        task, prior = opened
        if task.created_by_id != actor.pk:
            # Only the person whose token started it drives it; to anyone else it is a
            # task that does not exist (no lease, no state, not even that it is there).
            raise NotFound(f"there is no task {task_id}")
        if not task.is_attached:
            raise ProtocolRefused("not_attached", f"task {task_id} is hosted: workers drive it")
        if prior is not None:
            if prior.body_hash != fingerprint:
                raise ProtocolRefused(
                    "request_id_reused", f"request {request_id} was another request of this task"
                )
            return dict(prior.answer)
        answer = _Answered(request_id, step, fingerprint, entry.kept)
        return _step(task, store, entry, fields, answer, actor)


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


def _step(
    task: Task,
    store: StepStore,
    step: ProtocolStep,
    fields: Mapping[str, Any],
    answered: _Answered,
    actor: User,
) -> dict[str, Any]:
    if task.is_terminal:
        if step.name == "result":
            _settle_late(task, store.owner, fields)
        return _remembered(store, _stopped(task), answered)  # terminal is sticky
    # This request takes the lease (a new process after its predecessor vanished, or a
    # client whose lease ran out): the calls left running are interrupted (_Driver).
    handover = task.lease_owner != store.owner
    if step.kept and _fresh(task, store.owner):  # a heartbeat is there to renew it
        store.go_on(task)  # renewed a moment ago: no statement for it this time
        return _Driver(task, store, actor=actor).run(step, fields, answered)
    taken = store.take_lease(lease_seconds())
    if isinstance(taken, str):
        now = Task.objects.get(id=task.id)
        if now.is_terminal:  # stopped before it ran, or recovered from a lost client
            return _remembered(store, _stopped(now), answered)
        at = timezone.now()
        until = now.lease_alive_until(at)
        left = None if until is None else max(1.0, (until - at).total_seconds())
        raise ProtocolRefused("lease_held", f"task {task.id}: {taken}", retry_after=left)
    return _Driver(taken, store, actor=actor, handover=handover).run(step, fields, answered)


def _remembered(store: StepStore, answer: dict[str, Any], answered: _Answered) -> dict[str, Any]:
    """``answer``, stored on its own (no save carries it)."""
    kept = answered.of(answer)
    if kept is not None:
        store.remember(kept)
    return answer


def _fresh(task: Task, lease: str) -> bool:
    """Whether ``lease`` drives the running ``task`` with more than two thirds of its lease
    left: the step goes on without renewing it (one statement fewer); a later step renews
    it well before it runs out."""
    if task.state != TaskState.RUNNING or task.lease_owner != lease:
        return False
    renew_before = timezone.now() + timedelta(seconds=lease_seconds() * 2 / 3)
    return task.lease_alive_until(renew_before) is not None


def _settle_late(task: Task, lease: str, fields: Mapping[str, Any]) -> None:
    """The result of a write that was executing when another call of its model call stopped
    the task (a client running a batch at once): its operation is still ``IN_FLIGHT`` and
    must be settled by what the client reports — ``COMMITTED``, or ``UNKNOWN`` for a human —
    not left for nobody. The stop stands; only the ledger moves (once: a write settled
    already, or a read, is left as it is)."""
    checkpoint = task.checkpoint if isinstance(task.checkpoint, dict) else {}
    if not of_this_phase(task) or "steps" not in checkpoint["guard"]:
        return
    if (checkpoint.get("attached") or {}).get("lease") != lease:
        return  # only the client that was running it may say what became of it
    store = open_store(task.id, lease)
    ledger = DatabaseLedger(store=store)
    # Stopped already: no report is made from the history.
    guard = guard_of(task, _options(task, ledger), history=partial(store.history, task.phase))
    index = fields.get("ticket")
    ticket = next((t for t in guard.tickets if t.index == index), None)
    if ticket is None or str(ticket.status) != "executing" or ticket.call.effect != "write":
        return
    key = ticket.call.operation_key or ""
    entry = ledger.get(key)
    if entry is None or entry.state is not OperationState.IN_FLIGHT:
        return
    outcome, error = _outcome(fields.get("result"), fields.get("error"))
    guard.after_tool(ticket, outcome, error=error, inspect=_inspector(fields.get("evidence")))


def _options(task: Task, ledger: DatabaseLedger) -> dict[str, Any]:
    """The guard's options for a step of ``task`` (its row locked for the whole step, so
    the stop fact read with it is current)."""
    return {
        "now": _wall_ms,
        "wait": _no_wait,
        "ledger": ledger,
        "cancel": lambda: task.stop_requested_at is not None,
        "tools": dict(task.tools),
        "transient": _transient,
    }


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


class _ToolError(Exception):
    """What a client's tool raised, as the client described it."""

    def __init__(self, message: str, *, transient: bool) -> None:
        super().__init__(message)
        self.transient = transient


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
    """One step of one attached task, with its guard restored from the checkpoint."""

    def __init__(
        self, task: Task, store: StepStore, *, actor: User, handover: bool = False
    ) -> None:
        self.task = task
        self.store = store
        self.actor = actor
        self.handover = handover
        self.now = _wall_ms()
        self.ledger = DatabaseLedger(store=store)
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

    # -- the steps ---------------------------------------------------------------------------

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
            self.store.save(pending)
        elif kept is not None:
            self.store.remember(kept)
        self._audit_settled()
        return answer

    def _heartbeat(self, fields: Mapping[str, Any]) -> dict[str, Any]:
        stopping = self.task.stop_requested_at is not None
        answer = self._answer(stop_requested=stopping, lease_seconds=lease_seconds())
        if self.clock.orphans:
            answer["interrupted"] = [self._interrupted(index) for index in self.clock.orphans]
            if self.handover:
                self._save()  # the calls stay interrupted for this lease's next steps
        return answer

    def _model(self, fields: Mapping[str, Any]) -> dict[str, Any]:
        if (stop := self._settled_first()) is not None:
            return self._stop(stop)
        self.seq.check(Next.MODEL)
        for ticket in self.guard.tickets:
            if ticket.status == "admitted":
                # Admitted and never asked for (its framework dropped it: a person said no,
                # another middleware answered): the trace says so, and keeps its key for the
                # phase's history (a batch's admission looked it up).
                shown = preview(ticket.call.args)
                detail = "admitted; the client called the model again without asking to run it"
                self.events.append(
                    self._request(ticket, Decision.NOT_RUN, None, shown, detail=detail)
                )
        return self._allow_model(fields)

    def _tools(self, fields: Mapping[str, Any]) -> dict[str, Any]:
        if (stop := self._settled_first()) is not None:
            return self._stop(stop)
        self.seq.check(Next.PROPOSAL)
        calls = self._calls(fields.get("calls"))
        enter = fields.get("enter", False)
        if not isinstance(enter, bool):
            raise InvalidInput("enter must be true or false")
        if enter and len(calls) != 1:
            raise InvalidInput("enter is for a model call of exactly one call")
        proposal: Any = calls[0] if len(calls) == 1 else calls
        model = self._model_event(proposal)
        if self.task.stop_requested_at is not None:
            # Heard now rather than at each call's entry: none of them would run.
            self.events.append(model)
            return self._stop(self.seq.halt(State.CANCELLED, Reason.OPERATOR_STOP))
        admitted = self._guarded(lambda: self.seq.proposed(proposal, enter=enter))
        self.events.append(model)
        if isinstance(admitted, Report):
            self.events.append(trace.blocked_event(admitted))
            return self._stop(admitted)
        if isinstance(admitted, Nudge):
            self.events.append(trace.nudge_event(admitted, self.guard.revision))
            self._save()
            nudge = {
                "message": admitted.message,
                "tool": admitted.tool,
                "fingerprint": admitted.fingerprint,
                "reason": str(admitted.reason),
            }
            return self._answer(nudge=nudge)
        self.clock.entered = {}
        tickets = [_ticket(ticket) for ticket in admitted]
        if enter:
            # The client runs its one call as soon as it hears: this request is the call's
            # entry too, decided after its admission in the same transaction, as the
            # runner claims right after admitting.
            return self._enter(admitted[0], admitted=tickets)
        # Admitting runs nothing: each call's entry (a claim, or a read's save) commits
        # synchronously before its tool may run, and flushes this commit with it (WAL is
        # written in order). A crash of the database server in between loses the
        # admission, and the client's next step is refused (unknown_call): nothing ran.
        self._save(durable=False)
        return self._answer(admitted=tickets)

    def _call(self, fields: Mapping[str, Any]) -> dict[str, Any]:
        return self._enter(self._ticket(fields.get("ticket")))

    def _enter(self, ticket: Ticket, **answer: Any) -> dict[str, Any]:
        """The executor's entry of an admitted call: execute (its claim made), reuse the
        stored result, or stop."""
        self.seq.check(Next.ENTER, ticket)
        shown = preview(ticket.call.args)
        self.ledger.describe(ticket.call, shown)
        decision = self._guarded(lambda: self.seq.enter(ticket))
        if decision.action is Action.STOP:
            report = decision.report
            if report is None:  # pragma: no cover - STOP always carries its report
                raise RuntimeError("a stop decision without a report")
            event = self._request(ticket, Decision.BLOCKED, None, shown, reason=report.reason)
            self.events.append(event)
            return self._stop(report)
        entered = dict(self.clock.entered or {})
        entered[str(ticket.index)] = self.now
        self.clock.entered = entered
        self._save()
        if decision.action is Action.EXECUTE:
            return self._answer(**answer, action="execute")
        result = decision.result
        shown_result = None if result is None else redact(result.to_dict())
        return self._answer(**answer, action="reuse", result=shown_result)

    def _result(self, fields: Mapping[str, Any]) -> dict[str, Any]:
        ticket = self._ticket(fields.get("ticket"))
        orphan = ticket.index in self.clock.orphans
        if not orphan:  # a call a lost client left is settled by the driver (_interrupt)
            self.seq.check(Next.RESULT, ticket)
        then = fields.get("then")
        if then is not None and then not in ("wait", "model"):
            raise InvalidInput('then must be "wait" or "model"')
        if then == "model":  # checked before the result moves anything (a 400 is final)
            _count(fields.get("reserve", 0), "reserve", MAX_AMOUNT)
        reported = fields.get("result") is not None or fields.get("error") is not None
        if orphan and (not reported or ticket.call.effect == "write"):
            # Interrupted with its client: what the tool's lookup found, or nothing (lost).
            # Recovery has made a write UNKNOWN; only trusted evidence settles it now: a
            # lookup, or the very client that ran it reporting its SUCCESS after its lease
            # ran out (nobody else can have run it: an UNKNOWN write never runs again).
            if reported and fields.get("lookup") is not None:
                raise InvalidInput("a result step carries a result, an error or a lookup")
            found = _found(fields.get("lookup"), ticket)
            if reported and self.clock.orphaned_by == self.store.owner:
                found = _late(fields.get("result"), fields.get("error"))
            stop = self._interrupt(ticket, found, _inspector(fields.get("evidence")))
            if stop is None and not self.clock.orphans:
                stop = self._waited_while_lost()
            if stop is not None:
                return self._stop(stop)
            return self._after_results(fields, then)
        if fields.get("lookup") is not None:
            raise InvalidInput("lookup is only for a call its client left running (interrupted)")
        executed = str(ticket.status) == "executing"
        outcome: Any = None
        error: BaseException | None = None
        if executed:
            outcome, error = _outcome(fields.get("result"), fields.get("error"))
        stop = self._guarded(
            lambda: self.seq.returned(ticket, outcome)
            if error is None
            else self.seq.raised(ticket, error)
        )
        entered = (self.clock.entered or {}).get(str(ticket.index))
        latency = None if entered is None else max(0.0, self.now - float(entered)) / 1000.0
        detail = "" if error is None else str(error)[:500]
        self.events.append(
            self._request(
                ticket,
                Decision.EXECUTED if executed else Decision.REUSED,
                latency,
                preview(ticket.call.args),
                reason="" if stop is None else stop.reason,
                detail=detail,
            )
        )
        if stop is not None:
            return self._stop(stop)
        return self._after_results(fields, then)

    def _after_results(self, fields: Mapping[str, Any], then: str | None) -> dict[str, Any]:
        if then is None or self.seq.next().next is not Next.WAIT:
            self._save()  # calls of this model call are still to come: nothing follows yet
            return self._answer()
        # The model call's last result, and what the client does next in the same request:
        # the wait, and (when there is none) the next model call, counted now, as the
        # runner counts it ahead with the step's save.
        return self._wait(fields, model=then == "model")

    def _wait(self, fields: Mapping[str, Any], *, model: bool = False) -> dict[str, Any]:
        if (stop := self._settled_first()) is not None:
            return self._stop(stop)
        self.seq.check(Next.WAIT)
        if self.task.stop_requested_at is not None:
            # Heard now rather than after the wait: the next model call would refuse anyway.
            return self._stop(self.seq.halt(State.CANCELLED, Reason.OPERATOR_STOP))
        pause = self._guarded(self.seq.pause)
        if isinstance(pause, Report):
            return self._stop(pause)
        if pause:
            self.events.append(trace.event(EventKind.WAIT, detail=f"waiting {pause:.0f} ms"))
        elif model:
            return self._allow_model(fields, wait_ms=pause)
        self._save()
        return self._answer(wait_ms=pause)

    def _allow_model(self, fields: Mapping[str, Any], **answer: Any) -> dict[str, Any]:
        """Count the next model call (reserving ``reserve``), or stop."""
        reserve = _count(fields.get("reserve", 0), "reserve", MAX_AMOUNT)
        stop = self._guarded(lambda: self.seq.model(reserve=reserve))
        if stop is not None:
            return self._stop(stop)
        self.clock.model_at = self.now
        self._save()
        return self._answer(**answer, allowed=True)

    def _finish(self, fields: Mapping[str, Any]) -> dict[str, Any]:
        if (stop := self._settled_first()) is not None:
            return self._stop(stop)
        self.seq.check(Next.PROPOSAL)
        finish = Finish(fields.get("answer"))
        report = self._guarded(lambda: self.seq.proposed(finish))
        self.events.append(self._model_event(finish))
        return self._stop(report)

    def _failed(self, fields: Mapping[str, Any]) -> dict[str, Any]:
        why = _text(fields.get("error"), "error") or "the model call failed"
        detail = f"planner: {why}"
        self.events.append(self._model_event(None, detail=detail))
        return self._stop(self.seq.planner_failed(RuntimeError(why)))

    def _halt(self, fields: Mapping[str, Any]) -> dict[str, Any]:
        try:
            state = State(str(fields.get("state")))
            reason = Reason(str(fields.get("reason")))
        except ValueError:
            raise InvalidInput("halt needs a state and a reason in the guard's words") from None
        if reason not in HALT_REASONS or state is State.COMPLETED:
            raise InvalidInput(f"a client may not stop its task {state}/{reason}")
        detail = _text(fields.get("detail"), "detail")
        return self._stop(self.seq.halt(state, reason, detail))

    # -- calls a lost client left running ----------------------------------------------------

    def _interrupted(self, index: int) -> dict[str, Any]:
        """An interrupted call as a heartbeat names it, for the new process to report."""
        ticket = self._ticket(index)
        call = ticket.call
        return {
            "ticket": ticket.index,
            "tool": call.tool,
            "effect": call.effect,
            "operation_key": call.operation_key,
            "status": str(ticket.status),
        }

    def _interrupt(
        self, ticket: Ticket, found: Settlement | None, inspect: Any
    ) -> Report | None:
        """Settle a call its lost client left running. A reuse counts its stored result; a
        read is re-askable (``RETRYABLE``: the model may ask for it again, within the
        repeat limit); a write is lost — settled by ``found`` (the tool's lookup, asked by
        the new process) or ``UNKNOWN`` for a person. Never run again on anyone's word."""
        self.clock.orphans = tuple(i for i in self.clock.orphans if i != ticket.index)
        why = "interrupted: the client running it was lost before it reported"
        if str(ticket.status) == "reusing":
            stop = self.guard.after_tool(ticket, inspect=inspect)
            decision = Decision.REUSED
        elif ticket.call.effect == "write":
            decision = Decision.EXECUTED
            key = ticket.call.operation_key or ""
            if found is None or found.committed is None:
                # Recovery made it UNKNOWN when the lease ran out; nobody can tell more.
                if found is not None:
                    why = f"{why}; its lookup could not tell: {found.evidence}"
                stop = self.guard.halt(State.NEEDS_HUMAN, Reason.UNKNOWN_COMMIT, f"{why} ({key})")
            else:
                error = _ToolError(why, transient=True)
                settled = self.guard.after_tool(
                    ticket, error=error, inspect=inspect, lookup=lambda _key: found
                )
                stop = settled
                self.settled.append((key, found))
                said = "committed" if found.committed else "not committed"
                why = f"{why}; its lookup found it {said}: {found.evidence}"
        else:
            retry = Result(Kind.RETRYABLE, {"interrupted": why}, wait_ms=RETRY_WAIT_MS)
            stop = self.guard.after_tool(ticket, retry, inspect=inspect)
            decision = Decision.EXECUTED
        self.events.append(
            self._request(
                ticket,
                decision,
                None,
                preview(ticket.call.args),
                reason="" if stop is None else stop.reason,
                detail=why[:500],
            )
        )
        return stop

    def _audit_settled(self) -> None:
        """Every write a client's lookup settled, in the audit log as an automatic settle
        in the name of the token's person (its evidence is in the operation's history)."""
        for key, found in self.settled:
            reached = OperationState.COMMITTED if found.committed else OperationState.NOT_COMMITTED
            op = Operation.objects.filter(key=key, state=reached).first()
            if op is None:  # the ledger refused the move (a person settled it first)
                continue
            audit_automatic_settle(
                op, actor=self.actor, task_id=self.task.id, before=OperationState.UNKNOWN,
                said=found.evidence, client=self.task.client,
            )  # fmt: skip
        self.settled = []

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

    def _settled_first(self) -> Report | None:
        """Before a step that ends the model call's calls: the calls a lost client left
        running are settled as interrupted (the stop, if one of them stops the task), before
        the sequencer judges the step (:attr:`seq`)."""
        if not self.clock.orphans:
            return None
        for index in self.clock.orphans:
            stop = self._interrupt(self._ticket(index), None, None)
            if stop is not None:
                return stop
        return self._waited_while_lost()

    def _waited_while_lost(self) -> Report | None:
        """Once the calls a lost client left are settled: the wait they ask for (a read
        asked again, a write a lookup proved not committed) passed while the lease ran out
        and the new process took over, so it is served here; the new process is never
        refused a model step for a wait nobody told it of."""
        if self.seq.next().next is not Next.WAIT:
            return None
        pause = self._guarded(self.seq.pause)
        return pause if isinstance(pause, Report) else None

    def _calls(self, raw: Any) -> list[Call]:
        if not isinstance(raw, list) or not 0 < len(raw) <= MAX_CALLS:
            raise InvalidInput(f"calls must be a list of 1 to {MAX_CALLS} calls")
        calls = []
        for index, item in enumerate(raw):
            where = f"calls[{index}]"
            if not isinstance(item, Mapping) or set(item) - {
                "tool",
                "args",
                "effect",
                "operation_key",
            }:
                raise InvalidInput(f"{where} must be {{tool, args, effect?, operation_key?}}")
            tool, args = item.get("tool"), item.get("args", {})
            # No tool is declared with a longer name: one is a malformed call, not a bad one.
            if not isinstance(tool, str) or not 0 < len(tool) <= MAX_NAME_CHARS:
                raise InvalidInput(f"{where}.tool must be a tool's name (1 to {MAX_NAME_CHARS})")
            if not isinstance(args, Mapping):
                raise InvalidInput(f"{where}.args must be an object")
            _bounded(args, f"{where}.args", MAX_ARGS_BYTES)
            # Only an absent effect (or null) takes the declared one: a false or an empty
            # list is a malformed effect, not a request for the default.
            effect = item.get("effect")
            if effect is None:
                effect = self.task.tools.get(tool, "read")
            if effect not in ("read", "write"):
                raise InvalidInput(f'{where}.effect must be "read" or "write"')
            key = item.get("operation_key")
            if key is not None and not isinstance(key, str):
                raise InvalidInput(f"{where}.operation_key must be a string")
            # Never cut: a shorter key names another business action.
            problem = None if key is None else key_problem(key)
            if problem is not None:
                raise InvalidInput(f"{where}: {problem}")
            calls.append(Call(tool, dict(args), effect, key))
        return calls

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


@dataclass(frozen=True, slots=True)
class ProtocolStep:
    """One step of the protocol (docs/protocol.md): what answers it and what it carries.

    ``takes`` and ``gives`` name the request fields it reads and the answer fields it may
    give beyond every step's own, as :mod:`console.api.serializers` declares them (the request
    and answer schemas, and so the OpenAPI document, are built from this table). A new
    step is one entry here and its handler (and its row in docs/protocol.md)."""

    name: str
    handler: Callable[[_Driver, Mapping[str, Any]], dict[str, Any]]
    takes: tuple[str, ...]
    gives: tuple[str, ...]
    summary: str
    kept: bool = True
    """Its answer is stored under its request id (a retry gets it again) and it charges the
    ``usage`` it carries; a heartbeat's is not: it changes nothing a retry could repeat."""


def _steps(*steps: ProtocolStep) -> dict[str, ProtocolStep]:
    return {step.name: step for step in steps}


PROTOCOL_STEPS: Mapping[str, ProtocolStep] = _steps(
    ProtocolStep(
        "model", _Driver._model, ("reserve",), ("allowed",),
        "before a model call: allowed, or the stop report",
    ),
    ProtocolStep(
        "tools", _Driver._tools, ("calls", "enter"), ("admitted", "nudge", "action", "result"),
        "before the model call's calls: their tickets, a nudge for the model, or the stop",
    ),
    ProtocolStep(
        "call", _Driver._call, ("ticket",), ("action", "result"),
        "at a call's entry: execute it, reuse its stored result, or the stop",
    ),
    ProtocolStep(
        "result", _Driver._result,
        ("ticket", "result", "error", "lookup", "evidence", "then", "reserve"),
        ("wait_ms", "allowed"),
        "after a call: what it came to (with then, what wait and model answer too)",
    ),
    ProtocolStep(
        "wait", _Driver._wait, (), ("wait_ms",),
        "before waiting: how long to wait before the next model call",
    ),
    ProtocolStep(
        "finish", _Driver._finish, ("answer", "evidence"), (),
        "the model's final answer: the stop report, COMPLETED only if verified",
    ),
    ProtocolStep(
        "failed", _Driver._failed, ("error",), (),
        "the model call raised: the stop report, FAILED/planner_error",
    ),
    ProtocolStep(
        "halt", _Driver._halt, ("state", "reason", "detail"), (),
        "the client stops its task for a reason it found: the stop report",
    ),
    ProtocolStep(
        "heartbeat", _Driver._heartbeat, (), ("stop_requested", "lease_seconds", "interrupted"),
        "renew the lease (or take it, coming back): the calls a lost client left running",
        kept=False,
    ),
)  # fmt: skip
"""The protocol's steps by name, in the order docs/protocol.md lists them."""

STEPS = tuple(PROTOCOL_STEPS)
"""The steps' names."""


# The guard's refusals of a step out of order, as a client of the protocol reads them.
_IN_PROTOCOL_WORDS = {
    "each proposal needs its own before_model() first": (
        "send a model step before each tools or finish step: every model call is allowed first"
    ),
    "before_tool() needs a fresh ticket from the current before_tools()": (
        "a call step needs a ticket admitted by the current model call's tools step"
    ),
    "after_tool() needs a ticket that before_tool() let execute": (
        "a result step needs a ticket whose call step answered execute or reuse"
    ),
}

def _refusal(step: str, ticket: Ticket | None, refused: OutOfOrder) -> tuple[str, str]:
    """The sequencer's refusal of a client's step as the protocol says it: its code (the
    more specific ones for a result), and the step that was due."""
    status = None if ticket is None else str(ticket.status)
    if step == "result" and ticket is not None and status in ("admitted", "not_run"):
        return "call_not_allowed", f"call {ticket.index} was never allowed to run"
    if step == "result" and ticket is not None and status in ("ran", "reused"):
        return "result_given", f"call {ticket.index} has its result already"
    due = refused.expected
    about = "" if due.ticket is None else f"call {due.ticket.index} ({due.ticket.call.tool})"
    said = {
        Next.MODEL: "send a model step first: every model call is allowed before its tools "
        "or finish step",
        Next.PROPOSAL: "the model call allowed last comes first: send its tools, finish or "
        "failed step",
        Next.ENTER: f"a call step for {about} is due first",
        Next.RESULT: f"report the result of {about} first, with a result step",
        Next.WAIT: "a wait step is due first: "
        + (
            "the model call's calls asked to wait"
            if refused.wait_ms is None
            else f"wait {refused.wait_ms:.0f} ms before the next model call"
        ),
        Next.DONE: "the task has stopped",
    }[due.next]
    return "step_out_of_order", f"a {step} step does not fit here: {said}"


_RUNNING = ("executing", "reusing")
"""A call's statuses while its client runs it (or reuses its stored result)."""


def _late(result: Any, error: Any) -> Settlement | None:
    """A write's own outcome, reported by the client that ran it after its lease ran out:
    a ``SUCCESS`` settles it committed with that result; anything else is still unknown."""
    outcome, failed = _outcome(result, error)
    if failed is not None or not isinstance(outcome, Result) or outcome.kind is not Kind.SUCCESS:
        return None
    return Settlement(True, outcome, "its client reported SUCCESS after its lease ran out")


def _found(raw: Any, ticket: Ticket) -> Settlement | None:
    """A client's report of what its tool's trusted lookup found about an interrupted
    write, or ``None`` (no lookup: the write is lost)."""
    if raw is None:
        return None
    if ticket.call.effect != "write":
        raise InvalidInput("lookup is for a write: an interrupted read is asked again")
    if not isinstance(raw, Mapping) or set(raw) - {"committed", "result", "evidence"}:
        raise InvalidInput('lookup is {"committed": true|false|null, "result"?, "evidence"}')
    committed = raw.get("committed")
    if not (committed is None or isinstance(committed, bool)):
        raise InvalidInput("lookup.committed must be true, false or null (cannot tell)")
    evidence = _text(raw.get("evidence"), "lookup.evidence")
    if committed is not None and not evidence.strip():
        raise InvalidInput("lookup.evidence must say what the lookup found")
    result = None
    if raw.get("result") is not None:
        if committed is not True:
            raise InvalidInput("lookup.result only goes with committed: true")
        _bounded(raw["result"], "lookup.result", MAX_RESULT_BYTES)
        reported, error = _outcome(raw["result"], None)
        if error is not None or not isinstance(reported, Result):
            raise InvalidInput("lookup.result must be a result, {kind, data?}")
        result = reported
    return Settlement(committed, result, evidence)


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


def _stored(raw: Mapping[str, Any]) -> dict[str, Any]:
    """A call in progress as it is kept (in the checkpoint, in an answer): its arguments and
    result redacted, as the trace keeps them; its tool, operation key and fingerprint exact,
    for the ledger and loop detection work on those (a redacted key would name another
    business action)."""
    result = raw.get("result")
    return {
        **raw,
        "args": redact(raw.get("args") or {}),
        "result": None if result is None else redact(result),
    }


def _ticket(ticket: Ticket) -> dict[str, Any]:
    """An admitted call as the answer shows it (the client knows its own arguments: they
    are stored redacted with the answer, which a retry gets again)."""
    raw = _stored(ticket.to_dict())
    raw["ticket"] = raw.pop("index")
    return raw


def _outcome(result: Any, error: Any) -> tuple[Any, BaseException | None]:
    """The tool's outcome as the client reported it: a result (anything that is not one is
    the guard's ``bad_result``), or the error it raised."""
    if (result is None) == (error is None):
        raise InvalidInput("a result step for a call that ran carries result or error")
    if error is not None:
        if not isinstance(error, Mapping) or set(error) - {"type", "message", "transient"}:
            raise InvalidInput('error is {"type", "message", "transient"}')
        kind = _text(error.get("type"), "error.type", MAX_NAME_CHARS) or "Error"
        message = _text(error.get("message"), "error.message")
        transient = error.get("transient", False)
        if not isinstance(transient, bool):
            # Read as false, "true" would make a retryable error final: refused instead.
            raise InvalidInput("error.transient must be true or false")
        # Named as the client's exception was, so that the report reads as it would locally.
        named = kind if kind.isidentifier() else "ToolError"
        cls = type(named, (_ToolError,), {})
        return None, cls(message, transient=transient)
    if isinstance(result, Mapping):
        # Checked before the kind: a count of the wrong type is a malformed result (400),
        # while a result that is not one at all is the guard's bad_result.
        attempts, wait = result.get("attempts", 1), result.get("wait_ms")
        if not isinstance(attempts, int) or isinstance(attempts, bool):
            raise InvalidInput("result.attempts must be a whole number")
        _count(attempts, "result.attempts", MAX_ATTEMPTS)
        if wait is not None and (
            not isinstance(wait, int | float)
            or isinstance(wait, bool)
            or not 0 <= wait <= MAX_WAIT_MS
        ):
            raise InvalidInput(f"result.wait_ms must be milliseconds, at most {MAX_WAIT_MS:,}")
    try:
        reported = Result.from_dict(result)
    except (KeyError, TypeError, ValueError, AttributeError, OverflowError):
        return result, None  # not a result: the guard stops it as bad_result
    return reported, None


def _inspector(evidence: Any) -> Any:
    """The client's inspector's word as an ``inspect`` for the guard, or ``None`` (the
    observed-evidence policy)."""
    if evidence is None:
        return None
    if not isinstance(evidence, Mapping):
        raise InvalidInput('evidence is {"revision", "done", "committed"}')
    if "error" in evidence:
        if not isinstance(evidence["error"], str):
            raise InvalidInput('evidence.error must say, as a string, what the inspector raised')
        failure = _text(evidence["error"], "evidence.error")

        def failed(_result: Any, _call: Any) -> Evidence:
            raise ValueError(f"the client's inspector failed: {failure}")

        return failed
    if set(evidence) - {"revision", "done", "committed"}:
        raise InvalidInput('evidence is {"revision", "done", "committed"}')
    revision, done, committed = (
        evidence.get("revision"),
        evidence.get("done", False),
        evidence.get("committed"),
    )
    # Malformed evidence is the client's error (400), not the guard's verdict on evidence it
    # cannot trust: that one is for an inspector that raised (above).
    if not isinstance(revision, int) or isinstance(revision, bool):
        raise InvalidInput("evidence.revision must be a whole number")
    if abs(revision) > MAX_REVISION:
        raise InvalidInput(f"evidence.revision must be at most {MAX_REVISION:,}")
    if not isinstance(done, bool):
        raise InvalidInput("evidence.done must be true or false")
    if not (committed is None or isinstance(committed, bool)):
        raise InvalidInput("evidence.committed must be true, false or null")

    def inspect(_result: Any, _call: Any) -> Evidence:
        return Evidence(revision, done, committed)

    return inspect


def _count(value: Any, what: str, most: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise InvalidInput(f"{what} must be a whole number ≥ 0")
    if value > most:
        raise InvalidInput(f"{what} must be at most {most:,}")
    return value


def _text(value: Any, what: str, most: int = MAX_TEXT_CHARS) -> str:
    """Words a client reports (an error's message, a detail, evidence), refused rather than
    cut when longer than ``most``: the stop report and the trace say what was sent."""
    if value is None:
        return ""
    if not isinstance(value, str):
        raise InvalidInput(f"{what} must be a string")
    if len(value) > most:
        raise InvalidInput(f"{what} is {len(value):,} characters long: at most {most:,} are taken")
    return value


def _bounded(value: Any, what: str, most_bytes: int) -> None:
    """Refuse a value that would be stored other than it was sent (cut below the depth the
    redaction keeps) or is larger than its bound (:mod:`console.records.inputs`)."""
    try:
        check_bounded(value, what=what, most_bytes=most_bytes)
    except InputRefused as exc:
        raise InvalidInput(str(exc)) from None
