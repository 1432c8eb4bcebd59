"""Approval before an attached tool's call, with the Python client ``guard.remote`` over real
HTTP against a live console (pytest-django's live server on the real PostgreSQL): the call
is held, a person approves it through the API, a new process attaches to the resumed task
and the same call proposed again runs once."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from console.models import Task
from console.records.roles import Role
from guard import Call, Kind, Report, Result
from guard.remote import RemoteGuard
from guard.steps import Action, Decision

from .test_attached_live import LIMITS, api, token, url  # noqa: F401 - fixtures, by name

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

TOOLS = {"lookup": "read", "refund": "write"}
REFUND = Call("refund", {"order": 7, "amount": 120}, "write", "order-7-refund")


def _entered(guard: RemoteGuard, call: Call) -> tuple[Any, Decision]:
    assert guard.before_model() is None
    admitted = guard.before_tools(call)
    assert isinstance(admitted, list), admitted
    (ticket,) = admitted
    return ticket, guard.before_tool(ticket)


def test_a_remote_guard_asks_for_approval_and_runs_the_approved_call_once_on_attach(
    url: str,  # noqa: F811
    token: Callable[[Role], str],  # noqa: F811
) -> None:
    agent, approver = token(Role.AGENT), token(Role.APPROVER)
    with RemoteGuard.start(
        url, token=agent, agent="desk", tools=TOOLS, limits=LIMITS, approval=["refund"]
    ) as guard:
        _, decision = _entered(guard, REFUND)
        assert decision.action is Action.STOP
        report = guard.report
        assert report is not None and report.reason == "approval_required"
        assert report.pending is not None
        assert (report.pending["tool"], report.pending["args"]) == ("refund", REFUND.args)
    (held,) = api(url, approver, "GET", "/api/approvals")["approvals"]
    api(url, approver, "POST", f"/api/approvals/{held['id']}/approve", {"reason": "fine"})

    with RemoteGuard.attach(url, token=agent, task=guard.task) as again:
        assert again.report is None  # the resumed phase, taken with a new lease
        ticket, decision = _entered(again, REFUND)
        assert decision.action is Action.EXECUTE
        assert again.after_tool(ticket, Result(Kind.SUCCESS, "refunded"), inspect=None) is None
        other = Call("refund", {"order": 8, "amount": 5}, "write", "order-8-refund")
        _, refused = _entered(again, other)
        assert refused.action is Action.STOP
        assert isinstance(again.report, Report) and again.report.reason == "approval_required"
    task = Task.objects.get(id=guard.task)
    assert (task.phase, task.executions, task.approval_tools) == (2, 1, ["refund"])


def test_approval_is_a_list_of_names_not_one_name(url: str) -> None:  # noqa: F811
    with pytest.raises(TypeError, match="list of tool names"):
        RemoteGuard.start(url, token="unused", agent="desk", tools=TOOLS, approval="refund")
