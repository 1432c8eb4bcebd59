"""What the step protocol answers where a client written from docs/protocol.md alone
found it out of step with the document: a Stop heard at the tools step, a stop report that
names who stopped the task, errors in the protocol's words."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from console import services
from console.models import AuditEntry, StopReport, Task, TaskState
from console.records.roles import Role

from .helpers import Caller
from .test_attached import Client


@pytest.fixture
def started(caller: Callable[..., Caller]) -> Client:
    client = Client(caller(Role.AGENT))
    assert client.start().status_code == 201
    return client


def _stopped_by_an_operator(client: Client, caller: Callable[..., Caller]) -> Caller:
    operator = caller(Role.OPERATOR, username="ops-anna")
    services.task_stop(task_id=client.task, actor=operator.user, reason="the desk is closing")
    return operator


def test_a_tools_step_after_a_stop_answers_the_stop_and_admits_nothing(
    started: Client, caller: Callable[..., Caller]
) -> None:
    started.step("model")
    _stopped_by_an_operator(started, caller)
    answer = started.step("tools", calls=[{"tool": "lookup", "args": {"n": 1}}])
    assert "admitted" not in answer
    assert (answer["state"], answer["stop"]["reason"]) == (TaskState.CANCELLED, "operator_stop")


def test_an_operators_stop_report_names_who_stopped_the_task_and_why(
    started: Client, caller: Callable[..., Caller]
) -> None:
    _stopped_by_an_operator(started, caller)
    stop = started.step("model")["stop"]
    assert stop["detail"] == "stopped by ops-anna: the desk is closing"
    stored = StopReport.objects.get(task_id=started.task).report
    assert stored["detail"] == stop["detail"]


def test_every_step_after_the_stop_answers_the_same_report_and_charges_nothing(
    started: Client, caller: Callable[..., Caller]
) -> None:
    started.step("model", reserve=0)
    _stopped_by_an_operator(started, caller)
    first = started.step("model")["stop"]
    spent = Task.objects.values_list("tokens", "spend").get(id=started.task)
    late = started.step("model", usage={"tokens": 40, "cost": 3})
    assert late["stop"] == first  # terminal is sticky: 200 with the report...
    assert Task.objects.values_list("tokens", "spend").get(id=started.task) == spent  # ...free


def test_a_secret_in_what_a_client_says_of_itself_is_masked_everywhere(
    caller: Callable[..., Caller],
) -> None:
    secret = "sk-live-4f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c"
    client = Client(caller(Role.AGENT))
    assert client.start(client=f"refund-service/2 key={secret}").status_code == 201
    admin = caller(Role.ADMIN)
    from django.test import Client as Browser

    browser = Browser()
    browser.force_login(admin.user)
    shown = [
        admin.get(f"/api/tasks/{client.task}").content,
        admin.get("/api/tasks").content,
        browser.get("/tasks/").content,
        browser.get(f"/tasks/{client.task}/").content,
        browser.get("/audit/").content,
        b"".join(browser.get("/audit.csv").streaming_content),
        b"".join(browser.get("/audit.json").streaming_content),
    ]
    assert all(secret.encode() not in page for page in shown)
    task = Task.objects.get(id=client.task)
    assert secret not in task.client and task.client.startswith("refund-service/2")
    assert all(secret not in str(entry.reason) + str(entry.after)
               for entry in AuditEntry.objects.filter(task=task))  # fmt: skip
