"""The step-by-step API other agent loops use, and what it refuses."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from guard import (
    Call,
    Evidence,
    Finish,
    Guard,
    InMemoryLedger,
    Kind,
    Nudge,
    OperationState,
    Reason,
    Report,
    Result,
    State,
)
from guard.steps import Action

from .support import (
    NOTICE_KEY,
    Clock,
    Inspector,
    Notices,
    Planner,
    Records,
    Script,
    functions,
    make_guard,
    notice,
    read,
    roomy,
    tools,
)

# -- step by step -------------------------------------------------------------------------


def step_by_step(guard: Guard, clock: Clock, plan: Any, execute: Any, inspect: Any) -> Report:
    """The loop of docs/guard.md, written the way another agent framework would."""
    observation: Any = None
    while True:
        stop = guard.before_model()
        if stop is not None:
            return stop
        proposal = plan(observation)
        if isinstance(proposal, Finish):
            return guard.finish(proposal, inspect)
        admitted = guard.before_tools(proposal)
        if isinstance(admitted, Report):
            return admitted
        if isinstance(admitted, Nudge):
            observation = admitted
            continue
        results: list[Result] = []
        for ticket in admitted:
            decision = guard.before_tool(ticket)
            if decision.action is Action.STOP:
                assert decision.report is not None
                return decision.report
            reused = decision.action is Action.REUSE
            result = decision.result if reused else execute(ticket.call)
            stop = guard.after_tool(ticket, result, inspect=inspect)
            if stop is not None:
                return stop
            assert result is not None
            results.append(result)
        pause = guard.before_wait()
        if isinstance(pause, Report):
            return pause
        if pause:
            clock.wait(pause)
        observation = results if isinstance(proposal, list) else results[0]


def paging_with_a_retry() -> Script:
    records = Records()
    busy = [True]

    def read_page(call: Call) -> Result:
        if call.args["page"] == 1 and busy[0]:
            busy[0] = False
            return Result(Kind.RETRYABLE, wait_ms=25)
        records.revision += 1
        records.done = records.revision == 3
        return Result(Kind.SUCCESS, {"page": call.args["page"]})

    page = [read("read_page", page=n) for n in (1, 2, 3)]
    return Script(
        Planner(page[0], page[0], [page[1], page[2]], Finish()),
        tools(read_page=read_page),
        Inspector(records.inspect),
    )


def reusing_a_notice() -> Script:
    notices = Notices()
    return Script(Planner(notice()), tools(send_notice=notices.send), Inspector(notices.inspect))


@pytest.mark.parametrize("scenario", [paging_with_a_retry, reusing_a_notice])
def test_the_step_by_step_api_reproduces_what_run_does(scenario: Callable[[], Script]) -> None:
    by_run, run_clock = scenario(), Clock()
    expected = make_guard(run_clock, roomy(stagnant=3)).run(*functions(by_run))

    by_steps, step_clock = scenario(), Clock()
    guard = make_guard(step_clock, roomy(stagnant=3))
    report = step_by_step(guard, step_clock, *functions(by_steps))

    assert report == expected
    assert by_steps.plan.observations == by_run.plan.observations
    assert by_steps.execute.calls == by_run.execute.calls
    assert step_clock.waits == run_clock.waits
    assert guard.before_model() is report


def test_the_paging_scenario_completes_step_by_step() -> None:
    script, clock = paging_with_a_retry(), Clock()
    report = step_by_step(make_guard(clock, roomy()), clock, *functions(script))

    assert (report.state, report.reason, report.revision) == (State.COMPLETED, Reason.GOAL_MET, 3)
    assert clock.waits == [25]
    assert script.execute.entries == 4


def test_a_write_executed_but_never_reported_is_a_lost_write_at_the_next_model_call() -> None:
    ledger = InMemoryLedger()
    guard = make_guard(Clock(), ledger=ledger)
    assert guard.before_model() is None
    admitted = guard.before_tools(notice())
    assert isinstance(admitted, list)
    decision = guard.before_tool(admitted[0])
    assert decision.action is Action.EXECUTE
    # ... the tool runs, and the caller crashes or forgets to call after_tool.

    report = guard.before_model()

    assert isinstance(report, Report)
    assert report.state is State.NEEDS_HUMAN
    assert [(op.key, op.state) for op in report.uncertain] == [(NOTICE_KEY, OperationState.UNKNOWN)]
    entry = ledger.get(NOTICE_KEY)
    assert entry is not None and entry.state is OperationState.UNKNOWN
    assert report.model_calls == 1


def test_before_tools_without_before_model_is_refused() -> None:
    guard = make_guard(Clock())
    with pytest.raises(ValueError):
        guard.before_tools(read("read_inbox"))


def test_a_second_proposal_for_one_model_call_is_refused() -> None:
    guard = make_guard(Clock())
    assert guard.before_model() is None
    guard.before_tools(read("read_inbox"))
    with pytest.raises(ValueError):
        guard.before_tools(read("read_queue"))


def test_finish_without_before_model_is_refused() -> None:
    guard = make_guard(Clock())
    with pytest.raises(ValueError):
        guard.finish(Finish(), Inspector(Evidence(0, True)))


def test_a_ticket_from_an_earlier_model_call_is_refused() -> None:
    guard = make_guard(Clock(), roomy())
    assert guard.before_model() is None
    old = guard.before_tools(read("read_page", page=1))
    assert isinstance(old, list)
    decision = guard.before_tool(old[0])
    guard.after_tool(old[0], Result(Kind.SUCCESS), inspect=Inspector(Evidence(1, False)))
    assert decision.action is Action.EXECUTE
    assert guard.before_model() is None
    guard.before_tools(read("read_page", page=2))

    with pytest.raises(ValueError):
        guard.before_tool(old[0])


def test_reporting_a_result_for_a_ticket_that_was_never_let_through_is_refused() -> None:
    guard = make_guard(Clock())
    assert guard.before_model() is None
    admitted = guard.before_tools(read("read_inbox"))
    assert isinstance(admitted, list)

    with pytest.raises(ValueError):
        guard.after_tool(admitted[0], Result(Kind.SUCCESS), inspect=Inspector(Evidence(0, False)))


def test_the_host_can_halt_the_guard_and_the_stop_is_sticky() -> None:
    clock = Clock()
    guard = make_guard(clock)
    assert guard.before_model() is None
    admitted = guard.before_tools(read("read_inbox"))
    assert isinstance(admitted, list)

    report = guard.halt(State.NEEDS_HUMAN, Reason.UNKNOWN_COMMIT, "ledger: the record failed")

    assert (report.state, report.reason) == (State.NEEDS_HUMAN, Reason.UNKNOWN_COMMIT)
    assert report.detail == "ledger: the record failed"
    assert (report.model_calls, report.requests, report.executions) == (1, 1, 0)
    decision = guard.before_tool(admitted[0])
    assert decision.action is Action.STOP and decision.report is report
    assert guard.before_model() is report
    assert guard.halt(State.FAILED, Reason.FATAL) is report  # the first word stands


def test_halting_takes_only_the_words_of_the_contract() -> None:
    guard = make_guard(Clock())
    assert guard.before_model() is None
    with pytest.raises(ValueError):
        guard.halt("STOPPED", Reason.FATAL)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        guard.halt(State.FAILED, "tired")  # type: ignore[arg-type]
    # A refused halt changed nothing: the model call in progress still proposes.
    assert isinstance(guard.before_tools(read("read_inbox")), list)
