"""Celery tasks: thin wrappers that pass ids, re-fetch, and call the runner."""

from __future__ import annotations

import logging

from celery import shared_task

from . import runner

logger = logging.getLogger(__name__)


@shared_task(name="console.tasks.run_task")
def run_task(task_id: int) -> str:
    """Drive one task (safe to deliver twice: the lease admits one driver)."""
    return runner.drive(task_id)


@shared_task(name="console.tasks.sweep")
def sweep() -> dict[str, int]:
    """Recover tasks whose driver died; re-enqueue queued tasks whose message was lost."""
    counts = runner.sweep(enqueue=run_task.delay)
    if any(counts.values()):
        logger.info("sweep: %s", counts)
    return counts
