"""The partitions of the history tables: ranges of task ids, made ahead of the newest task.

``console_traceevent`` is partitioned by ranges of ``LOOPGUARD_TRACE_PARTITION_TASKS`` task
ids on PostgreSQL (migration 0019 made it so, the table it was becoming the first range).
A task's whole trace is in one partition. The beat keeps :data:`AHEAD` ranges ready beyond
the newest task, so that a step never waits for one to be made; a task past them all still
gets its trace written, into the default partition, and the next range made starts above
the rows that landed there. SQLite (standalone mode) keeps a plain table: nothing to do.

Only the beat's task imports this module (``tests/test_architecture.py`` keeps the door).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass

from django.conf import settings
from django.db import connection, transaction

__all__ = ["AHEAD", "TRACE", "Partition", "partitions_ahead", "trace_partitions"]

logger = logging.getLogger(__name__)

TRACE = "console_traceevent"
AHEAD = 2
"""How many ranges of task ids stand ready beyond the newest task's."""

_BOUNDS = re.compile(r"FROM \((MINVALUE|'?-?\d+'?)\) TO \((MAXVALUE|'?-?\d+'?)\)")

_PARTITIONS = """
SELECT c.relname, pg_get_expr(c.relpartbound, c.oid), c.reltuples::bigint
FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
WHERE i.inhparent = %s::regclass
ORDER BY c.relname
"""
_PARTITIONED = "SELECT 1 FROM pg_partitioned_table WHERE partrelid = to_regclass(%s)"
_NEWEST_TASK = "SELECT coalesce(max(id), 0) FROM console_task"
_IN_DEFAULT = "SELECT max(task_id) FROM console_traceevent_default WHERE task_id >= %s"


@dataclass(frozen=True, slots=True)
class Partition:
    """One partition of a history table: the task ids it holds, ``low`` included and
    ``high`` not (``None``: unbounded; both ``None`` with ``default``), and the planner's
    estimate of its rows (``-1``: never analysed)."""

    name: str
    low: int | None
    high: int | None
    rows: int
    default: bool = False


def trace_partitions() -> list[Partition]:
    """The trace's partitions, lowest range first and the default last (``[]`` where the
    trace is a plain table: SQLite, or a database not yet migrated)."""
    if connection.vendor != "postgresql":
        return []
    with connection.cursor() as cursor:
        cursor.execute(_PARTITIONED, [TRACE])
        if cursor.fetchone() is None:
            return []
        cursor.execute(_PARTITIONS, [TRACE])
        rows = cursor.fetchall()
    found = []
    for name, bound, estimate in rows:
        if bound == "DEFAULT":
            found.append(Partition(name, None, None, int(estimate), default=True))
            continue
        match = _BOUNDS.search(bound)
        if match is None:  # not a range this module made: shown, never relied on
            continue
        low, high = (None if v.endswith("VALUE") else int(v.strip("'")) for v in match.groups())
        found.append(Partition(name, low, high, int(estimate)))
    return sorted(found, key=lambda p: (p.default, -(2**63) if p.low is None else p.low))


def partitions_ahead() -> list[str]:
    """Make the ranges missing up to :data:`AHEAD` beyond the newest task's; the names made.

    Each is made apart and attached (which locks the parent only against other changes of
    its partitions, never against the steps' inserts), under a short ``lock_timeout``: a
    partition not made now is made at the beat's next run, and meanwhile the range's
    trace goes to the default partition. Safe to run at any time, from several places."""
    partitions = trace_partitions()
    ranges = [p for p in partitions if not p.default and p.high is not None]
    if not ranges:
        return []
    size = int(settings.LOOPGUARD_TRACE_PARTITION_TASKS)
    with connection.cursor() as cursor:
        cursor.execute(_NEWEST_TASK)
        (newest,) = cursor.fetchone() or (0,)
    top = max(int(p.high or 0) for p in ranges)
    made = []
    while top <= int(newest) + AHEAD * size:
        low = _above_the_default(top)
        high = (low // size + 1) * size  # back on the ranges' boundaries after a gap
        name = f"{TRACE}_t{low}"
        try:
            _attach(name, low, high)
        except Exception:  # a lock not had in time, a race with another beat: next run
            logger.warning("trace partition %s not made now; the next run tries again", name)
            logger.debug("why", exc_info=True)
            break
        made.append(name)
        top = high
    if made:
        logger.info("trace partitions made ahead: %s", ", ".join(made))
    return made


def _above_the_default(low: int) -> int:
    """Where a new range may start: above any trace that landed in the default partition
    (a range may not take rows the default holds)."""
    with connection.cursor() as cursor:
        cursor.execute(_IN_DEFAULT, [low])
        (highest,) = cursor.fetchone() or (None,)
    return low if highest is None else int(highest) + 1


def _attach(name: str, low: int, high: int) -> None:
    # The table is made on its own, its check added, then attached: the check spares the
    # parent a scan, and attaching takes a lock that steps' inserts do not wait for.
    statements = (
        "SET LOCAL lock_timeout = '2s'",
        f"CREATE TABLE {name} (LIKE {TRACE} INCLUDING DEFAULTS INCLUDING CONSTRAINTS)",
        f"ALTER TABLE {name} ADD CONSTRAINT {name}_range"
        f" CHECK (task_id >= {low} AND task_id < {high})",
        f"ALTER TABLE {TRACE} ATTACH PARTITION {name} FOR VALUES FROM ({low}) TO ({high})",
        f"ALTER TABLE {name} DROP CONSTRAINT {name}_range",
    )
    with transaction.atomic(), connection.cursor() as cursor:
        for statement in statements:
            cursor.execute(statement)
