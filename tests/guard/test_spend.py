"""Spend: money is reserved before a paid model call and settled after it (invariant 12).

A call starts only if its maximum cost fits in what is left; the reservation counts as
spent until the real cost replaces it, so a crash in between keeps it spent.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from guard import Evidence, Finish, Guard, Kind, Limits, Price, Reason, Result, State, Usage

from .support import (
    Clock,
    Executor,
    Planner,
    Script,
    make_guard,
    page_after_page,
    read,
    roomy,
    scripted,
)

# -- prices and limits ---------------------------------------------------------------------


def test_a_price_rounds_a_cost_up_to_a_whole_minor_unit() -> None:
    price = Price(input=3, output=15)  # minor units per million tokens

    assert price.cost(0, 0) == 0
    assert price.cost(1, 0) == 1  # 0.000003 of a unit is still a unit reserved
    assert price.cost(1_000_000, 0) == 3
    assert price.cost(1_000_001, 0) == 4
    assert price.cost(1_000_000, 1_000_000) == 18
    assert price.cost(200_000, 100_000) == 3  # 0.6 + 1.5 = 2.1, rounded up


@pytest.mark.parametrize("tokens", [-1, True, 1.0, "10"])
def test_a_price_refuses_a_token_count_that_is_not_a_count(tokens: Any) -> None:
    price = Price(input=3, output=15)

    with pytest.raises(ValueError):
        price.cost(tokens, 0)
    with pytest.raises(ValueError):
        price.cost(0, tokens)


@pytest.mark.parametrize("rate", [-1, True, 0.5])
def test_a_price_refuses_a_rate_that_is_not_a_count(rate: Any) -> None:
    with pytest.raises(ValueError):
        Price(input=rate, output=1)


def test_a_negative_spend_limit_is_refused() -> None:
    with pytest.raises(ValueError):
        Limits(spend=-1)
    with pytest.raises(TypeError):
        Limits(spend=1.5)  # type: ignore[arg-type]


def test_spend_is_a_budget_of_every_report_and_checkpoint() -> None:
    guard = make_guard(Clock(), roomy(spend=100))
    assert guard.before_model(reserve=30) is None

    assert guard.remaining()["spend"] == 70
    assert guard.checkpoint()["usage"]["spend"] == 30
    report = guard.halt(State.PARTIAL, Reason.MODEL_BUDGET)
    assert report.spend == 30
    assert report.to_dict()["used"]["spend"] == 30
    assert report.to_dict()["remaining_budget"]["spend"] == 70


def test_without_a_spend_limit_spend_is_counted_but_never_refused() -> None:
    guard = make_guard(Clock(), roomy())

    assert guard.before_model(reserve=10**9) is None
    assert guard.usage.spend == 10**9
    assert guard.remaining()["spend"] is None


# -- reserving -----------------------------------------------------------------------------


def test_a_reservation_that_does_not_fit_refuses_the_model_call_before_it_starts() -> None:
    guard = make_guard(Clock(), roomy(spend=100))
    script = scripted([read("lookup", id=1)])

    report = script.run(guard, reserve=lambda observation: 150)

    assert (report.state, report.reason) == (State.PARTIAL, Reason.SPEND_BUDGET)
    assert script.plan.calls == 0
    assert report.model_calls == 0
    assert report.spend == 0
    assert report.remaining["spend"] == 100
    assert "150" in report.detail


def test_a_reservation_that_exactly_fits_is_allowed() -> None:
    guard = make_guard(Clock(), roomy(spend=100))

    assert guard.before_model(reserve=100) is None
    assert guard.usage.spend == 100
    assert guard.remaining()["spend"] == 0


def test_a_bad_reservation_is_refused_and_counts_nothing() -> None:
    guard = make_guard(Clock(), roomy(spend=100))

    for bad in (-1, 2.5, True):
        with pytest.raises(ValueError):
            guard.before_model(reserve=bad)  # type: ignore[arg-type]

    assert guard.usage.spend == 0
    assert guard.usage.model_calls == 0
    assert guard.report is None


def test_settling_replaces_the_reservation_with_a_smaller_real_cost() -> None:
    guard = make_guard(Clock(), roomy(spend=100))
    assert guard.before_model(reserve=60) is None

    guard.settle_spend(20)

    assert guard.usage.spend == 20
    assert guard.remaining()["spend"] == 80
    assert guard.before_model(reserve=70) is None  # the money given back fits a bigger call


def test_settling_charges_a_real_cost_above_the_reservation_too() -> None:
    guard = make_guard(Clock(), roomy(spend=100))
    assert guard.before_model(reserve=30) is None

    guard.settle_spend(45)  # the model went over its stated maximum: the money is gone

    assert guard.usage.spend == 45


def test_a_model_call_is_settled_once_so_a_second_settlement_cannot_charge_it_again() -> None:
    guard = make_guard(Clock(), roomy(spend=100))
    assert guard.before_model(reserve=30) is None
    guard.settle_spend(20)

    with pytest.raises(ValueError, match="not settled yet"):
        guard.settle_spend(20)
    assert guard.usage.spend == 20


def test_a_negative_settlement_is_refused() -> None:
    guard = make_guard(Clock(), roomy(spend=100))
    assert guard.before_model(reserve=30) is None

    with pytest.raises(ValueError):
        guard.settle_spend(-5)
    assert guard.usage.spend == 30


def test_a_crash_between_reserving_and_settling_keeps_the_reservation_spent() -> None:
    clock = Clock()
    guard = make_guard(clock, roomy(spend=100))
    assert guard.before_model(reserve=40) is None
    saved = json.loads(json.dumps(guard.checkpoint()))  # the worker dies before settling

    restored = Guard.restore(saved, roomy(spend=100), now=clock.now, wait=clock.wait)

    assert restored.usage.spend == 40
    assert restored.remaining()["spend"] == 60
    assert restored.before_model(reserve=61) is not None  # 61 no longer fits


def test_spend_goes_on_across_phases() -> None:
    guard = make_guard(Clock(), roomy(spend=100), used=Usage(model_calls=3, spend=90))

    stop = guard.before_model(reserve=20)

    assert stop is not None
    assert (stop.state, stop.reason) == (State.PARTIAL, Reason.SPEND_BUDGET)
    assert stop.spend == 90
    assert stop.remaining["spend"] == 10
    assert stop.model_calls == 3


def test_a_reservation_that_fits_what_an_earlier_phase_left_is_allowed() -> None:
    guard = make_guard(Clock(), roomy(spend=100), used=Usage(spend=90))

    assert guard.before_model(reserve=10) is None
    assert guard.usage.spend == 100


def test_a_spend_budget_already_used_up_refuses_even_a_free_model_call() -> None:
    guard = make_guard(Clock(), roomy(spend=100), used=Usage(spend=100))
    script = scripted([read("lookup", id=1)])

    report = script.run(guard)  # no reserve: each call reserves 0

    assert (report.state, report.reason) == (State.PARTIAL, Reason.SPEND_BUDGET)
    assert script.plan.calls == 0
    assert report.remaining["spend"] == 0


def test_run_reserves_each_model_calls_cost_and_stops_when_the_next_does_not_fit() -> None:
    guard = make_guard(Clock(), roomy(spend=100))
    seen: list[Any] = []

    def reserve(observation: Any) -> int:
        seen.append(observation)
        return 30

    script = Script(Planner(page_after_page()), Executor(Result(Kind.SUCCESS, {"ok": True})))

    report = script.run(guard, reserve=reserve)

    assert (report.state, report.reason) == (State.PARTIAL, Reason.SPEND_BUDGET)
    assert script.plan.calls == 3
    assert script.execute.entries == 3
    assert report.model_calls == 3
    assert report.spend == 90
    assert report.remaining["spend"] == 10
    # Each reservation was asked with the observation that model call would see.
    assert seen[0] is None
    assert seen[1:] == [Result(Kind.SUCCESS, {"ok": True})] * 3


def test_run_with_a_reserve_that_raises_stops_as_a_planner_error_without_planning() -> None:
    guard = make_guard(Clock(), roomy(spend=100))
    script = scripted([Finish()])

    def reserve(observation: Any) -> int:
        raise RuntimeError("price list unavailable")

    report = script.run(guard, reserve=reserve)

    assert (report.state, report.reason) == (State.FAILED, Reason.PLANNER_ERROR)
    assert script.plan.calls == 0
    assert report.spend == 0


def test_run_with_a_reserve_that_returns_a_bad_amount_stops_instead_of_raising() -> None:
    guard = make_guard(Clock(), roomy(spend=100))
    script = scripted([Finish()], evidence=[Evidence(0, True)])

    report = script.run(guard, reserve=lambda observation: -1)

    assert report.state is State.FAILED
    assert script.plan.calls == 0
    assert report.spend == 0


def test_a_spend_stop_stays_stopped() -> None:
    guard = make_guard(Clock(), roomy(spend=10))
    script = scripted([read("lookup", id=1)])

    report = script.run(guard, reserve=lambda observation: 11)

    assert guard.before_model(reserve=0) is report
    assert script.run(guard, reserve=lambda observation: 0) is report
    assert script.plan.calls == 0
