"""The support desk's operations: every write and the few reads the agents need.

Writes are idempotent by key. Each inserts its row inside a savepoint and lets the
unique constraint on ``idempotency_key`` decide who was first: concurrent callers with one
key block on the index until the first commits, then find its row. Nothing here looks for a
row and then inserts, which would let two callers both see "absent" and both act.
"""

from __future__ import annotations

from typing import Any

from django.db import DEFAULT_DB_ALIAS, IntegrityError, models, transaction
from django.db.models import F

from console.demo.models import ExportJob, Fault, Notice, Order, Page, Refund

__all__ = [
    "DEMO_ORDERS",
    "DEMO_PAGES",
    "DeskError",
    "IdempotencyConflict",
    "JobNotFound",
    "OrderNotFound",
    "RefundRefused",
    "export_find",
    "export_poll",
    "export_start",
    "fault_trip_once",
    "notice_find",
    "notice_send",
    "order_get",
    "order_refund",
    "page_count",
    "page_get",
    "refund_find",
    "seed_demo_data",
]


class DeskError(Exception):
    """The desk refused an operation; nothing was changed."""


class OrderNotFound(DeskError, LookupError):
    """There is no order with that number."""


class JobNotFound(DeskError, LookupError):
    """There is no export job with that key."""


class RefundRefused(DeskError):
    """The order cannot be refunded this way (already refunded, or more than it cost)."""


class IdempotencyConflict(DeskError):
    """The idempotency key was already used for an action with other parameters."""


# Orders and pages the demo agents expect. Order 404 is deliberately absent.
DEMO_ORDERS: tuple[tuple[int, str, int], ...] = (
    (42, "ada@example.com", 1500),
    (43, "grace@example.com", 9900),
    (44, "edsger@example.com", 2500),
    (45, "barbara@example.com", 4200),
    (46, "donald@example.com", 12800),
)
DEMO_PAGES: dict[str, int] = {"reports": 3, "archive": 120}


# -- reads ---------------------------------------------------------------------------------


def order_get(number: int) -> Order:
    """The order with ``number``; raises :class:`OrderNotFound` if there is none."""
    try:
        return Order.objects.get(number=number)
    except Order.DoesNotExist:
        raise OrderNotFound(f"there is no order {number}") from None


def refund_find(idempotency_key: str) -> Refund | None:
    """The refund made under ``idempotency_key``, if any (what reconcilers check)."""
    return Refund.objects.select_related("order").filter(idempotency_key=idempotency_key).first()


def notice_find(idempotency_key: str) -> Notice | None:
    """The notice sent under ``idempotency_key``, if any (what reconcilers check)."""
    return Notice.objects.select_related("order").filter(idempotency_key=idempotency_key).first()


def export_find(idempotency_key: str) -> ExportJob | None:
    """The export job started under ``idempotency_key``, if any."""
    return ExportJob.objects.filter(idempotency_key=idempotency_key).first()


def page_get(*, collection: str, number: int) -> Page | None:
    """Page ``number`` of ``collection``, if it exists."""
    return Page.objects.filter(collection=collection, number=number).first()


def page_count(collection: str) -> int:
    """How many pages ``collection`` has."""
    return Page.objects.filter(collection=collection).count()


# -- writes --------------------------------------------------------------------------------


def order_refund(*, number: int, amount_cents: int, idempotency_key: str) -> Refund:
    """Refund ``amount_cents`` of order ``number`` once per ``idempotency_key``.

    A second call with the same key and parameters returns the first refund and changes
    nothing; the same key with other parameters raises :class:`IdempotencyConflict`.
    Raises :class:`OrderNotFound`, or :class:`RefundRefused` if the amount exceeds the
    order or the order was already refunded under another key.
    """
    _require_key(idempotency_key)
    _require_positive("amount_cents", amount_cents)
    with transaction.atomic():
        order = order_get(number)
        if amount_cents > order.amount_cents:
            raise RefundRefused(
                f"order {number} cost {order.amount_cents} cents; cannot refund {amount_cents}"
            )
        refund, created = _insert_once(
            Refund, idempotency_key, order=order, amount_cents=amount_cents
        )
        if not created:
            if (refund.order_id, refund.amount_cents) != (order.pk, amount_cents):
                raise IdempotencyConflict(
                    f"{idempotency_key!r} already refunded {refund.amount_cents} cents "
                    f"of order {refund.order.number}"
                )
            return refund
        # From open to refunded, in the refund's own transaction: losing this race (another
        # key refunded the order first) rolls the new refund back.
        moved = Order.objects.filter(pk=order.pk, status=Order.Status.OPEN).update(
            status=Order.Status.REFUNDED
        )
        if moved != 1:
            raise RefundRefused(f"order {number} is already refunded")
        return refund


def notice_send(
    *, order_number: int | None, recipient: str, text: str, idempotency_key: str
) -> Notice:
    """Send ``text`` to ``recipient`` once per ``idempotency_key``.

    ``order_number`` ties the notice to an order (``None`` for notices about other
    things, such as incidents). The same key with the same parameters returns the first
    notice; with other parameters it raises :class:`IdempotencyConflict`.
    """
    _require_key(idempotency_key)
    if not recipient.strip():
        raise ValueError("a notice needs a recipient")
    if not text.strip():
        raise ValueError("a notice needs a text")
    with transaction.atomic():
        order = None if order_number is None else order_get(order_number)
        notice, created = _insert_once(
            Notice, idempotency_key, order=order, recipient=recipient, text=text
        )
        if not created and (notice.order_id, notice.recipient, notice.text) != (
            None if order is None else order.pk,
            recipient,
            text,
        ):
            raise IdempotencyConflict(
                f"{idempotency_key!r} already sent another notice to {notice.recipient}"
            )
        return notice


def export_start(*, collection: str, polls_needed: int | None, idempotency_key: str) -> ExportJob:
    """Start an export of ``collection`` once per ``idempotency_key``.

    The job finishes after ``polls_needed`` status checks (``None``: never). Same
    idempotency rules as :func:`notice_send`.
    """
    _require_key(idempotency_key)
    if polls_needed is not None:
        _require_positive("polls_needed", polls_needed)
    job, created = _insert_once(
        ExportJob, idempotency_key, collection=collection, polls_needed=polls_needed
    )
    if not created and (job.collection, job.polls_needed) != (collection, polls_needed):
        raise IdempotencyConflict(f"{idempotency_key!r} already started another export")
    return job


def export_poll(*, idempotency_key: str) -> ExportJob:
    """Check an export job's status, which counts as one of the checks it needs to finish."""
    # One UPDATE, so concurrent polls each count once.
    moved = ExportJob.objects.filter(idempotency_key=idempotency_key).update(
        polls_done=F("polls_done") + 1
    )
    if moved != 1:
        raise JobNotFound(f"there is no export job {idempotency_key!r}")
    return ExportJob.objects.get(idempotency_key=idempotency_key)


def fault_trip_once(*, operation_key: str, kind: str = Fault.Kind.LOST_RESPONSE) -> bool:
    """Record that fault ``kind`` fired for ``operation_key``: ``True`` only the first time."""
    try:
        with transaction.atomic():
            Fault.objects.create(operation_key=operation_key, kind=kind)
    except IntegrityError:
        return False
    return True


def seed_demo_data(*, using: str = DEFAULT_DB_ALIAS) -> None:
    """Create the demo orders and pages if they are missing; existing rows are left alone."""
    # ON CONFLICT DO NOTHING: safe to run again, and from two processes at once.
    Order.objects.using(using).bulk_create(
        [
            Order(number=n, customer_email=email, amount_cents=cents)
            for n, email, cents in DEMO_ORDERS
        ],
        ignore_conflicts=True,
    )
    Page.objects.using(using).bulk_create(
        [
            Page(collection=collection, number=number, items=_page_items(collection, number))
            for collection, count in DEMO_PAGES.items()
            for number in range(1, count + 1)
        ],
        ignore_conflicts=True,
    )


# -- helpers -------------------------------------------------------------------------------


def _insert_once[M: models.Model](model: type[M], key: str, **values: Any) -> tuple[M, bool]:
    """Insert a row under ``key`` unless one exists: the row, and whether this call made it."""
    try:
        # A savepoint, so that a lost race leaves the caller's transaction usable.
        with transaction.atomic():
            return model._default_manager.create(idempotency_key=key, **values), True
    except IntegrityError:
        existing = model._default_manager.filter(idempotency_key=key).first()
        if existing is None:  # some other constraint failed: not ours to hide
            raise
        return existing, False


def _page_items(collection: str, number: int) -> list[dict[str, Any]]:
    return [{"id": f"{collection}-{number}-{i}", "line": (number - 1) * 3 + i} for i in (1, 2, 3)]


def _require_key(key: str) -> None:
    if not isinstance(key, str) or not key.strip():
        raise ValueError("an idempotency key must be a non-empty string")


def _require_positive(name: str, value: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
