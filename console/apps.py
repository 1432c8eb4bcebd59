"""The console's Django application."""

from django.apps import AppConfig


class ConsoleConfig(AppConfig):
    """Tasks, phases, traces, the operation ledger, stop reports and the audit log."""

    name = "console"
    verbose_name = "LoopGuard console"
    default_auto_field = "django.db.models.BigAutoField"
