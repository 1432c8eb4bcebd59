"""What the console stores: tasks, phases, trace events, operations, stop reports, audit.

Everything here is history and is only ever added to: trace events, operation transitions,
stop reports and audit entries are append-only (a database trigger refuses UPDATE and
DELETE on them, see migration 0002). A task changes state only through
``console.lifecycle`` and an operation only as ``guard.steps.OPERATION_MOVES`` allows, as
conditional updates.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import datetime, timedelta
from pathlib import PurePath
from typing import Any, NamedTuple

from django.conf import settings
from django.db import models
from django.db.models import F, Q
from django.utils import timezone

from guard import OperationState as GuardOperationState
from guard import Reason as GuardReason
from guard import State as GuardState
from guard.steps import OPERATION_MOVES

RESTART_LOOP = "restart_loop"
CLIENT_LOST = "client_lost"
"""The console's reason for an attached task whose client did not come back within
``LOOPGUARD_ATTACHED_CLIENT_LOST_SECONDS`` of its lease lapsing (not one of the guard's)."""
APPROVAL_REQUIRED = GuardReason.APPROVAL_REQUIRED.value


class TaskState(models.TextChoices):
    QUEUED = "QUEUED", "queued"
    RUNNING = "RUNNING", "running"
    COMPLETED = GuardState.COMPLETED.value, "completed"
    PARTIAL = GuardState.PARTIAL.value, "partial"
    FAILED = GuardState.FAILED.value, "failed"
    NEEDS_HUMAN = GuardState.NEEDS_HUMAN.value, "needs human"
    CANCELLED = GuardState.CANCELLED.value, "cancelled"


TERMINAL_STATES = frozenset(s.value for s in GuardState)
ACTIVE_STATES = frozenset({TaskState.QUEUED.value, TaskState.RUNNING.value})
RESUMABLE_STATES = frozenset(TERMINAL_STATES - {TaskState.COMPLETED.value})
"""The states an approved resumption may open a new phase from: stopped short of the goal."""
STOP_REASONS = (*(r.value for r in GuardReason), RESTART_LOOP, CLIENT_LOST)


class TaskMove(NamedTuple):
    """One move of a task's state (:data:`TASK_MOVES`)."""

    sources: frozenset[str]
    """The states it may leave."""
    targets: frozenset[str]
    """The states it may reach."""
    stopped_for: frozenset[str] | None = None
    """Leaving a stopped (terminal) state, the stop reasons it may leave it for (``None``:
    any). A task queued or running has no reason."""

    def leaves(self, state: str, reason: str) -> bool:
        """Whether a task in ``state``, stopped for ``reason``, may make this move."""
        if state not in self.sources:
            return False
        if state not in TERMINAL_STATES or self.stopped_for is None:
            return True
        return reason in self.stopped_for


TASK_MOVES: Mapping[str, TaskMove] = {
    # A driver takes a queued task (the first start, a resumption, a requeue).
    "start": TaskMove(frozenset({TaskState.QUEUED}), frozenset({TaskState.RUNNING})),
    # A driver takes over a running task whose driver's lease ran out (after recovery).
    "take_over": TaskMove(frozenset({TaskState.RUNNING}), frozenset({TaskState.RUNNING})),
    # An operator asks a running task to stop: its driver ends it.
    "request_stop": TaskMove(frozenset({TaskState.RUNNING}), frozenset({TaskState.RUNNING})),
    # A driver records the guard's stop, or recovery a lost driver's end.
    "finish": TaskMove(frozenset({TaskState.RUNNING}), frozenset(TERMINAL_STATES)),
    # The same goal keeps being started: held for a person before it runs.
    "hold": TaskMove(frozenset({TaskState.QUEUED}), frozenset({TaskState.NEEDS_HUMAN})),
    # An operator stops a task before it ever ran: queued, or held for a restart loop. A
    # task that has stopped for any other reason stays as it stopped (terminal is sticky).
    "cancel": TaskMove(
        frozenset({TaskState.QUEUED, TaskState.NEEDS_HUMAN}),
        frozenset({TaskState.CANCELLED}),
        stopped_for=frozenset({RESTART_LOOP}),
    ),
    # An approved resumption opens a new phase (a held call's answer too).
    "resume": TaskMove(RESUMABLE_STATES, frozenset({TaskState.QUEUED})),
    # Recovery hands a running task whose driver is gone back to the queue.
    "requeue": TaskMove(frozenset({TaskState.RUNNING}), frozenset({TaskState.QUEUED})),
    # A person rejects the call a stopped task waits for, and ends the task.
    "close": TaskMove(
        frozenset({TaskState.NEEDS_HUMAN}),
        frozenset({TaskState.PARTIAL}),
        stopped_for=frozenset({APPROVAL_REQUIRED}),
    ),
    # An attached task whose client did not come back in time (queued again after its
    # lease lapsed, or running still when no sweep ran meanwhile) waits for a person.
    "lose_client": TaskMove(
        frozenset({TaskState.QUEUED, TaskState.RUNNING}), frozenset({TaskState.NEEDS_HUMAN})
    ),
}
"""Every move a task may make: name -> (states it may leave, states it may reach, and the
stop reasons it may leave a stopped state for). ``console.lifecycle`` makes the moves;
:meth:`Task.allows` (and so ``can_stop``, ``can_cancel``, ``can_resume``) reads them here."""


class OperationState(models.TextChoices):
    IN_FLIGHT = GuardOperationState.IN_FLIGHT.value, "in flight"
    UNKNOWN = GuardOperationState.UNKNOWN.value, "unknown"
    COMMITTED = GuardOperationState.COMMITTED.value, "committed"
    NOT_COMMITTED = GuardOperationState.NOT_COMMITTED.value, "not committed"


UNSETTLED_STATES = frozenset(
    state.value
    for move in ("settle_committed", "settle_not_committed")
    for state in OPERATION_MOVES[move][0]
    if state is not None
)
"""The operation states trusted evidence settles (a person, a lookup): the write may or may
not have happened, and its task may not go on until it is settled."""


class Percentile(models.Aggregate):
    """PostgreSQL's ``percentile_cont(fraction) WITHIN GROUP (ORDER BY expression)``: the
    step latency chart's p50 and p95 (``console.rollups``, ``console.selectors``)."""

    function = "percentile_cont"
    template = "%(function)s(%(fraction)s) WITHIN GROUP (ORDER BY %(expressions)s)"
    output_field = models.FloatField()

    def __init__(self, expression: str, fraction: float) -> None:
        # The fraction is written into the SQL: only ever one of our own float constants.
        super().__init__(expression, fraction=repr(float(fraction)))


@models.CharField.register_lookup
class OneOf(models.Lookup):
    """``field__one_of=words``: the field holds one of a fixed set of words (a state, a
    reason, a kind). For CHECK constraints on rows written every step.

    PostgreSQL rebuilds a table's CHECK expressions from their stored form for every
    statement that writes a row. ``state IN ('a', 'b', …)`` stores one constant and one
    cast per word: the task's three such checks cost about 45 µs of server CPU per UPDATE
    of its row, several times a step (``benchmarks/statement_ceiling.py``). The same test
    as one ``text[]`` literal is one constant: ``state = ANY('{a,b,…}'::text[])``.
    Elsewhere (SQLite) it is the usual ``IN``.
    """

    lookup_name = "one_of"
    prepare_rhs = False  # a list of words, not a value of the field

    def as_sql(self, compiler: Any, connection: Any) -> tuple[str, tuple[Any, ...]]:
        lhs, params = self.process_lhs(compiler, connection)
        words = sorted(self.rhs)  # sorted: stable migrations
        if not all(_WORD.fullmatch(word) for word in words):
            raise ValueError(f"one_of takes plain words, not {words!r}")
        if connection.vendor == "postgresql":
            literal = ",".join(f'"{word}"' for word in words)
            return f"{lhs} = ANY('{{{literal}}}'::text[])", tuple(params)
        return f"{lhs} IN ({', '.join(['%s'] * len(words))})", (*params, *words)


_WORD = re.compile(r"[A-Za-z0-9_]*")


def _in(field: str, values: Any) -> Q:
    return Q(**{f"{field}__one_of": sorted(values)})  # sorted: stable migrations


def lease_alive(at: datetime, *, via: str = "") -> Q:
    """Tasks whose lease is alive at ``at``: a lease is an owner and an expiry, alive while
    it names its owner and its expiry is after ``at`` (``via``: the path to the task,
    ``"task__"`` from an operation). Only a driver that holds a live lease may drive the
    task; a lease that is not alive is nobody's (its driver is lost, or there is none).

    The one rule of a lease's life, in two forms kept side by side: this one for queries,
    :meth:`Task.lease_alive_until` for a row already loaded (``tests/console/test_models.py``
    holds them to the same answers). A running task whose lease is not alive is
    :func:`lease_lapsed`."""
    return ~Q(**{f"{via}lease_owner": ""}) & Q(**{f"{via}lease_expires_at__gt": at})


def lease_lapsed(before: datetime) -> Q:
    """Running tasks whose driver's lease was not alive any more at ``before`` (it ran out
    then or earlier): their driver is lost (served by the partial index
    ``task_running_lease``). Of running tasks with a lease, exactly those that are not
    :func:`lease_alive` at ``before``."""
    return Q(state=TaskState.RUNNING, lease_expires_at__lte=before)


def waiting_for_client(lapsed_before: datetime) -> Q:
    """Attached tasks waiting for their client: not stopped, and the client's lease lapsed
    by ``lapsed_before`` — running still (:func:`lease_lapsed`: the sweep has not recovered
    it yet) or queued again (it has: ``lifecycle.requeue`` keeps an attached task's lapsed
    expiry). The list's filter asks with now, the sweep's client-lost rule with now less the
    time a client may stay away; :attr:`Task.waiting_for_client_since` is the same rule for
    one task.

    One arm per state, each served by its partial index (``task_running_lease``,
    ``task_waiting_client``)."""
    return ~Q(client="") & (
        Q(state=TaskState.QUEUED, lease_expires_at__lte=lapsed_before) | lease_lapsed(lapsed_before)
    )


class Task(models.Model):
    """One user goal given to one agent, with its budgets, spent counters and lease."""

    agent = models.CharField(max_length=100)
    client = models.CharField(max_length=200, blank=True)
    """What drives an attached task over the step protocol (``console.drivers.attached``); blank
    for a hosted task, which the console's workers drive."""
    tools = models.JSONField(default=dict, blank=True)
    """An attached task's declared tools, name → ``"read"``/``"write"`` (a hosted agent's
    come from its class)."""
    approval_tools = models.JSONField(default=list, blank=True, db_default=[])
    """The names of an attached task's declared tools whose every call waits for a person's
    approval (the protocol's ``approval``); empty for a hosted task, whose agent says it."""
    input = models.JSONField(default=dict, blank=True)
    input_fingerprint = models.CharField(max_length=64)
    state = models.CharField(max_length=20, choices=TaskState, default=TaskState.QUEUED)
    reason = models.CharField(max_length=40, blank=True)
    detail = models.TextField(blank=True)
    limits = models.JSONField(default=dict)

    # Spent so far, cumulative across phases, restarts and redeliveries.
    model_calls = models.PositiveIntegerField(default=0)
    requests = models.PositiveIntegerField(default=0)
    executions = models.PositiveIntegerField(default=0)
    tokens = models.PositiveBigIntegerField(default=0)
    spend = models.PositiveBigIntegerField(default=0)  # in the minor unit of LOOPGUARD_CURRENCY
    explored = models.PositiveIntegerField(default=0)  # new results counted as progress
    polls = models.PositiveIntegerField(default=0)
    elapsed_ms = models.PositiveBigIntegerField(default=0)
    revision = models.BigIntegerField(default=0)

    phase = models.PositiveIntegerField(default=1)
    checkpoint = models.JSONField(null=True, blank=True)
    next_seq = models.PositiveBigIntegerField(default=1)
    recoveries = models.PositiveIntegerField(default=0)

    lease_owner = models.CharField(max_length=200, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)

    stop_requested_at = models.DateTimeField(null=True, blank=True)
    stop_requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    stop_note = models.TextField(blank=True)

    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)
    """When the task last changed state or was acted on (indexed: the dashboard's queues)."""
    last_step_at = models.DateTimeField(null=True, blank=True)
    """When its driver last saved a step. Not indexed on purpose: saved several times a
    step, a change to an unindexed column lets PostgreSQL update the row in place (HOT)."""
    finished_at = models.DateTimeField(null=True, blank=True)
    trace_archive = models.ForeignKey(
        "TraceArchive",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="tasks",
        db_index=False,  # looked up from the task, never the other way on a hot path
    )
    """Where its trace went when its partition was archived (``manage.py archive``);
    ``None`` while the trace is in the database (never archived, or restored)."""
    rolled = models.BooleanField(default=False, db_default=False)
    """Its state and spent counters are in :class:`TaskTotal` (``console.rollups``): set by
    beat a while after it stopped, taken back out (and cleared) before anything changes a
    rolled task (``console.lifecycle``). ``/metrics`` adds the tasks not rolled to the totals."""

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=_in("state", TaskState.values), name="task_state_valid"
            ),
            models.CheckConstraint(
                condition=Q(reason="") | _in("reason", STOP_REASONS), name="task_reason_valid"
            ),
            # A terminal task has a reason; a queued or running one has none.
            models.CheckConstraint(
                condition=(_in("state", ACTIVE_STATES) & Q(reason=""))
                | (_in("state", TERMINAL_STATES) & ~Q(reason="")),
                name="task_reason_matches_state",
            ),
        ]
        indexes = [
            # Task list, newest first, optionally by state.
            # The same order as the list (created_at, then id): no sort step.
            models.Index(fields=["-created_at", "-id"], name="task_created"),
            models.Index(fields=["state", "-created_at", "-id"], name="task_state_created"),
            models.Index(fields=["agent", "-created_at", "-id"], name="task_agent_created"),
            # The list filtered by state and agent both, and its count up to 10,000: each
            # index above alone leaves a heap read per task of the other's (migration 0023).
            models.Index(
                fields=["state", "agent", "-created_at", "-id"], name="task_state_agent_created"
            ),
            # Dashboard "recently stopped" and its counts of what finished lately.
            models.Index(
                fields=["-finished_at", "state"],
                condition=Q(finished_at__isnull=False) & ~Q(state="NEEDS_HUMAN"),
                name="task_recently_stopped",
            ),
            # The dashboard's stops by reason and per hour (selectors.trends) over a week of
            # stops: read from the index alone, where the two partial indexes fetched every
            # stopped task's row for its reason (a seq scan at a million tasks).
            models.Index(
                fields=["finished_at"],
                include=["state", "reason", "updated_at"],
                condition=Q(finished_at__isnull=False),
                name="task_stopped",
            ),
            # Dashboard "needs a human now", oldest first.
            models.Index(
                fields=["updated_at"], condition=Q(state="NEEDS_HUMAN"), name="task_needs_human"
            ),
            # Recovery sweep: running tasks whose lease ran out.
            models.Index(
                fields=["lease_expires_at"], condition=Q(state="RUNNING"), name="task_running_lease"
            ),
            # The sweep's client-lost rule and the list's "waiting for its client": attached
            # tasks queued again after their client's lease lapsed (few, and rarely written).
            models.Index(
                fields=["lease_expires_at"],
                condition=Q(state="QUEUED") & ~Q(client=""),
                name="task_waiting_client",
            ),
            # The task list's agent filter: the names attached clients gave their tasks.
            models.Index(fields=["agent"], condition=~Q(client=""), name="task_attached_agent"),
            # Restart-loop detection: the same agent and input inside a window.
            models.Index(fields=["agent", "input_fingerprint", "created_at"], name="task_restarts"),
            # /metrics' tasks not in TaskTotal yet, and beat's next ones to roll: the queued,
            # the running, the lately stopped and the resumed, however many tasks there are.
            models.Index(fields=["id"], condition=Q(rolled=False), name="task_unrolled"),
        ]

    def __str__(self) -> str:
        return f"task {self.pk} ({self.agent}, {self.state})"

    @property
    def is_attached(self) -> bool:
        """Its own client drives it over the step protocol, not the console's workers."""
        return bool(self.client)

    @property
    def is_terminal(self) -> bool:
        return self.state in TERMINAL_STATES

    def lease_alive_until(self, at: datetime) -> datetime | None:
        """When its lease runs out, if that lease is alive at ``at``; else ``None``.
        :func:`lease_alive` for this row as loaded: the lease names its owner, and its
        expiry is after ``at``."""
        expires = self.lease_expires_at
        alive = bool(self.lease_owner) and expires is not None and expires > at
        return expires if alive else None

    @property
    def waiting_for_client_since(self) -> datetime | None:
        """When its client's lease lapsed, for an attached task that has not stopped and
        whose client has not come back since; else ``None`` (:func:`waiting_for_client`)."""
        expires = self.lease_expires_at
        if not self.client or self.state not in ACTIVE_STATES or expires is None:
            return None
        return expires if expires <= timezone.now() else None

    @property
    def client_lost_at(self) -> datetime | None:
        """When the sweep stops it ``NEEDS_HUMAN``/``client_lost`` if its client is still
        not back (while it waits for its client); else ``None``."""
        since = self.waiting_for_client_since
        if since is None:
            return None
        return since + timedelta(seconds=settings.LOOPGUARD_ATTACHED_CLIENT_LOST_SECONDS)

    def allows(self, move: str) -> bool:
        """Whether :data:`TASK_MOVES` lets it make ``move`` as it stands (its state, and the
        reason it stopped for)."""
        return TASK_MOVES[move].leaves(self.state, self.reason)

    @property
    def can_stop(self) -> bool:
        """An operator may stop it: it is queued (``cancel``: it ends at once) or running
        (``request_stop``: its driver ends it), and no stop is recorded yet."""
        if self.is_terminal or self.stop_requested_at is not None:
            return False
        return self.allows("request_stop") or self.allows("cancel")

    @property
    def can_cancel(self) -> bool:
        """An operator may cancel it before it ever ran: it stopped already, but only to be
        held (``cancel`` from a stopped state: a restart loop)."""
        return self.is_terminal and self.allows("cancel")

    @property
    def can_resume(self) -> bool:
        """An approver may open a new phase (``resume``): it stopped short of its goal (not
        completed), and not for a held call, which its approval's answer resumes; and its
        trace is in the database (an archived one is restored first: the new phase's events
        would have no range of their own, and the range could not be restored after them).

        Whether a write is still uncertain is a question for its operations, asked apart.
        """
        return self._stopped_short and self.trace_archive_id is None

    @property
    def resumes_once_restored(self) -> bool:
        """It would be resumable (:attr:`can_resume`) but for its archived trace: an approver
        restores it first. A completed task's archive is no such obstacle."""
        return self._stopped_short and self.trace_archive_id is not None

    @property
    def _stopped_short(self) -> bool:
        return self.allows("resume") and not self.waits_for_approval

    @property
    def waits_for_approval(self) -> bool:
        """It stopped for a call a person must approve or reject (the approval queue): a
        rejection may ``close`` it."""
        return self.allows("close")


class Phase(models.Model):
    """One stretch of execution: the first start, then each approved resumption."""

    task = models.ForeignKey(Task, on_delete=models.PROTECT, related_name="phases")
    number = models.PositiveIntegerField()
    started_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    state = models.CharField(max_length=20, blank=True)
    reason = models.CharField(max_length=40, blank=True)
    approved_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    approval_note = models.TextField(blank=True)
    grant = models.JSONField(default=dict, blank=True)
    usage_at_start = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["task", "number"], name="phase_number_unique"),
        ]

    def __str__(self) -> str:
        return f"phase {self.number} of task {self.task_id}"


class EventKind(models.TextChoices):
    MODEL_CALL = "model_call", "model call"
    REQUEST = "request", "tool request"
    WAIT = "wait", "wait"
    STOP = "stop", "stop"
    NOTE = "note", "note"


class Decision(models.TextChoices):
    PLANNED = "planned", "planned"
    FINISHED = "finished", "finished"
    EXECUTED = "executed", "executed"
    REUSED = "reused", "reused"
    BLOCKED = "blocked", "blocked"
    NUDGED = "nudged", "nudged"
    NOT_RUN = "not_run", "not run"


class TraceEvent(models.Model):
    """One model call or tool request of a task, in order (``seq``), redacted."""

    # No index of its own: the (task, seq) unique constraint below leads with it.
    task = models.ForeignKey(Task, on_delete=models.PROTECT, related_name="events", db_index=False)
    phase = models.PositiveIntegerField()
    seq = models.PositiveBigIntegerField()
    at = models.DateTimeField(default=timezone.now)
    kind = models.CharField(max_length=20, choices=EventKind)
    decision = models.CharField(max_length=20, choices=Decision, blank=True)
    reason = models.CharField(max_length=40, blank=True)
    tool = models.CharField(max_length=200, blank=True)
    fingerprint = models.CharField(max_length=64, blank=True)
    args_preview = models.TextField(blank=True)
    result_kind = models.CharField(max_length=20, blank=True)
    result_preview = models.TextField(blank=True)
    revision = models.BigIntegerField(null=True, blank=True)
    operation_key = models.CharField(max_length=200, blank=True)
    latency_ms = models.PositiveIntegerField(null=True, blank=True)
    tokens = models.PositiveIntegerField(null=True, blank=True)
    cost = models.PositiveBigIntegerField(null=True, blank=True)
    """A model call's spend, in the minor unit of ``LOOPGUARD_CURRENCY`` (the dashboard's
    spend today and this week sum it, over ``trace_spend``)."""
    detail = models.TextField(blank=True)

    class Meta:
        constraints = [
            # Also the index for "the trace of a task, in order" and "events after seq N".
            models.UniqueConstraint(fields=["task", "seq"], name="trace_task_seq"),
            models.CheckConstraint(
                condition=_in("kind", EventKind.values), name="trace_kind_valid"
            ),
        ]
        indexes = [
            # The dashboard's spend today and this week, summed from the index alone: the
            # BRIN index on ``at`` read every block of the week's trace (~40k at 10M events)
            # for a column of one event in two. Only priced model calls have a cost.
            models.Index(
                fields=["at"],
                include=["cost"],
                condition=Q(cost__isnull=False),
                name="trace_spend",
            ),
            # The step latency chart (24 h) and /metrics' latency histogram (1 h), likewise.
            models.Index(
                fields=["at"],
                include=["latency_ms", "kind"],
                condition=Q(latency_ms__isnull=False),
                name="trace_latency",
            ),
        ]

    def __str__(self) -> str:
        return f"task {self.task_id} #{self.seq} {self.kind} {self.tool}".rstrip()


class TraceArchive(models.Model):
    """One partition of the trace written to a file, checked against the database, and then
    dropped from it (``manage.py archive``; ``manage.py restore_archive`` brings it back).

    The file is ``path`` (compressed JSON lines, one row each) beside its manifest; a task
    whose trace it holds points at it (``Task.trace_archive``) until it is restored."""

    partition = models.CharField(max_length=63)  # PostgreSQL's longest name
    low = models.BigIntegerField(null=True, blank=True)
    """The lowest task id of its range (``None``: every id below ``high``)."""
    high = models.BigIntegerField()
    """The first task id above its range."""
    path = models.TextField()
    sha256 = models.CharField(max_length=64)
    rows = models.PositiveBigIntegerField()
    first_id = models.BigIntegerField(null=True, blank=True)
    last_id = models.BigIntegerField(null=True, blank=True)
    archived_at = models.DateTimeField(default=timezone.now)
    restored_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            # A range is out of the database at most once at a time.
            models.UniqueConstraint(
                fields=["partition"],
                condition=Q(restored_at__isnull=True),
                name="trace_archive_one_out",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.partition} ({self.rows} rows) in {self.path}"

    @property
    def file_name(self) -> str:
        """The archive's file, without its folder."""
        return PurePath(self.path).name

    @property
    def manifest_path(self) -> str:
        """Its manifest, beside the file: what ``restore_archive`` is given."""
        return self.path.removesuffix(".jsonl.gz") + ".manifest.json"


class Operation(models.Model):
    """A ledger entry: one business action of a write tool, keyed by its operation key."""

    key = models.CharField(max_length=200)  # unique: see Meta (the claim's ON CONFLICT)
    fingerprint = models.CharField(max_length=64)
    state = models.CharField(max_length=20, choices=OperationState)
    tool = models.CharField(max_length=200)
    task = models.ForeignKey(Task, on_delete=models.PROTECT, related_name="operations")
    args_preview = models.TextField(blank=True)
    result = models.JSONField(null=True, blank=True)
    attempts = models.PositiveIntegerField(default=1)
    evidence = models.TextField(blank=True)
    claimed_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=_in("state", OperationState.values), name="operation_state_valid"
            ),
            # The ledger's one row per business action. A constraint, not unique=True: the
            # field would also get a varchar_pattern_ops index for LIKE, which no query uses
            # and every claim would pay for.
            models.UniqueConstraint(fields=["key"], name="operation_key_unique"),
        ]
        indexes = [
            # The reconciliation queue's hint: the same call committed under another key.
            models.Index(fields=["fingerprint"], name="operation_fingerprint"),
            # Reconciliation queue: uncertain operations, oldest first.
            models.Index(
                fields=["updated_at"],
                condition=Q(state__in=["UNKNOWN", "IN_FLIGHT"]),
                name="operation_unsettled",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.key} ({self.state})"


class OperationEvent(models.Model):
    """One state transition of an operation, with who or what caused it (append-only)."""

    operation = models.ForeignKey(Operation, on_delete=models.PROTECT, related_name="history")
    at = models.DateTimeField(default=timezone.now)
    from_state = models.CharField(max_length=20, blank=True)
    to_state = models.CharField(max_length=20)
    task = models.ForeignKey(Task, null=True, on_delete=models.PROTECT, related_name="+")
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    evidence = models.TextField(blank=True)

    def __str__(self) -> str:
        return f"{self.operation_id}: {self.from_state or '-'} → {self.to_state}"


class StopReport(models.Model):
    """The guard's stop report at the end of a phase (append-only)."""

    task = models.ForeignKey(Task, on_delete=models.PROTECT, related_name="stop_reports")
    phase = models.PositiveIntegerField()
    at = models.DateTimeField(default=timezone.now)
    state = models.CharField(max_length=20)
    reason = models.CharField(max_length=40)
    report = models.JSONField()

    class Meta:
        # Usually one per phase; a task held before it ran (restart_loop) and then
        # cancelled has two for its first phase: the hold, then the stop.
        indexes = [
            models.Index(fields=["task", "-phase", "-id"], name="stop_report_task_latest"),
            # /metrics' stops by state and reason: an index-only scan instead of reading
            # every report's JSON on each scrape.
            models.Index(fields=["state", "reason"], name="stop_report_state_reason"),
            # /metrics' stops since the last ones beat counted (Rollup.stops): index-only.
            models.Index(fields=["at"], include=["state", "reason"], name="stop_report_at"),
        ]

    def __str__(self) -> str:
        return f"task {self.task_id} phase {self.phase}: {self.state}/{self.reason}"


class StepRequest(models.Model):
    """One answered request of an attached task's step protocol, kept so that a retried
    request (the same ``request_id``) gets the same answer and never a second claim: it is
    written in the transaction of the step it answers."""

    task = models.ForeignKey(Task, on_delete=models.PROTECT, related_name="+")
    request_id = models.CharField(max_length=100)
    step = models.CharField(max_length=20)
    body_hash = models.CharField(max_length=64)
    """The SHA-256 of the request's canonical body: the same id with another body is refused."""
    answer = models.JSONField()
    at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["task", "request_id"], name="step_request_once"),
        ]
        indexes = [
            # A retried start finds the task it created by its request id.
            models.Index(
                fields=["request_id"], condition=Q(step="start"), name="step_request_start"
            ),
        ]

    def __str__(self) -> str:
        return f"task {self.task_id} request {self.request_id} ({self.step})"


class ApprovalState(models.TextChoices):
    PENDING = "PENDING", "waiting for a person"
    APPROVED = "APPROVED", "approved"
    REJECTED = "REJECTED", "rejected"


APPROVAL_MOVES: Mapping[str, tuple[frozenset[str], str]] = {
    # A person says yes to the held call: the next phase runs exactly that call, once.
    "approve": (frozenset({ApprovalState.PENDING}), ApprovalState.APPROVED),
    # A person says no: the next phase's model is told, or the task ends (``on_reject``).
    "reject": (frozenset({ApprovalState.PENDING}), ApprovalState.REJECTED),
}
"""Every move an approval may make: name -> (states it may leave, the state it reaches).
It is created ``PENDING`` in its stop's transaction and answered once, by
``console.lifecycle.approval_move``."""


class OnReject(models.TextChoices):
    """What a rejection does to the task."""

    RESUME = "resume", "tell the model and go on"
    END = "end", "end the task"


class Approval(models.Model):
    """One call held for a person's approval when its phase stopped
    (``NEEDS_HUMAN``/``approval_required``), and the one answer it gets.

    Written in the transaction of that stop; moved once, ``PENDING`` → ``APPROVED`` or
    ``REJECTED``, by a conditional update with its audit entry. The answer belongs to the
    next phase only (``phase`` + 1): bound to the call's fingerprint and operation key, it
    is used there once by the guard, so a later phase never reuses it.
    """

    task = models.ForeignKey(Task, on_delete=models.PROTECT, related_name="approvals")
    phase = models.PositiveIntegerField()
    """The phase that stopped for this call."""
    tool = models.CharField(max_length=200)
    effect = models.CharField(max_length=10)
    operation_key = models.CharField(max_length=200, blank=True)
    fingerprint = models.CharField(max_length=64)
    args = models.JSONField(default=dict)  # redacted, as every stored argument
    args_preview = models.TextField(blank=True)
    state = models.CharField(max_length=10, choices=ApprovalState, default=ApprovalState.PENDING)
    requested_at = models.DateTimeField(default=timezone.now)
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    decided_at = models.DateTimeField(null=True, blank=True)
    reason = models.TextField(blank=True)
    on_reject = models.CharField(max_length=10, choices=OnReject, blank=True)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=_in("state", ApprovalState.values), name="approval_state_valid"
            ),
            # One held call per stop: a phase stops once.
            models.UniqueConstraint(fields=["task", "phase"], name="approval_task_phase"),
            # An answer says who gave it, when and why; a pending call has none.
            models.CheckConstraint(
                condition=(Q(state="PENDING") & Q(decided_at=None))
                | (~Q(state="PENDING") & ~Q(decided_at=None) & ~Q(reason="")),
                name="approval_answer_complete",
            ),
        ]
        indexes = [
            # The approval queue and the dashboard's box: pending calls, oldest first.
            models.Index(
                fields=["requested_at"], condition=Q(state="PENDING"), name="approval_pending"
            ),
        ]

    def __str__(self) -> str:
        return f"approval {self.pk} of task {self.task_id} ({self.tool}, {self.state})"

    @property
    def is_pending(self) -> bool:
        return self.state == ApprovalState.PENDING


class AuditAction(models.TextChoices):
    START = "start", "start task"
    STOP = "stop", "stop task"
    MARK_COMMITTED = "mark_committed", "mark committed"
    MARK_NOT_COMMITTED = "mark_not_committed", "mark not committed"
    APPROVE_RESUMPTION = "approve_resumption", "approve resumption"
    APPROVE_CALL = "approve_call", "approve call"
    REJECT_CALL = "reject_call", "reject call"
    LOOKUP = "lookup", "run lookup"
    NOTIFICATION_CHANNEL_ADD = "notification_channel_add", "add notification channel"
    NOTIFICATION_CHANNEL_REMOVE = "notification_channel_remove", "remove notification channel"
    NOTIFICATION_TEST = "notification_test", "send test notice"


class AuditEntry(models.Model):
    """A human action: who, when, what, why, before → after (append-only)."""

    at = models.DateTimeField(default=timezone.now)
    actor = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    action = models.CharField(max_length=40, choices=AuditAction)
    task = models.ForeignKey(
        Task, null=True, blank=True, on_delete=models.PROTECT, related_name="audit"
    )
    operation = models.ForeignKey(
        Operation, null=True, blank=True, on_delete=models.PROTECT, related_name="audit"
    )
    approval = models.ForeignKey(
        "Approval", null=True, blank=True, on_delete=models.PROTECT, related_name="audit"
    )
    reason = models.TextField()
    before = models.JSONField(default=dict, blank=True)
    after = models.JSONField(default=dict, blank=True)

    class Meta:
        constraints = [
            models.CheckConstraint(condition=~Q(reason=""), name="audit_reason_required"),
        ]
        indexes = [
            models.Index(fields=["-at"], name="audit_at"),
            models.Index(fields=["task", "-at"], name="audit_task_at"),
            models.Index(fields=["actor", "-at"], name="audit_actor_at"),
        ]

    def __str__(self) -> str:
        return f"{self.at:%Y-%m-%d %H:%M:%S} {self.actor_id} {self.action}"


class ApiToken(models.Model):
    """A bearer token for the JSON API, acting as its user with that user's roles.

    Only the SHA-256 of the secret is stored: the secret is shown once, when the token is
    issued, and cannot be recovered from the database. A plain (unsalted, fast) hash is
    enough because the secret is 256 random bits, not a password a person chose.
    """

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens"
    )
    name = models.CharField(max_length=100)
    # Unique, so also the index for the lookup on every API request.
    key_hash = models.CharField(max_length=64, unique=True)
    prefix = models.CharField(max_length=8)  # lets a person tell their tokens apart
    created_at = models.DateTimeField(default=timezone.now)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            # Two live tokens of one person with the same name could not be told apart
            # when one of them has to be revoked.
            models.UniqueConstraint(
                fields=["user", "name"],
                condition=Q(revoked_at__isnull=True),
                name="api_token_live_name_unique",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.name})"

    @property
    def is_revoked(self) -> bool:
        return self.revoked_at is not None


# -- notifications (console/drivers/notifications.py) -----------------------------------------


class NoticeKind(models.TextChoices):
    """What a person is told about, each chosen per channel."""

    NEEDS_HUMAN = "needs_human", "a task needs a human"
    UNKNOWN_TOO_LONG = "unknown_too_long", "a write stayed UNKNOWN too long"
    RESTART_LOOP = "restart_loop", "a restart loop is held"


class ChannelTransport(models.TextChoices):
    """The kinds of channel; each is delivered by its class in
    ``console.drivers.notifications.TRANSPORTS`` (a test keeps the two in step)."""

    WEBHOOK = "webhook", "webhook"
    EMAIL = "email", "email"


class NotificationChannel(models.Model):
    """Where notices of the chosen kinds go: a webhook URL (signed with ``secret``) or the
    email addresses in ``address``. Admins add and remove them on the notifications page."""

    name = models.CharField(max_length=100)
    transport = models.CharField(max_length=10, choices=ChannelTransport)
    url = models.URLField(max_length=2000, blank=True)
    address = models.CharField(max_length=1000, blank=True)  # comma-separated addresses
    # Kept in clear because signing needs it; never shown or exported after it is saved
    # (only ``secret_hint``).
    secret = models.CharField(max_length=200, blank=True)
    kinds = models.JSONField(default=list)  # NoticeKind values
    active = models.BooleanField(default=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=_in("transport", ChannelTransport.values),
                name="notification_channel_transport_valid",
            ),
            # Each kind has the fields its transport keeps (``Transport.keeps``); the
            # database's own guard, checked against that table by
            # tests/console/test_notification_transports.py.
            models.CheckConstraint(
                condition=(Q(transport="webhook") & ~Q(url="") & ~Q(secret=""))
                | (Q(transport="email") & ~Q(address="")),
                name="notification_channel_target",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.transport})"

    @property
    def secret_hint(self) -> str:
        """Enough of the secret to tell two apart, not enough to sign with."""
        return f"…{self.secret[-4:]}" if self.secret else ""


class NotificationEvent(models.Model):
    """The outbox: one row per event, written in the transaction that made the change.

    The notifier routes rows not yet routed into one :class:`Notice` per channel, a batch
    of all of a kind's events inside the batching window.
    """

    kind = models.CharField(max_length=20, choices=NoticeKind)
    task = models.ForeignKey(Task, on_delete=models.PROTECT, related_name="+")
    operation = models.ForeignKey(
        Operation, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    reason = models.CharField(max_length=40, blank=True)
    detail = models.TextField(blank=True)
    at = models.DateTimeField(default=timezone.now)
    routed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=_in("kind", NoticeKind.values), name="notification_event_kind_valid"
            ),
            # One "stayed UNKNOWN too long" per operation, however often the check runs.
            models.UniqueConstraint(
                fields=["operation"],
                condition=Q(kind="unknown_too_long"),
                name="notification_event_unknown_once",
            ),
        ]
        indexes = [
            # The notifier's "events not routed yet", oldest first.
            models.Index(
                fields=["kind", "at"], condition=Q(routed_at=None), name="notification_unrouted"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.kind} task {self.task_id}"


class NoticeState(models.TextChoices):
    PENDING = "PENDING", "pending"
    SENDING = "SENDING", "sending"
    SENT = "SENT", "sent"
    FAILED = "FAILED", "failed"


NOTICE_MOVES: Mapping[str, tuple[frozenset[str], str]] = {
    # A worker takes a due notice for one try: a pending one whose wait is over, or one whose
    # last try's claim ran out (its worker died or hung).
    "claim": (frozenset({NoticeState.PENDING, NoticeState.SENDING}), NoticeState.SENDING),
    # The try's outcome, written by the worker whose claim it is.
    "sent": (frozenset({NoticeState.SENDING}), NoticeState.SENT),
    "retry": (frozenset({NoticeState.SENDING}), NoticeState.PENDING),  # failed, tries left
    "give_up": (frozenset({NoticeState.SENDING}), NoticeState.FAILED),  # failed, none left
}
"""Every move a notice may make: name -> (states it may leave, the state it reaches), each
made by ``console.lifecycle.notice_move`` from the state and try number seen."""


class Notice(models.Model):
    """One message to one channel: a batch of events (or a test), delivered with bounded
    retries. ``SENDING`` is claimed until ``claimed_until``; a worker that died leaves it
    to be claimed again after that."""

    channel = models.ForeignKey(
        NotificationChannel, on_delete=models.PROTECT, related_name="notices"
    )
    kind = models.CharField(max_length=20)  # a NoticeKind value, or "test"
    payload = models.JSONField()
    state = models.CharField(max_length=10, choices=NoticeState, default=NoticeState.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(default=timezone.now)
    claimed_until = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    sent_at = models.DateTimeField(null=True, blank=True)
    events = models.ManyToManyField(NotificationEvent, related_name="notices", blank=True)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=_in("state", NoticeState.values), name="notice_state_valid"
            ),
        ]
        indexes = [
            # The notifier's "notices due": pending ones by when, and claims that ran out.
            models.Index(
                fields=["next_attempt_at"],
                condition=Q(state__in=["PENDING", "SENDING"]),
                name="notice_due",
            ),
            models.Index(fields=["-created_at", "-id"], name="notice_created"),
        ]

    def __str__(self) -> str:
        return f"notice {self.pk} to {self.channel_id} ({self.state})"


class NoticeAttempt(models.Model):
    """One try at delivering a notice, kept for admins to read; never changed once written."""

    notice = models.ForeignKey(Notice, on_delete=models.PROTECT, related_name="tries")
    number = models.PositiveIntegerField()
    at = models.DateTimeField(default=timezone.now)
    ok = models.BooleanField()
    status_code = models.PositiveIntegerField(null=True, blank=True)
    response = models.CharField(max_length=500, blank=True)  # the start of the answer
    error = models.CharField(max_length=500, blank=True)
    duration_ms = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["notice_id", "number"]
        constraints = [
            models.UniqueConstraint(fields=["notice", "number"], name="notice_attempt_number"),
        ]

    def __str__(self) -> str:
        return f"notice {self.notice_id} try {self.number}: {'ok' if self.ok else 'failed'}"


class TraceExport(models.Model):
    """How far one task's trace has gone to the OpenTelemetry collector
    (``console/drivers/otel.py``). The trace is the export's outbox, append-only and numbered
    by ``seq`` in order within a task; this row is its cursor, written only by the export,
    never by a step."""

    task = models.OneToOneField(
        Task, on_delete=models.PROTECT, primary_key=True, related_name="trace_export"
    )
    seen_seq = models.PositiveBigIntegerField(default=0)
    """The last ``seq`` of the task's trace the export has found."""
    exported_seq = models.PositiveBigIntegerField(default=0)
    """The last ``seq`` the collector accepted; moved only after it did."""
    claimed_by = models.CharField(max_length=64, blank=True)
    claimed_until = models.DateTimeField(null=True, blank=True)
    """An export pass holds the task until then (compare-and-set): a second pass leaves it,
    and a pass that died lets it go when this runs out."""
    failures = models.PositiveIntegerField(default=0)
    """Sends of this task's events that failed since the last one that went through."""
    exported_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [
            # The export's "tasks with events still to send" and /metrics' events waiting:
            # only the rows behind their trace are in it, however many tasks there are.
            models.Index(
                fields=["exported_at"],
                condition=Q(seen_seq__gt=F("exported_seq")),
                name="trace_export_waiting",
            ),
        ]

    def __str__(self) -> str:
        return f"trace export of task {self.task_id}: {self.exported_seq}/{self.seen_seq}"


class TraceExportTotals(models.Model):
    """The export's one row: how far its reading of the trace has gone (by event id), and
    its counters for ``/metrics`` (kept here: every web process reads the same)."""

    id = models.PositiveSmallIntegerField(primary_key=True, default=1)
    read_id = models.BigIntegerField(default=0)
    """Every trace event with an id up to this one is counted in a task's ``seen_seq``."""
    exported = models.PositiveBigIntegerField(default=0)
    """Trace events the collector accepted (at least once: see docs/deployment.md)."""
    failures = models.PositiveBigIntegerField(default=0)
    """Sends the collector refused or never answered."""

    class Meta:
        constraints = [
            models.CheckConstraint(condition=Q(id=1), name="trace_export_totals_one_row"),
        ]

    def __str__(self) -> str:
        return f"trace export: {self.exported} exported, {self.failures} failures"


# -- roll-ups (console.rollups) ------------------------------------------------------------------


class TaskTotal(models.Model):
    """Rolled tasks (``Task.rolled``) of one agent in one state: how many, and what they
    spent of each budget of :data:`guard.steps.DIMENSIONS` (``spent``: ``used`` -> total).
    Beat adds a task once it has stopped a while; ``console.lifecycle`` takes it back out
    before a resumption, a cancel, a close or a summary turn changes it."""

    agent = models.CharField(max_length=100)
    state = models.CharField(max_length=20, choices=TaskState)
    tasks = models.BigIntegerField(default=0)
    spent = models.JSONField(default=dict)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["agent", "state"], name="task_total_once"),
        ]

    def __str__(self) -> str:
        return f"{self.tasks} {self.state} tasks of {self.agent}"


class HourStat(models.Model):
    """One closed hour of the trace, counted by beat (``console.rollups``): what the
    dashboard's step latency chart and spend read instead of the hour's events. The last
    day's hours are counted again on every pass (a step saved late still lands in its hour);
    older ones are final."""

    hour = models.DateTimeField(unique=True)
    """The hour's start (UTC)."""
    steps = models.PositiveIntegerField(default=0)
    """Model calls and tool requests with a latency."""
    latency_p50 = models.PositiveIntegerField(null=True, blank=True)
    """Median latency of those steps (``None``: none, or SQLite, which has no percentiles)."""
    latency_p95 = models.PositiveIntegerField(null=True, blank=True)
    spend = models.PositiveBigIntegerField(default=0)
    """What the hour's model calls cost, in the minor unit of ``LOOPGUARD_CURRENCY``."""
    counted_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"hour {self.hour:%Y-%m-%d %H}:00: {self.steps} steps"


class Rollup(models.Model):
    """The roll-ups' one row: how far beat has counted the stop reports (``/metrics``'
    ``loopguard_stops_total``); locked while they are counted, so one count at a time."""

    id = models.PositiveSmallIntegerField(primary_key=True, default=1)
    stops_before = models.DateTimeField(null=True, blank=True)
    """Every stop report stamped before it is counted in ``stops`` (``None``: none yet)."""
    stops = models.JSONField(default=dict)
    """Stop reports by ``"<state> <reason>"``."""

    class Meta:
        constraints = [models.CheckConstraint(condition=Q(id=1), name="rollup_one_row")]

    def __str__(self) -> str:
        return f"roll-up: stops before {self.stops_before}"
