"""Whatever an agent or a person typed is shown escaped; every page carries the CSP."""

from __future__ import annotations

import pytest

from console.models import Operation, OperationState

from .support import (
    ATTRIBUTE_BREAKER,
    XSS,
    XSS_ESCAPED,
    SignIn,
    Start,
    World,
    add_events,
    body,
    finish,
    resolve_form,
    running,
    unknown_operation,
)

pytestmark = pytest.mark.django_db


def _assert_escaped(html: str) -> None:
    assert "<script>" not in html
    assert XSS not in html
    assert XSS_ESCAPED in html
    assert ATTRIBUTE_BREAKER not in html


def test_agent_supplied_text_on_the_task_page_is_shown_escaped(
    signed_in: SignIn, start: Start
) -> None:
    task = start("test_reader", {"note": XSS})
    add_events(
        task,
        1,
        tool=XSS,
        args_preview=f"{XSS}{ATTRIBUTE_BREAKER}",
        result_preview=f"{XSS}{ATTRIBUTE_BREAKER}",
        detail=XSS,
    )
    finish(task, "FAILED", "fatal", detail=XSS)

    html = body(signed_in("viewer").get(f"/tasks/{task.id}/"))

    _assert_escaped(html)
    assert html.count(XSS_ESCAPED) >= 6  # input, tool, args, result, detail, stop report


def test_agent_supplied_text_in_new_live_rows_is_shown_escaped(
    signed_in: SignIn, world: World
) -> None:
    task = running(world.queued)
    add_events(task, 1, args_preview=f"{XSS}{ATTRIBUTE_BREAKER}", detail=XSS)

    html = body(signed_in("viewer").get(f"/tasks/{task.id}/live?after=0"))

    _assert_escaped(html)


def test_agent_supplied_text_in_the_reconciliation_queue_and_dashboard_is_shown_escaped(
    signed_in: SignIn, start: Start
) -> None:
    key = f"notice-{XSS}"
    unknown_operation(start("test_notices", {"count": 1}), key, {"text": XSS})
    client = signed_in("reconciler")

    queue = body(client.get("/operations/"))
    board = body(client.get("/"))

    for html in (queue, board):
        assert "<script>" not in html
        assert XSS_ESCAPED in html
    # The key travels in the form's URL percent-encoded, and the form still works.
    assert 'action="/operations/notice-%3Cscript%3Ealert(1)%3C/script%3E/resolve"' in queue
    op = Operation.objects.get(key=key)
    response = client.post(
        "/operations/notice-%3Cscript%3Ealert(1)%3C/script%3E/resolve", resolve_form(op)
    )
    assert response.status_code == 302
    op.refresh_from_db()
    assert op.state == OperationState.NOT_COMMITTED


def test_a_reason_typed_by_a_person_is_shown_escaped_in_the_audit_log(
    signed_in: SignIn, world: World
) -> None:
    signed_in("operator").post(f"/tasks/{world.queued.id}/stop", {"reason": XSS})
    client = signed_in("viewer")

    for url in ("/audit/", f"/tasks/{world.queued.id}/"):
        html = body(client.get(url))
        assert "<script>" not in html
        assert XSS_ESCAPED in html


@pytest.mark.parametrize(
    "url", ["/", "/tasks/", "/operations/", "/audit/", "/tasks/987654/", "/login"]
)
def test_pages_carry_a_content_security_policy_allowing_only_our_own_origin(
    signed_in: SignIn, url: str
) -> None:
    response = signed_in("viewer").get(url)

    assert "default-src 'self'" in response["Content-Security-Policy"]


def test_a_refusal_page_carries_the_content_security_policy_too(signed_in: SignIn) -> None:
    response = signed_in("nobody").get("/")

    assert response.status_code == 403
    assert "default-src 'self'" in response["Content-Security-Policy"]
