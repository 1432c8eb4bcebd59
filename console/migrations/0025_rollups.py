"""Roll-ups (``console/rollups.py``): what ``/metrics`` and the dashboard would otherwise count
over all of history on every look, counted once by beat.

Additive and quick on a large database: three new tables; ``Task.rolled`` with a constant
database default (no rewrite: every task starts out not rolled, which ``/metrics`` counts as
before until beat has rolled it); and two indexes built ``CONCURRENTLY`` as migration 0023
builds its own (steps go on writing meanwhile; a run stopped half-way is taken up by running
``migrate`` again). SQLite (standalone mode) makes plain indexes.
"""

from __future__ import annotations

import importlib

import django.utils.timezone
from django.db import migrations, models
from django.db.backends.base.schema import BaseDatabaseSchemaEditor
from django.db.migrations.state import StateApps

# Module names that start with a digit cannot be imported with an import statement.
_at_scale = importlib.import_module("console.migrations.0023_console_at_scale_indexes")

INDEXES = {
    "task": models.Index(fields=["id"], condition=models.Q(rolled=False), name="task_unrolled"),
    "stopreport": models.Index(fields=["at"], include=["state", "reason"], name="stop_report_at"),
}


def indexes(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    for model_name, index in INDEXES.items():
        model = apps.get_model("console", model_name)
        if schema_editor.connection.vendor != "postgresql":
            schema_editor.add_index(model, index)
            continue
        # Django's own text of the index (its column order and condition), made concurrently.
        sql = str(index.create_sql(model, schema_editor))
        body = sql.split(" ON ", 1)[1].split(" ", 1)[1]
        _at_scale._concurrently(schema_editor, index.name, model._meta.db_table, body)


def no_indexes(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    for index in INDEXES.values():
        schema_editor.execute(f"DROP INDEX IF EXISTS {index.name}")


def rollup_row(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    apps.get_model("console", "Rollup").objects.get_or_create(id=1)


class Migration(migrations.Migration):
    atomic = False  # CREATE INDEX CONCURRENTLY runs outside any transaction
    dependencies = [("console", "0024_attached_approval")]

    operations = [
        migrations.CreateModel(
            name="HourStat",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("hour", models.DateTimeField(unique=True)),
                ("steps", models.PositiveIntegerField(default=0)),
                ("latency_p50", models.PositiveIntegerField(blank=True, null=True)),
                ("latency_p95", models.PositiveIntegerField(blank=True, null=True)),
                ("spend", models.PositiveBigIntegerField(default=0)),
                ("counted_at", models.DateTimeField(default=django.utils.timezone.now)),
            ],
        ),
        migrations.CreateModel(
            name="Rollup",
            fields=[
                (
                    "id",
                    models.PositiveSmallIntegerField(default=1, primary_key=True, serialize=False),
                ),
                ("stops_before", models.DateTimeField(blank=True, null=True)),
                ("stops", models.JSONField(default=dict)),
            ],
            options={
                "constraints": [
                    models.CheckConstraint(condition=models.Q(id=1), name="rollup_one_row")
                ],
            },
        ),
        migrations.CreateModel(
            name="TaskTotal",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("agent", models.CharField(max_length=100)),
                (
                    "state",
                    models.CharField(
                        choices=[
                            ("QUEUED", "queued"),
                            ("RUNNING", "running"),
                            ("COMPLETED", "completed"),
                            ("PARTIAL", "partial"),
                            ("FAILED", "failed"),
                            ("NEEDS_HUMAN", "needs human"),
                            ("CANCELLED", "cancelled"),
                        ],
                        max_length=20,
                    ),
                ),
                ("tasks", models.BigIntegerField(default=0)),
                ("spent", models.JSONField(default=dict)),
            ],
            options={
                "constraints": [
                    models.UniqueConstraint(fields=["agent", "state"], name="task_total_once")
                ],
            },
        ),
        migrations.AddField(
            model_name="task",
            name="rolled",
            field=models.BooleanField(db_default=False, default=False),
        ),
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AddIndex(model_name, index) for model_name, index in INDEXES.items()
            ],
            database_operations=[migrations.RunPython(indexes, no_indexes, elidable=False)],
        ),
        migrations.RunPython(rollup_row, migrations.RunPython.noop),
    ]
