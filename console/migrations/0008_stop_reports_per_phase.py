"""A phase may end with more than one stop report (a held task, then cancelled)."""

import importlib

from django.db import migrations, models
from django.db.backends.base.schema import BaseDatabaseSchemaEditor
from django.db.migrations.state import StateApps

# Module names that start with a digit cannot be imported with an import statement.
_append_only = importlib.import_module("console.migrations.0006_sqlite_append_only")


def _triggers_again(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    # SQLite drops a constraint by rebuilding the table, which drops its triggers too.
    if schema_editor.connection.vendor == "sqlite":
        _append_only.create_triggers(schema_editor)


class Migration(migrations.Migration):
    dependencies = [("console", "0007_task_list_indexes")]

    operations = [
        migrations.RemoveConstraint(model_name="stopreport", name="stop_report_per_phase"),
        migrations.AddIndex(
            model_name="stopreport",
            index=models.Index(fields=["task", "-phase", "-id"], name="stop_report_task_latest"),
        ),
        migrations.RunPython(_triggers_again, migrations.RunPython.noop),
    ]
