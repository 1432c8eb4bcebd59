"""History tables refuse UPDATE and DELETE in the database itself.

The application never edits history; this makes sure nothing else can either (a shell, an
admin action, a buggy migration). TRUNCATE is left to the superuser who owns the schema:
test databases are emptied that way between tests.
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

# %% is a literal % for the driver, which formats this text as a query.
FUNCTION = """
CREATE OR REPLACE FUNCTION loopguard_append_only() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION '%% is append-only: %% refused', TG_TABLE_NAME, TG_OP
        USING ERRCODE = 'insufficient_privilege';
END;
$$ LANGUAGE plpgsql;
"""


def forwards(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return  # standalone mode on SQLite: the application's own rules still hold
    schema_editor.execute(FUNCTION)
    for table in APPEND_ONLY:
        schema_editor.execute(
            f"CREATE TRIGGER {table}_append_only BEFORE UPDATE OR DELETE ON {table} "
            "FOR EACH ROW EXECUTE FUNCTION loopguard_append_only()"
        )


def backwards(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    for table in APPEND_ONLY:
        schema_editor.execute(f"DROP TRIGGER IF EXISTS {table}_append_only ON {table}")
    schema_editor.execute("DROP FUNCTION IF EXISTS loopguard_append_only()")


class Migration(migrations.Migration):
    dependencies = [("console", "0001_initial")]

    operations = [migrations.RunPython(forwards, backwards)]
