"""The reconciliation queue tells the reconciler what the ledger and the last lookup know."""

from __future__ import annotations

import pytest

from console.models import AuditAction, AuditEntry, Operation, OperationState

from .support import KEY, SignIn, Start, body, unknown_operation

pytestmark = pytest.mark.django_db(transaction=True)


def _committed_elsewhere(start: Start, fingerprint: str, key: str) -> Operation:
    """Another task's write of the same call, under another key, that went through."""
    other = start("test_notices", {"count": 1, "other": True})
    Operation.objects.create(
        key=key,
        fingerprint=fingerprint,
        state=OperationState.COMMITTED,
        tool="send_notice",
        task=other,
        result={"kind": "SUCCESS", "data": {"sent": key}, "wait_ms": None, "attempts": 1},
    )
    return Operation.objects.get(key=key)


def test_the_queue_says_when_the_same_call_was_committed_under_another_key(
    signed_in: SignIn, start: Start
) -> None:
    op = unknown_operation(start("test_notices", {"count": 1}))
    other = _committed_elsewhere(start, op.fingerprint, "incident-42-notice-sent-by-hand")

    html = body(signed_in("reconciler").get("/operations/"))

    assert "What the ledger knows" in html
    assert "The same call was committed under another key" in html
    assert other.key in html
    assert f"/tasks/{other.task_id}/" in html
    # Its own moves: claimed by its task, then made uncertain by recovery.
    assert "new → IN_FLIGHT" in html
    assert "IN_FLIGHT → UNKNOWN" in html


def test_a_call_committed_nowhere_else_gets_no_such_hint(signed_in: SignIn, start: Start) -> None:
    unknown_operation(start("test_notices", {"count": 1}))

    html = body(signed_in("reconciler").get("/operations/"))

    assert "What the ledger knows" in html
    assert "The same call was committed under another key" not in html
    assert "Nobody has looked it up in the business system yet." in html


def test_the_queue_shows_the_last_lookup_and_who_ran_it(signed_in: SignIn, start: Start) -> None:
    op = unknown_operation(start("test_notices", {"count": 1}))
    client = signed_in("reconciler")
    client.post(f"/operations/{KEY}/lookup")  # the notice was never sent: it did not happen
    assert AuditEntry.objects.filter(operation=op, action=AuditAction.LOOKUP).count() == 1

    html = body(client.get("/operations/"))

    assert "Last looked up by reconciler" in html
    assert "<strong>it did not happen</strong>" in html
    assert "Nobody has looked it up" not in html
    assert Operation.objects.get(key=KEY).state == OperationState.UNKNOWN  # looking changed nothing
