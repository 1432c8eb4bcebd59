"""Pages meet the person reading them: local times with their zone, and the console's own
error pages (a missing page, an expired form) even in development mode."""

from __future__ import annotations

import json
import re

import pytest
from django.test import Client, override_settings

from console.project.pages import TIME_ZONE_COOKIE

from .support import SignIn, Start, World, body

pytestmark = pytest.mark.django_db


def test_times_are_shown_in_the_viewers_zone_and_say_which(signed_in: SignIn, world: World) -> None:
    client = signed_in("viewer")
    client.cookies[TIME_ZONE_COOKIE] = "Asia/Tokyo"
    created = world.stopped.created_at

    html = body(client.get(f"/tasks/{world.stopped.id}/"))

    local = created.astimezone(__import__("zoneinfo").ZoneInfo("Asia/Tokyo"))
    assert f"{local:%Y-%m-%d %H:%M:%S} JST" in html
    assert "Times are shown in Asia/Tokyo; exports and the API use UTC." in html


def test_without_a_zone_or_with_a_made_up_one_times_are_in_utc(
    signed_in: SignIn, world: World
) -> None:
    client = signed_in("viewer")
    client.cookies[TIME_ZONE_COOKIE] = "Mars/Olympus_Mons"

    html = body(client.get(f"/tasks/{world.stopped.id}/"))

    assert f"{world.stopped.created_at:%Y-%m-%d %H:%M:%S} UTC" in html
    assert "Times are shown in UTC" in html


def test_exports_stay_in_utc_whatever_the_viewers_zone(signed_in: SignIn, history: World) -> None:
    client = signed_in("viewer")
    client.cookies[TIME_ZONE_COOKIE] = "America/Los_Angeles"

    answer = client.get("/audit.json")
    entries = json.loads(b"".join(answer.streaming_content))  # type: ignore[attr-defined]

    assert entries
    assert all(re.search(r"(\+00:00|Z)$", entry["at"]) for entry in entries)


@override_settings(DEBUG=True)
def test_a_missing_page_is_the_consoles_own_page_even_in_development(
    signed_in: SignIn,
) -> None:
    answer = signed_in("viewer").get("/no-such-page/")

    html = body(answer)
    assert answer.status_code == 404
    assert "<h1>Not found</h1>" in html
    assert 'aria-label="Main"' in html  # the navigation
    assert "URLconf" not in html  # not Django's technical page, which lists every route


@override_settings(DEBUG=True)
def test_a_missing_task_is_the_consoles_own_page_even_in_development(
    signed_in: SignIn,
) -> None:
    answer = signed_in("viewer").get("/tasks/987654/")

    assert answer.status_code == 404
    assert "<h1>Not found</h1>" in body(answer)


@override_settings(DEBUG=True)
def test_the_api_still_answers_json_for_a_missing_task(signed_in: SignIn) -> None:
    answer = signed_in("viewer").get("/api/tasks/987654")

    assert answer.status_code in (401, 404)
    assert answer["Content-Type"].startswith("application/json")


def test_an_expired_form_gets_the_consoles_page_and_changes_nothing(
    signed_in: SignIn, start: Start
) -> None:
    task = start("test_reader", {"pages": 2})
    client = signed_in("operator", csrf=True)

    answer = client.post(f"/tasks/{task.id}/stop", {"reason": "stop it"})

    html = body(answer)
    assert answer.status_code == 403
    assert "This form has expired" in html
    assert 'aria-label="Main"' in html
    task.refresh_from_db()
    assert task.stop_requested_at is None


def test_an_expired_sign_in_form_gets_the_page_too() -> None:
    answer = Client(enforce_csrf_checks=True).post("/login", {"username": "x", "password": "y"})

    assert answer.status_code == 403
    assert "This form has expired" in body(answer)


def test_a_long_argument_and_a_result_open_in_place_not_only_on_hover(
    signed_in: SignIn, start: Start
) -> None:
    from .support import add_events

    task = start("test_reader", {"pages": 2})
    long_args = json.dumps({"customer": "ana@example.com", "note": "x" * 120})
    add_events(task, 1, args_preview=long_args, result_preview='{"page": 1, "items": ["a"]}')

    html = body(signed_in("viewer").get(f"/tasks/{task.id}/"))

    escaped = long_args.replace('"', "&quot;")
    assert f'<details class="cut"><summary>{escaped[:20]}' in html
    assert f"<code>{escaped}</code>" in html  # the whole of it, a keypress or a tap away
    assert '<summary class="mono">SUCCESS</summary><code>{&quot;page&quot;: 1' in html


def test_cancelling_a_held_task_says_cancel_on_its_page(signed_in: SignIn, start: Start) -> None:
    for _ in range(3):
        start("test_reader", {"pages": 1})
    held = start("test_reader", {"pages": 1})
    assert held.reason == "restart_loop"

    html = body(signed_in("operator").get(f"/tasks/{held.id}/stop"))

    assert f"<h1>Cancel task #{held.id}?</h1>" in html
    assert "Cancel the task</button>" in html
    assert "Stop the task" not in html


def test_every_page_starts_with_a_link_past_the_navigation(signed_in: SignIn) -> None:
    html = body(signed_in("viewer").get("/"))

    assert html.index('<a class="skip" href="#main">') < html.index('aria-label="Main"')
    assert '<main id="main" tabindex="-1">' in html


def test_the_resume_page_names_budgets_in_words_and_the_phases_show_the_grant_so(
    signed_in: SignIn, start: Start
) -> None:
    from console.drivers import runner

    task = start("test_reader", {"pages": 9}, model_calls=2)
    runner.drive(task.id)  # out of model calls
    client = signed_in("approver")

    form = body(client.get(f"/tasks/{task.id}/resume"))
    client.post(f"/tasks/{task.id}/resume", {"reason": "one more go", "grant_model_calls": "3"})
    page = body(client.get(f"/tasks/{task.id}/"))

    assert ">More model calls:</label>" in form
    assert "This task ran out of model calls." in form
    assert "On top of the model calls spent so far" in form
    assert ">grant model calls:</label>" not in form  # the field's name, as it was
    assert "+3 model calls" in page
    assert "{&#x27;model_calls&#x27;" not in page  # not a Python dict


def test_an_audit_export_with_a_filter_it_cannot_use_is_refused_not_made_of_everything(
    signed_in: SignIn, history: World
) -> None:
    answer = signed_in("viewer").get("/audit.csv?action=bogus")

    assert answer.status_code == 400
    assert "the export was not made: action:" in answer.content.decode()
