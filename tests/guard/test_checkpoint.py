"""Checkpoints: a guard's state carried to another process, as each of its parts keeps it.

Version 2 is made of the parts' own checkpoints; version 1 (one flat mapping) is what tasks
stored before the guard had parts, and existing databases still hold it.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from guard import Call, Evidence, Guard, InMemoryLedger, Kind, Limits, Reason, Report, Result
from guard.steps import HISTORY

NOTICE = Call(
    "send_notice",
    {"incident": 42, "text": "First notice"},
    effect="write",
    operation_key="incident-42-first-notice",
)
JOB = Call("fetch_job_status", {"job": 7})
QUEUE = Call("read_queue", {"queue": "billing"})
FIRST = [NOTICE, JOB, JOB, QUEUE]  # a write, a PENDING job polled once, a read
THEN = [JOB, QUEUE, QUEUE]  # one more poll, then the read repeated once too often
# explore=0: the rules VERSION_1 was taken under, before a new read counted as exploration
# beside an inspector.
LIMITS = Limits(
    deadline_ms=1000, model_calls=12, requests=12, executions=10, same=2, stagnant=5, explore=0
)

NOTICE_FP = "820562eb9897e1b013d4cc36f6aab15db3f35bebfd37b8d4d74905c167abc734"
JOB_FP = "c05e35b47e823c71671b9190abb470837fbf7b6093e5ecbb73c79a3092784ebc"
QUEUE_FP = "cca8c09c7df247cc1e43b865e1313d45d93f58823fcead32eaf95f676d41b0bc"

# Taken, as JSON, from the guard before it had parts, after FIRST.
VERSION_1: dict[str, Any] = {
    "version": 1,
    "usage": {
        "model_calls": 4,
        "requests": 4,
        "executions": 4,
        "tokens": 0,
        "polls": 1,
        "elapsed_ms": 40,
    },
    "revision": 1,
    "stagnant": 2,
    "recent": [NOTICE_FP, JOB_FP, QUEUE_FP],
    "repeats": {NOTICE_FP: 1, JOB_FP: 1, QUEUE_FP: 1},
    "pending": {JOB_FP: 1},
    "nudged": False,
    "touched": ["incident-42-first-notice"],
    "completed": [
        ["send_notice", NOTICE_FP, "incident-42-first-notice", False, 1],
        ["read_queue", QUEUE_FP, None, False, 1],
    ],
    "completed_total": 2,
}


class World:
    """A fake clock and business system: notices sent, a job that keeps running."""

    def __init__(self) -> None:
        self.ms = 0
        self.sent: set[str] = set()

    def now(self) -> float:
        return self.ms

    def wait(self, ms: float) -> None:
        self.ms += int(ms)

    def execute(self, call: Call) -> Result:
        self.ms += 5
        if call.effect == "write":
            assert call.operation_key is not None
            self.sent.add(call.operation_key)
            return Result(Kind.SUCCESS, {"notice": "n-1"})
        if call.tool == "fetch_job_status":
            return Result(Kind.PENDING, {"state": "running"}, wait_ms=10)
        return Result(Kind.SUCCESS, {"rows": []})

    def inspect(self, result: Result | None, call: Call | Any) -> Evidence:
        committed = call.operation_key in self.sent if call.effect == "write" else None
        return Evidence(len(self.sent), False, committed=committed)


def drive(guard: Guard, world: World, proposals: list[Call]) -> Report | None:
    """Step by step, as a host does: one model call per proposal; the report if it stops."""
    for call in proposals:
        if (stop := guard.before_model()) is not None:
            return stop
        admitted = guard.before_tools(call)
        if not isinstance(admitted, list):
            return admitted if isinstance(admitted, Report) else None
        for ticket in admitted:
            decision = guard.before_tool(ticket)
            if decision.report is not None:
                return decision.report
            stop = guard.after_tool(ticket, world.execute(call), inspect=world.inspect)
            if stop is not None:
                return stop
        pause = guard.before_wait()
        if isinstance(pause, Report):
            return pause
        world.wait(pause)
    return None


def started() -> tuple[Guard, World, InMemoryLedger]:
    world, ledger = World(), InMemoryLedger()
    guard = Guard(LIMITS, now=world.now, wait=world.wait, ledger=ledger)
    assert drive(guard, world, FIRST) is None
    return guard, world, ledger


def test_a_version_1_checkpoint_restores_and_goes_on_as_the_guard_it_was_taken_from() -> None:
    original, world, ledger = started()
    twin_world = copy.deepcopy(world)

    restored = Guard.restore(
        VERSION_1, LIMITS, now=twin_world.now, wait=twin_world.wait, ledger=ledger
    )

    assert restored.checkpoint() == original.checkpoint()
    went_on = drive(restored, twin_world, THEN)
    assert went_on is not None
    assert (went_on.reason, went_on.executions, went_on.polls) == (Reason.SAME_CALL, 6, 2)
    expected = drive(original, world, THEN)
    assert expected is not None
    assert went_on.to_dict() == expected.to_dict()


def test_a_version_1_checkpoint_without_its_history_takes_it_back_from_the_host() -> None:
    original, world, ledger = started()
    saved = {k: v for k, v in VERSION_1.items() if k not in HISTORY}

    restored = Guard.restore(
        saved, LIMITS, history=original.history(), now=world.now, ledger=ledger
    )

    assert restored.checkpoint() == original.checkpoint()


def test_the_checkpoint_is_made_of_the_parts_checkpoints() -> None:
    guard, _, _ = started()

    saved = guard.checkpoint()

    assert saved["version"] == 2
    assert set(saved) == {"version", "usage", "detector", "settlement", "record"}
    assert saved["usage"] == guard.usage.to_dict()
    assert saved["detector"]["pending"] == {JOB_FP: 1}
    assert saved["settlement"] == {"touched": ["incident-42-first-notice"]}
    assert saved["record"]["completed_total"] == 2


def test_a_checkpoint_without_history_plus_the_history_restores_the_same_guard() -> None:
    guard, world, ledger = started()
    light = json.loads(json.dumps(guard.checkpoint(history=False)))
    history = json.loads(json.dumps(guard.history()))

    restored = Guard.restore(light, LIMITS, history=history, now=world.now, ledger=ledger)

    assert "touched" not in light["settlement"] and "completed" not in light["record"]
    assert history == {
        "touched": ["incident-42-first-notice"],
        "completed": VERSION_1["completed"],
    }
    assert restored.checkpoint() == guard.checkpoint()


def test_the_hosts_own_counters_may_stand_in_for_the_checkpoints() -> None:
    guard, world, ledger = started()
    saved = {**guard.checkpoint(), "usage": {**guard.usage.to_dict(), "model_calls": 11}}

    restored = Guard.restore(saved, LIMITS, now=world.now, ledger=ledger)

    assert restored.usage.model_calls == 11
    report = drive(restored, world, [JOB, JOB])
    assert report is not None and report.reason is Reason.MODEL_BUDGET


@pytest.mark.parametrize("part", ["usage", "detector", "settlement", "record"])
def test_a_version_2_checkpoint_missing_a_part_is_refused(part: str) -> None:
    guard, _, _ = started()
    saved = guard.checkpoint()
    del saved[part]

    with pytest.raises(ValueError, match="malformed checkpoint"):
        Guard.restore(saved, LIMITS)


class Asked:
    """A host's history, handed over when the guard asks for it; counts the asking."""

    def __init__(self, history: dict[str, Any] | None) -> None:
        self.history = history
        self.times = 0

    def __call__(self) -> dict[str, Any]:
        self.times += 1
        if self.history is None:
            raise OSError("the trace cannot be read")
        return self.history


def later(guard: Guard, world: World, ledger: InMemoryLedger, asked: Asked) -> Guard:
    """``guard`` restored in another process, its history left with the host."""
    light = json.loads(json.dumps(guard.checkpoint(history=False)))
    return Guard.restore(
        light, LIMITS, history=asked, now=world.now, wait=world.wait, ledger=ledger
    )


def test_a_history_left_with_the_host_is_asked_for_only_by_the_stop_report() -> None:
    original, world, ledger = started()
    twin_world = copy.deepcopy(world)
    asked = Asked(json.loads(json.dumps(original.history())))

    restored = later(original, twin_world, ledger, asked)

    assert drive(restored, twin_world, THEN[:1]) is None  # steps that stop nothing
    assert asked.times == 0
    went_on = drive(restored, twin_world, THEN[1:])
    expected = drive(original, world, THEN)
    assert went_on is not None and expected is not None
    assert asked.times == 1
    # The same report as the guard that kept its history: what was done before the
    # restore first, then what was done since.
    assert went_on.to_dict() == expected.to_dict()
    assert [op.key for op in went_on.operations] == ["incident-42-first-notice"]
    assert went_on.completed_total == len(went_on.completed) == 3


def test_a_whole_checkpoint_of_a_guard_without_its_history_asks_for_it_once() -> None:
    original, world, ledger = started()
    asked = Asked(json.loads(json.dumps(original.history())))
    restored = later(original, copy.deepcopy(world), ledger, asked)

    assert restored.checkpoint(history=False) == original.checkpoint(history=False)
    assert asked.times == 0
    assert restored.checkpoint() == original.checkpoint()
    assert restored.history() == original.history()
    assert asked.times == 1


def test_a_history_that_cannot_be_read_leaves_the_report_with_what_was_done_since() -> None:
    original, world, ledger = started()
    twin_world = copy.deepcopy(world)
    asked = Asked(None)
    restored = later(original, twin_world, ledger, asked)
    write = Call(
        "send_notice",
        {"incident": 43, "text": "First notice"},
        effect="write",
        operation_key="incident-43-first-notice",
    )

    report = drive(restored, twin_world, [write, QUEUE, QUEUE, QUEUE, QUEUE])

    assert report is not None and report.reason is Reason.SAME_CALL  # made all the same
    assert asked.times == 1
    assert [op.key for op in report.operations] == ["incident-43-first-notice"]
    since = ["send_notice", "read_queue", "read_queue"]
    assert [step["tool"] for step in report.completed] == since
    assert report.completed_total == 2 + len(since)  # the count travels in the checkpoint


def test_a_whole_checkpoint_whose_history_cannot_be_read_is_refused_not_made_short() -> None:
    original, world, ledger = started()
    asked = Asked(None)
    restored = later(original, copy.deepcopy(world), ledger, asked)

    with pytest.raises(OSError, match="cannot be read"):
        restored.checkpoint()
    asked.history = json.loads(json.dumps(original.history()))  # readable again

    assert restored.checkpoint() == original.checkpoint()
    assert asked.times == 2
