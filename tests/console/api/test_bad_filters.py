"""The task list's filters in the API: a value the console does not know is a 400 that
names it, never a list of every task or of none."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from console.models import Task

from .helpers import Caller, document

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


@pytest.mark.parametrize("name", ["state", "reason", "agent", "waiting"])
@pytest.mark.parametrize("blank", [" ", "\x85"])
def test_a_filter_of_whitespace_alone_is_a_400_not_a_list_of_every_task(
    admin: Caller, start: Start, name: str, blank: str
) -> None:
    # The probe sent waiting=%C2%85: trimmed to nothing, it was taken for "any" and the
    # answer listed every task.
    start("test_reader", {"pages": 1})

    response = admin.get("/api/tasks", **{name: blank})

    assert response.status_code == 400
    assert list(response.json()["fields"]) == [name]


def test_an_empty_filter_is_no_filter_as_the_document_says(admin: Caller, start: Start) -> None:
    task = start("test_reader", {"pages": 1})
    described = {
        q["name"]: q["schema"] for q in document()["paths"]["/api/tasks"]["get"]["parameters"]
    }

    response = admin.get("/api/tasks", state="", reason="", waiting="")

    assert [t["id"] for t in response.json()["tasks"]] == [task.id]
    assert all("" in described[name]["enum"] for name in ("state", "reason", "waiting"))
    assert "deadline" in described["reason"]["enum"]


def test_an_approval_state_of_whitespace_alone_is_a_400_and_an_empty_one_the_pending_ones(
    admin: Caller,
) -> None:
    blank = admin.get("/api/approvals", state="\x85")
    empty = admin.get("/api/approvals", state="")

    assert blank.status_code == 400
    assert blank.json()["fields"]["state"].startswith("unknown state '\\x85'")
    assert empty.status_code == 200
