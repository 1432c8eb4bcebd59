"""What the step protocol answers where a client written from docs/protocol.md alone
found it out of step with the document: a Stop heard at the tools step, a stop report that
names who stopped the task, errors in the protocol's words."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from console import services
from console.models import StopReport, Task, TaskState
from console.roles import Role

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
