"""Reads for the console's pages and API: each list is served by an index (see models.py).

Every function runs a fixed number of queries whatever the page size: lists are sliced
in the database, related rows are joined or fetched in one extra query.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.core.paginator import Page, Paginator
from django.db.models import Count, Q, QuerySet
from django.utils import timezone

from .models import (
    AuditEntry,
    Operation,
    OperationState,
    Phase,
    StopReport,
    Task,
    TaskState,
    TraceEvent,
)

TASKS_PER_PAGE = 50
AUDIT_PER_PAGE = 100
TRACE_WINDOW = 100  # events shown at once on a task page; older ones are a link away
QUEUE_LIMIT = 50  # uncertain operations shown at once, oldest first
RECENT = timedelta(hours=24)  # the dashboard counts finished tasks over this window
BUDGETS = ("model_calls", "requests", "executions", "tokens", "elapsed_ms")
_LIMIT_OF = {"elapsed_ms": "deadline_ms"}


@dataclass(frozen=True)
class Gauge:
    """One budget dimension: spent / limit across all phases."""

    name: str
    used: int
    limit: int | None

    @property
    def percent(self) -> int:
        if not self.limit:
            return 0
        return min(100, round(100 * self.used / self.limit))

    @property
    def level(self) -> str:
        """``ok`` / ``warn`` / ``out``: for colouring the bar."""
        pct = self.percent
        return "out" if pct >= 100 else "warn" if pct >= 80 else "ok"


def gauges(task: Task) -> list[Gauge]:
    """The task's budget gauges, cumulative across phases."""
    limits = task.limits or {}
    out = []
    for name in BUDGETS:
        limit = limits.get(_LIMIT_OF.get(name, name))
        out.append(Gauge(name, int(getattr(task, name)), None if limit is None else int(limit)))
    return out


# -- dashboard ---------------------------------------------------------------------------------


@dataclass
class Dashboard:
    counts: dict[str, int]
    """QUEUED, RUNNING and NEEDS_HUMAN: all of them; the other states: finished in ``RECENT``."""
    needs_human: list[Task]
    uncertain: list[Operation]
    running: list[Task]
    recently_stopped: list[Task]


def dashboard(*, limit: int = 15) -> Dashboard:
    """What an operator needs at a glance; a fixed handful of queries."""
    counts = {state: 0 for state in TaskState.values}
    # Counting every task ever would scan the whole table on each refresh: what waits is
    # counted exactly (index-only on task_state_created), what finished over a window
    # (index-only on task_recently_stopped).
    waiting = [TaskState.QUEUED, TaskState.RUNNING, TaskState.NEEDS_HUMAN]
    for row in (
        Task.objects.filter(state__in=waiting).values("state").annotate(n=Count("id")).order_by()
    ):
        counts[row["state"]] = row["n"]
    finished = (
        Task.objects.filter(finished_at__gte=timezone.now() - RECENT)
        .exclude(state=TaskState.NEEDS_HUMAN)
        .values("state")
        .annotate(n=Count("id"))
        .order_by()
    )
    for row in finished:
        counts[row["state"]] = row["n"]
    needs_human = list(
        Task.objects.filter(state=TaskState.NEEDS_HUMAN).order_by("updated_at")[:limit]
    )
    running = list(Task.objects.filter(state=TaskState.RUNNING).order_by("-id")[:limit])
    stopped = list(
        Task.objects.filter(finished_at__isnull=False)
        .exclude(state=TaskState.NEEDS_HUMAN)
        .order_by("-finished_at")[:limit]
    )
    return Dashboard(
        counts=counts,
        needs_human=needs_human,
        uncertain=reconciliation_queue(limit=limit),
        running=running,
        recently_stopped=stopped,
    )


# -- tasks -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TaskFilters:
    """The task list's filters, as they appear in the URL."""

    state: str = ""
    reason: str = ""
    agent: str = ""
    since: datetime | None = None
    until: datetime | None = None
    q: str = ""
    errors: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_query(cls, query: Any) -> TaskFilters:
        """Read filters from a QueryDict; bad values are dropped and reported, not raised."""
        errors: dict[str, str] = {}
        query = _without_nul(query, errors)
        state = query.get("state", "").strip()
        if state and state not in TaskState.values:
            errors["state"] = f"unknown state {state!r}"
            state = ""
        since = _parse_time(query.get("since", ""), "since", errors)
        until = _parse_time(query.get("until", ""), "until", errors)
        return cls(
            state=state,
            reason=query.get("reason", "").strip()[:40],
            agent=query.get("agent", "").strip()[:100],
            since=since,
            until=until,
            q=query.get("q", "").strip()[:200],
            errors=errors,
        )

    def as_query(self) -> dict[str, str]:
        """The non-empty filters, for links that keep them."""
        out = {
            "state": self.state,
            "reason": self.reason,
            "agent": self.agent,
            "since": self.since.isoformat(timespec="minutes") if self.since else "",
            "until": self.until.isoformat(timespec="minutes") if self.until else "",
            "q": self.q,
        }
        return {k: v for k, v in out.items() if v}


def _without_nul(query: Any, errors: dict[str, str]) -> dict[str, str]:
    """The query's values, dropping any with a NUL character (the database refuses them)."""
    clean: dict[str, str] = {}
    for name in query:
        value = str(query.get(name, ""))
        if "\x00" in value:
            errors[name] = "contains a NUL character"
        else:
            clean[name] = value
    return clean


def _parse_time(raw: str, name: str, errors: dict[str, str]) -> datetime | None:
    raw = raw.strip()
    if not raw:
        return None
    try:
        value = datetime.fromisoformat(raw)
    except ValueError:
        errors[name] = f"{raw!r} is not a date and time (YYYY-MM-DDTHH:MM)"
        return None
    if timezone.is_naive(value):
        value = timezone.make_aware(value, timezone.get_current_timezone())
    return value


def tasks(filters: TaskFilters) -> QuerySet[Task]:
    """Tasks matching ``filters``, newest first."""
    qs = Task.objects.all()
    if filters.state:
        qs = qs.filter(state=filters.state)
    if filters.reason:
        qs = qs.filter(reason=filters.reason)
    if filters.agent:
        qs = qs.filter(agent=filters.agent)
    if filters.since:
        qs = qs.filter(created_at__gte=filters.since)
    if filters.until:
        qs = qs.filter(created_at__lt=filters.until)
    if filters.q:
        # A task id, or the key of one of its operations (keys are unique: no duplicates).
        term = filters.q.removeprefix("#")
        match = Q(id__in=Operation.objects.filter(key=filters.q).values("task_id"))
        if re.fullmatch(r"\d{1,18}", term):
            match |= Q(id=int(term))
        qs = qs.filter(match)
    return qs.order_by("-created_at", "-id")


def task_page(filters: TaskFilters, number: Any) -> Page[Task]:
    """One page of the task list (a bad page number gives the nearest page)."""
    return Paginator(tasks(filters), TASKS_PER_PAGE).get_page(number)


def agent_choices() -> list[str]:
    """Agent names for the filter: the registered ones (no query)."""
    return sorted(settings.LOOPGUARD_AGENTS)


@dataclass
class TaskDetail:
    task: Task
    gauges: list[Gauge]
    phases: list[Phase]
    operations: list[Operation]
    reports: list[StopReport]
    audit: list[AuditEntry]
    events: list[TraceEvent]
    earlier: bool
    last_seq: int


def task_detail(task_id: int, *, before: int | None = None) -> TaskDetail | None:
    """A task with everything its page shows; ``before`` pages back through the trace."""
    task = Task.objects.filter(id=task_id).select_related("created_by", "stop_requested_by").first()
    if task is None:
        return None
    window = trace(task.id, before=before)
    earlier = bool(window) and window[0].seq > 1
    last_seq = window[-1].seq if window else 0
    return TaskDetail(
        task=task,
        gauges=gauges(task),
        phases=list(task.phases.select_related("approved_by").order_by("number")),
        operations=list(task.operations.order_by("claimed_at", "id")),
        reports=list(task.stop_reports.order_by("-phase", "-id")),
        audit=list(task.audit.select_related("actor", "operation").order_by("-at")[:100]),
        events=window,
        earlier=earlier,
        last_seq=last_seq,
    )


@dataclass
class TaskLive:
    """What one tick of a task page's live view needs, and no more."""

    task: Task
    gauges: list[Gauge]
    operations: list[Operation]
    events: list[TraceEvent]


def task_live(task_id: int, *, after: int) -> TaskLive | None:
    task = Task.objects.filter(id=task_id).first()
    if task is None:
        return None
    return TaskLive(
        task=task,
        gauges=gauges(task),
        operations=list(task.operations.order_by("claimed_at", "id")),
        events=trace(task.id, after=after),
    )


def trace(
    task_id: int, *, after: int | None = None, before: int | None = None
) -> list[TraceEvent]:
    """A window of a task's trace in order: new events after ``after``, or the
    ``TRACE_WINDOW`` events before ``before`` (default: the latest)."""
    qs = TraceEvent.objects.filter(task_id=task_id)
    if after is not None:
        return list(qs.filter(seq__gt=after).order_by("seq")[:TRACE_WINDOW])
    if before is not None:
        qs = qs.filter(seq__lt=before)
    return list(reversed(qs.order_by("-seq")[:TRACE_WINDOW]))


def latest_report(task_id: int) -> StopReport | None:
    """The task's latest stop report (one indexed query), or ``None``."""
    return StopReport.objects.filter(task_id=task_id).order_by("-phase", "-id").first()


# -- operations --------------------------------------------------------------------------------


def reconciliation_count() -> int:
    """How many operations the reconciliation queue holds in all."""
    return _unsettled().count()


def reconciliation_queue(*, limit: int | None = QUEUE_LIMIT) -> list[Operation]:
    """Every write whose commit state a human must settle, oldest first: ``UNKNOWN`` ones,
    and ``IN_FLIGHT`` ones whose driver's lease has expired."""
    qs = _unsettled().select_related("task").order_by("updated_at", "id")
    return list(qs[:limit] if limit else qs)


def _unsettled() -> QuerySet[Operation]:
    now = timezone.now()
    return Operation.objects.filter(
        Q(state=OperationState.UNKNOWN)
        | Q(state=OperationState.IN_FLIGHT)
        & (~Q(task__state=TaskState.RUNNING) | Q(task__lease_expires_at__lt=now))
    )


def operation(key: str) -> Operation | None:
    return Operation.objects.filter(key=key).select_related("task").first()


# -- audit -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AuditFilters:
    actor: str = ""
    action: str = ""
    task: int | None = None
    since: datetime | None = None
    until: datetime | None = None
    errors: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_query(cls, query: Any) -> AuditFilters:
        errors: dict[str, str] = {}
        query = _without_nul(query, errors)
        raw_task = query.get("task", "").strip().removeprefix("#")
        task = int(raw_task) if re.fullmatch(r"\d{1,18}", raw_task) else None
        if raw_task and task is None:
            errors["task"] = f"{raw_task!r} is not a task id"
        return cls(
            actor=query.get("actor", "").strip()[:150],
            action=query.get("action", "").strip()[:40],
            task=task,
            since=_parse_time(query.get("since", ""), "since", errors),
            until=_parse_time(query.get("until", ""), "until", errors),
            errors=errors,
        )

    def as_query(self) -> dict[str, str]:
        out = {
            "actor": self.actor,
            "action": self.action,
            "task": str(self.task) if self.task else "",
            "since": self.since.isoformat(timespec="minutes") if self.since else "",
            "until": self.until.isoformat(timespec="minutes") if self.until else "",
        }
        return {k: v for k, v in out.items() if v}


def audit_entries(filters: AuditFilters) -> QuerySet[AuditEntry]:
    qs = AuditEntry.objects.select_related("actor", "operation")
    if filters.actor:
        qs = qs.filter(actor__username=filters.actor)
    if filters.action:
        qs = qs.filter(action=filters.action)
    if filters.task:
        qs = qs.filter(task_id=filters.task)
    if filters.since:
        qs = qs.filter(at__gte=filters.since)
    if filters.until:
        qs = qs.filter(at__lt=filters.until)
    return qs.order_by("-at", "-id")


def audit_page(filters: AuditFilters, number: Any) -> Page[AuditEntry]:
    return Paginator(audit_entries(filters), AUDIT_PER_PAGE).get_page(number)
