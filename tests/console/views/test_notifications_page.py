"""The notifications page: admins only, channels added and removed with a reason, a secret
shown once and never again, every try of every notice visible, and a "send test" button
that is CSRF-protected, audited, and delivers to a real receiver."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth.models import User

from console.drivers import notifications
from console.models import AuditEntry, Notice, NoticeAttempt, NoticeState, NotificationChannel
from console.tasks import deliver_notice
from tests.console.test_notifications import SECRET, Receiver, receiving

from .support import PERSONAS, SignIn, body, csrf_token

pytestmark = pytest.mark.django_db

NOT_ADMINS = [name for name in PERSONAS if name != "admin"]


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    """A real webhook receiver on a local port (tests/console/test_notifications.py)."""
    with receiving() as found:
        yield found


@pytest.fixture
def queued(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Notice ids the page handed to Celery, kept here instead of going to Redis."""
    ids: list[int] = []
    monkeypatch.setattr(deliver_notice, "delay", ids.append)
    yield ids


def channel(url: str, **fields: Any) -> NotificationChannel:
    values = {
        "name": "on-call",
        "transport": "webhook",
        "url": url,
        "secret": SECRET,
        "kinds": ["needs_human"],
        **fields,
    }
    return NotificationChannel.objects.create(**values)


def test_only_admins_see_the_page_and_its_link(signed_in: SignIn) -> None:
    admin = signed_in("admin")
    assert admin.get("/notifications/").status_code == 200
    assert 'href="/notifications/"' in body(admin.get("/"))
    for name in NOT_ADMINS:
        person = signed_in(name)
        assert person.get("/notifications/").status_code == 403, name
        assert 'href="/notifications/"' not in body(person.get("/")), name


def test_the_page_warns_when_links_would_be_paths_only(signed_in: SignIn, settings: Any) -> None:
    settings.LOOPGUARD_PUBLIC_URL = ""
    assert "LOOPGUARD_PUBLIC_URL is not set" in body(signed_in("admin").get("/notifications/"))
    settings.LOOPGUARD_PUBLIC_URL = "https://console.example.com"
    assert "LOOPGUARD_PUBLIC_URL is not set" not in body(signed_in("admin").get("/notifications/"))


def test_an_admin_adds_a_webhook_and_sees_its_made_secret_once(signed_in: SignIn) -> None:
    admin = signed_in("admin")
    form = {
        "name": "chat",
        "transport": "webhook",
        "url": "https://hooks.example.com/services/T0/B0/xyz",
        "kinds": ["needs_human", "restart_loop"],
        "reason": "the on-call chat",
    }

    answer = admin.post("/notifications/channels", form)

    made = NotificationChannel.objects.get()
    assert answer.status_code == 200
    assert made.secret in body(answer)  # shown once, on the answer to the form
    assert made.kinds == ["needs_human", "restart_loop"]
    again = body(admin.get("/notifications/"))
    assert made.secret not in again
    assert made.secret_hint in again and "https://hooks.example.com/…/xyz" in again
    # A chat's incoming-webhook path is a credential too: neither shown nor audited whole.
    assert "T0/B0" not in again
    entry = AuditEntry.objects.get()
    assert entry.action == notifications.AUDIT_CHANNEL_ADD and entry.reason == "the on-call chat"
    assert made.secret not in str(entry.after) and "T0/B0" not in str(entry.after)


def test_a_typed_secret_is_never_shown_back(signed_in: SignIn) -> None:
    admin = signed_in("admin")
    typed = "a-secret-typed-by-the-admin-123"
    form = {
        "name": "chat",
        "transport": "webhook",
        "url": "https://hooks.example.com/x",
        "secret": typed,
        "kinds": ["needs_human"],
        "reason": "chat",
    }

    answer = admin.post("/notifications/channels", form, follow=True)

    assert NotificationChannel.objects.get().secret == typed
    assert typed not in body(answer)
    assert "…-123" in body(answer)


def test_an_admin_adds_an_email_channel(signed_in: SignIn) -> None:
    form = {
        "name": "reconcilers",
        "transport": "email",
        "address": "ops@example.com, lead@example.com",
        "kinds": ["unknown_too_long"],
        "reason": "reconcilers want to know",
    }

    signed_in("admin").post("/notifications/channels", form)

    made = NotificationChannel.objects.get()
    assert (made.transport, made.address, made.secret) == (
        "email",
        "ops@example.com, lead@example.com",
        "",
    )


@pytest.mark.parametrize(
    ("change", "error"),
    [
        ({"reason": ""}, "This field is required."),
        ({"url": ""}, "A webhook needs its URL."),
        ({"kinds": ["sometimes"]}, "Select a valid choice."),
        ({"transport": "email"}, "Give at least one address."),
        ({"transport": "email", "address": "not an address"}, "Enter a valid email address."),
        ({"secret": "short"}, "at least 16 characters"),
    ],
)
def test_a_bad_channel_is_refused_with_a_message_and_nothing_is_stored(
    signed_in: SignIn, change: dict[str, Any], error: str
) -> None:
    form = {
        "name": "chat",
        "transport": "webhook",
        "url": "https://hooks.example.com/x",
        "kinds": ["needs_human"],
        "reason": "chat",
        **change,
    }

    answer = signed_in("admin").post("/notifications/channels", form)

    assert answer.status_code == 400
    assert error in body(answer)
    assert NotificationChannel.objects.count() == 0 and AuditEntry.objects.count() == 0


def test_the_send_test_button_delivers_a_signed_test_notice_and_shows_the_try(
    signed_in: SignIn, receiver: Receiver, queued: list[int], people: dict[str, User]
) -> None:
    target = channel(receiver.url)
    browser = signed_in("admin", csrf=True)
    page = browser.get("/notifications/")
    token = csrf_token(body(page))

    answer = browser.post(
        f"/notifications/{target.id}/test",
        {"reason": "checking the hook", "csrfmiddlewaretoken": token},
    )

    assert answer.status_code == 302
    notice = Notice.objects.get()
    assert queued == [notice.id]
    notifications.deliver(notice.id)  # what the Celery task does with it
    got = receiver.requests[0]
    assert notifications.verify(SECRET, got.body, got.headers["X-LoopGuard-Signature"])
    assert got.payload["kind"] == "test"
    assert got.payload["text"].startswith("LoopGuard: a test notice to on-call, sent by admin")
    entry = AuditEntry.objects.get()
    assert (entry.actor, entry.action, entry.reason) == (
        people["admin"],
        notifications.AUDIT_TEST,
        "checking the hook",
    )
    shown = body(browser.get("/notifications/"))
    assert "delivered · HTTP 200" in shown
    notice.refresh_from_db()
    assert notice.state == NoticeState.SENT


def test_a_failed_try_is_visible_with_its_status_but_never_the_receivers_answer(
    signed_in: SignIn, receiver: Receiver, queued: list[int]
) -> None:
    receiver.answers = [502]
    target = channel(receiver.url)
    signed_in("admin").post(f"/notifications/{target.id}/test", {"reason": "checking"})

    notifications.deliver(Notice.objects.get().id)

    shown = body(signed_in("admin").get("/notifications/"))
    assert "failed · HTTP 502 · answered 502" in shown
    assert "the receiver is down today" not in shown  # a webhook's body is never shown
    assert "next try" in shown


def test_each_channel_is_shown_in_its_transports_words_and_only_an_emails_answer_is_shown(
    signed_in: SignIn,
) -> None:
    hook = channel("https://hooks.example.com/services/T0/B0/xyz")
    mail = NotificationChannel.objects.create(
        name="reconcilers", transport="email", address="ops@example.com", kinds=["needs_human"]
    )
    # Tries as an older console may have kept them: a webhook's with the receiver's answer.
    for target, said in ((hook, "what the receiver answered"), (mail, "accepted by smtp for 1")):
        notice = Notice.objects.create(channel=target, kind="test", payload={"text": "a test"})
        NoticeAttempt.objects.create(notice=notice, number=1, ok=True, response=said)

    shown = body(signed_in("admin").get("/notifications/"))

    assert "webhook: https://hooks.example.com/…/xyz" in shown and "T0/B0" not in shown
    assert "email: ops@example.com" in shown
    assert "accepted by smtp for 1" in shown  # the mail server's acceptance: our own words
    assert "what the receiver answered" not in shown


def test_the_send_test_button_needs_the_csrf_token(
    signed_in: SignIn, receiver: Receiver, queued: list[int]
) -> None:
    target = channel(receiver.url)

    answer = signed_in("admin", csrf=True).post(
        f"/notifications/{target.id}/test", {"reason": "checking"}
    )

    assert answer.status_code == 403
    assert Notice.objects.count() == 0 and AuditEntry.objects.count() == 0 and queued == []


@pytest.mark.parametrize("name", NOT_ADMINS)
def test_only_an_admin_may_send_a_test_add_or_remove_a_channel(
    signed_in: SignIn, receiver: Receiver, queued: list[int], name: str
) -> None:
    target = channel(receiver.url)
    person = signed_in(name)
    form = {"name": "x", "transport": "webhook", "url": "https://h.example.com", "reason": "x"}

    assert person.post(f"/notifications/{target.id}/test", {"reason": "x"}).status_code == 403
    assert person.post(f"/notifications/{target.id}/remove", {"reason": "x"}).status_code == 403
    assert (
        person.post("/notifications/channels", form | {"kinds": "needs_human"}).status_code == 403
    )

    assert Notice.objects.count() == 0 and AuditEntry.objects.count() == 0 and queued == []
    assert NotificationChannel.objects.get().active


def test_a_test_needs_a_reason(signed_in: SignIn, receiver: Receiver, queued: list[int]) -> None:
    target = channel(receiver.url)

    answer = signed_in("admin").post(f"/notifications/{target.id}/test", {"reason": " "})

    assert answer.status_code == 400
    assert Notice.objects.count() == 0 and AuditEntry.objects.count() == 0 and queued == []


def test_a_removed_channel_is_kept_turned_off_and_audited(
    signed_in: SignIn, receiver: Receiver, queued: list[int]
) -> None:
    target = channel(receiver.url)
    admin = signed_in("admin")

    admin.post(f"/notifications/{target.id}/remove", {"reason": "the team moved"})
    again = admin.post(f"/notifications/{target.id}/test", {"reason": "still there?"}, follow=True)

    target.refresh_from_db()
    assert not target.active
    assert f"there is no active channel {target.id}" in body(again)
    assert [e.action for e in AuditEntry.objects.order_by("id")] == [
        notifications.AUDIT_CHANNEL_REMOVE
    ]
    assert Notice.objects.count() == 0 and queued == []
