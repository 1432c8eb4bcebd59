"""Roll-ups: what the dashboard and ``/metrics`` would otherwise count over all of history on
every look, counted once by beat (``console.tasks.roll_up``) and kept in a few rows.

- **Tasks** (``/metrics``' tasks by state and budgets spent by agent): a task that stopped
  more than :data:`SETTLE` ago is added to its agent's and state's :class:`TaskTotal` and
  marked ``rolled``, under its row lock. Anything that changes a rolled task afterwards (a
  resumption, a cancel or close of a held task, a summary turn's spend) first takes it back
  out (:func:`unroll`, called by ``console.lifecycle``, under the same row lock), so a task
  is always counted exactly once: in the totals, or among the tasks not rolled, which
  ``/metrics`` adds live (the partial index ``task_unrolled``).
- **Stop reports** (``loopguard_stops_total``): append-only, so counted forward in time:
  every report stamped before ``Rollup.stops_before`` is in ``Rollup.stops``; ``/metrics``
  counts the rest (``stop_report_at``).
- **The trace's hours** (the dashboard's step latency chart and spend): each closed hour's
  steps, latency percentiles and spend in an :class:`HourStat`. The last day's hours are
  counted again on every pass, so a step whose events were saved late (a model call's event
  travels with the save after its tool) still lands in its hour; older hours are final.
  Readers count what has no row yet (the current hour, or every hour when no beat runs).

A reader that adds live rows to rolled ones reads both in one snapshot
(``console.store.queries.snapshot``), so that a roll committing between them neither hides
nor doubles anything.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import connection, transaction
from django.db.models import Count, Sum
from django.db.models.functions import TruncHour
from django.utils import timezone

from console.models import (
    TERMINAL_STATES,
    HourStat,
    Percentile,
    Rollup,
    StopReport,
    Task,
    TaskTotal,
    TraceEvent,
)
from guard.steps import DIMENSIONS

SETTLE = timedelta(minutes=10)
"""How long after its stop a task is rolled, and how old a stop report must be before it is
counted: a summary turn comes within seconds of its stop (rolling before it would only be
undone), and a report's stamp is taken in the transaction that stores it, which is short."""
TASK_BATCH = 2000
"""Tasks rolled per transaction (a first pass over a million tasks goes in steps)."""
RECOUNT = timedelta(hours=24)
"""Closed hours of the trace counted again on every pass; older ones are final."""
KEEP = timedelta(days=8)
"""How far back a pass makes the hours that have no row: the dashboard's week, and a day."""
USED: tuple[str, ...] = tuple(d.used for d in DIMENSIONS)
"""The counters a :class:`TaskTotal` sums: every budget of ``DIMENSIONS``."""


@dataclass(frozen=True)
class Rolled:
    """What one pass did."""

    tasks: int
    stops: int
    hours: int


def roll(now: datetime | None = None, *, seconds: float = 20.0) -> Rolled:
    """One pass of beat: tasks stopped a while (as many as ``seconds`` allow, in batches),
    stop reports, and the trace's hours. Safe to run at any time and twice at once."""
    now = now or timezone.now()
    return Rolled(
        tasks=roll_tasks(now, until=time.monotonic() + seconds),
        stops=roll_stops(now),
        hours=count_hours(now),
    )


# -- tasks -------------------------------------------------------------------------------------


def roll_tasks(now: datetime, *, until: float) -> int:
    """Add the tasks that stopped before ``now - SETTLE`` and are not rolled to their
    totals; returns how many. Each batch holds its tasks' rows (``SKIP LOCKED``: a task
    another transaction holds, being moved or stepped, waits for the next pass)."""
    rolled, after = 0, 0
    while time.monotonic() < until:
        with transaction.atomic():
            rows = list(
                Task.objects.select_for_update(skip_locked=True)
                # Stopped as lifecycle._moved tells a stop (it unrolls a task leaving one).
                .filter(rolled=False, id__gt=after, finished_at__lt=now - SETTLE)
                .filter(state__in=sorted(TERMINAL_STATES))
                .order_by("id")
                .values("id", "agent", "state", *USED)[:TASK_BATCH]
            )
            if not rows:
                break
            ids = [row["id"] for row in rows]
            Task.objects.filter(id__in=ids).update(rolled=True)
            _add(rows, sign=1)
        rolled, after = rolled + len(rows), ids[-1]
    return rolled


def unroll(task_id: int) -> None:
    """Take a rolled task back out of its totals before it changes (its state, its
    counters): in the caller's transaction, under the task's row lock. Nothing for a task
    that is not rolled."""
    with transaction.atomic(savepoint=False):
        row = (
            Task.objects.select_for_update()
            .filter(id=task_id, rolled=True)
            .values("id", "agent", "state", *USED)
            .first()
        )
        if row is None:
            return
        Task.objects.filter(id=task_id).update(rolled=False)
        _add([row], sign=-1)


def _add(rows: Iterable[Mapping[str, Any]], *, sign: int) -> None:
    """Add (``sign`` 1) or take out (-1) tasks' counters to their agent's and state's
    totals. Totals are locked in one order (agent, state), so passes never deadlock."""
    sums: dict[tuple[str, str], list[int]] = {}
    for row in rows:
        key = (str(row["agent"]), str(row["state"]))
        into = sums.setdefault(key, [0] * (len(USED) + 1))
        into[0] += 1
        for i, name in enumerate(USED, start=1):
            into[i] += int(row[name] or 0)
    # Every total there first (two passes making the same new one would collide on its
    # unique key), so that each is then locked and moved on its row.
    TaskTotal.objects.bulk_create(
        [TaskTotal(agent=agent, state=state, spent={}) for agent, state in sorted(sums)],
        ignore_conflicts=True,
    )
    for (agent, state), (tasks, *counters) in sorted(sums.items()):
        total = TaskTotal.objects.select_for_update().get(agent=agent, state=state)
        total.tasks += sign * tasks
        total.spent = {
            name: int(total.spent.get(name, 0)) + sign * n
            for name, n in zip(USED, counters, strict=True)
        }
        total.save()


# -- stop reports ------------------------------------------------------------------------------


def roll_stops(now: datetime) -> int:
    """Count the stop reports stamped before ``now - SETTLE`` that are not counted yet;
    returns how many. One pass at a time (the roll-up row, locked; another pass skips)."""
    Rollup.objects.bulk_create([Rollup(id=1)], ignore_conflicts=True)  # a flushed database
    before = now - SETTLE
    with transaction.atomic():
        mark = Rollup.objects.select_for_update(skip_locked=True).filter(id=1).first()
        if mark is None or (mark.stops_before is not None and mark.stops_before >= before):
            return 0
        reports = StopReport.objects.filter(at__lt=before)
        if mark.stops_before is not None:
            reports = reports.filter(at__gte=mark.stops_before)
        counted = 0
        stops = dict(mark.stops)
        for row in reports.values("state", "reason").annotate(n=Count("*")).order_by():
            key = stops_key_of(row["state"], row["reason"])
            stops[key] = int(stops.get(key, 0)) + row["n"]
            counted += row["n"]
        mark.stops, mark.stops_before = stops, before
        mark.save(update_fields=["stops", "stops_before"])
    return counted


def stops_key_of(state: str, reason: str) -> str:
    """The key of ``Rollup.stops`` that counts stops in ``state`` for ``reason``."""
    return f"{state} {reason}"


def stops_key(key: str) -> tuple[str, str]:
    """A key of ``Rollup.stops`` as (state, reason)."""
    state, _, reason = key.partition(" ")
    return state, reason


# -- the trace's hours -------------------------------------------------------------------------


def hour_of(at: datetime) -> datetime:
    """The start of the UTC hour ``at`` falls in (a time without a zone is UTC's)."""
    at = at.replace(tzinfo=UTC) if at.tzinfo is None else at.astimezone(UTC)
    return at.replace(minute=0, second=0, microsecond=0)


def count_hours(now: datetime) -> int:
    """Count the trace's closed hours: the last day's again, and every hour of the last
    :data:`KEEP` that has no row; returns how many hours were written."""
    closed = hour_of(now)  # every hour before it has ended
    recount = closed - RECOUNT
    have = set(
        HourStat.objects.filter(hour__gte=closed - KEEP, hour__lt=recount).values_list(
            "hour", flat=True
        )
    )
    start = recount
    hour = closed - KEEP
    while hour < recount:
        if hour not in have:
            start = hour
            break
        hour += timedelta(hours=1)
    stats = hours_between(start, closed)
    counted_at = timezone.now()
    HourStat.objects.bulk_create(
        [
            HourStat(hour=hour, counted_at=counted_at, **values)
            for hour, values in sorted(stats.items())
        ],
        update_conflicts=True,
        unique_fields=["hour"],
        update_fields=["steps", "latency_p50", "latency_p95", "spend", "counted_at"],
    )
    return len(stats)


def hours_between(since: datetime, until: datetime) -> dict[datetime, dict[str, Any]]:
    """Each hour from ``since`` up to ``until`` (both on the hour): its steps, their latency
    percentiles (PostgreSQL only) and its spend, counted from the trace in two queries."""
    stats: dict[datetime, dict[str, Any]] = {}
    hour = since
    while hour < until:
        stats[hour] = {"steps": 0, "latency_p50": None, "latency_p95": None, "spend": 0}
        hour += timedelta(hours=1)
    if not stats:
        return stats
    window = {"at__gte": since, "at__lt": until}
    percentiles: dict[str, Any] = {}
    if connection.vendor == "postgresql":
        percentiles = {
            "p50": Percentile("latency_ms", 0.5),
            "p95": Percentile("latency_ms", 0.95),
        }
    steps: Iterable[Mapping[str, Any]] = (
        TraceEvent.objects.filter(latency_ms__isnull=False, **window)
        .annotate(hour=TruncHour("at", tzinfo=UTC))
        .values("hour")
        .annotate(n=Count("*"), **percentiles)
        .order_by()
    )
    for row in steps:
        into = stats[hour_of(row["hour"])]
        into["steps"] = row["n"]
        if percentiles:
            into["latency_p50"], into["latency_p95"] = round(row["p50"]), round(row["p95"])
    costs: Iterable[Mapping[str, Any]] = (
        TraceEvent.objects.filter(cost__isnull=False, **window)
        .annotate(hour=TruncHour("at", tzinfo=UTC))
        .values("hour")
        .annotate(spend=Sum("cost"))
        .order_by()
    )
    for row in costs:
        stats[hour_of(row["hour"])]["spend"] = int(row["spend"] or 0)
    return stats


__all__ = [
    "KEEP",
    "RECOUNT",
    "SETTLE",
    "USED",
    "Rolled",
    "count_hours",
    "hour_of",
    "hours_between",
    "roll",
    "roll_stops",
    "roll_tasks",
    "stops_key",
    "unroll",
]
