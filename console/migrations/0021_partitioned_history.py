"""The operation history and the audit log become tables partitioned by id (PostgreSQL).

Both are append-only and grow with every write and every human action, as the trace does
(migration 0019). Their rows are read by operation, by task and by time, never by one key
that every row has (an audit entry need not name a task), so they are partitioned by ranges
of their own ids, ``LOOPGUARD_HISTORY_PARTITION_ROWS`` to a range: ids only grow, so the
newest rows are always in the newest range and an old range holds only old rows. The
primary key is the partition key, so every key and index stays as it was.

As in 0019 the existing table is kept, not copied: it becomes the first range, of every id
below a bound ``B`` two ranges above the newest id. Checking that bound (``VALIDATE``) scans
the table under a lock that lets inserts go on; then, in one short transaction under
``lock_timeout``, the catalogue changes only: the table and its names step aside, its ids
get a plain sequence that goes on from the old one, the partitioned table takes the old
name with the same columns, checks, indexes, foreign keys and append-only trigger, and the
old table, a default partition and the ranges ahead are attached. Attaching finds the old
table's indexes and foreign keys the same as the parent's and adopts them: nothing is built
or scanned under the lock. A ``lock_timeout`` that runs out fails the migration with
nothing changed; ``migrate`` again goes on from where it stopped.
"""

from __future__ import annotations

from django.conf import settings
from django.db import migrations, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.base.schema import BaseDatabaseSchemaEditor
from django.db.migrations.state import StateApps

TABLES = ("console_operationevent", "console_auditentry")
# How many ranges of ids stand ready beyond the newest (the beat keeps as many).
AHEAD = 2


def _one(connection: BaseDatabaseWrapper, sql: str, params: tuple[object, ...] = ()) -> object:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    return None if row is None else row[0]


def _all(
    connection: BaseDatabaseWrapper, sql: str, params: tuple[object, ...] = ()
) -> list[tuple[str, str]]:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return [(str(a), str(b)) for a, b in cursor.fetchall()]


def _run(connection: BaseDatabaseWrapper, *statements: str) -> None:
    with connection.cursor() as cursor:
        for statement in statements:
            cursor.execute(statement)


def _partition(connection: BaseDatabaseWrapper, table: str, size: int) -> None:
    partitioned = "SELECT 1 FROM pg_partitioned_table WHERE partrelid = %s::regclass"
    if _one(connection, partitioned, (table,)):
        return
    old = f"{table}_t0"
    check = f"{table}_first_bound"
    sequence = f"{table}_id_seq"
    found = _one(
        connection,
        "SELECT pg_get_constraintdef(oid) FROM pg_constraint"
        " WHERE conname = %s AND conrelid = %s::regclass",
        (check, table),
    )
    if found is None:
        newest = int(_one(connection, f"SELECT coalesce(max(id), 0) FROM {table}") or 0)  # noqa: S608
        identity = _one(connection, "SELECT pg_get_serial_sequence(%s, 'id')", (table,))
        if identity is not None:  # ids given out but not yet committed count too
            given = _one(connection, f"SELECT last_value FROM {identity}")  # noqa: S608
            newest = max(newest, int(given or 0))
        # Two whole ranges above the newest id, so that rows written while this migration
        # runs still fall below it.
        bound = (newest // size + 2) * size
        _run(connection, f"ALTER TABLE {table} ADD CONSTRAINT {check} CHECK (id < {bound}) NOT VALID")
    else:  # an earlier run stopped after the check was added: its bound stands
        bound = int(str(found).rsplit("<", 1)[1].strip(" ()"))
    _run(connection, f"ALTER TABLE {table} VALIDATE CONSTRAINT {check}")
    with transaction.atomic(using=connection.alias):
        _run(
            connection,
            "SET LOCAL lock_timeout = '5s'",
            f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE",
        )
        last = int(_one(connection, f"SELECT coalesce(max(id), 0) FROM {table}") or 0)  # noqa: S608
        identity = _one(connection, "SELECT pg_get_serial_sequence(%s, 'id')", (table,))
        if identity is not None:
            last = max(last, int(_one(connection, f"SELECT last_value FROM {identity}") or 0))  # noqa: S608
        # What the parent must have to adopt the old table's: its indexes (by their
        # definitions, names kept) and its foreign keys (by name and definition).
        indexes = _all(
            connection,
            "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = %s"
            " AND indexname <> %s ORDER BY indexname",
            (table, f"{table}_pkey"),
        )
        keys = _all(
            connection,
            "SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint"
            " WHERE conrelid = %s::regclass AND contype = 'f' ORDER BY conname",
            (table,),
        )
        _run(
            connection,
            f"ALTER TABLE {table} RENAME TO {old}",
            f"ALTER INDEX {table}_pkey RENAME TO {old}_pkey",
            # Index names are the schema's: the old table's step aside for the parent's.
            *(f"ALTER INDEX {name} RENAME TO {name[:58]}_t0" for name, _ in indexes),
            f"DROP TRIGGER {table}_append_only ON {old}",  # the parent's reaches every partition
            f"ALTER TABLE {old} ALTER COLUMN id DROP IDENTITY IF EXISTS",
            f"CREATE SEQUENCE {sequence} AS bigint",
            f"SELECT setval('{sequence}', {last + 1}, false)",
            f"ALTER TABLE {old} ALTER COLUMN id SET DEFAULT nextval('{sequence}')",
            f"CREATE TABLE {table} (LIKE {old} INCLUDING DEFAULTS INCLUDING CONSTRAINTS)"
            " PARTITION BY RANGE (id)",
            f"ALTER TABLE {table} DROP CONSTRAINT {check}",
            f"ALTER SEQUENCE {sequence} OWNED BY {table}.id",
            f"ALTER TABLE {table} ADD CONSTRAINT {table}_pkey PRIMARY KEY (id)",
            *(definition for _, definition in indexes),  # ON the parent: its name is the old
            *(f"ALTER TABLE {table} ADD CONSTRAINT {name} {definition}" for name, definition in keys),
            f"CREATE TRIGGER {table}_append_only BEFORE UPDATE OR DELETE ON {table}"
            " FOR EACH ROW EXECUTE FUNCTION loopguard_append_only()",
            # Attached by its validated check: no scan. Its indexes and keys become the parent's.
            f"ALTER TABLE {table} ATTACH PARTITION {old} FOR VALUES FROM (MINVALUE) TO ({bound})",
            f"CREATE TABLE {table}_default PARTITION OF {table} DEFAULT",
            *(
                f"CREATE TABLE {table}_t{low} PARTITION OF {table}"
                f" FOR VALUES FROM ({low}) TO ({low + size})"
                for low in range(bound, bound + AHEAD * size, size)
            ),
        )
    _run(connection, f"ANALYZE {table}")


def forwards(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    connection = schema_editor.connection
    if connection.vendor != "postgresql":
        return  # standalone mode on SQLite: plain tables
    size = int(settings.LOOPGUARD_HISTORY_PARTITION_ROWS)
    for table in TABLES:
        _partition(connection, table, size)


class Migration(migrations.Migration):
    atomic = False  # each table's catalogue changes are their own short transaction
    dependencies = [("console", "0020_trace_export")]
    operations = [migrations.RunPython(forwards, migrations.RunPython.noop, elidable=False)]
