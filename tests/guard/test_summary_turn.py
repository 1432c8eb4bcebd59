"""The summary turn: after a stop for a budget, the deadline or no progress, one last model
call with no tools allowed, whose text goes into the stop report.

It is handed out once per stop, charged beyond the budget that ran out, never runs a tool,
and is never offered after a stop a person must look at (an uncertain write, a conflict, an
operator's stop, a failure, a pending approval) or after the goal was met.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from guard import Call, Evidence, Finish, Guard, InMemoryLedger, Kind, Reason, Report, Result, State
from guard.steps import SUMMARY_REASONS

from .support import (
    Clock,
    Executor,
    Notices,
    Planner,
    Script,
    assert_stays_stopped,
    make_guard,
    notice,
    page_after_page,
    read,
    roomy,
    scripted,
)


def _pages() -> Script:
    """A model reading page after page, each read a new call (no repeats)."""
    return Script(Planner(page_after_page()), Executor(Result(Kind.SUCCESS)))


def _out_of_model_calls() -> tuple[Guard, Script, Report]:
    guard = make_guard(Clock(), roomy(model_calls=2, tokens=100))
    script = _pages()
    report = script.run(guard)
    assert (report.state, report.reason) == (State.PARTIAL, Reason.MODEL_BUDGET)
    return guard, script, report


# -- after a budget stop ---------------------------------------------------------------------


def test_a_budget_stop_offers_one_summary_prompt() -> None:
    guard, _, _ = _out_of_model_calls()

    prompt = guard.summary_turn()

    assert prompt is not None
    assert "model_budget" in prompt
    assert "No tool may be called" in prompt
    assert guard.summary_turn() is None  # once per stop


def test_no_summary_is_offered_while_the_task_still_runs() -> None:
    guard = make_guard(Clock(), roomy())
    assert guard.summary_turn() is None
    assert guard.before_model() is None
    assert guard.summary_turn() is None


def test_the_summary_goes_into_the_report_and_is_charged_beyond_the_budget() -> None:
    guard, _, stopped = _out_of_model_calls()
    assert guard.summary_turn() is not None

    report = guard.record_summary("  Read two pages; the rest is not done.\n", tokens=40, cost=7)

    assert report.summary == "Read two pages; the rest is not done."
    assert report.to_dict()["summary"] == "Read two pages; the rest is not done."
    assert (report.state, report.reason) == (stopped.state, stopped.reason)
    assert report.tokens == stopped.tokens + 40
    assert report.spend == stopped.spend + 7
    assert guard.usage.tokens == stopped.tokens + 40
    assert report.model_calls == stopped.model_calls  # the stop's counters stay as they were
    assert report.requests == stopped.requests
    assert report.executions == stopped.executions


def test_a_summary_may_spend_past_an_exhausted_token_budget() -> None:
    guard = make_guard(Clock(), roomy(tokens=100))
    next_page = page_after_page()

    def plan(observation: Any) -> Call:
        guard.spend_tokens(60)
        return next_page(observation)

    Script(Planner(plan), Executor(Result(Kind.SUCCESS))).run(guard)
    assert guard.summary_turn() is not None

    report = guard.record_summary("Out of tokens.", tokens=30)

    assert report.reason is Reason.TOKEN_BUDGET
    assert report.tokens == 150
    assert report.remaining["tokens"] == 0


def test_the_summary_turn_reserves_its_cost_and_its_real_cost_replaces_it() -> None:
    guard = make_guard(Clock(), roomy(model_calls=1, spend=100))
    _pages().run(guard, reserve=lambda observation: 30)
    assert guard.usage.spend == 30

    assert guard.summary_turn(reserve=20) is not None
    assert guard.usage.spend == 50  # reserved while the summary call runs

    report = guard.record_summary("One page read.", cost=7)

    assert report.spend == 37
    assert report.remaining["spend"] == 63


def test_a_summary_turn_whose_cost_does_not_fit_the_spend_left_is_not_offered() -> None:
    guard = make_guard(Clock(), roomy(model_calls=1, spend=40))
    _pages().run(guard, reserve=lambda observation: 30)

    assert guard.summary_turn(reserve=11) is None
    assert guard.usage.spend == 30  # nothing reserved for a turn that was not offered
    assert guard.report is not None and guard.report.summary is None
    assert guard.summary_turn(reserve=10) is not None  # what does fit may still be taken


def test_a_crash_during_the_summary_turn_keeps_its_reservation_spent() -> None:
    clock = Clock()
    guard = make_guard(clock, roomy(model_calls=1, spend=100))
    _pages().run(guard)
    assert guard.summary_turn(reserve=25) is not None

    restored = Guard.restore(guard.checkpoint(), roomy(model_calls=1, spend=100), now=clock.now)

    assert restored.usage.spend == 25


def test_a_spend_budget_stop_offers_no_summary_turn() -> None:
    guard = make_guard(Clock(), roomy(spend=50))
    report = _pages().run(guard, reserve=lambda observation: 20)

    assert report.reason is Reason.SPEND_BUDGET
    assert guard.summary_turn() is None  # money is reserved before it is spent, a summary too


def test_run_reserves_the_summary_turns_cost_as_it_does_every_model_calls() -> None:
    guard = make_guard(Clock(), roomy(model_calls=1, spend=100))

    report = _pages().run(
        guard, reserve=lambda observation: 30, summarise=lambda prompt: "One page read."
    )

    assert report.summary == "One page read."
    assert report.spend == 60


def test_after_the_summary_the_task_stays_stopped_with_the_summarised_report() -> None:
    guard, script, _ = _out_of_model_calls()
    assert guard.summary_turn() is not None
    report = guard.record_summary("Done what I could.")

    assert guard.report is report
    assert guard.before_model() is report
    assert guard.before_tools(read("read_page", page=9)) is report
    assert guard.before_wait() is report
    assert guard.summary_turn() is None
    assert_stays_stopped(guard, script, report)


def test_a_summary_needs_its_turn_and_is_kept_once() -> None:
    guard, _, _ = _out_of_model_calls()
    with pytest.raises(ValueError):
        guard.record_summary("not asked for")

    assert guard.summary_turn() is not None
    guard.record_summary("first")
    with pytest.raises(ValueError):
        guard.record_summary("second")
    assert guard.report is not None and guard.report.summary == "first"


def test_a_summary_of_a_running_task_is_refused() -> None:
    guard = make_guard(Clock(), roomy())
    with pytest.raises(ValueError):
        guard.record_summary("too early")


def test_a_finish_as_the_summary_keeps_its_answer() -> None:
    guard, _, _ = _out_of_model_calls()
    assert guard.summary_turn() is not None

    report = guard.record_summary(Finish("Two pages read."))

    assert report.summary == "Two pages read."
    assert report.state is State.PARTIAL  # a finish in the summary verifies nothing


@pytest.mark.parametrize(
    "reply",
    [
        Call("send_notice", {"text": "hi"}, effect="write", operation_key="k"),
        [read("read_page", page=3), read("read_page", page=4)],
    ],
    ids=["one call", "several calls"],
)
def test_a_tool_call_as_the_summary_is_not_run(reply: Any) -> None:
    guard, script, _ = _out_of_model_calls()
    entered = script.execute.entries
    assert guard.summary_turn() is not None

    report = guard.record_summary(reply)

    assert script.execute.entries == entered
    assert report.summary is not None
    assert "no tool may run" in report.summary
    assert report.executions == entered


@pytest.mark.parametrize(
    ("limits", "script_of"),
    [
        (roomy(same=1), lambda: scripted([read("lookup", id=1)])),
        (roomy(stagnant=2), _pages),
        (roomy(executions=1), _pages),
        (roomy(requests=1), _pages),
    ],
    ids=["same_call", "no_progress", "execution_budget", "request_budget"],
)
def test_other_budget_and_progress_stops_offer_a_summary(
    limits: Any, script_of: Callable[[], Script]
) -> None:
    guard = make_guard(Clock(), limits)

    report = script_of().run(guard)

    assert report.reason in SUMMARY_REASONS
    assert guard.summary_turn() is not None


def test_a_deadline_stop_offers_a_summary() -> None:
    clock = Clock()
    guard = make_guard(clock, roomy(deadline_ms=100))

    def plan(observation: Any) -> Call:
        clock.advance(60)
        return read("read_page", page=clock.ms)

    report = Script(Planner(plan), Executor(Result(Kind.SUCCESS))).run(guard)

    assert report.reason is Reason.DEADLINE
    assert guard.summary_turn() is not None


# -- never after a stop a person must look at ------------------------------------------------


def _unknown_commit() -> tuple[Guard, Script]:
    # The tool says it succeeded, but the trusted records cannot confirm the write.
    script = scripted([notice()], [Result(Kind.SUCCESS)], [Evidence(0, False, committed=None)])
    return make_guard(Clock(), roomy()), script


def _lost_write() -> tuple[Guard, Script]:
    script = scripted([notice()], [TimeoutError("no answer")], [Evidence(0, False)])
    return make_guard(Clock(), roomy()), script


def _spend_budget() -> tuple[Guard, Script]:
    return make_guard(Clock(), roomy(spend=0)), scripted([read("lookup", id=1)])


def _conflict() -> tuple[Guard, Script]:
    notices = Notices()
    script = notices.script(notice("one"), notice("two"))
    return make_guard(Clock(), roomy(), ledger=InMemoryLedger()), script


def _operator_stop() -> tuple[Guard, Script]:
    guard = make_guard(Clock(), roomy())
    guard.cancel()
    return guard, scripted([read("lookup", id=1)])


def _fatal() -> tuple[Guard, Script]:
    return make_guard(Clock(), roomy()), scripted([read("lookup", id=1)], [Result(Kind.FATAL)])


def _planner_error() -> tuple[Guard, Script]:
    return make_guard(Clock(), roomy()), scripted([RuntimeError("model down")])


def _approval_required() -> tuple[Guard, Script]:
    guard = make_guard(Clock(), roomy(), needs_approval=lambda call: True)
    return guard, scripted([notice()])


def _goal_met() -> tuple[Guard, Script]:
    return make_guard(Clock(), roomy()), scripted([Finish()], evidence=[Evidence(1, True)])


@pytest.mark.parametrize(
    ("setup", "reason"),
    [
        (_unknown_commit, Reason.UNKNOWN_COMMIT),
        (_lost_write, Reason.EXECUTOR_ERROR),
        (_spend_budget, Reason.SPEND_BUDGET),
        (_conflict, Reason.OPERATION_CONFLICT),
        (_operator_stop, Reason.OPERATOR_STOP),
        (_fatal, Reason.FATAL),
        (_planner_error, Reason.PLANNER_ERROR),
        (_approval_required, Reason.APPROVAL_REQUIRED),
        (_goal_met, Reason.GOAL_MET),
    ],
    ids=lambda value: str(value) if isinstance(value, Reason) else "",
)
def test_no_summary_is_offered_after_a_stop_a_person_must_look_at(
    setup: Callable[[], tuple[Guard, Script]], reason: Reason
) -> None:
    guard, script = setup()
    asked: list[str] = []

    def summarise(prompt: str) -> str:
        asked.append(prompt)
        return "summary"

    report = script.run(guard, summarise=summarise)

    assert report.reason is reason
    assert asked == []
    assert report.summary is None
    assert guard.summary_turn() is None
    with pytest.raises(ValueError):
        guard.record_summary("not offered")


# -- run(summarise=) -------------------------------------------------------------------------


def test_run_takes_the_summary_turn_and_keeps_its_text() -> None:
    guard = make_guard(Clock(), roomy(model_calls=2))
    script = _pages()
    prompts: list[str] = []

    def summarise(prompt: str) -> str:
        prompts.append(prompt)
        return "Read pages 1 and 2."

    report = script.run(guard, summarise=summarise)

    assert report.reason is Reason.MODEL_BUDGET
    assert report.summary == "Read pages 1 and 2."
    assert len(prompts) == 1 and "model_budget" in prompts[0]
    assert script.plan.calls == 2  # the summary turn is not one of the planner's calls
    assert guard.report is report


def test_run_with_a_summarise_that_raises_still_returns_the_report_with_a_note() -> None:
    guard = make_guard(Clock(), roomy(model_calls=1))

    def summarise(prompt: str) -> str:
        raise RuntimeError("model unavailable")

    report = _pages().run(guard, summarise=summarise)

    assert report.reason is Reason.MODEL_BUDGET
    assert report.summary is not None
    assert "summary turn failed" in report.summary
    assert "model unavailable" in report.summary


def test_run_with_a_summarise_that_asks_for_a_tool_runs_nothing() -> None:
    guard = make_guard(Clock(), roomy(model_calls=1))
    script = _pages()

    report = script.run(guard, summarise=lambda prompt: read("read_page", page=99))

    assert script.execute.entries == 1  # the first model call's read only
    assert report.summary is not None and "no tool may run" in report.summary


def test_run_again_after_the_summary_offers_no_second_turn() -> None:
    guard = make_guard(Clock(), roomy(model_calls=1))
    script = _pages()
    asked: list[str] = []

    def summarise(prompt: str) -> str:
        asked.append(prompt)
        return "once"

    report = script.run(guard, summarise=summarise)
    again = script.run(guard, summarise=summarise)

    assert again is report
    assert len(asked) == 1
    assert again.summary == "once"
