"""What a newcomer met on the console (issue 12): bad filters said nothing, the dashboard's
boxes hid how many more there were, and the start form opened on an input for another agent."""

from __future__ import annotations

import html
import json
import re
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from console.models import AuditEntry, Task
from console.services import MAX_TEXT_CHARS

from .support import (
    START_FORM,
    SignIn,
    Start,
    World,
    body,
    finish,
    region,
    running,
    unknown_operation,
)

pytestmark = pytest.mark.django_db


# -- bad filter values -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("state=BOGUS", "state: unknown state &#x27;BOGUS&#x27;"),
        ("reason=deadlin", "reason: unknown stop reason &#x27;deadlin&#x27;"),
        ("agent=no_such_agent", "agent: unknown agent &#x27;no_such_agent&#x27;"),
        ("since=yesterday", "since: &#x27;yesterday&#x27; is not a date and time"),
        ("until=2024-13-01T00:00", "until: &#x27;2024-13-01T00:00&#x27; is not a date and time"),
    ],
)
def test_a_bad_task_filter_is_named_in_the_list_rather_than_ignored(
    signed_in: SignIn, world: World, query: str, message: str
) -> None:
    html = body(signed_in("viewer").get(f"/tasks/?{query}"))

    assert f'<ul class="errorlist"><li>{message}' in html
    # The bad filter is dropped, and the list says so: the count is of every task, with
    # no "match these filters" that would pass it off as filtered.
    assert "3 tasks." in html


def test_a_bad_filter_is_named_also_when_htmx_refreshes_only_the_results(
    signed_in: SignIn, world: World
) -> None:
    response = signed_in("viewer").get(
        "/tasks/?reason=nope", headers={"HX-Request": "true", "HX-Target": "results"}
    )

    assert "reason: unknown stop reason &#x27;nope&#x27;" in body(response)


def test_a_known_stop_reason_and_agent_still_narrow_the_list(
    signed_in: SignIn, world: World
) -> None:
    by_reason = body(signed_in("viewer").get("/tasks/?reason=operator_stop"))
    by_agent = body(signed_in("viewer").get("/tasks/?agent=test_notices"))

    assert "errorlist" not in by_reason
    assert "1 task matches these filters" in by_reason
    assert f'href="/tasks/{world.stopped.id}/"' in by_reason
    assert "errorlist" not in by_agent
    assert "1 task matches these filters" in by_agent
    assert f'href="/tasks/{world.uncertain.id}/"' in by_agent


def test_an_overlong_bad_filter_is_shown_cut_short(signed_in: SignIn, world: World) -> None:
    html = body(signed_in("viewer").get(f"/tasks/?agent={'x' * 500}"))

    assert f"<li>agent: unknown agent &#x27;{'x' * 60}…&#x27;</li>" in html


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("action=stopp", "action: unknown action &#x27;stopp&#x27;"),
        ("since=soon", "since: &#x27;soon&#x27; is not a date and time"),
        ("until=31/12/2024", "until: &#x27;31/12/2024&#x27; is not a date and time"),
    ],
)
def test_a_bad_audit_filter_is_named_in_the_log_rather_than_ignored(
    signed_in: SignIn, world: World, query: str, message: str
) -> None:
    signed_in("operator").post(f"/tasks/{world.queued.id}/stop", {"reason": "not needed"})

    html = body(signed_in("viewer").get(f"/audit/?{query}"))

    assert f'<ul class="errorlist"><li>{message}' in html


def test_a_known_audit_action_still_narrows_the_log(signed_in: SignIn, world: World) -> None:
    signed_in("operator").post(f"/tasks/{world.queued.id}/stop", {"reason": "not needed"})

    html = body(signed_in("viewer").get("/audit/?action=stop"))

    assert "errorlist" not in html
    assert "1 entry" in html


# -- the dashboard's boxes ---------------------------------------------------------------------

SHOWN = 15  # rows a dashboard box shows at most


@pytest.fixture
def crowd(start: Start) -> None:
    """More than a box shows of each: 16 writes in doubt (so 16 tasks needing a human),
    17 running tasks and 18 that stopped today, plus one that stopped two days ago."""
    for n in range(16):
        unknown_operation(start("test_notices", {"count": n + 1}), key=f"orders/{n}/notice")
    for n in range(17):
        running(start("test_reader", {"pages": n + 1}))
    for n in range(18):
        finish(start("test_waiter", {"n": n}), "CANCELLED", "operator_stop")
    old = finish(start("test_waiter", {"n": "old"}), "CANCELLED", "operator_stop")
    Task.objects.filter(id=old.id).update(finished_at=timezone.now() - timedelta(days=2))


def test_a_full_dashboard_box_says_how_many_there_are_and_links_to_all_of_them(
    signed_in: SignIn, crowd: None
) -> None:
    html = body(signed_in("viewer").get("/"))

    assert (
        '<a href="/tasks/?state=NEEDS_HUMAN">15 of 16 — see them all in the task list</a>' in html
    )
    assert '<a href="/operations/">15 of 16 — open the reconciliation queue</a>' in html
    assert '<a href="/tasks/?state=RUNNING">15 of 17 — see them all in the task list</a>' in html
    # The one that stopped two days ago is neither listed nor counted among today's.
    assert "15 of 18, the latest first" in html


def test_the_board_s_five_second_refresh_keeps_the_counts_of_full_boxes(
    signed_in: SignIn, crowd: None
) -> None:
    response = region(signed_in("viewer"), "/", "board")

    html = body(response)
    assert html.lstrip().startswith('<div id="board"')
    assert 'hx-trigger="every 5s"' in html
    assert "15 of 16 — open the reconciliation queue" in html
    assert "15 of 17 — see them all in the task list" in html


def test_a_box_that_shows_everything_it_holds_claims_no_more(
    signed_in: SignIn, world: World
) -> None:
    html = body(signed_in("viewer").get("/"))

    assert 'class="more"' not in html
    assert f'href="/tasks/{world.stopped.id}/"' in html  # listed in "Recently stopped"


def test_a_task_that_stopped_days_ago_is_not_among_the_recently_stopped(
    signed_in: SignIn, world: World
) -> None:
    Task.objects.filter(id=world.stopped.id).update(finished_at=timezone.now() - timedelta(days=2))

    html = body(signed_in("viewer").get("/"))

    assert "Nothing has stopped in the last 24 hours." in html
    assert f'href="/tasks/{world.stopped.id}/"' not in html


# -- the start form ----------------------------------------------------------------------------

SUPPORT_DESK = {"order": 42, "amount_cents": 1500, "reason": "the parcel arrived damaged"}
LOST_RESPONSE = {"incident": 102}


def start_form(response: Any) -> tuple[str, Any]:
    """The agent the start form has chosen, and the input it holds, as a person sees them."""
    page = body(response)
    chosen = re.search(r'<option value="([^"]+)"[^>]*selected', page)
    typed = re.search(r'<textarea name="input"[^>]*>(.*?)</textarea>', page, re.DOTALL)
    assert chosen and typed, "the page has no start form"
    text = html.unescape(typed.group(1)).strip()
    try:
        return chosen.group(1), json.loads(text)
    except ValueError:
        return chosen.group(1), text


def test_the_start_form_opens_on_the_first_agent_with_its_example_input(
    signed_in: SignIn,
) -> None:
    page = signed_in("operator").get("/tasks/new")

    # Not "{}": the support desk refuses an input without an order.
    assert start_form(page) == ("support_desk", SUPPORT_DESK)


def test_the_start_form_opens_on_the_agent_asked_for_with_its_example_input(
    signed_in: SignIn,
) -> None:
    page = signed_in("operator").get("/tasks/new?agent=lost_response")

    assert start_form(page) == ("lost_response", LOST_RESPONSE)


def test_an_unknown_agent_in_the_link_opens_the_form_on_one_that_exists(
    signed_in: SignIn,
) -> None:
    page = signed_in("operator").get("/tasks/new?agent=no_such_agent")

    assert start_form(page) == ("support_desk", SUPPORT_DESK)


def test_a_form_refused_for_another_agent_s_example_shows_the_chosen_agent_s_example(
    signed_in: SignIn,
) -> None:
    # Opened on lost_response, then the agent was changed and the input not.
    form = {"agent": "support_desk", "input": json.dumps(LOST_RESPONSE), "reason": ""}

    page = signed_in("operator").post("/tasks/new", form)

    assert page.status_code == 200
    assert not Task.objects.exists()
    assert start_form(page) == ("support_desk", SUPPORT_DESK)
    assert "That was lost_response&#x27;s example input; here is support_desk&#x27;s." in body(page)
    again = signed_in("operator").post("/tasks/new", {**form, "input": json.dumps(SUPPORT_DESK)})
    assert again.status_code == 302


def test_a_refused_form_keeps_an_input_the_operator_typed(signed_in: SignIn) -> None:
    typed = {"order": "forty-two"}
    form = {"agent": "support_desk", "input": json.dumps(typed), "reason": "order 42"}

    page = signed_in("operator").post("/tasks/new", form)

    assert "invalid input for support_desk" in body(page)
    assert start_form(page) == ("support_desk", typed)
    assert "example input; here is" not in body(page)


def test_a_task_starts_from_the_form_without_a_reason(signed_in: SignIn) -> None:
    response = signed_in("operator").post("/tasks/new", {**START_FORM, "reason": ""})

    assert response.status_code == 302
    entry = AuditEntry.objects.get(task=Task.objects.get())
    assert (entry.action, entry.reason) == ("start", "started from the console")


def test_the_start_form_the_api_and_the_guide_state_the_same_reason_rule(
    signed_in: SignIn,
) -> None:
    form = body(signed_in("operator").get("/tasks/new"))
    guide = (Path(__file__).parents[3] / "docs" / "operator-guide.md").read_text()
    start = guide[guide.index("### Start a task") : guide.index("### Stop")]

    rule = f"optional, at most {MAX_TEXT_CHARS:,} characters"
    assert rule.capitalize() in form
    assert f'maxlength="{MAX_TEXT_CHARS}"' in form
    assert rule in " ".join(start.split())
