"""A kept database connection under attached steps: a step's first statement, a read, is the
session's health check (no ``SELECT 1`` before it, console/store/statements.py), and a
session found dead by it is replaced and the read sent again.

The session is really ended from another connection (``pg_terminate_backend``) between two
requests, as a restart or a failover would. ``close_old_connections()`` is what Django does
as each request starts (its test client leaves it out).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.db import close_old_connections, connection

from console.models import StepRequest, Task
from console.records.roles import Role
from tests.databases import end_session

from .helpers import Caller
from .test_attached import Client

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def started(caller: Callable[..., Caller]) -> Client:
    client = Client(caller(Role.AGENT))
    assert client.start().status_code == 201
    client.step("model")
    return client


def _lookup(n: int) -> list[dict[str, Any]]:
    return [{"tool": "lookup", "args": {"n": n}}]


def test_a_steps_read_is_the_kept_sessions_health_check(
    started: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    pid = connection.connection.info.backend_pid
    close_old_connections()  # a request begins: the kept connection is to be checked
    checks: list[bool] = []
    is_usable = connection.is_usable
    monkeypatch.setattr(connection, "is_usable", lambda: checks.append(True) or is_usable())

    answer = started.step("tools", calls=_lookup(1), enter=True)

    assert answer["action"] == "execute"
    assert checks == []  # Django's SELECT 1 was not sent: the read checked the session
    assert connection.connection.info.backend_pid == pid


def test_a_session_ended_between_two_requests_is_replaced_by_the_steps_read(
    started: Client,
) -> None:
    before = Task.objects.get(id=started.task)
    pid = connection.connection.info.backend_pid
    end_session(pid)
    close_old_connections()

    answer = started.step("tools", calls=_lookup(1), enter=True)

    assert answer["action"] == "execute"
    assert connection.connection.info.backend_pid != pid
    task = Task.objects.get(id=started.task)
    assert task.requests == before.requests + 1  # the step happened once
    result = {"kind": "SUCCESS", "data": {"n": 1}}
    assert started.step("result", ticket=0, result=result, then="model")["allowed"] is True
    assert StepRequest.objects.filter(task_id=started.task).exclude(step="start").count() == 3
