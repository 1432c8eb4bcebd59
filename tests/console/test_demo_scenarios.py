"""The demo ``manage.py up`` seeds: a refund waiting for an approver, and a task always running.

The demo's tasks are started as ``up`` starts them (``demo_tasks``, then
``demo_keep_running`` every few seconds), without a worker: a test drives a task in-process
with the runner when it needs the task to have run.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.db import connection

from console import services
from console.demo.agents import LongRunner
from console.demo.models import Refund
from console.demo.scenarios import (
    APPROVAL_INPUT,
    KEEP_RUNNING,
    SCENARIOS,
    Scenario,
    demo_keep_running,
    demo_tasks,
    demo_users,
)
from console.drivers import runner
from console.models import Approval, ApprovalState, Task, TaskState
from guard import Limits

pytestmark = pytest.mark.django_db(transaction=True)

HOUR_MS = 3_600_000


class Demo:
    """The demo people, and the demo's first tasks started (queued, nobody drives them)."""

    def __init__(self) -> None:
        demo_users()
        self.shown = demo_tasks(enqueue=lambda _: None)

    def __getitem__(self, scenario: Scenario) -> Task:
        """The task started for ``scenario``."""
        return next(task for shown, task, _ in self.shown if shown is scenario)


@pytest.fixture
def demo(seeded: None) -> Demo:
    return Demo()


APPROVAL = next(scenario for scenario in SCENARIOS if scenario.input == APPROVAL_INPUT)


def admin() -> User:
    return User.objects.get(username="admin")


def stop(task: Task) -> None:
    services.task_stop(task_id=task.id, actor=admin(), reason="test: stop the running demo")


def runs_of(scenario: Scenario) -> list[Task]:
    return list(Task.objects.filter(agent=scenario.agent, input=scenario.input).order_by("id"))


# -- a call waiting for approval ---------------------------------------------------------------


def test_the_demo_leaves_a_refund_over_its_limit_waiting_in_the_approval_queue(
    demo: Demo,
) -> None:
    scenario = APPROVAL

    assert runner.drive(demo[scenario].id) == "NEEDS_HUMAN/approval_required"

    (approval,) = Approval.objects.filter(state=ApprovalState.PENDING)
    assert approval.task_id == demo[scenario].id
    assert (approval.tool, approval.operation_key) == ("refund", "order-46-refund")
    assert approval.args == {"order": 46, "amount_cents": 12800}
    assert not Refund.objects.filter(order__number=46).exists()  # it did not run


def test_an_approver_who_approves_the_demo_refund_sees_the_task_complete(
    demo: Demo,
) -> None:
    scenario = APPROVAL
    runner.drive(demo[scenario].id)
    approval = Approval.objects.get(state=ApprovalState.PENDING)

    services.approval_approve(
        approval_id=approval.id,
        actor=User.objects.get(username="approver"),
        reason="the customer's photos show both parcels",
        enqueue=lambda _: None,
    )

    assert runner.drive(demo[scenario].id) == "COMPLETED/goal_met"
    assert Refund.objects.get(order__number=46).amount_cents == 12800


# -- a task always running -----------------------------------------------------------------------


def test_the_running_demo_task_is_left_alone_while_it_runs(demo: Demo) -> None:
    assert demo[KEEP_RUNNING].state == TaskState.QUEUED

    assert demo_keep_running(enqueue=lambda _: None) == []
    assert len(runs_of(KEEP_RUNNING)) == 1


def test_once_the_running_demo_task_has_ended_the_next_one_starts(
    demo: Demo,
) -> None:
    stop(demo[KEEP_RUNNING])

    started = demo_keep_running(enqueue=lambda _: None)

    assert [(scenario, task.state) for scenario, task in started] == [
        (KEEP_RUNNING, TaskState.QUEUED)
    ]
    assert demo_keep_running(enqueue=lambda _: None) == []  # the new one is running
    assert [task.id for task in runs_of(KEEP_RUNNING)] == [demo[KEEP_RUNNING].id, started[0][1].id]


def test_a_person_who_keeps_stopping_it_never_gets_a_task_held_as_a_restart_loop(
    demo: Demo,
) -> None:
    for _ in range(settings.LOOPGUARD_RESTART_LIMIT + 2):
        last = runs_of(KEEP_RUNNING)[-1]
        if last.state == TaskState.QUEUED:
            stop(last)
        demo_keep_running(enqueue=lambda _: None)

    runs = runs_of(KEEP_RUNNING)
    assert len(runs) == settings.LOOPGUARD_RESTART_LIMIT
    assert not any(task.reason == "restart_loop" for task in runs)
    assert all(task.state == TaskState.CANCELLED for task in runs)

    # Once the first start is out of the window, the next one starts.
    window = timedelta(seconds=settings.LOOPGUARD_RESTART_WINDOW_SECONDS + 1)
    Task.objects.filter(id=runs[0].id).update(created_at=runs[0].created_at - window)
    (started,) = demo_keep_running(enqueue=lambda _: None)
    assert started[1].state == TaskState.QUEUED


def test_one_run_of_the_running_demo_fits_its_budgets_and_the_brokers_visibility_timeout() -> None:
    limits = Limits(**{**LongRunner.default_limits, **KEEP_RUNNING.limits})
    pages, delay_ms = KEEP_RUNNING.input["pages"], KEEP_RUNNING.input["delay_ms"]
    run_ms = pages * delay_ms

    LongRunner.validate_input(KEEP_RUNNING.input)
    assert run_ms <= 0.75 * limits.deadline_ms  # ends done reading, never on its deadline
    assert min(limits.model_calls, limits.requests, limits.executions) > pages
    # Redis hands an unacknowledged message to another worker after this long.
    visibility_timeout_s = settings.CELERY_BROKER_TRANSPORT_OPTIONS.get("visibility_timeout")
    assert isinstance(visibility_timeout_s, int)
    assert limits.deadline_ms < 1000 * visibility_timeout_s
    assert HOUR_MS / run_ms <= 6  # at most six new tasks an hour while nobody stops it
    assert delay_ms <= 5000  # a Stop takes effect within one page


def _census() -> dict[str, tuple[int, int]]:
    """Rows and bytes of row data in every table."""
    found = {}
    with connection.cursor() as cursor:
        for table in connection.introspection.table_names():
            quoted = connection.ops.quote_name(table)
            sql = f"SELECT count(*), coalesce(sum(pg_column_size(t.*)), 0) FROM {quoted} t"  # noqa: S608
            cursor.execute(sql)
            rows, size = cursor.fetchone()
            found[table] = (int(rows), int(size))
    return found


def _written(pages: int) -> tuple[int, int]:
    """Rows and bytes one demo-started long run of ``pages`` pages adds to the database."""
    before = _census()
    task = services.task_start(
        agent="long_runner",
        input={"pages": pages, "delay_ms": 0},
        actor=User.objects.get(username="operator"),
        reason="demo: measuring what a run writes",
        enqueue=lambda _: None,
    )
    assert runner.drive(task.id) == "COMPLETED/goal_met"
    after = _census()
    rows = sum(after[t][0] - before[t][0] for t in after)
    size = sum(after[t][1] - before[t][1] for t in after)
    return rows, size


def test_what_the_running_demo_writes_in_an_hour_is_small(demo: Demo) -> None:
    short_rows, short_bytes = _written(3)
    long_rows, long_bytes = _written(13)
    per_page = ((long_rows - short_rows) / 10, (long_bytes - short_bytes) / 10)
    per_run = (short_rows - 3 * per_page[0], short_bytes - 3 * per_page[1])

    pages_an_hour = HOUR_MS / KEEP_RUNNING.input["delay_ms"]
    runs_an_hour = pages_an_hour / KEEP_RUNNING.input["pages"]
    rows_an_hour = pages_an_hour * per_page[0] + runs_an_hour * per_run[0]
    bytes_an_hour = pages_an_hour * per_page[1] + runs_an_hour * per_run[1]

    assert per_page[0] == 2  # a model call and a request in the trace; nothing else grows
    assert rows_an_hour <= 1500
    assert bytes_an_hour <= 500_000  # of row data; with indexes perhaps twice that
