"""An approval is answered once, in the database itself: a held call's row may move only
from ``PENDING`` to an answer, keeping the call it holds; it is never deleted.

The service (``services._answer``) updates only pending rows, under a lock; this makes sure
nothing else can rewrite an answer or the call a person approved (a shell, an admin action,
a buggy migration). On SQLite (standalone mode) the application's own rules hold alone.
"""

from django.db import migrations
from django.db.backends.base.schema import BaseDatabaseSchemaEditor
from django.db.migrations.state import StateApps

# %% is a literal % for the driver, which formats this text as a query.
FUNCTION = """
CREATE OR REPLACE FUNCTION loopguard_approval_answered_once() RETURNS trigger AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        RAISE EXCEPTION 'console_approval keeps every held call: DELETE refused'
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF OLD.state <> 'PENDING' OR NEW.state = 'PENDING'
        OR (NEW.task_id, NEW.phase, NEW.tool, NEW.effect, NEW.operation_key,
            NEW.fingerprint, NEW.args::text, NEW.requested_at)
        IS DISTINCT FROM
           (OLD.task_id, OLD.phase, OLD.tool, OLD.effect, OLD.operation_key,
            OLD.fingerprint, OLD.args::text, OLD.requested_at) THEN
        RAISE EXCEPTION 'console_approval is answered once: %% of approval %% refused',
            TG_OP, OLD.id USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN NEW;
END;
$$ LANGUAGE plpgsql;
"""


def forwards(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute(FUNCTION)
    schema_editor.execute(
        "CREATE TRIGGER console_approval_answered_once BEFORE UPDATE OR DELETE ON "
        "console_approval FOR EACH ROW EXECUTE FUNCTION loopguard_approval_answered_once()"
    )


def backwards(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute(
        "DROP TRIGGER IF EXISTS console_approval_answered_once ON console_approval"
    )
    schema_editor.execute("DROP FUNCTION IF EXISTS loopguard_approval_answered_once()")


class Migration(migrations.Migration):
    dependencies = [("console", "0015_task_explored")]

    operations = [migrations.RunPython(forwards, backwards)]
