"""``RemoteGuard`` coming back after a crash (docs/protocol.md, "Coming back"), where it
needs no console: it waits out a live predecessor's lease (bounded), reports what the
predecessor left running with the tool's lookup, and a start asked again is the same start.
The console's side is tested live (tests/console/api/test_attached_restart.py,
tests/console/test_attached_live.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from guard import Kind, Result, Settlement
from guard.remote import ProtocolError, RemoteGuard

from .support import Sleeps
from .test_remote_client import TOKEN, Console, ok, refused

INTERRUPTED = {"ticket": 0, "tool": "refund", "effect": "write",
               "operation_key": "refund-42", "status": "executing"}  # fmt: skip


@pytest.fixture
def console() -> Iterator[Console]:
    """A scripted console on a local port (test_remote_client's)."""
    served = Console()
    yield served
    served.close()


def _attach(console: Console, sleeps: Sleeps, **options: Any) -> RemoteGuard:
    return RemoteGuard.attach(
        console.url, token=TOKEN, task=41, sleep=sleeps, heartbeat=False, **options
    )


def test_attach_waits_out_a_live_predecessors_lease(console: Console) -> None:
    held = refused(409, "lease_held", "another driver holds the lease for 4 more seconds")
    console.on("heartbeat", held, held, ok(stop_requested=False))
    sleeps = Sleeps()
    with _attach(console, sleeps) as guard:
        assert guard.task == 41
    assert len(console.steps("heartbeat")) == 3
    assert sleeps.waits == [2.0, 2.0]  # no Retry-After here: its own pause


def test_attach_gives_up_after_its_wait_and_says_why(console: Console) -> None:
    console.on("heartbeat", refused(409, "lease_held", "another driver holds the lease"))
    sleeps = Sleeps()
    with pytest.raises(ProtocolError) as held:
        _attach(console, sleeps, wait=5)
    assert held.value.code == "lease_held"
    assert sum(sleeps.waits) == pytest.approx(5)  # bounded by wait, not by luck


def test_a_write_left_running_is_reported_with_what_its_lookup_found(console: Console) -> None:
    console.on("heartbeat", ok(stop_requested=False, interrupted=[INTERRUPTED]))
    console.on("result", ok())
    found = Settlement(True, Result(Kind.SUCCESS, {"refund": "r-42"}), "refund r-42 in the desk")
    looked: list[str] = []

    def lookup(key: str) -> Settlement:
        looked.append(key)
        return found

    with _attach(console, Sleeps(), lookups={"refund": lookup}):
        pass
    assert looked == ["refund-42"]
    (reported,) = console.steps("result")
    assert reported.body["ticket"] == 0
    assert reported.body["lookup"] == {
        "committed": True,
        "evidence": "refund r-42 in the desk",
        "result": {"kind": "SUCCESS", "data": {"refund": "r-42"}, "wait_ms": None,
                   "attempts": 1},
    }  # fmt: skip


@pytest.mark.parametrize(
    ("lookup", "evidence"),
    [
        (lambda key: (_ for _ in ()).throw(TimeoutError("desk timed out")), "lookup failed"),
        (lambda key: "yes", "answered 'yes'"),
    ],
    ids=["raises", "not-a-settlement"],
)
def test_a_lookup_that_fails_or_answers_oddly_cannot_tell(
    console: Console, lookup: Any, evidence: str
) -> None:
    console.on("heartbeat", ok(stop_requested=False, interrupted=[INTERRUPTED]))
    console.on("result", ok())
    with _attach(console, Sleeps(), lookups={"refund": lookup}):
        pass
    (reported,) = console.steps("result")
    assert reported.body["lookup"]["committed"] is None
    assert evidence in reported.body["lookup"]["evidence"]


def test_a_read_left_running_and_a_write_without_lookup_are_reported_with_nothing(
    console: Console,
) -> None:
    read = {"ticket": 1, "tool": "lookup_order", "effect": "read", "operation_key": None,
            "status": "executing"}  # fmt: skip
    console.on("heartbeat", ok(stop_requested=False, interrupted=[INTERRUPTED, read]))
    console.on("result", ok())
    with _attach(console, Sleeps()):
        pass
    bodies = [seen.body for seen in console.steps("result")]
    assert [(b["ticket"], "lookup" in b, "result" in b) for b in bodies] == [
        (0, False, False),
        (1, False, False),
    ]


def test_a_start_the_console_made_before_for_another_lease_is_taken_over(
    console: Console,
) -> None:
    console.on("start", lambda body: (200, {"protocol": 1, "task": 41, "phase": 1,
               "state": "RUNNING", "remaining": {}, "stop": None, "lease_seconds": 60,
               "url": "/tasks/41/", "attach": True}))  # fmt: skip
    with RemoteGuard.start(
        console.url, token=TOKEN, agent="bot", tools={"refund": "write"},
        start_id="job-7", sleep=Sleeps(), heartbeat=False,
    ) as guard:  # fmt: skip
        assert guard.task == 41
    (start,) = console.steps("start")
    assert start.body["request_id"] == "job-7"
    (taken,) = console.steps("heartbeat")
    assert taken.body["lease"] == guard.lease


def test_a_start_id_must_be_printable_ascii() -> None:
    with pytest.raises(ValueError, match="start_id"):
        RemoteGuard.start("http://127.0.0.1:9", token=TOKEN, agent="bot", tools={},
                          start_id="job\n7")  # fmt: skip
