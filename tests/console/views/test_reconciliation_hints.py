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


def test_the_form_asks_for_an_override_when_the_lookup_finds_the_action_and_keeps_the_typing(
    signed_in: SignIn, start: Start
) -> None:
    from console.demo import desk

    op = unknown_operation(start("test_notices", {"count": 1}))
    desk.notice_send(
        order_number=None, recipient="ops@example.com", text="sent", idempotency_key=op.key
    )
    client = signed_in("reconciler")
    form = {"decision": "not_committed", "evidence": "checked the outbox by hand"}

    refused = body(client.post(f"/operations/{KEY}/resolve", form))

    assert "lookup finds this action" in refused
    assert 'name="override"' in refused  # the field to override it, shown now
    assert "checked the outbox by hand</textarea>" in refused  # what was typed is kept
    assert 'value="not_committed" checked' in refused
    assert Operation.objects.get(key=KEY).state == OperationState.UNKNOWN

    client.post(f"/operations/{KEY}/resolve", {**form, "override": "the row is a test fixture"})

    assert Operation.objects.get(key=KEY).state == OperationState.NOT_COMMITTED
    entry = AuditEntry.objects.get(action=AuditAction.MARK_NOT_COMMITTED)
    assert "override of the lookup: the row is a test fixture" in entry.reason


def test_the_override_field_is_not_shown_before_it_is_needed(
    signed_in: SignIn, start: Start
) -> None:
    unknown_operation(start("test_notices", {"count": 1}))

    html = body(signed_in("reconciler").get("/operations/"))

    assert 'name="override"' not in html
