"""Indexes for the console's pages at a million tasks and ten million trace events.

Measured with ``benchmarks/console_pages.py`` (docs/deployment.md): the task list filtered by
state and agent, the dashboard's stops by reason, its spend and its step latency chart each
read rows from the heap that an index can answer alone (index-only scans: the visibility map
that autovacuum keeps on these insert-mostly tables lets them skip the heap).

Built without stopping the console: each index is made ``CONCURRENTLY`` (steps go on writing
while it builds). The trace is partitioned (migration 0019), and a partitioned table takes no
concurrent index, so its two are made as PostgreSQL documents it: an index on the parent
alone (``ON ONLY``: made at once, invalid), one ``CONCURRENTLY`` on each partition, each
attached to the parent's, which becomes valid once every partition has its own. A partition
made later (beat, ``console/store/history.py``) gets them from the parent. A run that stops
half-way is taken up again by running ``migrate`` again: an index left invalid is dropped and
made anew. SQLite (standalone mode) makes plain indexes.
"""

from __future__ import annotations

from django.db import migrations, models
from django.db.backends.base.schema import BaseDatabaseSchemaEditor
from django.db.migrations.state import StateApps
from django.db.models import Q

TRACE = "console_traceevent"

TASK_INDEXES = [
    models.Index(fields=["state", "agent", "-created_at", "-id"], name="task_state_agent_created"),
    models.Index(
        fields=["finished_at"],
        include=["state", "reason", "updated_at"],
        condition=Q(finished_at__isnull=False),
        name="task_stopped",
    ),
]
TRACE_INDEXES = [
    models.Index(
        fields=["at"], include=["cost"], condition=Q(cost__isnull=False), name="trace_spend"
    ),
    models.Index(
        fields=["at"],
        include=["latency_ms", "kind"],
        condition=Q(latency_ms__isnull=False),
        name="trace_latency",
    ),
]
# What each trace index is, in SQL, for the partitions (Django makes the parent's text).
TRACE_SQL = {
    "trace_spend": "(at) INCLUDE (cost) WHERE cost IS NOT NULL",
    "trace_latency": "(at) INCLUDE (latency_ms, kind) WHERE latency_ms IS NOT NULL",
}


def _rows(
    schema_editor: BaseDatabaseSchemaEditor, sql: str, params: tuple[object, ...] = ()
) -> list[tuple[object, ...]]:
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(sql, params)
        return list(cursor.fetchall())


def _run(schema_editor: BaseDatabaseSchemaEditor, *statements: str) -> None:
    with schema_editor.connection.cursor() as cursor:
        for statement in statements:
            cursor.execute(statement)


def _valid(schema_editor: BaseDatabaseSchemaEditor, name: str) -> bool | None:
    """Whether the index ``name`` is valid (``None``: there is none)."""
    found = _rows(
        schema_editor,
        "SELECT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid"
        " WHERE c.relname = %s",
        (name,),
    )
    return None if not found else bool(found[0][0])


def _concurrently(
    schema_editor: BaseDatabaseSchemaEditor, name: str, table: str, body: str
) -> None:
    """``CREATE INDEX CONCURRENTLY name ON table body``, unless a valid one stands; one an
    interrupted run left invalid is dropped first."""
    valid = _valid(schema_editor, name)
    if valid:
        return
    if valid is False:
        _run(schema_editor, f"DROP INDEX CONCURRENTLY IF EXISTS {name}")
    _run(schema_editor, f"CREATE INDEX CONCURRENTLY {name} ON {table} {body}")


def forwards(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    task = apps.get_model("console", "Task")
    trace = apps.get_model("console", "TraceEvent")
    if schema_editor.connection.vendor != "postgresql":
        for index in TASK_INDEXES:
            schema_editor.add_index(task, index)
        for index in TRACE_INDEXES:
            schema_editor.add_index(trace, index)
        return
    for index in TASK_INDEXES:
        # Django's own text of the index (its column order and condition), made concurrently.
        sql = str(index.create_sql(task, schema_editor))
        body = sql.split(" ON ", 1)[1].split(" ", 1)[1]
        _concurrently(schema_editor, index.name, task._meta.db_table, body)
    partitions = [
        str(name)
        for (name,) in _rows(
            schema_editor,
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
            " WHERE i.inhparent = %s::regclass ORDER BY c.relname",
            (TRACE,),
        )
    ]
    for name, body in TRACE_SQL.items():
        if not partitions:  # not partitioned (a database 0019 has not reached): a plain index
            _concurrently(schema_editor, name, TRACE, body)
            continue
        if _valid(schema_editor, name) is None:
            _run(schema_editor, f"CREATE INDEX {name} ON ONLY {TRACE} {body}")
        for partition in partitions:
            child = f"{partition}_{name.removeprefix('trace_')}"
            _concurrently(schema_editor, child, partition, body)
            attached = _rows(
                schema_editor,
                "SELECT 1 FROM pg_inherits WHERE inhrelid = %s::regclass"
                " AND inhparent = %s::regclass",
                (child, name),
            )
            if not attached:
                _run(schema_editor, f"ALTER INDEX {name} ATTACH PARTITION {child}")


def backwards(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    for index in [*TASK_INDEXES, *TRACE_INDEXES]:
        # The parent's drops its partitions' with it.
        schema_editor.execute(f"DROP INDEX IF EXISTS {index.name}")


class Migration(migrations.Migration):
    atomic = False  # CREATE INDEX CONCURRENTLY runs outside any transaction
    dependencies = [("console", "0022_trace_archive")]
    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                *(migrations.AddIndex("task", index) for index in TASK_INDEXES),
                *(migrations.AddIndex("traceevent", index) for index in TRACE_INDEXES),
            ],
            database_operations=[migrations.RunPython(forwards, backwards, elidable=False)],
        )
    ]
