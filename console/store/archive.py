"""The trace's closed partitions taken out of the database, and brought back (PostgreSQL).

A range of task ids whose every task is finished, and which can receive no new task, may
leave the database as one table: ``console.drivers.archive`` writes its rows to a file and
checks the file against them, and only then :func:`drop_archived` detaches and drops the
partition, pointing its tasks at the :class:`~console.models.TraceArchive` that says where
their trace went. :func:`restore_rows` puts the rows back, with their ids, into a range
made again for them. Nothing unfinished is ever archived: a task still queued or running,
waiting for a person (``NEEDS_HUMAN``, a pending approval) or holding an ``IN_FLIGHT`` or
``UNKNOWN`` write keeps its whole range in the database (:func:`plan_archive` says which
tasks hold it).

The ranges are those of :mod:`console.store.history`; only ``console.drivers.archive``
imports this module (``tests/test_architecture.py`` keeps the door).
"""

from __future__ import annotations

import re
from collections.abc import Generator, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connection, transaction
from django.db.models import DateTimeField, Max
from django.db.models.functions import Coalesce
from django.utils import timezone

from console.models import (
    TERMINAL_STATES,
    UNSETTLED_STATES,
    Approval,
    ApprovalState,
    Operation,
    Task,
    TaskState,
    TraceArchive,
)
from console.store.history import Partition, trace_partitions

__all__ = [
    "FINISHED_STATES",
    "ArchiveRefused",
    "Kept",
    "Partition",
    "Plan",
    "Written",
    "drop_archived",
    "one_at_a_time",
    "partition_columns",
    "partition_lines",
    "partition_name",
    "partition_present",
    "plan_archive",
    "restore_rows",
]

TRACE = "console_traceevent"
"""The trace's partitioned table (its partitions are named ``<TRACE>_t<low>`` by
:mod:`console.store.history`)."""

FINISHED_STATES = frozenset(TERMINAL_STATES - {TaskState.NEEDS_HUMAN.value})
"""A task in one of these states is finished, unless a write of its is still uncertain or a
call of its waits for an approval: ``NEEDS_HUMAN`` waits for a person, whatever its age."""

HOLDERS_NAMED = 10
"""How many of the tasks that hold a range back a refusal names (and then how many more)."""

_NAME = re.compile(rf"^{TRACE}_t(\d+)$")
# Detaching waits for the steps' open transactions on the trace, and steps wait behind it:
# short, as history's attach (a partition not dropped now is dropped at the next run).
_LOCK_TIMEOUT = "SET LOCAL lock_timeout = '2s'"
_COLUMNS = """
SELECT attname FROM pg_attribute
WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped
ORDER BY attnum
"""
_IN_DEFAULT = (
    f"SELECT DISTINCT task_id FROM {TRACE}_default"  # noqa: S608 - the table's own name
    " WHERE task_id >= %s AND task_id < %s"
)
_EXISTS = "SELECT to_regclass(%s) IS NOT NULL"


class ArchiveRefused(Exception):
    """An archive or a restore that was not made, and why; nothing was changed."""


# The session lock that lets one archive or restore run at a time ("LGARCHIV" in ASCII).
_ONE_AT_A_TIME = 0x4C47415243484956


@contextmanager
def one_at_a_time() -> Iterator[None]:
    """Hold the lock that one archive or restore at a time holds (a session's advisory lock:
    released by PostgreSQL if this process dies), so that two runs (the beat's and one by
    hand) never write the same files or take the same partition. Refused if another run
    holds it, and on a database other than PostgreSQL (SQLite keeps a plain trace)."""
    if connection.vendor != "postgresql":
        raise ArchiveRefused(
            f"the trace's archives are PostgreSQL's; this database is {connection.vendor}, "
            "whose trace is one plain table"
        )
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_lock(%s)", [_ONE_AT_A_TIME])
        (held,) = cursor.fetchone() or (False,)
    if not held:
        raise ArchiveRefused("another archive or restore is running: try again once it ends")
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_unlock(%s)", [_ONE_AT_A_TIME])


@dataclass(frozen=True, slots=True)
class Kept:
    """A partition left in the database, and why."""

    partition: str
    why: str
    holding: tuple[int, ...] = ()
    """The tasks that hold it back (unfinished ones), lowest first, at most
    :data:`HOLDERS_NAMED`."""


@dataclass(frozen=True, slots=True)
class Plan:
    """What ``archive --before`` would take out of the database, and what it keeps."""

    before: datetime
    archivable: list[Partition]
    kept: list[Kept]


@dataclass(frozen=True, slots=True)
class Written:
    """A partition's rows as written to a file and checked there: what the database must
    still hold when the partition is dropped."""

    partition: str
    low: int | None
    high: int
    path: str
    sha256: str
    rows: int
    first_id: int | None
    last_id: int | None


def partition_name(low: int | None) -> str:
    """The name :mod:`console.store.history` gives the range starting at ``low`` (the first
    range, from the lowest id, is ``_t0``)."""
    return f"{TRACE}_t{low or 0}"


def plan_archive(before: datetime) -> Plan:
    """Which closed partitions of finished tasks may leave the database, every task of each
    having finished before ``before``; and every other partition, with why it stays."""
    archivable: list[Partition] = []
    kept: list[Kept] = []
    newest = int(Task.objects.aggregate(newest=Max("id"))["newest"] or 0)
    for partition in trace_partitions():
        why, holding = _kept_because(partition, before, newest)
        if why:
            kept.append(Kept(partition.name, why, holding))
        else:
            archivable.append(partition)
    return Plan(before, archivable, kept)


def _kept_because(
    partition: Partition, before: datetime, newest: int
) -> tuple[str, tuple[int, ...]]:
    """Why ``partition`` stays in the database (``""``: it need not), and the tasks that
    hold it there."""
    if partition.default or partition.high is None:
        return "the default partition (task ids past every range) is never archived", ()
    if _NAME.match(partition.name) is None or partition.name != partition_name(partition.low):
        return "not a range of console.store.history (its name is not the range's)", ()
    if newest < partition.high:
        # A new task takes an id above the newest: this range may still receive one.
        return f"still open to new tasks (the newest task is {newest})", ()
    tasks = _tasks_of(partition.low, partition.high)
    unfinished = _unfinished(tasks)
    if unfinished:
        named = ", ".join(f"{task_id} ({why})" for task_id, why in unfinished[:HOLDERS_NAMED])
        more = len(unfinished) - HOLDERS_NAMED
        said = f"{named} and {more} more" if more > 0 else named
        holding = tuple(task_id for task_id, _ in unfinished[:HOLDERS_NAMED])
        return f"{len(unfinished)} unfinished task(s) hold it: {said}", holding
    ended = tasks.aggregate(
        last=Max(Coalesce("finished_at", "updated_at", output_field=DateTimeField()))
    )["last"]
    if ended is None:
        return "no task in its range: nothing to archive", ()
    if ended >= before:
        return f"its last task finished {ended:%Y-%m-%d %H:%M}, not before {before:%Y-%m-%d}", ()
    if not _has_rows(partition.name):
        return "no trace in it: nothing to archive", ()
    return "", ()


def _tasks_of(low: int | None, high: int) -> Any:
    found = Task.objects.filter(id__lt=high)
    return found if low is None else found.filter(id__gte=low)


def _unfinished(tasks: Any) -> list[tuple[int, str]]:
    """The tasks of a range that are not finished, each with why, lowest id first: its
    state when it has not stopped or waits for a person, a write still uncertain, a call
    waiting for an approval."""
    ids = tasks.values("id")
    why: dict[int, list[str]] = {}
    for task_id, state in tasks.exclude(state__in=FINISHED_STATES).values_list("id", "state"):
        why.setdefault(task_id, []).append(state)
    uncertain = Operation.objects.filter(task_id__in=ids, state__in=UNSETTLED_STATES)
    for task_id, key, state in uncertain.values_list("task_id", "key", "state"):
        why.setdefault(task_id, []).append(f"{state} write {key}")
    waiting = Approval.objects.filter(task_id__in=ids, state=ApprovalState.PENDING)
    for task_id, tool in waiting.values_list("task_id", "tool"):
        why.setdefault(task_id, []).append(f"a call to {tool} waits for approval")
    return [(task_id, "; ".join(why[task_id])) for task_id in sorted(why)]


def _has_rows(name: str) -> bool:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT EXISTS (SELECT 1 FROM {_known(name)})")  # noqa: S608
        (found,) = cursor.fetchone() or (False,)
    return bool(found)


def partition_present(name: str) -> bool:
    """Whether ``name`` is one of the trace's partitions now."""
    return name in {p.name for p in trace_partitions()}


def _known(name: str) -> str:
    """``name``, once it is certain to be one of the trace's range partitions (it is put
    into statements as an identifier)."""
    if _NAME.match(name) is None or name not in {p.name for p in trace_partitions()}:
        raise ArchiveRefused(f"{name} is not a range partition of {TRACE}")
    return name


def partition_columns(name: str | None = None) -> list[str]:
    """The columns of the trace (or of its partition ``name``), in the table's order."""
    table = TRACE if name is None else _known(name)
    with connection.cursor() as cursor:
        cursor.execute(_COLUMNS, [table])
        return [str(column) for (column,) in cursor.fetchall()]


def partition_lines(name: str, *, chunk: int = 5000) -> Generator[tuple[int, str]]:
    """Every row of partition ``name`` in id order: its id, and the row as one JSON object
    of every column (PostgreSQL's ``row_to_json``, times in the connection's UTC). Read
    through a server-side cursor, ``chunk`` rows at a time, so a partition of millions of
    rows is never held in memory; written by the database, the same row always gives the
    same text, which is how a file is compared with it."""
    table = _known(name)
    with connection.chunked_cursor() as cursor:
        cursor.execute(f"SELECT t.id, row_to_json(t)::text FROM {table} t ORDER BY t.id")  # noqa: S608
        while rows := cursor.fetchmany(chunk):
            yield from ((int(row_id), str(text)) for row_id, text in rows)


def drop_archived(written: Written) -> TraceArchive:
    """Take the partition ``written`` describes out of the database, in one transaction:
    check it holds exactly the rows written (their count and first and last ids), record
    the archive, point the tasks whose trace it holds at it, detach and drop it.

    Refused (:class:`ArchiveRefused`, nothing changed) when the partition holds anything
    else, a task of its range is no longer finished (resumed since it was planned), or a
    lock is not had within 2 s. The partition is locked against inserts
    before it is counted, so nothing can join it between the count and the drop; the
    trace's own lock, which detaching takes and every step waits for, is held for
    catalogue changes only, after the count."""
    name = _known(written.partition)
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(_LOCK_TIMEOUT)
            cursor.execute(f"LOCK TABLE {name} IN SHARE MODE")
            cursor.execute(f"SELECT count(*), min(id), max(id) FROM {name}")  # noqa: S608
            found = cursor.fetchone() or (0, None, None)
            expected = (written.rows, written.first_id, written.last_id)
            if tuple(found) != expected:
                raise ArchiveRefused(
                    f"{name} holds {found[0]} rows (ids {found[1]}..{found[2]}) but "
                    f"{written.rows} (ids {written.first_id}..{written.last_id}) were "
                    "written: not dropped"
                )
            archive = TraceArchive.objects.create(
                partition=name,
                low=written.low,
                high=written.high,
                path=written.path,
                sha256=written.sha256,
                rows=written.rows,
                first_id=written.first_id,
                last_id=written.last_id,
                archived_at=timezone.now(),
            )
            cursor.execute(
                "UPDATE console_task SET trace_archive_id = %s"  # noqa: S608
                f" WHERE id IN (SELECT DISTINCT task_id FROM {name})",
                [archive.id],
            )
            # Asked again now that its tasks' rows are this transaction's (a resumption
            # waits for it to end): one resumed since the plan keeps its range.
            unfinished = _unfinished(_tasks_of(written.low, written.high))
            if unfinished:
                said = ", ".join(f"{task_id} ({why})" for task_id, why in unfinished[:3])
                raise ArchiveRefused(f"{name}: no longer finished: {said}: not dropped")
            cursor.execute(f"ALTER TABLE {TRACE} DETACH PARTITION {name}")
            cursor.execute(f"DROP TABLE {name}")
    except ArchiveRefused:
        raise
    except Exception as error:  # a lock not had in time, a race with another archive
        raise ArchiveRefused(f"{name} not dropped: {error}".strip()) from error
    return archive


def restore_rows(
    archive: TraceArchive, columns: Sequence[str], rows: Iterable[Sequence[Any]]
) -> int:
    """Put an archived partition's ``rows`` back, with their ids, into its range made again,
    in one transaction; mark the archive restored and point its tasks back at the database.
    How many rows went back.

    The range must be free: no partition of the trace may hold any of it, and the default
    partition no trace of its tasks (a task resumed after its trace was archived writes
    there). Refused (:class:`ArchiveRefused`, nothing changed) otherwise, and when ``rows``
    (an iterator may raise it too) do not add up to the archive's count and first and last
    ids."""
    name = partition_name(archive.low)
    if archive.partition != name or archive.restored_at is not None:
        raise ArchiveRefused(f"archive {archive.id} of {archive.partition} is not out to restore")
    low = "MINVALUE" if archive.low is None else str(int(archive.low))
    high = int(archive.high)
    table = partition_columns()
    if not columns or any(column not in table for column in columns) or "id" not in columns:
        raise ArchiveRefused(f"the archive's columns {list(columns)} are not the trace's {table}")
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(_LOCK_TIMEOUT)
            _refuse_unless_free(cursor, name, archive.low, high)
            _make_range(cursor, name, low, high)
            listed = ", ".join(f'"{column}"' for column in columns)
            with cursor.copy(f"COPY {name} ({listed}) FROM STDIN") as copy:
                for row in rows:
                    copy.write_row(row)
            cursor.execute(f"SELECT count(*), min(id), max(id) FROM {name}")  # noqa: S608
            found = tuple(cursor.fetchone() or (0, None, None))
            expected = (archive.rows, archive.first_id, archive.last_id)
            if found != expected:
                raise ArchiveRefused(
                    f"the file gave {found[0]} rows (ids {found[1]}..{found[2]}), the archive "
                    f"says {archive.rows} (ids {archive.first_id}..{archive.last_id})"
                )
            TraceArchive.objects.filter(id=archive.id).update(restored_at=timezone.now())
            Task.objects.filter(trace_archive=archive).update(trace_archive=None)
    except ArchiveRefused:
        raise
    except Exception as error:  # a row the table refuses, a lock not had in time
        raise ArchiveRefused(f"{name} not restored: {error}".strip()) from error
    archive.refresh_from_db()
    return int(found[0])


def _refuse_unless_free(cursor: Any, name: str, low: int | None, high: int) -> None:
    for partition in trace_partitions():
        if partition.default:
            continue
        below = partition.high is None or low is None or low < partition.high
        above = partition.low is None or high > partition.low
        if below and above:
            raise ArchiveRefused(
                f"the range of {name} is in the database already: {partition.name} holds "
                f"task ids {partition.low}..{partition.high}"
            )
    cursor.execute(_EXISTS, [name])
    (exists,) = cursor.fetchone() or (False,)
    if exists:
        raise ArchiveRefused(f"a table named {name} exists already")
    cursor.execute(_IN_DEFAULT, [-(2**63) if low is None else low, high])
    resumed = sorted(int(task_id) for (task_id,) in cursor.fetchall())
    if resumed:
        raise ArchiveRefused(
            f"the default partition holds trace of tasks in the range of {name} (written "
            f"after it was archived): {', '.join(map(str, resumed[:HOLDERS_NAMED]))}"
        )


def _make_range(cursor: Any, name: str, low: str, high: int) -> None:
    # As console.store.history makes a range: made apart, then attached (empty, so with no
    # check of its own to spare a scan; the default partition's is checked, found free).
    # The rows go in once it is attached: its keys, the task's foreign key and the trace's
    # append-only trigger are the parent's by then, and hold for every row restored.
    like = "INCLUDING DEFAULTS INCLUDING CONSTRAINTS"
    cursor.execute(f"CREATE TABLE {name} (LIKE {TRACE} {like})")
    bounds = f"FROM ({low}) TO ({high})"
    cursor.execute(f"ALTER TABLE {TRACE} ATTACH PARTITION {name} FOR VALUES {bounds}")
