"""One log format for every LoopGuard process: web, worker, beat and ``manage.py up``.

Each record is one line that says when, which process, how bad, which task and who logged
it::

    2026-11-30 03:37:12,345 worker:ForkPoolWorker-1[4242] INFO task=17 console.drivers.runner: ...

``task=`` is the LoopGuard task the line is about, ``-`` when it is about none. Inside a
driver (:func:`task_context`) it comes from there; Celery's own lines about ``run_task``
("received", "succeeded in") carry the task id in their arguments and are read from
those. The process name is ``$LOOPGUARD_PROCESS`` (set by ``manage.py up``: web, worker,
beat), followed by the pool process's name in a Celery worker's children.

A record cannot forge another: :class:`LineFormatter` escapes control characters (CR, LF,
the rest of C0 and C1, U+2028 and U+2029) in the line it writes, so a request path or a
reason with ``%0d%0a`` in it stays on its line. A traceback keeps its lines, each indented,
so that only a record's own line starts with a time.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

__all__ = [
    "FORMAT",
    "LineFormatter",
    "TaskFilter",
    "current_task",
    "escape",
    "logging_config",
    "task_context",
]

FORMAT = "%(asctime)s %(where)s %(levelname)s task=%(task)s %(name)s: %(message)s"

current_task: ContextVar[int | None] = ContextVar("loopguard_task", default=None)
"""The task the code running now is about (set by :func:`task_context`)."""

# Each control character as an escape a reader sees, not a break a log reader acts on.
_CONTROLS = {
    **{code: f"\\x{code:02x}" for code in (*range(0x20), 0x7F, *range(0x80, 0xA0))},
    ord("\n"): "\\n",
    ord("\r"): "\\r",
    ord("\t"): "\\t",
    0x2028: "\\u2028",
    0x2029: "\\u2029",
}
_TRACEBACK_INDENT = "  "

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


def escape(text: str) -> str:
    """``text`` with every control character written as an escape (``\\r``, ``\\x1b``)."""
    return text.translate(_CONTROLS)


class LineFormatter(logging.Formatter):
    """One record, one line: the formatted line escaped (message, its arguments and every
    other field alike), then the traceback, if any, on lines of its own.

    A traceback is ours, but its last line quotes the exception's message, which may quote
    what someone sent: its lines are indented (and all but the line break escaped), so none
    of them starts with a time like a record's own line does.
    """

    def format(self, record: logging.LogRecord) -> str:
        """The record's escaped line, then its traceback and stack, each line indented."""
        record.message = record.getMessage()
        if self.usesTime():
            record.asctime = self.formatTime(record, self.datefmt)
        text = self.formatMessage(record)
        # Not the traceback another handler may have left on the record (``exc_text``,
        # unindented): this one's own, made each time.
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        elif record.exc_text:
            text += "\n" + _indented(record.exc_text)
        if record.stack_info:
            text += "\n" + self.formatStack(record.stack_info)
        return text

    def formatMessage(self, record: logging.LogRecord) -> str:
        """The record's line, escaped."""
        return escape(super().formatMessage(record))

    def formatException(self, ei: Any) -> str:
        """The traceback, each of its lines indented and escaped."""
        return _indented(super().formatException(ei))

    def formatStack(self, stack_info: str) -> str:
        """The stack, each of its lines indented and escaped."""
        return _indented(super().formatStack(stack_info))


def _indented(text: str) -> str:
    return "\n".join(_TRACEBACK_INDENT + escape(line) for line in text.split("\n"))


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
        "filters": {"task": {"()": "console.records.logs.TaskFilter"}},
        "formatters": {"line": {"()": "console.records.logs.LineFormatter", "format": FORMAT}},
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
