"""Attached tasks: the step protocol's requests (docs/protocol.md).

An attached agent runs its own loop in its own process and asks before each model call and
tool call. Each request is one step of the same ``guard.Guard`` the hosted runner drives,
over the same step store, as if it held the task's row for the whole step:

1. read the task row, with the answer stored under the request id: a request id answered
   before gets that answer (a retry never claims twice);
2. take or renew the client's lease (``lifecycle.start_drive``: a lost driver's leftovers
   are settled first, as for a dead worker);
3. restore the guard from the task's checkpoint, run the one step, save its trace events,
   counters and checkpoint (``StepStore.save``), record a stop (``StepStore.finish``);
4. store the answer under the request id, with the save.

Most steps run on the row read without its lock (``StepStore.read_step``, PostgreSQL): a
running task whose lease this client holds fresh, a step that ends in one save. That save,
with the answer and the claim or record the step assumed, is one statement made only while
the row is still at the version read (a compare-and-set; no transaction held open). A row
changed meanwhile (a Stop, a resumption, another request of the task, the sweep), or a step
that comes to more (a stop, the lease to take, the ledger or the trace read, calls a lost
client left) or to a refusal (final for the client) writes nothing (``NeedsLock``) and runs
again in one transaction holding the row's lock from the first statement: a Stop, a
resumption or another request of the task waits for it. So every step is decided on the
row as it stands when its save commits.

A retry whose original committed is answered from the read; one whose original commits
after the read meets its answer's row: the compare-and-set or the answer's insert fails
the save whole (``AnsweredBefore``), or, holding the lock, its step rolls back whole
(PostgreSQL tells a retry by that insert conflicting, with no lookup before it), and the
stored answer is read.

On PostgreSQL a write's claim of a fresh key (at its entry) and its record (after it) are
assumed made and made by the save itself, one statement fewer (``Step.assumes``); a save
that cannot make them saves nothing (``MoveRefused``: a key with an entry already, a write
settled meanwhile), and the step is run once more, holding the lock, with the ledger asked
first.

A write's claim is a statement gated on the task row (its stop fact, the lease), so it is
atomic with the stop fact exactly as the runner's; and the client hears ``execute`` only
after the claim is committed. A failure anywhere leaves nothing of the step: the client
retries it with the same request id and the step happens once.

Elapsed time is the wall clock's: the checkpoint says when it was taken, and the time
since then (the model thinking, a tool running in the client) counts toward the deadline.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from functools import partial
from typing import Any

from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone

from console import services
from console.drivers.attached.driver import (
    ProtocolRefused,
    _answer,
    _Answered,
    _Driver,
    _limits_left,
    _options,
    _stopped,
    lease_seconds,
)
from console.drivers.attached.fields import _inspector, _outcome
from console.drivers.attached.steps import PROTOCOL_STEPS, STEPS, ProtocolStep
from console.drivers.ledger import DatabaseLedger
from console.lifecycle import guard_of, of_this_phase
from console.models import StepRequest, Task, TaskState
from console.records.redaction import redact_text
from console.services import InvalidInput, NotFound, ServiceError
from console.store import (
    Answer,
    AnsweredBefore,
    MoveRefused,
    NeedsLock,
    StepStore,
    open_store,
)
from guard import OperationState
from guard.steps import canonical_json


def body_hash(body: Mapping[str, Any]) -> str:
    """What tells a retried request from another one under the same request id."""
    return hashlib.sha256(canonical_json(dict(body)).encode()).hexdigest()


# -- start -------------------------------------------------------------------------------------


def attached_start(
    *,
    actor: User,
    request_id: str,
    lease: str,
    agent: str,
    client: str,
    tools: Mapping[str, str],
    approval: Any = None,
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
            approval=approval,
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
    request = _Request(actor, task_id, request_id, lease, entry, fields, fingerprint)
    store = open_store(task_id, lease)
    try:
        return request.answer(store)
    except (AnsweredBefore, ServiceError) as exc:
        # A retry whose step, run again, met its own answer's row (or was refused on the
        # way there: its call already run, the task stopped since). The step rolled back
        # whole; what the request was answered the first time is the answer.
        if not request.driven or getattr(exc, "code", "") == "request_id_reused":
            raise
        prior = store.answered(request_id)
        if prior is None:
            raise
        return _replayed(prior, request_id, fingerprint)


@dataclass
class _Request:
    """One step request of an attached task, answered once: without the task row's lock
    when it can be, else holding it (see the module's docstring)."""

    actor: User
    task_id: int
    request_id: str
    lease: str
    entry: ProtocolStep
    fields: Mapping[str, Any]
    fingerprint: str
    driven: bool = False
    """The actor drives this attached task: a stored answer may be theirs."""

    def answer(self, store: StepStore) -> dict[str, Any]:
        # A write's ledger move is first assumed made by the step's save, where the store
        # can carry it (one statement fewer): when that save cannot make it, the step runs
        # again with the ledger asked.
        assume = True
        if self.entry.kept:
            try:
                answered = self._unlocked(store)
                if answered is not None:
                    return answered
            except NeedsLock:
                pass  # nothing was written: the step runs again, holding the lock
            except MoveRefused:
                assume = False
        if assume:
            try:
                return self._locked(open_store(self.task_id, self.lease), assume=True)
            except MoveRefused:
                # The save could not make the move the step was decided on (the key was
                # claimed before, the write settled meanwhile): the step rolled back
                # whole. Once more, the ledger asked first.
                pass
        return self._locked(open_store(self.task_id, self.lease), assume=False)

    def _unlocked(self, store: StepStore) -> dict[str, Any] | None:
        """The step on the row as read without its lock, its save a compare-and-set on
        the row's version (``StepStore.read_step``); ``None`` when the step needs the
        lock (a stopped task, a lease to take or renew, calls a lost client left, a
        refusal to give)."""
        read = store.read_step(self.request_id)
        if read is None:
            raise NotFound(f"there is no task {self.task_id}")
        task, prior, unlocked = read
        self._may_drive(task)
        if prior is not None:
            return _replayed(prior, self.request_id, self.fingerprint)
        if task.is_terminal or not _fresh(task, self.lease):
            return None
        self.driven = True
        unlocked.go_on(task)
        driver = _Driver(task, unlocked, actor=self.actor, assume=True)
        if driver.clock.orphans:
            return None
        try:
            return driver.run(self.entry, self.fields, self._answered())
        except ServiceError:
            # A refusal is final for the client: it is given only by a step holding the
            # lock, on the row as it stands (not one read a moment ago, nor one whose
            # ledger read the guard swallowed).
            return None

    def _locked(self, store: StepStore, *, assume: bool) -> dict[str, Any]:
        """The step in one transaction holding the task row's lock (``open_step``)."""
        with transaction.atomic():
            opened = store.open_step(self.request_id if self.entry.kept else None)
            if opened is None:
                raise NotFound(f"there is no task {self.task_id}")
            task, prior = opened
            self._may_drive(task)
            if prior is not None:
                return _replayed(prior, self.request_id, self.fingerprint)
            self.driven = self.entry.kept
            return _step(
                task, store, self.entry, self.fields, self._answered(), self.actor, assume=assume
            )

    def _may_drive(self, task: Task) -> None:
        if task.created_by_id != self.actor.pk:
            # Only the person whose token started it drives it; to anyone else it is a task
            # that does not exist (no lease, no state, not even that it is there).
            raise NotFound(f"there is no task {self.task_id}")
        if not task.is_attached:
            raise ProtocolRefused(
                "not_attached", f"task {self.task_id} is hosted: workers drive it"
            )

    def _answered(self) -> _Answered:
        return _Answered(self.request_id, self.entry.name, self.fingerprint, self.entry.kept)


def _replayed(prior: Answer, request_id: str, fingerprint: str) -> dict[str, Any]:
    """The answer stored for a retried request, if the retry is the same request."""
    if prior.body_hash != fingerprint:
        raise ProtocolRefused(
            "request_id_reused", f"request {request_id} was another request of this task"
        )
    return dict(prior.answer)


def _step(
    task: Task,
    store: StepStore,
    step: ProtocolStep,
    fields: Mapping[str, Any],
    answered: _Answered,
    actor: User,
    *,
    assume: bool,
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
        return _Driver(task, store, actor=actor, assume=assume).run(step, fields, answered)
    taken = store.take_lease(lease_seconds())
    if isinstance(taken, str):
        now = Task.objects.get(id=task.id)
        if now.is_terminal:  # stopped before it ran, or recovered from a lost client
            return _remembered(store, _stopped(now), answered)
        at = timezone.now()
        until = now.lease_alive_until(at)
        left = None if until is None else max(1.0, (until - at).total_seconds())
        raise ProtocolRefused("lease_held", f"task {task.id}: {taken}", retry_after=left)
    driver = _Driver(taken, store, actor=actor, handover=handover, assume=assume)
    return driver.run(step, fields, answered)


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
