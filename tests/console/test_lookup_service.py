"""``services.operation_look_up``: a reconciler asks the business system about an uncertain
write. It tells what was found, writes that to the audit log, and settles nothing."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import AnonymousUser, User
from pytest_django import Settings

from console import services
from console.agents import Agent, Tool
from console.models import AuditEntry, Operation, OperationState, Task
from guard import Call, Evidence, Finish, Kind, Result, Settlement

from .views.support import unknown_operation

pytestmark = pytest.mark.django_db

Start = Callable[..., Task]


class _Desk(Agent):
    """One write tool whose lookup the test decides."""

    title = "Lookup desk (service tests)"
    lookup: Callable[[str], Settlement] | None = None

    def tools(self) -> list[Tool]:
        return [Tool("send_notice", "write", lambda call: Result(Kind.SUCCESS), lookup=self.lookup)]

    def plan(self, observation: Any) -> Finish:
        return Finish()

    def inspect(self, result: Result | None, step: Call | Finish) -> Evidence:
        return Evidence(0, True)


class BrokenDesk(_Desk):
    """The business system is down: its lookup raises."""

    @staticmethod
    def lookup(key: str) -> Settlement:
        raise ConnectionError(f"desk unreachable while asking for {key}")


class BlindDesk(_Desk):
    """The tool has no lookup at all."""


@pytest.fixture
def desks(settings: Settings) -> None:
    settings.LOOPGUARD_AGENTS = {
        **settings.LOOPGUARD_AGENTS,
        "test_broken_desk": f"{__name__}.BrokenDesk",
        "test_blind_desk": f"{__name__}.BlindDesk",
    }


def test_a_lookup_tells_what_the_business_system_found_and_audits_it_without_settling(
    start: Start, operator: User
) -> None:
    written = unknown_operation(start("test_notices", {"count": 1}), "notices/1")

    op, found = services.operation_look_up(key="notices/1", actor=operator)

    assert (op.key, op.state) == ("notices/1", OperationState.UNKNOWN)
    assert found == {"committed": False, "evidence": "", "result": None}
    written.refresh_from_db()
    assert written.state == OperationState.UNKNOWN  # a lookup informs; a reconciler decides
    entry = AuditEntry.objects.get()
    assert (entry.actor, entry.action, entry.operation, entry.task_id) == (
        operator,
        "lookup",
        written,
        written.task_id,
    )
    assert entry.after == found


def test_a_lookup_of_a_key_that_does_not_exist_is_not_found_and_audits_nothing(
    operator: User,
) -> None:
    with pytest.raises(services.NotFound, match="there is no operation no/such/key"):
        services.operation_look_up(key="no/such/key", actor=operator)

    assert not AuditEntry.objects.exists()


def test_a_lookup_by_someone_not_signed_in_is_refused_before_the_business_system_is_asked(
    start: Start,
) -> None:
    unknown_operation(start("test_notices", {"count": 1}), "notices/2")

    with pytest.raises(services.Refused):
        services.operation_look_up(key="notices/2", actor=AnonymousUser())  # type: ignore[arg-type]

    assert not AuditEntry.objects.exists()


def test_a_business_system_that_fails_is_an_answer_naming_the_failure_and_is_audited(
    start: Start, operator: User, desks: None
) -> None:
    unknown_operation(start("test_broken_desk"), "broken/1")

    _, found = services.operation_look_up(key="broken/1", actor=operator)

    assert found == {
        "error": "the lookup failed: ConnectionError: desk unreachable while asking for broken/1"
    }
    assert AuditEntry.objects.get(action="lookup").after == found
    assert Operation.objects.get(key="broken/1").state == OperationState.UNKNOWN


def test_a_tool_without_a_lookup_says_so(start: Start, operator: User, desks: None) -> None:
    unknown_operation(start("test_blind_desk"), "blind/1")

    _, found = services.operation_look_up(key="blind/1", actor=operator)

    assert found == {"error": "the tool send_notice has no lookup"}
    assert AuditEntry.objects.get(action="lookup").after == found
