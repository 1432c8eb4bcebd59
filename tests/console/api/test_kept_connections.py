"""A kept database connection: checked before a request's first statement without a round
trip (console/project/database/), and, dead all the same, replaced on that statement.

The session is really ended from another connection (``pg_terminate_backend``) between two
requests, as a restart or a failover would. ``close_old_connections()`` is what Django does
as each request starts (its test client leaves it out).
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from django.db import close_old_connections, connection, transaction

from console.api.tokens import api_token_forget_checks
from console.models import Task
from console.project.database import base as backend
from console.records.roles import Role
from console.services import task_start
from console.store import open_store
from tests.waiting import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def _other() -> psycopg.Connection[Any]:
    db = connection.settings_dict
    return psycopg.connect(
        host=db["HOST"], port=db["PORT"], user=db["USER"], password=db["PASSWORD"] or None,
        dbname=db["NAME"], autocommit=True,
    )  # fmt: skip


def _end_session(pid: int) -> None:
    """End the database session ``pid`` and wait until the server has let it go."""
    with _other() as other:
        other.execute("SELECT pg_terminate_backend(%s)", [pid])

        def gone() -> bool:
            found = other.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", [pid])
            return found.fetchone() is None

        wait_for(gone, timeout=5, what=f"session {pid} to end")


def _last_statement(pid: int) -> str:
    with _other() as other:
        row = other.execute("SELECT query FROM pg_stat_activity WHERE pid = %s", [pid]).fetchone()
    assert row is not None, f"session {pid} is gone"
    return str(row[0])


def test_the_check_before_a_requests_first_statement_sends_nothing_to_the_server(
    caller: Any,
) -> None:
    viewer = caller(Role.VIEWER)
    assert viewer.get("/api/tasks").status_code == 200
    with connection.cursor() as cursor:
        cursor.execute("SELECT 'the last statement before the check'")
    pid = connection.connection.info.backend_pid
    close_old_connections()  # a request begins: the kept connection is to be checked

    connection.close_if_health_check_failed()

    assert connection.connection is not None and connection.connection.info.backend_pid == pid
    # Django's own check would have sent SELECT 1 on the session.
    assert _last_statement(pid) == "SELECT 'the last statement before the check'"


def test_a_session_ended_between_two_requests_is_replaced_and_the_next_request_answers(
    caller: Any,
) -> None:
    viewer = caller(Role.VIEWER)
    assert viewer.get("/api/tasks").status_code == 200
    pid = connection.connection.info.backend_pid
    _end_session(pid)
    close_old_connections()

    answer = viewer.get("/api/tasks")

    assert answer.status_code == 200, answer.content
    assert connection.connection.info.backend_pid != pid


@pytest.fixture
def unseen_death(monkeypatch: pytest.MonkeyPatch) -> None:
    """The session's end not yet visible on its socket when it is checked (it came a
    moment after the check): the check passes a dead session."""
    monkeypatch.setattr(backend, "session_looks_alive", lambda session: True)


@pytest.mark.usefixtures("unseen_death")
def test_a_dead_session_the_check_missed_is_replaced_on_the_requests_first_statement(
    caller: Any,
) -> None:
    viewer = caller(Role.VIEWER)
    assert viewer.get("/api/tasks").status_code == 200
    pid = connection.connection.info.backend_pid
    _end_session(pid)
    close_old_connections()
    api_token_forget_checks()  # its check run out: the request's first statement is the token's

    answer = viewer.get("/api/tasks")

    assert answer.status_code == 200, answer.content
    assert connection.connection.info.backend_pid != pid


@pytest.mark.usefixtures("unseen_death")
def test_a_transaction_whose_first_statement_met_a_dead_session_goes_on_on_a_new_one(
    caller: Any, enqueued: list[int]
) -> None:
    agent = caller(Role.AGENT)
    task = task_start(agent="test_reader", input={}, actor=agent.user, reason="a test")
    pid = connection.connection.info.backend_pid
    _end_session(pid)
    close_old_connections()

    with transaction.atomic():
        opened = open_store(task.id, "a client").open_step(None)  # the step's first statement
        assert opened is not None and opened[0].id == task.id
        Task.objects.filter(id=task.id).update(detail="written after the replacement")

    assert connection.connection.info.backend_pid != pid
    with _other() as other:  # committed, as one transaction on the new session
        row = other.execute("SELECT detail FROM console_task WHERE id = %s", [task.id]).fetchone()
    assert row == ("written after the replacement",)


@pytest.mark.usefixtures("unseen_death")
def test_a_session_that_dies_after_the_request_used_it_is_not_sent_the_rest_again(
    caller: Any, enqueued: list[int]
) -> None:
    agent = caller(Role.AGENT)
    task = task_start(agent="test_reader", input={}, actor=agent.user, reason="a test")
    close_old_connections()

    with pytest.raises(Exception) as failed, transaction.atomic():
        opened = open_store(task.id, "a client").open_step(None)
        assert opened is not None
        Task.objects.filter(id=task.id).update(detail="lost with its session")
        _end_session(connection.connection.info.backend_pid)
        open_store(task.id, "a client").open_step(None)  # must not go on on a new session

    assert "terminat" in str(failed.value) or "closed" in str(failed.value), failed.value
    connection.close()
    assert Task.objects.get(id=task.id).detail == ""
