"""The notifications page and unsafe webhooks: a URL notices may not go to is a form error
on the URL field, with nothing stored; a try shows the answer's status and timing, never
its body, so the page cannot be used to read what a URL reaches."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from console.drivers import notifications
from console.models import AuditEntry, Notice, NoticeAttempt, NotificationChannel
from tests.console.test_notification_targets import REFUSED_FORMS, REFUSED_URLS
from tests.console.test_notifications import SECRET, Receiver, receiving

from .support import SignIn, body

pytestmark = pytest.mark.django_db

# What an internal service might answer: it must never reach the page.
INTERNAL = b"redis_version:7.2.4\r\nrequirepass internal-secret-4711\r\n"


@pytest.fixture(autouse=True)
def deployment_defaults(settings: Any) -> None:
    settings.LOOPGUARD_NOTIFY_ALLOW_HTTP = False
    settings.LOOPGUARD_NOTIFY_ALLOWED_NETWORKS = []


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with receiving() as found:
        yield found


def form(url: str) -> dict[str, Any]:
    return {
        "name": "chat",
        "transport": "webhook",
        "url": url,
        "kinds": ["needs_human"],
        "reason": "the on-call chat",
    }


@pytest.mark.parametrize(("url", "why"), REFUSED_URLS + REFUSED_FORMS)
def test_a_webhook_to_where_notices_may_not_go_is_a_form_error_and_nothing_is_stored(
    signed_in: SignIn, url: str, why: str
) -> None:
    answer = signed_in("admin").post("/notifications/channels", form(url))

    assert answer.status_code == 400
    shown = body(answer)
    assert why in shown
    # On the URL field itself, where the admin looks.
    assert why in answer.context["form"].errors["url"][0]
    assert NotificationChannel.objects.count() == 0 and AuditEntry.objects.count() == 0


def test_an_allowed_internal_receiver_is_saved_through_the_page(
    signed_in: SignIn, settings: Any
) -> None:
    settings.LOOPGUARD_NOTIFY_ALLOW_HTTP = True
    settings.LOOPGUARD_NOTIFY_ALLOWED_NETWORKS = ["10.20.0.0/16"]

    answer = signed_in("admin").post("/notifications/channels", form("http://10.20.3.4/hook"))

    assert answer.status_code == 200
    assert NotificationChannel.objects.get().url == "http://10.20.3.4/hook"


def _after_a_try(signed_in: SignIn, receiver: Receiver) -> str:
    """The notifications page after an admin tried a hook to ``receiver`` and the try was
    delivered (or refused)."""
    target = NotificationChannel.objects.create(
        name="on-call", transport="webhook", url=receiver.url, secret=SECRET, kinds=["needs_human"]
    )
    admin = signed_in("admin")
    admin.post(f"/notifications/{target.id}/test", {"reason": "checking the hook"})
    notifications.deliver(Notice.objects.get().id)
    return body(admin.get("/notifications/"))


@pytest.mark.parametrize("status", [200, 502])
def test_a_try_shows_the_status_and_timing_and_never_the_answers_body(
    signed_in: SignIn, receiver: Receiver, settings: Any, status: int
) -> None:
    settings.LOOPGUARD_NOTIFY_ALLOW_HTTP = True
    settings.LOOPGUARD_NOTIFY_ALLOWED_NETWORKS = ["127.0.0.1/32"]
    receiver.answers = [status]
    receiver.body = INTERNAL
    shown = _after_a_try(signed_in, receiver)
    attempt = NoticeAttempt.objects.get()
    assert f"HTTP {status}" in shown
    assert f"· {attempt.duration_ms} ms" in shown
    assert "internal-secret-4711" not in shown and "redis_version" not in shown


def test_an_answer_kept_before_this_rule_is_not_shown(
    signed_in: SignIn, receiver: Receiver
) -> None:
    target = NotificationChannel.objects.create(
        name="on-call", transport="webhook", url=receiver.url, secret=SECRET, kinds=["needs_human"]
    )
    notice = Notice.objects.create(channel=target, kind="test", payload={"text": "a test"})
    NoticeAttempt.objects.create(
        notice=notice, number=1, ok=False, status_code=200, response=INTERNAL.decode()
    )

    shown = body(signed_in("admin").get("/notifications/"))

    assert "HTTP 200" in shown and "internal-secret-4711" not in shown


def test_a_refused_delivery_is_shown_as_a_failed_try_that_says_why(
    signed_in: SignIn, receiver: Receiver
) -> None:
    # Saved before the check existed: http to the console's own machine.
    shown = _after_a_try(signed_in, receiver)
    assert "failed · refused: http:// is refused: use https://" in shown
    assert "next try" in shown
    assert receiver.requests == []
