"""History tables refuse UPDATE and DELETE on SQLite too (standalone mode).

Migration 0002 does this for PostgreSQL with one trigger function; SQLite has no trigger
functions, so each table gets a BEFORE UPDATE and a BEFORE DELETE trigger that aborts the
statement (and, with it, the transaction's change). Unlike PostgreSQL, SQLite cannot
exempt TRUNCATE: there is none; Django's `flush` deletes rows and is refused here, which
is what append-only means. Note for later migrations: Django alters a SQLite table by
copying it into a new one, which drops these triggers — a migration that alters one of
these tables must call `create_triggers` again.
"""

from django.db import migrations
from django.db.backends.base.schema import BaseDatabaseSchemaEditor
from django.db.migrations.state import StateApps

APPEND_ONLY = [
    "console_traceevent",
    "console_operationevent",
    "console_stopreport",
    "console_auditentry",
]
REFUSED = ("UPDATE", "DELETE")


def create_triggers(schema_editor: BaseDatabaseSchemaEditor) -> None:
    for table in APPEND_ONLY:
        for operation in REFUSED:
            schema_editor.execute(
                f"CREATE TRIGGER IF NOT EXISTS {table}_append_only_{operation.lower()} "
                f"BEFORE {operation} ON {table} FOR EACH ROW BEGIN "
                f"SELECT RAISE(ABORT, '{table} is append-only: {operation} refused'); END"
            )


def forwards(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    if schema_editor.connection.vendor == "sqlite":
        create_triggers(schema_editor)


def backwards(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    if schema_editor.connection.vendor != "sqlite":
        return
    for table in APPEND_ONLY:
        for operation in REFUSED:
            schema_editor.execute(
                f"DROP TRIGGER IF EXISTS {table}_append_only_{operation.lower()}"
            )


class Migration(migrations.Migration):
    dependencies = [("console", "0005_metrics_indexes")]

    operations = [migrations.RunPython(forwards, backwards)]
