"""What the guard does beyond the behaviour table.

Longer cycles, polling a ``PENDING`` job, exempt tools, token budgets, parallel calls,
cancellation, nudging, lookups of lost writes, a tool's own retries, resumption with spent
budgets, and the step-by-step API that other agent loops use.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from typing import Any

import pytest

from guard import (
    Action,
    Call,
    Evidence,
    Finish,
    Guard,
    InMemoryLedger,
    Kind,
    Limits,
    Nudge,
    OperationState,
    Reason,
    Report,
    Result,
    Settlement,
    State,
)

from .support import (
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
    scripted,
)

NOTICE_KEY = "incident-42-first-notice"


def roomy(**changes: Any) -> Limits:
    """Budgets wide enough that only the rule under test can stop the task."""
    room = {
        "deadline_ms": 100_000,
        "model_calls": 50,
        "requests": 50,
        "executions": 50,
        "stagnant": 50,
    }
    return base_limits(**{**room, **changes})


def read(tool: str, **args: Any) -> Call:
    return Call(tool, args)


class Records:
    """Trusted business records: a revision the tools raise, and which writes took effect."""

    def __init__(self) -> None:
        self.revision = 0
        self.done = False
        self.committed: dict[str, bool | None] = {}

    def inspect(self, result: Result | None, subject: Call | Finish) -> Evidence:
        if isinstance(subject, Call) and subject.effect == "write":
            assert subject.operation_key is not None
            committed = self.committed.get(subject.operation_key)
            return Evidence(self.revision, self.done, committed=committed)
        return Evidence(self.revision, self.done)


def tools(**handlers: Callable[[Call], Any]) -> Executor:
    """One executor for several tools; every real entry is counted by the Executor."""
    return Executor(lambda call: handlers[call.tool](call))


def functions(script: Script) -> tuple[Any, Any, Any]:
    """The planner, executor and inspector of ``script``, for ``run`` or a loop of steps."""
    return script.plan, script.execute, script.inspect


def succeed(call: Call) -> Result:
    return Result(Kind.SUCCESS)


def statuses(report: Report) -> list[str]:
    return [item["status"] for item in report.batch]


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


# -- tokens -------------------------------------------------------------------------------


def test_tokens_reported_by_the_planner_stop_the_task_before_the_next_model_call() -> None:
    guard = make_guard(Clock(), roomy(tokens=100))
    pages = iter(range(1, 100))

    def plan(observation: Any) -> Call:
        guard.spend_tokens(60)
        return read("read_page", page=next(pages))

    script = Script(Planner(plan), Executor(Result(Kind.SUCCESS)))

    report = script.run(guard)

    assert (report.state, report.reason) == (State.PARTIAL, Reason.TOKEN_BUDGET)
    assert script.plan.calls == 2
    assert report.model_calls == 2
    assert report.tokens == 120
    assert report.remaining["tokens"] == 0
    assert script.execute.entries == 2  # the second model call's tool still ran


def test_spending_negative_tokens_is_refused() -> None:
    guard = make_guard(Clock())
    with pytest.raises(ValueError):
        guard.spend_tokens(-1)
    assert guard.usage.tokens == 0


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


# -- lookup of lost writes ----------------------------------------------------------------


def lost_write(records: Records) -> Script:
    def send_notice(call: Call) -> Result:
        raise TimeoutError("no response from the notice service")

    return Script(
        Planner(notice(), Finish()), tools(send_notice=send_notice), Inspector(records.inspect)
    )


def test_a_lost_write_settled_as_committed_by_lookup_goes_on_without_a_human() -> None:
    records = Records()
    ledger = InMemoryLedger()
    asked: list[str] = []
    found = Result(Kind.SUCCESS, {"notice_id": "n-9"})

    def lookup(key: str) -> Settlement:
        asked.append(key)
        records.revision, records.done = 1, True
        return Settlement(committed=True, result=found, evidence="n-9 in the outbox")

    guard = make_guard(Clock(), ledger=ledger)
    script = lost_write(records)

    report = script.run(guard, lookup=lookup)

    assert asked == [NOTICE_KEY]
    assert report.state is not State.NEEDS_HUMAN
    assert report.uncertain == ()
    entry = ledger.get(NOTICE_KEY)
    assert entry is not None
    assert (entry.state, entry.result) == (OperationState.COMMITTED, found)
    assert script.execute.entries == 1


def test_a_lost_write_settled_by_lookup_hands_its_result_to_the_model() -> None:
    records = Records()
    found = Result(Kind.SUCCESS, {"notice_id": "n-9"})
    guard = make_guard(Clock())
    script = lost_write(records)

    script.run(guard, lookup=lambda key: Settlement(committed=True, result=found))

    assert script.plan.observations[1] == found


def test_a_lost_write_settled_as_not_committed_by_lookup_fails_and_may_be_retried() -> None:
    ledger = InMemoryLedger()
    guard = make_guard(Clock(), ledger=ledger)
    script = lost_write(Records())

    report = script.run(guard, lookup=lambda key: Settlement(committed=False, evidence="absent"))

    assert report.state is State.FAILED
    entry = ledger.get(NOTICE_KEY)
    assert entry is not None and entry.state is OperationState.NOT_COMMITTED
    assert report.uncertain == ()


def _raise(key: str) -> Any:
    raise RuntimeError("lookup service down")


@pytest.mark.parametrize(
    "lookup",
    [
        _raise,
        lambda key: "committed",
        lambda key: None,
        lambda key: True,
        lambda key: Settlement(committed=None),
        lambda key: Settlement(committed="yes"),  # type: ignore[arg-type]
        lambda key: Settlement(committed=True, result="receipt"),  # type: ignore[arg-type]
    ],
    ids=["raises", "text", "none", "bare-bool", "cannot-tell", "odd-flag", "junk-result"],
)
def test_a_lost_write_that_lookup_cannot_settle_stays_unknown_for_a_human(
    lookup: Callable[[str], Any],
) -> None:
    ledger = InMemoryLedger()
    guard = make_guard(Clock(), ledger=ledger)
    script = lost_write(Records())

    report = script.run(guard, lookup=lookup)

    assert report.state is State.NEEDS_HUMAN
    entry = ledger.get(NOTICE_KEY)
    assert entry is not None and entry.state is OperationState.UNKNOWN
    assert [op.key for op in report.uncertain] == [NOTICE_KEY]
    assert script.execute.entries == 1


def test_a_write_the_inspector_cannot_confirm_is_settled_by_lookup() -> None:
    records = Records()  # knows nothing about commits: committed=None
    ledger = InMemoryLedger()
    guard = make_guard(Clock(), ledger=ledger)
    script = Script(
        Planner(notice(), Finish()),
        Executor(Result(Kind.SUCCESS, {"notice_id": "n-1"})),
        Inspector(records.inspect),
    )

    report = script.run(guard, lookup=lambda key: Settlement(committed=True))

    assert report.state is not State.NEEDS_HUMAN
    entry = ledger.get(NOTICE_KEY)
    assert entry is not None and entry.state is OperationState.COMMITTED


def test_a_write_verified_as_not_committed_runs_again_with_the_same_key_and_input() -> None:
    records, ledger = Records(), InMemoryLedger()
    answers = iter([Result(Kind.RETRYABLE, wait_ms=10), Result(Kind.SUCCESS, {"notice_id": "n-1"})])

    def send_notice(call: Call) -> Result:
        answer = next(answers)
        # The outbox is the trusted record: the first try left nothing, the second landed.
        records.committed[NOTICE_KEY] = answer.kind is Kind.SUCCESS
        return answer

    guard = make_guard(Clock(), ledger=ledger)
    script = Script(
        Planner(notice(), notice(), Finish()),
        tools(send_notice=send_notice),
        Inspector(records.inspect),
    )

    report = script.run(guard)

    assert script.execute.calls == [notice(), notice()]
    entry = ledger.get(NOTICE_KEY)
    assert entry is not None
    assert (entry.state, entry.attempts) == (OperationState.COMMITTED, 2)
    assert report.uncertain == ()


# -- a tool's own retries -----------------------------------------------------------------


def test_a_tools_internal_retries_are_charged_to_the_execution_budget() -> None:
    guard = make_guard(Clock(), roomy(executions=3))
    script = scripted(
        [read("read_page", page=1), read("read_page", page=2)],
        [Result(Kind.SUCCESS, attempts=3)],
    )

    report = script.run(guard)

    assert script.execute.entries == 1
    assert report.executions == 3
    assert (report.state, report.reason) == (State.PARTIAL, Reason.EXECUTION_BUDGET)


def test_each_internal_retry_counts_as_one_execution() -> None:
    guard = make_guard(Clock(), roomy())
    script = scripted(
        [read("read_page", page=1), read("read_page", page=2), Finish()],
        [Result(Kind.SUCCESS, attempts=2), Result(Kind.SUCCESS, attempts=4)],
    )

    report = script.run(guard)

    assert script.execute.entries == 2
    assert report.executions == 6


# -- resumption ---------------------------------------------------------------------------


def progress_by_page(first_page: int = 1, clock: Clock | None = None, ms: int = 0) -> Script:
    """A model reading page after page, each page a verified step forward taking ``ms``."""
    records = Records()
    pages = iter(range(first_page, 1000))

    def read_page(call: Call) -> Result:
        if clock is not None:
            clock.advance(ms)
        records.revision = call.args["page"]
        return Result(Kind.SUCCESS)

    return Script(
        Planner(lambda observation: read("read_page", page=next(pages))),
        tools(read_page=read_page),
        Inspector(records.inspect),
    )


def test_a_resumed_guard_counts_model_calls_from_what_was_already_spent() -> None:
    first = make_guard(Clock(), roomy(model_calls=3)).run(*functions(progress_by_page()))
    assert (first.reason, first.model_calls) == (Reason.MODEL_BUDGET, 3)

    script = progress_by_page(first_page=first.revision + 1)
    guard = make_guard(Clock(), roomy(model_calls=5), used=first.usage, revision=first.revision)
    report = script.run(guard)

    assert (report.state, report.reason) == (State.PARTIAL, Reason.MODEL_BUDGET)
    assert script.plan.calls == 2
    assert report.model_calls == 5
    assert report.requests == 5
    assert report.executions == 5


def test_a_resumed_guard_keeps_the_time_already_spent() -> None:
    clock = Clock()
    first_guard = make_guard(clock, roomy(deadline_ms=1000, model_calls=6))
    first = progress_by_page(clock=clock, ms=100).run(first_guard)
    assert (first.reason, first.elapsed_ms) == (Reason.MODEL_BUDGET, 600)

    new_clock = Clock(start=50_000)  # another worker, another monotonic clock
    resumed = progress_by_page(first.revision + 1, new_clock, ms=100)
    guard = make_guard(
        new_clock,
        roomy(deadline_ms=1000, model_calls=50),
        used=first.usage,
        revision=first.revision,
    )
    report = resumed.run(guard)

    assert (report.state, report.reason) == (State.PARTIAL, Reason.DEADLINE)
    assert resumed.execute.entries == 4
    assert report.elapsed_ms == 1000


def test_a_resumed_guard_does_not_count_the_carried_revision_as_new_progress() -> None:
    guard = make_guard(Clock(), base_limits(model_calls=20), revision=7)
    script = scripted(
        [
            read("read_page", page=1),
            read("read_page", page=2),
            read("read_page", page=3),
            read("read_page", page=4),
        ],
        evidence=[Evidence(7, False)],
    )

    report = script.run(guard)

    assert (report.state, report.reason) == (State.PARTIAL, Reason.NO_PROGRESS)
    assert script.execute.entries == 3
    assert report.revision == 7


def test_a_resumed_guard_refuses_a_revision_below_the_carried_one() -> None:
    guard = make_guard(Clock(), revision=7)
    script = scripted([read("read_page", page=1)], evidence=[Evidence(3, False)])

    report = script.run(guard)

    assert (report.state, report.reason) == (State.FAILED, Reason.INVALID_EVIDENCE)


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
