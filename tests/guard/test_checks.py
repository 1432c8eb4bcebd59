"""Plain input checks: what planners, tools, inspectors and hosts hand the guard is checked
before the guard acts on it, and each problem is named for the stop report."""

from __future__ import annotations

import math
import threading
from typing import Any

import pytest

from guard import Call, Evidence, Kind, Result
from guard._checks import (
    Cancellation,
    as_calls,
    describe,
    evidence_problem,
    positive_ms,
    result_problem,
)


def test_one_well_formed_call_is_taken_as_it_is() -> None:
    call = Call("read_inbox", {"folder": "open"})

    assert as_calls(call, None) == [call]
    assert as_calls((call, call), None) == [call, call]


@pytest.mark.parametrize(
    ("proposal", "problem"),
    [
        ([], "an empty list of calls"),
        ("read the inbox", "the planner returned str, not Call, list or Finish"),
        ([Call("read_inbox"), 7], "int is not a Call"),
        (Call(""), "tool '' is not a non-empty string"),
        (Call("read_inbox", effect="delete"), "effect 'delete' of read_inbox is neither"),  # type: ignore[arg-type]
        (Call("read_inbox", operation_key=7), "operation_key 7 of read_inbox is not a string"),  # type: ignore[arg-type]
    ],
)
def test_a_malformed_proposal_is_described_not_taken(proposal: Any, problem: str) -> None:
    found = as_calls(proposal, None)

    assert isinstance(found, str) and found.startswith(problem)


def test_with_the_applications_tools_the_effect_is_the_applications_word() -> None:
    tools = {"refund": "write", "read_inbox": "read"}

    assert as_calls(Call("refund", {"order": 1}), tools) == "refund is a write tool, not a read"  # type: ignore[arg-type]
    assert as_calls(Call("drop_tables"), tools) == "there is no tool named 'drop_tables'"  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("result", "problem"),
    [
        (None, "the tool returned no result"),
        ({"kind": "SUCCESS"}, "the tool returned dict, not Result"),
        (Result("DONE"), "unknown result kind 'DONE'"),
        (Result(Kind.SUCCESS, attempts=0), "attempts 0 is not a positive int"),
        (Result(Kind.SUCCESS, attempts=True), "attempts True is not a positive int"),
    ],
)
def test_a_result_outside_the_closed_set_is_named(result: Any, problem: str) -> None:
    assert result_problem(result) == problem
    assert result_problem(Result(Kind.SUCCESS)) is None
    assert result_problem(Result("PENDING", wait_ms=5)) is None  # the word, as a plain str


@pytest.mark.parametrize(
    ("evidence", "problem"),
    [
        (Evidence(2, False), "revision went back from 3 to 2"),
        (Evidence(True, False), "revision True is not an int"),  # type: ignore[arg-type]
        (Evidence(3, "yes"), "done 'yes' is not a bool"),  # type: ignore[arg-type]
        (Evidence(3, False, committed=1), "committed 1 is not a bool or None"),  # type: ignore[arg-type]
        ("fine", "inspect returned str, not Evidence"),
    ],
)
def test_evidence_that_cannot_be_trusted_is_named(evidence: Any, problem: str) -> None:
    assert evidence_problem(evidence, 3) == problem
    assert evidence_problem(Evidence(3, True, committed=False), 3) is None


def test_only_a_positive_finite_wait_is_a_wait() -> None:
    assert positive_ms(10) and positive_ms(0.5) and positive_ms(10**400)
    assert not any(positive_ms(v) for v in (0, -1, True, math.nan, math.inf, "10", None))


class Mute(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no description")


def test_an_exception_is_described_briefly_even_when_it_cannot_describe_itself() -> None:
    assert describe(TimeoutError("no response")) == "TimeoutError: no response"
    assert describe(Mute()) == "Mute"
    assert len(describe(ValueError("x" * 10_000))) == len("ValueError: ") + 500


def test_a_stop_once_seen_stays_seen_and_an_unreadable_signal_is_a_stop() -> None:
    event = threading.Event()
    seen = Cancellation(event)
    assert not seen.requested()
    event.set()
    assert seen.requested()
    event.clear()
    assert seen.requested()

    def unreadable() -> bool:
        raise ConnectionError("stop fact unreadable")

    assert Cancellation(unreadable).requested()
