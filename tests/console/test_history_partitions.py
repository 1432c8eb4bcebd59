"""The history tables partitioned (PostgreSQL): the trace by ranges of task ids (a task's
trace in one partition), the operation history and the audit log by ranges of their own ids;
the ranges made ahead of the newest row, and an existing database migrated in place."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import DatabaseError, IntegrityError, connection, transaction

from console.models import AuditEntry, Operation, OperationEvent, Task, TraceEvent
from console.store import history
from tests.databases import django, own_database

pytestmark = pytest.mark.django_db


def _partition_of(row: TraceEvent | OperationEvent | AuditEntry) -> str:
    table = type(row)._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT tableoid::regclass::text FROM {table} WHERE id = %s",  # noqa: S608
            [row.id],
        )
        (name,) = cursor.fetchone()
    return str(name)


def _event(task: Task, seq: int = 0) -> TraceEvent:
    return TraceEvent.objects.create(task=task, phase=1, seq=seq, kind="note", detail="x")


def _task(**fields: object) -> Task:
    return Task.objects.create(agent="test_reader", input={}, limits={}, **fields)


def test_a_tasks_trace_is_written_into_the_range_that_holds_its_id() -> None:
    found = history.trace_partitions()
    ranges = [p for p in found if not p.default]
    assert found[-1].default and len(ranges) == 1 + history.AHEAD
    task = _task()
    first = next(p for p in ranges if (p.low or 0) <= task.id < (p.high or 0))
    assert _partition_of(_event(task)) == first.name
    assert list(task.events.values_list("seq", flat=True)) == [0]


def test_the_trace_stays_append_only_and_one_event_per_seq() -> None:
    task = _task()
    event = _event(task)
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        TraceEvent.objects.filter(id=event.id).update(detail="rewritten")
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        TraceEvent.objects.filter(id=event.id).delete()
    with pytest.raises(IntegrityError), transaction.atomic():
        _event(task, seq=0)
    assert TraceEvent.objects.get(id=event.id).detail == "x"


def test_ranges_are_made_ahead_of_the_newest_task_and_start_above_the_default(
    settings_size: int,
) -> None:
    top = max(p.high or 0 for p in history.trace_partitions() if not p.default)
    # A task past every range (ids jumped: a restored sequence, a bulk import): its trace
    # is written all the same, into the default partition.
    stray = _task(id=top + 5)
    assert _partition_of(_event(stray)).endswith("_default")
    made = history.partitions_ahead()
    assert made[0] == f"console_traceevent_t{top + 6}"  # above what the default holds
    after = history.trace_partitions()
    assert after[-1].default
    highest = max(p.high or 0 for p in after if not p.default)
    assert highest > stray.id + history.AHEAD * settings_size
    assert _partition_of(_event(_task(id=top + 7))) == made[0]
    assert history.partitions_ahead() == []  # enough ranges stand ready: nothing to make
    assert _partition_of(TraceEvent.objects.get(task=stray)).endswith("_default")


@pytest.fixture
def settings_size() -> int:
    return int(settings.LOOPGUARD_TRACE_PARTITION_TASKS)


def _operation(task: Task, key: str = "op-1") -> Operation:
    return Operation.objects.create(key=key, fingerprint="f" * 64, state="IN_FLIGHT",
                                    tool="send", task=task)


def _audit(task: Task, **fields: object) -> AuditEntry:
    actor, _ = get_user_model().objects.get_or_create(username="auditor")
    return AuditEntry.objects.create(actor=actor, action="stop", task=task, reason="r", **fields)


@pytest.mark.parametrize("table", [history.OPERATION_HISTORY, history.AUDIT], ids=lambda h: h.table)
def test_operation_history_and_audit_are_ranges_of_their_own_ids_made_ahead(
    table: history.History, history_size: int
) -> None:
    task = _task()
    operation = _operation(task)

    def write(**fields: object) -> OperationEvent | AuditEntry:
        if table is history.AUDIT:
            return _audit(task, **fields)
        return OperationEvent.objects.create(operation=operation, to_state="IN_FLIGHT",
                                             task=task, **fields)

    found = history.partitions(table)
    ranges = [p for p in found if not p.default]
    assert found[-1].default and len(ranges) == 1 + history.AHEAD
    row = write()
    holding = next(p for p in ranges if (p.low or -(2**63)) <= row.id < (p.high or 0))
    assert _partition_of(row) == holding.name
    # The history stays append-only in every partition.
    model = type(row)
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        model.objects.filter(id=row.id).update(at=row.at)
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        model.objects.filter(id=row.id).delete()
    # A row past every range (a restored sequence, an import) is written all the same, into
    # the default; the next range made starts above it, and ranges stand ready beyond it.
    top = max(p.high or 0 for p in ranges)
    stray = write(id=top + 3)
    assert _partition_of(stray) == f"{table.table}_default"
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT setval('{table.table}_id_seq', {top + 3})")
    made = [name for name in history.partitions_ahead() if name.startswith(table.table)]
    assert made[0] == f"{table.table}_t{top + 4}"
    highest = max(p.high or 0 for p in history.partitions(table) if not p.default)
    assert highest > stray.id + history.AHEAD * history_size
    assert _partition_of(write()) == made[0]  # the sequence goes on, into the new range
    assert model.objects.filter(id=stray.id).exists()
    assert not [n for n in history.partitions_ahead() if n.startswith(table.table)]


def test_operation_history_keeps_its_foreign_keys_when_partitioned() -> None:
    with pytest.raises(IntegrityError), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")  # Django's keys wait for the commit
        OperationEvent.objects.create(operation_id=987654321, to_state="IN_FLIGHT")


@pytest.fixture
def history_size() -> int:
    return int(settings.LOOPGUARD_HISTORY_PARTITION_ROWS)


# -- an existing database, migrated in place -----------------------------------------------


# What 0018 had: three finished tasks, two events each, an operation with its history and
# an audit entry, written with the models of that time.
_OLD_ROWS = """
from django.db import connection
from django.db.migrations.loader import MigrationLoader
apps = MigrationLoader(connection).project_state(("console", "0018_client_lost")).apps
Task, TraceEvent = apps.get_model("console", "Task"), apps.get_model("console", "TraceEvent")
Operation = apps.get_model("console", "Operation")
OperationEvent = apps.get_model("console", "OperationEvent")
AuditEntry, User = apps.get_model("console", "AuditEntry"), apps.get_model("auth", "User")
actor = User.objects.create(username="auditor")
for n in range(3):
    task = Task.objects.create(agent="test_reader", input={"n": n}, limits={}, state="COMPLETED",
                               reason="goal_met")
    for seq in range(2):
        TraceEvent.objects.create(task=task, phase=1, seq=seq, kind="note", detail=f"{n}/{seq}")
    operation = Operation.objects.create(key=f"op-{n}", fingerprint="f" * 64, state="COMMITTED",
                                         tool="send", task=task)
    OperationEvent.objects.create(operation=operation, to_state="IN_FLIGHT", task=task)
    OperationEvent.objects.create(operation=operation, from_state="IN_FLIGHT",
                                  to_state="COMMITTED", task=task)
    AuditEntry.objects.create(actor=actor, action="stop", task=task, reason=f"audit {n}")
"""
_NEW_ROW = """
from console.models import Task, TraceEvent
task = Task.objects.order_by("id").first()
event = TraceEvent.objects.create(task=task, phase=2, seq=2, kind="note", detail="after")
print(event.id, list(task.events.order_by("seq").values_list("detail", flat=True)))
"""


@pytest.fixture
def old_database() -> Iterator[str]:
    """A database of its own at the last migration before the partitions, with tasks and a
    trace in it: its URL."""
    with own_database("upgrade") as url:
        django(url, "migrate", "-v0", "console", "0018")
        django(url, "shell", "-c", _OLD_ROWS)
        yield url


def _catalogue(url: str) -> tuple[list[tuple[str, str]], list[tuple[int, int, str]]]:
    with psycopg.connect(url) as db:
        partitions = db.execute(
            "SELECT c.relname, pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits i"
            " JOIN pg_class c ON c.oid = i.inhrelid"
            " WHERE i.inhparent = 'console_traceevent'::regclass ORDER BY c.relname"
        ).fetchall()
        rows = db.execute(
            "SELECT id, task_id, detail FROM console_traceevent ORDER BY id"
        ).fetchall()
    return partitions, rows


def test_an_existing_trace_becomes_the_first_partition_with_every_row_and_id_kept(
    old_database: str, settings_size: int
) -> None:
    with psycopg.connect(old_database) as db:
        before = db.execute(
            "SELECT id, task_id, detail FROM console_traceevent ORDER BY id"
        ).fetchall()
    assert len(before) == 6

    django(old_database, "migrate", "-v0")

    partitions, rows = _catalogue(old_database)
    assert rows == before  # kept where they were: not copied, not renumbered
    bound = 2 * settings_size  # two whole ranges above the newest task (3)
    assert partitions == sorted(
        [
            ("console_traceevent_t0", f"FOR VALUES FROM (MINVALUE) TO ('{bound}')"),
            ("console_traceevent_default", "DEFAULT"),
            *(
                (
                    f"console_traceevent_t{low}",
                    f"FOR VALUES FROM ('{low}') TO ('{low + settings_size}')",
                )
                for low in (bound, bound + settings_size)
            ),
        ]
    )
    said = django(old_database, "shell", "-v0", "-c", _NEW_ROW).strip().splitlines()[-1]
    new_id, details = said.split(" ", 1)
    assert int(new_id) > max(row[0] for row in before)  # the ids go on from the old ones
    assert details.strip() == "['0/0', '0/1', 'after']"
    django(old_database, "migrate", "-v0")  # again: nothing left to do, nothing broken
    assert _catalogue(old_database)[0] == partitions


_HISTORY_ROW = """
from console.models import AuditEntry, Operation, OperationEvent
operation = Operation.objects.order_by("id").first()
event = OperationEvent.objects.create(operation=operation, to_state="UNKNOWN", task=operation.task)
audit = AuditEntry.objects.create(actor_id=1, action="stop", task=operation.task, reason="after")
print(event.id, audit.id)
"""


def test_an_existing_operation_history_and_audit_log_become_first_partitions(
    old_database: str, history_size: int
) -> None:
    tables = ("console_operationevent", "console_auditentry")
    with psycopg.connect(old_database) as db:
        before = {
            t: db.execute(f"SELECT * FROM {t} ORDER BY id").fetchall()  # noqa: S608
            for t in tables
        }
        indexes = {
            t: db.execute(
                "SELECT indexname FROM pg_indexes WHERE tablename = %s ORDER BY 1", [t]
            ).fetchall()
            for t in tables
        }
    assert [len(before[t]) for t in tables] == [6, 3]

    django(old_database, "migrate", "-v0")

    bound = 2 * history_size  # two whole ranges above the newest id
    with psycopg.connect(old_database) as db:
        for table in tables:
            rows = db.execute(f"SELECT * FROM {table} ORDER BY id").fetchall()  # noqa: S608
            assert rows == before[table]  # kept where they were, ids and all
            bounds = db.execute(
                "SELECT c.relname, pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits i"
                " JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = %s::regclass"
                " ORDER BY c.relname",
                [table],
            ).fetchall()
            assert (f"{table}_t0", f"FOR VALUES FROM (MINVALUE) TO ('{bound}')") in bounds
            assert (f"{table}_default", "DEFAULT") in bounds and len(bounds) == 2 + history.AHEAD
            # The parent has every index the table had, under the same names.
            after = db.execute(
                "SELECT indexname FROM pg_indexes WHERE tablename = %s ORDER BY 1", [table]
            ).fetchall()
            assert after == indexes[table]
    said = django(old_database, "shell", "-v0", "-c", _HISTORY_ROW).strip().splitlines()[-1]
    event_id, audit_id = (int(n) for n in said.split())
    assert event_id > max(row[0] for row in before["console_operationevent"])
    assert audit_id > max(row[0] for row in before["console_auditentry"])
