"""Reads for the console's pages and API: each list is served by an index (see models.py).

Every function runs a fixed number of queries whatever the page size: lists are sliced
in the database, related rows are joined or fetched in one extra query.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import cached_property
from typing import Any, ClassVar, Self

from django.conf import settings
from django.core.paginator import Page, Paginator
from django.db import connection
from django.db.models import (
    Case,
    Count,
    Model,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
    Sum,
    When,
)
from django.db.models.functions import TruncHour
from django.utils import timezone

from console.agents import UnknownAgent, agent_class
from console.models import (
    ACTIVE_STATES,
    STOP_REASONS,
    UNSETTLED_STATES,
    Approval,
    ApprovalState,
    AuditAction,
    AuditEntry,
    HourStat,
    OnReject,
    Operation,
    OperationEvent,
    OperationState,
    Percentile,
    Phase,
    StopReport,
    Task,
    TaskState,
    TraceEvent,
    lease_alive,
    waiting_for_client,
)
from console.records.spend import money
from console.rollups import hour_of
from guard import Limits, Reason
from guard.steps import DIMENSIONS, RESUME_CONDITIONS

logger = logging.getLogger(__name__)

TASKS_PER_PAGE = 50
AUDIT_PER_PAGE = 100
TRACE_WINDOW = 100  # events shown at once on a task page; older ones are a link away
QUEUE_LIMIT = 50  # uncertain operations shown at once, oldest first
APPROVALS_SHOWN = 50  # pending approvals shown at once, oldest first; and answered ones
APPROVALS_ON_BOARD = 5  # the dashboard's "Calls waiting for approval" lists the oldest few
ELSEWHERE_SHOWN = 3  # per queued operation: the same call committed under other keys
RECENT = timedelta(hours=24)  # the dashboard counts finished tasks over this window
# The poll budget bounds each PENDING job, not the task: a task-wide "polls spent / limit"
# would compare a sum with a per-job bound, so it has no gauge.
GAUGED = tuple(d for d in DIMENSIONS if not d.per_job)
BUDGETS = tuple(d.used for d in GAUGED)
"""The task counters a person sees (page gauges, the API's ``counters``), in order."""
BUDGET_OF_REASON = {d.reason.value: d.limit for d in DIMENSIONS if d.stops}
"""The limit a task ran out of, by its stop reason (the one a resumption must grant)."""
_DEFAULT_LIMITS = Limits()


@dataclass(frozen=True)
class Gauge:
    """One budget dimension: spent / limit across all phases."""

    name: str
    used: int
    limit: int | None
    label: str = ""
    """The dimension's name for people (``model calls``, ``time (ms)``)."""

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
    for d in GAUGED:
        # A limit the task does not name is the guard's default (its driver runs with
        # Limits(**task.limits)), not "none": ``explore`` is stored only when given.
        limit = limits[d.limit] if d.limit in limits else getattr(_DEFAULT_LIMITS, d.limit)
        used = int(getattr(task, d.used))
        out.append(Gauge(d.used, used, None if limit is None else int(limit), d.label))
    return out


# -- dashboard ---------------------------------------------------------------------------------


FINISHED = tuple(s for s in TaskState.values if s not in (*ACTIVE_STATES, TaskState.NEEDS_HUMAN))
"""The states of the dashboard's "Recently stopped" box (``NEEDS_HUMAN`` has its own)."""


@dataclass
class Dashboard:
    counts: dict[str, int]
    """QUEUED, RUNNING and NEEDS_HUMAN: all of them; the other states: finished in ``RECENT``."""
    needs_human: list[Task]
    uncertain: list[Operation]
    running: list[Task]
    recently_stopped: list[Task]
    """Finished in ``RECENT``, the latest first: the same tasks ``counts`` counts."""
    budgets: tuple[str, ...] = tuple(d.label for d in GAUGED)
    """The running tasks' gauges, by their names for people (see :func:`gauges`)."""
    uncertain_total: int = 0
    """Every write the reconciliation queue holds (``uncertain`` shows the oldest few)."""
    approvals: list[Approval] = field(default_factory=list)
    """The oldest calls waiting for a person's approval (with their tasks)."""
    approvals_total: int = 0
    """Every call the approval queue holds."""

    @property
    def totals(self) -> dict[str, int]:
        """How many each box holds in all, by box, for its "15 of 47". Its rows and the
        counts are read a moment apart: a box never claims fewer than it shows."""
        totals = {
            "needs_human": self.counts[TaskState.NEEDS_HUMAN],
            "uncertain": self.uncertain_total,
            "running": self.counts[TaskState.RUNNING],
            "recently_stopped": sum(self.counts[s] for s in FINISHED),
            "approvals": self.approvals_total,
        }
        return {box: max(n, len(getattr(self, box))) for box, n in totals.items()}

    @cached_property
    def trends(self) -> Trends:
        """The dashboard's charts (:func:`trends`): read when a page draws them, so the
        board's 5-second htmx poll, which has no charts, runs none of their queries."""
        return trends()

    @cached_property
    def spend(self) -> Spend:
        """What model calls cost today and this week (:func:`spend`): read when the page
        draws it, outside the board's 5-second poll, like the charts."""
        return spend()


def dashboard(*, limit: int = 15) -> Dashboard:
    """What an operator needs at a glance; a fixed handful of queries."""
    counts = {state: 0 for state in TaskState.values}
    # Counting every task ever would scan the whole table on each refresh: what waits is
    # counted exactly (index-only on task_state_agent_created), what finished over a window
    # (index-only on task_stopped).
    waiting = [TaskState.QUEUED, TaskState.RUNNING, TaskState.NEEDS_HUMAN]
    for row in (
        Task.objects.filter(state__in=waiting).values("state").annotate(n=Count("id")).order_by()
    ):
        counts[row["state"]] = row["n"]
    finished = (
        Task.objects.filter(finished_at__gte=timezone.now() - RECENT)
        .exclude(state=TaskState.NEEDS_HUMAN)
        .values("state")
        .annotate(n=Count("*"))  # not of ids: task_stopped holds the rest, not the id
        .order_by()
    )
    for row in finished:
        counts[row["state"]] = row["n"]
    needs_human = list(
        Task.objects.filter(state=TaskState.NEEDS_HUMAN).order_by("updated_at")[:limit]
    )
    running = list(Task.objects.filter(state=TaskState.RUNNING).order_by("-id")[:limit])
    # Over the same window as the counts, so that the box's "15 of 47" counts what it lists.
    stopped = list(
        Task.objects.filter(finished_at__gte=timezone.now() - RECENT)
        .exclude(state=TaskState.NEEDS_HUMAN)
        .order_by("-finished_at")[:limit]
    )
    uncertain = reconciliation_queue(limit=limit)
    # Counted only when the box is full; the partial index operation_unsettled serves it.
    uncertain_total = reconciliation_count() if len(uncertain) == limit else len(uncertain)
    approvals = approval_queue(limit=APPROVALS_ON_BOARD)
    # Counted only when the box is full, as above; the partial index approval_pending serves it.
    approvals_total = approval_count() if len(approvals) == APPROVALS_ON_BOARD else len(approvals)
    return Dashboard(
        counts=counts,
        needs_human=needs_human,
        uncertain=uncertain,
        running=running,
        recently_stopped=stopped,
        uncertain_total=uncertain_total,
        approvals=approvals,
        approvals_total=approvals_total,
    )


@dataclass(frozen=True)
class Spend:
    """What model calls cost, summed over their trace events' ``cost``, in the minor unit of
    ``LOOPGUARD_CURRENCY``."""

    today: int
    """Since midnight in the console's time zone."""
    week: int
    """Over the last 7 days (168 hours up to now)."""
    at: datetime
    """When it was summed."""

    @property
    def today_text(self) -> str:
        """``today`` as people read money (:func:`console.records.spend.money`)."""
        return money(self.today)

    @property
    def week_text(self) -> str:
        return money(self.week)


SPEND_WEEK = timedelta(days=7)


def spend(*, now: datetime | None = None) -> Spend:
    """The spend of today and of the last 7 days: the closed hours beat has counted
    (``HourStat``, see ``console.rollups``) and the rest (the current hour, an hour with no
    row yet, a window's first part hour) from the trace in one query. Only a model call
    carries a cost (both drivers write it there alone), so the index of costs
    (``trace_spend``: ``at``, with the cost beside it) answers that query from the index."""
    now = now or timezone.now()
    midnight = timezone.localtime(now).replace(hour=0, minute=0, second=0, microsecond=0)
    week_start = now - SPEND_WEEK
    rolled = _rolled_hours(week_start, now, "spend")
    # One query for both: a midnight off the hour (a zone at :30) leaves today a part hour
    # that the week has counted whole.
    today_live, week_live = _live(midnight, now, rolled), _live(week_start, now, rolled)
    sums = TraceEvent.objects.filter(today_live | week_live, cost__isnull=False).aggregate(
        today=Sum("cost", filter=today_live), week=Sum("cost", filter=week_live)
    )
    today = sum(n for hour, n in rolled.items() if hour >= midnight)
    week = sum(rolled.values())
    return Spend(
        today=today + int(sums["today"] or 0), week=week + int(sums["week"] or 0), at=now
    )


def _rolled_hours(since: datetime, now: datetime, column: str) -> dict[datetime, Any]:
    """``column`` of every closed hour wholly in ``[since, now)`` that beat has counted
    (``HourStat``), by hour."""
    first = hour_of(since) + (timedelta(hours=1) if hour_of(since) < since else timedelta())
    return dict(
        HourStat.objects.filter(hour__gte=first, hour__lt=hour_of(now)).values_list(
            "hour", column
        )
    )


def _live(since: datetime, now: datetime, rolled: Collection[datetime]) -> Q:
    """The part of ``[since, now)`` that the ``rolled`` hours leave to the trace: a Q over
    trace events' ``at``, as a few ranges (each one an index range scan)."""
    ranges = Q(pk__in=[])
    start = since
    hour = hour_of(since)
    while hour <= now:
        end = hour + timedelta(hours=1)
        if hour in rolled and hour >= since:
            if start < hour:
                ranges |= Q(at__gte=start, at__lt=hour)
            start = end
        hour = end
    if start < now:
        ranges |= Q(at__gte=start)
    return ranges


# -- tasks -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Filters:
    """A list's filters as they appear in its URL: bad values are dropped and reported in
    ``errors``, never raised; ``LOOKUPS`` names the query each filter narrows by."""

    LOOKUPS: ClassVar[Mapping[str, str]]
    since: datetime | None = None
    until: datetime | None = None
    errors: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_query(cls, query: Any) -> Self:
        """Read filters from a QueryDict."""
        errors: dict[str, str] = {}
        clean = _without_nul(query, errors)
        own = cls._read(clean, errors)
        since = _parse_time(clean.get("since", ""), "since", errors)
        until = _parse_time(clean.get("until", ""), "until", errors)
        return cls(since=since, until=until, errors=errors, **own)

    @classmethod
    def _read(cls, query: Mapping[str, str], errors: dict[str, str]) -> dict[str, Any]:
        raise NotImplementedError

    def as_query(self) -> dict[str, str]:
        """The non-empty filters, for links that keep them."""
        out = {}
        for name in self.LOOKUPS:
            value = getattr(self, name)
            if isinstance(value, datetime):
                value = value.isoformat(timespec="minutes")
            if value:
                out[name] = str(value)
        return out

    def apply[M: Model](self, qs: QuerySet[M]) -> QuerySet[M]:
        """``qs`` narrowed by every filter that is set."""
        for name, lookup in self.LOOKUPS.items():
            value = getattr(self, name)
            if value:
                qs = qs.filter(**{lookup: value})
        return qs


WAITING = ("client",)
"""What the task list's ``waiting`` filter may wait for."""


@dataclass(frozen=True)
class TaskFilters(_Filters):
    """The task list's filters."""

    LOOKUPS: ClassVar[Mapping[str, str]] = {
        "state": "state",
        "reason": "reason",
        "agent": "agent",
        "since": "created_at__gte",
        "until": "created_at__lt",
    }
    state: str = ""
    reason: str = ""
    agent: str = ""
    q: str = ""
    """A task id, or the key of one of its operations."""
    waiting: str = ""
    """``client``: only attached tasks waiting for their client (its lease lapsed, the task
    not stopped: ``models.waiting_for_client``)."""

    @classmethod
    def _read(cls, query: Mapping[str, str], errors: dict[str, str]) -> dict[str, Any]:
        # An agent no longer registered here cannot be chosen in the form either; its old
        # tasks are still found by id or by listing every agent.
        return {
            "state": _one_of(query, "state", TaskState.values, errors),
            "reason": _one_of(query, "reason", STOP_REASONS, errors, word="stop reason"),
            "agent": _one_of(query, "agent", _agents_for(query), errors),
            "q": query.get("q", "").strip()[:200],
            "waiting": _one_of(query, "waiting", WAITING, errors, word="waiting filter"),
        }

    def as_query(self) -> dict[str, str]:
        extra = {name: value for name in ("q", "waiting") if (value := getattr(self, name))}
        return {**super().as_query(), **extra}


def _agents_for(query: Mapping[str, str]) -> Collection[str]:
    """The agent names the filter may take for ``query``: the registered ones, and the one
    asked for when attached tasks bear it (asked only then: one indexed lookup)."""
    asked = query.get("agent", "").strip()
    if not asked or asked in settings.LOOPGUARD_AGENTS:
        return settings.LOOPGUARD_AGENTS
    if Task.objects.exclude(client="").filter(agent=asked).exists():
        return [*settings.LOOPGUARD_AGENTS, asked]
    return settings.LOOPGUARD_AGENTS


def _one_of(
    query: Mapping[str, str],
    name: str,
    allowed: Collection[str],
    errors: dict[str, str],
    *,
    word: str = "",
) -> str:
    """The filter ``name`` if it is one of ``allowed``, spaces around it aside (empty: not
    set). Anything else is an error rather than a filter that matches nothing or, dropped
    silently, everything: a value of whitespace alone too (``%20``, ``%C2%85``), which is
    not the empty value a form sends for "any"."""
    sent = query.get(name, "")
    value = sent.strip()
    if sent and value not in allowed:
        shown = sent if len(sent) <= 60 else f"{sent[:60]}…"
        errors[name] = f"unknown {word or name} {shown!r}"
        return ""
    return value


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
    try:
        if timezone.is_naive(value):
            value = timezone.make_aware(value, timezone.get_current_timezone())
        # The filter is compared in UTC and shown back in the console's time zone: a time
        # at the very edge of the calendar (9999-12-31T23:59-14:00) has no date in one of
        # them, and would fail there rather than here.
        value.astimezone(UTC)
        value.astimezone(timezone.get_current_timezone())
    except OverflowError:
        errors[name] = (
            f"{raw!r} is out of range (pick a time between the years 1 and 9999 in every time zone)"
        )
        return None
    return value


COUNTED_UP_TO = 10_000
"""A list counts the rows its filters match up to this many, and says "more than 10,000"
past it."""


@dataclass(frozen=True)
class Tally:
    """How many rows a list's filters match, counted no further than ``bound``: an exact
    count walks every match (the whole table for an unfiltered list of a million tasks,
    most of a second) to give a number nobody acts on past a few thousand."""

    n: int
    """The rows counted: at most ``bound + 1``, which means "more than ``bound``"."""
    bound: int = COUNTED_UP_TO

    @property
    def more(self) -> bool:
        """Whether there are more than ``bound``: the count stopped there."""
        return self.n > self.bound

    def __str__(self) -> str:
        return f"more than {self.bound:,}" if self.more else f"{self.n:,}"


def tally(qs: QuerySet[Any], *, bound: int | None = None) -> Tally:
    """Count ``qs`` up to ``bound`` (default :data:`COUNTED_UP_TO`), and one more to know
    it went past: one query that stops after ``bound + 1`` rows of the index serving
    ``qs``'s filters."""
    bound = COUNTED_UP_TO if bound is None else bound
    return Tally(qs.order_by()[: bound + 1].count(), bound)


_PLACE = re.compile(r"(\d{8}T\d{6}\.\d{6})Z_(\d{1,18})")


@dataclass(frozen=True)
class Place:
    """A row's place in a newest-first list: its time, then its id (the list's order and
    its index's). In links as ``20261204T170000.123456Z_12345``: UTC to the microsecond, as
    the database keeps it, so that the next page starts exactly after the row."""

    at: datetime
    id: int

    def __str__(self) -> str:
        return f"{self.at.astimezone(UTC):%Y%m%dT%H%M%S.%f}Z_{self.id}"

    @classmethod
    def parse(cls, raw: str) -> Place | None:
        """The place ``raw`` names, or ``None`` when it names none."""
        match = _PLACE.fullmatch(raw.strip())
        if match is None:
            return None
        try:
            at = datetime.strptime(match.group(1), "%Y%m%dT%H%M%S.%f").replace(tzinfo=UTC)
        except ValueError:  # digits that are no date (month 13)
            return None
        return cls(at, int(match.group(2)))


@dataclass(frozen=True)
class ListPage[M: Model]:
    """One page of a newest-first list, reached from a row's place (``?after=``: the rows
    older than it; ``?before=``: the newer ones) instead of a page number. A page number
    is an OFFSET, which reads and throws away every row before the page: 900,000 of them
    for a deep page of a million tasks. A place is where the index scan starts."""

    object_list: list[M]
    total: Tally
    newer: str = ""
    """The ``before`` of the page of newer rows (``""``: this is the newest page)."""
    older: str = ""
    """The ``after`` of the page of older rows (``""``: nothing older matches)."""
    error: str = ""
    """Why the place asked for was not used (the newest page is shown instead)."""
    field: str = ""
    """The time the list is ordered by (``created_at``, ``at``)."""

    @property
    def shown_from(self) -> datetime | None:
        """The time of the newest row shown (``None``: none is)."""
        return getattr(self.object_list[0], self.field) if self.object_list else None

    @property
    def has_previous(self) -> bool:
        return bool(self.newer)

    @property
    def has_next(self) -> bool:
        return bool(self.older)


def _list_page[M: Model](
    qs: QuerySet[M], field: str, query: Mapping[str, str], size: int
) -> ListPage[M]:
    """The page of ``qs`` (newest first by ``field``, then id) that ``query`` asks for, in
    at most three queries whatever the page (its rows, whether rows lie on the far side of
    them, the tally): each row query starts its index scan at the place."""
    after, before = query.get("after", ""), query.get("before", "")
    raw = after or before
    place = Place.parse(raw) if raw else None
    error = ""
    if raw and place is None:
        shown = raw if len(raw) <= 60 else f"{raw[:60]}…"
        error = f"{shown!r} is not a place in this list; the newest are shown"
    elif not raw and query.get("page", "1").strip() not in ("", "1"):
        # A link from before the list paged by place (a bookmark of ?page=7): said, not
        # silently taken for the first page.
        error = "pages have no numbers any more (follow Older and Newer); the newest are shown"
    total = tally(qs)
    newest = qs.order_by(f"-{field}", "-id")

    def place_of(row: M) -> Place:
        return Place(getattr(row, field), int(row.pk))

    # Each pair of bounds: the first is the index's range, the second breaks a tie of times.
    def older(than: Place) -> Q:
        return Q(**{f"{field}__lte": than.at}) & (
            Q(**{f"{field}__lt": than.at}) | Q(id__lt=than.id)
        )

    def newer(than: Place, *, itself: bool = False) -> Q:
        same = Q(id__gte=than.id) if itself else Q(id__gt=than.id)
        return Q(**{f"{field}__gte": than.at}) & (Q(**{f"{field}__gt": than.at}) | same)

    if place is not None and before and not after:
        # Read upwards from the place, the nearest first, and turned round to be shown.
        rows = list(qs.filter(newer(place)).order_by(field, "id")[: size + 1])
        if len(rows) > size:
            shown_rows = rows[:size][::-1]
            beyond = qs.filter(older(place_of(shown_rows[-1]))).exists()
            return ListPage(
                shown_rows,
                total,
                field=field,
                newer=str(place_of(shown_rows[0])),
                older=str(place_of(shown_rows[-1])) if beyond else "",
            )
        place = None  # no more than a page of newer rows: that is the newest page
    if place is not None:
        rows = list(newest.filter(older(place))[: size + 1])
        shown_rows = rows[:size]
        above = qs.filter(newer(place, itself=True)).exists()
        return ListPage(
            shown_rows,
            total,
            field=field,
            newer=str(place_of(shown_rows[0]) if shown_rows else place) if above else "",
            older=str(place_of(shown_rows[-1])) if len(rows) > size else "",
            error=error,
        )
    rows = list(newest[: size + 1])
    return ListPage(
        rows[:size],
        total,
        field=field,
        older=str(place_of(rows[size - 1])) if len(rows) > size else "",
        error=error,
    )


def tasks(filters: TaskFilters) -> QuerySet[Task]:
    """Tasks matching ``filters``, newest first."""
    qs = filters.apply(Task.objects.all())
    if filters.q:
        # A task id, or the key of one of its operations (keys are unique: no duplicates).
        term = filters.q.removeprefix("#")
        match = Q(id__in=Operation.objects.filter(key=filters.q).values("task_id"))
        if re.fullmatch(r"\d{1,18}", term):
            match |= Q(id=int(term))
        qs = qs.filter(match)
    if filters.waiting:
        qs = qs.filter(waiting_for_client(timezone.now()))
    return qs.order_by("-created_at", "-id")


def task_ids(filters: TaskFilters, *, limit: int) -> list[int]:
    """The ids of the tasks the list's ``filters`` match, newest first, at most ``limit``."""
    return list(tasks(filters).values_list("id", flat=True)[:limit])


ATTACHED_AGENTS_SHOWN = 100
"""The most attached agents' names the task list's filter offers."""


def task_page(filters: TaskFilters, number: Any) -> Page[Task]:
    """One page of the task list by its number, for the API (a bad page number gives the
    nearest page); the console's list pages by place instead (:func:`task_list_page`)."""
    return Paginator(tasks(filters), TASKS_PER_PAGE).get_page(number)


def task_list_page(filters: TaskFilters, query: Mapping[str, str]) -> ListPage[Task]:
    """The page of the task list that ``query``'s ``after`` or ``before`` asks for (none:
    the newest tasks), with how many tasks the filters match (:class:`Tally`)."""
    return _list_page(tasks(filters), "created_at", query, TASKS_PER_PAGE)


def agent_choices() -> list[str]:
    """Agent names for the filter: the registered ones, and those attached clients gave
    their tasks (one query, on the index of attached tasks' agents)."""
    attached = (
        Task.objects.exclude(client="")
        .order_by("agent")
        .values_list("agent", flat=True)
        .distinct()[:ATTACHED_AGENTS_SHOWN]
    )
    return sorted({*settings.LOOPGUARD_AGENTS, *attached})


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
    approval: Approval | None = None
    """The call it holds for a person's approval, while it waits for one."""
    answers: dict[int, Approval] = field(default_factory=dict)
    """By the number of the phase it opened: the held call whose answer (an approval, or a
    rejection that let the task go on) opened that phase."""

    @property
    def phase_rows(self) -> list[tuple[Phase, Approval | None]]:
        """Each phase with the answer that opened it (``None``: a start or a resumption)."""
        return [(p, self.answers.get(p.number)) for p in self.phases]


def task_detail(task_id: int, *, before: int | None = None) -> TaskDetail | None:
    """A task with everything its page shows; ``before`` pages back through the trace."""
    task = (
        Task.objects.filter(id=task_id)
        .select_related("created_by", "stop_requested_by", "trace_archive")
        .first()
    )
    if task is None:
        return None
    window = trace(task.id, before=before)
    earlier = bool(window) and window[0].seq > 1
    last_seq = window[-1].seq if window else 0
    held = None
    if task.waits_for_approval:
        held = task.approvals.filter(state=ApprovalState.PENDING, phase=task.phase).first()
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
        approval=held,
        answers=_phase_answers(task),
    )


def _phase_answers(task: Task) -> dict[int, Approval]:
    """The answers that opened phases, by the phase each opened: an approval always opens
    the next phase; a rejection only when it let the task go on (one that ended it opened
    none, and a later resumption's phase is not its)."""
    opened = task.approvals.filter(
        Q(state=ApprovalState.APPROVED) | Q(state=ApprovalState.REJECTED, on_reject=OnReject.RESUME)
    )
    return {a.phase + 1: a for a in opened.only("id", "task_id", "phase", "state", "tool")}


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


def trace(task_id: int, *, after: int | None = None, before: int | None = None) -> list[TraceEvent]:
    """A window of a task's trace in order: new events after ``after``, or the
    ``TRACE_WINDOW`` events before ``before`` (default: the latest)."""
    qs = TraceEvent.objects.filter(task_id=task_id)
    if after is not None:
        return list(qs.filter(seq__gt=after).order_by("seq")[:TRACE_WINDOW])
    if before is not None:
        qs = qs.filter(seq__lt=before)
    return list(reversed(qs.order_by("-seq")[:TRACE_WINDOW]))


SUMMARY_WAIT = timedelta(seconds=30)
"""How long after a stop a task page keeps asking for the summary turn's text: the turn is
one model call, and a worker that died during it never adds one."""


def summary_pending(task: Task, latest: StopReport | None) -> bool:
    """Whether a stopped task's summary turn is still to come: its driver said one follows
    (``summary_due`` in the stop report it stored, ``latest``), none has arrived yet, and
    the stop was moments ago (a worker that died during the turn leaves none)."""
    if not task.is_terminal or latest is None or latest.phase != task.phase:
        return False
    stored = latest.report or {}
    if not stored.get("summary_due") or stored.get("summary"):
        return False
    return task.finished_at is not None and timezone.now() - task.finished_at <= SUMMARY_WAIT


def latest_report(task_id: int) -> StopReport | None:
    """The task's latest stop report (one indexed query), or ``None``."""
    return (
        StopReport.objects.filter(task_id=task_id)
        .select_related("task", "task__stop_requested_by")
        .order_by("-phase", "-id")
        .first()
    )


@dataclass(frozen=True)
class ReportBudget:
    """One budget as a stop report left it: spent, and what was left (``None``: no limit,
    or a limit per ``PENDING`` job rather than the task's total)."""

    label: str
    used: int | None
    remaining: int | None
    per_job: bool


def report_budgets(report: Mapping[str, Any]) -> list[ReportBudget]:
    """The stop report's budgets, one per ``guard.steps.DIMENSIONS`` entry, in order."""
    used = report.get("used") or {}
    left = report.get("remaining_budget") or {}
    return [
        ReportBudget(d.label, used.get(d.used), None if d.per_job else left.get(d.limit), d.per_job)
        for d in DIMENSIONS
    ]


def report_document(stored: StopReport) -> dict[str, Any]:
    """The stop report as exported: which task, agent and phase, when it stopped and who
    asked it to (an operator's stop; ``None`` when the guard stopped it), in UTC, then the
    guard's report itself."""
    task = stored.task
    stopper = task.stop_requested_by if task.stop_requested_at is not None else None
    return {
        "task_id": task.id,
        "agent": task.agent,
        "phase": stored.phase,
        "created_at": _utc(task.created_at),
        "stopped_at": _utc(stored.at),
        "stop_requested_at": _utc(task.stop_requested_at),
        "stopped_by": stopper.get_username() if stopper is not None else None,
        "stop_note": task.stop_note if stopper is not None else "",
        **stored.report,
    }


def _utc(value: datetime | None) -> str | None:
    """ISO 8601 in UTC, whatever zone the viewer's pages use."""
    return None if value is None else value.astimezone(UTC).isoformat()


@dataclass
class Resumption:
    """What an approver weighs before opening a stopped task's new phase."""

    detail: TaskDetail
    budget: str
    """The limit the task ran out of, which the grant must raise (``""``: none ran out)."""
    uncertain: list[Operation]
    """Its writes that may or may not have happened: while there are any, it cannot resume."""
    condition: str
    """What must hold for it to resume."""

    @property
    def budget_label(self) -> str:
        """The budget it ran out of, in words (``model calls``), for people."""
        return next((d.label for d in DIMENSIONS if d.limit == self.budget), self.budget)


def resumption(task_id: int) -> Resumption | None:
    """The resume page of a task, or ``None`` if there is no such task."""
    detail = task_detail(task_id)
    if detail is None:
        return None
    task = detail.task
    uncertain = [op for op in detail.operations if op.state in UNCERTAIN]
    # The stop report's condition was written when the task stopped; whether a write is
    # still uncertain is decided now.
    condition = detail.reports[0].report.get("resume_condition", "") if detail.reports else ""
    if not uncertain and task.reason in _GUARD_REASONS:
        condition = RESUME_CONDITIONS[Reason(task.reason)]
    return Resumption(detail, BUDGET_OF_REASON.get(task.reason, ""), uncertain, condition)


_GUARD_REASONS = frozenset(reason.value for reason in Reason)


# -- starting ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class AgentCard:
    """A registered agent as the start page presents it."""

    name: str
    title: str
    description: str
    example: str
    """Its example input, as the JSON text a person may paste."""


def startable_agents() -> list[AgentCard]:
    """Every registered agent that loads, in settings order (one that does not is logged)."""
    cards = []
    for name in settings.LOOPGUARD_AGENTS:
        try:
            cls = agent_class(name)
        except (UnknownAgent, ImportError, TypeError):
            logger.exception("agent %s cannot be loaded", name)
            continue
        example = json.dumps(dict(cls.example_input))
        cards.append(AgentCard(name, cls.title, cls.description, example))
    return cards


# -- operations --------------------------------------------------------------------------------


UNCERTAIN = UNSETTLED_STATES
"""Operation states a human may have to settle (an ``IN_FLIGHT`` one once its driver is gone)."""


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
        | Q(state=OperationState.IN_FLIGHT) & ~lease_alive(now, via="task__")
    )


@dataclass(frozen=True)
class QueueRow:
    """One uncertain write on the reconciliation page."""

    op: Operation
    age: timedelta
    """How long it has been uncertain."""
    found: Mapping[str, Any] | None
    """What a lookup just found out about it, if one was run."""
    typed: Mapping[str, str] | None = None
    """What a reconciler just typed into its form, by field, when it was refused."""
    history: tuple[OperationEvent, ...] = ()
    """What the ledger knows: the operation's moves so far, oldest first (who claimed it,
    what made it uncertain)."""
    elsewhere: tuple[Operation, ...] = ()
    """The same call (tool and arguments: the fingerprint) committed under another key,
    newest first: the action may have happened after all, for another task."""
    looked_up: AuditEntry | None = None
    """The last lookup a person ran on it, with what the business system said then."""


@dataclass
class Reconciliation:
    """The reconciliation page: the oldest uncertain writes, and how many there are."""

    rows: list[QueueRow]
    total: int

    @property
    def version(self) -> str:
        """What :func:`reconciliation_version` says of the queue as this page shows it."""
        return _queue_version(
            self.total, [(r.op.id, r.op.state, r.op.updated_at) for r in self.rows]
        )


def reconciliation(
    found: Mapping[int, Mapping[str, Any]] | None = None,
    *,
    typed: Mapping[int, Mapping[str, str]] | None = None,
) -> Reconciliation:
    """The reconciliation page; ``found`` puts lookups' answers beside their operations (by
    id), ``typed`` what was typed into a refused form."""
    now = timezone.now()
    ops = reconciliation_queue()
    history, elsewhere, looked_up = _what_is_known(ops)
    rows = [
        QueueRow(
            op,
            now - op.updated_at,
            (found or {}).get(op.id),
            (typed or {}).get(op.id),
            tuple(history.get(op.id, ())),
            tuple(elsewhere.get(op.fingerprint, ())[:ELSEWHERE_SHOWN]),
            looked_up.get(op.id),
        )
        for op in ops
    ]
    return Reconciliation(rows, reconciliation_count())


def _what_is_known(
    ops: list[Operation],
) -> tuple[dict[int, list[OperationEvent]], dict[str, list[Operation]], dict[int, AuditEntry]]:
    """For the queue's operations, in three queries whatever their number: their moves, the
    same calls committed under other keys, and the last lookup of each."""
    ids = [op.id for op in ops]
    history: dict[int, list[OperationEvent]] = {}
    elsewhere: dict[str, list[Operation]] = {}
    looked_up: dict[int, AuditEntry] = {}
    if not ids:
        return history, elsewhere, looked_up
    moves = OperationEvent.objects.filter(operation_id__in=ids).select_related("actor")
    for event in moves.order_by("at", "id"):
        history.setdefault(event.operation_id, []).append(event)
    # operation_fingerprint serves this; a handful per call is plenty to act on.
    same = (
        Operation.objects.filter(
            fingerprint__in={op.fingerprint for op in ops}, state=OperationState.COMMITTED
        )
        .exclude(id__in=ids)
        .order_by("-updated_at", "-id")[: ELSEWHERE_SHOWN * len(ids)]
    )
    for other in same:
        elsewhere.setdefault(other.fingerprint, []).append(other)
    last = AuditEntry.objects.filter(
        operation_id=OuterRef("pk"), action=AuditAction.LOOKUP
    ).order_by("-at", "-id")
    latest = Operation.objects.filter(id__in=ids).annotate(last=Subquery(last.values("id")[:1]))
    entry_ids = [row.last for row in latest.only("id") if row.last is not None]
    for entry in AuditEntry.objects.filter(id__in=entry_ids).select_related("actor"):
        if entry.operation_id is not None:
            looked_up[entry.operation_id] = entry
    return history, elsewhere, looked_up


def reconciliation_version() -> str:
    """A short hash of what the reconciliation page shows (its rows' ids, states and times,
    and how many there are): it changes when anything the page shows does."""
    rows = list(
        _unsettled()
        .order_by("updated_at", "id")
        .values_list("id", "state", "updated_at")[:QUEUE_LIMIT]
    )
    return _queue_version(reconciliation_count(), rows)


def _queue_version(total: int, rows: Sequence[tuple[int, str, datetime]]) -> str:
    seen = json.dumps([total, [[i, s, t.isoformat()] for i, s, t in rows]])
    return hashlib.sha256(seen.encode()).hexdigest()[:16]


def operation(key: str) -> Operation | None:
    return Operation.objects.filter(key=key).select_related("task").first()


# -- approvals ---------------------------------------------------------------------------------


def _pending() -> QuerySet[Approval]:
    # The partial index approval_pending (requested_at, where PENDING) serves these.
    return Approval.objects.filter(state=ApprovalState.PENDING)


def approval_count() -> int:
    """How many calls wait for a person's approval in all."""
    return _pending().count()


def approval_queue(*, limit: int | None = APPROVALS_SHOWN) -> list[Approval]:
    """The calls waiting for approval, oldest first, each with its task (one query)."""
    qs = _pending().select_related("task").order_by("requested_at", "id")
    return list(qs[:limit] if limit else qs)


@dataclass(frozen=True)
class ApprovalRow:
    """One held call on the approval page."""

    approval: Approval
    age: timedelta
    """How long it has waited."""
    typed: Mapping[str, str] | None = None
    """What an approver just typed into its form, by field, when the answer was refused."""

    @property
    def gauges(self) -> list[Gauge]:
        """Its task's budgets, spent and left: an approved call spends from them."""
        return gauges(self.approval.task)


@dataclass(frozen=True)
class Refusal:
    """An answer the console did not record, shown with what was typed so it is not lost."""

    approval_id: int
    message: str
    typed: Mapping[str, str]


@dataclass
class ApprovalQueue:
    """The approval page: the oldest held calls, how many there are, and the answers of the
    last 24 hours (from the audit log: who, what, why)."""

    rows: list[ApprovalRow]
    total: int
    answered: list[AuditEntry]
    refusal: Refusal | None = None
    """An answer just refused for a call no longer in the queue (someone answered first)."""

    @property
    def version(self) -> str:
        """What :func:`approvals_version` says of the queue as this page shows it."""
        return _approvals_version(self.total, [r.approval.id for r in self.rows])


def approvals(
    *, typed: Mapping[int, Mapping[str, str]] | None = None, refused: str = ""
) -> ApprovalQueue:
    """The approval page; ``typed`` puts what was typed into a refused form back into it (by
    approval id), and ``refused`` says why it was refused. A call that is no longer pending
    gets its typed text shown apart, as a :class:`Refusal`."""
    now = timezone.now()
    held = approval_queue()
    rows = [ApprovalRow(a, now - a.requested_at, (typed or {}).get(a.id)) for a in held]
    refusal = None
    shown = {a.id for a in held}
    for approval_id, text in (typed or {}).items():
        if approval_id not in shown:
            refusal = Refusal(approval_id, refused, text)
    total = approval_count() if len(held) == APPROVALS_SHOWN else len(held)
    return ApprovalQueue(rows, total, answered_approvals(now=now), refusal)


def answered_approvals(*, now: datetime | None = None) -> list[AuditEntry]:
    """The answers given in the last 24 hours, the latest first, as their audit entries
    (who, when, why, and the approval answered): the audit_at index serves the window."""
    since = (now or timezone.now()) - RECENT
    return list(
        AuditEntry.objects.filter(
            action__in=[AuditAction.APPROVE_CALL, AuditAction.REJECT_CALL], at__gte=since
        )
        .select_related("actor", "approval", "task")
        .order_by("-at", "-id")[:APPROVALS_SHOWN]
    )


def approvals_version() -> str:
    """A short hash of which calls the approval page holds: it changes when a call is held
    or answered."""
    ids = list(
        _pending().order_by("requested_at", "id").values_list("id", flat=True)[:APPROVALS_SHOWN]
    )
    total = approval_count() if len(ids) == APPROVALS_SHOWN else len(ids)
    return _approvals_version(total, ids)


def _approvals_version(total: int, ids: Sequence[int]) -> str:
    seen = json.dumps([total, list(ids)])
    return hashlib.sha256(seen.encode()).hexdigest()[:16]


def approval(approval_id: int) -> Approval | None:
    """One approval with its task and who answered it, or ``None``."""
    return Approval.objects.filter(id=approval_id).select_related("task", "decided_by").first()


def approval_list(state: str, *, limit: int = APPROVALS_SHOWN) -> list[Approval]:
    """Approvals in ``state``: pending ones oldest first (the queue's order), answered ones
    the latest answer first; at most ``limit``."""
    qs = Approval.objects.filter(state=state).select_related("task", "decided_by")
    if state == ApprovalState.PENDING:
        qs = qs.order_by("requested_at", "id")
    else:
        qs = qs.order_by("-decided_at", "-id")
    return list(qs[:limit])


# -- audit -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AuditFilters(_Filters):
    """The audit log's filters."""

    LOOKUPS: ClassVar[Mapping[str, str]] = {
        "actor": "actor__username",
        "action": "action",
        "task": "task_id",
        "since": "at__gte",
        "until": "at__lt",
    }
    actor: str = ""
    action: str = ""
    task: int | None = None

    @classmethod
    def _read(cls, query: Mapping[str, str], errors: dict[str, str]) -> dict[str, Any]:
        raw_task = query.get("task", "").strip().removeprefix("#")
        task = int(raw_task) if re.fullmatch(r"\d{1,18}", raw_task) else None
        if raw_task and task is None:
            errors["task"] = f"{raw_task!r} is not a task id"
        return {
            "actor": query.get("actor", "").strip()[:150],
            "action": _one_of(query, "action", AuditAction.values, errors),
            "task": task,
        }


def audit_entries(filters: AuditFilters) -> QuerySet[AuditEntry]:
    """Audit entries matching ``filters``, newest first."""
    return filters.apply(AuditEntry.objects.select_related("actor", "operation")).order_by(
        "-at", "-id"
    )


def audit_page(filters: AuditFilters, query: Mapping[str, str]) -> ListPage[AuditEntry]:
    """The page of the audit log that ``query``'s ``after`` or ``before`` asks for (none:
    the latest entries), with how many entries the filters match (:class:`Tally`)."""
    return _list_page(audit_entries(filters), "at", query, AUDIT_PER_PAGE)


ABSENT: Any = type("Absent", (), {"__repr__": lambda self: "ABSENT"})()
"""A field an audit entry's ``before`` or ``after`` does not name (unlike ``None``, a value)."""


@dataclass(frozen=True)
class FieldChange:
    """One field an audited action changed: where it sits (``("limits", "spend")``), and
    its value before and after, :data:`ABSENT` on the side that does not name it."""

    path: tuple[str, ...]
    before: Any
    after: Any


def audit_changes(before: Any, after: Any) -> list[FieldChange]:
    """What an audit entry's ``before`` → ``after`` changed, field by field: nested records
    (a resumption's limits, a lookup's answer) down to their leaves, in the order the
    entry names them (``before``'s fields first); a field that kept its value is left out.
    """
    changes: list[FieldChange] = []

    def walk(path: tuple[str, ...], old: Any, new: Any) -> None:
        olds = old if isinstance(old, Mapping) else {} if old is ABSENT else None
        news = new if isinstance(new, Mapping) else {} if new is ABSENT else None
        if olds is not None and news is not None and (olds or news):
            for name in [*olds, *(name for name in news if name not in olds)]:
                walk((*path, str(name)), olds.get(name, ABSENT), news.get(name, ABSENT))
            return
        if old != new:
            changes.append(FieldChange(path, old, new))

    walk((), before if before is not None else {}, after if after is not None else {})
    return changes


AUDIT_COLUMNS = ("at", "actor", "action", "task", "operation", "reason", "before", "after")


def audit_rows(filters: AuditFilters) -> Iterator[dict[str, Any]]:
    """Every entry matching ``filters`` as plain values (``AUDIT_COLUMNS``), newest first,
    read in chunks: an export of the whole log never holds it in memory."""
    for entry in audit_entries(filters).iterator(chunk_size=2000):
        yield {
            "at": entry.at.isoformat(),
            "actor": entry.actor.get_username(),
            "action": entry.action,
            "task": entry.task_id,
            "operation": entry.operation.key if entry.operation else None,
            "reason": entry.reason,
            "before": entry.before,
            "after": entry.after,
        }


# -- dashboard trends --------------------------------------------------------------------------

TREND_HOURS = 24  # the hourly charts cover this many hours, the current one last
STOPS_WEEK = timedelta(days=7)


@dataclass(frozen=True)
class Trends:
    """The dashboard's charts: what stopped and why, what started and finished per hour,
    and how long steps took; counted in the database, a fixed three queries."""

    at: datetime
    """When the numbers were counted."""
    stops_day: list[tuple[str, int]]
    """Tasks that stopped in the last 24 hours by their stop reason, most first."""
    stops_week: list[tuple[str, int]]
    """The same over the last 7 days."""
    hours: list[datetime]
    """The start of each hour charted (UTC), oldest first; the last is the current one."""
    started: list[int]
    """Tasks created in each hour of ``hours``."""
    finished: list[int]
    """Tasks that stopped (in any terminal state, or for a human) in each hour."""
    latency_p50: list[int | None]
    """Median ``latency_ms`` of the model calls and tool requests of each hour (``None``: no
    step in that hour)."""
    latency_p95: list[int | None]
    latency_note: str = ""
    """Why there is no latency chart, when there cannot be one (SQLite)."""


def _stopped_since(since: datetime) -> Q:
    # Finished in the window and not held for a human, or held and still held within it
    # (updated_at is never earlier than finished_at: a hold sets both, later writes move
    # updated_at only). The window on finished_at is task_stopped's range; the rest is read
    # from the columns it includes, so no task row is fetched.
    return Q(finished_at__gte=since) & (
        Q(finished_at__isnull=False) & ~Q(state=TaskState.NEEDS_HUMAN)
        | Q(state=TaskState.NEEDS_HUMAN, updated_at__gte=since)
    )


def trends(*, now: datetime | None = None) -> Trends:
    """The dashboard's charts, counted in the database in four queries (``date_trunc``
    per hour, ``percentile_cont`` for latency) over windows the indexes serve, each read
    from the index alone: ``task_created`` for starts, ``task_stopped`` (the stop's time,
    state, reason) for stops; for latency, the closed hours beat has counted (``HourStat``,
    ``console.rollups``) and ``trace_latency`` for the rest (the current hour, or every
    hour when no beat runs). SQLite (standalone mode) draws every chart but latency."""
    now = now or timezone.now()
    current = hour_of(now)
    hours = [current - timedelta(hours=TREND_HOURS - 1 - i) for i in range(TREND_HOURS)]
    index = {hour: i for i, hour in enumerate(hours)}
    week, today, finished = _stops_by_reason(now, index)
    if connection.vendor == "postgresql":
        p50, p95 = _latency_per_hour(hours, index)
        note = ""
    else:
        p50, p95 = [None] * TREND_HOURS, [None] * TREND_HOURS
        note = "Step latency percentiles need PostgreSQL; this console runs on SQLite."
    return Trends(
        at=now,
        stops_day=_most_first(today),
        stops_week=_most_first(week),
        hours=hours,
        started=_starts_per_hour(hours, index),
        finished=finished,
        latency_p50=p50,
        latency_p95=p95,
        latency_note=note,
    )


def _stops_by_reason(
    now: datetime, index: Mapping[datetime, int]
) -> tuple[dict[str, int], dict[str, int], list[int]]:
    """Stops by reason over 7 days and over 24 hours, and stops per charted hour, in one
    pass over the week's stops: grouped by reason and by the hour of each stop of the last
    24 hours (NULL for the older ones), at most (reasons x 25) rows."""
    day = now - RECENT
    stops = (
        Task.objects.filter(_stopped_since(now - STOPS_WEEK))
        .annotate(
            hour=Case(
                When(finished_at__gte=day, then=TruncHour("finished_at", tzinfo=UTC)),
                default=None,
            )
        )
        .values("reason", "hour")
        # COUNT(*), not of ids: task_stopped holds every column this reads, not the id.
        .annotate(n=Count("*"))
        .order_by()
    )
    week: dict[str, int] = {}
    today: dict[str, int] = {}
    finished = [0] * TREND_HOURS
    for stop in stops:
        reason, n = str(stop["reason"]), int(stop["n"])
        week[reason] = week.get(reason, 0) + n
        if stop["hour"] is not None:
            today[reason] = today.get(reason, 0) + n
            # The hour before the first charted one holds the window's first minutes.
            # Inside CASE, date_trunc's value skips TruncHour's conversion: PostgreSQL
            # hands back the UTC wall time without a zone (hour_of reads it as UTC's).
            if (i := index.get(hour_of(stop["hour"]))) is not None:
                finished[i] += n
    return week, today, finished


def _starts_per_hour(hours: Sequence[datetime], index: Mapping[datetime, int]) -> list[int]:
    """Tasks created in each charted hour."""
    started = [0] * TREND_HOURS
    for start in (
        Task.objects.filter(created_at__gte=hours[0])
        .annotate(hour=TruncHour("created_at", tzinfo=UTC))
        .values("hour")
        .annotate(n=Count("id"))
        .order_by()
    ):
        if (i := index.get(start["hour"])) is not None:
            started[i] = int(start["n"])
    return started


def _latency_per_hour(
    hours: Sequence[datetime], index: Mapping[datetime, int]
) -> tuple[list[int | None], list[int | None]]:
    """The step latency's p50 and p95 in each charted hour (PostgreSQL): the closed hours
    beat counted (``HourStat``), the rest from the trace's index."""
    p50: list[int | None] = [None] * TREND_HOURS
    p95: list[int | None] = [None] * TREND_HOURS
    counted = {
        row.hour: row for row in HourStat.objects.filter(hour__gte=hours[0], hour__lt=hours[-1])
    }
    for hour, row in counted.items():
        if (i := index.get(hour)) is not None:
            p50[i], p95[i] = row.latency_p50, row.latency_p95
    since = next(hour for hour in hours if hour not in counted)
    for step in (
        TraceEvent.objects.filter(at__gte=since, latency_ms__isnull=False)
        .annotate(hour=TruncHour("at", tzinfo=UTC))
        .values("hour")
        .annotate(p50=Percentile("latency_ms", 0.5), p95=Percentile("latency_ms", 0.95))
        .order_by()
    ):
        if (i := index.get(step["hour"])) is not None and step["hour"] not in counted:
            p50[i], p95[i] = round(step["p50"]), round(step["p95"])
    return p50, p95


def _most_first(counts: Mapping[str, int]) -> list[tuple[str, int]]:
    return sorted(counts.items(), key=lambda item: (-item[1], item[0]))
