"""The closed-set CHECK constraints as one array literal each on PostgreSQL (``OneOf``).

Same rows accepted and refused; PostgreSQL rebuilds a table's checks for every statement
that writes it, and an ``IN`` list of words costs a constant and a cast per word each time.
"""

import importlib

from django.db import migrations, models
from django.db.backends.base.schema import BaseDatabaseSchemaEditor
from django.db.migrations.state import StateApps

# Module names that start with a digit cannot be imported with an import statement.
_append_only = importlib.import_module("console.migrations.0006_sqlite_append_only")


def _triggers_again(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    # SQLite alters a constraint by rebuilding the table, which drops its triggers too.
    if schema_editor.connection.vendor == "sqlite":
        _append_only.create_triggers(schema_editor)


class Migration(migrations.Migration):
    dependencies = [("console", "0009_trace_task_index_covered_by_task_seq")]

    operations = [
        migrations.RemoveConstraint(
            model_name="operation",
            name="operation_state_valid",
        ),
        migrations.RemoveConstraint(
            model_name="task",
            name="task_state_valid",
        ),
        migrations.RemoveConstraint(
            model_name="task",
            name="task_reason_valid",
        ),
        migrations.RemoveConstraint(
            model_name="task",
            name="task_reason_matches_state",
        ),
        migrations.RemoveConstraint(
            model_name="traceevent",
            name="trace_kind_valid",
        ),
        migrations.AddConstraint(
            model_name="operation",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    ("state__one_of", ["COMMITTED", "IN_FLIGHT", "NOT_COMMITTED", "UNKNOWN"])
                ),
                name="operation_state_valid",
            ),
        ),
        migrations.AddConstraint(
            model_name="task",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    (
                        "state__one_of",
                        [
                            "CANCELLED",
                            "COMPLETED",
                            "FAILED",
                            "NEEDS_HUMAN",
                            "PARTIAL",
                            "QUEUED",
                            "RUNNING",
                        ],
                    )
                ),
                name="task_state_valid",
            ),
        ),
        migrations.AddConstraint(
            model_name="task",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    ("reason", ""),
                    (
                        "reason__one_of",
                        [
                            "bad_args",
                            "bad_call",
                            "bad_result",
                            "deadline",
                            "execution_budget",
                            "executor_error",
                            "fatal",
                            "goal_met",
                            "goal_unverified",
                            "invalid_evidence",
                            "invalid_wait",
                            "missing_operation_key",
                            "model_budget",
                            "no_progress",
                            "operation_conflict",
                            "operation_in_flight",
                            "operator_stop",
                            "planner_error",
                            "poll_budget",
                            "precondition",
                            "request_budget",
                            "restart_loop",
                            "same_call",
                            "short_cycle",
                            "token_budget",
                            "unknown_commit",
                        ],
                    ),
                    _connector="OR",
                ),
                name="task_reason_valid",
            ),
        ),
        migrations.AddConstraint(
            model_name="task",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    models.Q(("state__one_of", ["QUEUED", "RUNNING"]), ("reason", "")),
                    models.Q(
                        (
                            "state__one_of",
                            ["CANCELLED", "COMPLETED", "FAILED", "NEEDS_HUMAN", "PARTIAL"],
                        ),
                        models.Q(("reason", ""), _negated=True),
                    ),
                    _connector="OR",
                ),
                name="task_reason_matches_state",
            ),
        ),
        migrations.AddConstraint(
            model_name="traceevent",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    ("kind__one_of", ["model_call", "note", "request", "stop", "wait"])
                ),
                name="trace_kind_valid",
            ),
        ),
        migrations.RunPython(_triggers_again, migrations.RunPython.noop),
    ]
