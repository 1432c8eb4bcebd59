"""The operation key's uniqueness as a constraint (no LIKE index beside it), and an index on
the fingerprint for the reconciliation queue's "the same call committed elsewhere"."""

import importlib

from django.db import migrations, models
from django.db.backends.base.schema import BaseDatabaseSchemaEditor
from django.db.migrations.state import StateApps

# Module names that start with a digit cannot be imported with an import statement.
_append_only = importlib.import_module("console.migrations.0006_sqlite_append_only")


def _triggers_again(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    # SQLite alters a table by rebuilding it, which drops its triggers too.
    if schema_editor.connection.vendor == "sqlite":
        _append_only.create_triggers(schema_editor)


class Migration(migrations.Migration):
    dependencies = [("console", "0010_enum_checks_as_array_literals")]

    operations = [
        # The new constraint first: the key is never without one.
        migrations.AddConstraint(
            model_name="operation",
            constraint=models.UniqueConstraint(fields=("key",), name="operation_key_unique"),
        ),
        migrations.AlterField(
            model_name="operation", name="key", field=models.CharField(max_length=200)
        ),
        migrations.AddIndex(
            model_name="operation",
            index=models.Index(fields=["fingerprint"], name="operation_fingerprint"),
        ),
        migrations.RunPython(_triggers_again, migrations.RunPython.noop),
    ]
