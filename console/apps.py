"""The console's Django application."""

from pathlib import Path

from django.apps import AppConfig
from django.conf import settings


class ConsoleConfig(AppConfig):
    """Tasks, phases, traces, the operation ledger, stop reports and the audit log."""

    name = "console"
    verbose_name = "LoopGuard console"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Standalone mode: SQLite creates its file but not the folder it goes in, and any
        # command (migrate, demo, start_task) may be the first to open it.
        database = settings.DATABASES["default"]
        if database["ENGINE"] == "django.db.backends.sqlite3" and database["NAME"] != ":memory:":
            Path(str(database["NAME"])).parent.mkdir(parents=True, exist_ok=True)
