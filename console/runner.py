"""The runner: drives the guard step by step for one task, persisting every step.

One driver per task, guaranteed by a lease (owner, expiry, heartbeat) taken with a
conditional update: a redelivered Celery message, a duplicate enqueue or a second worker
finds the lease held, or the task finished, and does nothing. Every step is saved
(trace events, counters, checkpoint) before the next one starts, so a crash loses at most
the step in progress, and the recovery sweep turns that step's in-flight write, if any,
into ``UNKNOWN`` instead of running it again (then settles it by its tool's lookup, when
the lookup can tell).

Tool and model I/O never happen inside a database transaction; the transactions here
are short and only record what happened.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timedelta
from enum import Enum
from functools import partial
from typing import Any, cast

from django.conf import settings
from django.db import (
    DatabaseError,
    InterfaceError,
    OperationalError,
    close_old_connections,
    connection,
    transaction,
)
from django.utils import timezone

from guard import Approval, Call, Finish, Guard, Nudge, Reason, Report, Result, Settlement, State
from guard.steps import (
    Action,
    Effect,
    LedgerError,
    Sequencer,
    Ticket,
    fingerprint,
    transient_error,
)

from . import lifecycle, trace
from .agents import Agent, Tool, agent_class
from .ledger import DatabaseLedger
from .lifecycle import recover
from .logs import task_context
from .models import Approval as ApprovalRow
from .models import (
    ApprovalState,
    Decision,
    EventKind,
    Operation,
    OperationState,
    Task,
    TaskState,
    lease_lapsed,
    waiting_for_client,
)
from .redaction import preview, redact
from .spend import money, price_of
from .store import LeaseLost, Record, Saved, Step, StepStore, open_store

logger = logging.getLogger(__name__)

STOP_POLL_S = 0.2  # how often a waiting driver looks for a stop: well under a second
QUICK_MODEL_CALL_S = 0.05  # a model call this quick has its event saved with its read

__all__ = ["STOP_POLL_S", "drive", "new_owner", "sweep"]


def lease_seconds() -> float:
    return float(settings.LOOPGUARD_LEASE_SECONDS)


def new_owner() -> str:
    """A lease owner name that says where the driver runs."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def sweep(enqueue: Callable[[int], None]) -> dict[str, int]:
    """Recover tasks whose driver's lease ran out; re-enqueue queued tasks nobody took.

    Run periodically (Celery beat). Safe to run on several machines at once: each task is
    handled under its row lock, skipping rows another sweep or driver holds, and only if it
    is still as the sweep saw it. A hosted task's lost writes are first looked up by their
    tools (:func:`_recover`); an attached task whose client's lease ran out is recovered
    the same way (its ``IN_FLIGHT`` writes become ``UNKNOWN``), but never enqueued: it
    waits for its client, for ``LOOPGUARD_ATTACHED_CLIENT_LOST_SECONDS``, then stops
    ``NEEDS_HUMAN``/``client_lost``.
    """
    now = timezone.now()
    # First: a running task whose client has been gone that long (no sweep ran since its
    # lease lapsed) stops for a person rather than going back to wait again.
    counts = {"client_lost": _lose_clients(now), "recovered": 0, "resumed": 0, "requeued": 0}
    expired = Task.objects.filter(lease_lapsed(now))
    for task_id in expired.values_list("id", flat=True)[:500]:
        with task_context(task_id):
            outcome = _recover(task_id, enqueue)
        if outcome is not _Recovery.LEFT:
            counts["recovered"] += 1
        if outcome is _Recovery.RESUMED:
            counts["resumed"] += 1
    # A queued task whose message was lost (a broker restart) is enqueued again; a
    # duplicate message is harmless, the lease lets only one driver in.
    stale = now - timedelta(seconds=settings.LOOPGUARD_REQUEUE_AFTER_SECONDS)
    queued = Task.objects.filter(state=TaskState.QUEUED, updated_at__lt=stale, client="")
    for task_id in queued.values_list("id", flat=True)[:500]:
        Task.objects.filter(id=task_id, state=TaskState.QUEUED).update(updated_at=now)
        enqueue(task_id)
        counts["requeued"] += 1
    return counts


class _Recovery(Enum):
    """What :func:`_recover` did with a task whose driver's lease ran out."""

    LEFT = "left as it was: someone else has it, or its lost write waits to be looked up"
    STOPPED = "recovered, and stopped (or, attached, waiting for its client)"
    RESUMED = "recovered and queued again"


def _recover(task_id: int, enqueue: Callable[[int], None] | None) -> _Recovery:
    """Recover one task whose driver's lease ran out (``lifecycle.recover``), its lost
    writes looked up first by their tools when it is hosted (:func:`_look_up_lost`).

    The lookups are I/O on the business system: they run before the transaction, on what
    was read without a lock. The transaction then goes on only if the task is still as it
    was seen (running, past its lease, the same driver's), so that two sweeps, or a sweep
    and a driver, recover it once; and each operation moves only from the state it is in
    under its row lock, so that a reconciler who settled it first keeps their answer. A
    lookup that finds nothing, while the lost driver may still be inside the write
    (``lifecycle.quiet_since``), leaves the task for a later sweep: that driver may yet
    come back and renew its lease, or make the write, which the lookup then finds.
    With ``enqueue`` a recovered task is queued again (on commit); without (a driver about
    to take the task itself), it is only put back in the queue.
    """
    seen = Task.objects.filter(lease_lapsed(timezone.now()), id=task_id).first()
    if seen is None:
        return _Recovery.LEFT
    found = _look_up_lost(seen)
    if any(said.get("committed") is False for said in found.values()) and not (
        lifecycle.quiet_since(seen)
    ):
        logger.info(
            "task %s: a lost write was not found; asking again once its driver is quiet", task_id
        )
        return _Recovery.LEFT
    with transaction.atomic():
        task = (
            Task.objects.select_for_update(skip_locked=True)
            .filter(lease_lapsed(timezone.now()), id=task_id, lease_owner=seen.lease_owner)
            .first()
        )
        if task is None:
            return _Recovery.LEFT
        why = "the client's lease expired" if task.is_attached else "lease expired"
        if not recover(task, why=why, found=found):
            return _Recovery.STOPPED
        lifecycle.requeue(task)
        if task.is_attached:
            return _Recovery.STOPPED  # it waits for its client, which takes it by its next step
        if enqueue is not None:
            transaction.on_commit(partial(enqueue, task.id))
    return _Recovery.RESUMED


# -- asking a lost write's tool ---------------------------------------------------------------


def lookup_bounds() -> tuple[int, float]:
    """How often, and for how long in all, recovery asks one lost write's lookup:
    ``LOOPGUARD_RECOVERY_LOOKUP_TRIES`` (3) and ``LOOPGUARD_RECOVERY_LOOKUP_SECONDS`` (10)."""
    tries = int(settings.LOOPGUARD_RECOVERY_LOOKUP_TRIES)
    return tries, float(min(settings.LOOPGUARD_RECOVERY_LOOKUP_SECONDS, 3600.0))


def _look_up_lost(task: Task) -> dict[str, dict[str, Any]]:
    """What the tools' lookups say of ``task``'s ``IN_FLIGHT`` writes, by operation key
    (``committed``, ``evidence``, ``result``; or an ``error``, which says why the person
    who is paged for it is), redacted; ``{}`` for an attached task (its tools are in its
    client). Outside any transaction: each lookup is asked on a thread of its own, within
    :func:`lookup_bounds`, so a lookup that hangs costs its bound and no more."""
    if task.is_attached:
        return {}
    lost = list(
        Operation.objects.filter(task_id=task.id, state=OperationState.IN_FLIGHT)
        .order_by("id")
        .values_list("key", "tool")
    )
    if not lost:
        return {}
    try:
        agent = agent_class(task.agent)(task.id, task.input, {})
        if not agent.auto_lookup:
            return {key: {"error": "its agent's auto_lookup is off"} for key, _ in lost}
        lookups = {tool.name: tool.lookup for tool in agent.tools()}
    except Exception as exc:
        logger.exception("task %s: its agent cannot be built to look its lost writes up", task.id)
        why = f"its agent could not be built: {type(exc).__name__}"
        return {key: {"error": why} for key, _ in lost}
    tries, seconds = lookup_bounds()
    found: dict[str, dict[str, Any]] = {}
    for key, tool in lost:
        lookup = lookups.get(tool)
        if lookup is None:
            found[key] = {"error": f"the tool {tool or '?'} has no lookup"}
        else:
            found[key] = dict(redact(_ask(lookup, key, tries=tries, seconds=seconds)))
    return found


def _ask(lookup: Callable[[str], Any], key: str, *, tries: int, seconds: float) -> dict[str, Any]:
    """Ask ``lookup`` about ``key`` until it says committed or not, at most ``tries``
    times within ``seconds``; what it last said. Never raises."""
    deadline = time.monotonic() + seconds
    said: dict[str, Any] = {"error": "the lookup was not asked"}
    for attempt in range(tries):
        if attempt:
            time.sleep(min(0.2 * 2**attempt, max(0.0, deadline - time.monotonic())))
        left = deadline - time.monotonic()
        if left <= 0:
            break
        answer: list[Any] = []

        def asking(answer: list[Any] = answer) -> None:
            try:
                answer.append(lookup(key))
            except Exception as exc:  # the business system failing is an answer too
                answer.append(exc)
            finally:
                connection.close()  # this thread's own, if the lookup used the database

        thread = threading.Thread(target=asking, name=f"lookup-{key}"[:60], daemon=True)
        thread.start()
        thread.join(left)
        if not answer:
            # Left to finish on its own: a thread cannot be stopped, only no longer heard.
            return {"error": f"the lookup did not answer within {seconds:g} s"}
        said = _said(answer[0])
        if said.get("committed") in (True, False):
            return said
    return said


def _said(answer: Any) -> dict[str, Any]:
    """A lookup's answer as recovery and the audit log keep it."""
    if isinstance(answer, Exception):
        return {"error": f"the lookup failed: {type(answer).__name__}: {answer}"[:500]}
    ok = isinstance(answer, Settlement) and answer.committed in (True, False, None)
    if not ok or (answer.result is not None and not isinstance(answer.result, Result)):
        return {"error": f"the lookup answered {type(answer).__name__}, not a Settlement"}
    return {
        "committed": answer.committed,
        "evidence": str(answer.evidence or "")[:500],
        "result": None if answer.result is None else answer.result.to_dict(),
    }


def _lose_clients(now: datetime) -> int:
    """Stop each attached task whose client's lease lapsed longer ago than a client may
    stay away (``lifecycle.lose_client``); returns how many. A task someone asked to stop
    is left to recovery, which ends it as they asked."""
    allowed = timedelta(seconds=settings.LOOPGUARD_ATTACHED_CLIENT_LOST_SECONDS)
    gone = Task.objects.filter(waiting_for_client(now - allowed), stop_requested_at=None)
    lost = 0
    for task_id in gone.values_list("id", flat=True)[:500]:
        with task_context(task_id), transaction.atomic():
            # Asked again under the row lock: a client that came back meanwhile holds the
            # row (skipped) or has renewed its lease (no longer matches).
            task = (
                Task.objects.select_for_update(skip_locked=True)
                .filter(waiting_for_client(now - allowed), id=task_id, stop_requested_at=None)
                .first()
            )
            if task is None:
                continue
            lifecycle.lose_client(task)
            lost += 1
    return lost


# -- the driver ------------------------------------------------------------------------------


def drive(task_id: int, *, owner: str | None = None) -> str:
    """Drive one task until the guard stops it, or return at once if it is not ours to drive.

    Returns a short description of what happened, for the worker's log.
    """
    with task_context(task_id):  # every log line of this run says task=<id>
        return _drive(task_id, owner or new_owner())


def _drive(task_id: int, owner: str) -> str:
    if Task.objects.filter(id=task_id).exclude(client="").exists():
        # An attached task's own client drives it (console.attached); a worker never does.
        logger.warning("task %s is attached: its client drives it, not a worker", task_id)
        return "attached: its client drives it"
    lost = Task.objects.filter(lease_lapsed(timezone.now()), id=task_id)
    if Operation.objects.filter(task__in=lost, state=OperationState.IN_FLIGHT).exists():
        # A driver was lost inside a write and no sweep has recovered the task yet: its
        # tools' lookups are asked first, as the sweep asks them, outside the lease's
        # transaction (whose recovery could only leave the write to a person).
        _recover(task_id, None)
        if lost.exists():
            logger.info("task %s: its lost driver's write is looked up again later", task_id)
            return "a lost driver's write waits to be looked up"
    store = open_store(task_id, owner)
    acquired = store.take_lease(lease_seconds())
    if isinstance(acquired, str):
        logger.info("task %s: %s", task_id, acquired)
        return acquired
    heartbeat = _Heartbeat(store)
    heartbeat.start()
    try:
        return _Driver(acquired, store, heartbeat).drive()
    except LeaseLost as exc:
        logger.warning("task %s: lease lost, leaving it to its new driver (%s)", task_id, exc)
        return f"lease lost: {exc}"
    finally:
        heartbeat.halt()


class _Heartbeat(threading.Thread):
    """Keeps the lease alive while the driver works; notices when it is lost."""

    def __init__(self, store: StepStore) -> None:
        super().__init__(name=f"lease-{store.task_id}", daemon=True)
        self.store = store
        self.lost = False
        self._halt = threading.Event()

    def run(self) -> None:
        interval = lease_seconds() / 3
        deadline = time.monotonic() + lease_seconds()
        try:
            while not self._halt.wait(interval):
                try:
                    renewed = self.store.renew_lease(lease_seconds())
                except DatabaseError:
                    close_old_connections()
                    if time.monotonic() > deadline:  # it has expired by now
                        self.lost = True
                        return
                    continue
                if not renewed:
                    self.lost = True
                    return
                deadline = time.monotonic() + lease_seconds()
        finally:
            connection.close()

    def halt(self) -> None:
        self._halt.set()
        self.join(timeout=5)


# What a save counts ahead: (model calls, requests, executions).
_NOTHING = (0, 0, 0)
_NEXT_CALL = (1, 0, 0)  # the next model call
_NEXT_STEP = (1, 1, 1)  # the next model call, one request and its execution


class _Driver:
    """One stretch of one task: rebuilds the guard and agent, then loops over steps.

    What is saved, and when (each a short transaction conditional on the lease):

    - after each tool request: its trace event, the counters and the checkpoint (guard,
      agent memory, observation) that a restart of this phase resumes from; for a write,
      its record (``COMMITTED``) in the same statement. Going on, this save also counts
      the next model call, one request and its execution ahead, so that a crash while
      the model thinks or the next tool runs never gives them back;
    - after the model call, when it proposed one call: nothing of its own. Its event
      waits for the next statement: a write's claim, which also reads the stop fact in
      its own transaction (the gate), or, for a read after a quick model call
      (``QUICK_MODEL_CALL_S``) that spent nothing else (tokens, a poll), the save after
      it, the stop fact being read just before the read starts;
    - after any other model call (several calls, a read after a slow model call, the
      first of a drive): its event and counters, executions counted ahead. That commit
      does not wait for the disk: a worker crash cannot lose it (the database has it),
      and the next synchronous commit (a claim, or the reads' own save) flushes it.
      Only a crash of the database server in between can lose it, and with it the
      count of those reads;
    - before a drive's first model call and before a wait: the model-call counter,
      already counting the next call.

    Counters saved ahead are corrected by the next save; when a task resumes after a
    worker crash they can only be too high, never too low (after a crash of the database
    server, too low by at most the reads of one model call).
    """

    def __init__(self, task: Task, store: StepStore, heartbeat: _Heartbeat) -> None:
        self.task = task
        self.store = store
        self.heartbeat = heartbeat
        self.pending: list[dict[str, Any]] = []  # events waiting for the next save
        self.carried: Step | None = None  # the step so far, riding on the next claim
        self.args_preview = ""  # the redacted arguments of the call in progress
        self.one_ahead = False  # the row counts the next model call, request, execution
        checkpoint = task.checkpoint if isinstance(task.checkpoint, dict) else {}
        self.agent: Agent = agent_class(task.agent)(
            task.id, task.input, dict(checkpoint.get("agent") or {})
        )
        self.tools: dict[str, Tool] = {tool.name: tool for tool in self.agent.tools()}
        self.ledger = DatabaseLedger(store=store)
        self.stop = _StopFact(task, store, heartbeat)
        self.price = price_of(type(self.agent).model_name())
        options: dict[str, Any] = {
            "now": _monotonic_ms,
            "wait": self.stop.wait,
            "ledger": self.ledger,
            "cancel": self.stop.asked,
            "nudge": self.agent.nudge,
            "tools": {name: tool.effect for name, tool in self.tools.items()},
            "transient": _transient,
            "needs_approval": self.agent.approval_policy(),
            "approvals": _approvals_for(task),
        }
        self.fresh = not lifecycle.of_this_phase(task)
        # The guard may hold a write for approval before its claim (which reads the stop
        # fact): then the stop fact must be read again before the call, to be named.
        self.gated = options["needs_approval"] is not None or bool(options["approvals"])
        self.approving = False  # the approved call is about to run: checkpoint it first
        self.guard = lifecycle.guard_of(
            task, options, history=partial(store.history, task.phase)
        )
        # The order of the guard's steps, as every driver keeps it (each tool's lookup is
        # given per call: it is the tool's own).
        self.seq = Sequencer(self.guard, inspect=self.agent.inspect)
        # What the last model call's calls came to, saved with the agent's memory: the two
        # go together (a model-planned agent answers its calls from it), in a new phase too.
        self.observation = _decode(checkpoint.get("observation"))

    # -- the loop -------------------------------------------------------------------------

    def drive(self) -> str:
        guard, agent, seq = self.guard, self.agent, self.seq
        reserved = False  # the next model call is already counted in the row
        if self.fresh and (rejected := guard.rejection()) is not None:
            self.observation = rejected  # a person said no: the model hears it first
            told = trace.event(
                EventKind.NOTE, tool=rejected.tool, detail=f"told the model: {rejected.message}"
            )
            self.pending.append(told)  # saved with the first step
        approved = guard.before_approved()  # a person said yes: that call runs first
        seq.approved(approved)
        if approved is not None:
            stopped = self._run_approved(approved)
            if stopped is not None:
                return self._finish(stopped)
            reserved = isinstance(approved, list)  # its step's save counted the next call
        while True:
            if not reserved:
                self._save(ahead=_NEXT_CALL)
            reserved = False
            try:
                reserve = self._reservation()
            except Exception as exc:
                return self._finish(seq.planner_failed(exc))
            stop = seq.model(reserve=reserve)
            if stop is not None:
                return self._finish(_in_money(stop, reserve))
            if reserve:
                # Money is reserved before it is spent: stored before the paid call goes out.
                self._save()
            started = time.monotonic()
            agent.usage_reset()
            failure: Exception | None = None
            try:
                proposal = agent.plan(self.observation)
            except Exception as exc:
                failure = exc
            cost = self._cost(reserve)
            try:  # a planner that failed after its model answered still spent the tokens
                if agent.tokens:
                    guard.spend_tokens(agent.tokens)
                if cost is not None:
                    guard.settle_spend(cost)
            except ValueError as exc:
                failure = failure or exc
            if failure is not None:
                detail = f"planner: {failure!r}"
                latency = _since(started)
                self._save(trace.model_event(None, latency, agent.tokens, guard.revision, detail))
                return self._finish(seq.planner_failed(failure))
            latency = _since(started)
            model_event = trace.model_event(proposal, latency, agent.tokens, guard.revision)
            if cost is not None:
                model_event["cost"] = cost
            admitted = seq.proposed(proposal)
            if isinstance(proposal, Finish):
                self._save(model_event)
                return self._finish(cast(Report, admitted))  # a finish ends in its report
            if isinstance(admitted, Report):
                self.observation = None  # none of its calls ran
                self._save(model_event, trace.blocked_event(admitted))
                return self._finish(admitted)
            if isinstance(admitted, Nudge):
                self.observation = admitted
                nudged = trace.nudge_event(admitted, guard.revision)
                self._save(model_event, nudged, checkpoint=True)
                continue
            self._hand_over(model_event, proposal, admitted, started)
            stopped = self._run(admitted, batch=not isinstance(proposal, Call))
            if stopped is not None:
                return self._finish(stopped)
            reserved = True  # the last step's save counted the next model call ahead

    def _run(
        self, admitted: list[Ticket], *, batch: bool, results: list[Result] | None = None
    ) -> Report | None:
        """The admitted calls of one model call (after ``results``, those of its calls that
        ran already), then the wait they asked for."""
        results = [] if results is None else results
        for index, ticket in enumerate(admitted):
            last = index == len(admitted) - 1
            stopped = self._step(ticket, results, last=last, batch=batch)
            if stopped is not None:
                return stopped
        pause = self.seq.pause()
        if isinstance(pause, Report):
            return pause
        if pause:
            waiting = trace.event(EventKind.WAIT, detail=f"waiting {pause:.0f} ms")
            self._save(waiting, ahead=_NEXT_CALL)
            self.stop.wait(pause)
        return None

    def _run_approved(self, admitted: list[Ticket] | Nudge | Report) -> Report | None:
        """The call a person approved, run as it was asked, before the model is asked
        again; its result is the model's next observation."""
        if isinstance(admitted, Report):
            return admitted
        if isinstance(admitted, Nudge):
            self.observation = admitted
            return None
        self.approving = True
        call = admitted[0].call
        note = trace.event(
            EventKind.NOTE,
            decision=Decision.PLANNED,
            tool=call.tool,
            operation_key=call.operation_key or "",
            detail=f"running the call a person approved: {call.tool}",
        )
        # Not waiting for the disk, as after a model call: the claim's commit flushes it.
        self._save(note, ahead=(0, 0, 1), durable=False)
        # The call was one of several the model asked for at once: its result follows
        # those of the calls before it that ran, as if the batch had gone on.
        before = self.observation if isinstance(self.observation, list) else None
        return self._run(admitted, batch=before is not None, results=before)

    def _reservation(self) -> int:
        """The next model call's maximum cost at the agent's model's price (0 unpriced)."""
        if self.price is None:
            return 0
        agent = self.agent
        return self.price.cost(agent.prompt_tokens(self.observation), agent.max_output_tokens)

    def _cost(self, reserve: int) -> int | None:
        """What the model call really cost: as the agent reports it, or from its token
        counts at the model's price; the reservation when it says neither; ``None`` for a
        call that is neither priced nor reported (nothing to settle)."""
        agent = self.agent
        if agent.cost is not None:
            return agent.cost
        if self.price is None:
            return None
        if agent.input_tokens is not None:
            return self.price.cost(agent.input_tokens, agent.output_tokens or 0)
        return reserve

    def _hand_over(
        self, model_event: dict[str, Any], proposal: Any, admitted: list[Ticket], started: float
    ) -> None:
        """Where the model call's event goes before its calls run (see the class's note)."""
        way = _carriage(
            proposal,
            admitted[0],
            one_ahead=self.one_ahead,
            tokens=self.agent.tokens,
            quick=time.monotonic() - started < QUICK_MODEL_CALL_S,
        )
        if way is _Carriage.CLAIM:
            # It rides on the claim, which reads the stop fact in its own transaction: the
            # stop fact read before the model call may stand, unless the guard may refuse
            # before claiming (then a stop recorded meanwhile must be seen, to be named as
            # the reason).
            self.pending.append(model_event)
            self.carried = self._step_of(tuple(self.pending), ahead=(0, 0, 1))
            self.ledger.carry = self.carried
            if self.gated or 0 in self.guard.remaining().values():
                self.stop.forget()
        elif way is _Carriage.READ:
            # A read: its event goes with the read's save. After a slow model call (a real
            # one) it is saved at once instead, so that the live trace shows what runs
            # while it runs; beside the model, that costs nothing.
            self.pending.append(model_event)
            self.stop.forget()  # ask again, just before the read starts
        else:
            # Not waiting for the disk here: what follows is either a claim, whose
            # synchronous commit flushes this save too before any write runs, or reads,
            # followed by their own synchronous save.
            self._save(model_event, ahead=(0, 0, len(admitted)), durable=False)

    def _step(
        self, ticket: Ticket, results: list[Result], *, last: bool, batch: bool
    ) -> Report | None:
        """One admitted call: claim, run, record. Returns the report if the task stops."""
        guard, seq, call = self.guard, self.seq, ticket.call
        tool = self.tools[call.tool]
        # Redacted once: for the operation's row (a write) and for the request's event.
        self.args_preview = preview(call.args)
        self.ledger.describe(call, self.args_preview)
        # A retry of a write settled NOT_COMMITTED asks the tool's lookup first (whatever
        # auto_lookup says: it can only stop the write, never settle it).
        # A reuse is reported by the sequencer with its entry.
        decision = seq.enter(ticket, lookup=tool.lookup)
        carried, self.carried, self.ledger.carry = self.carried, None, None
        if carried is not None and carried.saved is not None:
            self._saved(carried.saved)
        if decision.action is Action.STOP:
            report = decision.report
            if report is None:  # pragma: no cover - STOP always carries its report
                raise RuntimeError("a stop decision without a report")
            self.observation = list(results) if batch else None  # this call did not run
            self._save(self._request(ticket, Decision.BLOCKED, None, reason=report.reason))
            return report
        started = time.monotonic()
        outcome: Any = decision.result
        error: Exception | None = None
        executed = decision.action is Action.EXECUTE
        if self.approving:
            # The approval is used now: checkpointed before the call runs, so that a crash
            # while it runs never hands it over again (a write would meet its ledger entry;
            # a read would run twice).
            self.approving = False
            self._save(checkpoint=True)
        if executed:
            self.stop.forget()  # the tool may take a while: ask again afterwards
            try:
                outcome = tool.run(call)
            except Exception as exc:
                error = exc
        latency = time.monotonic() - started
        lookup = tool.lookup if self.agent.auto_lookup else None
        # The save below follows at once: a write's record may ride on it.
        self.ledger.defer = last
        try:
            if not executed:
                stop = decision.report
            elif error is not None:
                stop = seq.raised(ticket, error, lookup=lookup)
            else:
                stop = seq.returned(ticket, outcome, lookup=lookup)
        finally:
            self.ledger.defer = False
        if ticket.result is not None:
            results.append(ticket.result)
        # What this model call's calls came to so far, checkpointed with the agent's memory
        # by the save below, so that a crash mid-batch or a stop resumes with it: the calls
        # without a result did not run.
        self.observation = list(results) if batch else (results[0] if results else None)
        detail = "" if error is None else f"{type(error).__name__}: {error}"[:500]
        event = self._request(
            ticket,
            Decision.EXECUTED if executed else Decision.REUSED,
            latency,
            reason="" if stop is None else stop.reason,
            detail=detail,
        )
        # Going on: count the next model call now, and one request and execution of it,
        # sparing a save before it when it proposes one call.
        ahead = _NEXT_STEP if last and stop is None else _NOTHING
        saved = self._save(event, checkpoint=True, ahead=ahead, record=self.ledger.take_record())
        return _unrecorded(guard, stop, saved.record_failed or self.ledger.record_failed)

    # -- persistence ----------------------------------------------------------------------

    def _save(
        self,
        *events: dict[str, Any],
        checkpoint: bool = False,
        ahead: tuple[int, int, int] = _NOTHING,
        durable: bool = True,
        record: Record | None = None,
    ) -> Saved:
        """Persist counters (and the checkpoint, the pending events and ``events``) in one
        short transaction, with ``record`` (a write's) when there is one; ``ahead``: the
        model calls, requests and executions counted ahead.

        Conditional on still holding the lease: a driver that lost it stops here.
        ``durable=False`` lets the commit return before its WAL is flushed (PostgreSQL).
        """
        step = self._step_of(
            (*self.pending, *events), checkpoint=checkpoint, ahead=ahead, durable=durable
        )
        saved = self.store.save(step, record=record)
        self._saved(saved)
        self.one_ahead = ahead == _NEXT_STEP
        return saved

    def _step_of(
        self,
        events: tuple[dict[str, Any], ...],
        *,
        checkpoint: bool = False,
        ahead: tuple[int, int, int] = _NOTHING,
        durable: bool = True,
    ) -> Step:
        """The step so far as the store's value: counters (with what is counted ahead),
        the events and, if asked, the checkpoint."""
        usage = self.guard.usage.to_dict()
        usage["model_calls"] += ahead[0]
        usage["requests"] += ahead[1]
        usage["executions"] += ahead[2]
        saved = self._checkpoint() if checkpoint else None
        return Step(usage, self.guard.revision, events, saved, durable)

    def _saved(self, saved: Saved) -> None:
        """Take in what a save said: the pending events are stored, and the stop fact."""
        self.pending.clear()
        self.stop.take(saved)

    def _checkpoint(self) -> dict[str, Any]:
        return _checkpoint_of(self.task.phase, self.guard, self.agent, self.observation)

    def _finish(self, report: Report) -> str:
        """Record the guard's stop as the task's terminal state."""
        if self.heartbeat.lost:
            raise LeaseLost("the lease was lost before the stop could be recorded")
        if self.ledger.unavailable is not None:
            # A step failed on the database: that is no verdict on the task. Record nothing;
            # recovery settles what was in flight and resumes from the last checkpoint.
            failed = self.ledger.unavailable
            raise DatabaseError(f"the ledger failed ({failed}); left to recovery") from failed
        if report.reason is Reason.OPERATOR_STOP and not self.stop.asked(again=True):
            # The guard stopped because the stop fact could not be read, not because an
            # operator asked: record nothing and let recovery resume the task.
            raise DatabaseError("stopped on an unreadable stop fact; leaving it to recovery")
        prompt, reserve = self._summary_turn()
        # The summary turn's reservation is stored with the stop, in its transaction: it is
        # spent before the call goes out, and a resumption meanwhile cannot lose it.
        usage = self.guard.usage if prompt is not None else None
        self.store.finish(
            report, checkpoint=self._checkpoint(), usage=usage, summary_due=prompt is not None
        )
        if prompt is not None:
            self._summarise(prompt, reserve)
        return f"{report.state}/{report.reason}"

    def _summary_turn(self) -> tuple[str | None, int]:
        """The summary turn's prompt and reservation, if the agent takes one after this stop
        (never after an operator asked to stop, whatever the stop's own reason)."""
        if not self.agent.summary_turn or self.stop.asked(again=True):
            return None, 0
        try:
            reserve = self._reservation()
        except Exception:
            logger.exception("task %s: no summary turn, its cost cannot be estimated", self.task.id)
            return None, 0
        return self.guard.summary_turn(reserve=reserve), reserve

    def _summarise(self, prompt: str, reserve: int) -> None:
        """The summary turn, after the stop is recorded: one model call with no tools,
        its text added to the stop report. A crash during it leaves the stop as it was
        (and the reservation, stored with it, spent)."""
        guard, agent = self.guard, self.agent
        started = time.monotonic()
        agent.usage_reset()
        try:
            reply = agent.summarise(prompt, self.observation)
        except Exception as exc:
            logger.exception("task %s: the summary turn failed", self.task.id)
            reply = f"(the summary turn failed: {type(exc).__name__})"
        cost = self._cost(reserve)
        try:
            report = guard.record_summary(reply, tokens=agent.tokens, cost=cost)
        except ValueError as exc:  # the agent reported usage that is not a count
            cost = reserve if self.price is not None else None
            report = guard.record_summary(f"(the summary turn failed: {exc})", cost=cost)
        event = trace.event(
            EventKind.MODEL_CALL,
            decision=Decision.FINISHED,
            latency_ms=_since(started),
            tokens=agent.tokens or None,
            cost=cost,
            revision=report.revision,
            detail="summary: " + (report.summary or "")[:480],
        )
        lifecycle.add_summary(self.task.id, self.task.phase, report, event)

    def _request(self, ticket: Ticket, decision: str, latency: float | None, **why: str) -> Any:
        """The trace event of ``ticket``'s request, as it stands now."""
        return trace.request_event(
            ticket,
            decision,
            latency,
            args_preview=self.args_preview,
            revision=self.guard.revision,
            **why,
        )


class _StopFact:
    """Has this task been asked to stop? The runner's one place for its stop fact
    (:meth:`asked`), which is also the guard's cancel signal.

    The fact is read back by every save (:meth:`take`, ``Saved.stop_requested``); when time
    has passed since (the model thought, a tool ran), the driver :meth:`forget`\\ s it and
    it is asked again. A lost lease (the heartbeat's) counts as a stop: this driver may not
    start anything more. If the database cannot be asked, nothing may start: the answer is
    "stop", and the driver leaves the task to recovery. A write's claim reads the fact in
    its own statement and answers the guard itself (``ClaimStatus.STOPPING``): a stop
    recorded after the last look is refused there, and the guard stops ``operator_stop``.
    """

    def __init__(self, task: Task, store: StepStore, heartbeat: _Heartbeat) -> None:
        self.task_id = task.id
        self.store = store
        self.heartbeat = heartbeat
        self.seen: bool | None = task.stop_requested_at is not None

    def take(self, saved: Saved) -> None:
        self.seen = saved.stop_requested

    def forget(self) -> None:
        self.seen = None

    def asked(self, *, again: bool = False) -> bool:
        """Whether the task was asked to stop (or this driver lost its lease).

        ``again``: ask the database now, whatever was seen, about the fact alone, as the
        end of a drive records it; a fact that cannot be read raises ``DatabaseError`` then
        (no verdict is recorded on it) instead of answering "stop"."""
        if again:
            self.seen = None
        elif self.heartbeat.lost:
            return True
        if self.seen is None:
            try:
                self.seen = self.store.stop_requested()
            except DatabaseError:
                if again:
                    raise
                logger.exception("task %s: cannot read its stop fact", self.task_id)
                return True
        return self.seen

    def wait(self, ms: float) -> None:
        """Wait for a RETRYABLE/PENDING result, waking within ``STOP_POLL_S`` for a stop."""
        end = time.monotonic() + ms / 1000.0
        while True:
            self.seen = None
            left = end - time.monotonic()
            if left <= 0 or self.asked():
                return
            time.sleep(min(left, STOP_POLL_S))


# -- the driver's decisions and values, apart from its loop ----------------------------------


class _Carriage(Enum):
    """Where a model call's event goes before its calls run."""

    CLAIM = "rides on the write's claim"
    READ = "goes with the read's save"
    NOW = "saved at once, not waiting for the disk"


def _carriage(
    proposal: Any, first: Ticket, *, one_ahead: bool, tokens: int, quick: bool
) -> _Carriage:
    """When the last save counted this model call, one request and its execution ahead,
    a one-call proposal's event can wait for the next statement, unless the step spent
    what was not counted ahead (tokens, a poll); a read's waits only after a quick model
    call."""
    if not one_ahead or not isinstance(proposal, Call) or tokens or first.poll:
        return _Carriage.NOW
    if proposal.effect == "write":
        return _Carriage.CLAIM
    return _Carriage.READ if quick else _Carriage.NOW


def _in_money(stop: Report, reserve: int) -> Report:
    """A spend stop's detail as people read money (the guard knows no currency)."""
    if stop.reason is not Reason.SPEND_BUDGET:
        return stop
    left = stop.remaining.get("spend")
    return replace(
        stop, detail=f"the next model call may cost {money(reserve)}; {money(left)} left"
    )


def _unrecorded(guard: Guard, stop: Report | None, failed: LedgerError | None) -> Report | None:
    """``stop``, unless a verified write's record ``failed``: the write ran and inspect saw
    it commit, but meanwhile its operation was settled by someone else (its lease had run
    out), which ends the task ``NEEDS_HUMAN``/``unknown_commit`` as when a record fails."""
    if failed is None or (stop is not None and stop.reason is Reason.UNKNOWN_COMMIT):
        return stop
    detail = f"ledger: {failed!r}"
    if stop is None:
        return guard.halt(State.NEEDS_HUMAN, Reason.UNKNOWN_COMMIT, detail)
    return replace(stop, state=State.NEEDS_HUMAN, reason=Reason.UNKNOWN_COMMIT, detail=detail)


def _transient(error: BaseException) -> bool:
    """An error after which a write may run again once its lookup proved it did not happen:
    a lost connection or a timeout, the database's own included (a cut connection, a
    restart, a serialization failure)."""
    return transient_error(error) or isinstance(error, (OperationalError, InterfaceError))


def _approvals_for(task: Task) -> list[Approval]:
    """The answers people gave to the call that stopped the phase before this one: they
    are this phase's to use, once. An approved call is handed over whole when its stored
    (redacted) arguments are still the exact call; when the redaction changed them, the
    model asks for it again and only that exact call matches."""
    if task.phase < 2:
        return []
    rows = ApprovalRow.objects.filter(task_id=task.id, phase=task.phase - 1).exclude(
        state=ApprovalState.PENDING
    )
    answers: list[Approval] = []
    for row in rows:
        # A rejection that ended the task still binds a later resumption: the model is
        # told, and asking for that call again ends the task again.
        approved = row.state == ApprovalState.APPROVED
        key = row.operation_key or None
        effect: Effect = "write" if row.effect == "write" else "read"
        call = Call(row.tool, row.args, effect, key)
        try:
            exact = fingerprint(row.tool, row.args) == row.fingerprint
        except Exception:
            exact = False
        answers.append(
            Approval(
                row.fingerprint,
                key,
                approved,
                call=call if exact else None,
                reason=row.reason,
                tool=row.tool,
            )
        )
    return answers


def _checkpoint_of(phase: int, guard: Guard, agent: Agent, observation: Any) -> dict[str, Any]:
    """What a restart of ``phase`` resumes from. What grows with the phase stays out (the
    trace holds it, ``StepStore.history`` rebuilds it), so that a step's cost does not
    grow with the phase's length.

    Secrets stay out (invariant 10): the agent's memory (a model's conversation quotes tool
    results) and the last observation are stored redacted, as the trace and the ledger store
    them; a resumed agent reads them as a re-requested committed write reads its stored
    result. An agent's credentials come from its configuration, never from its memory. The
    guard's part is counters, fingerprints and operation keys, kept exact: it holds nothing
    a tool returned or a person typed, and loop detection needs it unchanged.
    """
    return {
        "phase": phase,
        "guard": guard.checkpoint(history=False),
        "agent": redact(agent.memory),
        "observation": redact(_encode(observation)),
    }


def _since(started: float) -> int:
    """Whole milliseconds since ``started`` (``time.monotonic()``)."""
    return trace.ms(time.monotonic() - started)


def _monotonic_ms() -> float:
    return time.monotonic() * 1000.0


def _encode(observation: Any) -> Any:
    """The observation as JSON-ready data for the checkpoint."""
    if observation is None:
        return None
    if isinstance(observation, Result):
        return {"result": observation.to_dict()}
    if isinstance(observation, Nudge):
        return {
            "nudge": {
                "message": observation.message,
                "tool": observation.tool,
                "fingerprint": observation.fingerprint,
                "reason": observation.reason.value,
            }
        }
    if isinstance(observation, list):
        return {"results": [item.to_dict() for item in observation]}
    raise TypeError(f"cannot checkpoint an observation of type {type(observation).__name__}")


def _decode(raw: Any) -> Any:
    if not isinstance(raw, dict):
        return None
    if "result" in raw:
        return Result.from_dict(raw["result"])
    if "results" in raw:
        return [Result.from_dict(item) for item in raw["results"]]
    if "nudge" in raw:
        nudge = raw["nudge"]
        return Nudge(nudge["message"], nudge["tool"], nudge["fingerprint"], Reason(nudge["reason"]))
    return None
