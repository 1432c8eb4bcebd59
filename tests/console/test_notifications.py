"""Be told, not watch: a task that needs a human, a held restart loop and a write left
UNKNOWN too long reach people as signed webhooks and as email, batched, retried, kept.

Every notice goes to a real local HTTP receiver (``http.server`` in a thread) or a real
local SMTP sink (aiosmtpd), through the same outbox the beat-scheduled notifier reads; one
test runs the whole pass in a real Celery worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import ssl
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from email import message_from_bytes
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from aiosmtpd.controller import Controller
from django.contrib.auth.models import User
from django.db import connections, transaction
from django.utils import timezone

from console import lifecycle
from console.drivers import notifications
from console.models import (
    AuditEntry,
    Notice,
    NoticeAttempt,
    NoticeKind,
    NoticeState,
    NotificationChannel,
    NotificationEvent,
    Operation,
    Task,
    TaskState,
)
from console.services import task_start
from console.tasks import notify
from tests import workers
from tests.processes import run_settings
from tests.waiting import wait_for

from .views.support import finish, unknown_operation

PUBLIC = "https://console.example.com"
SECRET = "a-webhook-secret-of-some-length"


# -- a real HTTP receiver and a real SMTP sink -------------------------------------------------


@dataclass
class Received:
    path: str
    headers: Message  # case-insensitive, as HTTP header names are
    body: bytes

    @property
    def payload(self) -> Any:
        return json.loads(self.body)


@dataclass
class Receiver:
    """A webhook receiver on a local port: keeps every request, answers ``answers`` in
    turn (then 200), with ``body`` when set and ``location`` as a redirect's target."""

    url: str = ""
    requests: list[Received] = field(default_factory=list)
    answers: list[int] = field(default_factory=list)
    body: bytes | None = None
    location: str = ""

    @property
    def port(self) -> int:
        return int(self.url.split(":")[2].split("/")[0])


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with receiving() as found:
        yield found


@contextlib.contextmanager
def receiving(tls: ssl.SSLContext | None = None) -> Iterator[Receiver]:
    """A :class:`Receiver` listening on a free local port until the block ends (HTTPS with
    ``tls``)."""
    found = Receiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length)
            found.requests.append(Received(self.path, self.headers, body))
            status = found.answers.pop(0) if found.answers else 200
            answer = found.body
            if answer is None:
                answer = b"ok" if status < 400 else b"the receiver is down today"
            self.send_response(status)
            if found.location:
                self.send_header("Location", found.location)
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    scheme = "http" if tls is None else "https"
    found.url = f"{scheme}://127.0.0.1:{server.server_address[1]}/hooks/loopguard"
    try:
        yield found
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@dataclass
class Sink:
    port: int
    messages: list[Any] = field(default_factory=list)
    recipients: list[list[str]] = field(default_factory=list)

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        self.messages.append(message_from_bytes(envelope.content))
        self.recipients.append(list(envelope.rcpt_tos))
        return "250 Message accepted for delivery"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def smtp_sink(settings: Any) -> Iterator[Sink]:
    """A real SMTP server on a local port, and Django's mail settings pointed at it (the
    test runner's in-memory mailer replaced by the SMTP one the console uses)."""
    sink = Sink(_free_port())
    controller = Controller(
        sink, hostname="127.0.0.1", port=sink.port, loop=asyncio.new_event_loop()
    )
    controller.start()
    settings.MAILERS = {
        "default": {
            "BACKEND": "django.core.mail.backends.smtp.EmailBackend",
            "OPTIONS": {"host": "127.0.0.1", "port": sink.port, "timeout": 5},
        }
    }
    settings.DEFAULT_FROM_EMAIL = "loopguard@example.com"
    try:
        yield sink
    finally:
        controller.stop()


@pytest.fixture(autouse=True)
def notify_settings(settings: Any) -> None:
    settings.LOOPGUARD_PUBLIC_URL = PUBLIC
    settings.LOOPGUARD_NOTIFY_BATCH_SECONDS = 60
    settings.LOOPGUARD_NOTIFY_ATTEMPTS = 4
    settings.LOOPGUARD_NOTIFY_BACKOFF_SECONDS = 30.0
    settings.LOOPGUARD_NOTIFY_TIMEOUT_SECONDS = 5.0


# -- helpers ---------------------------------------------------------------------------------


def webhook(url: str, *kinds: str, name: str = "on-call") -> NotificationChannel:
    return NotificationChannel.objects.create(
        name=name,
        transport="webhook",
        url=url,
        secret=SECRET,
        kinds=list(kinds or [NoticeKind.NEEDS_HUMAN]),
    )


def later(seconds: float = 61) -> Any:
    return timezone.now() + timedelta(seconds=seconds)


def run_notifier(now: Any = None) -> list[str]:
    """One pass of the beat task, its deliveries made here instead of by Celery."""
    return [notifications.deliver(i, now=now) for i in notifications.notify(now=now)]


def needs_human(start: Any, pages: int = 1) -> Task:
    """A task stopped for a person (each ``pages`` its own goal: the same one started again
    and again would be held for a restart loop instead)."""
    task = start("test_reader", {"pages": pages})
    return finish(task, "NEEDS_HUMAN", "unknown_commit", "a write was lost")


# -- one event, one signed notice ----------------------------------------------------------------


def test_a_task_that_needs_a_human_sends_one_signed_webhook_that_the_receiver_verifies(
    start: Any, receiver: Receiver
) -> None:
    webhook(receiver.url)
    task = needs_human(start)

    run_notifier(later())
    run_notifier(later(3600))  # a later pass finds nothing new to say

    assert len(receiver.requests) == 1
    got = receiver.requests[0]
    assert notifications.verify(SECRET, got.body, got.headers["X-LoopGuard-Signature"])
    assert not notifications.verify(
        "another-secret-entirely", got.body, got.headers["X-LoopGuard-Signature"]
    )
    assert got.headers["Content-Type"] == "application/json"
    payload = got.payload
    link = f"{PUBLIC}/tasks/{task.id}/"
    # Slack-compatible: a top-level "text", a sentence with the link, besides the fields.
    assert payload["text"].startswith("LoopGuard: 1 task needs a human: ")
    assert link in payload["text"]
    assert payload["kind"] == "needs_human" and payload["count"] == 1
    assert payload["events"][0] | {"at": None} == {
        "task": task.id,
        "agent": "test_reader",
        "reason": "unknown_commit",
        "at": None,
        "url": link,
    }
    notice = Notice.objects.get()
    assert notice.state == NoticeState.SENT
    assert got.headers["X-LoopGuard-Notice"] == str(notice.id)
    # The answer's status is kept; its body ("ok") is the target's words and is not.
    assert [(t.number, t.ok, t.status_code, t.response) for t in notice.tries.all()] == [
        (1, True, 200, "")
    ]


def test_the_event_is_written_with_the_stop_and_rolled_back_with_it(start: Any) -> None:
    task = running_task(start)
    with pytest.raises(RuntimeError), transaction.atomic():
        locked = Task.objects.select_for_update().get(id=task.id)
        report = lifecycle.report_from_task(locked, "NEEDS_HUMAN", "unknown_commit").to_dict()
        lifecycle.finish_task(locked, "NEEDS_HUMAN", "unknown_commit", report)
        assert NotificationEvent.objects.filter(task_id=task.id).count() == 1
        raise RuntimeError("the transaction that stopped the task fails after all")

    assert NotificationEvent.objects.count() == 0
    assert Task.objects.get(id=task.id).state == TaskState.RUNNING


def running_task(start: Any) -> Task:
    from .views.support import running

    return running(start("test_reader", {"pages": 1}))


def test_a_task_that_ends_otherwise_sends_nothing(start: Any, receiver: Receiver) -> None:
    webhook(receiver.url, *NoticeKind.values)
    finish(start("test_reader", {"pages": 1}), "PARTIAL", "no_progress")
    finish(start("test_reader", {"pages": 1}), "CANCELLED", "operator_stop")

    run_notifier(later())

    assert receiver.requests == []
    assert NotificationEvent.objects.count() == 0


def test_links_are_paths_when_the_public_url_is_unset(
    start: Any, receiver: Receiver, settings: Any
) -> None:
    settings.LOOPGUARD_PUBLIC_URL = ""
    webhook(receiver.url)
    task = needs_human(start)

    run_notifier(later())

    assert receiver.requests[0].payload["events"][0]["url"] == f"/tasks/{task.id}/"


# -- no storms ---------------------------------------------------------------------------------


def test_forty_tasks_stopping_at_once_send_one_batched_notice_per_channel(
    start: Any, receiver: Receiver
) -> None:
    webhook(receiver.url, name="chat")
    webhook(receiver.url + "?pager", name="pager")
    tasks = [needs_human(start, pages) for pages in range(1, 41)]

    assert run_notifier() == []  # inside the window: more may come, nothing is sent yet
    run_notifier(later())
    run_notifier(later(3600))

    assert len(receiver.requests) == 2  # one per channel, not eighty
    for got in receiver.requests:
        payload = got.payload
        assert payload["count"] == 40
        assert payload["text"].startswith("LoopGuard: 40 tasks need a human: ")
        # The first few links in the sentence, and one to all of them.
        for task in tasks[:5]:
            assert f"{PUBLIC}/tasks/{task.id}/" in payload["text"]
        assert f"{PUBLIC}/tasks/{tasks[5].id}/" not in payload["text"]
        assert f"and 35 more: {PUBLIC}/tasks/?state=NEEDS_HUMAN" in payload["text"]
        assert [e["task"] for e in payload["events"]] == [t.id for t in tasks]
    assert NotificationEvent.objects.filter(routed_at=None).count() == 0


@pytest.mark.django_db(transaction=True)
def test_two_notifiers_at_once_route_each_event_once(start: Any) -> None:
    webhook("http://127.0.0.1:9/hook")
    needs_human(start)
    locked, release = threading.Event(), threading.Event()

    def first_notifier() -> None:
        # Holds the event's row (FOR UPDATE, as route_events does) in a connection of its
        # own while the second notifier runs.
        try:
            with transaction.atomic():
                list(NotificationEvent.objects.select_for_update())
                locked.set()
                release.wait(timeout=30)
        finally:
            connections.close_all()

    holder = threading.Thread(target=first_notifier)
    holder.start()
    try:
        assert locked.wait(timeout=30)
        # The second skips the held row instead of waiting for it or routing it twice.
        assert notifications.route_events(now=later()) == 0
    finally:
        release.set()
        holder.join(timeout=30)

    assert NotificationEvent.objects.get().routed_at is None
    assert notifications.route_events(now=later()) == 1
    assert notifications.route_events(now=later()) == 0
    assert Notice.objects.count() == 1


# -- kinds and channels --------------------------------------------------------------------------


def test_each_channel_gets_only_the_kinds_it_chose_and_a_held_restart_loop_is_its_own(
    start: Any, receiver: Receiver
) -> None:
    webhook(receiver.url + "?humans", NoticeKind.NEEDS_HUMAN, name="humans")
    webhook(receiver.url + "?loops", NoticeKind.RESTART_LOOP, name="loops")
    queued = start("test_reader", {"pages": 9})
    with transaction.atomic():
        lifecycle.hold(Task.objects.select_for_update().get(id=queued.id), "started 4 times")

    run_notifier(later())

    assert [got.path for got in receiver.requests] == ["/hooks/loopguard?loops"]
    payload = receiver.requests[0].payload
    assert payload["kind"] == "restart_loop"
    assert payload["text"].startswith("LoopGuard: 1 task is held for a restart loop: ")
    assert f"{PUBLIC}/tasks/{queued.id}/" in payload["text"]


def test_a_removed_channel_is_told_nothing(start: Any, receiver: Receiver) -> None:
    channel = webhook(receiver.url)
    NotificationChannel.objects.filter(id=channel.id).update(active=False)
    needs_human(start)

    run_notifier(later())

    assert receiver.requests == []


def test_a_channel_removed_after_its_notice_was_made_is_told_nothing_more(
    start: Any, receiver: Receiver
) -> None:
    channel = webhook(receiver.url)
    needs_human(start)
    made = notifications.notify(now=later())  # routed: a notice waits for its delivery
    assert len(made) == 1
    NotificationChannel.objects.filter(id=channel.id).update(active=False)

    outcome = notifications.deliver(made[0], now=later())

    assert outcome == "its channel was removed"
    assert notifications.due_notices(now=later(3600)) == []
    assert receiver.requests == []


def test_a_write_unknown_for_too_long_is_told_once_with_a_link_to_the_reconciliation_queue(
    start: Any, receiver: Receiver, settings: Any
) -> None:
    settings.LOOPGUARD_NOTIFY_UNKNOWN_AFTER_MINUTES = 30
    webhook(receiver.url, NoticeKind.UNKNOWN_TOO_LONG)
    task = start("test_notices", {"count": 1})
    op = unknown_operation(task, "orders/7/notice")

    run_notifier(timezone.now() + timedelta(minutes=29))  # not long enough yet
    assert receiver.requests == []
    assert notifications.record_overdue_unknowns(now=timezone.now() + timedelta(minutes=31)) == 1
    assert notifications.record_overdue_unknowns(now=timezone.now() + timedelta(minutes=40)) == 0
    run_notifier(timezone.now() + timedelta(minutes=40))
    run_notifier(timezone.now() + timedelta(minutes=90))

    assert len(receiver.requests) == 1
    payload = receiver.requests[0].payload
    assert payload["text"].startswith("LoopGuard: 1 write has stayed UNKNOWN too long: ")
    assert f"orders/7/notice (task {task.id}) {PUBLIC}/operations/" in payload["text"]
    assert payload["events"][0]["operation"] == op.key
    assert payload["events"][0]["task_url"] == f"{PUBLIC}/tasks/{task.id}/"


def test_a_write_settled_in_time_is_not_told(start: Any, receiver: Receiver) -> None:
    webhook(receiver.url, NoticeKind.UNKNOWN_TOO_LONG)
    task = start("test_notices", {"count": 1})
    op = unknown_operation(task, "orders/8/notice")
    Operation.objects.filter(id=op.id).update(state="COMMITTED")

    run_notifier(timezone.now() + timedelta(hours=2))

    assert receiver.requests == []


# -- retries, backoff, claims -------------------------------------------------------------------


def test_a_failing_receiver_is_retried_with_backoff_and_every_try_is_kept(
    start: Any, receiver: Receiver
) -> None:
    receiver.answers = [500, 503]
    webhook(receiver.url)
    needs_human(start)
    t0 = later()
    notifications.notify(now=t0)
    notice = Notice.objects.get()

    assert notifications.deliver(notice.id, now=t0) == "try 1: PENDING"
    notice.refresh_from_db()
    first_wait = notice.next_attempt_at - t0
    # Not again before its wait is over, whoever asks.
    assert notifications.due_notices(now=t0 + timedelta(seconds=20)) == []
    assert notifications.deliver(notice.id, now=t0 + timedelta(seconds=20)) == "not due: PENDING"

    assert notifications.deliver(notice.id, now=t0 + timedelta(seconds=31)) == "try 2: PENDING"
    notice.refresh_from_db()
    second_wait = notice.next_attempt_at - (t0 + timedelta(seconds=31))
    assert notifications.due_notices(now=notice.next_attempt_at) == [notice.id]
    assert notifications.deliver(notice.id, now=notice.next_attempt_at) == "try 3: SENT"

    assert timedelta(seconds=29) < first_wait <= timedelta(seconds=31)  # 30 s, then doubled
    assert timedelta(seconds=59) < second_wait <= timedelta(seconds=61)
    assert len(receiver.requests) == 3
    assert len({got.body for got in receiver.requests}) == 1  # the same signed notice
    assert {got.headers["X-LoopGuard-Notice"] for got in receiver.requests} == {str(notice.id)}
    tries = list(NoticeAttempt.objects.filter(notice=notice))
    assert [(t.number, t.ok, t.status_code) for t in tries] == [
        (1, False, 500),
        (2, False, 503),
        (3, True, 200),
    ]
    assert tries[0].response == ""  # the receiver's words are never kept
    assert tries[0].error == "answered 500"


def test_retries_are_bounded_and_an_unreachable_receiver_says_why(
    start: Any, settings: Any
) -> None:
    settings.LOOPGUARD_NOTIFY_ATTEMPTS = 2
    webhook(f"http://127.0.0.1:{_free_port()}/nobody-listens")
    needs_human(start)
    now = later()
    notifications.notify(now=now)
    notice = Notice.objects.get()

    notifications.deliver(notice.id, now=now)
    notifications.deliver(notice.id, now=now + timedelta(minutes=5))
    assert notifications.deliver(notice.id, now=now + timedelta(hours=5)) == "not due: FAILED"

    notice.refresh_from_db()
    assert notice.state == NoticeState.FAILED
    assert notifications.due_notices(now=now + timedelta(days=1)) == []
    tries = list(notice.tries.all())
    assert len(tries) == 2
    assert all(not t.ok and t.status_code is None for t in tries)
    assert "refused" in tries[0].error.lower()


def test_a_notice_claimed_by_a_worker_that_died_is_sent_again_after_its_claim_runs_out(
    start: Any, receiver: Receiver
) -> None:
    webhook(receiver.url)
    needs_human(start)
    now = later()
    notifications.notify(now=now)
    notice = Notice.objects.get()
    # A worker claimed it and died before it could say how the try went.
    Notice.objects.filter(id=notice.id).update(
        state=NoticeState.SENDING, attempts=1, claimed_until=now + timedelta(seconds=35)
    )

    assert notifications.deliver(notice.id, now=now) == "not due: SENDING"
    assert notifications.due_notices(now=now + timedelta(seconds=36)) == [notice.id]
    assert notifications.deliver(notice.id, now=now + timedelta(seconds=36)) == "try 2: SENT"
    assert len(receiver.requests) == 1


def test_a_second_delivery_of_one_notice_at_once_does_not_send_it_twice(
    start: Any, receiver: Receiver
) -> None:
    webhook(receiver.url)
    needs_human(start)
    now = later()
    (notice_id,) = notifications.notify(now=now)
    # The first delivery has claimed the row (the compare-and-set moved it to SENDING).
    Notice.objects.filter(id=notice_id).update(
        state=NoticeState.SENDING, attempts=1, claimed_until=now + timedelta(seconds=35)
    )

    assert notifications.deliver(notice_id, now=now) == "not due: SENDING"
    assert receiver.requests == []


# -- email ---------------------------------------------------------------------------------------


def test_email_reaches_the_smtp_sink_with_the_link(start: Any, smtp_sink: Sink) -> None:
    NotificationChannel.objects.create(
        name="reconcilers",
        transport="email",
        address="ops@example.com, lead@example.com",
        kinds=[NoticeKind.NEEDS_HUMAN],
    )
    task = needs_human(start)

    run_notifier(later())

    assert smtp_sink.recipients == [["ops@example.com", "lead@example.com"]]
    message = smtp_sink.messages[0]
    assert message["Subject"] == "LoopGuard: 1 task needs a human"
    assert message["From"] == "loopguard@example.com"
    text = message.get_payload(decode=True).decode()
    assert f"{PUBLIC}/tasks/{task.id}/" in text
    notice = Notice.objects.get()
    assert notice.state == NoticeState.SENT
    assert notice.tries.get().response.startswith("accepted by 127.0.0.1")


def test_an_email_channel_without_mail_settings_fails_its_try_and_says_so(
    start: Any, settings: Any
) -> None:
    settings.MAILERS = {}
    NotificationChannel.objects.create(
        name="ops", transport="email", address="ops@example.com", kinds=["needs_human"]
    )
    needs_human(start)

    run_notifier(later())

    assert Notice.objects.get().tries.get().error == (
        "email is not configured: EMAIL_HOST is not set"
    )


# -- a real worker ---------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_real_worker_routes_and_delivers_a_notice(receiver: Receiver, tmp_path: Path) -> None:
    webhook(receiver.url)
    task = finish(
        task_start(agent="test_reader", input={"pages": 1}, enqueue=lambda task_id: None),
        "NEEDS_HUMAN",
        "precondition",
    )
    queue = f"notify-{uuid.uuid4().hex[:8]}"
    worker = workers.start_worker(
        queue,
        tmp_path,
        beat=False,
        extra_env={"LOOPGUARD_PUBLIC_URL": PUBLIC, "LOOPGUARD_NOTIFY_BATCH_SECONDS": "0"},
    )
    try:
        notify.apply_async(queue=queue)
        wait_for(lambda: receiver.requests, timeout=30, what="the worker's webhook")
        wait_for(
            lambda: Notice.objects.filter(state=NoticeState.SENT).exists(),
            timeout=30,
            what="the notice to be recorded as sent",
        )
    finally:
        workers.stop_worker(worker)

    got = receiver.requests[0]
    assert notifications.verify(SECRET, got.body, got.headers["X-LoopGuard-Signature"])
    assert f"{PUBLIC}/tasks/{task.id}/" in got.payload["text"]


# -- the admin's services ----------------------------------------------------------------------


def test_a_channel_added_without_a_secret_gets_one_that_the_audit_log_never_holds(db: None) -> None:
    admin = User.objects.create_user("admin-person")
    channel, made = notifications.channel_add(
        actor=admin,
        reason="the on-call channel",
        name="chat",
        transport="webhook",
        kinds=["needs_human"],
        url="https://hooks.example.com/x",
    )

    assert len(made) >= 40 and channel.secret == made
    entry = AuditEntry.objects.get()
    assert made not in json.dumps([entry.before, entry.after])
    assert entry.after["secret"] == "…" + made[-4:]


# -- settings ---------------------------------------------------------------------------------

PRINT_MAIL = (
    "from django.conf import settings\n"
    "print(settings.MAILERS, settings.DEFAULT_FROM_EMAIL, settings.LOOPGUARD_PUBLIC_URL)\n"
)


def test_the_email_variables_make_the_default_mailer() -> None:
    started = run_settings(
        PRINT_MAIL,
        EMAIL_HOST="smtp.example.com",
        EMAIL_PORT="587",
        EMAIL_USE_TLS="1",
        EMAIL_FROM="loopguard@example.com",
        LOOPGUARD_PUBLIC_URL="https://console.example.com/",
    )

    assert started.returncode == 0, started.stderr
    assert "'host': 'smtp.example.com', 'port': 587" in started.stdout
    assert "'use_tls': True" in started.stdout
    assert started.stdout.strip().endswith("loopguard@example.com https://console.example.com")


def test_without_email_host_there_is_no_mailer() -> None:
    started = run_settings(PRINT_MAIL)

    assert started.returncode == 0, started.stderr
    assert started.stdout.startswith("{} ")


def test_a_public_url_that_is_not_an_address_stops_start_up() -> None:
    started = run_settings(PRINT_MAIL, LOOPGUARD_PUBLIC_URL="console.example.com")

    assert started.returncode != 0
    assert "LOOPGUARD_PUBLIC_URL='console.example.com' must be an http(s) address" in (
        started.stderr
    )


def test_a_prefixed_mail_variable_is_refused_naming_the_one_read() -> None:
    started = run_settings(PRINT_MAIL, DJANGO_EMAIL_HOST="smtp.example.com")

    assert started.returncode != 0
    assert "DJANGO_EMAIL_HOST is not a LoopGuard setting" in started.stderr
    assert "did you mean EMAIL_HOST?" in started.stderr


def test_a_reason_given_for_a_channel_is_checked_and_masked_like_every_typed_reason(
    db: None, receiver: Receiver
) -> None:
    admin = User.objects.create_user("ada")
    channel = webhook(receiver.url)

    with pytest.raises(notifications.NotificationError, match="NUL"):
        notifications.channel_remove(actor=admin, reason="no\x00pe", channel_id=channel.id)
    with pytest.raises(notifications.NotificationError, match="reason is required"):
        notifications.channel_remove(actor=admin, reason="   ", channel_id=channel.id)
    assert NotificationChannel.objects.get(id=channel.id).active  # refused: nothing changed

    notifications.channel_remove(
        actor=admin, reason="leaked with token=abcdef123456", channel_id=channel.id
    )

    entry = AuditEntry.objects.get(action="notification_channel_remove")
    assert "abcdef123456" not in entry.reason
