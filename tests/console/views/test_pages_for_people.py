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
