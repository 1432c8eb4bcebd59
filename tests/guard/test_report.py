"""The record of a task: its latest completed requests, and its one stop report."""

from __future__ import annotations

from guard import Reason, State, Usage
from guard._report import Record
from guard.steps import COMPLETED_KEPT


def stop(record: Record, reason: Reason) -> object:
    return record.stop(
        State.PARTIAL,
        reason,
        usage=Usage(model_calls=1),
        remaining={},
        revision=0,
        operations=(),
        call=None,
        batch=(),
        detail="",
    )


def test_a_long_run_keeps_only_its_latest_completed_requests_but_counts_them_all() -> None:
    record = Record()
    for step in range(COMPLETED_KEPT + 5):
        record.complete("read_page", f"fp-{step}", None, False, step)

    report = stop(record, Reason.MODEL_BUDGET)

    assert report is record.report
    assert record.report is not None
    assert record.report.completed_total == COMPLETED_KEPT + 5
    assert len(record.report.completed) == COMPLETED_KEPT
    assert record.report.completed[0]["fingerprint"] == "fp-5"


def test_the_first_stop_stands() -> None:
    record = Record()
    first = stop(record, Reason.DEADLINE)

    assert stop(record, Reason.MODEL_BUDGET) is first
    assert record.report is not None and record.report.reason is Reason.DEADLINE


def test_the_record_part_of_a_checkpoint_gives_back_what_was_completed() -> None:
    record = Record()
    record.complete("send_notice", "fp", "incident-42-first-notice", True, 3)

    again = Record()
    again.load(record.checkpoint())

    assert again.checkpoint() == {
        "completed": [["send_notice", "fp", "incident-42-first-notice", True, 3]],
        "completed_total": 1,
    }
