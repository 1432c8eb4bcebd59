"""Answering held calls through the API: the same services, roles and audit as the console."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from console.demo.models import Refund
from console.drivers import runner
from console.models import Approval, AuditAction, AuditEntry, Task, TaskState
from console.records.roles import Role

from .helpers import Caller, error

pytestmark = pytest.mark.django_db

Start = Callable[..., Task]




def test_the_pending_calls_are_listed_in_full(
    caller: Callable[..., Caller], held: Approval
) -> None:
    viewer = caller(Role.VIEWER)

    listed = viewer.get("/api/approvals")
    one = viewer.get(f"/api/approvals/{held.id}")

    assert listed.status_code == 200
    (shown,) = listed.json()["approvals"]
    assert shown == one.json()
    assert (shown["id"], shown["task"], shown["agent"]) == (held.id, held.task_id, "support_desk")
    assert (shown["tool"], shown["effect"], shown["state"]) == ("refund", "write", "PENDING")
    assert shown["operation_key"] == "order-42-refund"
    assert shown["fingerprint"] == held.fingerprint
    assert shown["args"] == {"order": 42, "amount_cents": 1500}
    assert shown["decided_by"] is None
    assert shown["approve_url"] == f"/api/approvals/{held.id}/approve"


def test_the_list_filters_by_state_and_refuses_an_unknown_one(
    caller: Callable[..., Caller], held: Approval, enqueued: list[int]
) -> None:
    approver = caller(Role.APPROVER)
    approver.post(f"/api/approvals/{held.id}/approve", {"reason": "checked"})

    pending = approver.get("/api/approvals")
    approved = approver.get("/api/approvals", state="APPROVED")
    rejected = approver.get("/api/approvals", state="REJECTED")
    wrong = approver.get("/api/approvals", state="maybe")

    assert pending.json()["approvals"] == []
    assert [a["id"] for a in approved.json()["approvals"]] == [held.id]
    assert approved.json()["approvals"][0]["decided_by"] == approver.user.get_username()
    assert rejected.json()["approvals"] == []
    assert "unknown state 'maybe'" in error(wrong, 400)
    assert wrong.json()["code"] == "invalid_query"


def test_an_approver_approves_and_the_call_runs_once_in_a_new_phase(
    caller: Callable[..., Caller],
    held: Approval,
    enqueued: list[int],
    django_capture_on_commit_callbacks: Callable[..., Any],
) -> None:
    approver = caller(Role.APPROVER)

    with django_capture_on_commit_callbacks(execute=True):
        answer = approver.post(f"/api/approvals/{held.id}/approve", {"reason": "checked"})

    assert answer.status_code == 200
    assert answer.json()["approval"]["state"] == "APPROVED"
    assert (answer.json()["task"]["state"], answer.json()["task"]["phase"]) == ("QUEUED", 2)
    assert enqueued == [held.task_id]
    entry = AuditEntry.objects.get(action=AuditAction.APPROVE_CALL)
    assert (entry.actor, entry.approval_id, entry.reason) == (approver.user, held.id, "checked")
    assert runner.drive(held.task_id) == "COMPLETED/goal_met"
    assert Refund.objects.count() == 1


def test_a_rejection_may_end_the_task(caller: Callable[..., Caller], held: Approval) -> None:
    admin = caller(Role.ADMIN)

    answer = admin.post(
        f"/api/approvals/{held.id}/reject", {"reason": "fraud suspected", "on_reject": "end"}
    )

    assert answer.status_code == 200
    assert answer.json()["approval"]["on_reject"] == "end"
    assert (answer.json()["task"]["state"], answer.json()["task"]["reason"]) == (
        "PARTIAL",
        "approval_rejected",
    )
    assert Refund.objects.count() == 0


def test_a_rejection_may_tell_the_model_and_go_on(
    caller: Callable[..., Caller], held: Approval, enqueued: list[int]
) -> None:
    answer = caller(Role.APPROVER).post(
        f"/api/approvals/{held.id}/reject", {"reason": "too much", "on_reject": "resume"}
    )

    assert answer.json()["task"]["state"] == "QUEUED"
    assert Task.objects.get(id=held.task_id).state == TaskState.QUEUED


def test_a_second_answer_is_stale(
    caller: Callable[..., Caller], held: Approval, enqueued: list[int]
) -> None:
    approver = caller(Role.APPROVER)
    approver.post(f"/api/approvals/{held.id}/approve", {"reason": "checked"})

    again = approver.post(
        f"/api/approvals/{held.id}/reject", {"reason": "changed my mind", "on_reject": "end"}
    )

    assert "already APPROVED" in error(again, 409)
    assert again.json()["code"] == "stale_state"
    assert AuditEntry.objects.filter(approval=held).count() == 1


@pytest.mark.parametrize("role", [Role.VIEWER, Role.OPERATOR, Role.RECONCILER])
def test_answering_needs_the_approver_role(
    caller: Callable[..., Caller], held: Approval, role: Role
) -> None:
    someone = caller(role)

    approved = someone.post(f"/api/approvals/{held.id}/approve", {"reason": "x"})
    rejected = someone.post(f"/api/approvals/{held.id}/reject", {"reason": "x", "on_reject": "end"})

    assert "approve permission" in error(approved, 403)
    assert "approve permission" in error(rejected, 403)
    assert Approval.objects.get(id=held.id).state == "PENDING"


def test_bad_answers_are_refused_before_anything_changes(
    caller: Callable[..., Caller], held: Approval
) -> None:
    approver = caller(Role.APPROVER)
    url = f"/api/approvals/{held.id}"

    no_reason = approver.post(f"{url}/approve", {"reason": "  "})
    no_choice = approver.post(f"{url}/reject", {"reason": "no"})
    bad_choice = approver.post(f"{url}/reject", {"reason": "no", "on_reject": "later"})
    typo = approver.post(f"{url}/approve", {"reasn": "ok"})

    assert "reason is required" in error(no_reason, 400)
    assert "on_reject must be one of: resume, end" in error(no_choice, 400)
    assert "on_reject must be one of" in error(bad_choice, 400)
    assert "unknown field(s): reasn" in error(typo, 400)
    assert Approval.objects.get(id=held.id).state == "PENDING"
    assert not AuditEntry.objects.filter(approval=held).exists()


def test_an_unknown_approval_is_not_found(caller: Callable[..., Caller], held: Approval) -> None:
    approver = caller(Role.APPROVER)

    read = approver.get("/api/approvals/987654")
    approved = approver.post("/api/approvals/987654/approve", {"reason": "ok"})

    assert "no approval 987654" in error(read, 404)
    assert "no approval 987654" in error(approved, 404)
    assert approved.json()["code"] == "not_found"
