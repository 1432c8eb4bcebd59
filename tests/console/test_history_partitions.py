"""The trace partitioned by ranges of task ids (PostgreSQL): a task's trace in one partition,
the ranges made ahead of the newest task, and an existing database migrated in place."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import psycopg
import pytest
from django.conf import settings
from django.db import DatabaseError, IntegrityError, connection, transaction

from console.models import Task, TraceEvent
from console.store import history
from tests.processes import ROOT, clean_environment

pytestmark = pytest.mark.django_db


def _partition_of(event: TraceEvent) -> str:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT tableoid::regclass::text FROM console_traceevent WHERE id = %s", [event.id]
        )
        (name,) = cursor.fetchone()
    return str(name)


def _event(task: Task, seq: int = 0) -> TraceEvent:
    return TraceEvent.objects.create(task=task, phase=1, seq=seq, kind="note", detail="x")


def _task(**fields: object) -> Task:
    return Task.objects.create(agent="test_reader", input={}, limits={}, **fields)


def test_a_tasks_trace_is_written_into_the_range_that_holds_its_id() -> None:
    found = history.trace_partitions()
    ranges = [p for p in found if not p.default]
    assert found[-1].default and len(ranges) == 1 + history.AHEAD
    task = _task()
    first = next(p for p in ranges if (p.low or 0) <= task.id < (p.high or 0))
    assert _partition_of(_event(task)) == first.name
    assert list(task.events.values_list("seq", flat=True)) == [0]


def test_the_trace_stays_append_only_and_one_event_per_seq() -> None:
    task = _task()
    event = _event(task)
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        TraceEvent.objects.filter(id=event.id).update(detail="rewritten")
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        TraceEvent.objects.filter(id=event.id).delete()
    with pytest.raises(IntegrityError), transaction.atomic():
        _event(task, seq=0)
    assert TraceEvent.objects.get(id=event.id).detail == "x"


def test_ranges_are_made_ahead_of_the_newest_task_and_start_above_the_default(
    settings_size: int,
) -> None:
    top = max(p.high or 0 for p in history.trace_partitions() if not p.default)
    # A task past every range (ids jumped: a restored sequence, a bulk import): its trace
    # is written all the same, into the default partition.
    stray = _task(id=top + 5)
    assert _partition_of(_event(stray)).endswith("_default")
    made = history.partitions_ahead()
    assert made[0] == f"console_traceevent_t{top + 6}"  # above what the default holds
    after = history.trace_partitions()
    assert after[-1].default
    highest = max(p.high or 0 for p in after if not p.default)
    assert highest > stray.id + history.AHEAD * settings_size
    assert _partition_of(_event(_task(id=top + 7))) == made[0]
    assert history.partitions_ahead() == []  # enough ranges stand ready: nothing to make
    assert _partition_of(TraceEvent.objects.get(task=stray)).endswith("_default")


@pytest.fixture
def settings_size() -> int:
    return int(settings.LOOPGUARD_TRACE_PARTITION_TASKS)


# -- an existing database, migrated in place -----------------------------------------------


# What 0018 had: three finished tasks, two events each, written by the ORM of that time.
_OLD_ROWS = """
from django.db import connection
from django.db.migrations.loader import MigrationLoader
old = MigrationLoader(connection).project_state(("console", "0018_client_lost")).apps
Task, TraceEvent = old.get_model("console", "Task"), old.get_model("console", "TraceEvent")
for n in range(3):
    task = Task.objects.create(agent="test_reader", input={"n": n}, limits={}, state="COMPLETED",
                               reason="goal_met")
    for seq in range(2):
        TraceEvent.objects.create(task=task, phase=1, seq=seq, kind="note", detail=f"{n}/{seq}")
"""
_NEW_ROW = """
from console.models import Task, TraceEvent
task = Task.objects.order_by("id").first()
event = TraceEvent.objects.create(task=task, phase=2, seq=2, kind="note", detail="after")
print(event.id, list(task.events.order_by("seq").values_list("detail", flat=True)))
"""


@pytest.fixture
def old_database() -> Iterator[str]:
    """A database of its own at the last migration before the partitions, with tasks and a
    trace in it: its URL."""
    db = settings.DATABASES["default"]
    name = f"{db['NAME']}_upgrade"
    server = f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}"
    with psycopg.connect(f"{server}/postgres", autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{name}"')
    url = f"{server}/{name}"
    _django(url, "migrate", "-v0", "console", "0018")
    _django(url, "shell", "-c", _OLD_ROWS)
    yield url
    with psycopg.connect(f"{server}/postgres", autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _django(url: str, *argv: str) -> str:
    done = subprocess.run(  # noqa: S603 - this interpreter, Django's own command line
        [sys.executable, "-m", "django", *argv],
        cwd=ROOT,
        env=clean_environment(DATABASE_URL=url, DJANGO_SETTINGS_MODULE="console.project.settings"),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def _catalogue(url: str) -> tuple[list[tuple[str, str]], list[tuple[int, int, str]]]:
    with psycopg.connect(url) as db:
        partitions = db.execute(
            "SELECT c.relname, pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits i"
            " JOIN pg_class c ON c.oid = i.inhrelid"
            " WHERE i.inhparent = 'console_traceevent'::regclass ORDER BY c.relname"
        ).fetchall()
        rows = db.execute(
            "SELECT id, task_id, detail FROM console_traceevent ORDER BY id"
        ).fetchall()
    return partitions, rows


def test_an_existing_trace_becomes_the_first_partition_with_every_row_and_id_kept(
    old_database: str, settings_size: int
) -> None:
    with psycopg.connect(old_database) as db:
        before = db.execute(
            "SELECT id, task_id, detail FROM console_traceevent ORDER BY id"
        ).fetchall()
    assert len(before) == 6

    _django(old_database, "migrate", "-v0")

    partitions, rows = _catalogue(old_database)
    assert rows == before  # kept where they were: not copied, not renumbered
    bound = 2 * settings_size  # two whole ranges above the newest task (3)
    assert partitions == sorted(
        [
            ("console_traceevent_t0", f"FOR VALUES FROM (MINVALUE) TO ('{bound}')"),
            ("console_traceevent_default", "DEFAULT"),
            *(
                (
                    f"console_traceevent_t{low}",
                    f"FOR VALUES FROM ('{low}') TO ('{low + settings_size}')",
                )
                for low in (bound, bound + settings_size)
            ),
        ]
    )
    said = _django(old_database, "shell", "-v0", "-c", _NEW_ROW).strip().splitlines()[-1]
    new_id, details = said.split(" ", 1)
    assert int(new_id) > max(row[0] for row in before)  # the ids go on from the old ones
    assert details.strip() == "['0/0', '0/1', 'after']"
    _django(old_database, "migrate", "-v0")  # again: nothing left to do, nothing broken
    assert _catalogue(old_database)[0] == partitions
