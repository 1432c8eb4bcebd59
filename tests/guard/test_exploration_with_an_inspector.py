"""An agent with a trusted inspector that reads before it writes is not stopped for it.

The inspector's revision rises only with business progress, so reads never raise it. A
read that brings back something the task has not seen before is still information
gathered: it is counted as exploration (``Limits.explore``) and the count of requests
without progress starts again from it. The revision stays the inspector's, repeats and
cycles are remembered, and reworded calls with the same answer stop as before.
"""

from __future__ import annotations

import json
from typing import Any

from guard import Call, Finish, Guard, Kind, Reason, Report, Result, State
from guard.steps import Action

from .support import (
    Clock,
    Executor,
    Planner,
    Records,
    base_limits,
    make_guard,
    notice,
    read,
    roomy,
)


def _desk(records: Records) -> Executor:
    """Reads that answer with their own arguments; the notice write, recorded as the
    progress (and the goal) the inspector verifies."""

    def answer(call: Call) -> Result:
        if call.effect == "write":
            assert call.operation_key is not None
            records.committed[call.operation_key] = True
            records.revision += 1
            records.done = True
            return Result(Kind.SUCCESS, {"notice": 1})
        return Result(Kind.SUCCESS, {"tool": call.tool, **call.args})

    return Executor(answer)


READS = [read("load_incident", id=42), read("load_owner", id=7), read("load_rota", week=19)]


def _run(guard: Guard, planner: Planner, records: Records, executor: Executor) -> Report:
    return guard.run(planner, executor, records.inspect)


def test_three_distinct_reads_then_the_write_complete_the_task() -> None:
    records = Records()
    desk = _desk(records)

    report = _run(make_guard(Clock()), Planner(*READS, notice()), records, desk)

    assert (report.state, report.reason) == (State.COMPLETED, Reason.GOAL_MET)
    assert desk.entries == 4
    assert report.revision == 1  # the inspector's: the notice, not the reads
    assert report.explored == 3


def test_reworded_reads_with_the_same_answer_still_stop_as_no_progress() -> None:
    records = Records()
    searches = [read("search_orders", q=q) for q in ("late", "late orders", "delayed", "slow")]
    same = Executor(Result(Kind.SUCCESS, {"orders": []}))

    report = _run(make_guard(Clock()), Planner(*searches, notice()), records, same)

    # The first answer was news; the two after it told nothing new: stagnant=3 requests.
    assert (report.state, report.reason) == (State.PARTIAL, Reason.NO_PROGRESS)
    assert same.entries == 3
    assert report.explored == 1
    assert report.detail == ""


def test_a_repeated_read_is_still_a_repeat() -> None:
    records = Records()
    status = Executor(Result(Kind.SUCCESS, {"status": "open"}))

    report = _run(make_guard(Clock()), Planner(read("load_incident", id=42)), records, status)

    assert (report.state, report.reason) == (State.PARTIAL, Reason.SAME_CALL)
    assert status.entries == 2


def test_two_reads_in_ping_pong_are_still_a_short_cycle_on_the_fourth_request() -> None:
    records = Records()
    a, b = read("read_inbox", folder="open"), read("read_queue", queue="triage")
    tools = Executor(lambda call: Result(Kind.SUCCESS, {"tool": call.tool}))

    report = _run(
        make_guard(Clock(), base_limits(stagnant=5)), Planner(a, b, cycle=True), records, tools
    )

    assert (report.state, report.reason) == (State.PARTIAL, Reason.SHORT_CYCLE)
    assert tools.calls == [a, b, a]
    assert report.revision == 0


def test_new_reads_stop_counting_once_the_exploration_budget_is_spent() -> None:
    records = Records()
    pages = [read("read_page", page=n) for n in range(1, 9)]
    desk = _desk(records)

    report = _run(make_guard(Clock(), roomy(stagnant=3, explore=2)), Planner(*pages), records, desk)

    assert (report.state, report.reason) == (State.PARTIAL, Reason.NO_PROGRESS)
    assert desk.entries == 2 + 2  # two new pages counted, then the third request without
    assert report.explored == 2
    assert report.remaining["explore"] == 0
    assert "exploration budget is spent" in report.detail


def test_a_pending_job_is_not_exploration_and_its_finished_answer_is() -> None:
    records = Records()
    job = read("fetch_job_status", job=7)
    answers = iter(
        [
            Result(Kind.PENDING, {"job": 7, "state": "running"}, wait_ms=10),
            Result(Kind.PENDING, {"job": 7, "state": "running"}, wait_ms=10),
            Result(Kind.SUCCESS, {"job": 7, "state": "done", "rows": 12}),
        ]
    )
    desk = _desk(records)
    tools = Executor(lambda call: next(answers) if call.tool == job.tool else desk(call))

    report = _run(make_guard(Clock()), Planner(job, job, job, notice()), records, tools)

    assert (report.state, report.reason) == (State.COMPLETED, Reason.GOAL_MET)
    assert report.polls == 2
    assert report.explored == 1  # the finished job's answer, not its pending ones


def test_the_same_run_driven_step_by_step_ends_the_same() -> None:
    records = Records()
    desk = _desk(records)
    guard = make_guard(Clock())
    stops: list[Report | None] = []
    for call in [*READS, notice()]:
        assert guard.before_model() is None
        (ticket,) = guard.before_tools(call)  # type: ignore[misc]
        assert guard.before_tool(ticket).action is Action.EXECUTE
        stops.append(guard.after_tool(ticket, desk(call), inspect=records.inspect))

    *reads, report = stops

    assert reads == [None, None, None]
    assert report is not None
    assert (report.state, report.reason) == (State.COMPLETED, Reason.GOAL_MET)
    assert report.explored == 3


def test_a_restored_guard_does_not_take_a_result_it_has_seen_for_news() -> None:
    clock = Clock()
    records = Records()
    answer = Result(Kind.SUCCESS, {"orders": ["o-1"]})
    guard = make_guard(clock, roomy(stagnant=2))

    def step(g: Guard, call: Call) -> Report | None:
        assert g.before_model() is None
        (ticket,) = g.before_tools(call)  # type: ignore[misc]
        g.before_tool(ticket)
        return g.after_tool(ticket, answer, inspect=records.inspect)

    assert step(guard, read("search", q="late")) is None  # news: stagnant starts again at 1
    saved: dict[str, Any] = json.loads(json.dumps(guard.checkpoint()))
    restored = Guard.restore(saved, roomy(stagnant=2), now=clock.now, wait=clock.wait)

    report = step(restored, read("search", q="overdue"))  # the same answer: no news

    assert report is not None
    assert (report.state, report.reason) == (State.PARTIAL, Reason.NO_PROGRESS)
    assert len(saved["observed"]["seen"]) == 1


def test_an_agent_that_opts_out_keeps_the_inspectors_rule_alone() -> None:
    records = Records()
    desk = _desk(records)
    guard = make_guard(Clock(), base_limits(explore=0))

    report = _run(guard, Planner(*READS, notice(), Finish()), records, desk)

    assert (report.state, report.reason) == (State.PARTIAL, Reason.NO_PROGRESS)
    assert desk.entries == 3
    assert report.explored == 0
    assert report.detail == ""
    assert "observed" not in guard.checkpoint()


def test_an_inspector_that_sees_progress_in_a_read_spends_no_exploration() -> None:
    records = Records()

    def page(call: Call) -> Result:
        records.revision += 1  # each page is a business record the inspector counts
        return Result(Kind.SUCCESS, {"page": call.args["page"]})

    pages = Planner(*[read("read_page", page=n) for n in (1, 2, 3)], Finish())
    report = make_guard(Clock()).run(pages, Executor(page), records.inspect)

    assert report.revision == 3
    assert report.explored == 0
    assert report.remaining["explore"] == 20
    assert report.reason is Reason.GOAL_UNVERIFIED
