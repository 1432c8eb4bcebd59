"""Trace events lose the index on ``task`` alone: ``trace_task_seq`` (task, seq) leads with
it and serves every lookup by task, so the second index only cost each insert a write."""

import importlib

import django.db.models.deletion
from django.db import migrations, models
from django.db.backends.base.schema import BaseDatabaseSchemaEditor
from django.db.migrations.state import StateApps

# Module names that start with a digit cannot be imported with an import statement.
_append_only = importlib.import_module("console.migrations.0006_sqlite_append_only")


def _triggers_again(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    # SQLite alters a column by rebuilding the table, which drops its triggers too.
    if schema_editor.connection.vendor == "sqlite":
        _append_only.create_triggers(schema_editor)


class Migration(migrations.Migration):
    dependencies = [("console", "0008_stop_reports_per_phase")]

    operations = [
        # Reversed, the AlterField below rebuilds the table again: triggers after it.
        migrations.RunPython(migrations.RunPython.noop, _triggers_again),
        migrations.AlterField(
            model_name="traceevent",
            name="task",
            field=models.ForeignKey(
                db_index=False,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="events",
                to="console.task",
            ),
        ),
        migrations.RunPython(_triggers_again, migrations.RunPython.noop),
    ]
