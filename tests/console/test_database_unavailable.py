"""What a request answers when the database drops its connection, in-process: a kept
connection that died while idle is replaced before the request's first statement; one lost
during the request is a 503 with ``Retry-After`` (the API's JSON error, or a plain page),
never a 500.

The connection is really cut: right before a chosen statement, the session is terminated
from another connection (``pg_terminate_backend``), so that the statement meets a dead
connection as it would after a restart or a failover. The live gunicorn console meets the
same in tests/console/test_database_cut.py.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import close_old_connections, connection
from django.test import Client
from pytest_django import Settings

from console.api.tokens import api_token_issue
from console.api.views import DATABASE_RETRY_AFTER_SECONDS
from console.models import Task
from console.records.roles import Role, assign
from tests.databases import end_session

pytestmark = pytest.mark.django_db(transaction=True)

RETRY_AFTER = str(DATABASE_RETRY_AFTER_SECONDS)


@contextmanager
def cut_before(marker: str) -> Iterator[list[str]]:
    """Terminate this thread's database session right before the first statement whose
    text holds ``marker``; yields the statements that were cut."""
    cut: list[str] = []

    def wrapper(execute: Callable[..., Any], sql: Any, params: Any, many: bool, context: Any
                ) -> Any:  # fmt: skip
        text = sql.decode() if isinstance(sql, bytes) else str(sql)
        if not cut and marker in text:
            cut.append(text)
            end_session(context["connection"].connection.info.backend_pid)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(wrapper):
        yield cut
    connection.close()  # dead: the next test's statements open another


def _token(role: Role) -> str:
    user = User.objects.create_user(f"{role.value}-{User.objects.count()}")
    assign(user, [role])
    return api_token_issue(user=user, name="tests")[1]


def _api(secret: str) -> Client:
    return Client(headers={"authorization": f"Bearer {secret}"}, raise_request_exception=False)


@pytest.fixture(params=[True, False], ids=["debug-on", "debug-off"])
def debug(request: pytest.FixtureRequest, settings: Settings) -> bool:
    """DEBUG on (``manage.py up``'s default: Django logs every statement) and off."""
    settings.DEBUG = request.param
    return bool(request.param)


def test_a_kept_connection_that_died_while_idle_is_replaced_before_the_tokens_statement(
    debug: bool,
) -> None:
    client = _api(_token(Role.VIEWER))
    assert client.get("/api/tasks").status_code == 200
    end_session(connection.connection.info.backend_pid)
    # What Django does as each request starts (its test client leaves it out): the kept
    # connection is to be checked before its first statement.
    close_old_connections()

    answer = client.get("/api/tasks")

    assert answer.status_code == 200, answer.content


@pytest.mark.parametrize("marker", ["console_apitoken", 'FROM "console_task"'])
def test_a_connection_lost_during_an_api_request_is_a_503_with_retry_after(
    debug: bool, marker: str
) -> None:
    client = _api(_token(Role.VIEWER))

    with cut_before(marker) as cut:
        answer = client.get("/api/tasks")

    assert cut, f"no statement held {marker!r}"
    assert answer.status_code == 503
    assert answer["Retry-After"] == RETRY_AFTER
    assert answer.json()["code"] == "database_unavailable"
    assert "database" in answer.json()["error"]
    assert _api(_token(Role.VIEWER)).get("/api/tasks").status_code == 200  # and then it is back


def test_a_write_cut_short_is_a_503_and_nothing_of_it_is_kept() -> None:
    client = _api(_token(Role.ADMIN))
    body = {"agent": "test_reader", "input": {"n": 1}}

    with cut_before('INSERT INTO "console_task"') as cut:
        answer = client.post("/api/tasks", body, content_type="application/json")

    assert cut and answer.status_code == 503 and answer["Retry-After"] == RETRY_AFTER
    assert not Task.objects.exists()


def test_a_page_whose_session_cannot_be_read_is_a_plain_503_with_retry_after(
    debug: bool,
) -> None:
    person = User.objects.create_user("olga", password="pw-olga")
    assign(person, [Role.VIEWER])
    browser = Client(raise_request_exception=False)
    browser.force_login(person)

    # The sign-in check loads the session in a middleware, before any view runs.
    with cut_before("django_session") as cut:
        page = browser.get("/")

    assert cut and page.status_code == 503
    assert page["Retry-After"] == RETRY_AFTER
    assert page["Cache-Control"] == "no-store"
    assert "cannot reach its database" in page.content.decode()
    assert browser.get("/").status_code == 200  # and then it is back


def test_another_failure_is_still_a_500() -> None:
    client = _api(_token(Role.VIEWER))

    def broken(*args: Any) -> Any:
        raise RuntimeError("a bug")

    with connection.execute_wrapper(broken):
        answer = client.get("/api/tasks")

    assert answer.status_code == 500
    assert answer.json()["code"] == "internal_error"
    assert "Retry-After" not in answer
