"""Roll-ups (console/rollups.py): what /metrics and the dashboard read instead of all of
history, and every way a rolled task can change afterwards, against a count of everything.

Each test compares what a person or Prometheus sees with what a full count of the tables
says (the oracle, :func:`_counted`), before a roll, after it, and after every move that
takes a rolled task back out."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from django.contrib.auth.models import User
from django.db import connection, transaction
from django.db.models import Count, Sum
from django.test import Client
from django.utils import timezone

from console import lifecycle, rollups, services
from console.models import (
    Approval,
    HourStat,
    StopReport,
    Task,
    TaskState,
    TaskTotal,
    TraceEvent,
)
from console.records.roles import Role, assign
from console.selectors import spend, trends
from console.store import queries
from console.web.metrics import SPENT, snapshot
from tests.databases import django, own_database

HOUR = timedelta(hours=1)
LATER = 2 * rollups.SETTLE


def _counted() -> dict[str, Any]:
    """What /metrics must say, counted over every row: tasks by state, what each agent's
    tasks spent, stop reports by state and reason."""
    tasks = dict.fromkeys(TaskState.values, 0)
    for row in Task.objects.values("state").annotate(n=Count("id")).order_by():
        tasks[row["state"]] = row["n"]
    spent: dict[str, dict[str, int]] = {d.used: {} for d in SPENT}
    for row in Task.objects.values("agent").annotate(**{d.used: Sum(d.used) for d in SPENT}):
        for d in SPENT:
            spent[d.used][row["agent"]] = int(row[d.used] or 0)
    stops = {
        (row["state"], row["reason"]): row["n"]
        for row in StopReport.objects.values("state", "reason").annotate(n=Count("*")).order_by()
    }
    return {"tasks": tasks, "spent": spent, "stops": stops}


def _seen() -> dict[str, Any]:
    """What /metrics says, in the oracle's shape."""
    snap = snapshot()
    return {"tasks": snap.tasks, "spent": snap.spent, "stops": snap.stops}


def _resume(task_id: int, person: User) -> None:
    """An approver resumes a task that ran out of model calls, granting five more (no
    worker runs in these tests: nothing is enqueued)."""
    services.task_approve_resumption(
        task_id=task_id,
        actor=person,
        reason="more calls",
        grant={"model_calls": 5},
        enqueue=lambda _: None,
    )


def _roll_everything() -> None:
    """What beat does, with every task that stopped taken as stopped a while ago (the stop
    reports here are stamped an hour back, but the moves below stop tasks now)."""
    rollups.roll_tasks(timezone.now() + LATER, until=time.monotonic() + 30)
    rollups.roll_stops(timezone.now())


def _stopped(
    state: str,
    reason: str,
    *,
    agent: str = "test_reader",
    ago: timedelta = HOUR,
    **counters: int,
) -> Task:
    """A task that stopped ``ago``, with its stop report."""
    at = timezone.now() - ago
    task = Task.objects.create(
        agent=agent,
        input={"goal": reason},
        input_fingerprint=f"{agent}-{reason}".ljust(64, "f")[:64],
        state=state,
        reason=reason,
        limits={"model_calls": 10},
        finished_at=at,
        updated_at=at,
        created_at=at - HOUR,
        **counters,
    )
    StopReport.objects.create(task=task, phase=1, state=state, reason=reason, report={}, at=at)
    return task


@pytest.fixture
def person(db: None) -> User:
    user = User.objects.create_user("rolla", password="pw-rolla")
    assign(user, [Role.OPERATOR, Role.APPROVER])
    return user


# -- /metrics ----------------------------------------------------------------------------------


@pytest.mark.django_db
def test_metrics_say_the_same_before_a_roll_after_it_and_after_every_move_of_a_rolled_task(
    person: User,
) -> None:
    _stopped(TaskState.COMPLETED, "goal_met", model_calls=3, tokens=120, spend=40)
    budget = _stopped(TaskState.PARTIAL, "model_budget", agent="paging", model_calls=10)
    held = _stopped(TaskState.NEEDS_HUMAN, "restart_loop", agent="paging")
    waiting = _stopped(TaskState.NEEDS_HUMAN, "approval_required", executions=2, requests=3)
    Approval.objects.create(
        task=waiting, phase=1, tool="refund", effect="write", operation_key="r-1", args={}
    )
    summarised = _stopped(TaskState.PARTIAL, "token_budget", tokens=500, spend=90)
    Task.objects.create(agent="paging", input_fingerprint="r" * 64, state=TaskState.RUNNING)
    before = _counted()
    assert _seen() == before

    _roll_everything()

    assert Task.objects.filter(rolled=True).count() == 5
    assert TaskTotal.objects.filter(tasks__gt=0).count() == 5  # by agent and state
    assert _seen() == _counted() == before

    _resume(budget.id, person)
    assert _seen() == _counted()
    services.task_stop(task_id=held.id, actor=person, reason="not again")  # cancel
    assert _seen() == _counted()
    approval = Approval.objects.get(task=waiting)
    services.approval_reject(approval_id=approval.id, actor=person, reason="no", resume=False)
    assert _seen() == _counted()
    summarised.refresh_from_db()
    report = lifecycle.report_from_task(summarised, summarised.state, summarised.reason)
    assert lifecycle.add_summary(
        summarised.id,
        1,
        dataclasses.replace(report, tokens=700, spend=130),
        {"kind": "note", "detail": "summary"},
    )
    assert _seen() == _counted()

    after = _counted()
    assert after != before  # the moves above changed what is counted
    assert Task.objects.filter(rolled=False).exclude(state=TaskState.RUNNING).count() == 4
    _roll_everything()
    assert _seen() == _counted() == after
    assert set(Task.objects.filter(rolled=False).values_list("state", flat=True)) == {
        TaskState.RUNNING,
        TaskState.QUEUED,  # the resumed task, waiting for a worker
    }


@pytest.mark.django_db
def test_a_task_is_rolled_only_once_it_has_stopped_a_while() -> None:
    recent = _stopped(TaskState.FAILED, "fatal", ago=timedelta(minutes=1))
    old = _stopped(TaskState.FAILED, "fatal", ago=HOUR)
    Task.objects.create(agent="paging", input_fingerprint="r" * 64, state=TaskState.RUNNING)

    rolled = rollups.roll_tasks(timezone.now(), until=time.monotonic() + 30)

    assert rolled == 1
    assert set(Task.objects.filter(rolled=True).values_list("id", flat=True)) == {old.id}
    assert not Task.objects.get(id=recent.id).rolled
    assert _seen() == _counted()


@pytest.mark.django_db
def test_stop_reports_are_counted_once_whether_beat_counted_them_or_not() -> None:
    _stopped(TaskState.PARTIAL, "same_call", ago=3 * HOUR)
    _stopped(TaskState.PARTIAL, "same_call", ago=2 * HOUR)
    assert rollups.roll_stops(timezone.now()) == 2
    assert rollups.roll_stops(timezone.now()) == 0  # nothing new
    _stopped(TaskState.PARTIAL, "same_call", ago=timedelta(minutes=1))  # too new to count
    _stopped(TaskState.FAILED, "fatal", ago=timedelta(minutes=1))

    assert rollups.roll_stops(timezone.now()) == 0
    assert (
        _seen()["stops"]
        == _counted()["stops"]
        == {
            ("PARTIAL", "same_call"): 3,
            ("FAILED", "fatal"): 1,
        }
    )
    assert rollups.roll_stops(timezone.now() + LATER) == 2
    assert _seen()["stops"] == _counted()["stops"]


# -- racing a roll -----------------------------------------------------------------------------


def _in_thread(work: Callable[[], Any]) -> threading.Thread:
    def run() -> None:
        try:
            work()
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


@pytest.mark.django_db(transaction=True)
def test_a_resumption_that_waits_for_a_roll_takes_the_task_out_after_it(person: User) -> None:
    task = _stopped(TaskState.PARTIAL, "model_budget", model_calls=10, tokens=50)
    rolling, resumed = threading.Event(), threading.Event()

    def roll_and_hold() -> None:
        with transaction.atomic():
            assert rollups.roll_tasks(timezone.now(), until=time.monotonic() + 30) == 1
            rolling.set()
            # The resumption waits for the task's row, held here until this commits.
            assert not resumed.wait(1.0)

    def resume() -> None:
        assert rolling.wait(10)
        _resume(task.id, person)
        resumed.set()

    threads = [_in_thread(roll_and_hold), _in_thread(resume)]
    for thread in threads:
        thread.join(30)

    assert resumed.is_set()
    assert Task.objects.get(id=task.id).state == TaskState.QUEUED
    assert not Task.objects.get(id=task.id).rolled
    assert _seen() == _counted()


@pytest.mark.django_db(transaction=True)
def test_a_roll_passes_over_a_task_that_is_moving_and_takes_it_next_time(person: User) -> None:
    task = _stopped(TaskState.PARTIAL, "model_budget", model_calls=10)
    other = _stopped(TaskState.FAILED, "fatal")
    holding, rolled = threading.Event(), threading.Event()

    def resume_slowly() -> None:
        with transaction.atomic():
            Task.objects.select_for_update().get(id=task.id)  # as the services lock it first
            holding.set()
            assert rolled.wait(10)
            _resume(task.id, person)

    def roll() -> None:
        assert holding.wait(10)
        assert rollups.roll_tasks(timezone.now(), until=time.monotonic() + 30) == 1
        rolled.set()

    threads = [_in_thread(resume_slowly), _in_thread(roll)]
    for thread in threads:
        thread.join(30)

    assert Task.objects.get(id=other.id).rolled  # the one nobody held
    assert not Task.objects.get(id=task.id).rolled  # passed over, then resumed
    assert _seen() == _counted()


@pytest.mark.django_db(transaction=True)
def test_two_rolls_that_both_make_a_new_total_add_to_the_one_total() -> None:
    first = _stopped(TaskState.FAILED, "fatal")
    rolled, waited = threading.Event(), threading.Event()
    second_rolled: list[int] = []

    def roll_and_hold() -> None:
        with transaction.atomic():
            # The first FAILED test_reader task ever rolled: its total is made here.
            assert rollups.roll_tasks(timezone.now(), until=time.monotonic() + 30) == 1
            rolled.set()
            # The other roll makes the same total meanwhile and waits for this one's.
            assert waited.wait(10)
            time.sleep(0.5)

    def roll_another() -> None:
        assert rolled.wait(10)
        _stopped(TaskState.FAILED, "fatal")  # its agent's and state's total is not there yet
        waited.set()
        second_rolled.append(rollups.roll_tasks(timezone.now(), until=time.monotonic() + 30))

    threads = [_in_thread(roll_and_hold), _in_thread(roll_another)]
    for thread in threads:
        thread.join(30)

    assert second_rolled == [1]  # not an error on the total's unique key
    assert Task.objects.filter(rolled=True).count() == 2 and Task.objects.get(id=first.id).rolled
    assert TaskTotal.objects.get(agent="test_reader", state=TaskState.FAILED).tasks == 2
    assert _seen() == _counted()


@pytest.mark.django_db(transaction=True)
def test_metrics_read_the_totals_and_the_rest_at_one_moment() -> None:
    _stopped(TaskState.FAILED, "fatal")
    with queries.snapshot():
        first = list(TaskTotal.objects.values_list("agent", "tasks"))
        _in_thread(lambda: rollups.roll_tasks(timezone.now(), until=time.monotonic() + 30)).join(30)
        assert list(TaskTotal.objects.values_list("agent", "tasks")) == first == []
        assert Task.objects.filter(rolled=False).count() == 1  # as it was when reading began
    assert list(TaskTotal.objects.values_list("agent", "tasks")) == [("test_reader", 1)]


# -- the dashboard's hours ---------------------------------------------------------------------


def _trace(task: Task, at: datetime, *, latency: int, cost: int | None = None) -> None:
    seq = TraceEvent.objects.filter(task=task).count() + 1
    TraceEvent.objects.create(
        task=task,
        phase=1,
        seq=seq,
        at=at,
        kind="model_call" if cost is not None else "request",
        latency_ms=latency,
        cost=cost,
    )


@pytest.fixture
def traced(db: None) -> Task:
    """A task with steps over the last two days: some priced, in most hours."""
    task = Task.objects.create(agent="paging", input_fingerprint="t" * 64, state="RUNNING")
    now = timezone.now()
    for n in range(60):
        at = now - n * 47 * timedelta(minutes=1)
        _trace(task, at, latency=10 + (n * 37) % 400, cost=(n % 5) or None)
    return task


@pytest.mark.django_db
def test_the_charts_and_spend_read_the_same_from_counted_hours(traced: Task) -> None:
    now = timezone.now()
    live_trends, live_spend = trends(now=now), spend(now=now)

    assert rollups.count_hours(now) == int(rollups.KEEP / HOUR)
    assert HourStat.objects.filter(steps__gt=0).exists()

    assert trends(now=now) == live_trends
    assert spend(now=now) == live_spend
    assert live_spend.week > live_spend.today > 0


@pytest.mark.django_db
def test_spend_today_is_right_where_midnight_is_not_on_the_hour(traced: Task) -> None:
    now = timezone.now()
    with timezone.override("Asia/Kolkata"):  # UTC+05:30
        midnight = timezone.localtime(now).replace(hour=0, minute=0, second=0, microsecond=0)
        # A priced call in the half hour after midnight, which the week counts whole.
        _trace(
            traced, midnight + min(timedelta(minutes=10), (now - midnight) / 2), latency=5, cost=11
        )
        live = spend(now=now)
        rollups.count_hours(now)
        assert spend(now=now) == live


@pytest.mark.django_db
def test_a_step_saved_late_lands_in_its_hour_within_a_day_and_older_hours_are_final(
    traced: Task,
) -> None:
    now = timezone.now()
    rollups.count_hours(now)
    closed = rollups.hour_of(now)
    recent, old = closed - 3 * HOUR, closed - 30 * HOUR
    counted = {h.hour: h.steps for h in HourStat.objects.filter(hour__in=[recent, old])}

    _trace(traced, recent + timedelta(minutes=5), latency=9)
    _trace(traced, old + timedelta(minutes=5), latency=9)
    rollups.count_hours(now)

    again = {h.hour: h.steps for h in HourStat.objects.filter(hour__in=[recent, old])}
    assert again == {recent: counted[recent] + 1, old: counted[old]}


@pytest.mark.django_db
def test_the_current_hour_is_always_read_from_the_trace(traced: Task) -> None:
    now = timezone.now()
    rollups.count_hours(now)
    before = trends(now=now)
    current = now.astimezone(UTC).replace(minute=0, second=0, microsecond=0)

    today = spend(now=now).today
    _trace(traced, max(current, now - timedelta(seconds=1)), latency=5000, cost=7)

    assert trends(now=now).latency_p95[-1] != before.latency_p95[-1]
    assert spend(now=now).today == today + 7


# -- beat --------------------------------------------------------------------------------------


def test_beat_rolls_up_every_minute() -> None:
    from console.project import settings as production  # the tests' own replace beat's

    entry = production.CELERY_BEAT_SCHEDULE["roll-ups"]
    assert entry == {"task": "console.tasks.roll_up", "schedule": 60.0}


@pytest.mark.django_db(transaction=True)  # the task starts with close_old_connections()
def test_the_beat_task_rolls_tasks_stops_and_hours(traced: Task, client: Client) -> None:
    from console.tasks import roll_up

    _stopped(TaskState.FAILED, "fatal", ago=2 * HOUR)

    done = roll_up()

    assert done["tasks"] == 1
    assert done["stops"] == 1
    assert done["hours"] == int(rollups.KEEP / HOUR)
    assert client.get("/metrics").status_code == 200
    assert _seen() == _counted()


# -- migrating a database from before them -----------------------------------------------------

_METRICS = (
    "from console import rollups; from console.web.metrics import snapshot;"
    " before = snapshot(); done = rollups.roll();"
    " after = snapshot(); print(done.tasks, done.stops,"
    " (before.tasks, before.spent, before.stops) == (after.tasks, after.spent, after.stops),"
    " after.tasks['FAILED'], after.spent['model_calls'])"
)


@pytest.mark.django_db
def test_a_database_from_before_the_roll_ups_migrates_and_its_metrics_stay_the_same() -> None:
    with own_database("rollups") as url:
        django(url, "migrate", "-v0", "console", "0024")
        with psycopg.connect(url) as conn:  # rows as the code before 0025 wrote them
            conn.execute(
                "INSERT INTO console_task (agent, client, tools, input, input_fingerprint, state,"
                " reason, detail, limits, model_calls, requests, executions, tokens, spend,"
                " explored, polls, elapsed_ms, revision, phase, next_seq, recoveries, lease_owner,"
                " stop_note, created_at, updated_at, finished_at) SELECT 'test_reader', '', '{}',"
                " '{}', 'f', 'FAILED', 'fatal', '', '{}', s, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 0, '',"
                " '', now() - interval '2 hours', now(), now() - interval '1 hour'"
                " FROM generate_series(1, 3) s"
            )
            conn.execute(
                "INSERT INTO console_stopreport (task_id, phase, at, state, reason, report)"
                " SELECT id, 1, finished_at, state, reason, '{}' FROM console_task"
            )

        django(url, "migrate", "-v0")

        with psycopg.connect(url) as conn:
            valid = dict(
                conn.execute(
                    "SELECT c.relname, i.indisvalid FROM pg_index i"
                    " JOIN pg_class c ON c.oid = i.indexrelid WHERE c.relname = ANY(%s)",
                    (["task_unrolled", "stop_report_at"],),
                ).fetchall()
            )
            unrolled = conn.execute("SELECT count(*) FROM console_task WHERE NOT rolled").fetchone()
            mark = conn.execute("SELECT stops_before FROM console_rollup WHERE id = 1").fetchone()
        assert valid == {"task_unrolled": True, "stop_report_at": True}
        assert unrolled == (3,)  # none rolled yet: /metrics counts them live meanwhile
        assert mark == (None,)
        printed = django(url, "shell", "-c", _METRICS).splitlines()[-1].split()
        assert printed == ["3", "3", "True", "3", "{'test_reader':", "6}"]
