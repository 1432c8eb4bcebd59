"""Answers are private, the policy forbids framing and foreign form targets, and a session
lasts one shift."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.contrib.sessions.models import Session
from django.test import Client
from django.utils import timezone

from console.api.tokens import api_token_issue
from console.models import Task
from console.records.roles import Role, assign
from tests.processes import run_settings

from ..views.support import finish

PASSWORD = "pw-vera"


@pytest.fixture
def vera(django_user_model: type[User]) -> User:
    user = django_user_model.objects.create_user("vera", password=PASSWORD)
    assign(user, [Role.VIEWER])
    return user


@pytest.fixture
def browser(vera: User) -> Client:
    client = Client()
    client.force_login(vera)
    return client


@pytest.fixture
def task(start: Callable[..., Task]) -> Task:
    """A stopped task: its page, and its stop report to download."""
    return finish(start("test_reader", {"pages": 2}), "CANCELLED", "operator_stop")


def pages(task: Task) -> list[str]:
    return [
        "/",
        "/tasks/",
        f"/tasks/{task.id}/",
        f"/tasks/{task.id}/report.json",
        "/operations/",
        "/audit/",
        "/audit.csv",
        "/audit.json",
    ]


def test_every_signed_in_page_and_export_is_kept_out_of_every_cache(
    browser: Client, task: Task
) -> None:
    for url in pages(task):
        response = browser.get(url)
        assert response.status_code == 200, url
        directives = {d.strip() for d in response["Cache-Control"].split(",")}
        assert {"no-store", "private"} <= directives, (url, response["Cache-Control"])
        assert "public" not in directives


def test_an_api_answer_is_kept_out_of_every_cache(vera: User) -> None:
    _, secret = api_token_issue(user=vera, name="tests")
    response = Client(headers={"authorization": f"Bearer {secret}"}).get("/api/tasks")

    assert response.status_code == 200
    assert "no-store" in response["Cache-Control"]
    assert "private" in response["Cache-Control"]


def test_the_sign_in_page_is_not_cached_either(db: None) -> None:
    assert "no-store" in Client().get("/login")["Cache-Control"]


def test_static_files_keep_their_own_cache_lifetime(db: None) -> None:
    response = Client().get("/static/console/console.css")

    assert response.status_code == 200
    assert "no-store" not in response.get("Cache-Control", "")


@pytest.mark.parametrize(
    "directive",
    ["default-src 'self'", "frame-ancestors 'none'", "form-action 'self'", "base-uri 'none'"],
)
def test_the_content_security_policy_forbids_framing_foreign_forms_and_a_base(
    browser: Client, task: Task, directive: str
) -> None:
    for url in [*pages(task)[:3], "/login"]:
        assert directive in browser.get(url)["Content-Security-Policy"], url


def test_a_session_ends_with_the_browser_and_lasts_eight_hours_from_sign_in(vera: User) -> None:
    client = Client()
    before = timezone.now()

    response = client.post("/login", {"username": "vera", "password": PASSWORD})

    assert response.status_code == 302
    cookie = response.cookies["sessionid"]
    assert not cookie["expires"] and not cookie["max-age"]  # a browser-session cookie
    session = Session.objects.get()
    assert before + timedelta(hours=8) <= session.expire_date <= timezone.now() + timedelta(hours=8)


def test_a_session_past_its_lifetime_is_sent_back_to_sign_in(browser: Client) -> None:
    assert browser.get("/").status_code == 200
    Session.objects.update(expire_date=timezone.now() - timedelta(seconds=1))

    response = browser.get("/")

    assert response.status_code == 302
    assert response["Location"].startswith("/login")


def test_the_session_lifetime_and_browser_close_are_configurable() -> None:
    started = run_settings(
        "from django.conf import settings\n"
        "print(settings.SESSION_COOKIE_AGE, settings.SESSION_EXPIRE_AT_BROWSER_CLOSE)\n",
        LOOPGUARD_SESSION_HOURS="2.5",
        LOOPGUARD_SESSION_ENDS_WITH_BROWSER="0",
    )

    assert started.returncode == 0, started.stderr
    assert started.stdout.split() == ["9000", "False"]


def test_a_session_lifetime_that_is_not_a_number_stops_start_up() -> None:
    started = run_settings("", LOOPGUARD_SESSION_HOURS="a shift")

    assert started.returncode != 0
    assert "LOOPGUARD_SESSION_HOURS='a shift' is not a number" in started.stderr
