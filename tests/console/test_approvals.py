"""A refund over the limit waits for a person: approved, it runs once; rejected, never."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from django.contrib.auth.models import User

from console import services
from console.demo.models import Refund
from console.drivers import runner
from console.models import (
    Approval,
    ApprovalState,
    AuditAction,
    AuditEntry,
    Operation,
    StopReport,
    Task,
    TaskState,
    TraceEvent,
)
from tests.console.held import REFUND, hold_refund

pytestmark = pytest.mark.django_db(transaction=True)

Start = Callable[..., Task]


@pytest.fixture
def approver(django_user_model: type[User]) -> User:
    return django_user_model.objects.create_user("ada", password="pw-ada")


def _held(start: Start) -> tuple[Task, Approval]:
    approval = hold_refund(start)
    return approval.task, approval


def test_a_refund_over_the_limit_stops_for_approval_before_it_is_claimed(
    seeded: None, start: Start
) -> None:
    task, approval = _held(start)

    assert (task.state, task.reason) == (TaskState.NEEDS_HUMAN, "approval_required")
    assert Refund.objects.count() == 0
    assert not Operation.objects.filter(key="order-42-refund").exists()  # never claimed
    assert approval.state == ApprovalState.PENDING
    assert (approval.tool, approval.operation_key) == ("refund", "order-42-refund")
    assert approval.args == {"order": 42, "amount_cents": 1500}
    report = StopReport.objects.get(task=task).report
    assert report["pending"]["fingerprint"] == approval.fingerprint


def test_an_approved_refund_runs_once_without_asking_the_model_again(
    seeded: None, start: Start, approver: User
) -> None:
    task, approval = _held(start)
    calls_before = task.model_calls

    services.approval_approve(
        approval_id=approval.id, actor=approver, reason="checked the order", enqueue=lambda _: None
    )
    outcome = runner.drive(task.id)

    task.refresh_from_db()
    assert outcome == "COMPLETED/goal_met"
    assert Refund.objects.count() == 1
    assert Operation.objects.get(key="order-42-refund").state == "COMMITTED"
    # The phase began with the approved call: a note, then the refund, before any model call.
    phase_2 = list(
        TraceEvent.objects.filter(task=task, phase=2)
        .order_by("seq")
        .values_list("kind", "tool")[:2]
    )
    assert phase_2 == [("note", "refund"), ("request", "refund")]
    # The notice took one model call (its verified result meets the goal); the refund none.
    assert task.model_calls == calls_before + 1
    entry = AuditEntry.objects.get(action=AuditAction.APPROVE_CALL)
    assert (entry.actor, entry.approval_id, entry.task_id) == (approver, approval.id, task.id)


def test_an_approval_is_answered_once(seeded: None, start: Start, approver: User) -> None:
    _, approval = _held(start)
    services.approval_approve(
        approval_id=approval.id, actor=approver, reason="ok", enqueue=lambda _: None
    )

    with pytest.raises(services.StaleState, match="already APPROVED by ada"):
        services.approval_reject(approval_id=approval.id, actor=approver, reason="no", resume=False)


def test_a_rejected_refund_is_told_to_the_model_and_never_happens(
    seeded: None, start: Start, approver: User
) -> None:
    task, approval = _held(start)

    services.approval_reject(
        approval_id=approval.id,
        actor=approver,
        reason="above the goodwill limit",
        resume=True,
        enqueue=lambda _: None,
    )
    outcome = runner.drive(task.id)

    task.refresh_from_db()
    # The scripted planner asks for the refund again: the task ends without running it.
    assert outcome == "PARTIAL/approval_rejected"
    assert Refund.objects.count() == 0
    assert not Operation.objects.filter(key="order-42-refund").exists()
    told = TraceEvent.objects.get(task=task, phase=2, kind="note")
    assert "above the goodwill limit" in told.detail
    assert "will not be run" in told.detail and "try again" not in told.detail.lower()
    stop = TraceEvent.objects.filter(task=task, phase=2, kind="stop").get()
    assert "approval_rejected" in stop.reason


def test_a_rejection_may_end_the_task_at_once(seeded: None, start: Start, approver: User) -> None:
    task, approval = _held(start)

    services.approval_reject(
        approval_id=approval.id, actor=approver, reason="fraud suspected", resume=False
    )

    task.refresh_from_db()
    assert (task.state, task.reason) == (TaskState.PARTIAL, "approval_rejected")
    assert "fraud suspected" in task.detail
    assert StopReport.objects.filter(task=task).latest("id").reason == "approval_rejected"
    assert Refund.objects.count() == 0
    assert AuditEntry.objects.get(action=AuditAction.REJECT_CALL).reason == "fraud suspected"


def test_a_task_waiting_for_an_approval_is_not_resumed_past_it(
    seeded: None, start: Start, approver: User
) -> None:
    task, _ = _held(start)

    with pytest.raises(services.Refused, match="approval queue"):
        services.task_approve_resumption(task_id=task.id, actor=approver, reason="go on")


def test_an_approved_call_of_a_batch_runs_after_the_calls_before_it_and_the_model_sees_both(
    start: Start, approver: User
) -> None:
    from console.demo.models import Notice

    task = start("test_notices", {"count": 3, "batch": True, "approve": 2})
    assert runner.drive(task.id) == "NEEDS_HUMAN/approval_required"
    assert Notice.objects.count() == 1  # the first ran; the second waits; the third never ran
    approval = Approval.objects.get(task=task)
    assert approval.operation_key.endswith("-notice-2")

    services.approval_approve(
        approval_id=approval.id, actor=approver, reason="fine", enqueue=lambda _: None
    )
    outcome = runner.drive(task.id)

    task.refresh_from_db()
    assert outcome == "COMPLETED/goal_met"
    assert sorted(Notice.objects.values_list("text", flat=True)) == [
        "notice 1",
        "notice 2",
        "notice 3",
    ]
    # Phase 2's first model call saw the batch's two results (the first call's and the
    # approved one's), as if the batch had gone on.
    assert task.checkpoint["agent"]["observed"][-1] == ["SUCCESS", "SUCCESS"]


def test_a_stop_pressed_while_the_model_thinks_wins_over_a_held_write(
    seeded: None, start: Start, monkeypatch: pytest.MonkeyPatch, django_user_model: type[User]
) -> None:
    from console.demo.support_desk import SupportDesk

    operator = django_user_model.objects.create_user("olga")
    plan = SupportDesk.plan

    def stopped_meanwhile(self: SupportDesk, observation: object) -> object:
        proposal = plan(self, observation)
        if getattr(proposal, "tool", "") == "refund":  # the operator presses Stop now
            services.task_stop(task_id=self.task_id, actor=operator, reason="hold everything")
        return proposal

    monkeypatch.setattr(SupportDesk, "plan", stopped_meanwhile)
    task = start("support_desk", REFUND)

    outcome = runner.drive(task.id)

    assert outcome == "CANCELLED/operator_stop"
    assert not Approval.objects.filter(task=task).exists()
    assert Refund.objects.count() == 0


def test_the_approval_is_checkpointed_as_used_before_the_approved_call_runs(
    seeded: None, start: Start, approver: User, monkeypatch: pytest.MonkeyPatch
) -> None:
    from console.demo import support_desk

    task, approval = _held(start)
    services.approval_approve(
        approval_id=approval.id, actor=approver, reason="ok", enqueue=lambda _: None
    )
    seen: list[object] = []
    refund = support_desk.SupportDesk._refund

    def watching(self: support_desk.SupportDesk, call: object) -> object:
        # What a worker restarted now would resume from: the approval already used.
        saved = Task.objects.values_list("checkpoint", flat=True).get(id=self.task_id)
        seen.append(saved["guard"].get("approvals", {}).get("used"))
        return refund(self, call)  # type: ignore[arg-type]

    monkeypatch.setattr(support_desk.SupportDesk, "_refund", watching)
    runner.drive(task.id)

    assert seen == [[[approval.fingerprint, "order-42-refund"]]]


def test_the_database_lets_an_approval_be_answered_once_and_never_rewritten(
    seeded: None, start: Start, approver: User
) -> None:
    from django.db import DatabaseError, transaction

    _, approval = _held(start)
    rows = Approval.objects.filter(id=approval.id)
    with pytest.raises(DatabaseError, match="answered once"), transaction.atomic():
        rows.update(args={"order": 42, "amount_cents": 999_999})  # the call a person sees
    services.approval_approve(
        approval_id=approval.id, actor=approver, reason="checked", enqueue=lambda _: None
    )

    with pytest.raises(DatabaseError, match="answered once"), transaction.atomic():
        rows.update(state=ApprovalState.REJECTED, reason="changed my mind")
    with pytest.raises(DatabaseError, match="DELETE refused"), transaction.atomic():
        rows._raw_delete(rows.db)  # past the ORM's own refusal (the audit entry protects it)
    assert rows.get().state == ApprovalState.APPROVED
