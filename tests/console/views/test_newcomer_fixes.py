"""What a newcomer met on the console (issue 12): bad filters said nothing, the dashboard's
boxes hid how many more there were, and the start form opened on an input for another agent.
And how the long lists page and count at a million tasks (issue 23): from a row's place,
never a page number, and "more than 10,000" rather than a count of every match."""

from __future__ import annotations

import html
import json
import re
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from console import selectors
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


# -- paging and counting long lists ------------------------------------------------------------


def _links(html: str) -> dict[str, str]:
    """The pager's links, by their words, as the href a person (or a keyboard) follows."""
    pager = html[html.index('<nav class="pager"') :]
    pager = pager[: pager.index("</nav>")]
    found = re.findall(r'<a href="([^"]+)"[^>]*>([^<]+)</a>', pager)
    return {words.strip(): html_module.unescape(href) for href, words in found}


html_module = html


def _listed(html: str) -> list[int]:
    return [int(n) for n in re.findall(r'<td><a href="/tasks/(\d+)/">#', html)]


@pytest.fixture
def seven(start: Start, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Seven tasks created in the same microsecond (the list breaks the tie by id), three to
    a page; their ids newest first."""
    monkeypatch.setattr(selectors, "TASKS_PER_PAGE", 3)
    ids = [start("test_reader", {"pages": n}).id for n in range(7)]
    Task.objects.filter(id__in=ids).update(created_at=timezone.now())
    return sorted(ids, reverse=True)


def test_the_task_list_pages_older_and_back_newer_by_links_from_its_rows(
    signed_in: SignIn, seven: list[int]
) -> None:
    client = signed_in("viewer")

    first = body(client.get("/tasks/"))
    assert _listed(first) == seven[:3]
    assert set(_links(first)) == {"Older →"}  # the newest page: nothing newer
    assert "the newest tasks" in first

    second = body(client.get(_links(first)["Older →"]))
    assert _listed(second) == seven[3:6]
    assert set(_links(second)) == {"Newest", "← Newer", "Older →"}

    last = body(client.get(_links(second)["Older →"]))
    assert _listed(last) == seven[6:]
    assert set(_links(last)) == {"Newest", "← Newer"}  # nothing older

    back = body(client.get(_links(last)["← Newer"]))
    assert _listed(back) == seven[3:6]
    top = body(client.get(_links(back)["← Newer"]))
    assert _listed(top) == seven[:3]
    assert set(_links(top)) == {"Older →"}
    assert _listed(body(client.get(_links(back)["Newest"]))) == seven[:3]


def test_paging_keeps_the_filters_and_a_task_started_meanwhile_moves_no_row(
    signed_in: SignIn, start: Start, seven: list[int]
) -> None:
    client = signed_in("viewer")
    first = body(client.get("/tasks/?state=QUEUED&agent=test_reader"))
    older = _links(first)["Older →"]
    assert "state=QUEUED" in older and "agent=test_reader" in older

    start("test_reader", {"pages": 99})  # a page number would now show seven[2] again

    assert _listed(body(client.get(older))) == seven[3:6]


def test_a_page_from_newer_rows_than_a_page_holds_is_the_newest_page(
    signed_in: SignIn, seven: list[int]
) -> None:
    client = signed_in("viewer")
    second = body(client.get(_links(body(client.get("/tasks/")))["Older →"]))
    # Back from the second page's second row: two newer rows, less than a page.
    one_in = _links(body(client.get(_links(second)["← Newer"])))["Older →"]
    place = one_in.split("after=")[1]

    html = body(client.get(f"/tasks/?before={place}"))

    assert _listed(html) == seven[:3]
    assert set(_links(html)) == {"Older →"}


def test_a_list_past_the_counted_bound_says_more_than_and_stops_counting(
    signed_in: SignIn, seven: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    client = signed_in("viewer")
    monkeypatch.setattr(selectors, "COUNTED_UP_TO", 6)

    assert "More than 6 tasks. Times in" in body(client.get("/tasks/"))
    assert "More than 6 tasks match these filters." in body(
        client.get("/tasks/?agent=test_reader")
    )
    monkeypatch.setattr(selectors, "COUNTED_UP_TO", 7)
    assert "7 tasks. Times in" in body(client.get("/tasks/"))  # up to the bound: exact


def test_the_audit_log_pages_by_links_and_counts_up_to_its_bound(
    signed_in: SignIn, world: World, people: dict[str, User], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(selectors, "AUDIT_PER_PAGE", 2)
    monkeypatch.setattr(selectors, "COUNTED_UP_TO", 4)
    # Five stops, a minute apart, reason 4 the latest; the last two at the same instant.
    now = timezone.now()
    AuditEntry.objects.bulk_create(
        AuditEntry(
            actor=people["operator"],
            action="stop",
            task=world.queued,
            reason=f"reason {n}",
            at=now - timedelta(minutes=max(4 - n, 1)),
        )
        for n in range(5)
    )
    client = signed_in("viewer")

    first = body(client.get("/audit/?action=stop"))
    assert "More than 4 entries" in first
    assert re.findall(r"reason (\d)", first) == ["4", "3"]
    second = body(client.get(_links(first)["Older →"]))
    assert re.findall(r"reason (\d)", second) == ["2", "1"]
    assert "action=stop" in _links(second)["← Newer"]
    last = body(client.get(_links(second)["Older →"]))
    assert re.findall(r"reason (\d)", last) == ["0"]
    assert "Older →" not in _links(last)
    assert re.findall(r"reason (\d)", body(client.get(_links(last)["← Newer"]))) == ["2", "1"]


def test_an_old_numbered_page_link_says_the_list_starts_at_the_newest_now(
    signed_in: SignIn, seven: list[int]
) -> None:
    html = body(signed_in("viewer").get("/tasks/?page=2"))

    assert "page: pages have no numbers any more (follow Older and Newer)" in html
    assert _listed(html) == seven[:3]
    assert "errorlist" not in body(signed_in("viewer").get("/tasks/?page=1"))
