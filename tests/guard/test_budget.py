"""Budgets: tokens the planner reports, a tool's own retries, and resumption with the
budgets already spent."""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import fields
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from guard import Call, Evidence, Finish, Kind, Limits, Reason, Result, State, Usage, _values
from guard._budget import Budget
from guard.steps import DIMENSIONS, Dimension

from .support import (
    Clock,
    Executor,
    Inspector,
    Planner,
    Records,
    Script,
    base_limits,
    functions,
    make_guard,
    page_after_page,
    read,
    roomy,
    scripted,
    tools,
)

# -- tokens -------------------------------------------------------------------------------


def test_tokens_reported_by_the_planner_stop_the_task_before_the_next_model_call() -> None:
    guard = make_guard(Clock(), roomy(tokens=100))
    next_page = page_after_page()

    def plan(observation: Any) -> Call:
        guard.spend_tokens(60)
        return next_page(observation)

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

    def read_page(call: Call) -> Result:
        if clock is not None:
            clock.advance(ms)
        records.revision = call.args["page"]
        return Result(Kind.SUCCESS)

    return Script(
        Planner(page_after_page(first_page)),
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


# -- one declaration of every budget ------------------------------------------------------


def test_usage_remaining_and_the_report_name_the_budgets_of_dimensions_in_its_order() -> None:
    guard = make_guard(Clock(), roomy())
    report = scripted([Finish()]).run(guard)
    counted = [d.used for d in DIMENSIONS]
    task_wide = [d.limit for d in DIMENSIONS if not d.per_job]
    assert task_wide == [
        "model_calls",
        "requests",
        "executions",
        "tokens",
        "spend",
        "explore",
        "deadline_ms",
    ]

    assert list(Usage().to_dict()) == counted
    assert list(report.to_dict()["used"]) == counted
    assert list(guard.checkpoint()["usage"]) == counted
    assert list(report.remaining) == task_wide
    assert list(Limits().remaining(Usage())) == task_wide
    assert report.usage == Usage(**{d.used: getattr(report, d.used) for d in DIMENSIONS})


def test_limits_and_usage_have_a_field_for_each_dimension_and_no_other() -> None:
    limits = [f.name for f in fields(Limits)]
    assert sorted(limits) == sorted([d.limit for d in DIMENSIONS] + list(_values._SETTINGS))
    assert [f.name for f in fields(Usage)] == [d.used for d in DIMENSIONS]


def test_the_limits_that_may_be_unbounded_are_those_whose_field_takes_none() -> None:
    assert {"tokens", "spend", "explore"} == _values._UNBOUNDED
    assert Limits(tokens=None, spend=None, explore=None).remaining(Usage()) == {
        "model_calls": 20,
        "requests": 40,
        "executions": 30,
        "tokens": None,
        "spend": None,
        "explore": None,
        "deadline_ms": 60_000,
    }


def _limits(name: str, value: Any) -> Limits:
    return Limits(**{name: value})


@pytest.mark.parametrize("dimension", DIMENSIONS, ids=[d.limit for d in DIMENSIONS])
def test_each_budgets_limit_is_checked_as_a_count(dimension: Dimension) -> None:
    assert getattr(_limits(dimension.limit, 0), dimension.limit) == 0
    with pytest.raises(ValueError, match=f"Limits.{dimension.limit} must be at least 0, got -1"):
        _limits(dimension.limit, -1)
    for wrong in (True, 1.5, "3"):
        with pytest.raises(TypeError, match=f"Limits.{dimension.limit} must be an int"):
            _limits(dimension.limit, wrong)
    if dimension.limit in _values._UNBOUNDED:
        assert getattr(_limits(dimension.limit, None), dimension.limit) is None
    else:
        with pytest.raises(TypeError, match=f"Limits.{dimension.limit} must be an int"):
            _limits(dimension.limit, None)


@pytest.mark.parametrize("name", ["same", "stagnant", "max_period"])
def test_the_detectors_settings_are_counts_of_at_least_one(name: str) -> None:
    assert getattr(_limits(name, 1), name) == 1
    with pytest.raises(ValueError, match=f"Limits.{name} must be at least 1, got 0"):
        _limits(name, 0)


def _values_edited(tmp_path: Path, *edits: tuple[str, str]) -> ModuleType:
    """guard/_values.py with each ``(anchor, addition)`` put after its anchor, imported on
    its own (it imports nothing of the guard's)."""
    source = Path(_values.__file__).read_text(encoding="utf-8")
    for anchor, addition in edits:
        assert source.count(anchor) == 1, f"guard/_values.py no longer has {anchor!r}"
        source = source.replace(anchor, anchor + addition)
    path = tmp_path / "edited_values.py"
    path.write_text(source, encoding="utf-8")
    spec = importlib.util.spec_from_file_location("edited_values", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses and get_type_hints look the module up
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    return module


# A budget of pages read, as a newcomer would add it: its dimension, its limit, its counter.
NEW_DIMENSION = (
    "DIMENSIONS: tuple[Dimension, ...] = (\n",
    '    Dimension("pages", "pages", Reason.REQUEST_BUDGET, "pages"),\n',
)
NEW_LIMIT = ("    max_period: int = 4\n", "    pages: int | None = None\n")
NEW_COUNTER = (
    '    """What a task has already spent: carried into a new guard when a task resumes."""\n\n',
    "    pages: int = 0\n",
)


def test_a_dimension_without_its_limits_field_stops_the_import(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match=r"Limits has no field for: \['pages'\]"):
        _values_edited(tmp_path, NEW_DIMENSION, NEW_COUNTER)


def test_a_limits_field_without_a_dimension_stops_the_import(tmp_path: Path) -> None:
    stray = r"neither a budget of DIMENSIONS nor a setting: \['pages'\]"
    with pytest.raises(TypeError, match=stray):
        _values_edited(tmp_path, NEW_LIMIT)


def test_a_dimension_without_its_usage_counter_stops_the_import(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match=r"Usage's fields .* must be the counters of DIMENSIONS"):
        _values_edited(tmp_path, NEW_DIMENSION, NEW_LIMIT)


def test_a_usage_counter_without_a_dimension_stops_the_import(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match=r"Usage's fields .* must be the counters of DIMENSIONS"):
        _values_edited(tmp_path, NEW_COUNTER)


def test_a_dimension_declared_twice_stops_the_import(tmp_path: Path) -> None:
    again = (NEW_DIMENSION[0], '    Dimension("spend", "spend", Reason.SPEND_BUDGET, "spend"),\n')
    with pytest.raises(TypeError, match=r"declares the used \['spend'\] more than once"):
        _values_edited(tmp_path, again)


def test_a_dimension_with_its_two_fields_is_checked_counted_and_kept_like_the_others(
    tmp_path: Path,
) -> None:
    edited = _values_edited(tmp_path, NEW_DIMENSION, NEW_LIMIT, NEW_COUNTER)

    assert {"tokens", "spend", "explore", "pages"} == edited._UNBOUNDED
    assert edited.Limits(pages=None).pages is None
    with pytest.raises(ValueError, match=r"Limits\.pages must be at least 0, got -1"):
        edited.Limits(pages=-1)
    assert list(edited.Usage(pages=3).to_dict()) == ["pages", *Usage().to_dict()]
    assert edited.Limits(pages=5).remaining(edited.Usage(pages=3))["pages"] == 2


PENDING_JOB = read("fetch_job_status", job=7)


STOPPING = tuple(d for d in DIMENSIONS if d.stops)  # the exploration budget only stops counting


@pytest.mark.parametrize("dimension", STOPPING, ids=[d.used for d in STOPPING])
def test_each_budget_spent_stops_the_task_with_the_reason_its_dimension_names(
    dimension: Dimension,
) -> None:
    script = scripted(
        [PENDING_JOB], [Result(Kind.PENDING, wait_ms=10)], [Evidence(0, False)], cycle=True
    )
    guard = make_guard(Clock(), roomy(same=50, **{dimension.limit: 0}))

    report = script.run(guard)

    assert (report.state, report.reason) == (State.PARTIAL, dimension.reason)


def test_a_budget_starts_from_what_earlier_phases_spent() -> None:
    clock = Clock(start=500)
    spent = Usage(model_calls=2, requests=3, executions=1, tokens=40, polls=1, elapsed_ms=300)

    budget = Budget(roomy(model_calls=3), clock.now, spent)

    assert budget.usage() == spent
    assert budget.start_model_call() is None
    assert budget.start_model_call() is Reason.MODEL_BUDGET
    assert budget.usage().model_calls == 3


def test_executions_admitted_for_one_model_call_are_reserved_until_the_batch_is_whole() -> None:
    budget = Budget(roomy(executions=2), Clock().now, Usage(executions=1))
    assert budget.start_model_call() is None

    assert budget.admit_execution() is True
    assert budget.admit_execution() is False  # the first call's execution is reserved
    assert budget.has_room() is True  # nothing has run yet
    budget.enter()
    assert budget.has_room() is False
