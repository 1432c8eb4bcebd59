"""The reconciliation queue and settling an uncertain write."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from console.models import AuditEntry, Operation, OperationEvent, OperationState, Task
from console.records.roles import Role
from tests.console.doubt import in_flight_operation

from .helpers import Caller, error, unknown_operation

pytestmark = pytest.mark.django_db

Start = Callable[..., Task]


def test_the_operations_endpoint_lists_the_reconciliation_queue(
    admin: Caller, start: Start
) -> None:
    task = start("test_notices", {"count": 1})
    op = unknown_operation(task)

    queue = admin.get("/api/operations").json()["operations"]

    assert [(o["key"], o["state"], o["task"]) for o in queue] == [(op.key, "UNKNOWN", task.id)]


def test_resolving_an_operation_settles_it_once_and_a_second_resolve_is_a_409(
    caller: Callable[..., Caller], start: Start
) -> None:
    reconciler = caller(Role.RECONCILER)
    op = unknown_operation(start("test_notices", {"count": 1}))
    url = f"/api/operations/{op.key}/resolve"

    first = reconciler.post(
        url, {"committed": True, "evidence": "refund R-17 in the ledger", "result": {"id": 17}}
    )
    second = reconciler.post(url, {"committed": False, "evidence": "changed my mind"})

    assert first.status_code == 200
    shown = first.json()["operation"]
    assert (shown["key"], shown["state"], shown["evidence"]) == (
        "order/42/refund",
        "COMMITTED",
        "refund R-17 in the ledger",
    )
    assert "already COMMITTED" in error(second, 409)
    op.refresh_from_db()
    assert op.state == OperationState.COMMITTED
    assert op.result["data"] == {"id": 17}
    assert OperationEvent.objects.filter(operation=op, to_state="COMMITTED").count() == 1
    entry = AuditEntry.objects.get(operation=op)
    assert (entry.actor, entry.action) == (reconciler.user, "mark_committed")
    assert reconciler.get("/api/operations").json()["operations"] == []


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"evidence": "x"}, "committed must be true"),
        ({"committed": "yes", "evidence": "x"}, "committed must be true"),
        ({"committed": False}, "evidence is required"),
        ({"committed": False, "evidence": "x", "result": {"id": 1}}, "only goes with committed"),
    ],
)
def test_a_malformed_resolve_is_a_400_and_the_operation_stays_unknown(
    admin: Caller, start: Start, body: dict[str, Any], message: str
) -> None:
    op = unknown_operation(start("test_notices", {"count": 1}))

    assert message in error(admin.post(f"/api/operations/{op.key}/resolve", body), 400)
    op.refresh_from_db()
    assert op.state == OperationState.UNKNOWN


def test_an_operation_still_being_executed_is_a_409_with_the_reason(
    admin: Caller, start: Start
) -> None:
    task = start("test_notices", {"count": 1})
    in_flight_operation(task, "order-1-refund")

    response = admin.post(
        "/api/operations/order-1-refund/resolve", {"committed": False, "evidence": "?"}
    )

    assert "being executed right now" in error(response, 409)
    assert Operation.objects.get(key="order-1-refund").state == OperationState.IN_FLIGHT


def _sent_after_all(op: Operation) -> None:
    """The notice the operation stands for is in the desk: the action did happen (and the
    operation names the tool whose lookup can tell)."""
    from console.demo import desk

    Operation.objects.filter(pk=op.pk).update(tool="send_notice")

    desk.notice_send(
        order_number=None, recipient="ops@example.com", text="sent", idempotency_key=op.key
    )


def test_marking_not_committed_what_the_lookup_finds_needs_an_override_with_its_reason(
    caller: Callable[..., Caller], start: Start
) -> None:
    reconciler = caller(Role.RECONCILER)
    op = unknown_operation(start("test_notices", {"count": 1}))
    _sent_after_all(op)
    url = f"/api/operations/{op.key}/resolve"

    refused = reconciler.post(url, {"committed": False, "evidence": "nothing in my inbox"})

    assert "lookup finds this action" in error(refused, 409)
    op.refresh_from_db()
    assert op.state == OperationState.UNKNOWN
    assert not AuditEntry.objects.filter(operation=op).exists()

    overridden = reconciler.post(
        url,
        {
            "committed": False,
            "evidence": "nothing in my inbox",
            "override": "the desk's row is a test fixture; the customer got nothing",
        },
    )

    assert overridden.status_code == 200
    op.refresh_from_db()
    assert op.state == OperationState.NOT_COMMITTED
    entry = AuditEntry.objects.get(operation=op, action="mark_not_committed")
    assert "override of the lookup: the desk's row is a test fixture" in entry.reason
    assert entry.after["override"].startswith("the desk's row is a test fixture")
    assert entry.after["lookup"]["committed"] is True


def test_an_override_goes_only_with_not_committed(
    caller: Callable[..., Caller], start: Start
) -> None:
    op = unknown_operation(start("test_notices", {"count": 1}))
    body = {"committed": True, "evidence": "seen", "override": "because"}

    answer = caller(Role.RECONCILER).post(f"/api/operations/{op.key}/resolve", body)

    assert "only goes with committed: false" in error(answer, 400)
    op.refresh_from_db()
    assert op.state == OperationState.UNKNOWN


def test_marking_not_committed_what_the_lookup_does_not_find_needs_no_override(
    caller: Callable[..., Caller], start: Start
) -> None:
    op = unknown_operation(start("test_notices", {"count": 1}))
    Operation.objects.filter(pk=op.pk).update(tool="send_notice")

    answer = caller(Role.RECONCILER).post(
        f"/api/operations/{op.key}/resolve", {"committed": False, "evidence": "not in the desk"}
    )

    assert answer.status_code == 200
    entry = AuditEntry.objects.get(operation=op, action="mark_not_committed")
    assert entry.after["lookup"]["committed"] is False
    assert "override" not in entry.after
