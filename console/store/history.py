"""The partitions of the history tables: ranges of a key, made ahead of the newest row.

On PostgreSQL the three append-only tables that grow with use are partitioned by ranges
(:data:`HISTORIES`): the trace by ranges of ``LOOPGUARD_TRACE_PARTITION_TASKS`` task ids
(migration 0019; a task's whole trace is in one partition, so a range of finished tasks can
be archived as one table), the operation history and the audit log by ranges of
``LOOPGUARD_HISTORY_PARTITION_ROWS`` of their own ids (migration 0021; an audit entry need
not name a task). Each migration made the existing table the first range. The beat keeps
:data:`AHEAD` ranges ready beyond the newest key, so that a step never waits for one to be
made; a row past them all is still written, into the table's default partition, and the
next range made starts above what landed there. SQLite (standalone mode) keeps plain
tables: nothing to do.

Only the beat's task imports this module (``tests/test_architecture.py`` keeps the door).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass

from django.conf import settings
from django.db import connection, transaction

__all__ = [
    "AHEAD",
    "AUDIT",
    "HISTORIES",
    "OPERATION_HISTORY",
    "TRACE",
    "History",
    "Partition",
    "partitions",
    "partitions_ahead",
    "trace_partitions",
]

logger = logging.getLogger(__name__)

AHEAD = 2
"""How many ranges stand ready beyond the newest key."""


@dataclass(frozen=True, slots=True)
class History:
    """A history table partitioned by ranges of one column: its ``table``, the ``key``
    column, the ``setting`` that sizes a range, and ``newest``, the SQL that gives the
    highest key a row may soon have (ranges are made ahead of it)."""

    table: str
    key: str
    setting: str
    newest: str


TRACE = History(
    "console_traceevent",
    "task_id",
    "LOOPGUARD_TRACE_PARTITION_TASKS",
    "SELECT coalesce(max(id), 0) FROM console_task",
)
OPERATION_HISTORY = History(
    "console_operationevent",
    "id",
    "LOOPGUARD_HISTORY_PARTITION_ROWS",
    "SELECT last_value FROM console_operationevent_id_seq",
)
AUDIT = History(
    "console_auditentry",
    "id",
    "LOOPGUARD_HISTORY_PARTITION_ROWS",
    "SELECT last_value FROM console_auditentry_id_seq",
)
HISTORIES = (TRACE, OPERATION_HISTORY, AUDIT)
"""Every partitioned history table (the beat makes each one's ranges ahead)."""

_BOUNDS = re.compile(r"FROM \((MINVALUE|'?-?\d+'?)\) TO \((MAXVALUE|'?-?\d+'?)\)")

_PARTITIONS = """
SELECT c.relname, pg_get_expr(c.relpartbound, c.oid), c.reltuples::bigint
FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
WHERE i.inhparent = %s::regclass
ORDER BY c.relname
"""
_PARTITIONED = "SELECT 1 FROM pg_partitioned_table WHERE partrelid = to_regclass(%s)"


@dataclass(frozen=True, slots=True)
class Partition:
    """One partition of a history table: the keys it holds, ``low`` included and
    ``high`` not (``None``: unbounded; both ``None`` with ``default``), and the planner's
    estimate of its rows (``-1``: never analysed)."""

    name: str
    low: int | None
    high: int | None
    rows: int
    default: bool = False


def trace_partitions() -> list[Partition]:
    """The trace's partitions (:func:`partitions` of :data:`TRACE`)."""
    return partitions(TRACE)


def partitions(history: History) -> list[Partition]:
    """A history table's partitions, lowest range first and the default last (``[]`` where
    it is a plain table: SQLite, or a database not yet migrated)."""
    if connection.vendor != "postgresql":
        return []
    with connection.cursor() as cursor:
        cursor.execute(_PARTITIONED, [history.table])
        if cursor.fetchone() is None:
            return []
        cursor.execute(_PARTITIONS, [history.table])
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
    """Make every history table's ranges missing up to :data:`AHEAD` beyond its newest key;
    the names made.

    Each is made apart and attached (which locks the parent only against other changes of
    its partitions, never against the steps' inserts), under a short ``lock_timeout``: a
    partition not made now is made at the beat's next run, and meanwhile the range's rows
    go to the default partition. Safe to run at any time, from several places."""
    return [name for history in HISTORIES for name in _ahead(history)]


def _ahead(history: History) -> list[str]:
    ranges = [p for p in partitions(history) if not p.default and p.high is not None]
    if not ranges:
        return []
    size = int(getattr(settings, history.setting))
    with connection.cursor() as cursor:
        cursor.execute(history.newest)
        (newest,) = cursor.fetchone() or (0,)
    top = max(int(p.high or 0) for p in ranges)
    made = []
    while top <= int(newest) + AHEAD * size:
        low = _above_the_default(history, top)
        high = (low // size + 1) * size  # back on the ranges' boundaries after a gap
        name = f"{history.table}_t{low}"
        try:
            _attach(history, name, low, high)
        except Exception:  # a lock not had in time, a race with another beat: next run
            logger.warning("partition %s not made now; the next run tries again", name)
            logger.debug("why", exc_info=True)
            break
        made.append(name)
        top = high
    if made:
        logger.info("partitions made ahead: %s", ", ".join(made))
    return made


def _above_the_default(history: History, low: int) -> int:
    """Where a new range may start: above any row that landed in the default partition
    (a range may not take rows the default holds)."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT max({history.key}) FROM {history.table}_default"  # noqa: S608
            f" WHERE {history.key} >= %s",
            [low],
        )
        (highest,) = cursor.fetchone() or (None,)
    return low if highest is None else int(highest) + 1


def _attach(history: History, name: str, low: int, high: int) -> None:
    # The table is made on its own, its check added, then attached: the check spares the
    # parent a scan, and attaching takes a lock that steps' inserts do not wait for.
    table, key = history.table, history.key
    statements = (
        "SET LOCAL lock_timeout = '2s'",
        f"CREATE TABLE {name} (LIKE {table} INCLUDING DEFAULTS INCLUDING CONSTRAINTS)",
        f"ALTER TABLE {name} ADD CONSTRAINT {name}_range"
        f" CHECK ({key} >= {low} AND {key} < {high})",
        f"ALTER TABLE {table} ATTACH PARTITION {name} FOR VALUES FROM ({low}) TO ({high})",
        f"ALTER TABLE {name} DROP CONSTRAINT {name}_range",
    )
    with transaction.atomic(), connection.cursor() as cursor:
        for statement in statements:
            cursor.execute(statement)
