"""An operator stops an attached agent from the browser; the agent hears it at its next
step and runs no other tool.

The agent runs its own loop in this process (a thread), asking the live console's guard
over HTTP with ``guard.remote`` before each model call and each tool: the operator sees its
task on the console like any other, marked attached, its trace growing live, and presses
Stop. No tool starts after the stop is recorded.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from django.contrib.auth.models import User
from playwright.sync_api import expect

from console.api.tokens import api_token_issue
from console.models import StepRequest, Task, TaskState
from console.records.roles import Role
from guard import Call, Kind, Report, Result
from guard.remote import RemoteGuard
from guard.steps import Action
from tests.workers import wait_for

from .conftest import BROWSER_TEST, Console

pytestmark = BROWSER_TEST

LIMITS = {"deadline_ms": 120_000, "model_calls": 200, "requests": 200, "executions": 200}


class PageReader:
    """An attached agent reading the incident log page after page until it is stopped."""

    def __init__(self, url: str, token: str) -> None:
        self.guard = RemoteGuard.start(
            url, token=token, agent="log-reader", client="my-service/2 (guard.remote)",
            tools={"read_page": "read"}, limits=LIMITS,
        )  # fmt: skip
        self.started: list[float] = []  # when each tool execution began (wall clock)
        self.report: Report | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        guard, page = self.guard, 0
        while self.report is None:
            if (stop := guard.before_model()) is not None:
                self.report = stop
                break
            page += 1
            admitted = guard.before_tools(Call("read_page", {"page": page}))
            if isinstance(admitted, Report):
                self.report = admitted
                break
            assert isinstance(admitted, list)
            (ticket,) = admitted
            decision = guard.before_tool(ticket)
            if decision.action is not Action.EXECUTE:
                self.report = decision.report
                break
            self.started.append(time.time())
            time.sleep(0.3)  # reading a page takes a while
            result = Result(Kind.SUCCESS, f"page {page}: {page * 3} events")
            self.report = guard.after_tool(ticket, result, inspect=None)
            if self.report is None and isinstance(pause := guard.before_wait(), Report):
                self.report = pause
        guard.close()


def test_an_operator_stops_an_attached_agent_from_the_browser_before_its_next_tool(
    console: Console, people: dict[Role, User], live_server: Any
) -> None:
    agent_user = people[Role.AGENT]
    secret = api_token_issue(user=agent_user, name="e2e")[1]
    reader = PageReader(str(live_server.url), secret)
    reader.thread.start()
    wait_for(lambda: len(reader.started) >= 2, timeout=20, what="the agent to read two pages")

    page = console.sign_in(people[Role.OPERATOR])
    page.goto(f"/tasks/{reader.guard.task}/")
    status = page.locator("#status")
    expect(status).to_contain_text("attached · driven by my-service/2 (guard.remote)")
    expect(page.locator("#trace-rows")).to_contain_text("read_page")
    page.get_by_role("link", name="Stop…").click()
    page.get_by_label("Reason").fill("the log is read enough")
    page.get_by_role("button", name="Stop the task").click()

    reader.thread.join(timeout=20)
    assert reader.report is not None
    assert (reader.report.state, reader.report.reason) == ("CANCELLED", "operator_stop")
    task = Task.objects.get(id=reader.guard.task)
    assert task.state == TaskState.CANCELLED and task.stop_requested_at is not None
    stopped_at = task.stop_requested_at.timestamp()
    # Every execution was allowed by a call step committed before the stop: both hold the
    # task's row, so the stop's time is taken after any step that decided first. A tool
    # allowed just before the stop may start a moment after it (its answer on the way),
    # only the last one; none is allowed after it.
    allowed = [
        answered.at.timestamp()
        for answered in StepRequest.objects.filter(task_id=task.id, step="call")
        if answered.answer.get("action") == "execute"
    ]
    assert allowed and max(allowed) < stopped_at, "a tool was allowed after the stop"
    assert task.executions == len(reader.started) == len(allowed)
    assert not [t for t in reader.started[:-1] if t > stopped_at], "a tool started after the stop"
    page.reload()
    expect(page.locator("#status")).to_contain_text("CANCELLED")
    expect(page.locator("#status")).to_contain_text("operator_stop")
