"""The loop detector, seen through the guard: cycles longer than two, polling a
``PENDING`` job, exempt tools and nudging once."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from guard import Call, Finish, Kind, Nudge, Reason, Result, State
from guard._detector import Detector

from .support import (
    Clock,
    Inspector,
    Notices,
    Planner,
    Records,
    Script,
    assert_stays_stopped,
    base_limits,
    make_guard,
    notice,
    read,
    roomy,
    scripted,
    tools,
)

# -- cycles -------------------------------------------------------------------------------


@pytest.mark.parametrize("period", [2, 3, 4])
def test_a_cycle_stops_on_the_request_that_completes_its_second_repetition(period: int) -> None:
    cycle = [read(f"tool_{n}", n=n) for n in range(period)]
    guard = make_guard(Clock(), roomy())
    script = scripted([*cycle, *cycle, Finish()])

    report = script.run(guard)

    assert (report.state, report.reason) == (State.PARTIAL, Reason.SHORT_CYCLE)
    assert script.execute.calls == [*cycle, *cycle[:-1]]
    assert report.requests == 2 * period
    assert report.call is not None and report.call["tool"] == f"tool_{period - 1}"
    assert_stays_stopped(guard, script, report)


def test_a_cycle_of_period_five_goes_unnoticed_with_the_default_max_period() -> None:
    cycle = [read(f"tool_{n}", n=n) for n in range(5)]
    guard = make_guard(Clock(), roomy())
    script = scripted([*cycle, *cycle, Finish()])

    report = script.run(guard)

    assert script.execute.entries == 10
    assert (report.state, report.reason) == (State.PARTIAL, Reason.GOAL_UNVERIFIED)


def test_a_cycle_of_period_five_is_detected_with_max_period_five() -> None:
    cycle = [read(f"tool_{n}", n=n) for n in range(5)]
    guard = make_guard(Clock(), roomy(max_period=5))
    script = scripted([*cycle, *cycle, Finish()])

    report = script.run(guard)

    assert script.execute.entries == 9
    assert (report.state, report.reason) == (State.PARTIAL, Reason.SHORT_CYCLE)


@pytest.mark.parametrize("same", [2, 3, 4])
def test_a_constant_repeat_is_reported_as_the_same_call_not_as_a_cycle(same: int) -> None:
    guard = make_guard(Clock(), roomy(same=same))
    script = scripted([read("read_inbox", folder="open")])

    report = script.run(guard)

    assert (report.state, report.reason) == (State.PARTIAL, Reason.SAME_CALL)
    assert script.execute.entries == same
    assert report.requests == same + 1


# -- polling ------------------------------------------------------------------------------


def test_polls_of_a_pending_job_are_charged_to_the_poll_budget_only() -> None:
    # same=2 and stagnant=3 would stop a plain repeat after two or three requests.
    guard = make_guard(Clock(), base_limits(polls=4, model_calls=20, requests=20, executions=20))
    status = read("export_status", job="export-7")
    script = scripted([status], [Result(Kind.PENDING, wait_ms=10)])

    report = script.run(guard)

    assert (report.state, report.reason) == (State.PARTIAL, Reason.POLL_BUDGET)
    assert script.execute.entries == 5  # the first request, then four polls
    assert report.polls == 4
    assert report.requests == 6


def test_a_pending_job_that_finishes_within_its_polls_completes_the_task() -> None:
    records = Records()
    answers = iter([Result(Kind.PENDING, wait_ms=10)] * 4 + [Result(Kind.SUCCESS, "export.csv")])

    def export_status(call: Call) -> Result:
        answer = next(answers)
        if answer.kind is Kind.SUCCESS:
            records.revision, records.done = 1, True
        return answer

    clock = Clock()
    guard = make_guard(clock, base_limits(polls=4))
    script = Script(
        Planner(read("export_status", job="export-7")),
        tools(export_status=export_status),
        Inspector(records.inspect),
    )

    report = script.run(guard)

    assert (report.state, report.reason) == (State.COMPLETED, Reason.GOAL_MET)
    assert script.execute.entries == 5
    assert report.polls == 4
    assert clock.waits == [10, 10, 10, 10]


def test_the_deadline_still_applies_while_polling() -> None:
    clock = Clock()
    guard = make_guard(clock, roomy(deadline_ms=1000, polls=100))
    script = scripted([read("export_status", job="export-7")], [Result(Kind.PENDING, wait_ms=100)])

    report = script.run(guard)

    assert (report.state, report.reason) == (State.PARTIAL, Reason.DEADLINE)
    assert script.execute.entries == 10  # at 0, 100, ..., 900 ms; waiting again reaches 1000
    assert clock.ms < 1000
    assert report.polls == 9


# -- exempt tools -------------------------------------------------------------------------


def test_an_exempt_tool_may_repeat_the_same_call() -> None:
    guard = make_guard(Clock(), roomy(exempt=frozenset({"tail_log"})))
    tail = read("tail_log", service="billing", lines=50)
    script = scripted([tail] * 6 + [Finish()])

    report = script.run(guard)

    assert script.execute.entries == 6
    assert (report.state, report.reason) == (State.PARTIAL, Reason.GOAL_UNVERIFIED)


def test_an_exempt_tool_may_alternate_without_being_called_a_cycle() -> None:
    guard = make_guard(Clock(), roomy(exempt=frozenset({"tail_log"})))
    billing, shipping = read("tail_log", service="billing"), read("tail_log", service="shipping")
    script = scripted([billing, shipping] * 3 + [Finish()])

    report = script.run(guard)

    assert script.execute.entries == 6
    assert report.reason is Reason.GOAL_UNVERIFIED


def test_an_exempt_tool_still_stops_for_no_progress() -> None:
    guard = make_guard(
        Clock(), base_limits(stagnant=3, model_calls=20, exempt=frozenset({"tail_log"}))
    )
    script = scripted([read("tail_log", service="billing")])

    report = script.run(guard)

    assert (report.state, report.reason) == (State.PARTIAL, Reason.NO_PROGRESS)
    assert script.execute.entries == 3


def test_an_exempt_tool_still_draws_on_the_execution_budget() -> None:
    guard = make_guard(Clock(), roomy(executions=4, exempt=frozenset({"tail_log"})))
    script = scripted([read("tail_log", service="billing")])

    report = script.run(guard)

    assert (report.state, report.reason) == (State.PARTIAL, Reason.EXECUTION_BUDGET)
    assert script.execute.entries == 4


def test_an_exempt_tool_polling_a_pending_job_is_still_bounded_by_the_poll_budget() -> None:
    guard = make_guard(Clock(), roomy(polls=2, exempt=frozenset({"tail_log"})))
    script = scripted([read("tail_log", job="export-7")], [Result(Kind.PENDING, wait_ms=10)])

    report = script.run(guard)

    assert (report.state, report.reason) == (State.PARTIAL, Reason.POLL_BUDGET)
    assert script.execute.entries == 3
    assert report.polls == 2


def test_exempting_one_tool_leaves_other_tools_checked_for_repeats() -> None:
    guard = make_guard(Clock(), roomy(exempt=frozenset({"tail_log"})))
    script = scripted([read("read_inbox", folder="open")])

    report = script.run(guard)

    assert report.reason is Reason.SAME_CALL
    assert script.execute.entries == 2


# -- nudge --------------------------------------------------------------------------------


def test_the_first_repeat_nudges_the_model_and_nothing_runs() -> None:
    guard = make_guard(Clock(), roomy(), nudge=True)
    inbox = read("read_inbox", folder="open")
    script = scripted([inbox])

    report = script.run(guard)

    nudges = [obs for obs in script.plan.observations if isinstance(obs, Nudge)]
    assert len(nudges) == 1
    assert nudges[0].reason is Reason.SAME_CALL
    assert nudges[0].tool == "read_inbox"
    assert script.plan.observations.index(nudges[0]) == 3  # seen by the 4th model call
    assert script.execute.entries == 2
    assert (report.state, report.reason) == (State.PARTIAL, Reason.SAME_CALL)


def test_after_a_nudge_the_next_detection_stops_even_for_another_call() -> None:
    guard = make_guard(Clock(), roomy(), nudge=True)
    inbox, queue = read("read_inbox", folder="open"), read("read_queue", queue="triage")
    script = scripted([inbox, inbox, inbox, queue, queue, queue])

    report = script.run(guard)

    assert [call.tool for call in script.execute.calls] == [
        "read_inbox",
        "read_inbox",
        "read_queue",
        "read_queue",
    ]
    assert (report.state, report.reason) == (State.PARTIAL, Reason.SAME_CALL)
    assert report.call is not None and report.call["tool"] == "read_queue"


def test_a_cycle_is_nudged_once_as_a_cycle() -> None:
    guard = make_guard(Clock(), roomy(), nudge=True)
    inbox, queue = read("read_inbox", folder="open"), read("read_queue", queue="triage")
    script = scripted([inbox, queue], cycle=True)

    report = script.run(guard)

    nudges = [obs for obs in script.plan.observations if isinstance(obs, Nudge)]
    assert [n.reason for n in nudges] == [Reason.SHORT_CYCLE]
    assert report.reason in (Reason.SHORT_CYCLE, Reason.SAME_CALL)
    assert script.execute.entries == 3


def test_the_nudge_for_a_repeated_write_names_the_tool_and_never_invites_a_retry() -> None:
    notices = Notices()
    guard = make_guard(Clock(), roomy(), nudge=True)
    script = Script(Planner(notice()), tools(send_notice=notices.send), Inspector(notices.inspect))

    report = script.run(guard)

    nudges = [obs for obs in script.plan.observations if isinstance(obs, Nudge)]
    assert len(nudges) == 1
    text = nudges[0].message
    assert "send_notice" in text
    assert not re.search(r"try\s+(it\s+)?again|re-?try", text, re.IGNORECASE)
    assert script.execute.entries == 1
    assert report.reason is Reason.SAME_CALL


# -- the detector itself ------------------------------------------------------------------


def detector(**changes: Any) -> Detector:
    return Detector(roomy(**changes), revision=0, nudge=False)


def admit_and_observe(found: Detector, tool: str, revision: int = 0) -> Any:
    """One call through the detector: admitted, then observed with ``revision``."""
    call = read(tool)
    answer = found.admit(call, tool)
    if answer is False:
        found.end_admission()
        found.observe(call, tool, False, Kind.SUCCESS, revision)
    return answer


def test_a_rise_in_the_revision_clears_the_memory_of_repeats_and_cycles() -> None:
    found = detector(same=2)
    admit_and_observe(found, "a")
    admit_and_observe(found, "a", revision=1)  # the same call, but with verified progress

    assert admit_and_observe(found, "a") is False
    refused = admit_and_observe(found, "a")
    assert refused is not False and refused.reason is Reason.SAME_CALL


def test_calls_of_one_model_call_count_against_each_other_before_any_has_run() -> None:
    found = detector(same=1)

    assert found.admit(read("a"), "a") is False
    refused = found.admit(read("a"), "a")
    assert refused is not False and refused.reason is Reason.SAME_CALL
    assert found.repeats == {}  # nothing ran: nothing is recorded


def test_stagnation_counts_requests_without_progress_but_not_polls() -> None:
    found = detector(stagnant=2)
    job = read("fetch_job_status")
    assert found.observe(job, "job", False, Kind.PENDING, 0) is False
    assert found.observe(job, "job", True, Kind.PENDING, 0) is False  # a poll of the job

    assert found.stagnant == 1
    assert found.observe(read("other"), "other", False, Kind.SUCCESS, 0) is True


def test_the_detectors_checkpoint_part_gives_back_its_memory() -> None:
    found = detector()
    admit_and_observe(found, "a")
    admit_and_observe(found, "b")
    saved = json.loads(json.dumps(found.checkpoint()))

    again = Detector(roomy(), revision=saved["revision"], nudge=False)
    again.load(saved)

    assert again.checkpoint() == found.checkpoint()
    assert admit_and_observe(again, "a") is False
    refused = admit_and_observe(again, "b")  # a → b → a → b: the memory came back
    assert refused is not False and refused.reason is Reason.SHORT_CYCLE
