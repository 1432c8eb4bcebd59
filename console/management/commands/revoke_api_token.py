"""Revoke an API token: ``manage.py revoke_api_token ana --name ci-pipeline``."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from console.api.tokens import api_token_revoke
from console.services import NotFound


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
        try:
            api_token_revoke(username=username, name=name)
        except NotFound as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(f"revoked API token {name!r} of {username}")
