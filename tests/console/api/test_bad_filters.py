"""The task list's filters in the API: a value the console does not know is a 400 that
names it, never a list of every task or of none."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from console.models import Task

from .helpers import Caller

pytestmark = pytest.mark.django_db

Start = Callable[..., Task]


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("agent", "no_such_agent", "unknown agent 'no_such_agent'"),
        ("reason", "deadlin", "unknown stop reason 'deadlin'"),
        ("state", "BOGUS", "unknown state 'BOGUS'"),
        ("since", "yesterday", "'yesterday' is not a date and time"),
    ],
)
def test_an_unknown_filter_value_is_a_400_invalid_query_naming_the_filter(
    admin: Caller, start: Start, name: str, value: str, message: str
) -> None:
    start("test_reader", {"pages": 1})

    response = admin.get("/api/tasks", **{name: value})

    assert response.status_code == 400
    answer = response.json()
    assert answer["code"] == "invalid_query"
    assert list(answer["fields"]) == [name]
    assert answer["fields"][name].startswith(message)
    assert answer["error"].startswith(f"{name}: ")


def test_a_known_agent_and_stop_reason_narrow_the_list(admin: Caller, start: Start) -> None:
    reader = start("test_reader", {"pages": 1})
    start("test_waiter", {})

    by_agent = admin.get("/api/tasks", agent="test_reader")
    by_reason = admin.get("/api/tasks", reason="operator_stop")

    assert [t["id"] for t in by_agent.json()["tasks"]] == [reader.id]
    assert by_reason.status_code == 200  # a reason no task has stopped for yet is no error
    assert by_reason.json()["tasks"] == []
