"""Celery tasks: thin wrappers that pass ids, re-fetch, and call the runner."""

from __future__ import annotations

import logging

from celery import shared_task
from django.db import close_old_connections

from . import runner

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
    """Recover tasks whose driver died; re-enqueue queued tasks whose message was lost."""
    close_old_connections()
    counts = runner.sweep(enqueue=run_task.delay)
    if any(counts.values()):
        logger.info("sweep: %s", counts)
    return counts
