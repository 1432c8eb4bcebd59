"""Approval before an attached tool's call (docs/protocol.md, "Approval"): a call to a tool
named in the start's ``approval`` never runs before a person approves that exact call; the
client proposes it again in the resumed phase and it is admitted once. Through the API on
real PostgreSQL, the protocol spoken by hand."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from console import services
from console.models import Approval, ApprovalState, Operation, Task, TaskState
from console.records.roles import Role

from .helpers import Caller, error
from .test_attached import Client

REFUND = {"order": 7, "amount": 120}
KEY = "order/7/refund"


@pytest.fixture
def agent(caller: Callable[..., Caller]) -> Client:
    client = Client(caller(Role.AGENT))
    assert client.start(approval=["refund"]).status_code == 201
    return client


@pytest.fixture
def approver(caller: Callable[..., Caller]) -> Caller:
    return caller(Role.APPROVER)


def _held(agent: Client) -> tuple[dict[str, Any], Approval]:
    """The client proposes the refund; the console holds it for a person."""
    answer = agent.call("refund", REFUND, KEY)
    approval = Approval.objects.get(task_id=agent.task, state=ApprovalState.PENDING)
    return answer, approval


def _proposed(agent: Client, args: dict[str, Any] = REFUND, key: str = KEY) -> dict[str, Any]:
    """A model call proposing one refund, up to its decision (with the call's ticket)."""
    assert agent.step("model")["allowed"] is True
    call = {"tool": "refund", "args": args, "operation_key": key}
    tools = agent.step("tools", calls=[call])
    if tools["stop"] is not None:
        return tools
    (ticket,) = tools["admitted"]
    return agent.step("call", ticket=ticket["ticket"]) | {"ticket": ticket["ticket"]}


def _refund_runs(agent: Client) -> dict[str, Any]:
    """Propose the refund as the model asks again; run it if told to, report it."""
    answer = _proposed(agent)
    assert answer.get("action") == "execute", answer
    return agent.step("result", ticket=answer["ticket"], result={"kind": "SUCCESS", "data": 1})


def test_a_call_needing_approval_stops_for_a_person_and_never_enters_the_tool(
    agent: Client,
) -> None:
    answer, approval = _held(agent)
    assert answer.get("action") != "execute"
    assert (answer["stop"]["state"], answer["stop"]["reason"]) == (
        "NEEDS_HUMAN",
        "approval_required",
    )
    pending = answer["stop"]["pending"]
    assert (pending["tool"], pending["args"], pending["operation_key"]) == ("refund", REFUND, KEY)
    assert (approval.tool, approval.args, approval.operation_key) == ("refund", REFUND, KEY)
    task = Task.objects.get(id=agent.task)
    assert (task.state, task.executions) == (TaskState.NEEDS_HUMAN, 0)
    assert not Operation.objects.filter(key=KEY).exists()  # never claimed, never run


def test_a_read_that_needs_no_approval_runs_as_before(agent: Client) -> None:
    answer = agent.call("lookup", {"n": 1})
    assert answer["action"] == "execute"


def test_the_approved_call_runs_once_when_the_client_asks_again(
    agent: Client, approver: Caller
) -> None:
    _, approval = _held(agent)
    services.approval_approve(approval_id=approval.id, actor=approver.user, reason="refund ok")
    task = Task.objects.get(id=agent.task)
    assert (task.state, task.phase) == (TaskState.QUEUED, 2)
    # The console ran nothing on the approval: the client's next steps take the task.
    assert not Operation.objects.filter(key=KEY).exists()

    reported = _refund_runs(agent)
    assert reported["stop"] is None, reported
    operation = Operation.objects.get(key=KEY)
    assert operation.state == "COMMITTED"
    assert Task.objects.get(id=agent.task).executions == 1

    # Used once. The same call asked again runs nothing: the ledger holds it committed, so
    # its stored result is reused (no person is asked to approve what will not run).
    again = _proposed(agent)
    assert again["action"] == "reuse", again
    assert agent.step("result", ticket=again["ticket"])["stop"] is None
    # Another refund would run: it waits for a person again.
    other = _proposed(agent, {"order": 8, "amount": 120}, key="order/8/refund")
    assert other.get("action") is None
    assert (other["stop"]["state"], other["stop"]["reason"]) == (
        "NEEDS_HUMAN",
        "approval_required",
    )
    assert Task.objects.get(id=agent.task).executions == 1
    assert Approval.objects.filter(task_id=agent.task, state=ApprovalState.PENDING).count() == 1


def test_an_approval_is_for_that_call_only(agent: Client, approver: Caller) -> None:
    _, approval = _held(agent)
    services.approval_approve(approval_id=approval.id, actor=approver.user, reason="ok")
    other = agent.call("refund", {"order": 7, "amount": 9_999}, KEY)
    assert other.get("action") != "execute"
    assert (other["stop"]["state"], other["stop"]["reason"]) == (
        "NEEDS_HUMAN",
        "approval_required",
    )
    assert other["stop"]["pending"]["args"] == {"order": 7, "amount": 9_999}
    assert Task.objects.get(id=agent.task).executions == 0


def test_a_rejection_ends_the_task_and_the_client_is_told_plainly(
    agent: Client, approver: Caller
) -> None:
    _, approval = _held(agent)
    services.approval_reject(
        approval_id=approval.id, actor=approver.user, reason="over the limit", resume=False
    )
    answer = agent.step("model")
    assert (answer["state"], answer["stop"]["reason"]) == ("PARTIAL", "approval_rejected")
    assert "a person rejected the call to refund: over the limit" in answer["stop"]["detail"]
    assert not Operation.objects.filter(key=KEY).exists()


def test_after_a_rejection_that_resumes_the_call_asked_again_ends_the_task(
    agent: Client, approver: Caller
) -> None:
    _, approval = _held(agent)
    services.approval_reject(
        approval_id=approval.id, actor=approver.user, reason="no refunds", resume=True
    )
    answer = agent.call("refund", REFUND, KEY)
    assert answer.get("action") != "execute"
    assert (answer["stop"]["state"], answer["stop"]["reason"]) == ("PARTIAL", "approval_rejected")
    assert "no refunds" in answer["stop"]["detail"]


@pytest.mark.parametrize(
    ("approval", "said"),
    [
        ("refund", "must be a list of tool names"),
        ([1], "must be a list of tool names"),
        (["refnud"], "not among the declared tools"),
        ([f"t{n}" for n in range(201)], "more than 200"),
    ],
)
def test_a_bad_approval_is_refused_and_starts_nothing(
    caller: Callable[..., Caller], approval: Any, said: str
) -> None:
    client = Client(caller(Role.AGENT))
    before = Task.objects.count()
    assert said in error(client.start(approval=approval), 400)
    assert Task.objects.count() == before


def test_a_task_started_without_approval_asks_no_one(caller: Callable[..., Caller]) -> None:
    client = Client(caller(Role.AGENT))
    assert client.start().status_code == 201
    assert client.call("refund", REFUND, KEY)["action"] == "execute"


def test_another_person_cannot_see_or_drive_the_held_task(
    agent: Client, approver: Caller, caller: Callable[..., Caller]
) -> None:
    _, approval = _held(agent)
    services.approval_approve(approval_id=approval.id, actor=approver.user, reason="ok")
    stranger = Client(caller(Role.AGENT, username="stranger"))
    stranger.task = agent.task
    error(stranger.send("model"), 404)
    error(stranger.send("heartbeat"), 404)
    # Nothing the stranger sent took the task or spent its approval.
    assert _refund_runs(agent)["stop"] is None
    assert Task.objects.get(id=agent.task).executions == 1


def test_an_approved_read_runs_once_and_asked_again_waits_for_a_person_again(
    caller: Callable[..., Caller], approver: Caller
) -> None:
    # A read has no ledger entry to reuse: only the approval's being used up stops it.
    client = Client(caller(Role.AGENT))
    assert client.start(approval=["lookup"]).status_code == 201
    assert client.call("lookup", {"n": 1})["stop"]["reason"] == "approval_required"
    approval = Approval.objects.get(task_id=client.task, state=ApprovalState.PENDING)
    services.approval_approve(approval_id=approval.id, actor=approver.user, reason="ok")
    assert _runs(client, "lookup", {"n": 1})["stop"] is None
    again = client.call("lookup", {"n": 1})
    assert again.get("action") is None
    assert (again["stop"]["state"], again["stop"]["reason"]) == (
        "NEEDS_HUMAN",
        "approval_required",
    )
    assert Task.objects.get(id=client.task).executions == 1


def _runs(client: Client, tool: str, args: dict[str, Any]) -> dict[str, Any]:
    assert client.step("model")["allowed"] is True
    (ticket,) = client.step("tools", calls=[{"tool": tool, "args": args}])["admitted"]
    assert client.step("call", ticket=ticket["ticket"])["action"] == "execute"
    return client.step("result", ticket=ticket["ticket"], result={"kind": "SUCCESS", "data": 1})


def test_a_task_written_by_code_from_before_the_field_still_saves_and_asks_for_none(
    agent: Client,
) -> None:
    """Migration 0024 runs while the console's old processes still serve (docs/deployment.md):
    their inserts do not name ``approval_tools``, and the column's default answers for it."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_name = 'console_task'"
            " AND column_name NOT IN ('id', 'approval_tools') ORDER BY ordinal_position"
        )
        columns = ", ".join(f'"{name}"' for (name,) in cursor.fetchall())
        cursor.execute(
            f"INSERT INTO console_task ({columns}) SELECT {columns} FROM console_task"  # noqa: S608
            " WHERE id = %s RETURNING id",
            [agent.task],
        )
        (copied,) = cursor.fetchone()
    assert Task.objects.get(id=agent.task).approval_tools == ["refund"]
    assert Task.objects.get(id=copied).approval_tools == []
