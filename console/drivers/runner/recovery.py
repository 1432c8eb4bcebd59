"""Recovery: tasks whose driver's lease ran out, their lost writes looked up by their tools.

The sweep (Celery beat) and a driver about to take such a task both come here. The tools'
lookups are I/O on the business system: they run outside any transaction, each on a thread
of its own within its bound, and the task is recovered only if it is still as it was seen.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from enum import Enum
from functools import partial
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from console import lifecycle
from console.agents import agent_class
from console.lifecycle import recover
from console.models import (
    Operation,
    OperationState,
    Task,
    TaskState,
    lease_lapsed,
    waiting_for_client,
)
from console.records.logs import task_context
from console.records.redaction import redact
from guard import Result, Settlement

logger = logging.getLogger(__name__)

__all__ = ["Recovery", "lookup_bounds", "recover_lost", "sweep"]


def sweep(enqueue: Callable[[int], None]) -> dict[str, int]:
    """Recover tasks whose driver's lease ran out; re-enqueue queued tasks nobody took.

    Run periodically (Celery beat). Safe to run on several machines at once: each task is
    handled under its row lock, skipping rows another sweep or driver holds, and only if it
    is still as the sweep saw it. A hosted task's lost writes are first looked up by their
    tools (:func:`recover_lost`); an attached task whose client's lease ran out is recovered
    the same way (its ``IN_FLIGHT`` writes become ``UNKNOWN``), but never enqueued: it
    waits for its client, for ``LOOPGUARD_ATTACHED_CLIENT_LOST_SECONDS``, then stops
    ``NEEDS_HUMAN``/``client_lost``.
    """
    now = timezone.now()
    # First: a running task whose client has been gone that long (no sweep ran since its
    # lease lapsed) stops for a person rather than going back to wait again.
    counts = {"client_lost": _lose_clients(now), "recovered": 0, "resumed": 0, "requeued": 0}
    expired = Task.objects.filter(lease_lapsed(now))
    for task_id in expired.values_list("id", flat=True)[:500]:
        with task_context(task_id):
            outcome = recover_lost(task_id, enqueue)
        if outcome is not Recovery.LEFT:
            counts["recovered"] += 1
        if outcome is Recovery.RESUMED:
            counts["resumed"] += 1
    # A queued task whose message was lost (a broker restart) is enqueued again; a
    # duplicate message is harmless, the lease lets only one driver in.
    stale = now - timedelta(seconds=settings.LOOPGUARD_REQUEUE_AFTER_SECONDS)
    queued = Task.objects.filter(state=TaskState.QUEUED, updated_at__lt=stale, client="")
    for task_id in queued.values_list("id", flat=True)[:500]:
        Task.objects.filter(id=task_id, state=TaskState.QUEUED).update(updated_at=now)
        enqueue(task_id)
        counts["requeued"] += 1
    return counts


class Recovery(Enum):
    """What :func:`recover_lost` did with a task whose driver's lease ran out."""

    LEFT = "left as it was: someone else has it, or its lost write waits to be looked up"
    STOPPED = "recovered, and stopped (or, attached, waiting for its client)"
    RESUMED = "recovered and queued again"


def recover_lost(task_id: int, enqueue: Callable[[int], None] | None) -> Recovery:
    """Recover one task whose driver's lease ran out (``lifecycle.recover``), its lost
    writes looked up first by their tools when it is hosted (:func:`_look_up_lost`).

    The lookups are I/O on the business system: they run before the transaction, on what
    was read without a lock. The transaction then goes on only if the task is still as it
    was seen (running, past its lease, the same driver's), so that two sweeps, or a sweep
    and a driver, recover it once; and each operation moves only from the state it is in
    under its row lock, so that a reconciler who settled it first keeps their answer. A
    lookup that finds nothing, while the lost driver may still be inside the write
    (``lifecycle.quiet_since``), leaves the task for a later sweep: that driver may yet
    come back and renew its lease, or make the write, which the lookup then finds.
    With ``enqueue`` a recovered task is queued again (on commit); without (a driver about
    to take the task itself), it is only put back in the queue.
    """
    seen = Task.objects.filter(lease_lapsed(timezone.now()), id=task_id).first()
    if seen is None:
        return Recovery.LEFT
    found = _look_up_lost(seen)
    if any(said.get("committed") is False for said in found.values()) and not (
        lifecycle.quiet_since(seen)
    ):
        logger.info(
            "task %s: a lost write was not found; asking again once its driver is quiet", task_id
        )
        return Recovery.LEFT
    with transaction.atomic():
        task = (
            Task.objects.select_for_update(skip_locked=True)
            .filter(lease_lapsed(timezone.now()), id=task_id, lease_owner=seen.lease_owner)
            .first()
        )
        if task is None:
            return Recovery.LEFT
        why = "the client's lease expired" if task.is_attached else "lease expired"
        if not recover(task, why=why, found=found):
            return Recovery.STOPPED
        lifecycle.requeue(task)
        if task.is_attached:
            return Recovery.STOPPED  # it waits for its client, which takes it by its next step
        if enqueue is not None:
            transaction.on_commit(partial(enqueue, task.id))
    return Recovery.RESUMED


# -- asking a lost write's tool ---------------------------------------------------------------


def lookup_bounds() -> tuple[int, float]:
    """How often, and for how long in all, recovery asks one lost write's lookup:
    ``LOOPGUARD_RECOVERY_LOOKUP_TRIES`` (3) and ``LOOPGUARD_RECOVERY_LOOKUP_SECONDS`` (10)."""
    tries = int(settings.LOOPGUARD_RECOVERY_LOOKUP_TRIES)
    return tries, float(min(settings.LOOPGUARD_RECOVERY_LOOKUP_SECONDS, 3600.0))


def _look_up_lost(task: Task) -> dict[str, dict[str, Any]]:
    """What the tools' lookups say of ``task``'s ``IN_FLIGHT`` writes, by operation key
    (``committed``, ``evidence``, ``result``; or an ``error``, which says why the person
    who is paged for it is), redacted; ``{}`` for an attached task (its tools are in its
    client). Outside any transaction: each lookup is asked on a thread of its own, within
    :func:`lookup_bounds`, so a lookup that hangs costs its bound and no more."""
    if task.is_attached:
        return {}
    lost = list(
        Operation.objects.filter(task_id=task.id, state=OperationState.IN_FLIGHT)
        .order_by("id")
        .values_list("key", "tool")
    )
    if not lost:
        return {}
    try:
        agent = agent_class(task.agent)(task.id, task.input, {})
        if not agent.auto_lookup:
            return {key: {"error": "its agent's auto_lookup is off"} for key, _ in lost}
        lookups = {tool.name: tool.lookup for tool in agent.tools()}
    except Exception as exc:
        logger.exception("task %s: its agent cannot be built to look its lost writes up", task.id)
        why = f"its agent could not be built: {type(exc).__name__}"
        return {key: {"error": why} for key, _ in lost}
    tries, seconds = lookup_bounds()
    found: dict[str, dict[str, Any]] = {}
    for key, tool in lost:
        lookup = lookups.get(tool)
        if lookup is None:
            found[key] = {"error": f"the tool {tool or '?'} has no lookup"}
        else:
            found[key] = dict(redact(_ask(lookup, key, tries=tries, seconds=seconds)))
    return found


def _ask(lookup: Callable[[str], Any], key: str, *, tries: int, seconds: float) -> dict[str, Any]:
    """Ask ``lookup`` about ``key`` until it says committed or not, at most ``tries``
    times within ``seconds``; what it last said. Never raises."""
    deadline = time.monotonic() + seconds
    said: dict[str, Any] = {"error": "the lookup was not asked"}
    for attempt in range(tries):
        if attempt:
            time.sleep(min(0.2 * 2**attempt, max(0.0, deadline - time.monotonic())))
        left = deadline - time.monotonic()
        if left <= 0:
            break
        answer: list[Any] = []

        def asking(answer: list[Any] = answer) -> None:
            try:
                answer.append(lookup(key))
            except Exception as exc:  # the business system failing is an answer too
                answer.append(exc)
            finally:
                connection.close()  # this thread's own, if the lookup used the database

        thread = threading.Thread(target=asking, name=f"lookup-{key}"[:60], daemon=True)
        thread.start()
        thread.join(left)
        if not answer:
            # Left to finish on its own: a thread cannot be stopped, only no longer heard.
            return {"error": f"the lookup did not answer within {seconds:g} s"}
        said = _said(answer[0])
        if said.get("committed") in (True, False):
            return said
    return said


def _said(answer: Any) -> dict[str, Any]:
    """A lookup's answer as recovery and the audit log keep it."""
    if isinstance(answer, Exception):
        return {"error": f"the lookup failed: {type(answer).__name__}: {answer}"[:500]}
    ok = isinstance(answer, Settlement) and answer.committed in (True, False, None)
    if not ok or (answer.result is not None and not isinstance(answer.result, Result)):
        return {"error": f"the lookup answered {type(answer).__name__}, not a Settlement"}
    return {
        "committed": answer.committed,
        "evidence": str(answer.evidence or "")[:500],
        "result": None if answer.result is None else answer.result.to_dict(),
    }


def _lose_clients(now: datetime) -> int:
    """Stop each attached task whose client's lease lapsed longer ago than a client may
    stay away (``lifecycle.lose_client``); returns how many. A task someone asked to stop
    is left to recovery, which ends it as they asked."""
    allowed = timedelta(seconds=settings.LOOPGUARD_ATTACHED_CLIENT_LOST_SECONDS)
    gone = Task.objects.filter(waiting_for_client(now - allowed), stop_requested_at=None)
    lost = 0
    for task_id in gone.values_list("id", flat=True)[:500]:
        with task_context(task_id), transaction.atomic():
            # Asked again under the row lock: a client that came back meanwhile holds the
            # row (skipped) or has renewed its lease (no longer matches).
            task = (
                Task.objects.select_for_update(skip_locked=True)
                .filter(waiting_for_client(now - allowed), id=task_id, stop_requested_at=None)
                .first()
            )
            if task is None:
                continue
            lifecycle.lose_client(task)
            lost += 1
    return lost

