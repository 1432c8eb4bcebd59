"""Create or update a console user with roles: ``manage.py create_user ana --role operator``."""

from __future__ import annotations

import secrets
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction

from console.records.roles import Role, assign


class Command(BaseCommand):
    help = "Create a console user (or update one) with the given roles; prints the password."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")
        parser.add_argument(
            "--role",
            action="append",
            choices=[role.value for role in Role],
            required=True,
            help="a role to hold (repeatable): " + ", ".join(role.value for role in Role),
        )
        parser.add_argument("--password", help="default: a new random password, printed once")

    def handle(self, *args: Any, **options: Any) -> None:
        username: str = options["username"].strip()
        if not username:
            raise CommandError("a username is required")
        password = options["password"] or secrets.token_urlsafe(12)
        with transaction.atomic():
            user, created = get_user_model().objects.get_or_create(username=username)
            user.set_password(password)
            user.is_staff = Role.ADMIN.value in options["role"]
            user.save()
            assign(user, [Role(name) for name in options["role"]])
        verb = "created" if created else "updated"
        roles = ", ".join(options["role"])
        self.stdout.write(f"{verb} {username} ({roles}) password: {password}")
