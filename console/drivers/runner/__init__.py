"""The runner: drives the guard step by step for one task, persisting every step.

One driver per task, guaranteed by a lease (owner, expiry, heartbeat) taken with a
conditional update: a redelivered Celery message, a duplicate enqueue or a second worker
finds the lease held, or the task finished, and does nothing. Every step is saved
(trace events, counters, checkpoint) before the next one starts, so a crash loses at most
the step in progress, and the recovery sweep turns that step's in-flight write, if any,
into ``UNKNOWN`` instead of running it again (then settles it by its tool's lookup, when
the lookup can tell).

Tool and model I/O never happen inside a database transaction; the transactions here
are short and only record what happened.

Its parts, each with one job: ``driver`` (the loop of one drive, under its lease),
``model`` (the model call and the summary turn), ``tools`` (one call at the executor's
entry), ``saves`` (what is saved, and when; the checkpoint), ``watch`` (the lease's
heartbeat and the task's stop fact, asked in one place) and ``recovery`` (the sweep, and
the lookups of a lost driver's writes).
"""

from __future__ import annotations

from console.drivers.runner.driver import drive, new_owner
from console.drivers.runner.recovery import sweep
from console.drivers.runner.watch import STOP_POLL_S

__all__ = ["STOP_POLL_S", "drive", "new_owner", "sweep"]
