"""People use the console in a real browser while a real worker runs their tasks.

Headless Chromium talks to the console on a live server; the tasks it starts are driven by
a Celery worker process on the same test database. Every assertion is about what the
person on the page sees (or, for a forged request, what the server refuses). Each page
visited is saved to tests/artifacts/screenshots/.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

from django.contrib.auth.models import User
from playwright.sync_api import Locator, Page, expect

from console import services
from console.models import AuditEntry, EventKind, Task, TaskState, TraceEvent
from console.records.roles import Role

from .conftest import BROWSER_TEST, Console, Worker, wait_for

pytestmark = BROWSER_TEST

Shoot = Callable[[Page, str], Path]
TASK_HEADING = re.compile(r"Task #(\d+) · ")


def trace_rows(page: Page) -> Locator:
    return page.locator("#trace-rows > tr")


def task_state(page: Page) -> Locator:
    """The task's state badge at the top of its page (not the "stop requested" one)."""
    return page.locator("#status > .state").first


def task_id_of(page: Page) -> int:
    heading = page.get_by_role("heading", name=TASK_HEADING)
    expect(heading).to_be_visible()
    found = TASK_HEADING.search(heading.inner_text())
    assert found is not None
    return int(found.group(1))


def last_seq_shown(page: Page) -> int:
    return int(trace_rows(page).last.locator("td").first.inner_text())


def wait_for_more_rows(page: Page, than: int, *, timeout_ms: int) -> int:
    """Wait (letting the page run) until the trace shows more than ``than`` rows."""
    waited = 0
    while (count := trace_rows(page).count()) <= than and waited < timeout_ms:
        page.wait_for_timeout(100)
        waited += 100
    return count


# -- an operator watches a long task and stops it ------------------------------------------------


def test_an_operator_watches_a_trace_grow_live_and_stops_the_task(
    console: Console, people: dict[Role, User], worker: Worker, shoot: Shoot
) -> None:
    page = console.open()
    page.goto("/")
    expect(page.get_by_role("heading", name="Sign in")).to_be_visible()
    shoot(page, "01-login")
    console.sign_in(people[Role.OPERATOR], page)

    page.get_by_role("link", name="Start a task").click()
    expect(page.get_by_role("heading", name="Start a task")).to_be_visible()
    page.get_by_role("link", name="long_runner", exact=True).click()
    expect(page.get_by_role("combobox", name="Agent")).to_have_value("long_runner")
    expect(page.get_by_label("Input")).to_have_value('{"pages": 100, "delay_ms": 300}')
    page.get_by_label("Reason").fill("watch the archive being read")
    shoot(page, "02-start-form")
    page.get_by_role("button", name="Start", exact=True).click()

    task_id = task_id_of(page)
    expect(page.get_by_role("status")).to_contain_text(f"Task {task_id} started.")
    expect(task_state(page)).to_have_text("RUNNING")
    # A marker the page would lose if it reloaded: the rows must arrive without a reload.
    page.evaluate("window.__sameDocument = true")
    expect(trace_rows(page).first).to_be_visible()
    seen = trace_rows(page).count()
    more = wait_for_more_rows(page, than=seen, timeout_ms=5_000)
    assert more > seen, f"the trace stayed at {seen} rows for 5 s"
    assert page.evaluate("window.__sameDocument") is True, "the page reloaded"
    expect(page.locator("#trace-rows")).to_contain_text("read_page")
    shoot(page, "03-task-live")

    page.get_by_role("link", name="Stop…").click()
    expect(page.get_by_role("heading", name=f"Stop task #{task_id}?")).to_be_visible()
    page.get_by_label("Reason").fill("enough pages for the demo")
    shoot(page, "04-stop-form")
    page.get_by_role("button", name="Stop the task").click()

    expect(task_state(page)).to_have_text("CANCELLED")
    expect(page.locator("#status")).to_contain_text("operator_stop")
    expect(page.get_by_role("link", name="Stop…")).to_have_count(0)
    expect(trace_rows(page).last).to_contain_text("operator_stop")
    expect(trace_rows(page).last).to_contain_text("CANCELLED")
    rows_at_stop, seq_at_stop = trace_rows(page).count(), last_seq_shown(page)
    page.wait_for_timeout(2_000)  # seven pages' worth of reading, had it gone on
    assert trace_rows(page).count() == rows_at_stop
    page.reload()
    expect(task_state(page)).to_have_text("CANCELLED")
    assert last_seq_shown(page) == seq_at_stop, "the trace grew after the stop"
    facts = page.get_by_role("region", name="Task", exact=True)
    expect(facts).to_contain_text("enough pages for the demo")
    shoot(page, "05-task-stopped")
    task = Task.objects.get(id=task_id)
    assert (task.state, task.reason) == (TaskState.CANCELLED, "operator_stop")
    assert max(TraceEvent.objects.filter(task=task).values_list("seq", flat=True)) == seq_at_stop


# -- a lost response is reconciled and the task resumed ------------------------------------------


def test_a_lost_response_is_reconciled_then_the_resumed_task_completes(
    console: Console, people: dict[Role, User], worker: Worker, shoot: Shoot
) -> None:
    key = "incident-102-first-notice"
    operator = console.sign_in(people[Role.OPERATOR])
    operator.goto("/tasks/new?agent=lost_response")
    expect(operator.get_by_label("Input")).to_have_value('{"incident": 102}')
    operator.get_by_label("Reason").fill("show the lost response")
    operator.get_by_role("button", name="Start", exact=True).click()
    task_id = task_id_of(operator)
    expect(task_state(operator)).to_have_text("NEEDS_HUMAN", timeout=20_000)
    # The notice's response was lost as an exception (executor_error); what matters to
    # people is that the write is in doubt. The page reloads itself once the task stops.
    operations = operator.get_by_role("region", name="Operations", exact=True)
    expect(operations).to_contain_text(key)
    expect(operations.locator(".state")).to_have_text("UNKNOWN")
    expect(operator.get_by_role("link", name="Approve resumption…")).to_have_count(0)

    reconciler = console.sign_in(people[Role.RECONCILER])
    reconciler.get_by_role("link", name="Reconciliation").click()
    entry = reconciler.get_by_role("region", name=key)
    expect(entry).to_contain_text("UNKNOWN")
    expect(entry).to_contain_text(f"#{task_id}")
    entry.get_by_role("button", name="Look it up in the business system").click()
    expect(entry.get_by_role("status")).to_contain_text("It happened.")
    expect(entry.get_by_role("status")).to_contain_text("Nothing was changed")
    shoot(reconciler, "06-reconciliation-lookup")
    entry.get_by_label("It happened (mark committed)").check()
    entry.get_by_label("Evidence").fill("the desk shows the notice went out; checked by hand")
    entry.get_by_role("button", name="Record what happened").click()
    expect(reconciler.locator(".messages")).to_contain_text(f"{key} marked committed.")
    expect(reconciler.get_by_text("No write is in doubt.")).to_be_visible()

    approver = console.sign_in(people[Role.APPROVER])
    approver.goto(f"/tasks/{task_id}/")
    expect(task_state(approver)).to_have_text("NEEDS_HUMAN")
    approver.get_by_role("link", name="Approve resumption…").click()
    expect(
        approver.get_by_role("heading", name=f"Approve resumption of task #{task_id}")
    ).to_be_visible()
    approver.get_by_label("Reason").fill("the notice was sent once; finish the task")
    shoot(approver, "07-resume-form")
    approver.get_by_role("button", name="Approve resumption").click()
    expect(approver.locator(".messages")).to_contain_text(
        f"Task {task_id} resumes in a new phase."
    )
    expect(task_state(approver)).to_have_text("COMPLETED", timeout=20_000)
    expect(approver.locator("#status")).to_contain_text("goal_met")
    approver.reload()  # the phases and operations panels are not live
    phases = approver.get_by_role("region", name="Phases", exact=True)
    expect(phases.locator("tbody tr")).to_have_count(2)
    expect(phases).to_contain_text("the notice was sent once; finish the task")
    settled = approver.get_by_role("region", name="Operations", exact=True)
    expect(settled.locator(".state")).to_have_text("COMMITTED")
    shoot(approver, "08-task-completed")

    approver.get_by_role("link", name="Audit log").click()
    audit = approver.locator("#results")
    for who, what in [
        ("operator-e2e", "show the lost response"),
        ("reconciler-e2e", "looked the operation up in the business system"),
        ("reconciler-e2e", "the desk shows the notice went out"),
        ("approver-e2e", "the notice was sent once; finish the task"),
    ]:
        expect(audit.locator("tr", has_text=what)).to_contain_text(who)
    shoot(approver, "09-audit-log")
    approver.get_by_role("link", name="Tasks", exact=True).click()
    expect(approver.locator("#results tbody tr")).to_contain_text("COMPLETED")
    shoot(approver, "10-tasks")
    approver.get_by_role("link", name="Dashboard").click()
    expect(approver.get_by_role("region", name="Recently stopped")).to_contain_text("COMPLETED")
    shoot(approver, "11-dashboard")


# -- a viewer can look but not act --------------------------------------------------------------


def test_a_viewer_sees_no_actions_and_a_forged_stop_is_refused(
    console: Console, people: dict[Role, User], worker: Worker, shoot: Shoot
) -> None:
    waiting = services.task_start(agent="paging", input={}, enqueue=lambda task_id: None)
    stuck = services.task_start(agent="lost_response", input={"incident": 202})
    wait_for(
        lambda: Task.objects.filter(id=stuck.id, state=TaskState.NEEDS_HUMAN).exists(),
        timeout=20,
        what="the lost response to leave the task NEEDS_HUMAN",
    )
    # Control: someone holding every role is offered every action on the same pages.
    admin = console.sign_in(people[Role.ADMIN])
    viewer = console.sign_in(people[Role.VIEWER])
    offers: dict[str, Callable[[Page], Locator]] = {
        f"/tasks/{waiting.id}/": lambda page: page.get_by_role("link", name="Stop…"),
        f"/tasks/{stuck.id}/": lambda page: page.get_by_role("link", name="Approve resumption…"),
        "/operations/": lambda page: page.get_by_role(
            "button", name=re.compile("Look it up|Record what happened")
        ),
        "/": lambda page: page.get_by_role("link", name="Start a task"),
    }
    for path, action in offers.items():
        admin.goto(path)
        expect(action(admin).first).to_be_visible()
        viewer.goto(path)
        expect(viewer.locator("main")).to_be_visible()
        expect(action(viewer)).to_have_count(0)
    viewer.goto("/operations/")
    expect(viewer.locator("main form")).to_have_count(0)
    expect(viewer.get_by_text("settling an operation needs the reconciler role")).to_be_visible()
    shoot(viewer, "12-reconciliation-read-only")

    viewer.goto(f"/tasks/{waiting.id}/")
    token = next(c["value"] for c in viewer.context.cookies() if c["name"] == "csrftoken")
    forged = viewer.request.post(
        f"{console.url}/tasks/{waiting.id}/stop",
        form={"reason": "I only read"},
        headers={"X-CSRFToken": token},
        max_redirects=0,
    )

    assert forged.status == 403
    # Refused by the role check, not by CSRF: the token was valid.
    assert "Your roles do not include this action" in forged.text()
    viewer.reload()
    expect(task_state(viewer)).to_have_text("QUEUED")
    expect(viewer.locator("#status")).not_to_contain_text("stop requested")
    task = Task.objects.get(id=waiting.id)
    assert (task.state, task.stop_requested_at) == (TaskState.QUEUED, None)
    assert not AuditEntry.objects.filter(task=task).exists()


# -- what an agent writes is shown, never run ----------------------------------------------------

SCRIPT = "<script>window.__xss=1</script>"


def _event(task: Task, seq: int, **fields: object) -> TraceEvent:
    Task.objects.filter(id=task.id).update(next_seq=seq + 1)
    return TraceEvent.objects.create(task=task, phase=1, seq=seq, **fields)


def test_script_in_a_trace_is_shown_as_text_on_load_and_live(
    console: Console, people: dict[Role, User]
) -> None:
    task = services.task_start(agent="paging", input={}, enqueue=lambda task_id: None)
    _event(
        task, 1, kind=EventKind.REQUEST, decision="executed", tool="read_page",
        args_preview=json.dumps({"q": SCRIPT}), result_kind="SUCCESS", detail=SCRIPT,
    )
    # The console's CSP would block an inline script by itself; without it, only the
    # escaping stands between the agent's text and the browser.
    viewer = console.sign_in(people[Role.VIEWER], bypass_csp=True)
    viewer.goto(f"/tasks/{task.id}/")
    first = trace_rows(viewer).first
    expect(first).to_contain_text(json.dumps({"q": SCRIPT}))
    expect(first).to_contain_text(SCRIPT)

    # A row that arrives through the live view is escaped too.
    _event(task, 2, kind=EventKind.NOTE, detail=f"agent says {SCRIPT}", reason=SCRIPT[:40])
    expect(trace_rows(viewer)).to_have_count(2)
    expect(trace_rows(viewer).nth(1)).to_contain_text(f"agent says {SCRIPT}")

    assert viewer.evaluate("typeof window.__xss") == "undefined"
    assert viewer.locator("#trace-rows script").count() == 0
