"""What an attached step request sends to PostgreSQL: the request's id taken in the same
statement as the task's lock, a retry told by that insert's conflict, the answer stored
with the step's save, and no lookup of a stored answer before a request that is new."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from console.models import StepRequest
from console.records.roles import Role

from .helpers import Caller
from .test_attached import Client

LOOKUP = "SELECT step, body_hash, answer FROM console_steprequest"


@pytest.fixture
def started(caller: Callable[..., Caller]) -> Client:
    client = Client(caller(Role.AGENT))
    assert client.start().status_code == 201
    return client


def _statements(client: Client, step: str, **fields: Any) -> tuple[Any, list[str]]:
    """``step`` sent, and the statements it sent (savepoints and the token's left out)."""
    with CaptureQueriesContext(connection) as captured:
        response = client.send(step, **fields)
    sent = [
        query["sql"]
        for query in captured.captured_queries
        if "SAVEPOINT" not in query["sql"] and "console_apitoken" not in query["sql"]
    ]
    return response, sent


def test_a_new_step_request_takes_its_id_with_the_tasks_lock_and_looks_up_no_answer(
    started: Client,
) -> None:
    started.step("model")

    response, sent = _statements(
        started, "tools", calls=[{"tool": "lookup", "args": {"q": 1}}], usage={"tokens": 3}
    )

    assert response.status_code == 200, response.content
    assert not [sql for sql in sent if LOOKUP in sql]
    # The lock and the id's row in one statement; the save, with the answer, in another.
    opened, saved = sent
    assert "FOR UPDATE" in opened and "INSERT INTO console_steprequest" in opened
    assert "UPDATE console_task" in saved and "console_steprequest" in saved
    stored = StepRequest.objects.get(task_id=started.task, request_id=started.last["request_id"])
    assert stored.step == "tools" and stored.answer == response.json()


def test_a_retried_request_is_told_by_its_ids_conflict_and_gets_its_answer_unsaved_again(
    started: Client,
) -> None:
    started.step("model")
    calls = [{"tool": "refund", "args": {"order": 7}, "operation_key": "refund/7"}]
    first = started.step("tools", calls=calls, usage={"tokens": 3}, request_id="admit-1")

    response, sent = _statements(
        started, "tools", calls=calls, usage={"tokens": 3}, request_id="admit-1"
    )

    assert response.status_code == 200 and response.json() == first
    opened, looked_up = sent  # the conflict, then the stored answer read: nothing saved
    assert "INSERT INTO console_steprequest" in opened and LOOKUP in looked_up
    assert StepRequest.objects.filter(task_id=started.task, request_id="admit-1").count() == 1


def test_a_refused_request_leaves_its_id_free(started: Client) -> None:
    started.step("model")
    refused = started.send("result", ticket=1, request_id="too-soon")  # nothing admitted yet
    assert refused.status_code == 409, refused.content

    assert not StepRequest.objects.filter(task_id=started.task, request_id="too-soon").exists()


def test_a_step_reads_its_task_without_the_goals_input_and_reads_nothing_more_later(
    caller: Callable[..., Caller],
) -> None:
    client = Client(caller(Role.AGENT))
    assert client.start(input={"document": "x" * 60_000}).status_code == 201  # near its bound
    client.step("model")

    response, sent = _statements(
        client, "tools", calls=[{"tool": "lookup", "args": {"q": 1}}], usage={"tokens": 3}
    )

    assert response.status_code == 200, response.content
    opened, _ = sent  # no statement of its own for a column left out
    read = opened.split("FROM console_task")[0]
    assert "checkpoint" in read and "input" not in read
