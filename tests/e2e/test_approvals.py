"""An approver answers a held refund on a phone, with the keyboard alone; a worker runs it once.

The refund over the limit is started like any task and driven by a real Celery worker until
it stops for approval. The approver signs in on a 390 px screen, reaches the approval queue
from the navigation, types a reason and presses Approve without touching a mouse; the
worker then runs the approved call in a new phase, and the desk holds exactly one refund.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from django.contrib.auth.models import User
from playwright.sync_api import Page, expect

from console.demo.models import Refund
from console.models import Approval, Task, TaskState
from console.records.roles import Role
from console.services import task_start
from tests.console.held import REFUND
from tests.workers import Worker, wait_for

from .conftest import BROWSER_TEST, PASSWORD, PHONE, Console

pytestmark = BROWSER_TEST

FOCUSED = "() => { const el = document.activeElement; return [el.tagName, el.id, el.textContent.trim().slice(0, 40), el.name || '', el.value || '']; }"  # noqa: E501


def _tab_to(page: Page, wanted: str, *, attribute: int = 2, limit: int = 80) -> None:
    """Press Tab until the focused element's text (or id: ``attribute=1``) is ``wanted``."""
    for _ in range(limit):
        page.keyboard.press("Tab")
        if page.evaluate(FOCUSED)[attribute] == wanted:
            return
    raise AssertionError(f"Tab never reached {wanted!r}; last focus: {page.evaluate(FOCUSED)}")


def _sign_in_by_keyboard(console: Console, user: User) -> Page:
    page = console.open(viewport=PHONE)
    page.goto("/login")
    page.get_by_label("User name").focus()
    page.keyboard.type(user.get_username())
    page.keyboard.press("Tab")
    page.keyboard.type(PASSWORD)
    page.keyboard.press("Enter")
    expect(page.get_by_role("heading", name="Dashboard", exact=True)).to_be_visible()
    return page


def test_an_approver_approves_a_held_refund_by_keyboard_on_a_phone_and_it_runs_once(
    console: Console,
    people: dict[Role, User],
    worker: Worker,
    shoot: Callable[[Page, str], Path],
) -> None:
    task = task_start(agent="support_desk", input=REFUND, actor=people[Role.OPERATOR])
    held = wait_for(
        lambda: Approval.objects.filter(task=task).first(),
        timeout=20,
        what="the worker to hold the refund for approval",
        explain=worker.log,
    )
    assert Refund.objects.count() == 0

    page = _sign_in_by_keyboard(console, people[Role.APPROVER])
    box = page.get_by_role("region", name="Calls waiting for approval")
    expect(box).to_contain_text(f"#{task.id}")
    _tab_to(page, "Menu")  # on a phone the navigation is a menu
    page.keyboard.press("Enter")
    _tab_to(page, "Approvals")
    page.keyboard.press("Enter")
    expect(page.get_by_role("heading", name="Approval queue")).to_be_visible()
    call = page.get_by_role("region", name=f"refund for task #{task.id}")
    expect(call).to_contain_text("order-42-refund")
    expect(call).to_contain_text(held.fingerprint)
    expect(call).to_contain_text('"amount_cents": 1500')
    assert page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
    shoot(page, "13-approval-queue-phone")

    _tab_to(page, f"reason-{held.id}", attribute=1)
    page.keyboard.type("order 42 arrived damaged; photos checked")
    page.keyboard.press("Tab")  # the rejection's choice, left as it is
    page.keyboard.press("Tab")
    assert page.evaluate(FOCUSED)[3:] == ["decision", "approve"]
    page.keyboard.press("Enter")

    expect(page.locator(".messages")).to_contain_text(
        f"Approved: task {task.id} runs the call to refund in a new phase."
    )
    expect(page.get_by_text("No call is waiting for approval.")).to_be_visible()
    answered = page.get_by_role("region", name="Answered (last 24 hours)")
    expect(answered).to_contain_text("order 42 arrived damaged; photos checked")
    expect(answered).to_contain_text("approver-e2e")
    shoot(page, "14-approval-answered-phone")

    wait_for(
        lambda: Task.objects.filter(id=task.id, state=TaskState.COMPLETED).exists(),
        timeout=20,
        what="the worker to run the approved refund",
        explain=worker.log,
    )
    assert list(Refund.objects.values_list("order__number", "amount_cents")) == [(42, 1500)]
    page.goto(f"/tasks/{task.id}/")
    expect(page.locator("#status")).to_contain_text("COMPLETED")
    expect(page.get_by_text("A call waits for approval")).to_have_count(0)
