"""The support desk's Django application."""

from __future__ import annotations

from typing import Any

from django.apps import AppConfig
from django.db import DEFAULT_DB_ALIAS, connections
from django.db.models.signals import post_migrate


class DeskConfig(AppConfig):
    """Orders, refunds, notices, export jobs and pages for the demo agents."""

    name = "console.demo"
    label = "desk"
    verbose_name = "Support desk (demo business system)"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Seeding after every migrate (and after the test runner's flush, which sends the
        # same signal) means a demo agent never meets an empty desk on a first run.
        post_migrate.connect(_seed_after_migrate, sender=self)


def _seed_after_migrate(using: str = DEFAULT_DB_ALIAS, **kwargs: Any) -> None:
    from console.demo.desk import seed_demo_data
    from console.demo.models import Page

    # `migrate` may stop short of the desk's migrations (`migrate console 0001`), and the
    # signal is sent all the same.
    if Page._meta.db_table in connections[using].introspection.table_names():
        seed_demo_data(using=using)
