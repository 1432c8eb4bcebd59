"""The runner: drives the guard step by step for one task, persisting every step.

One driver per task, guaranteed by a lease (owner, expiry, heartbeat) taken with a
conditional update: a redelivered Celery message, a duplicate enqueue or a second worker
finds the lease held, or the task finished, and does nothing. Every step is saved
(trace events, counters, checkpoint) before the next one starts, so a crash loses at most
the step in progress, and the recovery sweep turns that step's in-flight write, if any,
into ``UNKNOWN`` instead of running it again.

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
from collections.abc import Callable, Mapping
from contextlib import nullcontext
from dataclasses import replace
from datetime import timedelta
from functools import cache, partial
from typing import Any

from django.conf import settings
from django.db import DatabaseError, close_old_connections, connection, transaction
from django.db.models import F
from django.utils import timezone

from guard import (
    COMPLETED_KEPT,
    Action,
    Call,
    Finish,
    Guard,
    Kind,
    Limits,
    Nudge,
    Reason,
    Report,
    Result,
    State,
    Ticket,
    Usage,
)

from .agents import Agent, Tool, agent_class
from .ledger import DatabaseLedger, LeaseLost, entry_of
from .logs import task_context
from .models import (
    Decision,
    EventKind,
    Operation,
    OperationEvent,
    OperationState,
    Phase,
    StopReport,
    Task,
    TaskState,
    TraceEvent,
)
from .redaction import preview, redact, redact_text
from .statements import fetch_one

logger = logging.getLogger(__name__)

STOP_POLL_S = 0.2  # how often a waiting driver looks for a stop: well under a second
QUICK_MODEL_CALL_S = 0.05  # a model call this quick has its event saved with its read


def lease_seconds() -> float:
    return float(settings.LOOPGUARD_LEASE_SECONDS)


def new_owner() -> str:
    """A lease owner name that says where the driver runs."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def limits_of(task: Task) -> Limits:
    """The task's cumulative limits as the guard's value."""
    raw = dict(task.limits)
    raw["exempt"] = frozenset(raw.get("exempt", ()))
    return Limits(**raw)


def usage_of(task: Task) -> Usage:
    return Usage(
        model_calls=task.model_calls,
        requests=task.requests,
        executions=task.executions,
        tokens=task.tokens,
        polls=task.polls,
        elapsed_ms=task.elapsed_ms,
    )


def _counters(usage: Usage, revision: int) -> dict[str, int]:
    return {**usage.to_dict(), "revision": revision}


# -- finishing a task ------------------------------------------------------------------------


def report_from_task(task: Task, state: str, reason: str, detail: str = "") -> Report:
    """A stop report for a task stopped outside the guard (before it ran, or by recovery)."""
    limits = limits_of(task)
    operations = tuple(entry_of(op) for op in task.operations.order_by("claimed_at", "id"))
    remaining = limits.remaining(usage_of(task))
    return Report(
        state=State(state),
        reason=Reason(reason) if reason in Reason else Reason.OPERATOR_STOP,
        model_calls=task.model_calls,
        requests=task.requests,
        executions=task.executions,
        revision=task.revision,
        operations=operations,
        tokens=task.tokens,
        polls=task.polls,
        elapsed_ms=task.elapsed_ms,
        remaining=remaining,
        detail=detail,
    )


def finish_task(
    task: Task,
    state: str,
    reason: str,
    report: dict[str, Any],
    *,
    detail: str = "",
    counters: Mapping[str, int] | None = None,
    checkpoint: Any = None,
) -> None:
    """Record a terminal state with its stop report. Call inside a transaction holding
    the task row; the caller has checked that the task may make this transition."""
    now = timezone.now()
    detail = redact_text(detail)  # error messages may quote credentials
    report = redact(report)
    fields: dict[str, Any] = {
        "state": state,
        "reason": reason,
        "detail": detail[:2000],
        "finished_at": now,
        "updated_at": now,
        "lease_owner": "",
        "lease_expires_at": None,
        **(counters or {}),
    }
    if checkpoint is not None:
        fields["checkpoint"] = checkpoint
    Task.objects.filter(id=task.id).update(**fields)
    Phase.objects.filter(task_id=task.id, number=task.phase).update(
        ended_at=now, state=state, reason=reason
    )
    StopReport.objects.create(
        task_id=task.id, phase=task.phase, state=state, reason=reason, report=report
    )
    seq = _take_seq(task.id, 1)
    TraceEvent.objects.create(
        task_id=task.id,
        phase=task.phase,
        seq=seq,
        kind=EventKind.STOP,
        decision="",
        reason=reason,
        detail=f"{state}" + (f": {detail}" if detail else ""),
    )
    logger.info("task %s stopped %s/%s %s", task.id, state, reason, detail)


def _take_seq(task_id: int, count: int) -> int:
    """Reserve ``count`` trace sequence numbers; returns the first. Inside a transaction."""
    Task.objects.filter(id=task_id).update(next_seq=F("next_seq") + count)
    last = Task.objects.filter(id=task_id).values_list("next_seq", flat=True).get()
    return int(last) - count


def recover(task: Task, *, why: str) -> bool:
    """A driver of ``task`` is gone. Settle what it left behind; True if the task may go on.

    Its ``IN_FLIGHT`` operations become ``UNKNOWN``: they may or may not have happened and
    are never run again. Call inside a transaction holding the task row.
    """
    stranded = list(
        Operation.objects.select_for_update()
        .filter(task_id=task.id, state=OperationState.IN_FLIGHT)
        .order_by("id")
    )
    now = timezone.now()
    for op in stranded:
        Operation.objects.filter(id=op.id).update(state=OperationState.UNKNOWN, updated_at=now)
        OperationEvent.objects.create(
            operation=op,
            from_state=OperationState.IN_FLIGHT,
            to_state=OperationState.UNKNOWN,
            task_id=task.id,
            evidence=f"recovery: {why}",
        )
    task.recoveries += 1
    Task.objects.filter(id=task.id).update(recoveries=F("recoveries") + 1)
    logger.warning("task %s recovered (%s): %d write(s) now UNKNOWN", task.id, why, len(stranded))
    if stranded:
        keys = ", ".join(op.key for op in stranded)
        detail = f"{why}; in flight when it stopped: {keys}"
        report = report_from_task(task, State.NEEDS_HUMAN, Reason.UNKNOWN_COMMIT, detail)
        finish_task(task, State.NEEDS_HUMAN, Reason.UNKNOWN_COMMIT, report.to_dict(), detail=detail)
        return False
    if task.stop_requested_at is not None:
        report = report_from_task(task, State.CANCELLED, Reason.OPERATOR_STOP, why)
        finish_task(task, State.CANCELLED, Reason.OPERATOR_STOP, report.to_dict(), detail=why)
        return False
    if task.recoveries > settings.LOOPGUARD_MAX_RECOVERIES:
        detail = f"{why}; the driver was lost {task.recoveries} times"
        report = report_from_task(task, State.FAILED, Reason.EXECUTOR_ERROR, detail)
        finish_task(task, State.FAILED, Reason.EXECUTOR_ERROR, report.to_dict(), detail=detail)
        return False
    return True


def sweep(enqueue: Callable[[int], None]) -> dict[str, int]:
    """Recover tasks whose driver's lease ran out; re-enqueue queued tasks nobody took.

    Run periodically (Celery beat). Safe to run on several machines at once: each task is
    handled under its row lock, skipping rows another sweep or driver holds.
    """
    now = timezone.now()
    counts = {"recovered": 0, "resumed": 0, "requeued": 0}
    expired = Task.objects.filter(state=TaskState.RUNNING, lease_expires_at__lt=now)
    for task_id in expired.values_list("id", flat=True)[:500]:
        with task_context(task_id), transaction.atomic():
            task = (
                Task.objects.select_for_update(skip_locked=True)
                .filter(id=task_id, state=TaskState.RUNNING, lease_expires_at__lt=timezone.now())
                .first()
            )
            if task is None:
                continue
            counts["recovered"] += 1
            if recover(task, why="lease expired"):
                Task.objects.filter(id=task.id).update(
                    state=TaskState.QUEUED, lease_owner="", lease_expires_at=None, updated_at=now
                )
                transaction.on_commit(partial(enqueue, task.id))
                counts["resumed"] += 1
    # A queued task whose message was lost (a broker restart) is enqueued again; a
    # duplicate message is harmless, the lease lets only one driver in.
    stale = now - timedelta(seconds=settings.LOOPGUARD_REQUEUE_AFTER_SECONDS)
    queued = Task.objects.filter(state=TaskState.QUEUED, updated_at__lt=stale)
    for task_id in queued.values_list("id", flat=True)[:500]:
        Task.objects.filter(id=task_id, state=TaskState.QUEUED).update(updated_at=now)
        enqueue(task_id)
        counts["requeued"] += 1
    return counts


# -- the driver ------------------------------------------------------------------------------


def drive(task_id: int, *, owner: str | None = None) -> str:
    """Drive one task until the guard stops it, or return at once if it is not ours to drive.

    Returns a short description of what happened, for the worker's log.
    """
    with task_context(task_id):  # every log line of this run says task=<id>
        return _drive(task_id, owner or new_owner())


def _drive(task_id: int, owner: str) -> str:
    acquired = _acquire(task_id, owner)
    if isinstance(acquired, str):
        logger.info("task %s: %s", task_id, acquired)
        return acquired
    heartbeat = _Heartbeat(task_id, owner)
    heartbeat.start()
    try:
        return _Driver(acquired, owner, heartbeat).drive()
    except LeaseLost as exc:
        logger.warning("task %s: lease lost, leaving it to its new driver (%s)", task_id, exc)
        return f"lease lost: {exc}"
    finally:
        heartbeat.halt()


def _acquire(task_id: int, owner: str) -> Task | str:
    """Take the task's lease, or say why not. Settles a previous driver's leftovers first."""
    with transaction.atomic():
        task = Task.objects.select_for_update().filter(id=task_id).first()
        if task is None:
            return "no such task"
        if task.state not in (TaskState.QUEUED, TaskState.RUNNING):
            return f"nothing to do: the task is {task.state}"
        now = timezone.now()
        if task.lease_owner and task.lease_expires_at and task.lease_expires_at > now:
            return f"lease held by {task.lease_owner}"
        if task.state == TaskState.RUNNING and not recover(task, why="driver lost"):
            return "recovered: the task stopped"
        if task.stop_requested_at is not None:
            report = report_from_task(task, State.CANCELLED, Reason.OPERATOR_STOP)
            finish_task(task, State.CANCELLED, Reason.OPERATOR_STOP, report.to_dict())
            return "stopped before it ran"
        task.state = TaskState.RUNNING
        task.lease_owner = owner
        task.lease_expires_at = now + timedelta(seconds=lease_seconds())
        task.updated_at = now
        task.save(update_fields=["state", "lease_owner", "lease_expires_at", "updated_at"])
        Phase.objects.filter(task_id=task.id, number=task.phase, started_at=None).update(
            started_at=now
        )
    return task


class _Heartbeat(threading.Thread):
    """Keeps the lease alive while the driver works; notices when it is lost."""

    def __init__(self, task_id: int, owner: str) -> None:
        super().__init__(name=f"lease-{task_id}", daemon=True)
        self.task_id = task_id
        self.owner = owner
        self.lost = False
        self._halt = threading.Event()

    def run(self) -> None:
        interval = lease_seconds() / 3
        deadline = time.monotonic() + lease_seconds()
        try:
            while not self._halt.wait(interval):
                try:
                    renewed = Task.objects.filter(
                        id=self.task_id, lease_owner=self.owner, state=TaskState.RUNNING
                    ).update(lease_expires_at=timezone.now() + timedelta(seconds=lease_seconds()))
                except DatabaseError:
                    close_old_connections()
                    if time.monotonic() > deadline:  # it has expired by now
                        self.lost = True
                        return
                    continue
                if renewed != 1:
                    self.lost = True
                    return
                deadline = time.monotonic() + lease_seconds()
        finally:
            connection.close()

    def halt(self) -> None:
        self._halt.set()
        self.join(timeout=5)


# The step's counters in one statement, conditional on the lease; it also reads back the
# stop fact, so that the check before the next model call or execution costs nothing
# extra. Raw SQL with a fixed text: it runs several times a step.
_SAVE = """
UPDATE console_task SET model_calls = %s, requests = %s, executions = %s, tokens = %s,
    polls = %s, elapsed_ms = %s, revision = %s, next_seq = %s, last_step_at = %s{checkpoint}
WHERE id = %s AND lease_owner = %s AND state = 'RUNNING'{asynchronous}
RETURNING stop_requested_at, lease_owner
"""
_STOP_FACT = "SELECT stop_requested_at FROM console_task WHERE id = %s"
# A save whose transaction commits without waiting for its WAL to reach the disk (only
# this transaction: the setting is local to it). PostgreSQL writes WAL in order, so the
# next synchronous commit (every claim, every save after a tool) makes it durable too;
# see _Driver for which saves may use it.
_ASYNCHRONOUS = "\n    AND set_config('synchronous_commit', 'off', true) IS NOT NULL"

# Trace event columns with their types: a VALUES list needs them spelt out where a value
# may be NULL.
_EVENT_COLUMNS = (
    ("task_id", "bigint"),
    ("phase", "integer"),
    ("seq", "bigint"),
    ("at", "timestamptz"),
    ("kind", "text"),
    ("decision", "text"),
    ("reason", "text"),
    ("tool", "text"),
    ("fingerprint", "text"),
    ("args_preview", "text"),
    ("result_kind", "text"),
    ("result_preview", "text"),
    ("revision", "bigint"),
    ("operation_key", "text"),
    ("latency_ms", "integer"),
    ("tokens", "integer"),
    ("detail", "text"),
)
_EVENT_ROW = "(" + ", ".join(f"%s::{kind}" for _, kind in _EVENT_COLUMNS) + ")"
_EVENT_NAMES = ", ".join(name for name, _ in _EVENT_COLUMNS)


@cache
def save_ctes(events: int, checkpoint: bool, durable: bool) -> str:
    """PostgreSQL: a save as CTEs, ``saved`` (the counters' UPDATE, returning the stop fact
    and the lease owner) feeding ``added`` (the ``events`` trace events' INSERT), so both
    happen or neither does, and a lost lease inserts nothing. Built from the constants
    above only; every value is a parameter. A handful of texts, each prepared once.
    """
    save = _SAVE.format(
        checkpoint=", checkpoint = %s" if checkpoint else "",
        asynchronous="" if durable else _ASYNCHRONOUS,
    ).strip()
    values = ", ".join([_EVENT_ROW] * events)
    return (
        f"saved AS ({save}), added AS ("  # noqa: S608
        f"INSERT INTO console_traceevent ({_EVENT_NAMES}) "
        f"SELECT v.* FROM (VALUES {values}) AS v ({_EVENT_NAMES}) CROSS JOIN saved)"
    )


@cache
def _save_sql(events: int, checkpoint: bool, durable: bool, postgresql: bool) -> str:
    """The text of a save: counters (and checkpoint), then ``events`` trace events."""
    if events and postgresql:
        return f"WITH {save_ctes(events, checkpoint, durable)} SELECT * FROM saved"  # noqa: S608
    return _SAVE.format(
        checkpoint=", checkpoint = %s" if checkpoint else "",
        asynchronous="" if durable or not postgresql else _ASYNCHRONOUS,
    ).strip()


@cache
def _save_with_record_sql(record_ctes: str, events: int, checkpoint: bool) -> str:
    """A save that also makes a write's record (``console.ledger.MOVE_CTES``); its
    third column says whether the record was made."""
    return (
        f"WITH {record_ctes}, {save_ctes(events, checkpoint, True)} "  # noqa: S608
        "SELECT saved.stop_requested_at, saved.lease_owner, (SELECT count(*) FROM moved) "
        "FROM saved"
    )


_NUMERIC = frozenset({"task_id", "phase", "seq", "at", "revision", "latency_ms", "tokens"})


def _event_row(task_id: int, phase: int, seq: int, event: Mapping[str, Any]) -> list[Any]:
    """One trace event as a VALUES row of a save (``_save_sql``)."""
    given = {"task_id": task_id, "phase": phase, "seq": seq, **event}
    return [
        given.get(name) if name in _NUMERIC else str(given.get(name) or "")
        for name, _ in _EVENT_COLUMNS
    ]


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

    def __init__(self, task: Task, owner: str, heartbeat: _Heartbeat) -> None:
        self.task = task
        self.owner = owner
        self.heartbeat = heartbeat
        self.next_seq = task.next_seq
        self.stop_seen: bool | None = task.stop_requested_at is not None
        self.postgresql = connection.vendor == "postgresql"
        self.pending: list[dict[str, Any]] = []  # events waiting for the next save
        self.one_ahead = False  # the row counts the next model call, request, execution
        checkpoint = task.checkpoint if isinstance(task.checkpoint, dict) else {}
        same_phase = checkpoint.get("phase") == task.phase
        self.agent: Agent = agent_class(task.agent)(
            task.id, task.input, dict(checkpoint.get("agent") or {})
        )
        self.tools: dict[str, Tool] = {tool.name: tool for tool in self.agent.tools()}
        self.ledger = DatabaseLedger(task_id=task.id, owner=owner)
        options: dict[str, Any] = {
            "now": _monotonic_ms,
            "wait": self._wait,
            "ledger": self.ledger,
            "cancel": self._stop_requested,
            "nudge": self.agent.nudge,
            "tools": {name: tool.effect for name, tool in self.tools.items()},
        }
        limits = limits_of(task)
        if same_phase and "guard" in checkpoint:
            # The same phase after a crash or redelivery: go on with the detectors' memory.
            # The counters come from the row, which is never behind the checkpoint.
            saved = dict(checkpoint["guard"])
            saved["usage"] = usage_of(task).to_dict()
            saved.update(_trace_history(task))
            self.guard = Guard.restore(saved, limits, **options)
        else:
            # A new phase: budgets carry over, repeat memory starts afresh.
            self.guard = Guard(limits, used=usage_of(task), revision=task.revision, **options)
        # What the last model call's calls came to, saved with the agent's memory: the two
        # go together (a model-planned agent answers its calls from it), in a new phase too.
        self.observation = _decode(checkpoint.get("observation"))

    # -- the loop -------------------------------------------------------------------------

    def drive(self) -> str:
        guard, agent = self.guard, self.agent
        reserved = False  # the next model call is already counted in the row
        while True:
            if not reserved:
                self._save(model_calls_ahead=1)
            reserved = False
            stop = guard.before_model()
            if stop is not None:
                return self._finish(stop)
            started = time.monotonic()
            agent.tokens = 0
            failure: Exception | None = None
            try:
                proposal = agent.plan(self.observation)
            except Exception as exc:
                failure = exc
            try:  # a planner that failed after its model answered still spent the tokens
                if agent.tokens:
                    guard.spend_tokens(agent.tokens)
            except ValueError as exc:
                failure = failure or exc
            if failure is not None:
                self._save(self._model_event(None, started, detail=f"planner: {failure!r}"))
                return self._finish(guard.planner_failed(failure))
            model_event = self._model_event(proposal, started)
            if isinstance(proposal, Finish):
                report = guard.finish(proposal, agent.inspect)
                self._save(model_event)
                return self._finish(report)
            admitted = guard.before_tools(proposal)
            if isinstance(admitted, Report):
                self.observation = None  # none of its calls ran
                self._save(model_event, self._blocked_event(admitted))
                return self._finish(admitted)
            if isinstance(admitted, Nudge):
                self.observation = admitted
                self._save(model_event, self._nudge_event(admitted), checkpoint=True)
                continue
            # When the last save counted this model call, one request and its execution
            # ahead, a one-call proposal's event can wait for the next statement, unless
            # the step spent what was not counted ahead (tokens, a poll).
            one = proposal if self.one_ahead and isinstance(proposal, Call) else None
            if one is not None and (agent.tokens or admitted[0].poll):
                one = None
            if one is not None and one.effect == "write" and self.postgresql:
                # It rides on the claim, which reads the stop fact in its own
                # transaction: the stop fact read before the model call may stand,
                # unless the guard may refuse before claiming (then a stop recorded
                # meanwhile must be seen, to be named as the reason).
                self.pending.append(model_event)
                self.ledger.carry(*self._carried_save(executions_ahead=1))
                if 0 in guard.remaining().values():
                    self.stop_seen = None
            elif one is not None and time.monotonic() - started < QUICK_MODEL_CALL_S:
                # A read: its event goes with the read's save. After a slow model call
                # (a real one) it is saved at once instead, so that the live trace
                # shows what runs while it runs; beside the model, that costs nothing.
                self.pending.append(model_event)
                self.stop_seen = None  # ask again, just before the read starts
            else:
                # Not waiting for the disk here: what follows is either a claim, whose
                # synchronous commit flushes this save too before any write runs, or
                # reads, followed by their own synchronous save.
                self._save(model_event, executions_ahead=len(admitted), durable=False)
            results: list[Result] = []
            for index, ticket in enumerate(admitted):
                last = index == len(admitted) - 1
                batch = not isinstance(proposal, Call)
                stopped = self._step(ticket, results, last=last, batch=batch)
                if stopped is not None:
                    return self._finish(stopped)
            reserved = True  # the last step's save counted the next model call ahead
            pause = guard.before_wait()
            if isinstance(pause, Report):
                return self._finish(pause)
            if pause:
                wait_event = self._event(EventKind.WAIT, detail=f"waiting {pause:.0f} ms")
                self._save(wait_event, model_calls_ahead=1)
                self._wait(pause)

    def _step(
        self, ticket: Ticket, results: list[Result], *, last: bool, batch: bool
    ) -> Report | None:
        """One admitted call: claim, run, record. Returns the report if the task stops."""
        guard, call = self.guard, ticket.call
        tool = self.tools[call.tool]
        self.ledger.describe(call)
        decision = guard.before_tool(ticket)
        if self.pending and (saved := self.ledger.carried()) is not None:
            self._saved(saved, len(self.pending))
        if decision.action is Action.STOP:
            report = decision.report
            if report is None:  # pragma: no cover - STOP always carries its report
                raise RuntimeError("a stop decision without a report")
            self.observation = list(results) if batch else None  # this call did not run
            self._save(self._request_event(ticket, Decision.BLOCKED, None, reason=report.reason))
            return report
        started = time.monotonic()
        outcome: Any = decision.result
        error: Exception | None = None
        if decision.action is Action.EXECUTE:
            self.stop_seen = None  # the tool may take a while: ask again afterwards
            try:
                outcome = tool.run(call)
            except Exception as exc:
                error = exc
        latency = time.monotonic() - started
        lookup = tool.lookup if self.agent.auto_lookup else None
        # The save below follows at once: a write's record may ride on it.
        self.ledger.defer_record = last and self.postgresql
        try:
            stop = guard.after_tool(
                ticket, outcome, error=error, inspect=self.agent.inspect, lookup=lookup
            )
        finally:
            self.ledger.defer_record = False
        if ticket.result is not None:
            results.append(ticket.result)
        # What this model call's calls came to so far, checkpointed with the agent's memory
        # by the save below, so that a crash mid-batch or a stop resumes with it: the calls
        # without a result did not run.
        self.observation = list(results) if batch else (results[0] if results else None)
        executed = decision.action is Action.EXECUTE
        detail = "" if error is None else f"{type(error).__name__}: {error}"[:500]
        self._save(
            self._request_event(
                ticket,
                Decision.EXECUTED if executed else Decision.REUSED,
                latency,
                reason="" if stop is None else stop.reason,
                detail=detail,
            ),
            checkpoint=True,
            # Going on: count the next model call now, and one request and execution of
            # it, sparing a save before it when it proposes one call.
            model_calls_ahead=1 if last and stop is None else 0,
            requests_ahead=1 if last and stop is None else 0,
            executions_ahead=1 if last and stop is None else 0,
            record=self.ledger.take_deferred(),
        )
        failed = self.ledger.record_failed
        if failed is not None and (stop is None or stop.reason is not Reason.UNKNOWN_COMMIT):
            # The write ran and inspect saw it commit, but meanwhile its operation was
            # settled by someone else (its lease had run out): as when a record fails.
            detail = f"ledger: {failed!r}"
            if stop is None:
                return guard.halt(State.NEEDS_HUMAN, Reason.UNKNOWN_COMMIT, detail)
            return replace(
                stop, state=State.NEEDS_HUMAN, reason=Reason.UNKNOWN_COMMIT, detail=detail
            )
        return stop

    # -- persistence ----------------------------------------------------------------------

    def _save(
        self,
        *events: dict[str, Any],
        checkpoint: bool = False,
        model_calls_ahead: int = 0,
        requests_ahead: int = 0,
        executions_ahead: int = 0,
        durable: bool = True,
        record: tuple[str, list[Any]] | None = None,
    ) -> None:
        """Persist counters (and the checkpoint, the pending events and ``events``) in one
        short transaction.

        Conditional on still holding the lease: a driver that lost it stops here.
        ``durable=False`` lets the commit return before its WAL is flushed (PostgreSQL).
        ``record``: the ledger's deferred record (``take_deferred``), made in the same
        statement.
        """
        events = (*self.pending, *events)
        params = self._save_params(
            len(events),
            checkpoint=checkpoint,
            model_calls_ahead=model_calls_ahead,
            requests_ahead=requests_ahead,
            executions_ahead=executions_ahead,
        )
        if not self.postgresql:
            # SQLite (standalone mode): the same in a transaction, the events by the ORM.
            with transaction.atomic() if events else nullcontext():
                row = fetch_one(_save_sql(len(events), checkpoint, durable, False), params)
                if row is not None and events:
                    TraceEvent.objects.bulk_create(
                        TraceEvent(task_id=self.task.id, phase=self.task.phase, seq=seq, **e)
                        for seq, e in enumerate(events, start=self.next_seq)
                    )
        elif record is None:
            sql = _save_sql(len(events), checkpoint, durable, True)
            row = fetch_one(sql, [*params, *self._event_rows(events)])
        else:
            ctes, record_params = record
            sql = _save_with_record_sql(ctes, len(events), checkpoint)
            try:
                row = fetch_one(sql, [*record_params, *params, *self._event_rows(events)])
            except DatabaseError:
                # The write ran and was verified: try to record it on its own, so that
                # recovery finds it COMMITTED rather than turning it UNKNOWN.
                self.ledger.rescue_deferred()
                raise
            self.ledger.deferred_done(row is not None and row[2] > 0)
        self._saved(row, len(events))
        self.one_ahead = (model_calls_ahead, requests_ahead, executions_ahead) == (1, 1, 1)

    def _carried_save(self, *, executions_ahead: int) -> tuple[str, list[Any]]:
        """The pending events and the counters as a save for the next claim to carry."""
        events = tuple(self.pending)
        params = self._save_params(len(events), executions_ahead=executions_ahead)
        return save_ctes(len(events), False, True), [*params, *self._event_rows(events)]

    def _save_params(
        self,
        events: int,
        *,
        checkpoint: bool = False,
        model_calls_ahead: int = 0,
        requests_ahead: int = 0,
        executions_ahead: int = 0,
    ) -> list[Any]:
        """The parameters of a save's UPDATE: counters, checkpoint, then the lease."""
        guard = self.guard
        usage = guard.usage
        params: list[Any] = [
            usage.model_calls + model_calls_ahead,
            usage.requests + requests_ahead,
            usage.executions + executions_ahead,
            usage.tokens,
            usage.polls,
            usage.elapsed_ms,
            guard.revision,
            self.next_seq + events,
            # As the ORM stores it: SQLite keeps times as text and compares them as text.
            connection.ops.adapt_datetimefield_value(timezone.now()),
        ]
        if checkpoint:
            params.append(_CHECKPOINT_FIELD.get_db_prep_save(self._checkpoint(), connection))
        return [*params, self.task.id, self.owner]

    def _event_rows(self, events: tuple[dict[str, Any], ...]) -> list[Any]:
        """The parameters of a save's trace events (PostgreSQL), numbered from ``next_seq``."""
        rows: list[Any] = []
        for i, event in enumerate(events):
            rows += _event_row(self.task.id, self.task.phase, self.next_seq + i, event)
        return rows

    def _saved(self, row: tuple[Any, ...] | None, events: int) -> None:
        """Take in what a save returned: the stop fact, or that the lease is gone."""
        if row is None:
            raise LeaseLost(f"task {self.task.id} is no longer driven by {self.owner}")
        self.next_seq += events
        self.pending.clear()
        self.stop_seen = row[0] is not None

    def _checkpoint(self) -> dict[str, Any]:
        guard = self.guard.checkpoint()
        for name in _FROM_TRACE:
            del guard[name]
        return {
            "phase": self.task.phase,
            "guard": guard,
            "agent": self.agent.memory,
            "observation": _encode(self.observation),
        }

    def _finish(self, report: Report) -> str:
        """Record the guard's stop as the task's terminal state."""
        if self.heartbeat.lost:
            raise LeaseLost("the lease was lost before the stop could be recorded")
        if self.ledger.unavailable is not None:
            # A step failed on the database: that is no verdict on the task. Record nothing;
            # recovery settles what was in flight and resumes from the last checkpoint.
            raise DatabaseError(f"the ledger failed ({self.ledger.unavailable}); left to recovery")
        if (
            report.reason is Reason.OPERATOR_STOP
            and not Task.objects.filter(id=self.task.id, stop_requested_at__isnull=False).exists()
        ):
            # The guard stopped because the stop fact could not be read, not because an
            # operator asked: record nothing and let recovery resume the task.
            raise DatabaseError("stopped on an unreadable stop fact; leaving it to recovery")
        with transaction.atomic():
            task = (
                Task.objects.select_for_update()
                .filter(id=self.task.id, lease_owner=self.owner, state=TaskState.RUNNING)
                .first()
            )
            if task is None:
                raise LeaseLost(f"task {self.task.id} is no longer driven by {self.owner}")
            finish_task(
                task,
                report.state.value,
                report.reason.value,
                report.to_dict(),
                detail=report.detail,
                counters=_counters(report.usage, report.revision),
                checkpoint=self._checkpoint(),
            )
        return f"{report.state}/{report.reason}"

    # -- signals --------------------------------------------------------------------------

    def _stop_requested(self) -> bool:
        """The guard's cancel signal: the stop fact in the database, or a lost lease.

        The fact is read back by every save; when time has passed since (the model
        thought, a tool ran), it is asked again. If the database cannot be asked, nothing
        may start: the answer is "stop", and the driver leaves the task to recovery.
        """
        if self.heartbeat.lost or self.ledger.stop_recorded:
            return True
        if self.stop_seen is None:
            try:
                row = fetch_one(_STOP_FACT, [self.task.id])
                self.stop_seen = row is None or row[0] is not None
            except DatabaseError:
                logger.exception("task %s: cannot read its stop fact", self.task.id)
                return True
        return self.stop_seen

    def _wait(self, ms: float) -> None:
        """Wait for a RETRYABLE/PENDING result, waking within ``STOP_POLL_S`` for a stop."""
        end = time.monotonic() + ms / 1000.0
        while True:
            self.stop_seen = None
            left = end - time.monotonic()
            if left <= 0 or self._stop_requested():
                return
            time.sleep(min(left, STOP_POLL_S))

    # -- events ---------------------------------------------------------------------------

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        detail = fields.get("detail")
        if detail:
            fields["detail"] = redact_text(detail)  # error messages may quote credentials
        return {"kind": kind, "at": timezone.now(), **fields}

    def _model_event(self, proposal: Any, started: float, *, detail: str = "") -> dict[str, Any]:
        if isinstance(proposal, Finish):
            decision, summary = Decision.FINISHED, "finish: " + preview(proposal.answer, 500)
        elif proposal is None:
            decision, summary = Decision.BLOCKED, detail
        else:
            calls = proposal if isinstance(proposal, list | tuple) else [proposal]
            names = ", ".join(str(getattr(c, "tool", "?")) for c in calls)
            decision, summary = Decision.PLANNED, f"{len(calls)} call(s): {names}"[:500]
        return self._event(
            EventKind.MODEL_CALL,
            decision=decision,
            latency_ms=_ms(time.monotonic() - started),
            tokens=self.agent.tokens or None,
            revision=self.guard.revision,
            detail=summary,
        )

    def _request_event(
        self,
        ticket: Ticket,
        decision: str,
        latency: float | None,
        *,
        reason: str = "",
        detail: str = "",
    ) -> dict[str, Any]:
        call, result = ticket.call, ticket.result
        return self._event(
            EventKind.REQUEST,
            decision=decision,
            reason=reason,
            tool=call.tool,
            fingerprint=ticket.fingerprint,
            args_preview=preview(call.args),
            result_kind="" if result is None else str(result.kind),
            result_preview="" if result is None else preview(result.data),
            revision=self.guard.revision,
            operation_key=call.operation_key or "",
            latency_ms=None if latency is None else _ms(latency),
            detail=detail,
        )

    def _blocked_event(self, report: Report) -> dict[str, Any]:
        about = report.call or {}
        return self._event(
            EventKind.REQUEST,
            decision=Decision.BLOCKED,
            reason=report.reason,
            tool=str(about.get("tool") or "")[:200],
            fingerprint=str(about.get("fingerprint") or ""),
            operation_key=str(about.get("operation_key") or "")[:200],
            revision=report.revision,
            detail=report.detail[:2000],
        )

    def _nudge_event(self, nudge: Nudge) -> dict[str, Any]:
        return self._event(
            EventKind.REQUEST,
            decision=Decision.NUDGED,
            reason=nudge.reason,
            tool=nudge.tool,
            fingerprint=nudge.fingerprint,
            revision=self.guard.revision,
            detail=nudge.message,
        )


_CHECKPOINT_FIELD = Task._meta.get_field("checkpoint")

# Parts of the guard's checkpoint left out of the stored one: they grow with the phase
# (every operation key it touched, its latest completed requests), so saving them with
# every step would make a step's cost grow with the phase's length, and the phase's trace
# events hold them already. _trace_history rebuilds them when a phase resumes.
_FROM_TRACE = ("touched", "completed")


def _trace_history(task: Task) -> dict[str, list[Any]]:
    """The guard's ``touched`` and ``completed`` for the task's phase, from its trace.

    ``touched``: the operation keys its requests named, in first-seen order (one that was
    never claimed has no ledger entry, so the stop report cannot list it). ``completed``:
    the latest ``COMPLETED_KEPT`` requests that executed or reused a successful result.
    """
    requests = (
        TraceEvent.objects.filter(task_id=task.id, phase=task.phase, kind=EventKind.REQUEST)
        .order_by("seq")
        .values_list(
            "tool", "fingerprint", "operation_key", "decision", "reason", "result_kind", "revision"
        )
    )
    touched: dict[str, None] = {}
    completed: list[list[Any]] = []
    for tool, fp, key, decision, reason, kind, revision in requests.iterator():
        ran = decision in (Decision.EXECUTED, Decision.REUSED)
        if key and (ran or reason in _MET_THE_LEDGER):
            touched.setdefault(key, None)
        if ran and kind == Kind.SUCCESS and reason in _COMPLETED_THEN:
            completed.append([tool, fp, key or None, decision == Decision.REUSED, revision or 0])
    return {"touched": list(touched), "completed": completed[-COMPLETED_KEPT:]}


# A request blocked for these reasons had its key looked up in the ledger first.
_MET_THE_LEDGER = frozenset(
    {Reason.OPERATION_CONFLICT, Reason.OPERATION_IN_FLIGHT, Reason.UNKNOWN_COMMIT}
)
# A successful request counts as completed unless it stopped the task before the guard
# could count it (its evidence was refused, its commit could not be settled).
_COMPLETED_THEN = frozenset({"", Reason.GOAL_MET, Reason.NO_PROGRESS, Reason.INVALID_WAIT})


def _ms(seconds: float) -> int:
    return max(0, round(seconds * 1000))


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
