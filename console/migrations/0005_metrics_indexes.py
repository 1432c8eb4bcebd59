"""Indexes for /metrics: stops by state and reason; trace events of the last hour."""

from django.db import migrations, models
from django.db.backends.base.schema import BaseDatabaseSchemaEditor
from django.db.migrations.state import StateApps


def _trace_at_brin(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    # Trace events are appended in time order, so a BRIN index (a few pages for millions of
    # rows, next to no cost per insert) narrows "the last hour" to the newest blocks. A
    # B-tree would add a write to every step of every task for one scrape a minute.
    # Standalone mode on SQLite has no BRIN and no such volume: it scans.
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(
            "CREATE INDEX IF NOT EXISTS trace_at_brin ON console_traceevent USING brin (at)"
        )


def _no_trace_at_brin(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("DROP INDEX IF EXISTS trace_at_brin")


class Migration(migrations.Migration):

    dependencies = [
        ('console', '0004_task_last_step_at'),
    ]

    operations = [
        migrations.AddIndex(
            model_name='stopreport',
            index=models.Index(fields=['state', 'reason'], name='stop_report_state_reason'),
        ),
        migrations.RunPython(_trace_at_brin, _no_trace_at_brin),
    ]
