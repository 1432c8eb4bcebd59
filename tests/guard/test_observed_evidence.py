"""Progress without an inspector (``inspect=None``): the observed-evidence policy.

A framework agent (LangChain, the OpenAI Agents SDK) has no trusted ``inspect``. The guard
then reads progress from the tools' own results: a read whose result was never seen before
in the task is new information, drawn from the exploration budget (``Limits.explore``); a
write that returns ``SUCCESS`` is committed on the tool's word. The loops of the issue must
still be stopped within a few executions, and no legitimate run stopped.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from guard import (
    Call,
    Evidence,
    Finish,
    Guard,
    InMemoryLedger,
    Kind,
    Limits,
    OperationState,
    Reason,
    Report,
    Result,
    Settlement,
    State,
)
from guard.steps import DIMENSIONS, Action

from .support import (
    BASE_LIMITS,
    NOTICE_KEY,
    Clock,
    Executor,
    Notices,
    Planner,
    base_limits,
    make_guard,
    notice,
    read,
    roomy,
)


def _run(guard: Guard, planner: Planner, executor: Executor, **options: Any) -> Report:
    """``guard.run`` with no inspector: the observed-evidence policy."""
    return guard.run(planner, executor, None, **options)


def _same_answer(answer: Any) -> Executor:
    """A read tool that answers every call with the same data."""
    return Executor(Result(Kind.SUCCESS, answer))


def _echo_page(call: Call) -> Result:
    """A paged source: each page holds its own items."""
    page = call.args["page"]
    return Result(Kind.SUCCESS, {"page": page, "ids": [f"item-{page}"]})


def _incident_tools(notices: Notices) -> Executor:
    """Reads that each answer with something of their own, and the notice write."""
    return Executor(
        lambda call: (
            notices.send(call)
            if call.effect == "write"
            else Result(Kind.SUCCESS, {"tool": call.tool})
        )
    )


def _pages_then_finish(pages: int) -> Planner:
    """A model that reads ``pages`` pages in order, then says it is done."""
    steps: list[Any] = [read("read_page", page=n) for n in range(1, pages + 1)]
    return Planner(*steps, Finish(f"read {pages} pages"))


# -- loops are still stopped -------------------------------------------------------------


def test_one_read_repeated_stops_as_same_call_after_two_executions() -> None:
    guard = make_guard(Clock())
    tool = _same_answer({"status": "open"})

    report = _run(guard, Planner(read("load_incident", id=42)), tool)

    assert (report.state, report.reason) == (State.PARTIAL, Reason.SAME_CALL)
    assert tool.entries == 2
    assert report.revision == 1  # its first answer was new; the same answer again was not
    assert report.explored == 1


def test_two_reads_in_ping_pong_stop_as_a_short_cycle() -> None:
    guard = make_guard(Clock())
    a, b = read("read_inbox", folder="open"), read("read_queue", queue="triage")
    tools = Executor(lambda call: Result(Kind.SUCCESS, {"tool": call.tool}))

    report = _run(guard, Planner(a, b, cycle=True), tools)

    assert (report.state, report.reason) == (State.PARTIAL, Reason.SHORT_CYCLE)
    assert tools.calls == [a, b, a, b]  # the first round was new; the fifth request is refused
    assert report.call is not None and report.call["tool"] == "read_inbox"


def test_a_cycle_of_three_reads_stops_as_a_short_cycle_in_its_second_round() -> None:
    guard = make_guard(Clock(), base_limits(stagnant=5, requests=12, executions=12))
    calls = [read("read_inbox", folder="open"), read("read_queue", queue="t"), read("cal", w=19)]
    tools = Executor(lambda call: Result(Kind.SUCCESS, {"tool": call.tool}))

    report = _run(guard, Planner(*calls, cycle=True), tools)

    assert (report.state, report.reason) == (State.PARTIAL, Reason.SHORT_CYCLE)
    assert tools.calls == calls + calls + calls[:1]
    assert report.revision == 3


def test_a_cycle_of_three_reads_at_the_base_limits_stops_within_six_executions() -> None:
    guard = make_guard(Clock(), base_limits(executions=20, requests=20, model_calls=20))
    calls = [read("read_inbox", folder="open"), read("read_queue", queue="t"), read("cal", w=19)]
    tools = Executor(lambda call: Result(Kind.SUCCESS, {"tool": call.tool}))

    report = _run(guard, Planner(*calls, cycle=True), tools)

    # The second round brings nothing new: stagnant=3 ends it before a cycle can be seen.
    assert (report.state, report.reason) == (State.PARTIAL, Reason.NO_PROGRESS)
    assert tools.entries == 6


def test_reworded_arguments_with_the_same_result_stop_as_no_progress() -> None:
    guard = make_guard(Clock())
    queries = [read("search_orders", q=q) for q in ("late", "late orders", "delayed", "slow")]
    tool = _same_answer({"orders": []})

    report = _run(guard, Planner(*queries, Finish()), tool)

    assert (report.state, report.reason) == (State.PARTIAL, Reason.NO_PROGRESS)
    assert tool.entries == 4  # one new answer, then stagnant=3 requests that told nothing new
    assert report.revision == 1
    assert report.detail == ""  # the exploration budget had nothing to do with it


def test_a_pending_read_is_not_progress() -> None:
    guard = make_guard(Clock(), roomy(stagnant=3, polls=2))
    job = read("fetch_job_status", job=7)
    tool = Executor(Result(Kind.PENDING, {"job": 7, "state": "running"}, wait_ms=10))

    report = _run(guard, Planner(job), tool)

    assert (report.state, report.reason) == (State.PARTIAL, Reason.POLL_BUDGET)
    assert report.revision == 0
    assert report.explored == 0


# -- legitimate runs are not -------------------------------------------------------------


def test_fifteen_distinct_pages_run_at_the_default_limits_until_the_model_finishes() -> None:
    guard = Guard(Limits(), now=Clock().now, wait=Clock().wait)
    pages = Executor(_echo_page)

    report = _run(guard, _pages_then_finish(15), pages)

    # Nothing verifies the goal: the model's word is all there is (invariant 6).
    assert (report.state, report.reason) == (State.PARTIAL, Reason.GOAL_UNVERIFIED)
    assert pages.entries == 15
    assert report.revision == 15
    assert report.explored == 15
    assert report.remaining["explore"] == 5


def test_more_pages_than_the_exploration_budget_stop_as_no_progress_only_after_it() -> None:
    clock = Clock()
    guard = Guard(Limits(model_calls=40, requests=40, executions=40), now=clock.now)
    pages = Executor(_echo_page)

    report = _run(guard, _pages_then_finish(30), pages)

    assert (report.state, report.reason) == (State.PARTIAL, Reason.NO_PROGRESS)
    assert pages.entries == 20 + 3  # the budget of 20 new results, then stagnant=3 more
    assert report.revision == 20
    assert report.explored == 20
    assert report.remaining["explore"] == 0
    assert "exploration budget is spent" in report.detail


def test_three_reads_then_the_write_they_prepare_run_to_the_finish() -> None:
    notices = Notices()
    ledger = InMemoryLedger()
    guard = make_guard(Clock(), ledger=ledger)
    reads = [read("load_incident", id=42), read("load_owner", id=7), read("load_rota", week=19)]
    tools = _incident_tools(notices)

    report = _run(guard, Planner(*reads, notice(), Finish("notice sent")), tools)

    assert (report.state, report.reason) == (State.PARTIAL, Reason.GOAL_UNVERIFIED)
    assert tools.entries == 4
    assert report.revision == 4  # three new results and one committed write
    entry = ledger.get(NOTICE_KEY)
    assert entry is not None and entry.state is OperationState.COMMITTED
    assert NOTICE_KEY in notices.sent


def test_with_an_inspector_that_sees_no_progress_in_reads_the_same_run_reaches_its_finish() -> None:
    # The inspector's revision stays 0 (a notice does not resolve the incident); each new
    # read is information gathered, counted as exploration, never as verified progress.
    notices = Notices()
    guard = make_guard(Clock())
    reads = [read("load_incident", id=42), read("load_owner", id=7), read("load_rota", week=19)]
    tools = _incident_tools(notices)

    report = guard.run(Planner(*reads, notice(), Finish()), tools, notices.inspect)

    assert (report.state, report.reason) == (State.PARTIAL, Reason.GOAL_UNVERIFIED)
    assert tools.entries == 4
    assert report.revision == 0  # the inspector's word, not the results'
    assert report.explored == 3


def test_with_an_inspector_and_no_exploration_budget_the_same_run_stops_early() -> None:
    # Limits(explore=0) opts out: only the inspector's revision counts.
    notices = Notices()
    guard = make_guard(Clock(), base_limits(explore=0))
    reads = [read("load_incident", id=42), read("load_owner", id=7), read("load_rota", week=19)]
    tools = _incident_tools(notices)

    report = guard.run(Planner(*reads, notice(), Finish()), tools, notices.inspect)

    assert (report.state, report.reason) == (State.PARTIAL, Reason.NO_PROGRESS)
    assert tools.entries == 3
    assert report.explored == 0
    assert report.detail == ""
    assert "observed" not in guard.checkpoint()


# -- writes ------------------------------------------------------------------------------


def test_a_write_that_returns_success_is_committed_and_its_result_reused_after() -> None:
    notices = Notices()
    ledger = InMemoryLedger()
    guard = make_guard(Clock(), base_limits(same=3), ledger=ledger)
    tool = Executor(notices.send)

    report = _run(guard, Planner(notice()), tool)

    entry = ledger.get(NOTICE_KEY)
    assert entry is not None and entry.state is OperationState.COMMITTED
    assert entry.result == Result(Kind.SUCCESS, {"notice_id": "n-1"})
    assert tool.entries == 1  # later requests reuse the stored result and are not progress
    assert (report.state, report.reason) == (State.PARTIAL, Reason.SAME_CALL)
    assert report.revision == 1
    assert report.requests == 4  # the commit, two reuses, then the fourth is refused


def test_a_write_whose_success_its_lookup_cannot_find_is_left_for_a_human() -> None:
    ledger = InMemoryLedger()
    guard = make_guard(Clock(), ledger=ledger)
    tool = Executor(Result(Kind.SUCCESS, {"notice_id": "n-1"}))

    def lookup(key: str) -> Settlement:
        return Settlement(committed=False, evidence="the outbox holds no such notice")

    report = _run(guard, Planner(notice()), tool, lookup=lookup)

    assert report.state is State.NEEDS_HUMAN
    entry = ledger.get(NOTICE_KEY)
    assert entry is not None and entry.state is OperationState.UNKNOWN
    assert report.revision == 0


def test_a_write_whose_lookup_cannot_tell_rests_on_the_tools_success() -> None:
    ledger = InMemoryLedger()
    guard = make_guard(Clock(), ledger=ledger)
    tool = Executor(Result(Kind.SUCCESS, {"notice_id": "n-1"}))

    report = _run(guard, Planner(notice(), Finish()), tool, lookup=lambda key: None)

    entry = ledger.get(NOTICE_KEY)
    assert entry is not None and entry.state is OperationState.COMMITTED
    assert (report.state, report.reason) == (State.PARTIAL, Reason.GOAL_UNVERIFIED)


def test_a_write_that_does_not_return_success_is_not_committed_on_its_word() -> None:
    ledger = InMemoryLedger()
    guard = make_guard(Clock(), ledger=ledger)
    tool = Executor(Result(Kind.RETRYABLE, {"error": "busy"}, wait_ms=10))

    report = _run(guard, Planner(notice()), tool)

    # A tool's "it did not happen" is not trusted evidence: nothing runs again blindly.
    assert (report.state, report.reason) == (State.NEEDS_HUMAN, Reason.UNKNOWN_COMMIT)
    entry = ledger.get(NOTICE_KEY)
    assert entry is not None and entry.state is OperationState.UNKNOWN
    assert tool.entries == 1


def test_a_write_that_its_lookup_proves_not_done_may_be_retried() -> None:
    ledger = InMemoryLedger()
    notices = Notices()
    guard = make_guard(Clock(), ledger=ledger)
    tool = Executor(Result(Kind.RETRYABLE, {"error": "busy"}, wait_ms=10), notices.send)

    def lookup(key: str) -> Settlement:
        return Settlement(committed=key in notices.sent, evidence="the outbox")

    report = _run(guard, Planner(notice(), notice(), Finish()), tool, lookup=lookup)

    assert (report.state, report.reason) == (State.PARTIAL, Reason.GOAL_UNVERIFIED)
    assert tool.entries == 2
    entry = ledger.get(NOTICE_KEY)
    assert entry is not None and entry.state is OperationState.COMMITTED
    assert report.revision == 1


def test_a_lost_write_its_lookup_finds_committed_counts_as_progress() -> None:
    ledger = InMemoryLedger()
    guard = make_guard(Clock(), ledger=ledger)
    tool = Executor(TimeoutError("the response was lost"))

    def lookup(key: str) -> Settlement:
        return Settlement(committed=True, result=Result(Kind.SUCCESS, {"notice_id": "n-1"}))

    report = _run(guard, Planner(notice(), Finish()), tool, lookup=lookup)

    assert (report.state, report.reason) == (State.PARTIAL, Reason.GOAL_UNVERIFIED)
    assert report.revision == 1
    entry = ledger.get(NOTICE_KEY)
    assert entry is not None and entry.state is OperationState.COMMITTED


def test_a_lost_write_without_a_lookup_stays_unknown() -> None:
    ledger = InMemoryLedger()
    guard = make_guard(Clock(), ledger=ledger)

    report = _run(guard, Planner(notice()), Executor(TimeoutError("lost")))

    assert report.state is State.NEEDS_HUMAN
    entry = ledger.get(NOTICE_KEY)
    assert entry is not None and entry.state is OperationState.UNKNOWN


# -- the finish, the budget and its checks -----------------------------------------------


def test_a_finish_without_an_inspector_is_never_completed() -> None:
    guard = make_guard(Clock())

    report = _run(guard, Planner(Finish("all done, trust me")), _same_answer(None))

    assert (report.state, report.reason) == (State.PARTIAL, Reason.GOAL_UNVERIFIED)


def test_with_no_exploration_budget_no_read_counts() -> None:
    guard = make_guard(Clock(), base_limits(explore=0))
    pages = Executor(_echo_page)

    report = _run(guard, _pages_then_finish(5), pages)

    assert (report.state, report.reason) == (State.PARTIAL, Reason.NO_PROGRESS)
    assert pages.entries == 3
    assert report.revision == 0
    assert "exploration budget is spent" in report.detail


def test_an_unbounded_exploration_budget_counts_every_new_result() -> None:
    guard = make_guard(Clock(), roomy(explore=None))
    pages = Executor(_echo_page)

    report = _run(guard, _pages_then_finish(30), pages)

    assert report.reason is Reason.GOAL_UNVERIFIED
    assert report.explored == 30
    assert report.remaining["explore"] is None


@pytest.mark.parametrize("bad", [-1, 1.5, True])
def test_the_exploration_budget_must_be_a_count(bad: Any) -> None:
    with pytest.raises((TypeError, ValueError)):
        Limits(explore=bad)


def test_the_same_data_from_two_tools_is_two_new_results() -> None:
    guard = make_guard(Clock())
    tools = _same_answer([])

    report = _run(
        guard,
        Planner(read("search_orders", q="x"), read("search_refunds", q="x"), Finish()),
        tools,
    )

    assert report.reason is Reason.GOAL_UNVERIFIED
    assert report.revision == 2


def test_a_result_json_cannot_hold_is_still_told_apart() -> None:
    guard = make_guard(Clock())
    answers = Executor(Result(Kind.SUCCESS, {1, 2}), Result(Kind.SUCCESS, {3}))

    report = _run(guard, Planner(read("a", n=1), read("a", n=2), read("a", n=3), Finish()), answers)

    assert report.reason is Reason.GOAL_UNVERIFIED
    assert report.revision == 2  # {1, 2}, then {3}; {3} again is not new


def test_the_new_dimension_is_declared_once_and_reported() -> None:
    (explored,) = [d for d in DIMENSIONS if d.used == "explored"]
    guard = make_guard(Clock())

    report = _run(guard, _pages_then_finish(2), Executor(_echo_page))

    assert (explored.limit, explored.reason, explored.stops) == (
        "explore",
        Reason.NO_PROGRESS,
        False,
    )
    assert report.usage.explored == 2
    assert report.to_dict()["used"]["explored"] == 2
    assert report.to_dict()["remaining_budget"]["explore"] == 18
    assert guard.checkpoint()["usage"]["explored"] == 2


# -- step by step, and across processes --------------------------------------------------


def _step(guard: Guard, call: Call, result: Result) -> Report | None:
    """One model call proposing ``call``, run with ``result``, with no inspector."""
    assert guard.before_model() is None
    tickets = guard.before_tools(call)
    assert isinstance(tickets, list)
    decision = guard.before_tool(tickets[0])
    assert decision.action is Action.EXECUTE
    return guard.after_tool(tickets[0], result, inspect=None)


def test_the_steps_take_no_inspector_too() -> None:
    guard = make_guard(Clock())
    page = read("read_page", page=1)

    assert _step(guard, page, _echo_page(page)) is None

    assert guard.revision == 1
    assert guard.usage.explored == 1
    assert guard.remaining()["explore"] == 19


def test_a_restored_guard_remembers_the_results_it_has_seen() -> None:
    clock = Clock()
    guard = make_guard(clock, roomy())
    first, again = read("search", q="late"), read("search", q="overdue")
    answer = Result(Kind.SUCCESS, {"orders": ["o-1"]})
    assert _step(guard, first, answer) is None

    saved = json.loads(json.dumps(guard.checkpoint(history=False)))
    restored = Guard.restore(
        saved, roomy(), history=guard.history(), now=clock.now, wait=clock.wait
    )

    assert len(json.dumps(saved["observed"])) < 100  # a hash per result, not the result
    assert restored.revision == 1
    assert _step(restored, again, answer) is None  # the same answer: not new
    assert restored.revision == 1
    assert restored.usage.explored == 1
    assert _step(restored, again, Result(Kind.SUCCESS, {"orders": ["o-2"]})) is None
    assert restored.revision == 2


def test_the_checkpoint_keeps_no_more_results_than_the_exploration_budget() -> None:
    clock = Clock()
    guard = make_guard(clock, roomy(explore=4, stagnant=50))
    pages = Executor(_echo_page)

    _run(guard, _pages_then_finish(12), pages)

    assert len(guard.checkpoint()["observed"]["seen"]) == 4


def test_a_malformed_observed_part_is_refused() -> None:
    guard = make_guard(Clock())
    _step(guard, read("search", q="x"), Result(Kind.SUCCESS, {"n": 1}))
    saved = guard.checkpoint()
    saved["observed"] = {"seen": [7]}

    with pytest.raises(ValueError, match="malformed"):
        Guard.restore(saved, BASE_LIMITS)


def test_a_grant_of_exploration_in_a_new_phase_lets_new_results_count_again() -> None:
    clock = Clock()
    first = Guard(Limits(explore=2), now=clock.now, wait=clock.wait)
    stopped = _run(first, _pages_then_finish(10), Executor(_echo_page))
    assert stopped.reason is Reason.NO_PROGRESS
    assert stopped.explored == 2

    saved = first.checkpoint()
    later = Guard.restore(saved, Limits(explore=4), now=clock.now, wait=clock.wait)
    planner = Planner(*[read("read_page", page=n) for n in range(6, 12)], Finish())
    report = _run(later, planner, Executor(_echo_page))

    assert report.usage.explored == 4
    assert report.revision == 4
    assert report.reason is Reason.NO_PROGRESS


def test_an_inspector_given_later_cannot_lower_the_revision_the_results_raised() -> None:
    # One evidence source per task: the docs say so, and a mix fails closed.
    guard = make_guard(Clock())
    assert _step(guard, read("search", q="x"), Result(Kind.SUCCESS, {"n": 1})) is None
    assert guard.before_model() is None
    tickets = guard.before_tools(read("search", q="y"))
    assert isinstance(tickets, list)
    guard.before_tool(tickets[0])

    report = guard.after_tool(
        tickets[0], Result(Kind.SUCCESS, {"n": 2}), inspect=lambda r, c: Evidence(0, False)
    )

    assert report is not None
    assert (report.state, report.reason) == (State.FAILED, Reason.INVALID_EVIDENCE)
