"""The support desk: every business action happens once per idempotency key.

These are the records reconcilers check, so the desk itself must never make a second
refund or send a second notice for one key, even when eight workers ask at once.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection

from console.demo import desk
from console.demo.models import ExportJob, Fault, Notice, Order, Page, Refund

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def seeded() -> None:
    desk.seed_demo_data()


# -- refunds -------------------------------------------------------------------------------


def test_a_refund_marks_the_order_refunded() -> None:
    refund = desk.order_refund(number=42, amount_cents=1500, idempotency_key="order-42-refund")

    assert (refund.order.number, refund.amount_cents) == (42, 1500)
    assert Order.objects.get(number=42).status == Order.Status.REFUNDED


def test_a_refund_asked_twice_with_one_key_is_made_once() -> None:
    first = desk.order_refund(number=42, amount_cents=1500, idempotency_key="order-42-refund")
    second = desk.order_refund(number=42, amount_cents=1500, idempotency_key="order-42-refund")

    assert second.pk == first.pk
    assert Refund.objects.count() == 1


def test_a_refund_with_a_used_key_and_another_amount_is_a_conflict_and_changes_nothing() -> None:
    desk.order_refund(number=42, amount_cents=1500, idempotency_key="order-42-refund")

    with pytest.raises(desk.IdempotencyConflict, match="already refunded 1500"):
        desk.order_refund(number=42, amount_cents=900, idempotency_key="order-42-refund")

    assert list(Refund.objects.values_list("amount_cents", flat=True)) == [1500]


def test_a_used_refund_key_cannot_be_spent_on_another_order() -> None:
    desk.order_refund(number=42, amount_cents=1500, idempotency_key="order-42-refund")

    with pytest.raises(desk.IdempotencyConflict):
        desk.order_refund(number=43, amount_cents=1500, idempotency_key="order-42-refund")

    assert Order.objects.get(number=43).status == Order.Status.OPEN


def test_an_order_refunded_under_one_key_is_refused_under_another() -> None:
    desk.order_refund(number=42, amount_cents=1500, idempotency_key="order-42-refund")

    with pytest.raises(desk.RefundRefused, match="already refunded"):
        desk.order_refund(number=42, amount_cents=1500, idempotency_key="retry-7")

    assert desk.refund_find("retry-7") is None
    assert Refund.objects.count() == 1


def test_a_refund_larger_than_the_order_is_refused_and_leaves_the_order_open() -> None:
    with pytest.raises(desk.RefundRefused, match="cost 1500 cents"):
        desk.order_refund(number=42, amount_cents=1501, idempotency_key="order-42-refund")

    assert Refund.objects.count() == 0
    assert Order.objects.get(number=42).status == Order.Status.OPEN


def test_refunding_an_order_the_desk_does_not_have_raises_order_not_found() -> None:
    with pytest.raises(desk.OrderNotFound, match="no order 404"):
        desk.order_refund(number=404, amount_cents=100, idempotency_key="order-404-refund")


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"amount_cents": 0}, "amount_cents must be a positive int"),
        ({"amount_cents": True}, "amount_cents must be a positive int"),
        ({"idempotency_key": " "}, "idempotency key must be a non-empty string"),
    ],
)
def test_a_refund_with_a_bad_amount_or_key_is_rejected(
    changes: dict[str, Any], message: str
) -> None:
    arguments: dict[str, Any] = {
        "number": 42,
        "amount_cents": 1500,
        "idempotency_key": "order-42-refund",
        **changes,
    }

    with pytest.raises(ValueError, match=message):
        desk.order_refund(**arguments)

    assert Refund.objects.count() == 0


# -- notices -------------------------------------------------------------------------------


def _notice(text: str = "Refunded.", key: str = "order-42-refund-notice") -> Notice:
    return desk.notice_send(
        order_number=42, recipient="ada@example.com", text=text, idempotency_key=key
    )


def test_a_notice_asked_twice_with_one_key_is_sent_once() -> None:
    first = _notice()
    second = _notice()

    assert second.pk == first.pk
    assert Notice.objects.count() == 1


def test_a_notice_with_a_used_key_and_another_text_is_a_conflict() -> None:
    _notice("Refunded.")

    with pytest.raises(desk.IdempotencyConflict):
        _notice("Refunded, sorry!")

    assert list(Notice.objects.values_list("text", flat=True)) == ["Refunded."]


def test_a_notice_need_not_be_about_an_order() -> None:
    notice = desk.notice_send(
        order_number=None,
        recipient="customers@example.com",
        text="Incident 7: investigating.",
        idempotency_key="incident-7-first-notice",
    )

    assert notice.order is None
    assert desk.notice_find("incident-7-first-notice") == notice


def test_a_notice_about_an_unknown_order_is_not_sent() -> None:
    with pytest.raises(desk.OrderNotFound):
        desk.notice_send(
            order_number=404, recipient="x@example.com", text="Hi", idempotency_key="k"
        )

    assert Notice.objects.count() == 0


# -- concurrency ---------------------------------------------------------------------------


def _race(workers: int, action: Callable[[], Any]) -> tuple[list[Any], list[BaseException]]:
    """Run ``action`` in ``workers`` threads released together; their results and errors."""
    start = threading.Barrier(workers)
    results: list[Any] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def work() -> None:
        try:
            start.wait()
            outcome = action()
            with lock:
                results.append(outcome)
        except BaseException as error:
            with lock:
                errors.append(error)
        finally:
            connection.close()  # each thread has its own connection; leave none open

    threads = [threading.Thread(target=work) for _ in range(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    return results, errors


@pytest.mark.django_db(transaction=True)
def test_eight_workers_refunding_with_one_key_make_exactly_one_refund() -> None:
    desk.seed_demo_data()

    refunds, errors = _race(
        8,
        lambda: desk.order_refund(number=43, amount_cents=9900, idempotency_key="order-43-refund"),
    )

    assert errors == []
    assert len(refunds) == 8
    assert {refund.pk for refund in refunds} == {Refund.objects.get().pk}
    assert Order.objects.get(number=43).status == Order.Status.REFUNDED


@pytest.mark.django_db(transaction=True)
def test_eight_workers_refunding_one_order_under_eight_keys_make_exactly_one_refund() -> None:
    desk.seed_demo_data()
    keys = iter(f"attempt-{n}" for n in range(8))
    lock = threading.Lock()

    def refund() -> Refund:
        with lock:
            key = next(keys)
        return desk.order_refund(number=44, amount_cents=2500, idempotency_key=key)

    refunds, errors = _race(8, refund)

    assert len(refunds) == 1
    assert len(errors) == 7
    assert all(isinstance(error, desk.RefundRefused) for error in errors)
    assert Refund.objects.count() == 1


@pytest.mark.django_db(transaction=True)
def test_eight_workers_sending_one_notice_send_it_once() -> None:
    desk.seed_demo_data()

    notices, errors = _race(8, _notice)

    assert errors == []
    assert len({notice.pk for notice in notices}) == 1
    assert Notice.objects.count() == 1


# -- lookups, jobs, faults, seed ------------------------------------------------------------


def test_lookups_find_an_action_by_its_key_and_nothing_for_an_unused_key() -> None:
    refund = desk.order_refund(number=42, amount_cents=1500, idempotency_key="order-42-refund")
    notice = _notice()

    assert desk.refund_find("order-42-refund") == refund
    assert desk.notice_find("order-42-refund-notice") == notice
    assert desk.refund_find("order-43-refund") is None
    assert desk.notice_find("order-43-refund-notice") is None
    assert desk.order_get(42).customer_email == "ada@example.com"


def test_looking_up_an_order_the_desk_does_not_have_raises_order_not_found() -> None:
    with pytest.raises(desk.OrderNotFound):
        desk.order_get(404)


def test_an_export_job_starts_once_and_finishes_after_the_checks_it_needs() -> None:
    first = desk.export_start(collection="archive", polls_needed=2, idempotency_key="export-9")
    again = desk.export_start(collection="archive", polls_needed=2, idempotency_key="export-9")

    assert again.pk == first.pk
    assert desk.export_poll(idempotency_key="export-9").finished is False
    assert desk.export_poll(idempotency_key="export-9").finished is True
    assert ExportJob.objects.count() == 1
    with pytest.raises(desk.IdempotencyConflict):
        desk.export_start(collection="archive", polls_needed=5, idempotency_key="export-9")
    with pytest.raises(desk.JobNotFound):
        desk.export_poll(idempotency_key="export-10")


def test_a_fault_fires_only_the_first_time_for_an_operation_key() -> None:
    assert desk.fault_trip_once(operation_key="incident-7-first-notice") is True
    assert desk.fault_trip_once(operation_key="incident-7-first-notice") is False
    assert desk.fault_trip_once(operation_key="incident-8-first-notice") is True
    assert Fault.objects.count() == 2


def test_seeding_again_adds_nothing_and_keeps_what_changed() -> None:
    desk.order_refund(number=42, amount_cents=1500, idempotency_key="order-42-refund")
    orders, pages = Order.objects.count(), Page.objects.count()

    desk.seed_demo_data()

    assert (Order.objects.count(), Page.objects.count()) == (orders, pages)
    assert Order.objects.get(number=42).status == Order.Status.REFUNDED
    assert desk.page_count("reports") == 3
    assert not Order.objects.filter(number=404).exists()
