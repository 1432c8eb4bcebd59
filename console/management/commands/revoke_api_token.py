"""Revoke an API token: ``manage.py revoke_api_token ana --name ci-pipeline``."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from console.models import ApiToken


class Command(BaseCommand):
    help = (
        "Revoke USERNAME's live API token named NAME: every request with it is refused from "
        "now on. The row stays (revoked_at set); a new token may then take the name."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")
        parser.add_argument("--name", required=True, help="the name it was created with")

    def handle(self, *args: Any, **options: Any) -> None:
        username, name = options["username"].strip(), options["name"].strip()
        live = ApiToken.objects.filter(
            user__username=username, name=name, revoked_at__isnull=True
        )
        revoked = live.update(revoked_at=timezone.now())
        if revoked == 0:
            names = sorted(
                ApiToken.objects.filter(
                    user__username=username, revoked_at__isnull=True
                ).values_list("name", flat=True)
            )
            having = ", ".join(repr(n) for n in names) if names else "none"
            raise CommandError(
                f"{username} has no live token named {name!r} (live tokens: {having})"
            )
        self.stdout.write(f"revoked API token {name!r} of {username}")
