"""An attached task's tools whose calls wait for a person's approval (docs/protocol.md,
``approval`` at ``start``). Additive: every existing task asks for none, and the column's
database default (``'[]'``, a constant: no rewrite) lets the processes still running the
code from before it go on saving tasks while it is applied."""

from __future__ import annotations

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("console", "0023_console_at_scale_indexes")]

    operations = [
        migrations.AddField(
            model_name="task",
            name="approval_tools",
            field=models.JSONField(blank=True, default=list, db_default=[]),
        ),
    ]
