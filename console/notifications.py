"""Be told, not watch: notices of what needs a person, by webhook and by email.

The outbox pattern, in three steps, each safe to run twice and safe when a worker dies:

1. **Events.** ``lifecycle.finish_task`` writes a :class:`NotificationEvent` in the
   transaction that stops a task ``NEEDS_HUMAN`` (a restart-loop hold is its own kind);
   :func:`record_overdue_unknowns` adds one for each write still ``UNKNOWN`` after
   ``LOOPGUARD_NOTIFY_UNKNOWN_AFTER_MINUTES`` (once per operation: a unique constraint).
2. **Routing.** :func:`route_events` takes the events not routed yet with
   ``SELECT … FOR UPDATE SKIP LOCKED`` and, once the oldest of a kind is
   ``LOOPGUARD_NOTIFY_BATCH_SECONDS`` old, turns all of that kind into one :class:`Notice`
   per active channel that chose the kind: forty tasks stopping at once are one notice.
3. **Delivery.** :func:`deliver` claims a due notice with a compare-and-set (``PENDING`` →
   ``SENDING`` until a deadline), sends it outside any transaction, and stores the try as a
   :class:`NoticeAttempt`. A failed try is retried after a wait that doubles each time, up to
   ``LOOPGUARD_NOTIFY_ATTEMPTS`` tries; a worker that died mid-send leaves a claim that runs
   out, and the notice is sent again (at least once: receivers can tell a repeat by its
   ``X-LoopGuard-Notice`` id).

A webhook's body is JSON with a top-level ``text`` (what Slack-compatible incoming webhooks
show) beside the structured fields, signed with the channel's secret: the
``X-LoopGuard-Signature`` header is ``sha256=`` and the hex HMAC-SHA256 of the body's bytes.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import secrets
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.core import mail
from django.db import transaction
from django.db.models import Exists, OuterRef, Prefetch, Q
from django.urls import reverse
from django.utils import timezone

from .inputs import InputRefused, typed_text
from .models import (
    AuditAction,
    AuditEntry,
    ChannelTransport,
    Notice,
    NoticeAttempt,
    NoticeKind,
    NoticeState,
    NotificationChannel,
    NotificationEvent,
    Operation,
    OperationState,
)
from .redaction import redact_text

logger = logging.getLogger(__name__)

SIGNATURE_HEADER = "X-LoopGuard-Signature"
"""The header carrying ``sha256=<hex HMAC-SHA256 of the body with the channel's secret>``."""
NOTICE_HEADER = "X-LoopGuard-Notice"
"""The notice's id: the same on every try of one notice, so a receiver can drop a repeat."""
TEST = "test"
"""The kind of a notice sent by the "send test" button."""

LINKS_IN_TEXT = 5  # the human sentence names the first few; the rest are one link away
EVENTS_IN_PAYLOAD = 50  # the structured list is bounded too: the count says how many in all
ROUTE_AT_ONCE = 1000  # events taken by one routing pass; the next pass takes the rest
EXCERPT_CHARS = 200

AUDIT_CHANNEL_ADD = AuditAction.NOTIFICATION_CHANNEL_ADD
AUDIT_CHANNEL_REMOVE = AuditAction.NOTIFICATION_CHANNEL_REMOVE
AUDIT_TEST = AuditAction.NOTIFICATION_TEST


class NotificationError(Exception):
    """A request about notifications that cannot be done; the message says why."""


# -- signing --------------------------------------------------------------------------------


def sign(secret: str, body: bytes) -> str:
    """The ``X-LoopGuard-Signature`` value for ``body``: ``sha256=`` and the hex HMAC."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def verify(secret: str, body: bytes, signature: str) -> bool:
    """Whether ``signature`` is ``body``'s, as a receiver checks it (in constant time)."""
    return hmac.compare_digest(sign(secret, body), signature)


def body_of(payload: Mapping[str, Any]) -> bytes:
    """The exact bytes a webhook sends (and signs) for ``payload``."""
    return json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()


# -- links and notices ------------------------------------------------------------------------


def link(path: str) -> str:
    """An absolute link to a console page when ``LOOPGUARD_PUBLIC_URL`` is set, else the path."""
    return f"{settings.LOOPGUARD_PUBLIC_URL}{path}"


_HEADLINES = {
    NoticeKind.NEEDS_HUMAN: ("task needs a human", "tasks need a human"),
    NoticeKind.RESTART_LOOP: (
        "task is held for a restart loop",
        "tasks are held for a restart loop",
    ),
    NoticeKind.UNKNOWN_TOO_LONG: (
        "write has stayed UNKNOWN too long",
        "writes have stayed UNKNOWN too long",
    ),
}


def headline(kind: str, count: int) -> str:
    """``"12 tasks need a human"``: the first words of a notice."""
    one, many = _HEADLINES[NoticeKind(kind)]
    return f"{count} {one if count == 1 else many}"


def _item(event: NotificationEvent) -> dict[str, Any]:
    task_url = link(reverse("task", args=[event.task_id]))
    item: dict[str, Any] = {
        "task": event.task_id,
        "agent": event.task.agent,
        "reason": event.reason,
        "at": event.at.isoformat(),
        "url": task_url,
    }
    if event.operation is not None:
        # Where to act on an uncertain write is the reconciliation queue.
        item["operation"] = event.operation.key
        item["url"] = link(reverse("operations"))
        item["task_url"] = task_url
    return item


def _line(item: Mapping[str, Any]) -> str:
    if "operation" in item:
        return f"{item['operation']} (task {item['task']}) {item['url']}"
    return f"task {item['task']} ({item['agent']}, {item['reason']}) {item['url']}"


def build_payload(kind: str, events: Sequence[NotificationEvent]) -> dict[str, Any]:
    """The notice for ``events`` of one kind: a ``text`` sentence with the first few links
    (what a chat channel shows as it is) and the same facts as fields."""
    items = [_item(event) for event in events]
    count = len(items)
    shown = "; ".join(_line(item) for item in items[:LINKS_IN_TEXT])
    rest = count - LINKS_IN_TEXT
    listing = link(
        reverse("operations")
        if kind == NoticeKind.UNKNOWN_TOO_LONG
        else reverse("tasks") + "?state=NEEDS_HUMAN"
    )
    text = f"LoopGuard: {headline(kind, count)}: {shown}"
    if rest > 0:
        text += f"; and {rest} more: {listing}"
    return {
        "text": text,
        "kind": kind,
        "count": count,
        "events": items[:EVENTS_IN_PAYLOAD],
        "list_url": listing,
        "created_at": timezone.now().isoformat(),
    }


def payload_for_test(channel: NotificationChannel, actor: User) -> dict[str, Any]:
    """What the "send test" button sends: a notice that says it is a test, with a link."""
    page = link(reverse("notifications"))
    return {
        "text": f"LoopGuard: a test notice to {channel.name}, sent by {actor.get_username()}: "
        f"{page}",
        "kind": TEST,
        "count": 0,
        "events": [],
        "list_url": page,
        "created_at": timezone.now().isoformat(),
    }


# -- step 1: events ---------------------------------------------------------------------------


def record_overdue_unknowns(*, now: datetime | None = None) -> int:
    """An event for each write ``UNKNOWN`` for longer than the configured time that has
    none yet; returns how many were added. Safe to run twice at once: the unique
    constraint keeps one event per operation, and the loser's insert does nothing."""
    now = now or timezone.now()
    cutoff = now - timedelta(minutes=settings.LOOPGUARD_NOTIFY_UNKNOWN_AFTER_MINUTES)
    told = NotificationEvent.objects.filter(
        operation=OuterRef("pk"), kind=NoticeKind.UNKNOWN_TOO_LONG
    )
    # Served by the partial index operation_unsettled (UNKNOWN/IN_FLIGHT by updated_at).
    overdue = list(
        Operation.objects.filter(state=OperationState.UNKNOWN, updated_at__lte=cutoff)
        .filter(~Exists(told))
        .values_list("id", "task_id", "updated_at")[:ROUTE_AT_ONCE]
    )
    rows = [
        NotificationEvent(
            kind=NoticeKind.UNKNOWN_TOO_LONG,
            task_id=task_id,
            operation_id=op_id,
            reason="unknown_commit",
            detail=f"UNKNOWN since {since.isoformat()}",
            at=now,
        )
        for op_id, task_id, since in overdue
    ]
    return len(NotificationEvent.objects.bulk_create(rows, ignore_conflicts=True))


# -- step 2: routing --------------------------------------------------------------------------


def channels_for(kind: str) -> list[NotificationChannel]:
    """The active channels that chose ``kind``."""
    return [
        channel
        for channel in NotificationChannel.objects.filter(active=True).order_by("id")
        if kind in channel.kinds
    ]


def route_events(*, now: datetime | None = None) -> int:
    """Turn the events whose batching window has closed into notices, one per channel and
    kind; returns how many notices were made.

    The events are locked with ``FOR UPDATE SKIP LOCKED`` and marked routed in the same
    transaction as the notices are written: two notifiers at once route each event once,
    and one that dies mid-way leaves them unrouted for the next.
    """
    now = now or timezone.now()
    window = timedelta(seconds=settings.LOOPGUARD_NOTIFY_BATCH_SECONDS)
    made = 0
    with transaction.atomic():
        taken = list(
            NotificationEvent.objects.select_for_update(skip_locked=True, of=("self",))
            .filter(routed_at=None)
            .select_related("task", "operation")
            .order_by("at", "id")[:ROUTE_AT_ONCE]
        )
        by_kind: dict[str, list[NotificationEvent]] = {}
        for event in taken:
            by_kind.setdefault(event.kind, []).append(event)
        routed: list[int] = []
        for kind, events in by_kind.items():
            if events[0].at > now - window:
                continue  # the window is open: more of this kind may come
            for channel in channels_for(kind):
                notice = Notice.objects.create(
                    channel=channel, kind=kind, payload=build_payload(kind, events)
                )
                notice.events.add(*events)
                made += 1
            routed += [event.id for event in events]
        if routed:
            NotificationEvent.objects.filter(id__in=routed).update(routed_at=now)
    return made


# -- step 3: delivery -------------------------------------------------------------------------


def due_notices(*, now: datetime | None = None) -> list[int]:
    """Notices to try now: pending ones whose wait is over, and claims that ran out."""
    now = now or timezone.now()
    return list(
        Notice.objects.filter(
            Q(state=NoticeState.PENDING, next_attempt_at__lte=now)
            | Q(state=NoticeState.SENDING, claimed_until__lt=now),
            # A channel removed meanwhile (its URL leaked, say) is told nothing more.
            channel__active=True,
        )
        .order_by("next_attempt_at", "id")
        .values_list("id", flat=True)[:ROUTE_AT_ONCE]
    )


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one try at sending got."""

    ok: bool
    status_code: int | None = None
    response: str = ""
    error: str = ""


def backoff(attempts: int) -> timedelta:
    """The wait after the ``attempts``-th failed try: the base, doubled for each try after."""
    return timedelta(seconds=settings.LOOPGUARD_NOTIFY_BACKOFF_SECONDS * 2 ** (attempts - 1))


def deliver(notice_id: int, *, now: datetime | None = None) -> str:
    """Try to deliver one notice if it is due and nobody else holds it; says what happened.

    The claim is a compare-and-set on the row (from the state seen, until a deadline past
    the longest a try may take); the send runs outside any transaction; its outcome is
    written with the row still claimed by this try (``attempts`` unchanged).
    """
    now = now or timezone.now()
    notice = Notice.objects.select_related("channel").filter(id=notice_id).first()
    if notice is None:
        return "no such notice"
    due = (notice.state == NoticeState.PENDING and notice.next_attempt_at <= now) or (
        notice.state == NoticeState.SENDING
        and notice.claimed_until is not None
        and notice.claimed_until < now
    )
    if not due:
        return f"not due: {notice.state}"
    if not notice.channel.active:
        return "its channel was removed"
    number = notice.attempts + 1
    hold_for = timedelta(seconds=settings.LOOPGUARD_NOTIFY_TIMEOUT_SECONDS + 30)
    claimed = Notice.objects.filter(
        id=notice.id, state=notice.state, attempts=notice.attempts, channel__active=True
    ).update(state=NoticeState.SENDING, attempts=number, claimed_until=now + hold_for)
    if claimed != 1:
        return "claimed by another worker"
    started = time.monotonic()
    try:
        outcome = send(notice.channel, notice.payload, notice_id=notice.id, kind=notice.kind)
    except Exception as exc:  # every failure is a failed try, kept and shown
        outcome = Outcome(ok=False, error=f"{type(exc).__name__}: {exc}")
    duration = round((time.monotonic() - started) * 1000)
    finished = now + timedelta(milliseconds=duration)  # on the caller's clock
    if outcome.ok:
        changes: dict[str, Any] = {"state": NoticeState.SENT, "sent_at": finished}
    elif number >= settings.LOOPGUARD_NOTIFY_ATTEMPTS:
        changes = {"state": NoticeState.FAILED}
    else:
        changes = {"state": NoticeState.PENDING, "next_attempt_at": finished + backoff(number)}
    with transaction.atomic():
        kept = Notice.objects.filter(
            id=notice.id, state=NoticeState.SENDING, attempts=number
        ).update(claimed_until=None, **changes)
        NoticeAttempt.objects.create(
            notice_id=notice.id,
            number=number,
            ok=outcome.ok,
            status_code=outcome.status_code,
            response=redact_text(outcome.response)[:EXCERPT_CHARS],
            error=redact_text(outcome.error)[:EXCERPT_CHARS],
            duration_ms=duration,
        )
    if not kept:
        # Our claim ran out and another worker took the notice: its try decides the state.
        return f"try {number} kept; another worker took the notice"
    logger.info("notice %s try %s: %s", notice.id, number, changes["state"])
    return f"try {number}: {changes['state']}"


def send(
    channel: NotificationChannel, payload: Mapping[str, Any], *, notice_id: int, kind: str
) -> Outcome:
    """Send ``payload`` to ``channel`` once (no database access: runs outside transactions)."""
    if channel.transport == ChannelTransport.WEBHOOK:
        return send_webhook(channel.url, channel.secret, payload, notice_id=notice_id, kind=kind)
    return send_email(channel.address, payload)


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    # A redirect would turn the POST into a GET elsewhere, or carry the signed body to a
    # host nobody chose: it is a failed try, shown with its status.
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


_OPENER = urllib.request.build_opener(_NoRedirects)


def send_webhook(
    url: str, secret: str, payload: Mapping[str, Any], *, notice_id: int, kind: str
) -> Outcome:
    """POST the signed JSON body; a 2xx answer is delivered, anything else a failed try."""
    body = body_of(payload)
    request = urllib.request.Request(  # noqa: S310 - an admin's http(s) URL (URLField)
        url,
        data=body,
        method="POST",
        headers={
            "Content-Type": "application/json",
            "User-Agent": "LoopGuard-notifier",
            SIGNATURE_HEADER: sign(secret, body),
            NOTICE_HEADER: str(notice_id),
            "X-LoopGuard-Kind": kind,
        },
    )
    timeout = settings.LOOPGUARD_NOTIFY_TIMEOUT_SECONDS
    try:
        with _OPENER.open(request, timeout=timeout) as answer:
            text = answer.read(EXCERPT_CHARS * 4).decode("utf-8", "replace")
            return Outcome(ok=200 <= answer.status < 300, status_code=answer.status, response=text)
    except urllib.error.HTTPError as exc:
        text = exc.read(EXCERPT_CHARS * 4).decode("utf-8", "replace") if exc.fp else ""
        return Outcome(ok=False, status_code=exc.code, response=text, error=f"answered {exc.code}")
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        return Outcome(ok=False, error=f"{type(exc).__name__}: {reason}")


def send_email(addresses: str, payload: Mapping[str, Any]) -> Outcome:
    """Mail the notice through Django's mail settings (``EMAIL_*``) to ``addresses``."""
    if "default" not in mail.mailers:
        return Outcome(ok=False, error="email is not configured: EMAIL_HOST is not set")
    mailer: Mapping[str, Any] = settings.MAILERS["default"]
    host = mailer.get("OPTIONS", {}).get("host", "the mail server")
    to = [address.strip() for address in addresses.split(",") if address.strip()]
    text = str(payload["text"])
    subject = text.split(": ", 2)[1] if text.count(": ") >= 1 else text
    lines = [text, ""]
    lines += [_line(item) for item in payload.get("events", [])]
    if payload.get("count", 0) > len(payload.get("events", [])):
        lines.append(f"All of them: {payload['list_url']}")
    sent = mail.send_mail(
        subject=f"LoopGuard: {subject}"[:200],
        message="\n".join(lines) + "\n",
        from_email=None,
        recipient_list=to,
        using="default",
    )
    return Outcome(ok=sent == 1, response=f"accepted by {host} for {len(to)}")


def notify(*, now: datetime | None = None) -> list[int]:
    """One pass of the notifier: record overdue writes, route events, and return the ids
    of the notices due for delivery (each delivered by :func:`deliver`)."""
    record_overdue_unknowns(now=now)
    route_events(now=now)
    return due_notices(now=now)


# -- what admins do on the notifications page --------------------------------------------------


def channel_add(
    *,
    actor: User,
    reason: str,
    name: str,
    transport: str,
    kinds: Iterable[str],
    url: str = "",
    address: str = "",
    secret: str = "",
) -> tuple[NotificationChannel, str]:
    """Add a channel, audited; returns it and its secret when one was made here (shown to
    the admin once: it is never shown again)."""
    chosen = sorted({NoticeKind(kind).value for kind in kinds})
    if not chosen:
        raise NotificationError("choose at least one kind of event")
    made = ""
    if transport == ChannelTransport.WEBHOOK:
        if not url:
            raise NotificationError("a webhook needs its URL")
        if not secret:
            secret = made = secrets.token_urlsafe(32)
        address = ""
    elif transport == ChannelTransport.EMAIL:
        if not address:
            raise NotificationError("an email channel needs at least one address")
        url, secret = "", ""
    else:
        raise NotificationError(f"unknown transport {transport!r}")
    with transaction.atomic():
        channel = NotificationChannel.objects.create(
            name=name,
            transport=transport,
            url=url,
            address=address,
            secret=secret,
            kinds=chosen,
            created_by=actor,
        )
        _audit(actor, AUDIT_CHANNEL_ADD, reason, after=_shown(channel))
    return channel, made


def channel_remove(*, actor: User, reason: str, channel_id: int) -> NotificationChannel:
    """Turn a channel off, audited (kept, with its notices' history)."""
    with transaction.atomic():
        channel = NotificationChannel.objects.select_for_update().filter(id=channel_id).first()
        if channel is None or not channel.active:
            raise NotificationError(f"there is no active channel {channel_id}")
        NotificationChannel.objects.filter(id=channel.id, active=True).update(active=False)
        _audit(actor, AUDIT_CHANNEL_REMOVE, reason, before=_shown(channel))
        channel.active = False
    return channel


def channel_send_test(*, actor: User, reason: str, channel_id: int) -> Notice:
    """Queue a test notice to a channel, audited; it is delivered like every notice."""
    with transaction.atomic():
        channel = NotificationChannel.objects.filter(id=channel_id, active=True).first()
        if channel is None:
            raise NotificationError(f"there is no active channel {channel_id}")
        notice = Notice.objects.create(
            channel=channel, kind=TEST, payload=payload_for_test(channel, actor)
        )
        _audit(actor, AUDIT_TEST, reason, after={**_shown(channel), "notice": notice.id})
    return notice


def _shown(channel: NotificationChannel) -> dict[str, Any]:
    """A channel as the audit log keeps it: never its secret, only the hint."""
    return {
        "channel": channel.id,
        "name": channel.name,
        "transport": channel.transport,
        "target": channel.target,
        "kinds": list(channel.kinds),
        "secret": channel.secret_hint,
    }


def _audit(
    actor: User,
    action: str,
    reason: str,
    *,
    before: Mapping[str, Any] | None = None,
    after: Mapping[str, Any] | None = None,
) -> None:
    try:
        reason = typed_text(reason, what="a reason")
    except InputRefused as exc:
        raise NotificationError(str(exc)) from None
    if not reason:
        raise NotificationError("a reason is required")
    AuditEntry.objects.create(
        actor=actor,
        action=action,
        reason=reason,
        before=dict(before or {}),
        after=dict(after or {}),
    )


@dataclass(frozen=True, slots=True)
class NotificationsPage:
    """What the notifications page shows."""

    channels: list[NotificationChannel]
    notices: list[Notice]
    public_url: str


def notifications_page(*, recent: int = 50) -> NotificationsPage:
    """The channels, and the latest notices with every try of each."""
    channels = list(NotificationChannel.objects.order_by("-active", "id"))
    notices = list(
        Notice.objects.select_related("channel")
        .prefetch_related(Prefetch("tries", queryset=NoticeAttempt.objects.order_by("number")))
        .order_by("-created_at", "-id")[:recent]
    )
    return NotificationsPage(channels, notices, settings.LOOPGUARD_PUBLIC_URL)


__all__ = [
    "NOTICE_HEADER",
    "SIGNATURE_HEADER",
    "NotificationError",
    "NotificationsPage",
    "Outcome",
    "backoff",
    "body_of",
    "build_payload",
    "channel_add",
    "channel_remove",
    "channel_send_test",
    "deliver",
    "due_notices",
    "notifications_page",
    "notify",
    "record_overdue_unknowns",
    "route_events",
    "send",
    "sign",
    "verify",
]
