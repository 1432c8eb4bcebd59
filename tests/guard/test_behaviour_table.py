"""The behaviour table of DESIGN.md, row by row: offline replay, fake clock and executor.

Every row starts from the base limits and changes only what the row names. "Executes"
is the number of real entries into the fake executor. After every stop, running the
guard again must return the same report and start no work at all.
"""

from __future__ import annotations

from typing import Any

import pytest

from guard import (
    Call,
    Evidence,
    Finish,
    InMemoryLedger,
    Kind,
    OperationState,
    Reason,
    Result,
    State,
)
from guard.steps import fingerprint

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
    scripted,
)


def test_a_read_that_keeps_returning_retryable_runs_twice_then_stops_as_same_call() -> None:
    clock = Clock()
    guard = make_guard(clock)
    status = Call("fetch_job_status", {"job": "export-7"})
    script = scripted([status], [Result(Kind.RETRYABLE, wait_ms=10)])

    report = script.run(guard)

    assert script.execute.entries == 2
    assert (report.state, report.reason) == (State.PARTIAL, Reason.SAME_CALL)
    assert (report.requests, report.executions, report.revision) == (3, 2, 0)
    assert clock.waits == [10, 10]
    assert report.call is not None and report.call["tool"] == "fetch_job_status"
    assert report.operations == ()
    assert_stays_stopped(guard, script, report)


def test_two_alternating_reads_run_three_times_then_stop_as_a_short_cycle() -> None:
    guard = make_guard(Clock(), base_limits(stagnant=5))
    inbox = Call("read_inbox", {"folder": "open"})
    queue = Call("read_queue", {"queue": "triage"})
    script = scripted([inbox, queue], cycle=True)

    report = script.run(guard)

    assert script.execute.calls == [inbox, queue, inbox]
    assert (report.state, report.reason) == (State.PARTIAL, Reason.SHORT_CYCLE)
    assert (report.requests, report.executions, report.revision) == (4, 3, 0)
    assert report.call is not None and report.call["tool"] == "read_queue"
    assert report.operations == ()
    assert_stays_stopped(guard, script, report)


def test_three_valid_pages_in_order_complete_the_task_at_revision_three() -> None:
    guard = make_guard(Clock())
    pages = Pages(total=3)
    script = pages.script()

    report = script.run(guard)

    assert [call.args["page"] for call in script.execute.calls] == [1, 2, 3]
    assert (report.state, report.reason) == (State.COMPLETED, Reason.GOAL_MET)
    assert (report.requests, report.executions, report.revision) == (3, 3, 3)
    assert report.operations == ()
    assert_stays_stopped(guard, script, report)


def test_new_arguments_and_passing_time_are_not_progress_the_model_can_claim() -> None:
    clock = Clock()
    guard = make_guard(clock)
    searches = [Call("search_orders", {"query": f"refund for order {n}"}) for n in range(1, 6)]

    def slow_search(call: Call) -> Result:
        clock.advance(100)
        return Result(Kind.SUCCESS, {"note": "progress 90%, almost done", "hits": []})

    script = Script(Planner(*searches), Executor(slow_search), Inspector(Evidence(0, False)))

    report = script.run(guard)

    assert script.execute.calls == searches[:3]
    assert (report.state, report.reason) == (State.PARTIAL, Reason.NO_PROGRESS)
    assert (report.requests, report.executions, report.revision) == (3, 3, 0)
    assert clock.ms >= 300
    assert_stays_stopped(guard, script, report)


def test_a_committed_write_requested_again_is_reused_not_reexecuted() -> None:
    ledger = InMemoryLedger()
    guard = make_guard(Clock(), base_limits(same=3), ledger=ledger)
    notices = Notices()
    write = notice()
    script = notices.script(write)

    report = script.run(guard)

    assert script.execute.entries == 1
    assert list(notices.sent) == ["incident-42-first-notice"]
    stored = Result(Kind.SUCCESS, {"notice_id": "n-1"})
    assert script.plan.observations[1:] == [stored, stored]  # the later requests got it back
    assert (report.state, report.reason) == (State.PARTIAL, Reason.NO_PROGRESS)
    assert (report.model_calls, report.requests, report.executions) == (3, 3, 1)
    assert [(op.key, op.state, op.result) for op in report.operations] == [
        ("incident-42-first-notice", OperationState.COMMITTED, stored)
    ]
    assert report.operations[0].fingerprint == fingerprint("send_notice", write.args)
    assert_stays_stopped(guard, script, report)
    assert ledger.operations() == list(report.operations)


def _commit_then_raise(notices: Notices) -> Any:
    def send(call: Call) -> Result:
        notices.send(call)
        raise TimeoutError("the notice service did not answer in time")

    return send


def _commit_then_return_nothing(notices: Notices) -> Any:
    def send(call: Call) -> None:
        notices.send(call)

    return send


@pytest.mark.parametrize(
    ("lose_response", "reason"),
    [(_commit_then_raise, Reason.EXECUTOR_ERROR), (_commit_then_return_nothing, Reason.BAD_RESULT)],
    ids=["exception", "no-result"],
)
def test_a_write_whose_response_is_lost_runs_once_and_leaves_its_operation_unknown(
    lose_response: Any, reason: Reason
) -> None:
    ledger = InMemoryLedger()
    guard = make_guard(Clock(), ledger=ledger)
    notices = Notices()
    script = Script(Planner(notice()), Executor(lose_response(notices)), Inspector(notices.inspect))

    report = script.run(guard)

    assert script.execute.entries == 1
    assert list(notices.sent) == ["incident-42-first-notice"]  # it did commit
    assert (report.state, report.reason) == (State.NEEDS_HUMAN, reason)
    assert (report.requests, report.executions) == (1, 1)
    assert [(op.key, op.state) for op in report.operations] == [
        ("incident-42-first-notice", OperationState.UNKNOWN)
    ]
    assert_stays_stopped(guard, script, report)
    operation = ledger.get("incident-42-first-notice")
    assert operation is not None and operation.state is OperationState.UNKNOWN


def test_an_operation_key_with_different_input_conflicts_without_executing() -> None:
    ledger = InMemoryLedger()
    guard = make_guard(Clock(), ledger=ledger)
    notices = Notices()
    first, changed = notice("First notice"), notice("First notice, corrected")
    script = notices.script(first, changed)

    report = script.run(guard)

    assert script.execute.calls == [first]
    assert notices.sent == {"incident-42-first-notice": dict(first.args)}
    assert (report.state, report.reason) == (State.NEEDS_HUMAN, Reason.OPERATION_CONFLICT)
    assert (report.requests, report.executions) == (2, 1)
    assert report.call is not None and report.call["operation_key"] == "incident-42-first-notice"
    assert [(op.state, op.fingerprint) for op in report.operations] == [
        (OperationState.COMMITTED, fingerprint("send_notice", first.args))
    ]
    assert_stays_stopped(guard, script, report)


@pytest.mark.parametrize(
    ("kind", "state", "reason"),
    [
        (Kind.FATAL, State.FAILED, Reason.FATAL),
        (Kind.PRECONDITION, State.NEEDS_HUMAN, Reason.PRECONDITION),
    ],
    ids=["permanent-error", "missing-precondition"],
)
def test_a_permanent_error_or_missing_precondition_runs_once_and_stops(
    kind: Kind, state: State, reason: Reason
) -> None:
    guard = make_guard(Clock())
    lookup = Call("read_contract", {"customer": "c-9"})
    script = scripted([lookup], [Result(kind, {"error": "contract c-9 not found"})])

    report = script.run(guard)

    assert script.execute.entries == 1
    assert (report.state, report.reason) == (state, reason)
    assert (report.requests, report.executions) == (1, 1)
    assert_stays_stopped(guard, script, report)


@pytest.mark.parametrize("kind", [Kind.RETRYABLE, Kind.PENDING])
def test_a_wait_that_would_cross_the_deadline_is_not_taken_and_nothing_more_is_requested(
    kind: Kind,
) -> None:
    clock = Clock()
    guard = make_guard(clock)

    def slow_export(call: Call) -> Result:
        clock.advance(600)
        return Result(kind, {"job": "export-7"}, wait_ms=500)

    script = Script(Planner(Call("run_export", {"job": "export-7"})), Executor(slow_export))

    report = script.run(guard)

    assert script.execute.entries == 1
    assert clock.waits == []
    assert script.plan.calls == 1
    assert (report.state, report.reason) == (State.PARTIAL, Reason.DEADLINE)
    assert (report.requests, report.executions) == (1, 1)
    assert_stays_stopped(guard, script, report)


def test_an_exhausted_model_budget_refuses_the_next_model_call_before_it_starts() -> None:
    guard = make_guard(Clock(), base_limits(model_calls=2))
    pages = Pages(total=5)
    script = pages.script()

    report = script.run(guard)

    assert script.plan.calls == 2
    assert script.execute.entries == 2
    assert (report.state, report.reason) == (State.PARTIAL, Reason.MODEL_BUDGET)
    assert (report.model_calls, report.executions, report.revision) == (2, 2, 2)
    assert_stays_stopped(guard, script, report)


def test_an_exhausted_execution_budget_refuses_the_next_execution_before_it_starts() -> None:
    guard = make_guard(Clock(), base_limits(executions=1))
    pages = Pages(total=5)
    script = pages.script()

    report = script.run(guard)

    assert script.plan.calls == 2
    assert [call.args["page"] for call in script.execute.calls] == [1]
    assert (report.state, report.reason) == (State.PARTIAL, Reason.EXECUTION_BUDGET)
    assert (report.model_calls, report.requests, report.executions) == (2, 2, 1)
    assert report.revision == 1
    assert_stays_stopped(guard, script, report)


def test_a_read_returning_an_unknown_result_kind_stops_as_a_bad_result() -> None:
    guard = make_guard(Clock())
    script = scripted([Call("read_page", {"page": 1})], [Result("DONE", {"page": 1})])

    report = script.run(guard)

    assert script.execute.entries == 1
    assert (report.state, report.reason) == (State.FAILED, Reason.BAD_RESULT)
    assert (report.requests, report.executions) == (1, 1)
    assert_stays_stopped(guard, script, report)


def test_a_write_returning_an_unknown_result_kind_stops_with_its_operation_unknown() -> None:
    guard = make_guard(Clock())
    notices = Notices()

    def send(call: Call) -> Result:
        notices.send(call)
        return Result("SENT", {"notice_id": "n-1"})

    script = Script(Planner(notice()), Executor(send), Inspector(notices.inspect))

    report = script.run(guard)

    assert script.execute.entries == 1
    assert (report.state, report.reason) == (State.NEEDS_HUMAN, Reason.BAD_RESULT)
    assert [(op.key, op.state) for op in report.operations] == [
        ("incident-42-first-notice", OperationState.UNKNOWN)
    ]
    assert_stays_stopped(guard, script, report)


def test_a_finish_the_records_do_not_verify_is_partial_and_never_completed() -> None:
    guard = make_guard(Clock())
    pages = Pages(total=3)
    finish = Finish("all three pages are in")
    script = Script(
        Planner(pages.next_page, finish), Executor(pages.read), Inspector(pages.inspect)
    )

    report = script.run(guard)

    assert script.execute.entries == 1
    assert script.inspect.seen[-1] == (None, finish)
    assert (report.state, report.reason) == (State.PARTIAL, Reason.GOAL_UNVERIFIED)
    assert report.revision == 1
    assert_stays_stopped(guard, script, report)
