"""A client that never comes back (issue 24 §2): an attached task whose client's lease
lapsed waits for it, shown as waiting, for ``LOOPGUARD_ATTACHED_CLIENT_LOST_SECONDS``; then
the sweep stops it for a person (``NEEDS_HUMAN``/``client_lost``), with a stop report, its
write in flight made ``UNKNOWN`` and a notice. Within that time its owner goes on.

The clients speak the step protocol by hand through the API (``Client`` of the attached
protocol's tests); a lapse is made by moving the lease's expiry into the past, as a client
that stopped heartbeating leaves it, and the sweep is called as beat calls it.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta

import pytest
from django.contrib.auth.models import User
from django.test import Client as Browser
from django.test import override_settings
from django.utils import timezone

from console import services
from console.drivers import notifications, runner
from console.models import (
    EventKind,
    NoticeKind,
    NotificationChannel,
    NotificationEvent,
    Operation,
    OperationEvent,
    OperationState,
    Phase,
    StopReport,
    Task,
    TaskState,
    TraceEvent,
)
from console.records.roles import Role, assign
from console.templatetags.console import stamp
from tests.console.api.helpers import Caller
from tests.console.api.test_attached import Client
from tests.processes import run_settings

pytestmark = pytest.mark.django_db

HOUR = timedelta(seconds=3600)  # the setting's default
PRINT_SETTING = (
    "from django.conf import settings\nprint(settings.LOOPGUARD_ATTACHED_CLIENT_LOST_SECONDS)\n"
)


@pytest.fixture
def started(caller: Callable[..., Caller]) -> Client:
    client = Client(caller(Role.AGENT, username="desk-bot-owner"), lease="host-a:1:first")
    assert client.start().status_code == 201
    return client


@pytest.fixture
def viewer(db: None) -> Browser:
    person = User.objects.create_user("vera")
    assign(person, [Role.VIEWER])
    browser = Browser()
    browser.force_login(person)
    return browser


def _task(client: Client) -> Task:
    return Task.objects.get(id=client.task)


def _lapse(client: Client, ago: timedelta) -> datetime:
    """The client stopped heartbeating: its lease ran out ``ago``. Returns the lapse."""
    lapsed = timezone.now() - ago
    Task.objects.filter(id=client.task).update(lease_expires_at=lapsed)
    return lapsed


def _sweep() -> dict[str, int]:
    enqueued: list[int] = []
    counts = runner.sweep(enqueued.append)
    assert enqueued == []  # an attached task is never handed to a worker
    return counts


def _page(browser: Browser, url: str) -> str:
    response = browser.get(url)
    assert response.status_code == 200
    return response.content.decode()


def test_a_client_that_stops_heartbeating_leaves_its_task_queued_and_shown_waiting_for_it(
    started: Client, viewer: Browser
) -> None:
    started.step("model")
    lapsed = _lapse(started, timedelta(seconds=5))

    assert _sweep()["client_lost"] == 0
    task = _task(started)
    assert (task.state, task.reason) == (TaskState.QUEUED, "")
    assert task.waiting_for_client_since == lapsed
    assert task.client_lost_at == lapsed + HOUR
    page = _page(viewer, f"/tasks/{task.id}/")
    assert "waiting for its client since <time datetime=" in page
    assert f">{stamp(lapsed)}</time>" in page
    assert f"if it is not back by {stamp(lapsed + HOUR)}, the task stops for a person" in page
    assert "waiting for its client" in _page(viewer, "/tasks/")


def test_after_the_allowed_time_the_sweep_stops_it_for_a_person_with_its_write_unknown(
    started: Client, viewer: Browser
) -> None:
    on_call = NotificationChannel.objects.create(
        name="on-call",
        transport="webhook",
        url="https://hooks.example.com/loopguard",
        secret="s" * 32,
        kinds=[NoticeKind.NEEDS_HUMAN],
    )
    assert started.call("refund", {"cents": 9}, key="order/9/refund")["action"] == "execute"
    # The client dies inside the write, and no sweep runs until long after its lease lapsed.
    _lapse(started, HOUR + timedelta(seconds=1))

    assert _sweep()["client_lost"] == 1

    task = _task(started)
    assert (task.state, task.reason) == (TaskState.NEEDS_HUMAN, "client_lost")
    assert "did not come back within 3600 s" in task.detail
    assert "in flight when it stopped: order/9/refund" in task.detail
    op = Operation.objects.get(key="order/9/refund")
    assert op.state == OperationState.UNKNOWN
    lost = OperationEvent.objects.filter(operation=op).order_by("id").last()
    assert lost is not None and lost.evidence == "recovery: the client did not come back"
    report = StopReport.objects.get(task=task)
    assert (report.state, report.reason) == (TaskState.NEEDS_HUMAN, "client_lost")
    assert report.report["reason"] == "client_lost"
    assert report.report["operations"][0]["state"] == OperationState.UNKNOWN
    assert "approve resumption once its client" in report.report["resume_condition"]
    stop = TraceEvent.objects.get(task=task, kind=EventKind.STOP)
    assert stop.reason == "client_lost"
    assert Phase.objects.get(task=task, number=1).reason == "client_lost"
    # A person is told, as of every stop that needs one.
    event = NotificationEvent.objects.get(task=task)
    assert (event.kind, event.reason) == (NoticeKind.NEEDS_HUMAN, "client_lost")
    assert notifications.route_events(now=timezone.now() + timedelta(minutes=2)) == 1
    notice = on_call.notices.get()
    assert f"task {task.id} (desk-bot, client_lost)" in notice.payload["text"]
    page = _page(viewer, f"/tasks/{task.id}/")
    assert "client_lost" in page and "waiting for its client" not in page
    # The client coming back after all hears the stop, and runs nothing.
    late = started.step("result", ticket=0, result={"kind": "SUCCESS"})
    assert (late["state"], late["stop"]["reason"]) == ("NEEDS_HUMAN", "client_lost")
    assert Operation.objects.get(key="order/9/refund").state == OperationState.UNKNOWN


@override_settings(LOOPGUARD_ATTACHED_CLIENT_LOST_SECONDS=60)
def test_a_queued_task_waits_the_settings_time_from_its_lapse_then_stops(started: Client) -> None:
    started.step("model")
    _lapse(started, timedelta(seconds=50))
    _sweep()
    assert _task(started).state == TaskState.QUEUED

    assert _sweep()["client_lost"] == 0  # 50 s of 60: it still waits
    _lapse(started, timedelta(seconds=61))  # as it stands after another 11 s
    assert _sweep()["client_lost"] == 1

    task = _task(started)
    assert (task.state, task.reason) == (TaskState.NEEDS_HUMAN, "client_lost")
    assert "within 60 s" in task.detail
    assert StopReport.objects.filter(task=task, reason="client_lost").count() == 1
    assert _sweep()["client_lost"] == 0  # stopped once


def test_before_the_time_its_owner_attaches_again_and_goes_on(started: Client) -> None:
    started.step("model")
    _lapse(started, timedelta(seconds=5))
    _sweep()
    assert _task(started).state == TaskState.QUEUED

    # A new process of the same person, with the task id: a heartbeat takes a new lease.
    again = Client(started.caller, lease="host-a:2:after-a-crash")
    again.task = started.task
    assert again.step("heartbeat")["state"] == TaskState.RUNNING
    assert again.step("model")["allowed"] is True
    task = _task(again)
    assert task.waiting_for_client_since is None and task.client_lost_at is None
    # Its first lapse is forgotten: the sweep, however much later, finds a live lease.
    with override_settings(LOOPGUARD_ATTACHED_CLIENT_LOST_SECONDS=1):
        assert _sweep() == {"client_lost": 0, "recovered": 0, "resumed": 0, "requeued": 0}
    assert _task(again).state == TaskState.RUNNING


def test_a_stop_asked_for_before_the_client_was_lost_ends_the_task_as_asked(
    started: Client, caller: Callable[..., Caller]
) -> None:
    started.step("model")
    services.task_stop(task_id=started.task, actor=caller(Role.OPERATOR).user, reason="enough")
    _lapse(started, HOUR * 2)

    counts = _sweep()

    assert (counts["client_lost"], counts["recovered"]) == (0, 1)
    task = _task(started)
    assert (task.state, task.reason) == (TaskState.CANCELLED, "operator_stop")


def test_the_filter_lists_exactly_the_tasks_waiting_for_their_client(
    caller: Callable[..., Caller], viewer: Browser
) -> None:
    owner = caller(Role.AGENT, username="desk-bot-owner")

    def attach(n: int) -> Client:
        client = Client(owner, lease=f"host:{n}")
        assert client.start(input={"n": n}).status_code == 201
        return client

    queued, running, alive, stopped = attach(1), attach(2), attach(3), attach(4)
    _lapse(queued, timedelta(seconds=5))
    _sweep()  # it goes back to the queue, to wait there
    _lapse(running, timedelta(seconds=1))  # lapsed since: still running, not yet swept
    stopped.step("model")
    stopped.step("finish", answer="done")
    _lapse(stopped, timedelta(seconds=5))  # a stopped task waits for nobody
    hosted = services.task_start(agent="test_reader", input={}, enqueue=lambda task_id: None)
    Task.objects.filter(id=hosted.id).update(
        state=TaskState.RUNNING, lease_owner="worker:1", lease_expires_at=timezone.now()
    )  # its worker is lost: the sweep's business, not its client's
    waiting = {queued.task, running.task}

    listed = owner.get("/api/tasks", waiting="client").json()["tasks"]
    assert {row["id"] for row in listed} == waiting
    page = _page(viewer, "/tasks/?waiting=client")
    shown = {t.id for t in Task.objects.all() if f'href="/tasks/{t.id}/"' in page}
    assert shown == waiting
    assert '<option value="client" selected>for its client</option>' in page
    assert {alive.task, stopped.task, hosted.id} & shown == set()


def test_a_filter_for_waiting_on_something_else_is_refused_not_dropped(
    caller: Callable[..., Caller], viewer: Browser
) -> None:
    refused = caller(Role.VIEWER).get("/api/tasks", waiting="forever")
    assert refused.status_code == 400 and refused.json()["code"] == "invalid_query"
    assert "waiting" in refused.json()["fields"]
    assert "unknown waiting filter &#x27;forever&#x27;" in _page(viewer, "/tasks/?waiting=forever")


@pytest.mark.parametrize("value", ["an hour", "0", "-60"])
def test_a_bad_client_lost_setting_stops_start_up(value: str) -> None:
    started = run_settings(PRINT_SETTING, LOOPGUARD_ATTACHED_CLIENT_LOST_SECONDS=value)

    assert started.returncode != 0
    assert "ImproperlyConfigured" in started.stderr
    assert "LOOPGUARD_ATTACHED_CLIENT_LOST_SECONDS" in started.stderr


def test_the_client_lost_setting_reads_seconds_and_defaults_to_an_hour() -> None:
    default = run_settings(PRINT_SETTING)
    set_ = run_settings(PRINT_SETTING, LOOPGUARD_ATTACHED_CLIENT_LOST_SECONDS="900")

    assert default.stdout.split() == ["3600.0"], default.stderr
    assert set_.stdout.split() == ["900.0"], set_.stderr
