"""A committed result means one thing: the tool's data, which the agent is given as the
reused result's data. A whole result sent in its place would reach the agent wrapped twice,
so it is refused and nothing changes (issue 22)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from console import services
from console.models import AuditEntry, Operation, OperationState, Task, TaskState
from console.records.roles import Role

from .helpers import Caller, error, unknown_operation
from .test_attached import Client

pytestmark = pytest.mark.django_db

Start = Callable[..., Task]
WRAPPED = {"kind": "SUCCESS", "data": {"y": 2}}


@pytest.fixture
def started(caller: Callable[..., Caller]) -> Client:
    client = Client(caller(Role.AGENT))
    assert client.start().status_code == 201
    return client


def _lost_write(client: Client, key: str) -> dict[str, Any]:
    """A refund whose response was lost: its operation is UNKNOWN, the task stops for a
    person. Returns the refund's arguments, for asking for it again."""
    args = {"order": 7, "cents": 700}
    client.call("refund", args, key)
    lost = {"type": "ConnectionError", "message": "reset", "transient": True}
    client.step("result", ticket=0, error=lost)
    assert Operation.objects.get(key=key).state == OperationState.UNKNOWN
    return args


def _reused_after(client: Client, args: dict[str, Any], key: str, approver: Caller) -> Any:
    """Resume the task and let a new process ask for the write again: what it is handed."""
    services.task_approve_resumption(task_id=client.task, actor=approver.user, reason="ok")
    again = Client(client.caller, lease="new-process")
    again.task = client.task
    reused = again.call("refund", args, key)
    assert reused["action"] == "reuse"
    return reused["result"]


def test_a_reconcilers_result_reaches_the_agent_as_the_data_it_sent_wrapped_once(
    started: Client, caller: Callable[..., Caller], enqueued: list[int]
) -> None:
    key = "order/7/refund"
    args = _lost_write(started, key)
    reconciler = caller(Role.RECONCILER)

    answer = reconciler.post(
        f"/api/operations/{key}/resolve",
        {"committed": True, "evidence": "refund r-7 in the desk", "result": {"y": 2}},
    )

    assert answer.status_code == 200
    result = _reused_after(started, args, key, caller(Role.APPROVER))
    assert (result["kind"], result["data"]) == ("SUCCESS", {"y": 2})


@pytest.mark.parametrize(
    "sent",
    [
        WRAPPED,
        {"kind": "SUCCESS"},
        {"kind": "FATAL", "data": None, "wait_ms": None, "attempts": 1},
        {"kind": "PENDING", "data": "job-4", "wait_ms": 500},
    ],
)
def test_a_whole_result_sent_as_the_result_is_a_400_that_changes_nothing(
    admin: Caller, start: Start, sent: dict[str, Any]
) -> None:
    op = unknown_operation(start("test_notices", {"count": 1}))
    body = {"committed": True, "evidence": "refund R-17 in the ledger", "result": sent}

    answer = admin.post(f"/api/operations/{op.key}/resolve", body)

    assert "send the data alone" in error(answer, 400)
    assert answer.json()["code"] == "invalid_input"
    op.refresh_from_db()
    assert (op.state, op.result) == (OperationState.UNKNOWN, None)
    assert not AuditEntry.objects.filter(operation=op).exists()


@pytest.mark.parametrize(
    "data",
    [
        {"kind": "refund", "id": 3},  # "kind" of the business system's own, not a result's
        {"kind": "SUCCESS", "order": 4},  # more than a result holds: this is data
        [{"kind": "SUCCESS", "data": 1}],  # a list of such things is data too
        "R-17",
    ],
)
def test_data_that_merely_mentions_a_kind_is_stored_as_it_was_sent(
    admin: Caller, start: Start, data: Any
) -> None:
    op = unknown_operation(start("test_notices", {"count": 1}))
    body = {"committed": True, "evidence": "refund R-17 in the ledger", "result": data}

    assert admin.post(f"/api/operations/{op.key}/resolve", body).status_code == 200

    op.refresh_from_db()
    assert op.state == OperationState.COMMITTED and op.result is not None
    assert (op.result["kind"], op.result["data"]) == ("SUCCESS", data)


def test_after_a_refused_whole_result_the_data_alone_is_taken_and_reused_once(
    started: Client, caller: Callable[..., Caller], enqueued: list[int]
) -> None:
    key = "order/7/refund"
    args = _lost_write(started, key)
    reconciler = caller(Role.RECONCILER)
    url = f"/api/operations/{key}/resolve"
    refused = reconciler.post(url, {"committed": True, "evidence": "r-7", "result": WRAPPED})
    assert refused.status_code == 400
    assert Task.objects.get(id=started.task).state == TaskState.NEEDS_HUMAN

    taken = reconciler.post(url, {"committed": True, "evidence": "r-7", "result": {"y": 2}})

    assert taken.status_code == 200
    assert _reused_after(started, args, key, caller(Role.APPROVER))["data"] == {"y": 2}


def test_the_api_document_says_what_a_result_is(admin: Caller) -> None:
    document = admin.get("/api/openapi.json").json()
    result = document["components"]["schemas"]["ResolveOperation"]["properties"]["result"]

    assert "the tool's data" in result["description"]
    assert "wrapped twice" in result["description"]
