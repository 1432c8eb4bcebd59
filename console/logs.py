"""One log format for every LoopGuard process: web, worker, beat and ``manage.py up``.

Each record is one line that says when, which process, how bad, which task and who logged
it::

    2026-11-30 03:37:12,345 worker:ForkPoolWorker-1[4242] INFO task=17 console.runner: ...

``task=`` is the LoopGuard task the line is about, ``-`` when it is about none. Inside a
driver (:func:`task_context`) it comes from there; Celery's own lines about ``run_task``
("received", "succeeded in") carry the task id in their arguments and are read from
those. The process name is ``$LOOPGUARD_PROCESS`` (set by ``manage.py up``: web, worker,
beat), followed by the pool process's name in a Celery worker's children.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

__all__ = ["FORMAT", "TaskFilter", "current_task", "logging_config", "task_context"]

FORMAT = "%(asctime)s %(where)s %(levelname)s task=%(task)s %(name)s: %(message)s"

current_task: ContextVar[int | None] = ContextVar("loopguard_task", default=None)
"""The task the code running now is about (set by :func:`task_context`)."""

RUN_TASK = "console.tasks.run_task"
_FIRST_ARG = re.compile(r"^\[?\(?\s*(\d+)")


@contextmanager
def task_context(task_id: int) -> Iterator[None]:
    """Mark every log line written inside the block as being about ``task_id``."""
    token = current_task.set(task_id)
    try:
        yield
    finally:
        current_task.reset(token)


class TaskFilter(logging.Filter):
    """Adds ``task`` (the task id or ``-``) and ``where`` (process name[pid]) to records."""

    def __init__(self, name: str = "") -> None:
        super().__init__(name)
        self.role = os.environ.get("LOOPGUARD_PROCESS", "")

    def filter(self, record: logging.LogRecord) -> bool:
        task = current_task.get()
        if task is None:
            task = _celery_task_id(record.args)
        record.task = "-" if task is None else str(task)
        process = record.processName or ""
        if process == "MainProcess":
            name = self.role or "main"
        else:
            name = f"{self.role}:{process}" if self.role else process
        record.where = f"{name}[{record.process}]"
        return True


def _celery_task_id(args: Any) -> int | None:
    """The task id in a Celery trace record about ``run_task`` (its arguments' repr)."""
    if not isinstance(args, Mapping) or args.get("name") != RUN_TASK:
        return None
    match = _FIRST_ARG.match(str(args.get("args") or ""))
    return int(match.group(1)) if match else None


def logging_config(level: str) -> dict[str, Any]:
    """The ``logging.config.dictConfig`` of every process (Django's LOGGING, gunicorn's)."""
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "filters": {"task": {"()": "console.logs.TaskFilter"}},
        "formatters": {"line": {"format": FORMAT}},
        "handlers": {
            "console": {
                "class": "logging.StreamHandler",  # standard error, as before
                "filters": ["task"],
                "formatter": "line",
            }
        },
        "root": {"handlers": ["console"], "level": level},
        "loggers": {
            # gunicorn's loggers bring handlers of their own otherwise: one line each.
            "gunicorn.error": {"handlers": [], "propagate": True},
            "gunicorn.access": {"handlers": [], "propagate": True},
            # The model client's HTTP library logs every request at INFO; the trace has them.
            "httpx": {"level": "WARNING"},
            "httpcore": {"level": "WARNING"},
        },
    }
