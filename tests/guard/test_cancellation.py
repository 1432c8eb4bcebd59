"""Cancellation: an operator's stop is honoured before the next model call, execution
or wait."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from guard import Call, InMemoryLedger, Kind, OperationState, Reason, Result, State

from .support import (
    NOTICE_KEY,
    Clock,
    Executor,
    Planner,
    Script,
    assert_stays_stopped,
    make_guard,
    notice,
    read,
    roomy,
    scripted,
    statuses,
    tools,
)

# -- cancellation -------------------------------------------------------------------------


def test_a_task_cancelled_before_it_starts_plans_and_executes_nothing() -> None:
    stop = threading.Event()
    stop.set()
    guard = make_guard(Clock(), cancel=stop)
    script = scripted([read("read_inbox")])

    report = script.run(guard)

    assert (report.state, report.reason) == (State.CANCELLED, Reason.OPERATOR_STOP)
    assert (script.plan.calls, script.execute.entries, report.model_calls) == (0, 0, 0)


def test_an_event_set_while_the_model_plans_stops_the_task_before_the_tool_runs() -> None:
    stop = threading.Event()
    guard = make_guard(Clock(), cancel=stop)

    def plan(observation: Any) -> Call:
        stop.set()
        return read("read_inbox")

    script = Script(Planner(plan), Executor(Result(Kind.SUCCESS)))

    report = script.run(guard)

    assert (report.state, report.reason) == (State.CANCELLED, Reason.OPERATOR_STOP)
    assert script.execute.entries == 0
    assert_stays_stopped(guard, script, report)


def test_a_cancel_callable_stops_the_task_before_the_next_model_call() -> None:
    flag = {"stop": False}

    def read_page(call: Call) -> Result:
        if call.args["page"] == 2:
            flag["stop"] = True  # the operator presses Stop while page 2 is read
        return Result(Kind.SUCCESS)

    guard = make_guard(Clock(), roomy(), cancel=lambda: flag["stop"])
    script = Script(
        Planner(*(read("read_page", page=n) for n in range(1, 10))), tools(read_page=read_page)
    )

    report = script.run(guard)

    assert (report.state, report.reason) == (State.CANCELLED, Reason.OPERATOR_STOP)
    assert script.execute.entries == 2
    assert script.plan.calls == 2


def test_guard_cancel_from_the_planner_stops_the_task_before_the_tool_runs() -> None:
    guard = make_guard(Clock(), roomy())

    def plan(observation: Any) -> Call:
        if observation is not None:
            guard.cancel()
        return read("read_page", page=2 if observation is not None else 1)

    script = Script(Planner(plan), Executor(Result(Kind.SUCCESS)))

    report = script.run(guard)

    assert (report.state, report.reason) == (State.CANCELLED, Reason.OPERATOR_STOP)
    assert script.execute.calls == [read("read_page", page=1)]


def test_cancelling_during_one_call_of_a_batch_keeps_the_rest_from_running() -> None:
    stop = threading.Event()

    def first(call: Call) -> Result:
        stop.set()
        return Result(Kind.SUCCESS)

    guard = make_guard(Clock(), cancel=stop)
    script = Script(Planner([read("first"), read("second")]), tools(first=first, second=first))

    report = script.run(guard)

    assert (report.state, report.reason) == (State.CANCELLED, Reason.OPERATOR_STOP)
    assert [call.tool for call in script.execute.calls] == ["first"]
    assert statuses(report) == ["ran", "not_run"]


def test_cancelling_during_a_call_that_asks_to_wait_ends_without_waiting() -> None:
    stop = threading.Event()

    def busy(call: Call) -> Result:
        stop.set()
        return Result(Kind.RETRYABLE, wait_ms=50)

    clock = Clock()
    guard = make_guard(clock, cancel=stop)
    script = Script(Planner(read("busy")), tools(busy=busy))

    report = script.run(guard)

    assert (report.state, report.reason) == (State.CANCELLED, Reason.OPERATOR_STOP)
    assert clock.waits == []
    assert script.execute.entries == 1


def test_a_write_interrupted_by_cancellation_is_left_unknown_for_a_human() -> None:
    stop = threading.Event()

    def send_notice(call: Call) -> Result:
        stop.set()
        raise ConnectionAbortedError("worker shutting down mid-request")

    guard = make_guard(Clock(), cancel=stop)
    script = Script(Planner(notice()), tools(send_notice=send_notice))

    report = script.run(guard)

    assert report.state is State.NEEDS_HUMAN
    assert [(op.key, op.state) for op in report.uncertain] == [(NOTICE_KEY, OperationState.UNKNOWN)]
    assert script.execute.entries == 1
    assert_stays_stopped(guard, script, report)


def test_an_interrupt_during_a_write_leaves_it_unknown_and_propagates() -> None:
    def send_notice(call: Call) -> Result:
        raise KeyboardInterrupt

    ledger = InMemoryLedger()
    guard = make_guard(Clock(), ledger=ledger)
    script = Script(Planner(notice()), tools(send_notice=send_notice))

    with pytest.raises(KeyboardInterrupt):
        script.run(guard)

    entry = ledger.get(NOTICE_KEY)
    assert entry is not None and entry.state is OperationState.UNKNOWN
    assert guard.report is not None and guard.report.state is State.NEEDS_HUMAN
