"""Issue an API token: ``manage.py create_api_token ana --name ci-pipeline``."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from console.api.tokens import api_token_issue
from console.records.roles import roles_of
from console.services import ServiceError


class Command(BaseCommand):
    help = (
        "Create a bearer token for the JSON API, acting as USERNAME with that user's roles. "
        "The token is printed once and cannot be shown again: only its hash is stored."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")
        parser.add_argument(
            "--name", required=True, help="what the token is for, e.g. ci-pipeline"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        username: str = options["username"].strip()
        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            raise CommandError(f"there is no user {username!r} (create_user makes one)")
        if not user.is_active:
            raise CommandError(f"{username} is deactivated: a token for them would not work")
        try:
            token, secret = api_token_issue(user=user, name=options["name"])
        except ServiceError as exc:
            raise CommandError(str(exc)) from None
        roles = ", ".join(sorted(roles_of(user))) or "none: every request will be refused"
        # The secret is alone on the last line, so a script can take it with `tail -n 1`.
        self.stdout.write(
            f"created API token {token.name!r} ({token.prefix}…) for {username}; roles: {roles}\n"
            "Store it now: it is shown only this once."
        )
        self.stdout.write(secret)
