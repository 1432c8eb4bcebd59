"""The trace's export to OpenTelemetry: a cursor per task and the export's one row of totals
(console/drivers/otel.py). The trace itself is the outbox; nothing here is written by a step."""

import django.db.models.deletion
from django.db import migrations, models


def totals_row(apps, schema_editor):
    # The one row the export's passes lock in turn and /metrics reads; made here so that
    # neither has to make it (two first passes would race to).
    apps.get_model("console", "TraceExportTotals").objects.get_or_create(id=1)


class Migration(migrations.Migration):

    dependencies = [
        ('console', '0019_partitioned_trace'),
    ]

    operations = [
        migrations.CreateModel(
            name='TraceExport',
            fields=[
                ('task', models.OneToOneField(on_delete=django.db.models.deletion.PROTECT, primary_key=True, related_name='trace_export', serialize=False, to='console.task')),
                ('seen_seq', models.PositiveBigIntegerField(default=0)),
                ('exported_seq', models.PositiveBigIntegerField(default=0)),
                ('claimed_by', models.CharField(blank=True, max_length=64)),
                ('claimed_until', models.DateTimeField(blank=True, null=True)),
                ('failures', models.PositiveIntegerField(default=0)),
                ('exported_at', models.DateTimeField(blank=True, null=True)),
            ],
            options={
                'indexes': [models.Index(condition=models.Q(('seen_seq__gt', models.F('exported_seq'))), fields=['exported_at'], name='trace_export_waiting')],
            },
        ),
        migrations.CreateModel(
            name='TraceExportTotals',
            fields=[
                ('id', models.PositiveSmallIntegerField(default=1, primary_key=True, serialize=False)),
                ('read_id', models.BigIntegerField(default=0)),
                ('exported', models.PositiveBigIntegerField(default=0)),
                ('failures', models.PositiveBigIntegerField(default=0)),
            ],
            options={
                'constraints': [models.CheckConstraint(condition=models.Q(('id', 1)), name='trace_export_totals_one_row')],
            },
        ),
        migrations.RunPython(totals_row, migrations.RunPython.noop),
    ]
