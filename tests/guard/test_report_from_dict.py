"""A stop report read back from its JSON (``Report.from_dict``, ``Operation.from_dict``) is
the report the guard made: what an attached agent gets from the console is the same report
a local guard would have handed it."""

from __future__ import annotations

import json
from typing import Any

import pytest

from guard import Evidence, Finish, Guard, Kind, Limits, OperationState, Reason, Report, Result
from guard import State as TaskState
from guard.steps import Operation

from .support import NOTICE_KEY, Clock, Pages, make_guard, notice, read, scripted


def same_call_report() -> Report:
    script = scripted([read("search", q="refund policy")], [Result(Kind.RETRYABLE, wait_ms=10)])
    return script.run(make_guard(Clock()))


def unknown_commit_report() -> Report:
    """A write that ran and that the records cannot confirm: its operation stays UNKNOWN."""
    script = scripted([notice()], evidence=[Evidence(0, False, committed=None)])
    return script.run(make_guard(Clock()))


def goal_met_report() -> Report:
    return Pages(3).script().run(make_guard(Clock()))


def approval_required_report() -> Report:
    guard = make_guard(Clock(), needs_approval=lambda call: call.effect == "write")
    return scripted([notice()]).run(guard)


def summarised_report() -> Report:
    guard = Guard(Limits(model_calls=1, stagnant=5))
    script = scripted([read("search", q="a"), read("search", q="b")])
    script.run(guard)
    assert guard.summary_turn() is not None
    return guard.record_summary("Searched once; the model budget ran out.", tokens=12)


REPORTS = {
    "same_call": same_call_report,
    "unknown_commit": unknown_commit_report,
    "goal_met": goal_met_report,
    "approval_required": approval_required_report,
    "summary": summarised_report,
}


def through_json(report: Report) -> dict[str, Any]:
    """The report as the console sends it: its JSON text, parsed again."""
    parsed: dict[str, Any] = json.loads(report.to_json())
    return parsed


@pytest.mark.parametrize("make", REPORTS.values(), ids=REPORTS.keys())
def test_a_report_read_back_from_its_json_is_the_same_report(make: Any) -> None:
    report = make()
    again = Report.from_dict(through_json(report))
    assert again.to_dict() == report.to_dict()
    assert again == report


def test_the_stops_under_test_are_the_ones_they_are_named_after() -> None:
    assert (same_call_report().state, same_call_report().reason) == (
        TaskState.PARTIAL,
        Reason.SAME_CALL,
    )
    assert unknown_commit_report().reason is Reason.UNKNOWN_COMMIT
    assert goal_met_report().reason is Reason.GOAL_MET
    assert approval_required_report().pending is not None
    assert summarised_report().summary


def test_an_uncertain_operation_stays_uncertain_when_read_back() -> None:
    report = Report.from_dict(through_json(unknown_commit_report()))
    assert report.state is TaskState.NEEDS_HUMAN
    assert [(op.key, op.state) for op in report.uncertain] == [(NOTICE_KEY, OperationState.UNKNOWN)]
    assert report.resume_condition == unknown_commit_report().resume_condition
    assert report.usage == unknown_commit_report().usage


def test_an_operation_read_back_keeps_its_stored_result() -> None:
    committed = Operation(
        NOTICE_KEY,
        "f" * 64,
        OperationState.COMMITTED,
        Result(Kind.SUCCESS, {"notice_id": "n-1"}),
        attempts=2,
        evidence="seen in the notices table",
    )
    again = Operation.from_dict(json.loads(json.dumps(committed.to_dict())))
    assert again == committed
    assert again.result == Result(Kind.SUCCESS, {"notice_id": "n-1"})


def test_a_pending_call_read_back_is_the_call_a_person_approves() -> None:
    report = approval_required_report()
    again = Report.from_dict(through_json(report))
    assert again.pending == report.pending
    assert again.pending is not None and again.pending["operation_key"] == NOTICE_KEY


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"state": "DONE"}, "a state that is not one of the guard's"),
        ({"reason": "tired"}, "a reason that is not one of the guard's"),
        ({"revision": -1}, "a negative revision"),
        ({"used": {"model_calls": "3"}}, "a counter that is not a number"),
        ({"operations": [{"key": "k"}]}, "an operation without its fields"),
        ({"remaining_budget": {"model_calls": 1.5}}, "a budget left that is not a count"),
        ({"batch": None}, "a batch that is not a list"),
        ({"call": "search"}, "a call that is not an object"),
    ],
)
def test_a_report_that_is_not_one_is_refused_with_a_value_error(
    change: dict[str, Any], why: str
) -> None:
    raw = {**through_json(unknown_commit_report()), **change}
    with pytest.raises(ValueError, match="malformed"):
        Report.from_dict(raw)


def test_a_report_without_its_state_is_refused() -> None:
    raw = through_json(goal_met_report())
    del raw["state"]
    with pytest.raises(ValueError, match="malformed stop report"):
        Report.from_dict(raw)


def test_the_derived_fields_are_not_read_but_recomputed() -> None:
    raw = through_json(unknown_commit_report())
    raw["resume_condition"] = "anything"
    raw["operation_key"] = "another-key"
    again = Report.from_dict(raw)
    assert again.to_dict()["operation_key"] == NOTICE_KEY
    assert again.resume_condition == unknown_commit_report().resume_condition


def test_a_finish_verified_by_the_inspector_reads_back_completed() -> None:
    guard = make_guard(Clock())
    assert guard.before_model() is None
    report = guard.finish(Finish("done"), lambda result, subject: Evidence(4, True))
    again = Report.from_dict(through_json(report))
    assert (again.state, again.reason, again.revision) == (TaskState.COMPLETED, Reason.GOAL_MET, 4)
