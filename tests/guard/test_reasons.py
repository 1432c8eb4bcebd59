"""Every terminal state and stop reason of the contract, each reached through ``Guard.run``.

Each scenario checks the state and reason and that no work started after the stop; the
stop report's JSON form is checked against the shape of the design's example.
"""

from __future__ import annotations

import json
import threading
from typing import Any, cast

import pytest

from guard import (
    Call,
    Evidence,
    Finish,
    Guard,
    InMemoryLedger,
    Kind,
    OperationState,
    Reason,
    Report,
    Result,
    State,
)
from guard.steps import IN_FLIGHT_WAIT_MS, RESUME_CONDITIONS, fingerprint

from .support import (
    Clock,
    Executor,
    Inspector,
    Notices,
    Pages,
    Planner,
    Script,
    assert_stays_stopped,
    base_limits,
    make_guard,
    notice,
    roomy,
    scripted,
)

STATES = ["COMPLETED", "PARTIAL", "FAILED", "NEEDS_HUMAN", "CANCELLED"]
REASONS = [
    "goal_met",
    "goal_unverified",
    "deadline",
    "model_budget",
    "request_budget",
    "execution_budget",
    "token_budget",
    "poll_budget",
    "same_call",
    "short_cycle",
    "no_progress",
    "planner_error",
    "bad_call",
    "bad_args",
    "missing_operation_key",
    "operation_conflict",
    "operation_in_flight",
    "unknown_commit",
    "executor_error",
    "bad_result",
    "invalid_evidence",
    "fatal",
    "precondition",
    "invalid_wait",
    "operator_stop",
    "spend_budget",
    "approval_required",
    "approval_rejected",
]

KEY = "incident-42-first-notice"


def _stopped(report: Report, state: State, reason: Reason) -> None:
    """The report says ``state``/``reason`` and its JSON form is a readable stop report."""
    assert (report.state, report.reason) == (state, reason), report.detail
    stop = json.loads(report.to_json())
    assert (stop["state"], stop["reason"]) == (str(state), str(reason))


# -- the words -------------------------------------------------------------------------------


def test_the_states_are_exactly_the_five_contract_words() -> None:
    assert sorted(str(state) for state in State) == sorted(STATES)
    assert all(State(word) == word for word in STATES)


def test_the_reasons_are_exactly_the_contract_words() -> None:
    assert sorted(str(reason) for reason in Reason) == sorted(REASONS)
    assert len(REASONS) == len(set(REASONS)) == 28
    assert all(Reason(word) == word for word in REASONS)


def test_every_reason_has_a_resume_condition() -> None:
    assert set(RESUME_CONDITIONS) == set(Reason)
    assert all(text.strip() for text in RESUME_CONDITIONS.values())


# -- finishing ---------------------------------------------------------------------------------


def test_a_finish_whose_answer_the_records_verify_completes_the_task() -> None:
    guard = make_guard(Clock())
    read_total = Call("read_order", {"order": 7})
    answer = Finish({"order": 7, "total": 1999})

    def records(result: Result | None, subject: Call | Finish) -> Evidence:
        # Reading the order is not the goal; answering with the recorded total is.
        if isinstance(subject, Finish):
            return Evidence(0, subject.answer == {"order": 7, "total": 1999})
        return Evidence(0, False)

    script = Script(
        Planner(read_total, answer),
        Executor(Result(Kind.SUCCESS, {"order": 7, "total": 1999})),
        Inspector(records),
    )

    report = script.run(guard)

    _stopped(report, State.COMPLETED, Reason.GOAL_MET)
    assert script.execute.calls == [read_total]
    assert script.inspect.seen[-1] == (None, answer)
    assert_stays_stopped(guard, script, report)


def test_a_finish_declared_before_anything_was_verified_is_goal_unverified() -> None:
    guard = make_guard(Clock())
    script = scripted([Finish("done, trust me")], evidence=[Evidence(0, False)])

    report = script.run(guard)

    _stopped(report, State.PARTIAL, Reason.GOAL_UNVERIFIED)
    assert script.execute.entries == 0
    assert_stays_stopped(guard, script, report)


# -- budgets -----------------------------------------------------------------------------------


def test_a_tool_that_outlasts_the_deadline_stops_the_next_model_call() -> None:
    clock = Clock()
    guard = make_guard(clock)

    def slow_read(call: Call) -> Result:
        clock.advance(1200)
        return Result(Kind.SUCCESS, {"rows": 10})

    script = Script(Planner(Call("read_report", {"day": "2024-05-01"})), Executor(slow_read))

    report = script.run(guard)

    _stopped(report, State.PARTIAL, Reason.DEADLINE)
    assert script.plan.calls == 1
    assert script.execute.entries == 1
    assert report.remaining["deadline_ms"] == 0
    assert_stays_stopped(guard, script, report)


def test_the_model_budget_stops_before_the_next_model_call() -> None:
    guard = make_guard(Clock(), base_limits(model_calls=3))
    pages = Pages(total=10)
    script = pages.script()

    report = script.run(guard)

    _stopped(report, State.PARTIAL, Reason.MODEL_BUDGET)
    assert (script.plan.calls, script.execute.entries) == (3, 3)
    assert report.remaining["model_calls"] == 0
    assert_stays_stopped(guard, script, report)


def test_the_request_budget_refuses_a_parallel_batch_before_any_of_it_runs() -> None:
    guard = make_guard(Clock(), base_limits(requests=2))
    batch = [Call("read_page", {"page": page}) for page in (1, 2, 3)]
    script = scripted([batch])

    report = script.run(guard)

    _stopped(report, State.PARTIAL, Reason.REQUEST_BUDGET)
    assert script.execute.entries == 0
    assert report.requests == 2  # the refused request is not counted
    assert report.call is not None and report.call["tool"] == "read_page"
    assert_stays_stopped(guard, script, report)


def test_an_adapters_internal_retries_spend_the_same_execution_budget() -> None:
    guard = make_guard(Clock(), base_limits(executions=3))
    pages = Pages(total=5)

    def read_after_two_internal_retries(call: Call) -> Result:
        page = pages.read(call)
        return Result(page.kind, page.data, attempts=3)

    script = Script(
        Planner(pages.next_page),
        Executor(read_after_two_internal_retries),
        Inspector(pages.inspect),
    )

    report = script.run(guard)

    _stopped(report, State.PARTIAL, Reason.EXECUTION_BUDGET)
    assert script.execute.entries == 1
    assert report.executions == 3
    assert script.plan.calls == 2
    assert_stays_stopped(guard, script, report)


def test_reusing_a_committed_write_needs_no_execution_budget() -> None:
    ledger = InMemoryLedger()
    guard = make_guard(Clock(), base_limits(executions=1, same=3), ledger=ledger)
    notices = Notices()
    script = notices.script(notice())

    report = script.run(guard)

    # The budget is spent by the first send; the repeats get its stored result until the
    # lack of progress stops the task, never an execution_budget refusal.
    _stopped(report, State.PARTIAL, Reason.NO_PROGRESS)
    assert script.execute.entries == 1
    assert (report.requests, report.executions) == (3, 1)
    assert_stays_stopped(guard, script, report)


def test_the_token_budget_stops_before_the_next_model_call() -> None:
    clock = Clock()
    pages = Pages(total=10)
    guard = make_guard(clock, base_limits(tokens=100))

    def costly_model(observation: Any) -> Call:
        guard.spend_tokens(60)
        return pages.next_page(observation)

    script = Script(Planner(costly_model), Executor(pages.read), Inspector(pages.inspect))

    report = script.run(guard)

    _stopped(report, State.PARTIAL, Reason.TOKEN_BUDGET)
    assert (script.plan.calls, script.execute.entries) == (2, 2)
    assert report.tokens == 120
    assert report.remaining["tokens"] == 0
    assert_stays_stopped(guard, script, report)


def test_polling_a_pending_job_beyond_its_poll_budget_stops_it() -> None:
    clock = Clock()
    guard = make_guard(clock, base_limits(polls=2))
    status = Call("export_status", {"job": "export-7"})
    script = scripted([status], [Result(Kind.PENDING, {"state": "running"}, wait_ms=10)])

    report = script.run(guard)

    _stopped(report, State.PARTIAL, Reason.POLL_BUDGET)
    assert script.execute.entries == 3  # the first request and two polls
    assert report.polls == 2
    assert clock.waits == [10, 10, 10]
    assert_stays_stopped(guard, script, report)


# -- repetition and progress -------------------------------------------------------------------


def test_the_same_read_with_its_keys_reordered_is_still_the_same_call() -> None:
    guard = make_guard(Clock())
    first = Call("search_orders", {"customer": "c-9", "status": "open"})
    reordered = Call("search_orders", {"status": "open", "customer": "c-9"})
    script = scripted([first, reordered, first])

    report = script.run(guard)

    _stopped(report, State.PARTIAL, Reason.SAME_CALL)
    assert script.execute.calls == [first, reordered]
    assert report.requests == 3
    assert_stays_stopped(guard, script, report)


def test_a_cycle_of_three_reads_stops_at_the_end_of_its_second_round() -> None:
    guard = make_guard(Clock(), base_limits(stagnant=8, requests=10, executions=10))
    calls = [
        Call("read_inbox", {"folder": "open"}),
        Call("read_queue", {"queue": "triage"}),
        Call("read_calendar", {"week": 19}),
    ]
    script = scripted(calls, cycle=True)

    report = script.run(guard)

    _stopped(report, State.PARTIAL, Reason.SHORT_CYCLE)
    assert script.execute.calls == calls + calls[:2]
    assert report.requests == 6
    assert report.call is not None and report.call["tool"] == "read_calendar"
    assert_stays_stopped(guard, script, report)


def test_requests_without_a_rising_revision_stop_as_no_progress() -> None:
    guard = make_guard(Clock(), revision=4)
    drafts = [Call("draft_reply", {"ticket": 7, "version": version}) for version in (1, 2, 3, 4)]
    script = scripted(drafts, evidence=[Evidence(4, False)])

    report = script.run(guard)

    _stopped(report, State.PARTIAL, Reason.NO_PROGRESS)
    assert script.execute.calls == drafts[:3]
    assert report.revision == 4
    assert_stays_stopped(guard, script, report)


# -- the planner and the shape of its calls ----------------------------------------------------


def test_a_planner_that_raises_fails_the_task() -> None:
    guard = make_guard(Clock())
    pages = Pages(total=5)
    script = Script(
        Planner(pages.next_page, RuntimeError("model API answered 500")),
        Executor(pages.read),
        Inspector(pages.inspect),
    )

    report = script.run(guard)

    _stopped(report, State.FAILED, Reason.PLANNER_ERROR)
    assert script.execute.entries == 1
    assert "model API answered 500" in report.detail
    assert_stays_stopped(guard, script, report)


BAD_CALLS = {
    "a-dict": {"tool": "read_page", "args": {"page": 1}},
    "a-string": "read_page(page=1)",
    "an-empty-list": [],
    "a-non-string-tool": Call(cast(Any, 42), {"page": 1}),
    "an-empty-tool-name": Call("", {"page": 1}),
    "args-as-a-list": Call("read_page", cast(Any, [1])),
    "effect-delete": Call("drop_table", {"table": "orders"}, effect=cast(Any, "delete")),
    "a-dict-after-a-valid-call": [Call("read_page", {"page": 1}), {"tool": "read_page"}],
}


@pytest.mark.parametrize("proposal", BAD_CALLS.values(), ids=BAD_CALLS.keys())
def test_a_malformed_proposal_fails_as_bad_call_and_nothing_runs(proposal: Any) -> None:
    guard = make_guard(Clock())
    script = scripted([proposal])

    report = script.run(guard)

    _stopped(report, State.FAILED, Reason.BAD_CALL)
    assert script.execute.entries == 0
    assert report.executions == 0
    assert report.requests == 0
    assert_stays_stopped(guard, script, report)


def _self_containing() -> dict[str, Any]:
    loop: dict[str, Any] = {"name": "loop"}
    loop["self"] = loop
    return loop


def _nested(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(depth):
        value = {"child": value}
    return value


BAD_ARGS = {
    "nan": {"amount": float("nan")},
    "infinity-in-a-list": {"amounts": [1.0, float("inf")]},
    "a-set": {"ids": {1, 2, 3}},
    "an-object": {"when": object()},
    "a-self-containing-dict": _self_containing(),
    "three-hundred-levels-deep": _nested(300),
    "ten-thousand-levels-deep": _nested(10_000),
    "a-non-string-key": {"filters": {1: "open"}},
}


@pytest.mark.parametrize("args", BAD_ARGS.values(), ids=BAD_ARGS.keys())
def test_arguments_json_cannot_hold_fail_as_bad_args_and_nothing_runs(args: dict[str, Any]) -> None:
    guard = make_guard(Clock())
    script = scripted([Call("search_orders", args)])

    report = script.run(guard)

    _stopped(report, State.FAILED, Reason.BAD_ARGS)
    assert script.execute.entries == 0
    assert report.executions == 0
    assert_stays_stopped(guard, script, report)


# -- writes and the ledger ---------------------------------------------------------------------


@pytest.mark.parametrize("key", [None, ""], ids=["none", "empty"])
def test_a_write_without_an_operation_key_needs_a_human_and_does_not_run(key: str | None) -> None:
    guard = make_guard(Clock())
    notices = Notices()
    script = notices.script(notice(key=key))

    report = script.run(guard)

    _stopped(report, State.NEEDS_HUMAN, Reason.MISSING_OPERATION_KEY)
    assert script.execute.entries == 0
    assert notices.sent == {}
    assert_stays_stopped(guard, script, report)


def test_one_key_with_two_inputs_in_one_model_call_conflicts_before_either_runs() -> None:
    ledger = InMemoryLedger()
    guard = make_guard(Clock(), ledger=ledger)
    notices = Notices()
    batch = [notice("First notice"), notice("First notice, louder")]
    script = notices.script(batch)

    report = script.run(guard)

    _stopped(report, State.NEEDS_HUMAN, Reason.OPERATION_CONFLICT)
    assert script.execute.entries == 0
    assert notices.sent == {}
    assert ledger.get(KEY) is None
    assert_stays_stopped(guard, script, report)


def test_a_write_another_guard_keeps_executing_stops_as_in_flight_once_its_polls_run_out() -> None:
    ledger = InMemoryLedger()
    write = notice()
    other = make_guard(Clock(), ledger=ledger)
    assert other.before_model() is None
    tickets = other.before_tools(write)
    assert isinstance(tickets, list)
    assert other.before_tool(tickets[0]).action == "execute"  # the other task holds the key

    clock = Clock()
    guard = make_guard(clock, roomy(polls=3), ledger=ledger)
    notices = Notices()
    script = notices.script(write)

    report = script.run(guard)

    _stopped(report, State.NEEDS_HUMAN, Reason.OPERATION_IN_FLIGHT)
    assert script.execute.entries == 0
    assert notices.sent == {}
    # It asked, then polled three times, waiting before each poll; the fourth poll is refused.
    assert clock.waits == [IN_FLIGHT_WAIT_MS] * 4
    assert [(op.key, op.state) for op in report.operations] == [(KEY, OperationState.IN_FLIGHT)]
    operation = ledger.get(KEY)
    assert operation is not None and operation.state is OperationState.IN_FLIGHT
    assert_stays_stopped(guard, script, report)


def test_a_write_the_records_cannot_confirm_is_an_unknown_commit() -> None:
    ledger = InMemoryLedger()
    guard = make_guard(Clock(), ledger=ledger)
    notices = Notices()
    cannot_tell = Evidence(0, False, committed=None)
    script = Script(Planner(notice()), Executor(notices.send), Inspector(cannot_tell))

    report = script.run(guard)

    _stopped(report, State.NEEDS_HUMAN, Reason.UNKNOWN_COMMIT)
    assert script.execute.entries == 1
    assert [(op.key, op.state) for op in report.operations] == [(KEY, OperationState.UNKNOWN)]
    assert_stays_stopped(guard, script, report)


def test_a_second_task_does_not_rerun_an_unknown_operation_of_a_shared_ledger() -> None:
    ledger = InMemoryLedger()
    notices = Notices()
    first = Script(Planner(notice()), Executor(notices.send), Inspector(Evidence(0, False)))
    assert first.run(make_guard(Clock(), ledger=ledger)).reason == Reason.UNKNOWN_COMMIT

    guard = make_guard(Clock(), ledger=ledger)
    script = notices.script(notice())

    report = script.run(guard)

    _stopped(report, State.NEEDS_HUMAN, Reason.UNKNOWN_COMMIT)
    assert script.execute.entries == 0
    assert len(notices.sent) == 1
    assert_stays_stopped(guard, script, report)


def test_an_unknown_commit_stop_report_round_trips_through_json_in_the_designs_shape() -> None:
    clock = Clock()
    ledger = InMemoryLedger()
    guard = make_guard(clock, ledger=ledger)
    notices = Notices()
    load = Call("load_incident", {"incident": 42})
    write = notice()

    def tools(call: Call) -> Result:
        clock.advance(50)
        if call.effect == "write":
            return notices.send(call)
        return Result(Kind.SUCCESS, {"incident": 42, "status": "open"})

    def records(result: Result | None, subject: Call | Finish) -> Evidence:
        if isinstance(subject, Call) and subject.effect == "write":
            return Evidence(1, False, committed=None)  # the notice service has no lookup
        return Evidence(1, False)

    script = Script(Planner(load, write), Executor(tools), Inspector(records))

    report = script.run(guard)
    stop = report.to_dict()
    decoded = json.loads(json.dumps(stop))

    assert decoded == stop
    assert json.loads(report.to_json()) == stop
    assert decoded["state"] == "NEEDS_HUMAN"
    assert decoded["reason"] == "unknown_commit"
    assert decoded["operation_key"] == KEY
    assert decoded["operation_state"] == "UNKNOWN"
    assert [step["tool"] for step in decoded["completed"]] == ["load_incident"]
    [operation] = decoded["operations"]
    assert operation["key"] == KEY
    assert operation["state"] == "UNKNOWN"
    assert operation["fingerprint"] == fingerprint("send_notice", write.args)
    assert "result" in operation
    assert decoded["remaining_budget"] == {
        "model_calls": 6,
        "requests": 6,
        "executions": 4,
        "tokens": None,
        "spend": None,
        "explore": 20,
        "deadline_ms": 900,
    }
    assert decoded["resume_condition"] == RESUME_CONDITIONS[Reason.UNKNOWN_COMMIT]
    assert script.execute.entries == 2
    assert_stays_stopped(guard, script, report)


# -- the tool and its evidence -----------------------------------------------------------------


def test_a_read_that_raises_fails_as_executor_error() -> None:
    guard = make_guard(Clock())
    script = scripted([Call("read_page", {"page": 1})], [ConnectionError("connection reset")])

    report = script.run(guard)

    _stopped(report, State.FAILED, Reason.EXECUTOR_ERROR)
    assert script.execute.entries == 1
    assert "connection reset" in report.detail
    assert_stays_stopped(guard, script, report)


def test_a_read_that_returns_something_other_than_a_result_fails_as_bad_result() -> None:
    guard = make_guard(Clock())
    raw = {"kind": "SUCCESS", "data": {"page": 1}}
    script = scripted([Call("read_page", {"page": 1})], [raw])

    report = script.run(guard)

    _stopped(report, State.FAILED, Reason.BAD_RESULT)
    assert script.execute.entries == 1
    assert_stays_stopped(guard, script, report)


def _raises(result: Result | None, subject: Call | Finish) -> Evidence:
    raise LookupError("the records database is unreachable")


BAD_EVIDENCE = {
    "revision-going-down": Evidence(4, False),
    "inspector-raising": _raises,
    "done-not-a-bool": Evidence(5, cast(Any, "yes")),
    "revision-not-an-int": Evidence(cast(Any, "6"), False),
    "not-evidence": {"revision": 6, "done": False},
}


@pytest.mark.parametrize("evidence", BAD_EVIDENCE.values(), ids=BAD_EVIDENCE.keys())
def test_evidence_that_cannot_be_trusted_fails_as_invalid_evidence(evidence: Any) -> None:
    guard = make_guard(Clock(), revision=5)
    script = scripted([Call("read_page", {"page": 6})], evidence=[evidence])

    report = script.run(guard)

    _stopped(report, State.FAILED, Reason.INVALID_EVIDENCE)
    assert script.execute.entries == 1
    assert report.revision == 5
    assert_stays_stopped(guard, script, report)


def test_a_permanent_error_from_a_read_fails_as_fatal() -> None:
    guard = make_guard(Clock())
    script = scripted(
        [Call("read_account", {"account": "a-1"})], [Result(Kind.FATAL, {"error": "closed"})]
    )

    report = script.run(guard)

    _stopped(report, State.FAILED, Reason.FATAL)
    assert script.execute.entries == 1
    assert_stays_stopped(guard, script, report)


def test_a_write_refused_for_a_missing_precondition_needs_a_human_and_is_not_committed() -> None:
    ledger = InMemoryLedger()
    guard = make_guard(Clock(), ledger=ledger)
    charge = Call(
        "charge_card", {"order": 7, "amount": 1999}, effect="write", operation_key="order-7-charge"
    )
    script = scripted(
        [charge],
        [Result(Kind.PRECONDITION, {"error": "card expired"})],
        [Evidence(0, False, committed=False)],
    )

    report = script.run(guard)

    _stopped(report, State.NEEDS_HUMAN, Reason.PRECONDITION)
    assert script.execute.entries == 1
    assert [(op.key, op.state) for op in report.operations] == [
        ("order-7-charge", OperationState.NOT_COMMITTED)
    ]
    assert_stays_stopped(guard, script, report)


@pytest.mark.parametrize(
    "result",
    [
        Result(Kind.RETRYABLE, {"error": "busy"}),
        Result(Kind.PENDING, {"state": "queued"}, wait_ms=0),
        Result(Kind.RETRYABLE, {"error": "busy"}, wait_ms=-5),
        Result(Kind.PENDING, {"state": "queued"}, wait_ms=cast(Any, float("nan"))),
    ],
    ids=["retryable-without-wait", "pending-zero-wait", "negative-wait", "nan-wait"],
)
def test_a_wait_request_without_a_positive_duration_fails_as_invalid_wait(result: Result) -> None:
    clock = Clock()
    guard = make_guard(clock)
    script = scripted([Call("export_status", {"job": "export-7"})], [result])

    report = script.run(guard)

    _stopped(report, State.FAILED, Reason.INVALID_WAIT)
    assert script.execute.entries == 1
    assert clock.waits == []
    assert_stays_stopped(guard, script, report)


# -- the operator ------------------------------------------------------------------------------


def test_an_operator_stop_during_a_read_refuses_the_next_model_call() -> None:
    stop = threading.Event()
    clock = Clock()
    guard = Guard(base_limits(), now=clock.now, wait=clock.wait, cancel=stop)
    pages = Pages(total=5)

    def read_while_the_operator_presses_stop(call: Call) -> Result:
        stop.set()
        return pages.read(call)

    script = Script(
        Planner(pages.next_page),
        Executor(read_while_the_operator_presses_stop),
        Inspector(pages.inspect),
    )

    report = script.run(guard)

    _stopped(report, State.CANCELLED, Reason.OPERATOR_STOP)
    assert script.plan.calls == 1
    assert script.execute.entries == 1
    assert_stays_stopped(guard, script, report)


def test_an_operator_stop_during_planning_refuses_the_call_at_the_executors_entry() -> None:
    guard = make_guard(Clock())
    pages = Pages(total=5)

    def model_while_the_operator_presses_stop(observation: Any) -> Call:
        guard.cancel()
        return pages.next_page(observation)

    script = Script(
        Planner(model_while_the_operator_presses_stop),
        Executor(pages.read),
        Inspector(pages.inspect),
    )

    report = script.run(guard)

    _stopped(report, State.CANCELLED, Reason.OPERATOR_STOP)
    assert script.plan.calls == 1
    assert script.execute.entries == 0
    assert_stays_stopped(guard, script, report)
