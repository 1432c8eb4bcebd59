"""The MCP gateway holds a call that needs a person's approval (``"approval": true``) until
one decides on the console: the SDK's own client over stdio, the gateway's process, the
shop upstream and a live console on the real PostgreSQL (as in ``test_mcp_gateway``). The
person answers from another thread, through the service functions, while the MCP call is
in flight; "reached the server" is read from the shop's own records."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from django.contrib.auth.models import User

from console import services
from console.models import Approval, ApprovalState, Operation, OperationState, Task, TaskState
from tests.waiting import wait_for

from . import test_mcp_gateway as _gateway
from .test_mcp_gateway import Gateway, effects, in_thread, live, stdio_shop, text

pytest.importorskip("mcp")

from mcp import Client

# The gateway test's fixtures, used here by name.
_no_proxy, token, person = _gateway._no_proxy, _gateway.token, _gateway.person
gateway, db = _gateway.gateway, _gateway.db

HELD = {"send_refund": {"key": "refund-{order}", "approval": True}}


def _config(db: Path, **extra: Any) -> dict[str, Any]:
    return {"servers": {"shop": stdio_shop(db)}, "tools": HELD, **extra}


def _answer_when_held(answer: Callable[[Approval], None]) -> Callable[[], Approval]:
    """In the test's thread: wait for the call to be on the approval queue, then answer
    it as a person on the console would."""

    def work() -> Approval:
        held = wait_for(
            lambda: Approval.objects.filter(state=ApprovalState.PENDING).first(),
            timeout=30,
            what="the call to wait for approval",
        )
        answer(held)
        return held

    return work


@live
@pytest.mark.slow
def test_an_approved_call_runs_once_after_a_person_says_yes(
    gateway: Gateway, db: Path, person: User
) -> None:
    seen: dict[str, Any] = {}

    def approve(held: Approval) -> None:
        seen["before"] = effects(db, "refund")  # nothing reached the shop while held
        seen["held"] = (held.tool, held.args, held.operation_key)
        services.approval_approve(approval_id=held.id, actor=person, reason="refund is fine")

    async def scenario(client: Client) -> Any:
        async with anyio.create_task_group() as group:
            group.start_soon(in_thread, _answer_when_held(approve))
            answered = await client.call_tool("send_refund", {"order": 2})
        return answered

    answered = gateway.session(_config(db), scenario)
    assert not answered.is_error, text(answered)
    assert seen["before"] == []
    assert seen["held"] == ("send_refund", {"order": 2}, "refund-2")
    assert effects(db, "refund") == [2]  # run once, after the yes
    assert Operation.objects.get(key="refund-2").state == OperationState.COMMITTED
    task = Task.objects.get()
    # The resumed phase ran it; the session's end then ended the task as any session's.
    assert (task.phase, task.executions, task.reason) == (2, 1, "goal_unverified")
    assert task.approval_tools == ["send_refund"]


@live
@pytest.mark.slow
def test_a_rejected_call_is_told_plainly_and_never_runs(
    gateway: Gateway, db: Path, person: User
) -> None:
    def reject(held: Approval) -> None:
        services.approval_reject(
            approval_id=held.id, actor=person, reason="over the refund limit", resume=False
        )

    async def scenario(client: Client) -> Any:
        async with anyio.create_task_group() as group:
            group.start_soon(in_thread, _answer_when_held(reject))
            answered = await client.call_tool("send_refund", {"order": 3})
        return answered, await client.call_tool("send_refund", {"order": 4})

    answered, later = gateway.session(_config(db), scenario)
    said = text(answered)
    assert answered.is_error and "a person rejected this call to send_refund" in said
    assert "over the refund limit" in said and "do not ask for it again" in said
    assert "try again" not in said
    assert later.is_error and "approval_rejected" in text(later)
    assert effects(db, "refund") == []
    task = Task.objects.get()
    assert (task.state, task.reason, task.executions) == (TaskState.PARTIAL, "approval_rejected", 0)


@live
@pytest.mark.slow
def test_a_call_nobody_decides_on_is_answered_that_it_waits_and_stays_held(
    gateway: Gateway, db: Path
) -> None:
    async def scenario(client: Client) -> Any:
        return await client.call_tool("send_refund", {"order": 5})

    answered = gateway.session(_config(db, approval_wait_seconds=1.5), scenario)
    said = text(answered)
    assert answered.is_error and "waits for a person's approval" in said
    assert effects(db, "refund") == []
    task = Task.objects.get()
    assert (task.state, task.reason) == (TaskState.NEEDS_HUMAN, "approval_required")
    assert Approval.objects.get().state == ApprovalState.PENDING


@live
@pytest.mark.slow
def test_a_call_rejected_with_the_task_let_go_on_is_told_plainly_and_never_runs(
    gateway: Gateway, db: Path, person: User
) -> None:
    def reject(held: Approval) -> None:
        services.approval_reject(
            approval_id=held.id, actor=person, reason="not this one", resume=True
        )

    async def scenario(client: Client) -> Any:
        async with anyio.create_task_group() as group:
            group.start_soon(in_thread, _answer_when_held(reject))
            answered = await client.call_tool("send_refund", {"order": 6})
        return answered

    answered = gateway.session(_config(db), scenario)
    said = text(answered)
    assert answered.is_error and "a person rejected this call to send_refund" in said
    assert "not this one" in said and "do not ask for it again" in said
    assert effects(db, "refund") == []
    task = Task.objects.get()
    assert (task.phase, task.state, task.reason) == (2, TaskState.PARTIAL, "approval_rejected")
