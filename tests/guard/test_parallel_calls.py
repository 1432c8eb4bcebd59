"""Parallel calls: every call of one model call is checked before any of them runs."""

from __future__ import annotations

from typing import Any

import pytest

from guard import Call, Finish, Kind, OperationState, Reason, Result, State

from .support import (
    NOTICE_KEY,
    Clock,
    Executor,
    Inspector,
    Notices,
    Planner,
    Script,
    assert_stays_stopped,
    base_limits,
    make_guard,
    notice,
    read,
    roomy,
    scripted,
    statuses,
    succeed,
    tools,
)

# -- parallel calls -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("bad", "state", "reason"),
    [
        (read("search", q=float("nan")), State.FAILED, Reason.BAD_ARGS),
        (
            Call("charge", {"amount": 5}, effect="write"),
            State.NEEDS_HUMAN,
            Reason.MISSING_OPERATION_KEY,
        ),
        ("not a call", State.FAILED, Reason.BAD_CALL),
        (Call("", {}), State.FAILED, Reason.BAD_CALL),
    ],
    ids=["bad-args", "missing-key", "not-a-call", "no-tool-name"],
)
def test_a_bad_second_call_means_the_first_never_executes(
    bad: Any, state: State, reason: Reason
) -> None:
    guard = make_guard(Clock())
    script = scripted([[read("read_inbox", folder="open"), bad]])

    report = script.run(guard)

    assert (report.state, report.reason) == (state, reason)
    assert script.execute.entries == 0
    assert report.executions == 0


def test_a_batch_larger_than_the_execution_budget_runs_none_of_its_calls() -> None:
    guard = make_guard(Clock(), base_limits(executions=2))
    script = scripted([[read("a"), read("b"), read("c")]])

    report = script.run(guard)

    assert (report.state, report.reason) == (State.PARTIAL, Reason.EXECUTION_BUDGET)
    assert script.execute.entries == 0


def test_a_batch_larger_than_the_request_budget_runs_none_of_its_calls() -> None:
    guard = make_guard(Clock(), base_limits(requests=2))
    script = scripted([[read("a"), read("b"), read("c")]])

    report = script.run(guard)

    assert (report.state, report.reason) == (State.PARTIAL, Reason.REQUEST_BUDGET)
    assert script.execute.entries == 0


def test_each_call_of_a_batch_gets_its_own_result_in_order() -> None:
    guard = make_guard(Clock(), roomy())
    script = Script(
        Planner([read("a"), read("b"), read("c")], Finish()),
        Executor(lambda call: Result(Kind.SUCCESS, data=f"from {call.tool}")),
    )

    script.run(guard)

    assert script.plan.observations[1] == [
        Result(Kind.SUCCESS, data="from a"),
        Result(Kind.SUCCESS, data="from b"),
        Result(Kind.SUCCESS, data="from c"),
    ]


def test_a_failing_call_stops_the_task_without_losing_the_siblings_that_ran() -> None:
    notices = Notices()

    def lookup_customer(call: Call) -> Result:
        raise ConnectionError("customer service unreachable")

    guard = make_guard(Clock())
    script = Script(
        Planner([notice(), read("lookup_customer", id=7), read("read_inbox", folder="open")]),
        tools(send_notice=notices.send, lookup_customer=lookup_customer, read_inbox=succeed),
        Inspector(notices.inspect),
    )

    report = script.run(guard)

    assert (report.state, report.reason) == (State.FAILED, Reason.EXECUTOR_ERROR)
    assert [call.tool for call in script.execute.calls] == ["send_notice", "lookup_customer"]
    assert statuses(report) == ["ran", "ran", "not_run"]
    assert [(op.key, op.state) for op in report.operations] == [
        (NOTICE_KEY, OperationState.COMMITTED)
    ]
    assert [step["tool"] for step in report.completed] == ["send_notice"]
    assert guard.ledger.get(NOTICE_KEY) is not None
    assert_stays_stopped(guard, script, report)


def test_a_write_key_twice_in_one_batch_executes_once_and_both_get_its_result() -> None:
    notices = Notices()
    guard = make_guard(Clock())
    script = Script(
        Planner([notice(), notice()], Finish()),
        tools(send_notice=notices.send),
        Inspector(notices.inspect),
    )

    report = script.run(guard)

    assert script.execute.entries == 1
    receipt = Result(Kind.SUCCESS, {"notice_id": "n-1"})
    assert script.plan.observations[1] == [receipt, receipt]
    assert report.reason is Reason.GOAL_UNVERIFIED
    assert report.executions == 1


def test_the_deadline_is_checked_again_before_each_call_of_a_batch() -> None:
    clock = Clock()

    def slow(call: Call) -> Result:
        clock.advance(1000)
        return Result(Kind.SUCCESS)

    guard = make_guard(clock, base_limits(deadline_ms=1000))
    script = Script(Planner([read("slow"), read("next")]), tools(slow=slow, next=slow))

    report = script.run(guard)

    assert (report.state, report.reason) == (State.PARTIAL, Reason.DEADLINE)
    assert [call.tool for call in script.execute.calls] == ["slow"]
    assert statuses(report) == ["ran", "not_run"]


def test_internal_retries_in_a_batch_can_use_up_the_budget_of_later_calls() -> None:
    def retried(call: Call) -> Result:
        return Result(Kind.SUCCESS, attempts=3)

    guard = make_guard(Clock(), roomy(executions=3))
    script = Script(Planner([read("first"), read("second")]), tools(first=retried))

    report = script.run(guard)

    assert (report.state, report.reason) == (State.PARTIAL, Reason.EXECUTION_BUDGET)
    assert [call.tool for call in script.execute.calls] == ["first"]
    assert statuses(report) == ["ran", "not_run"]
    assert report.executions == 3


def test_a_write_key_twice_in_one_batch_with_other_input_is_a_conflict() -> None:
    notices = Notices()
    guard = make_guard(Clock())
    script = Script(
        Planner([notice("First notice"), notice("Second wording")]),
        tools(send_notice=notices.send),
        Inspector(notices.inspect),
    )

    report = script.run(guard)

    assert (report.state, report.reason) == (State.NEEDS_HUMAN, Reason.OPERATION_CONFLICT)
    assert script.execute.entries == 0


def test_a_write_executing_beside_the_call_that_stopped_the_task_is_still_settled() -> None:
    # A host that runs a batch at once (the Agents SDK): the read fails for good while the
    # write runs; the write's outcome, reported afterwards, must reach the ledger.
    from guard import Call, Evidence, InMemoryLedger, Kind, OperationState, Result, State
    from guard.steps import Action

    from .support import Clock, make_guard, roomy

    ledger = InMemoryLedger()
    guard = make_guard(Clock(), roomy(), ledger=ledger)
    write = Call("send", {"n": 1}, "write", "k1")
    assert guard.before_model() is None
    tickets = guard.before_tools([write, Call("read", {"n": 1})])
    assert isinstance(tickets, list)
    assert [guard.before_tool(t).action for t in tickets] == [Action.EXECUTE, Action.EXECUTE]

    def inspect(result: object, step: object) -> Evidence:
        return Evidence(0, False, committed=True)

    stop = guard.after_tool(tickets[1], Result(Kind.FATAL), inspect=inspect)
    assert stop is not None and stop.state is State.FAILED
    after = guard.after_tool(tickets[0], Result(Kind.SUCCESS, {"sent": 1}), inspect=inspect)

    assert after is stop  # the stop stands
    entry = ledger.get("k1")
    assert entry is not None and entry.state is OperationState.COMMITTED
