"""Spend on hosted runs: each model call's maximum cost is reserved, and stored, before it
starts; the call that does not fit is refused; a summary turn answers after a stop."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from console.drivers import runner
from console.models import StopReport, Task, TaskState, TraceEvent
from console.records.spend import money, prices_from_environment

pytestmark = pytest.mark.django_db(transaction=True)

Start = Callable[..., Task]

# paid_reader at the default demo price: 1,000 tokens in and a 500-token cap out reserve
# 2 * 1000 + 8 * 500 = 6,000; each reply of 1,000 in and 200 out costs 2,000 + 1,600.
RESERVED, COST = 6_000, 3_600


def test_spend_runs_out_mid_task_and_the_call_that_does_not_fit_never_starts(
    seeded: None, start: Start
) -> None:
    task = start("paid_reader", {"pages": 10})

    outcome = runner.drive(task.id)

    task.refresh_from_db()
    assert outcome == "PARTIAL/spend_budget"
    # 4 calls cost 14,400; a fifth reservation (20,400) does not fit in 20,000.
    assert task.model_calls == 4
    assert task.spend == 4 * COST
    report = StopReport.objects.get(task=task).report
    assert report["used"]["spend"] == 4 * COST
    assert report["remaining_budget"]["spend"] == 20_000 - 4 * COST
    assert report["detail"] == "the next model call may cost USD 0.006; USD 0.0056 left"
    costs = list(
        TraceEvent.objects.filter(task=task, kind="model_call").values_list("cost", flat=True)
    )
    assert costs == [COST] * 4


def test_a_reservation_is_stored_before_the_paid_call_goes_out(
    seeded: None, start: Start, monkeypatch: pytest.MonkeyPatch
) -> None:
    from console.demo.agents import PaidReader

    seen: list[int] = []
    plan = PaidReader.plan

    def watching(self: PaidReader, observation: Any) -> Any:
        # What the database holds while the model "thinks": the reservation is in it.
        seen.append(Task.objects.values_list("spend", flat=True).get(id=self.task_id))
        return plan(self, observation)

    monkeypatch.setattr(PaidReader, "plan", watching)
    task = start("paid_reader", {"pages": 2})

    runner.drive(task.id)

    assert seen[:2] == [RESERVED, COST + RESERVED]


def test_a_summary_turn_after_a_budget_stop_is_added_to_the_stop_report(
    seeded: None, start: Start
) -> None:
    task = start("budget_burner", {"dimension": "model_calls", "summary": "yes"})

    outcome = runner.drive(task.id)

    task.refresh_from_db()
    assert outcome == "PARTIAL/model_budget"
    assert (task.state, task.reason) == (TaskState.PARTIAL, "model_budget")
    first, latest = StopReport.objects.filter(task=task).order_by("id")
    assert first.report["summary"] is None  # the stop as it was recorded stays
    assert latest.report["summary"].startswith("I read 2 of 10 pages")
    assert "stopped (model_budget)" in latest.report["summary"]
    turn = TraceEvent.objects.filter(task=task, kind="model_call").latest("seq")
    assert turn.detail.startswith("summary: I read 2 of 10 pages")


def test_no_summary_turn_is_taken_unless_the_agent_asks_for_one(seeded: None, start: Start) -> None:
    task = start("budget_burner", {"dimension": "model_calls"})

    runner.drive(task.id)

    assert StopReport.objects.filter(task=task).count() == 1


def test_money_reads_in_the_currency_without_floats(settings: Any) -> None:
    settings.LOOPGUARD_CURRENCY, settings.LOOPGUARD_CURRENCY_DECIMALS = "USD", 6
    assert money(14_400) == "USD 0.0144"
    assert money(20_000_000) == "USD 20.00"
    assert money(None) == "—"
    settings.LOOPGUARD_CURRENCY_DECIMALS = 2
    assert money(123_456) == "USD 1,234.56"


@pytest.mark.parametrize("value", ["gpt=1", "gpt=1:x", "=1:2", "gpt=1:2,gpt=3:4", "gpt=-1:2"])
def test_a_malformed_price_is_refused_naming_the_entry(value: str) -> None:
    from django.core.exceptions import ImproperlyConfigured

    with pytest.raises(ImproperlyConfigured, match="LOOPGUARD_MODEL_PRICES"):
        prices_from_environment(value)


def test_prices_read_as_minor_units_per_million_tokens() -> None:
    assert prices_from_environment(" a=1:2 , b=30:40 ,") == {"a": (1, 2), "b": (30, 40)}


def test_a_spend_budget_is_refused_for_an_agent_whose_model_has_no_price(start: Start) -> None:
    from console.services import InvalidInput

    with pytest.raises(InvalidInput, match="no price in LOOPGUARD_MODEL_PRICES"):
        start("paging", {"collection": "reports"}, spend=1_000)
    assert not Task.objects.exists()


def test_a_spend_grant_keeps_an_unbounded_spend_unbounded_and_adds_to_a_bounded_one(
    seeded: None, start: Start, django_user_model: Any
) -> None:
    from console import services

    approver = django_user_model.objects.create_user("ada")
    unbounded = start("budget_burner", {"dimension": "model_calls"})
    bounded = start("paid_reader", {"pages": 10})
    for task in (unbounded, bounded):
        runner.drive(task.id)

    services.task_approve_resumption(
        task_id=unbounded.id, actor=approver, reason="more", grant={"model_calls": 1, "spend": 5}
    )
    services.task_approve_resumption(
        task_id=bounded.id, actor=approver, reason="more", grant={"spend": 10_000}
    )

    unbounded.refresh_from_db()
    bounded.refresh_from_db()
    assert unbounded.limits.get("spend") is None
    assert bounded.limits["spend"] == 30_000


def test_the_summary_turns_reservation_is_stored_with_the_stop_before_the_call(
    seeded: None, start: Start, monkeypatch: pytest.MonkeyPatch
) -> None:
    from console.demo.agents import PaidReader

    seen: list[tuple[str, int]] = []
    summarise = PaidReader.summarise

    def watching(self: PaidReader, prompt: str, observation: Any) -> Any:
        row = Task.objects.values_list("state", "spend").get(id=self.task_id)
        seen.append(row)
        return summarise(self, prompt, observation)

    monkeypatch.setattr(PaidReader, "summarise", watching)
    task = start("paid_reader", {"pages": 10, "summary": "yes"}, model_calls=2, spend=50_000)

    assert runner.drive(task.id) == "PARTIAL/model_budget"

    # Two calls spent 7,200; the turn's 6,000 was stored with the stop, before the call.
    assert seen == [("PARTIAL", 2 * COST + RESERVED)]
    task.refresh_from_db()
    assert task.spend == 2 * COST + RESERVED  # scripted: it reports no usage, so it all counts
