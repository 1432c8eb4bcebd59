"""The approval queue: a held call shown in full, answered once by someone who may approve."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from console.demo.models import Refund
from console.drivers import runner
from console.models import (
    Approval,
    ApprovalState,
    AuditAction,
    AuditEntry,
    Task,
    TaskState,
    TraceEvent,
)

from .support import XSS, XSS_ESCAPED, SignIn, body, csrf_token, may_not

pytestmark = pytest.mark.django_db





def _answer(decision: str, reason: str = "checked the order", **extra: str) -> dict[str, str]:
    return {"decision": decision, "reason": reason, "on_reject": "resume", **extra}


def test_the_queue_shows_the_held_call_in_full(signed_in: SignIn, held: Approval) -> None:
    html = body(signed_in("viewer").get("/approvals/"))

    assert f'id="approval-{held.id}"' in html
    assert f'href="/tasks/{held.task_id}/"' in html
    assert "support_desk" in html and "refund" in html
    assert "order-42-refund" in html
    assert held.fingerprint in html  # whole, not shortened
    assert "&quot;amount_cents&quot;: 1500" in html  # the arguments, as JSON
    assert "model calls" in html  # the task's budgets, spent and left
    assert "You can read this queue" in html  # a viewer reads, and gets no form
    assert 'name="decision"' not in html


def test_an_argument_holding_markup_is_shown_as_text(signed_in: SignIn, held: Approval) -> None:
    # A held call is never rewritten (a trigger refuses it): this one is held so, as written.
    Approval.objects.create(
        task=held.task,
        phase=held.phase + 1,
        tool="refund",
        effect="write",
        operation_key="order-42-refund-2",
        fingerprint="f" * 64,
        args={"note": XSS, "amount_cents": 1500},
    )

    html = body(signed_in("approver").get("/approvals/"))

    assert XSS not in html
    assert XSS_ESCAPED in html


def test_the_navigation_and_the_dashboard_lead_to_the_queue(
    signed_in: SignIn, held: Approval
) -> None:
    html = body(signed_in("viewer").get("/"))

    assert '<a href="/approvals/"' in html
    assert "Calls waiting for approval" in html
    assert f'href="/approvals/#approval-{held.id}"' in html


def test_an_approver_approves_and_the_task_is_queued_for_its_second_phase(
    signed_in: SignIn,
    held: Approval,
    people: dict[str, User],
    enqueued: list[int],
    django_capture_on_commit_callbacks: Callable[..., Any],
) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        response = signed_in("approver").post(
            f"/approvals/{held.id}/answer", _answer("approve"), follow=True
        )

    task = Task.objects.get(id=held.task_id)
    assert (task.state, task.phase) == (TaskState.QUEUED, 2)
    assert enqueued == [task.id]
    assert "Approved: task" in body(response)
    assert response.redirect_chain[-1][0] == "/approvals/"
    entry = AuditEntry.objects.get(action=AuditAction.APPROVE_CALL)
    assert (entry.actor, entry.approval_id, entry.reason) == (
        people["approver"],
        held.id,
        "checked the order",
    )
    # The answer is listed under "Answered", with who and why.
    answered = body(response).split('id="h-answered"')[1]
    assert "approver" in answered and "checked the order" in answered


def test_the_approved_call_runs_once(
    signed_in: SignIn, held: Approval, enqueued: list[int]
) -> None:
    signed_in("approver").post(f"/approvals/{held.id}/answer", _answer("approve"))

    assert runner.drive(held.task_id) == "COMPLETED/goal_met"
    assert Refund.objects.count() == 1


def test_a_rejection_that_ends_the_task_leaves_it_partial(
    signed_in: SignIn,
    held: Approval,
    enqueued: list[int],
    django_capture_on_commit_callbacks: Callable[..., Any],
) -> None:
    form = _answer("reject", "fraud suspected", on_reject="end")

    with django_capture_on_commit_callbacks(execute=True):
        signed_in("admin").post(f"/approvals/{held.id}/answer", form)

    task = Task.objects.get(id=held.task_id)
    assert (task.state, task.reason) == (TaskState.PARTIAL, "approval_rejected")
    assert enqueued == []
    assert Approval.objects.get(id=held.id).state == ApprovalState.REJECTED
    assert AuditEntry.objects.get(action=AuditAction.REJECT_CALL).reason == "fraud suspected"
    assert Refund.objects.count() == 0


def test_a_rejection_that_goes_on_tells_the_model(
    signed_in: SignIn, held: Approval, enqueued: list[int]
) -> None:
    signed_in("approver").post(
        f"/approvals/{held.id}/answer", _answer("reject", "above the goodwill limit")
    )

    task = Task.objects.get(id=held.task_id)
    assert (task.state, task.phase) == (TaskState.QUEUED, 2)
    runner.drive(task.id)
    told = TraceEvent.objects.get(task=task, phase=2, kind="note")
    assert "above the goodwill limit" in told.detail
    assert Refund.objects.count() == 0


@pytest.mark.parametrize("who", may_not("approve"))
def test_only_an_approver_may_answer(signed_in: SignIn, held: Approval, who: str) -> None:
    response = signed_in(who).post(f"/approvals/{held.id}/answer", _answer("approve"))

    assert response.status_code == 403
    assert Approval.objects.get(id=held.id).state == ApprovalState.PENDING
    assert not AuditEntry.objects.filter(approval=held).exists()


def test_a_second_answer_is_refused_and_keeps_what_was_typed(
    signed_in: SignIn, held: Approval
) -> None:
    signed_in("admin").post(f"/approvals/{held.id}/answer", _answer("approve", "first"))

    response = signed_in("approver").post(
        f"/approvals/{held.id}/answer", _answer("reject", "my carefully typed reason")
    )

    html = body(response)
    assert response.status_code == 200
    assert "was not answered" in html and "already APPROVED by admin" in html
    assert "my carefully typed reason" in html
    assert AuditEntry.objects.filter(approval=held).count() == 1


def test_an_answer_without_a_reason_is_refused_beside_its_call(
    signed_in: SignIn, held: Approval
) -> None:
    response = signed_in("approver").post(
        f"/approvals/{held.id}/answer", _answer("reject", "", on_reject="end")
    )

    html = body(response)
    assert "was not answered" in html and "reason" in html
    # The call is still in the queue, its form holding the choice that was made.
    section = html.split(f'id="approval-{held.id}"')[1]
    assert 'value="end" checked' in section
    assert Approval.objects.get(id=held.id).state == ApprovalState.PENDING


def test_an_answer_needs_its_csrf_token(signed_in: SignIn, held: Approval) -> None:
    browser = signed_in("approver", csrf=True)

    forged = browser.post(f"/approvals/{held.id}/answer", _answer("approve"))
    token = csrf_token(body(browser.get("/approvals/")))
    real = browser.post(
        f"/approvals/{held.id}/answer", {**_answer("approve"), "csrfmiddlewaretoken": token}
    )

    assert forged.status_code == 403
    assert real.status_code == 302
    assert Approval.objects.get(id=held.id).state == ApprovalState.APPROVED


def test_an_unknown_approval_is_not_found(signed_in: SignIn, held: Approval) -> None:
    response = signed_in("approver").post("/approvals/987654/answer", _answer("approve"))

    assert response.status_code == 404


def test_the_task_page_shows_the_held_call_and_answers_it_in_place(
    signed_in: SignIn, held: Approval, enqueued: list[int]
) -> None:
    url = f"/tasks/{held.task_id}/"
    viewer_html = body(signed_in("viewer").get(url))
    approver = signed_in("approver")
    approver_html = body(approver.get(url))

    assert "A call waits for approval" in viewer_html
    assert f'href="/approvals/#approval-{held.id}"' in viewer_html
    assert "order-42-refund" in viewer_html
    assert f'action="/approvals/{held.id}/answer"' not in viewer_html
    assert f'action="/approvals/{held.id}/answer"' in approver_html
    assert "Approve resumption…" not in approver_html  # the answer resumes it, not that form

    response = approver.post(
        f"/approvals/{held.id}/answer", {**_answer("approve"), "next": url}, follow=True
    )
    assert response.redirect_chain[-1][0] == url
    assert "A call waits for approval" not in body(response)


def test_the_queue_says_when_it_changed_under_the_reader(signed_in: SignIn, held: Approval) -> None:
    client = signed_in("viewer")
    html = body(client.get("/approvals/"))
    poll = html.split('id="approvals-live"')[1].split('hx-get="')[1].split('"')[0]
    headers = {"HX-Request": "true", "HX-Target": "approvals-live"}

    unchanged = client.get(poll, headers=headers)
    signed_in("admin").post(f"/approvals/{held.id}/answer", _answer("approve"))
    changed = client.get(poll, headers=headers)

    assert unchanged.status_code == 204
    assert changed.status_code == 200
    assert "The queue has changed" in body(changed)


def test_the_dashboard_sums_the_spend_of_today_and_of_the_week(
    signed_in: SignIn, held: Approval, settings: Any
) -> None:
    settings.LOOPGUARD_CURRENCY, settings.LOOPGUARD_CURRENCY_DECIMALS = "EUR", 2
    now = timezone.now()
    midnight = timezone.localtime(now).replace(hour=0, minute=0, second=0, microsecond=0)
    spent = [
        (now, 1250),  # today
        (midnight - timedelta(days=3), 300),  # this week, not today
        (now - timedelta(days=8), 99_900),  # older than a week
    ]
    TraceEvent.objects.bulk_create(
        TraceEvent(task_id=held.task_id, phase=1, seq=1000 + i, kind="model_call", at=at, cost=c)
        for i, (at, c) in enumerate(spent)
    )

    html = body(signed_in("viewer").get("/"))

    assert '<dd class="mono" id="spend-today">EUR 12.50</dd>' in html
    assert '<dd class="mono" id="spend-week">EUR 15.50</dd>' in html
