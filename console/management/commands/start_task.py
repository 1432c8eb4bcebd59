"""Start a task from the shell: ``manage.py start_task AGENT '{"order": 1001}'``."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from console.agents import agent_class, agent_names
from console.records.inputs import InputRefused, check_kept, load_json, unstorable
from console.services import ServiceError, task_start


class Command(BaseCommand):
    help = "Start a task for a registered agent; prints the task id."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("agent", nargs="?", help="agent name (omit to list them)")
        parser.add_argument("input", nargs="?", default="{}", help="the task input, JSON")
        parser.add_argument(
            "--limit",
            action="append",
            default=[],
            metavar="NAME=VALUE",
            help="override one budget, e.g. --limit model_calls=5 (repeatable)",
        )
        parser.add_argument(
            "--wait", action="store_true", help="drive the task in this process instead"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        name = options["agent"]
        if not name:
            for agent in agent_names():
                cls = agent_class(agent)
                self.stdout.write(f"{agent:<22} {cls.title}: {cls.description}")
            return
        try:
            payload = load_json(options["input"], what="the input")
            check_kept(payload, what="the input")
        except InputRefused as exc:
            raise CommandError(str(exc)) from None
        if not isinstance(payload, dict):
            raise CommandError("the input must be a JSON object")
        problem = unstorable(payload, what="the input")
        if problem is not None:
            raise CommandError(problem)
        limits: dict[str, Any] = {}
        for item in options["limit"]:
            key, sep, value = item.partition("=")
            if not sep:
                raise CommandError(f"--limit {item!r}: expected NAME=VALUE")
            try:
                limits[key.strip()] = int(value)
            except ValueError as exc:
                raise CommandError(f"--limit {item!r}: {value!r} is not a whole number") from exc
        try:
            if options["wait"]:  # this process drives it: nothing goes to the queue
                task = task_start(
                    agent=name, input=payload, limits=limits or None, enqueue=lambda task_id: None
                )
            else:
                task = task_start(agent=name, input=payload, limits=limits or None)
        except ServiceError as exc:
            raise CommandError(str(exc)) from exc
        if options["wait"] and task.state == "QUEUED":
            from console.tasks import run_task

            outcome = run_task(task.id)  # the Celery task's body, run here
            task.refresh_from_db()
            self.stdout.write(f"task {task.id}: {outcome}")
        self.stdout.write(str(task.id) if not options["wait"] else f"{task.state} {task.reason}")
