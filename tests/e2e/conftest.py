"""Fixtures for the browser tests: the console on a live server, a real worker, people, Chromium.

The console is served by pytest-django's ``live_server`` from the test database; a Celery
worker process group (with embedded beat) drives the tasks the browser starts, on a queue
of its own, against the same database; each person signs in through the login page in a
browser context of their own, as they would.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import (
    Browser,
    BrowserContext,
    Page,
    ViewportSize,
    expect,
    sync_playwright,
)

from console.demo.desk import seed_demo_data
from console.project.celery import app as celery_app
from console.records.roles import Role, assign
from tests.workers import Worker, start_worker, stop_worker
from tests.workers import wait_for as wait_for  # test_console.py imports it from here

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-background-networking",
    "--disable-gpu",
    "--disable-component-update",
    "--no-first-run",
]
# The size the screenshots in docs/screenshots/ are taken at.
VIEWPORT: ViewportSize = {"width": 1366, "height": 900}
PHONE: ViewportSize = {"width": 390, "height": 844}
"""A small phone's screen."""
SCREENSHOTS = ROOT / "tests" / "artifacts" / "screenshots"
PASSWORD = "correct horse battery staple"

BROWSER_TEST = [
    pytest.mark.e2e,
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        not CHROMIUM.exists(),
        reason=f"no {CHROMIUM}: install Debian's chromium package (`manage.py test` does)",
    ),
]
"""The marks of every browser test module (its ``pytestmark``): slow, on a live server's
transactions, and skipped where there is no Chromium."""


# -- the worker ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def worker(django_db_setup: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Worker]:
    """A worker (with beat) on a queue of its own; what the live server enqueues goes there."""
    queue = f"loopguard-e2e-{uuid.uuid4().hex[:12]}"
    running = start_worker(queue, tmp_path_factory.mktemp("e2e-worker"))
    # The live server runs in this process: its `run_task.delay()` must reach this queue.
    previous_queue = celery_app.conf.task_default_queue
    celery_app.conf.task_default_queue = queue
    try:
        yield running
    finally:
        celery_app.conf.task_default_queue = previous_queue
        stop_worker(running)


# -- people ----------------------------------------------------------------------------------


@pytest.fixture
def people(transactional_db: None) -> dict[Role, User]:
    """One person per role, each holding only that role; plus the desk's demo records."""
    seed_demo_data()
    found: dict[Role, User] = {}
    for role in Role:
        user = User.objects.create_user(f"{role.value}-e2e", password=PASSWORD)
        assign(user, [role])
        found[role] = user
    return found


# -- the browser -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """Headless Debian Chromium (never a browser Playwright downloads)."""
    # Playwright's sync API keeps an asyncio loop running on this thread, and Django refuses
    # ORM calls from a thread with a running loop. The tests' own ORM calls are plain
    # synchronous ones, so the check is switched off while the browser is up, and only then.
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
        with sync_playwright() as playwright:
            launched = playwright.chromium.launch(
                executable_path=str(CHROMIUM), args=CHROMIUM_ARGS
            )
            try:
                yield launched
            finally:
                launched.close()


@dataclass
class Console:
    """The console as people see it: one browser context per person."""

    browser: Browser
    url: str
    contexts: list[BrowserContext] = field(default_factory=list)

    def open(self, **options: Any) -> Page:
        """A fresh browser (no cookies) at the console's address."""
        options.setdefault("viewport", VIEWPORT)
        context = self.browser.new_context(base_url=self.url, **options)
        context.set_default_timeout(10_000)
        self.contexts.append(context)
        return context.new_page()

    def sign_in(self, user: User, page: Page | None = None, **options: Any) -> Page:
        """Sign ``user`` in through the login page; returns their page on the dashboard."""
        page = page or self.open(**options)
        if "/login" not in page.url:
            page.goto("/login")
        page.get_by_label("User name").fill(user.get_username())
        page.get_by_label("Password").fill(PASSWORD)
        page.get_by_role("button", name="Sign in").click()
        expect(page.get_by_role("heading", name="Dashboard", exact=True)).to_be_visible()
        return page

    def close(self) -> None:
        for context in self.contexts:
            context.close()


@pytest.fixture
def console(browser: Browser, live_server: Any, people: dict[Role, User]) -> Iterator[Console]:
    """Browser contexts at the live console; closed after the test."""
    opened = Console(browser, live_server.url)
    try:
        yield opened
    finally:
        opened.close()


@pytest.fixture(scope="session")
def shoot() -> Callable[[Page, str], Path]:
    """Save what ``page`` shows as tests/artifacts/screenshots/<name>.png (viewport only)."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)

    def save(page: Page, name: str) -> Path:
        path = SCREENSHOTS / f"{name}.png"
        page.screenshot(path=str(path), animations="disabled", caret="hide")
        return path

    return save
