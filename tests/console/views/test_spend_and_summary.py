"""Spend reads as money wherever a person sees it, and a summary turn's text reads on the
task page: demo tasks run in-process, pages read by a signed-in browser."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from console.demo.agents import BudgetBurner
from console.drivers import runner
from console.drivers.runner.model import ModelCall
from console.models import StopReport, Task

from .support import XSS, XSS_ESCAPED, SignIn, Start, body, finish, running

pytestmark = pytest.mark.django_db(transaction=True)

# paid_reader at the default demo price (in millionths of a dollar): four calls of 3,600
# each spend 14,400 of 20,000, and the fifth's reservation of 6,000 does not fit.
SPENT, LIMIT, LEFT, COST = "USD 0.0144", "USD 0.02", "USD 0.0056", "USD 0.0036"
SUMMARY = "Summary for the user"
SUMMARY_POLLER = 'hx-trigger="every 2s"'


def out_of_money(start: Start) -> Task:
    task = start("paid_reader", {"pages": 10})
    assert runner.drive(task.id) == "PARTIAL/spend_budget"
    return task


def test_the_task_page_gauges_spend_in_the_currency(
    seeded: None, start: Start, signed_in: SignIn
) -> None:
    task = out_of_money(start)

    html = body(signed_in("viewer").get(f"/tasks/{task.id}/"))

    assert f'<span class="mono">{SPENT} / {LIMIT}</span>' in html
    assert '<span class="mono">14,400 / 20,000</span>' not in html
    assert '<span class="mono">4 / 20</span>' in html  # model calls: still a count


def test_the_stop_report_gives_spend_spent_and_left_in_the_currency(
    seeded: None, start: Start, signed_in: SignIn
) -> None:
    task = out_of_money(start)

    html = body(signed_in("viewer").get(f"/tasks/{task.id}/"))

    assert f'<td>Spend</td><td class="num">{SPENT}</td><td class="num">{LEFT}</td>' in html
    # Every other budget reads as the count it is.
    assert '<td>Model calls</td><td class="num">4</td><td class="num">16</td>' in html


def test_a_task_without_a_spend_limit_says_no_limit_for_spend(
    signed_in: SignIn, start: Start
) -> None:
    task = start("test_reader", {"pages": 9}, model_calls=3)
    runner.drive(task.id)  # runs out of model calls

    html = body(signed_in("viewer").get(f"/tasks/{task.id}/"))

    assert (
        '<td>Spend</td><td class="num">USD 0.00</td>'
        '<td class="num"><span class="muted">no limit</span></td>'
    ) in html
    assert '<span class="mono">USD 0.00 / ∞</span>' in html


def test_each_model_call_in_the_trace_shows_its_tokens_and_cost(
    seeded: None, start: Start, signed_in: SignIn
) -> None:
    task = out_of_money(start)

    html = body(signed_in("viewer").get(f"/tasks/{task.id}/"))

    assert "Tokens · cost</th>" in html
    assert html.count(f'<td class="num">1,200 · {COST}</td>') == 4


def test_the_dashboard_gauges_a_running_tasks_spend_in_the_currency(
    seeded: None, start: Start, signed_in: SignIn
) -> None:
    task = running(start("paid_reader", {"pages": 10}))
    Task.objects.filter(id=task.id).update(spend=14_400, model_calls=4)

    html = body(signed_in("viewer").get("/"))

    assert f"{SPENT} / {LIMIT}" in html
    assert "14,400 / 20,000" not in html


def test_the_resume_page_gauges_spend_in_the_currency_and_says_what_a_grant_is_counted_in(
    seeded: None, start: Start, signed_in: SignIn
) -> None:
    task = out_of_money(start)

    html = body(signed_in("approver").get(f"/tasks/{task.id}/resume"))

    assert "This task ran out of spend." in html
    assert f'<span class="mono">{SPENT} / {LIMIT}</span>' in html
    assert "1 is USD 0.000001, 10000 is USD 0.01" in html


def test_a_spend_grant_reads_as_money_in_the_phases(
    seeded: None, start: Start, signed_in: SignIn
) -> None:
    task = out_of_money(start)
    client = signed_in("approver")

    client.post(f"/tasks/{task.id}/resume", {"reason": "a little more", "grant_spend": "10000"})
    html = body(client.get(f"/tasks/{task.id}/"))

    assert "+USD 0.01 spend" in html
    assert "+10000 spend" not in html


def test_the_summary_turns_text_is_on_the_task_page(
    seeded: None, start: Start, signed_in: SignIn
) -> None:
    task = start("budget_burner", {"dimension": "model_calls", "summary": "yes"})
    runner.drive(task.id)

    html = body(signed_in("viewer").get(f"/tasks/{task.id}/"))

    assert f'<h3 id="h-report-summary">{SUMMARY}</h3>' in html
    assert '<p class="summary">I read 2 of 10 pages' in html
    assert "stopped (model_budget)" in html
    assert SUMMARY_POLLER not in html  # it is there: nothing more to wait for


def test_a_summary_is_shown_escaped(
    seeded: None, start: Start, signed_in: SignIn, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(BudgetBurner, "summarise", lambda self, prompt, observation: XSS)
    task = start("budget_burner", {"dimension": "model_calls", "summary": "yes"})
    runner.drive(task.id)

    html = body(signed_in("viewer").get(f"/tasks/{task.id}/"))

    assert f'<p class="summary">{XSS_ESCAPED}</p>' in html
    assert XSS not in html


def test_a_task_without_a_summary_turn_has_no_summary_section(
    seeded: None, start: Start, signed_in: SignIn
) -> None:
    task = start("budget_burner", {"dimension": "model_calls"})
    runner.drive(task.id)

    html = body(signed_in("viewer").get(f"/tasks/{task.id}/"))

    assert "Stop report" in html
    assert SUMMARY not in html
    assert "writing a summary" not in html
    assert SUMMARY_POLLER not in html


def _stopped_before_its_summary(start: Start, monkeypatch: pytest.MonkeyPatch) -> Task:
    """A task the runner stopped, saying a summary turn follows, that has not come yet."""
    monkeypatch.setattr(ModelCall, "summarise", lambda self, prompt, reserve, observation: None)
    task = start("budget_burner", {"dimension": "model_calls", "summary": "yes"})
    runner.drive(task.id)
    return task


def test_a_page_opened_between_the_stop_and_its_summary_waits_for_the_summary(
    seeded: None, start: Start, signed_in: SignIn, monkeypatch: pytest.MonkeyPatch
) -> None:
    task = _stopped_before_its_summary(start, monkeypatch)

    html = body(signed_in("viewer").get(f"/tasks/{task.id}/"))

    assert "The agent is writing a summary for the user" in html
    assert f'hx-get="/tasks/{task.id}/live?after=' in html
    assert SUMMARY_POLLER in html


def test_the_live_view_waits_quietly_for_a_summary_and_reloads_the_page_once_it_is_there(
    seeded: None, start: Start, signed_in: SignIn, monkeypatch: pytest.MonkeyPatch
) -> None:
    task = _stopped_before_its_summary(start, monkeypatch)
    viewer = signed_in("viewer")
    live = f"/tasks/{task.id}/live?after=0"

    waiting = viewer.get(live, headers={"HX-Request": "true"})
    # The summary arrives as the runner adds it: a stop report of its own, carrying it.
    stored = StopReport.objects.filter(task=task).latest("id").report
    StopReport.objects.create(
        task=task,
        phase=task.phase,
        state="PARTIAL",
        reason="model_budget",
        report={**stored, "summary": "Read 2 of 10 pages."},
    )
    done = viewer.get(live, headers={"HX-Request": "true"})

    assert waiting.status_code == 204  # nothing rebuilt while the summary is still to come
    assert done.status_code == 200 and done.headers.get("HX-Refresh") == "true"


def test_a_page_stops_waiting_for_a_summary_that_never_came(
    seeded: None, start: Start, signed_in: SignIn, monkeypatch: pytest.MonkeyPatch
) -> None:
    task = _stopped_before_its_summary(start, monkeypatch)
    # Its worker died during the summary turn, long ago.
    Task.objects.filter(id=task.id).update(finished_at=timezone.now() - timedelta(minutes=5))

    html = body(signed_in("viewer").get(f"/tasks/{task.id}/"))

    assert SUMMARY_POLLER not in html
    assert "writing a summary" not in html


def test_a_stop_no_summary_follows_does_not_wait_for_one(
    seeded: None, start: Start, signed_in: SignIn
) -> None:
    task = finish(
        start("budget_burner", {"dimension": "model_calls", "summary": "yes"}),
        "CANCELLED",
        "operator_stop",
    )

    html = body(signed_in("viewer").get(f"/tasks/{task.id}/"))

    assert SUMMARY_POLLER not in html
    assert "writing a summary" not in html
