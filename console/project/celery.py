"""The Celery application: configured from Django settings (``CELERY_*``), see settings.py."""

import os
from pathlib import Path
from typing import Any

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.project.settings")

app = Celery("loopguard")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(["console"])


@app.on_after_configure.connect  # type: ignore[untyped-decorator]
def make_broker_folders(sender: Celery, **kwargs: Any) -> None:
    """Standalone mode: kombu's filesystem transport expects its folders to exist, in every
    process that publishes (web, ``manage.py start_task``) or consumes (worker)."""
    if not str(sender.conf.broker_url or "").startswith("filesystem:"):
        return
    options = sender.conf.broker_transport_options or {}
    for name in ("data_folder_in", "data_folder_out", "control_folder", "processed_folder"):
        if options.get(name):
            Path(options[name]).mkdir(parents=True, exist_ok=True)
