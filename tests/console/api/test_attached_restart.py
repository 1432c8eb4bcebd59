"""Attached clients that crash come back (docs/protocol.md, "Coming back"): a new process
with a new lease takes the task with a heartbeat after its predecessor died at any step,
hears which calls were interrupted, reports them — a write with what its tool's lookup
found — and goes on. Through the API on real PostgreSQL, the protocol spoken by hand."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from console.drivers import runner
from console.models import (
    AuditAction,
    AuditEntry,
    Operation,
    OperationEvent,
    OperationState,
    Task,
    TaskState,
    TraceEvent,
)
from console.records.roles import Role

from .helpers import Caller, error
from .test_attached import Client

KEY = "order/7/refund"


@pytest.fixture
def started(caller: Callable[..., Caller]) -> Client:
    client = Client(caller(Role.AGENT), lease="first-process")
    assert client.start().status_code == 201
    return client


def _vanish(client: Client, *, sweep: bool) -> Client:
    """The process dies; its lease runs out (and the sweep sees it, or not yet); a new
    process of the same person comes back for the task."""
    Task.objects.filter(id=client.task).update(
        lease_expires_at=timezone.now() - timedelta(seconds=1)
    )
    if sweep:
        runner.sweep(lambda task_id: None)
    again = Client(client.caller, lease="second-process")
    again.task = client.task
    return again


def _died_after(client: Client, step: str) -> None:
    """Drive ``client`` up to (and including) ``step``, then stop talking."""
    if step == "none":
        return
    client.step("model")
    if step == "model":
        return
    calls = [{"tool": "lookup", "args": {"n": 1}}]
    client.step("tools", calls=calls)
    if step == "tools":
        return
    client.step("call", ticket=0)
    if step == "call":
        return
    client.step("result", ticket=0, result={"kind": "SUCCESS", "data": 1})
    if step == "result":
        return
    client.step("wait")
    if step == "wait":
        return
    client.step("heartbeat")


def _finishes(client: Client) -> dict[str, Any]:
    """A model call with one read, then the finish: what a restarted loop does next."""
    assert client.step("model")["allowed"] is True
    admitted = client.step("tools", calls=[{"tool": "lookup", "args": {"n": 2}}])["admitted"]
    assert client.step("call", ticket=admitted[0]["ticket"])["action"] == "execute"
    client.step("result", ticket=0, result={"kind": "SUCCESS", "data": 2})
    client.step("model")
    stop: dict[str, Any] = client.step("finish", answer="done")["stop"]
    return stop


@pytest.mark.parametrize("step", ["none", "model", "tools", "call", "result", "wait", "heartbeat"])
@pytest.mark.parametrize("sweep", [True, False], ids=["swept", "not-swept-yet"])
def test_a_client_killed_after_any_step_restarts_and_finishes(
    started: Client, step: str, sweep: bool
) -> None:
    _died_after(started, step)
    again = _vanish(started, sweep=sweep)

    taken = again.step("heartbeat")  # as RemoteGuard.attach does: take the lease first
    assert taken["state"] == TaskState.RUNNING
    interrupted = taken.get("interrupted", [])
    if step == "call":  # the read it was running: interrupted, and asked again below
        assert [(c["ticket"], c["tool"], c["effect"]) for c in interrupted] == [
            (0, "lookup", "read")
        ]
    else:
        assert interrupted == []
    stop = _finishes(again)

    assert (stop["state"], stop["reason"]) == ("PARTIAL", "goal_unverified")  # no inspector


def test_a_read_left_running_is_said_to_be_interrupted_in_the_trace(started: Client) -> None:
    _died_after(started, "call")
    again = _vanish(started, sweep=True)
    again.step("heartbeat")
    again.step("result", ticket=0)  # reported as interrupted: no result, no lookup
    assert again.step("model")["allowed"] is True
    detail = TraceEvent.objects.filter(task_id=started.task, tool="lookup").values_list(
        "detail", flat=True
    )
    assert any("interrupted" in text for text in detail)


def _died_inside_a_write(client: Client) -> None:
    client.call("refund", {"cents": 7}, key=KEY)  # told to execute; the process dies in it


def test_a_write_cut_by_a_crash_waits_for_its_client_not_for_a_person(started: Client) -> None:
    _died_inside_a_write(started)
    _vanish(started, sweep=True)
    task = Task.objects.get(id=started.task)
    assert task.state == TaskState.QUEUED  # not NEEDS_HUMAN: its client may settle it
    assert Operation.objects.get(key=KEY).state == OperationState.UNKNOWN  # never run again


def test_the_restarted_clients_lookup_settles_a_cut_write_and_the_task_goes_on(
    started: Client,
) -> None:
    _died_inside_a_write(started)
    again = _vanish(started, sweep=True)
    (cut,) = again.step("heartbeat")["interrupted"]
    assert (cut["tool"], cut["effect"], cut["operation_key"]) == ("refund", "write", KEY)

    found = {"committed": True, "result": {"kind": "SUCCESS", "data": {"refund": "r-7"}},
             "evidence": "refund r-7 found in the desk by its key"}  # fmt: skip
    answer = again.step("result", ticket=cut["ticket"], lookup=found)

    assert answer["stop"] is None and answer["state"] == TaskState.RUNNING
    op = Operation.objects.get(key=KEY)
    assert op.state == OperationState.COMMITTED and op.result["data"] == {"refund": "r-7"}
    moved = OperationEvent.objects.filter(operation=op).order_by("id").last()
    assert moved is not None and "refund r-7 found" in moved.evidence
    audit = AuditEntry.objects.get(operation=op)
    assert audit.action == AuditAction.MARK_COMMITTED and audit.actor == started.caller.user
    assert "automatically" in audit.reason and "refund r-7 found" in audit.reason
    assert again.step("model")["allowed"] is True
    # The refund asked for again is the committed one: reused, never sent twice.
    admitted = again.step("tools", calls=[{"tool": "refund", "args": {"cents": 7},
                                           "operation_key": KEY}])["admitted"]  # fmt: skip
    assert again.step("call", ticket=admitted[0]["ticket"])["action"] == "reuse"
    assert Operation.objects.get(key=KEY).attempts == 1


def test_a_lookup_that_finds_nothing_lets_the_write_be_claimed_again(started: Client) -> None:
    _died_inside_a_write(started)
    again = _vanish(started, sweep=True)
    again.step("heartbeat")
    found = {"committed": False, "evidence": "no refund under this key in the desk"}
    assert again.step("result", ticket=0, lookup=found)["stop"] is None
    assert Operation.objects.get(key=KEY).state == OperationState.NOT_COMMITTED
    assert AuditEntry.objects.get(operation__key=KEY).action == AuditAction.MARK_NOT_COMMITTED
    assert again.step("model")["allowed"] is True
    call = {"tool": "refund", "args": {"cents": 7}, "operation_key": KEY}
    again.step("tools", calls=[call])
    assert again.step("call", ticket=0)["action"] == "execute"  # claimed again, once
    assert Operation.objects.get(key=KEY).attempts == 2


@pytest.mark.parametrize(
    "report",
    [
        {},  # no lookup
        {"lookup": {"committed": None, "evidence": "the desk did not answer"}},
    ],
    ids=["no-lookup", "cannot-tell"],
)
def test_a_cut_write_nobody_can_settle_stops_the_task_for_a_person(
    started: Client, report: dict[str, Any]
) -> None:
    _died_inside_a_write(started)
    again = _vanish(started, sweep=True)
    again.step("heartbeat")
    stop = again.step("result", ticket=0, **report)["stop"]
    assert (stop["state"], stop["reason"]) == ("NEEDS_HUMAN", "unknown_commit")
    assert Operation.objects.get(key=KEY).state == OperationState.UNKNOWN
    assert not AuditEntry.objects.filter(operation__key=KEY).exists()


def test_a_client_that_goes_straight_to_the_model_leaves_a_cut_write_for_a_person(
    started: Client,
) -> None:
    _died_inside_a_write(started)
    again = _vanish(started, sweep=False)
    stop = again.step("model")["stop"]  # no heartbeat, no lookup: as an older client does
    assert (stop["state"], stop["reason"]) == ("NEEDS_HUMAN", "unknown_commit")
    assert Operation.objects.get(key=KEY).state == OperationState.UNKNOWN


@pytest.mark.parametrize(
    ("lookup", "says"),
    [
        ({"committed": "yes", "evidence": "x"}, "lookup.committed"),
        ({"committed": True}, "lookup.evidence"),
        ({"committed": False, "evidence": "x", "result": {"kind": "SUCCESS"}}, "lookup.result"),
        ({"committed": True, "evidence": "x", "extra": 1}, "lookup is"),
    ],
)
def test_a_malformed_lookup_is_refused_and_settles_nothing(
    started: Client, lookup: dict[str, Any], says: str
) -> None:
    _died_inside_a_write(started)
    again = _vanish(started, sweep=True)
    again.step("heartbeat")
    assert says in error(again.send("result", ticket=0, lookup=lookup), 400)
    assert Operation.objects.get(key=KEY).state == OperationState.UNKNOWN
    # Asked again properly, it settles.
    good = {"committed": True, "evidence": "refund r-7 in the desk"}
    assert again.step("result", ticket=0, lookup=good)["stop"] is None


def test_a_lookup_for_a_call_this_client_runs_itself_is_refused(started: Client) -> None:
    started.call("refund", {"cents": 7}, key=KEY)
    found = {"committed": True, "evidence": "mine"}
    assert "interrupted" in error(started.send("result", ticket=0, lookup=found), 400)
    assert Operation.objects.get(key=KEY).state == OperationState.IN_FLIGHT


def test_a_new_start_by_a_restarted_process_finds_the_task_it_made(started: Client) -> None:
    again = Client(started.caller, lease="restarted-process")
    response = again.caller.post("/api/attached", {**started.last, "lease": again.lease})
    assert response.status_code == 200
    answer = response.json()
    assert answer["task"] == started.task and answer["attach"] is True
    assert Task.objects.filter(created_by=started.caller.user).count() == 1
    same = started.caller.post("/api/attached", started.last)  # the first process asking again
    assert same.status_code == 200 and "attach" not in same.json()


def test_errors_for_steps_out_of_order_speak_the_protocols_words(started: Client) -> None:
    message = error(started.send("tools", calls=[{"tool": "lookup", "args": {}}]), 409)
    assert "before_model" not in message and "model step" in message
