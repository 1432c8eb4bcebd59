"""Celery tasks: thin wrappers that pass ids, re-fetch, and call the runner."""

from __future__ import annotations

import logging

from celery import shared_task
from django.conf import settings
from django.db import close_old_connections
from django.utils import timezone

from console import rollups
from console.drivers import archive as trace_archive
from console.drivers import notifications, otel, runner
from console.store import history

logger = logging.getLogger(__name__)


@shared_task(name="console.tasks.run_task")  # type: ignore[untyped-decorator]
def run_task(task_id: int) -> str:
    """Drive one task (safe to deliver twice: the lease admits one driver)."""
    # A worker lives for days: drop connections a database restart broke before using them.
    close_old_connections()
    try:
        return runner.drive(task_id)
    finally:
        close_old_connections()


@shared_task(name="console.tasks.sweep")  # type: ignore[untyped-decorator]
def sweep() -> dict[str, int]:
    """Recover tasks whose driver died; re-enqueue queued tasks whose message was lost; stop
    attached tasks whose client never came back (``client_lost``)."""
    close_old_connections()
    counts = runner.sweep(enqueue=run_task.delay)
    if any(counts.values()):
        logger.info("sweep: %s", counts)
    return counts


@shared_task(name="console.tasks.notify")  # type: ignore[untyped-decorator]
def notify() -> int:
    """Route notification events into notices and hand each due notice to a delivery
    (beat runs it every few seconds; safe to run twice: rows are claimed, not assumed)."""
    close_old_connections()
    due = notifications.notify()
    for notice_id in due:
        deliver_notice.delay(notice_id)
    return len(due)


@shared_task(name="console.tasks.deliver_notice")  # type: ignore[untyped-decorator]
def deliver_notice(notice_id: int) -> str:
    """Try one notice once (safe to deliver twice: the claim admits one try at a time; a
    failed try waits for a later pass of :func:`notify`)."""
    close_old_connections()
    try:
        return notifications.deliver(notice_id)
    finally:
        close_old_connections()


@shared_task(name="console.tasks.partitions_ahead")  # type: ignore[untyped-decorator]
def partitions_ahead() -> list[str]:
    """Make the history tables' partitions ahead of their newest rows (beat, hourly; safe to
    run at any time: a partition made twice is refused, not doubled)."""
    close_old_connections()
    return history.partitions_ahead()


@shared_task(name="console.tasks.export_trace")  # type: ignore[untyped-decorator]
def export_trace() -> dict[str, int]:
    """Send the trace events added since the last pass to the OpenTelemetry collector, as
    spans (beat, every few seconds; nothing without an OTLP endpoint; safe to run twice at
    once: tasks are claimed, and a cursor moves only when the collector took its events)."""
    close_old_connections()
    done = otel.export_pass()
    return {"found": done.found, "exported": done.exported, "failures": done.failures}


@shared_task(name="console.tasks.roll_up")  # type: ignore[untyped-decorator]
def roll_up() -> dict[str, int]:
    """Roll up what ``/metrics`` and the dashboard would otherwise count over all of history
    (beat, every minute; safe to run twice at once: a task is held while it is rolled, stop
    reports are counted under one lock, an hour is written whole)."""
    close_old_connections()
    done = rollups.roll()
    return {"tasks": done.tasks, "stops": done.stops, "hours": done.hours}


@shared_task(name="console.tasks.archive")  # type: ignore[untyped-decorator]
def archive() -> dict[str, int]:
    """Archive the trace's closed partitions of tasks finished more than
    ``LOOPGUARD_ARCHIVE_AFTER_MONTHS`` whole months ago (beat, daily, when it is set; safe to
    run twice: a partition is dropped only once, and one that is gone is not planned)."""
    close_old_connections()
    months = int(settings.LOOPGUARD_ARCHIVE_AFTER_MONTHS)
    nothing = {"archived": 0, "refused": 0, "kept": 0}
    if months <= 0:
        return nothing
    try:
        outcome = trace_archive.archive(trace_archive.months_before(timezone.now(), months))
    except trace_archive.ArchiveRefused as refused:  # another run holds the lock: tomorrow
        logger.warning("trace archive not run now: %s", refused)
        return nothing
    return {
        "archived": len(outcome.archived),
        "refused": len(outcome.refused),
        "kept": len(outcome.kept),
    }
