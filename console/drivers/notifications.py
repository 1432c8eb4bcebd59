"""Be told, not watch: notices of what needs a person, by webhook and by email.

Each kind of channel is a :class:`Transport` in :data:`TRANSPORTS` ("transports", below):
what it asks of an admin, how its target is checked, how it sends and how it is shown. The
form, the page, delivery and the audit log read that table; nothing else tells kinds apart.

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
It goes only to https and public addresses unless the settings say otherwise, checked when
a channel is saved and again at every delivery ("where a webhook may go", below).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import http.client
import ipaddress
import json
import logging
import secrets
import socket
import ssl
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, ClassVar
from urllib.parse import urlsplit

from django.conf import settings
from django.contrib.auth.models import User
from django.core import mail
from django.db import transaction
from django.db.models import Exists, OuterRef, Prefetch, Q
from django.urls import reverse
from django.utils import timezone

from console import lifecycle
from console.models import (
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
from console.records.inputs import InputRefused, typed_text
from console.records.redaction import redact_text

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
CONNECT_TRIES = 2  # addresses of one webhook host tried per try, in the resolver's order

AUDIT_CHANNEL_ADD = AuditAction.NOTIFICATION_CHANNEL_ADD
AUDIT_CHANNEL_REMOVE = AuditAction.NOTIFICATION_CHANNEL_REMOVE
AUDIT_TEST = AuditAction.NOTIFICATION_TEST


class NotificationError(Exception):
    """A request about notifications that cannot be done; the message says why."""

    field: str | None = None
    """The channel's field the refusal is about, where the form shows it (``None``: the
    request as a whole)."""


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


def deliver(notice_id: int, *, now: datetime | None = None, resolve: Resolver | None = None) -> str:
    """Try to deliver one notice if it is due and nobody else holds it; says what happened.

    The claim is a compare-and-set on the row (from the state seen, until a deadline past
    the longest a try may take); the send runs outside any transaction; its outcome is
    written with the row still claimed by this try (``attempts`` unchanged). ``resolve``
    looks up a webhook's host (:func:`resolve_host` unless given).
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
    claimed = lifecycle.notice_move(
        notice,
        "claim",
        when=Q(channel__active=True),
        attempts=number,
        claimed_until=now + hold_for,
    )
    if not claimed:
        return "claimed by another worker"
    started = time.monotonic()
    try:
        outcome = send(
            notice.channel,
            notice.payload,
            notice_id=notice.id,
            kind=notice.kind,
            resolve=resolve or resolve_host,
        )
    except Exception as exc:  # every failure is a failed try, kept and shown
        outcome = Outcome(ok=False, error=f"{type(exc).__name__}: {exc}")
    duration = round((time.monotonic() - started) * 1000)
    finished = now + timedelta(milliseconds=duration)  # on the caller's clock
    changes: dict[str, Any] = {}
    if outcome.ok:
        move, changes = "sent", {"sent_at": finished}
    elif number >= settings.LOOPGUARD_NOTIFY_ATTEMPTS:
        move = "give_up"
    else:
        move, changes = "retry", {"next_attempt_at": finished + backoff(number)}
    with transaction.atomic():
        kept = lifecycle.notice_move(notice, move, claimed_until=None, **changes)
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
    logger.info("notice %s try %s: %s", notice.id, number, notice.state)
    return f"try {number}: {notice.state}"


def send(
    channel: NotificationChannel,
    payload: Mapping[str, Any],
    *,
    notice_id: int,
    kind: str,
    resolve: Resolver | None = None,
) -> Outcome:
    """Send ``payload`` to ``channel`` once, by its transport (no database access: runs
    outside transactions)."""
    return transport_of(channel).send(
        payload, notice_id=notice_id, kind=kind, resolve=resolve or resolve_host
    )


# -- where a webhook may go -------------------------------------------------------------------
#
# A webhook is a request the console makes from inside its own network, to a URL an admin
# typed, so an admin account (or a stolen admin session) could aim it at the cloud's
# metadata service, Redis or PostgreSQL. Hence: https only (http where
# LOOPGUARD_NOTIFY_ALLOW_HTTP says so), no credentials in the URL, and only public addresses
# unless LOOPGUARD_NOTIFY_ALLOWED_NETWORKS names the network. The addresses are checked
# after resolution, at save time to tell the admin at once and again at every delivery
# (DNS can change after the save), and the connection goes to the very address checked,
# so that a second resolution cannot swap it.

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Resolver = Callable[[str, int], Sequence[Address]]
"""``(host, port)`` → the addresses to connect to; raises ``OSError`` when there are none."""

# NAT64's well-known prefix carries an IPv4 address that a gateway on the path reaches.
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")


class WebhookRefused(NotificationError):
    """A webhook URL, or an address its host resolves to, that notices may not go to."""

    field = "url"


@dataclass(frozen=True, slots=True)
class WebhookTarget:
    """A webhook URL taken apart: what to connect to and what to ask for."""

    scheme: str
    host: str  # ASCII (IDNA), without brackets for IPv6
    port: int
    path: str  # the request target: path and query


def webhook_target(url: str) -> WebhookTarget:
    """``url`` as a :class:`WebhookTarget`, or :class:`WebhookRefused` saying why not."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme == "http" and not settings.LOOPGUARD_NOTIFY_ALLOW_HTTP:
        raise WebhookRefused(
            "http:// is refused: use https:// (LOOPGUARD_NOTIFY_ALLOW_HTTP allows http)"
        )
    if not scheme:
        raise WebhookRefused("the webhook URL has no scheme: use https://")
    if scheme not in {"http", "https"}:
        raise WebhookRefused(f"{scheme}:// is not a webhook: use https://")
    if parts.username is not None or parts.password is not None:
        # They would be sent to whoever answers, and kept and shown with the URL.
        raise WebhookRefused(
            "a webhook URL may not hold a user name or password: put a token in its path"
        )
    try:
        port = parts.port or (443 if scheme == "https" else 80)
        host = (parts.hostname or "").encode("idna").decode("ascii")
    except (ValueError, UnicodeError):
        raise WebhookRefused("the webhook URL's host or port is not usable") from None
    if not host:
        raise WebhookRefused("the webhook URL has no host")
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return WebhookTarget(scheme=scheme, host=host, port=port, path=path)


def resolve_host(host: str, port: int) -> list[Address]:
    """The addresses ``host`` resolves to now, in the resolver's order (a literal address
    is itself); ``socket.gaierror`` when it resolves to none."""
    found: list[Address] = []
    for *_, sockaddr in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM):
        # Drop an IPv6 scope ("fe80::1%eth0"); the address alone is what is checked.
        address = ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0])
        if address not in found:
            found.append(address)
    return found


def _allowed(address: Address) -> bool:
    networks = [ipaddress.ip_network(n) for n in settings.LOOPGUARD_NOTIFY_ALLOWED_NETWORKS]
    inner = _embedded_ipv4(address)
    return any(address in n or (inner is not None and inner in n) for n in networks)


def _embedded_ipv4(address: Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one stands for (mapped ``::ffff:a.b.c.d``, 6to4, NAT64),
    which is where a packet to it ends up."""
    if isinstance(address, ipaddress.IPv4Address):
        return None
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if address in _NAT64:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def address_refusal(address: Address) -> str:
    """Why notices may not go to ``address`` (``"a loopback address"``), or ``""``."""
    if _allowed(address):
        return ""
    checked = _embedded_ipv4(address) or address
    for kind, flagged in (
        ("an unspecified", checked.is_unspecified),
        ("a loopback", checked.is_loopback),
        ("a link-local", checked.is_link_local),
        ("a multicast", checked.is_multicast),
        ("a reserved", checked.is_reserved),
        ("a private", checked.is_private),
        # fec0::/10 counts as global to ipaddress, but it is a site's own network.
        ("a site-local", isinstance(checked, ipaddress.IPv6Address) and checked.is_site_local),
        ("a non-public", not checked.is_global),
    ):
        if flagged:
            return f"{kind} address"
    return ""


def _literal(host: str) -> Address | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def checked_addresses(target: WebhookTarget, *, resolve: Resolver) -> list[Address]:
    """The addresses of ``target``'s host, each allowed; :class:`WebhookRefused` if any is
    not (a name with one public and one private address must not get a coin toss), and
    ``OSError`` when the host does not resolve."""
    addresses = list(resolve(target.host, target.port))
    if not addresses:
        raise socket.gaierror(f"{target.host} resolves to no address")
    for address in addresses:
        why = address_refusal(address)
        if why:
            where = (
                f"{target.host} is"  # an address as the admin typed it
                if _literal(target.host) == address
                else f"{target.host} resolves to {address},"
            )
            raise WebhookRefused(
                f"{where} {why}: notices go to public addresses only "
                "(LOOPGUARD_NOTIFY_ALLOWED_NETWORKS can allow a network)"
            )
    return addresses


def webhook_check(url: str, *, resolve: Resolver = resolve_host) -> None:
    """The check at save time: :class:`WebhookRefused` for a URL no delivery would send to.

    A host that does not resolve now is accepted: every delivery resolves and checks it
    again anyway, and that check, not this one, is what keeps notices off internal services.
    """
    target = webhook_target(url)
    with contextlib.suppress(OSError):
        checked_addresses(target, resolve=resolve)


class _PinnedConnection(http.client.HTTPConnection):
    """HTTP, or HTTPS with ``tls``, to addresses checked beforehand: the TCP connection goes
    to one of them, never to a fresh resolution of the name, while the ``Host`` header, the
    TLS server name (SNI) and the certificate check all use the URL's host."""

    def __init__(
        self,
        target: WebhookTarget,
        addresses: Sequence[Address],
        *,
        timeout: float,
        tls: ssl.SSLContext | None,
    ) -> None:
        super().__init__(target.host, target.port, timeout=timeout)
        # Leaves the port out of the Host header when it is the scheme's own.
        self.default_port = 443 if tls is not None else 80
        self._addresses = list(addresses)
        self._tls = tls

    def connect(self) -> None:
        failure: OSError = OSError("no address to connect to")
        # Each was checked, so any may be tried; but each may take a whole timeout, and a
        # try must end within its claim (the timeout + 30 s): two at most (IPv6, IPv4).
        for address in self._addresses[:CONNECT_TRIES]:
            try:
                sock = socket.create_connection((str(address), self.port), self.timeout)
                break
            except OSError as exc:
                failure = exc
        else:
            raise failure
        if self._tls is not None:
            try:
                sock = self._tls.wrap_socket(sock, server_hostname=self.host)
            except BaseException:
                sock.close()
                raise
        self.sock = sock


def send_webhook(
    url: str,
    secret: str,
    payload: Mapping[str, Any],
    *,
    notice_id: int,
    kind: str,
    resolve: Resolver = resolve_host,
) -> Outcome:
    """POST the signed JSON body to a checked address; a 2xx answer is delivered, anything
    else (a redirect included: it is not followed) a failed try.

    Only the answer's status is kept: its body, headers and reason phrase are the target's
    words, and showing them would let the page read whatever the URL reaches.
    """
    try:
        target = webhook_target(url)
    except WebhookRefused as exc:
        return Outcome(ok=False, error=f"refused: {exc}")
    try:
        addresses = checked_addresses(target, resolve=resolve)
    except WebhookRefused as exc:
        return Outcome(ok=False, error=f"refused: {exc}")
    except OSError as exc:
        return Outcome(ok=False, error=f"cannot resolve {target.host}: {exc.strerror or exc}")
    body = body_of(payload)
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "LoopGuard-notifier",
        SIGNATURE_HEADER: sign(secret, body),
        NOTICE_HEADER: str(notice_id),
        "X-LoopGuard-Kind": kind,
    }
    tls = ssl.create_default_context() if target.scheme == "https" else None
    connection = _PinnedConnection(
        target, addresses, timeout=settings.LOOPGUARD_NOTIFY_TIMEOUT_SECONDS, tls=tls
    )
    try:
        connection.request("POST", target.path, body=body, headers=headers)
        status = connection.getresponse().status
    except http.client.HTTPException as exc:
        # Its message quotes what came back; the class says enough.
        return Outcome(ok=False, error=f"{type(exc).__name__}: no HTTP answer")
    except OSError as exc:
        return Outcome(ok=False, error=f"{type(exc).__name__}: {exc.strerror or exc}")
    except ValueError as exc:  # http.client.InvalidURL: its message quotes the secret path
        return Outcome(ok=False, error=f"{type(exc).__name__}: the URL cannot be sent")
    finally:
        connection.close()
    if 200 <= status < 300:
        return Outcome(ok=True, status_code=status)
    error = f"answered {status}"
    if 300 <= status < 400:
        error += " (a redirect: not followed)"
    return Outcome(ok=False, status_code=status, error=error)


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


# -- transports: each kind of channel, one class ---------------------------------------------

TARGET_FIELDS = ("url", "address", "secret")
"""The fields of a :class:`NotificationChannel` that say where and how it delivers."""


class Transport(ABC):
    """One kind of channel, all it takes in one place: what an admin must give, how its
    target is checked when it is saved, how a notice is sent and how the channel is shown.
    Each kind is one subclass in :data:`TRANSPORTS`, the only place kinds are told apart."""

    keeps: ClassVar[tuple[str, ...]]
    """The :data:`TARGET_FIELDS` it delivers with, each required (and by the database's
    ``notification_channel_target`` constraint too: a test keeps the two in step); the
    others are stored empty. One that keeps ``secret`` gets one made when none is given."""
    asks: ClassVar[Mapping[str, str]]
    """The fields an admin must fill in, each with what to say when it is left empty."""
    shows_response: ClassVar[bool] = False
    """Whether the page may show a try's ``response``: only when it is the console's own
    words (what a mail server accepted), never what a URL answered."""

    def __init__(self, channel: NotificationChannel) -> None:
        self.channel = channel

    @classmethod  # noqa: B027 - a hook, not abstract: most transports have nothing to check
    def check(cls, target: Mapping[str, str], *, resolve: Resolver) -> None:
        """Refuse, with a :class:`NotificationError` that says why, a target that no
        delivery would send to (``target`` holds every field of :attr:`asks`). Nothing
        more to check unless a transport says so."""

    @abstractmethod
    def where(self) -> str:
        """Where the channel delivers, as admins see it and the audit log keeps it."""

    @abstractmethod
    def send(
        self, payload: Mapping[str, Any], *, notice_id: int, kind: str, resolve: Resolver
    ) -> Outcome:
        """One try at sending ``payload`` (no database access: runs outside transactions)."""


class Webhook(Transport):
    """A signed JSON ``POST`` to a URL that may be reached ("where a webhook may go")."""

    keeps = ("url", "secret")
    asks = {"url": "A webhook needs its URL."}

    @classmethod
    def check(cls, target: Mapping[str, str], *, resolve: Resolver) -> None:
        webhook_check(target["url"], resolve=resolve)

    def where(self) -> str:
        """The host and the end of the path only: the path of a chat's incoming webhook
        (``https://hooks.slack.com/services/…``) is a secret too."""
        parts = urlsplit(self.channel.url)
        host = parts.hostname or ""
        where = f"{parts.scheme}://{host}" + (f":{parts.port}" if parts.port else "")
        rest = parts.path.lstrip("/") + (f"?{parts.query}" if parts.query else "")
        return f"{where}/…{rest[-4:]}" if rest else f"{where}/"

    def send(
        self, payload: Mapping[str, Any], *, notice_id: int, kind: str, resolve: Resolver
    ) -> Outcome:
        channel = self.channel
        return send_webhook(
            channel.url, channel.secret, payload, notice_id=notice_id, kind=kind, resolve=resolve
        )


class Email(Transport):
    """Mail through Django's mail settings to the comma-separated addresses."""

    keeps = ("address",)
    asks = {"address": "Give at least one address."}
    shows_response = True  # "accepted by <mail server> for <n>": the console's own words

    def where(self) -> str:
        return self.channel.address

    def send(
        self, payload: Mapping[str, Any], *, notice_id: int, kind: str, resolve: Resolver
    ) -> Outcome:
        return send_email(self.channel.address, payload)


TRANSPORTS: Mapping[str, type[Transport]] = {
    ChannelTransport.WEBHOOK: Webhook,
    ChannelTransport.EMAIL: Email,
}
"""Each kind of channel (``models.ChannelTransport``) → its transport. A new kind is a member
of ``ChannelTransport`` with its clause in the ``notification_channel_target`` constraint
(and their migration), and its class here: the form, the page, delivery and the audit log
take it from this table, and tests/console/test_notification_transports.py checks the
database against it."""


def transport_of(channel: NotificationChannel) -> Transport:
    """The transport that delivers for ``channel``."""
    return TRANSPORTS[channel.transport](channel)


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
    resolve: Resolver | None = None,
) -> tuple[NotificationChannel, str]:
    """Add a channel, audited; returns it and its secret when one was made here (shown to
    the admin once: it is never shown again). A webhook URL that no delivery would send to
    is refused with :class:`WebhookRefused` (``resolve`` looks up its host)."""
    chosen = sorted({NoticeKind(kind).value for kind in kinds})
    if not chosen:
        raise NotificationError("choose at least one kind of event")
    chosen_transport = TRANSPORTS.get(transport)
    if chosen_transport is None:
        raise NotificationError(f"unknown transport {transport!r}")
    given = {"url": url, "address": address, "secret": secret}
    for field, missing in chosen_transport.asks.items():
        if not given[field]:
            raise NotificationError(missing)
    chosen_transport.check(given, resolve=resolve or resolve_host)
    made = ""
    if "secret" in chosen_transport.keeps and not secret:
        given["secret"] = made = secrets.token_urlsafe(32)
    target = {
        field: value if field in chosen_transport.keeps else "" for field, value in given.items()
    }
    with transaction.atomic():
        channel = NotificationChannel.objects.create(
            name=name, transport=transport, kinds=chosen, created_by=actor, **target
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
        "target": transport_of(channel).where(),
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
class ShownChannel:
    """A channel as the page lists it: the row, and where it delivers in its transport's
    words."""

    channel: NotificationChannel
    where: str


@dataclass(frozen=True, slots=True)
class NotificationsPage:
    """What the notifications page shows."""

    channels: list[ShownChannel]
    notices: list[Notice]
    public_url: str
    shows_response: frozenset[str]
    """The kinds of channel whose tries' responses may be shown (``Transport.shows_response``)."""


def notifications_page(*, recent: int = 50) -> NotificationsPage:
    """The channels, and the latest notices with every try of each."""
    channels = [
        ShownChannel(channel, transport_of(channel).where())
        for channel in NotificationChannel.objects.order_by("-active", "id")
    ]
    notices = list(
        Notice.objects.select_related("channel")
        .prefetch_related(Prefetch("tries", queryset=NoticeAttempt.objects.order_by("number")))
        .order_by("-created_at", "-id")[:recent]
    )
    shows_response = frozenset(kind for kind, t in TRANSPORTS.items() if t.shows_response)
    return NotificationsPage(channels, notices, settings.LOOPGUARD_PUBLIC_URL, shows_response)


__all__ = [
    "NOTICE_HEADER",
    "SIGNATURE_HEADER",
    "TARGET_FIELDS",
    "TRANSPORTS",
    "NotificationError",
    "NotificationsPage",
    "Outcome",
    "Resolver",
    "ShownChannel",
    "Transport",
    "WebhookRefused",
    "WebhookTarget",
    "address_refusal",
    "backoff",
    "body_of",
    "build_payload",
    "channel_add",
    "channel_remove",
    "channel_send_test",
    "checked_addresses",
    "deliver",
    "due_notices",
    "notifications_page",
    "notify",
    "record_overdue_unknowns",
    "resolve_host",
    "route_events",
    "send",
    "send_webhook",
    "sign",
    "transport_of",
    "verify",
    "webhook_check",
    "webhook_target",
]
