"""The restart-loop hold is one decision even when the same goal is started many times at once.

Eight separate OS processes, each with its own database connection, start the same agent
with the same input at the same moment (released together), on PostgreSQL and on the SQLite
of standalone mode. Counting the recent starts and inserting the new task must be one atomic
decision, or every racer counts the same few committed tasks and all of them run.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

from console.models import StopReport, Task, TaskState
from tests.databases import on_test_database
from tests.processes import run_python, start_python
from tests.waiting import release_together, standalone_env

pytestmark = pytest.mark.slow

PROCESSES = 8
ROUNDS = 2

# A racing starter, run as `python -c STARTER agent input-json` (with DJANGO_SETTINGS_MODULE
# and DATABASE_URL set): it connects, says "ready", waits for the start time the parent sends
# (see release_together), starts one task without enqueueing it and prints its outcome.
STARTER = """
import json, sys, time
import django
django.setup()
from django.db import connection
from console.services import task_start
agent, payload = sys.argv[1], json.loads(sys.argv[2])
connection.ensure_connection()
print("ready", flush=True)
start = float(sys.stdin.readline())
while (left := start - time.time()) > 0:
    time.sleep(min(left, 0.0005))
task = task_start(agent=agent, input=payload, enqueue=lambda task_id: None)
print(json.dumps({"id": task.id, "state": task.state, "reason": task.reason}), flush=True)
"""
MIGRATE = """
import django
django.setup()
from django.core.management import call_command
call_command("migrate", verbosity=0)
"""


def start_starter(
    agent: str, payload: Mapping[str, object], env: Mapping[str, str]
) -> subprocess.Popen[str]:
    return start_python(STARTER, agent, json.dumps(payload), env=env)


def race(env: Mapping[str, str], payload: Mapping[str, object]) -> list[dict[str, Any]]:
    """Eight starts of ``test_reader`` with ``payload``, released together: their outcomes."""
    racers = [start_starter("test_reader", payload, env) for _ in range(PROCESSES)]
    answers: list[dict[str, Any]] = release_together(racers, delay=0.5, timeout=120)
    return answers


def assert_only_the_limit_ran(answers: list[dict[str, Any]], limit: int) -> None:
    running = [a for a in answers if a["state"] == TaskState.QUEUED]
    held = [a for a in answers if a["state"] == TaskState.NEEDS_HUMAN]
    assert len(running) == limit, answers
    assert len(held) == PROCESSES - limit, answers
    assert {a["reason"] for a in held} == {"restart_loop"}, answers


@pytest.mark.django_db(transaction=True)
def test_of_eight_processes_starting_the_same_goal_at_once_only_the_limit_run() -> None:
    limit = settings.LOOPGUARD_RESTART_LIMIT
    assert limit < PROCESSES, "the race needs more starters than the limit lets run"
    env = on_test_database()
    # Two rounds, each a goal of its own: one lucky interleaving cannot pass the test.
    for round_number in range(ROUNDS):
        answers = race(env, {"pages": 1, "round": round_number})
        assert_only_the_limit_ran(answers, limit)
        # What an operator sees agrees with what each starter was told.
        tasks = Task.objects.filter(id__in=[a["id"] for a in answers])
        assert tasks.filter(state=TaskState.QUEUED).count() == limit
        held_ids = [a["id"] for a in answers if a["state"] == TaskState.NEEDS_HUMAN]
        reported = StopReport.objects.filter(task_id__in=held_ids)
        assert set(reported.values_list("task_id", flat=True)) == set(held_ids)


def test_on_sqlite_the_same_race_runs_only_the_limit_too(tmp_path: Path) -> None:
    # Standalone mode: SQLite's IMMEDIATE transactions serialise the starts without a lock
    # of their own.
    env = standalone_env(tmp_path)
    migrate = run_python(MIGRATE, env=env)
    assert migrate.returncode == 0, migrate.stderr

    answers = race(env, {"pages": 1})

    assert_only_the_limit_ran(answers, settings.LOOPGUARD_RESTART_LIMIT)
