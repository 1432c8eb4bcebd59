"""Seed the demo: ``manage.py demo`` (``manage.py up`` runs it before it starts the console)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from console.demo.desk import seed_demo_data
from console.demo.scenarios import DemoUser, Scenario, demo_tasks, demo_users
from console.models import Task


def credentials(people: list[DemoUser]) -> list[str]:
    """The demo people as lines to print: username, role, password."""
    lines = []
    for person in people:
        if person.password is None:
            lines.append(f"{person.username:<11} (an existing account, not the demo's: unchanged)")
        else:
            lines.append(f"{person.username:<11} password {person.password}")
    return lines


def task_lines(shown: list[tuple[Scenario, Task, bool]]) -> list[str]:
    """One line per demo task: id, agent, what it shows, and whether it was started now."""
    return [
        f"task {task.id:<5} {scenario.agent:<18} {scenario.shows}"
        + ("" if new else f" (from an earlier run: {task.state})")
        for scenario, task, new in shown
    ]


class Command(BaseCommand):
    help = (
        "Create the demo people (admin, operator, reconciler, approver, viewer; new random "
        "passwords, printed once) and start the demo tasks that are not there yet. Safe to "
        "run again."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--no-tasks", action="store_true", help="only the people and the desk's records"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        people = demo_users()
        self.stdout.write("Demo people (passwords are new on every run):")
        for line in credentials(people):
            self.stdout.write(f"  {line}")
        if options["no_tasks"]:
            seed_demo_data()
            return
        self.stdout.write("Demo tasks (the workers drive them):")
        for line in task_lines(demo_tasks()):
            self.stdout.write(f"  {line}")
