"""Prometheus metrics at ``/metrics``, in the text exposition format (version 0.0.4).

Every value is read from the database when Prometheus scrapes, with a fixed handful of
queries whatever the number of tasks: what grows with history (tasks, stop reports) is
rolled up by beat (``console.rollups``) and only the rest is counted here. So every web
process answers the same, a restart loses nothing, and workers need no metrics port of
their own. ``prometheus_client`` writes the
text, from a custom collector on a registry of this module's own: the library's metric
objects (and its global registry) keep values in process memory, which gunicorn's several
processes would each hold a part of; the collector keeps nothing between scrapes.

Access: with ``LOOPGUARD_METRICS_TOKEN`` set, a scraper must send
``Authorization: Bearer <token>``; without it, only loopback clients are answered.
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth.decorators import login_not_required
from django.db.models import Count, F, Func, Q, Subquery, Sum
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from console.models import (
    UNSETTLED_STATES,
    EventKind,
    Operation,
    OperationState,
    Rollup,
    StopReport,
    Task,
    TaskState,
    TaskTotal,
    TraceEvent,
    TraceExport,
    TraceExportTotals,
    lease_alive,
    lease_lapsed,
)
from console.rollups import stops_key
from console.store import queries
from guard import Reason
from guard.steps import DIMENSIONS, Dimension

# The classic text format, whatever a scraper's Accept asks for: every Prometheus reads it.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
CHALLENGE = 'Bearer realm="loopguard-metrics"'
LATENCY_WINDOW = timedelta(hours=1)
# Upper bounds of the step latency buckets, in milliseconds (trace events store whole ms):
# from a cached read to a slow model call.
LATENCY_BUCKETS_MS = (5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10_000, 30_000, 60_000)
LATENCY_KINDS = (EventKind.MODEL_CALL.value, EventKind.REQUEST.value)
# Not summed by agent: a per-job budget (each poll is an execution already, in
# loopguard_executions), and elapsed time, a duration per task rather than work spent.
SPENT: tuple[Dimension, ...] = tuple(
    d for d in DIMENSIONS if not d.per_job and d.reason is not Reason.DEADLINE
)
"""The budgets summed by agent, each as ``loopguard_<used>``; a budget declared in
:data:`guard.steps.DIMENSIONS` gets its series here without another line."""
_MONEY = "Money spent on model calls, in minor units of LOOPGUARD_CURRENCY,"
_WHAT = {
    "spend": _MONEY,
    "explored": "Never-seen read results counted as exploration (the exploration budget),",
}
"""How a series says what it sums, where "<label> spent" would not read right."""


@dataclass(frozen=True)
class Latency:
    """Step latencies of one kind of trace event: a count per bucket (cumulative), sum, count."""

    buckets: tuple[int, ...]
    count: int
    sum_ms: int


@dataclass(frozen=True)
class Snapshot:
    """Everything ``/metrics`` shows, read at one moment."""

    tasks: dict[str, int]
    tasks_lease_expired: int
    spent: dict[str, dict[str, int]]  # budget dimension -> agent -> total
    operations_unknown: int
    operations_in_flight: int
    operations_in_flight_lease_expired: int
    stops: dict[tuple[str, str], int]  # (state, reason) -> stop reports
    latency: dict[str, Latency]  # event kind -> latencies
    trace_export: TraceExported = field(default_factory=lambda: TraceExported(0, 0, 0))


@dataclass(frozen=True)
class TraceExported:
    """The trace's export to OpenTelemetry (console/drivers/otel.py): events the collector
    took, sends that failed, and events found in the trace and not sent yet."""

    exported: int
    failures: int
    waiting: int


def snapshot() -> Snapshot:
    """Read the metrics: a fixed handful of queries, each returning one row per group. The
    tasks and the stops add beat's roll-ups (``console.rollups``) to what is not rolled yet,
    both read in one snapshot."""
    now = timezone.now()
    with queries.snapshot():
        tasks, tasks_lease_expired, spent = _tasks(now)
        stops = _stops()
    unknown, in_flight, stranded = _operations(now)
    return Snapshot(
        tasks=tasks,
        tasks_lease_expired=tasks_lease_expired,
        spent=spent,
        operations_unknown=unknown,
        operations_in_flight=in_flight,
        operations_in_flight_lease_expired=stranded,
        stops=stops,
        latency=_latency(now - LATENCY_WINDOW),
        trace_export=_trace_export(),
    )


def _tasks(now: datetime) -> tuple[dict[str, int], int, dict[str, dict[str, int]]]:
    """Tasks by state, running ones with an expired lease, and budgets spent by agent: the
    rolled tasks' totals, and the tasks not rolled (``task_unrolled``: the queued, the
    running, the lately stopped) counted here."""
    tasks = dict.fromkeys(TaskState.values, 0)
    spent: dict[str, dict[str, int]] = {dim.used: {} for dim in SPENT}

    def add(agent: str, state: str, n: int, used: Mapping[str, Any]) -> None:
        tasks[state] = tasks.get(state, 0) + n
        for dim in SPENT:
            by_agent = spent[dim.used]
            by_agent[agent] = by_agent.get(agent, 0) + int(used.get(dim.used) or 0)

    for total in TaskTotal.objects.all():
        add(total.agent, total.state, total.tasks, total.spent)
    expired = 0
    rows: Iterable[Mapping[str, Any]] = (
        Task.objects.filter(rolled=False)
        .values("agent", "state")
        .annotate(
            n=Count("id"),
            expired=Count("id", filter=lease_lapsed(now)),
            **{dim.used: Sum(dim.used) for dim in SPENT},
        )
        .order_by()
    )
    for row in rows:
        add(row["agent"], row["state"], row["n"], row)
        expired += row["expired"]
    return tasks, expired, spent


def _operations(now: datetime) -> tuple[int, int, int]:
    """Unknown, in-flight, and in-flight operations whose task's lease ran out."""
    in_flight = Q(state=OperationState.IN_FLIGHT)
    # Only unsettled operations: the reconciliation queue's partial index serves this.
    counts = Operation.objects.filter(state__in=sorted(UNSETTLED_STATES)).aggregate(
        unknown=Count("id", filter=Q(state=OperationState.UNKNOWN)),
        in_flight=Count("id", filter=in_flight),
        # Its driver is gone (its task's lease is not alive, or it holds none at all): the
        # beat sweep turns these UNKNOWN within a sweep period, so one that stays means no
        # sweep is running.
        stranded=Count("id", filter=in_flight & ~lease_alive(now, via="task__")),
    )
    return counts["unknown"], counts["in_flight"], counts["stranded"]


def _stops() -> dict[tuple[str, str], int]:
    """Stop reports (one per stopped phase) by state and reason; history, so only grows:
    those beat counted (``Rollup.stops``) and the ones stamped since."""
    stops: dict[tuple[str, str], int] = {}
    mark = Rollup.objects.filter(id=1).first()
    reports = StopReport.objects.all()
    if mark is not None and mark.stops_before is not None:
        for key, n in mark.stops.items():
            stops[stops_key(key)] = int(n)
        reports = reports.filter(at__gte=mark.stops_before)
    # COUNT(*), not of ids: the index stop_report_at (or stop_report_state_reason, for a
    # database beat has not counted yet) answers it alone.
    for row in reports.values("state", "reason").annotate(n=Count("*")).order_by():
        key = (row["state"], row["reason"])
        stops[key] = stops.get(key, 0) + row["n"]
    return stops


def _latency(since: datetime) -> dict[str, Latency]:
    """Latencies of model calls and tool requests recorded since ``since``, bucketed."""
    # Counted on latency_ms (never NULL here), not on ids: trace_latency (at, with latency and
    # kind) then answers it alone.
    buckets = {
        f"le_{ms}": Count("latency_ms", filter=Q(latency_ms__lte=ms)) for ms in LATENCY_BUCKETS_MS
    }
    latency = {kind: Latency(tuple(0 for _ in LATENCY_BUCKETS_MS), 0, 0) for kind in LATENCY_KINDS}
    rows: Iterable[Mapping[str, Any]] = (
        TraceEvent.objects.filter(at__gte=since, latency_ms__isnull=False, kind__in=LATENCY_KINDS)
        .values("kind")
        .annotate(n=Count("*"), total=Sum("latency_ms"), **buckets)
        .order_by()
    )
    for row in rows:
        latency[row["kind"]] = Latency(
            buckets=tuple(row[f"le_{ms}"] for ms in LATENCY_BUCKETS_MS),
            count=row["n"],
            sum_ms=int(row["total"] or 0),
        )
    return latency


def _trace_export() -> TraceExported:
    """The export's totals row, with the events waiting summed in the same query (over the
    cursors behind their trace only: the partial index ``trace_export_waiting``)."""
    behind = TraceExport.objects.filter(seen_seq__gt=F("exported_seq"))
    # Func, not Sum: an aggregate over the whole filtered table, without the GROUP BY that
    # Django adds for an aggregate in annotate() (the docs' way to sum in a subquery).
    waiting = behind.order_by().annotate(
        n=Func(F("seen_seq") - F("exported_seq"), function="SUM")
    ).values("n")
    row = (
        TraceExportTotals.objects.filter(id=1)
        .annotate(waiting=Subquery(waiting))
        .values("exported", "failures", "waiting")
        .first()
    )
    if row is None:  # the row migration 0020 made is gone: nothing was exported
        return TraceExported(0, 0, 0)
    return TraceExported(row["exported"], row["failures"], int(row["waiting"] or 0))


# -- the families ------------------------------------------------------------------------------


def _families(snap: Snapshot) -> Iterator[Metric]:
    """The snapshot as Prometheus metric families, in the order they are served."""
    tasks = GaugeMetricFamily("loopguard_tasks", "Tasks by state.", labels=["state"])
    for state, n in sorted(snap.tasks.items()):
        tasks.add_metric([state], n)
    yield tasks
    yield GaugeMetricFamily(
        "loopguard_tasks_lease_expired",
        "Running tasks whose driver's lease ran out (the beat sweep recovers them).",
        value=snap.tasks_lease_expired,
    )
    yield GaugeMetricFamily(
        "loopguard_operations_unknown",
        "Write operations whose commit state is unknown, waiting for reconciliation.",
        value=snap.operations_unknown,
    )
    yield GaugeMetricFamily(
        "loopguard_operations_in_flight",
        "Write operations executing now.",
        value=snap.operations_in_flight,
    )
    yield GaugeMetricFamily(
        "loopguard_operations_in_flight_lease_expired",
        "In-flight write operations whose task's driver lost its lease (the sweep makes them"
        " UNKNOWN; one that stays means no sweep runs).",
        value=snap.operations_in_flight_lease_expired,
    )
    stops = CounterMetricFamily(
        "loopguard_stops_total",
        "Phases stopped, by terminal state and reason.",
        labels=["state", "reason"],
    )
    for (state, reason), n in sorted(snap.stops.items()):
        stops.add_metric([state, reason], n)
    yield stops
    for dim in SPENT:
        what = _WHAT.get(dim.used, f"{dim.label.capitalize()} spent")
        spent = GaugeMetricFamily(
            f"loopguard_{dim.used}",
            f"{what} by all tasks, by agent. A gauge, not a counter: a"
            " driver counts the next step ahead and corrects it when the task stops.",
            labels=["agent"],
        )
        for agent, total in sorted(snap.spent[dim.used].items()):
            spent.add_metric([agent], total)
        yield spent
    latency = HistogramMetricFamily(
        "loopguard_step_latency_seconds",
        "Latency of model calls and tool requests over the last hour (a moving window: use"
        " histogram_quantile on the buckets themselves, not on rate()).",
        labels=["kind"],
    )
    for kind in LATENCY_KINDS:
        lat = snap.latency[kind]
        buckets = [
            (f"{ms / 1000:g}", n) for ms, n in zip(LATENCY_BUCKETS_MS, lat.buckets, strict=True)
        ]
        latency.add_metric([kind], [*buckets, ("+Inf", lat.count)], lat.sum_ms / 1000)
    yield latency
    exported = snap.trace_export
    yield CounterMetricFamily(
        "loopguard_trace_exported_events",
        "Trace events the OpenTelemetry collector accepted as spans (at least once: an event"
        " may be sent again after a pass died between the collector's answer and its cursor).",
        value=exported.exported,
    )
    yield CounterMetricFamily(
        "loopguard_trace_export_failures",
        "Sends of trace events to the OpenTelemetry collector that failed (down, slow or"
        " refusing); their events wait and go with a later pass.",
        value=exported.failures,
    )
    yield GaugeMetricFamily(
        "loopguard_trace_export_waiting_events",
        "Trace events found and not yet accepted by the OpenTelemetry collector (growing: the"
        " collector is unreachable, or the export cannot keep up).",
        value=exported.waiting,
    )


class DatabaseCollector:
    """A ``prometheus_client`` collector that reads the database at each scrape (five
    queries) and keeps nothing between scrapes."""

    def collect(self) -> Iterator[Metric]:
        """Every family, read now."""
        return _families(snapshot())


REGISTRY = CollectorRegistry()
"""``/metrics``' own registry: only the database collector, none of the library's process
collectors (one process's CPU or memory would be a random gunicorn worker's)."""
REGISTRY.register(DatabaseCollector())


# -- the view ----------------------------------------------------------------------------------


def _is_loopback(address: str) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


def _refusal(request: HttpRequest) -> HttpResponse | None:
    """Why this request may not read the metrics, as a response; None if it may."""
    token: str = settings.LOOPGUARD_METRICS_TOKEN
    if token:
        scheme, _, given = request.META.get("HTTP_AUTHORIZATION", "").strip().partition(" ")
        # Compared in constant time: the token is a shared secret.
        if scheme.lower() == "bearer" and hmac.compare_digest(
            given.strip().encode(), token.encode()
        ):
            return None
        refused = HttpResponse(
            "send Authorization: Bearer <LOOPGUARD_METRICS_TOKEN>\n",
            status=401,
            content_type="text/plain; charset=utf-8",
        )
        refused["WWW-Authenticate"] = CHALLENGE
        return refused
    if _is_loopback(request.META.get("REMOTE_ADDR", "")):
        return None
    return HttpResponse(
        "metrics are served to loopback clients only; set LOOPGUARD_METRICS_TOKEN to scrape"
        " from elsewhere\n",
        status=403,
        content_type="text/plain; charset=utf-8",
    )


@login_not_required
@never_cache
@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    """Prometheus scrape endpoint (see the module docstring for who may read it)."""
    refused = _refusal(request)
    if refused is not None:
        return refused
    return HttpResponse(generate_latest(REGISTRY), content_type=CONTENT_TYPE)
