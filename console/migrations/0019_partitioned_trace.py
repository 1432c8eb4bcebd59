"""The trace becomes a table partitioned by task id (PostgreSQL; SQLite keeps a plain table).

Every step appends to ``console_traceevent`` and nothing ever leaves it, so it grows for as
long as the console runs. Partitioned by ranges of task ids, a task's whole trace lives in
one partition (the unique ``(task_id, seq)`` that the step's insert relies on holds, since it
includes the partition key), the step's statements stay the same texts, and a range whose
tasks are long finished can later be archived and dropped as one table instead of deleted
row by row (``console/store/history.py`` makes the partitions ahead, docs/deployment.md).

The existing table is kept, not copied: it becomes the first partition, of every task id
below a bound ``B`` comfortably above the newest task. What takes time runs without
blocking steps, and the one step that blocks them is short:

1. ``CHECK (task_id < B) NOT VALID`` (a brief lock, no scan), then ``VALIDATE`` (scans the
   table under a lock that lets inserts go on), and a unique index on ``(id, task_id)``
   built ``CONCURRENTLY``: the partitioned parent's primary key must include the partition
   key, and this index is the one the old table brings to it.
2. In one transaction, under ``lock_timeout``: rename the table and its indexes, give its ids
   a plain sequence (PostgreSQL 15 has no identity column on a partitioned table), create the
   partitioned parent under the old name with the same columns, checks, keys and trigger,
   and attach the old table (its validated check spares the scan), a default partition and
   the first partitions ahead. That is catalogue work only, whatever the table holds.

Nothing is rewritten and no row moves. A ``lock_timeout`` that runs out (a long transaction
holding the table) fails the migration with nothing changed; running ``migrate`` again
goes on from where it stopped.
"""

from __future__ import annotations

from django.conf import settings
from django.db import migrations, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.base.schema import BaseDatabaseSchemaEditor
from django.db.migrations.state import StateApps

TABLE = "console_traceevent"
OLD = f"{TABLE}_t0"  # the table as it was: the partition of every task id below B
CHECK = "trace_first_partition_bound"
ID_SEQUENCE = f"{TABLE}_id_seq"
KEYS = f"{TABLE}_id_task"  # (id, task_id): the parent's primary key, brought by OLD
# How many partitions of task ids stand ready beyond the newest task (the beat keeps as many).
AHEAD = 2


def _one(connection: BaseDatabaseWrapper, sql: str, params: tuple[object, ...] = ()) -> object:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    return None if row is None else row[0]


def _run(connection: BaseDatabaseWrapper, *statements: str) -> None:
    with connection.cursor() as cursor:
        for statement in statements:
            cursor.execute(statement)


def forwards(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    connection = schema_editor.connection
    if connection.vendor != "postgresql":
        return  # standalone mode on SQLite: a plain table
    partitioned = "SELECT 1 FROM pg_partitioned_table WHERE partrelid = %s::regclass"
    if _one(connection, partitioned, (TABLE,)):
        return
    size = int(settings.LOOPGUARD_TRACE_PARTITION_TASKS)
    newest = int(_one(connection, "SELECT coalesce(max(id), 0) FROM console_task") or 0)
    found = _one(
        connection,
        "SELECT pg_get_constraintdef(oid) FROM pg_constraint"
        " WHERE conname = %s AND conrelid = %s::regclass",
        (CHECK, TABLE),
    )
    if found is None:
        # The next boundary of ``size`` at least one whole range above the newest task, so
        # that tasks started while this migration runs still fall below it.
        bound = (newest // size + 2) * size
        _run(
            connection,
            f"ALTER TABLE {TABLE} ADD CONSTRAINT {CHECK} CHECK (task_id < {bound}) NOT VALID",
        )
    else:  # an earlier run stopped after step 1: its bound stands
        bound = int(str(found).rsplit("<", 1)[1].strip(" ()"))
    _run(
        connection,
        f"ALTER TABLE {TABLE} VALIDATE CONSTRAINT {CHECK}",
        f"DROP INDEX CONCURRENTLY IF EXISTS {KEYS}",  # an earlier run's, maybe left invalid
        f"CREATE UNIQUE INDEX CONCURRENTLY {KEYS} ON {TABLE} (id, task_id)",
    )
    with transaction.atomic(using=connection.alias):
        _run(
            connection,
            "SET LOCAL lock_timeout = '5s'",
            f"LOCK TABLE {TABLE} IN ACCESS EXCLUSIVE MODE",
        )
        last = _one(connection, f"SELECT coalesce(max(id), 0) FROM {TABLE}")  # noqa: S608
        # The parent's foreign key takes the old one's name, so that attaching finds it
        # and keeps it (a new one would be validated by a scan under the lock).
        task_fk = _one(
            connection,
            "SELECT conname FROM pg_constraint WHERE conrelid = %s::regclass AND contype = 'f'"
            " AND confrelid = 'console_task'::regclass",
            (TABLE,),
        )
        identity = _one(connection, "SELECT pg_get_serial_sequence(%s, 'id')", (TABLE,))
        if identity is not None:
            given = _one(connection, f"SELECT last_value FROM {identity}")  # noqa: S608
            last = max(int(last or 0), int(given or 0))
        _run(
            connection,
            # The old table steps aside, its names with it (the parent takes Django's).
            f"ALTER TABLE {TABLE} RENAME TO {OLD}",
            f"ALTER TABLE {OLD} RENAME CONSTRAINT trace_task_seq TO {OLD}_task_seq",
            f"ALTER INDEX trace_at_brin RENAME TO {OLD}_at_brin",
            f"ALTER INDEX {KEYS} RENAME TO {OLD}_id_task",
            # Its key becomes (id, task_id), the parent's, on the index built in step 1:
            # attaching needs a key of its own to match, or it builds one under the lock.
            f"ALTER TABLE {OLD} DROP CONSTRAINT {TABLE}_pkey",
            f"ALTER TABLE {OLD} ADD CONSTRAINT {OLD}_pkey PRIMARY KEY USING INDEX {OLD}_id_task",
            f"DROP TRIGGER {TABLE}_append_only ON {OLD}",  # the parent's reaches every partition
            f"ALTER TABLE {OLD} ALTER COLUMN id DROP IDENTITY IF EXISTS",
            f"CREATE SEQUENCE {ID_SEQUENCE} AS bigint",
            f"SELECT setval('{ID_SEQUENCE}', {int(last) + 1}, false)",
            f"ALTER TABLE {OLD} ALTER COLUMN id SET DEFAULT nextval('{ID_SEQUENCE}')",
            # The parent: the same columns and checks (LIKE), the same names as before.
            f"CREATE TABLE {TABLE} (LIKE {OLD} INCLUDING DEFAULTS INCLUDING CONSTRAINTS)"
            " PARTITION BY RANGE (task_id)",
            f"ALTER TABLE {TABLE} DROP CONSTRAINT {CHECK}",
            f"ALTER SEQUENCE {ID_SEQUENCE} OWNED BY {TABLE}.id",
            f"ALTER TABLE {TABLE} ADD CONSTRAINT {TABLE}_pkey PRIMARY KEY (id, task_id)",
            f"ALTER TABLE {TABLE} ADD CONSTRAINT trace_task_seq UNIQUE (task_id, seq)",
            f"CREATE INDEX trace_at_brin ON {TABLE} USING brin (at)",
            f"ALTER TABLE {TABLE} ADD CONSTRAINT {task_fk} FOREIGN KEY (task_id)"
            " REFERENCES console_task (id) DEFERRABLE INITIALLY DEFERRED",
            f"CREATE TRIGGER {TABLE}_append_only BEFORE UPDATE OR DELETE ON {TABLE}"
            " FOR EACH ROW EXECUTE FUNCTION loopguard_append_only()",
            # Attached by its validated check: no scan. Its indexes become the parent's.
            f"ALTER TABLE {TABLE} ATTACH PARTITION {OLD} FOR VALUES FROM (MINVALUE) TO ({bound})",
            # Anything beyond the partitions made ahead lands here rather than failing a step.
            f"CREATE TABLE {TABLE}_default PARTITION OF {TABLE} DEFAULT",
            *(
                f"CREATE TABLE {TABLE}_t{low} PARTITION OF {TABLE}"
                f" FOR VALUES FROM ({low}) TO ({low + size})"
                for low in range(bound, bound + AHEAD * size, size)
            ),
        )
        # The old table's check stays: it holds for every row it has.
    _run(connection, f"ANALYZE {TABLE}")


class Migration(migrations.Migration):
    atomic = False  # step 1 builds an index CONCURRENTLY: outside any transaction
    dependencies = [("console", "0018_client_lost")]
    operations = [migrations.RunPython(forwards, migrations.RunPython.noop, elidable=False)]
