"""Every page of the console on a phone and a laptop, in both themes: it fits, it reads.

The pages are found from the URL map, not listed by hand: every console URL is filled in
with real objects (a finished task, a task waiting for a human with a write in doubt, its
operation) and kept if a signed-in person gets an HTML page from it. So a page added later
is checked without anyone remembering to add it here.

At 390 px (a small phone) and 1280 px no page may be wider than the screen: a wide table
scrolls inside its own box (on a phone its rows are cards). In the light and the dark theme,
every piece of text on every page meets WCAG AA contrast against what is behind it (4.5:1,
or 3:1 for large text). No word is broken across two lines ("appr|over", "read_pag|e"),
and no button, link or field is cut short ("Sen" for "Send test").
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver, reverse
from django.utils import timezone
from playwright.sync_api import Page, expect

from console.demo.desk import seed_demo_data
from console.drivers import attached, notifications, runner
from console.models import Approval, Operation, OperationState, Task, TaskState
from console.records.roles import Role, assign
from console.services import approval_reject, task_start
from tests.console.held import REFUND

from .conftest import BROWSER_TEST, PASSWORD, PHONE, Console

pytestmark = BROWSER_TEST

LAPTOP = {"width": 1280, "height": 800}
# Not pages: data, fragments, exports, probes, the API (its own tests), and sign-out.
NOT_PAGES = {"task-live", "task-report", "audit-export", "healthz", "metrics", "logout"}

# The contrast of every visible piece of text against the first opaque background behind
# it (WCAG 2.x relative luminance). Returns the pieces that fall short.
CONTRAST = """
() => {
  const parse = (value) => {
    let m = value.match(/rgba?\\(([^)]+)\\)/);
    if (m) {
      const p = m[1].split(/[ ,\\/]+/).filter(Boolean).map(Number);
      return [p[0], p[1], p[2], p.length > 3 ? p[3] : 1];
    }
    m = value.match(/color\\(srgb ([^)]+)\\)/);
    if (m) {
      const p = m[1].split(/[ \\/]+/).filter(Boolean).map(Number);
      return [p[0] * 255, p[1] * 255, p[2] * 255, p.length > 3 ? p[3] : 1];
    }
    return null;
  };
  const lum = ([r, g, b]) => {
    const c = [r, g, b].map((v) => {
      v /= 255;
      return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4);
    });
    return 0.2126 * c[0] + 0.7152 * c[1] + 0.0722 * c[2];
  };
  const background = (el) => {
    for (let node = el; node; node = node.parentElement) {
      const bg = parse(getComputedStyle(node).backgroundColor);
      if (bg && bg[3] > 0.5) return bg;
    }
    return parse(getComputedStyle(document.documentElement).backgroundColor) || [255, 255, 255, 1];
  };
  const short = [];
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  const seen = new Set();
  while (walker.nextNode()) {
    const text = walker.currentNode.textContent.trim();
    const el = walker.currentNode.parentElement;
    if (!text || !el || seen.has(el)) continue;
    seen.add(el);
    const style = getComputedStyle(el);
    const box = el.getBoundingClientRect();
    if (style.visibility === "hidden" || box.width === 0 || box.height === 0) continue;
    let fg = parse(style.color);
    if (!fg) continue;
    const bg = background(el);
    // A translucent text colour is seen mixed with what is behind it.
    fg = [0, 1, 2].map((i) => fg[i] * fg[3] + bg[i] * (1 - fg[3]));
    const [a, b] = [lum(fg), lum(bg)].sort((x, y) => y - x);
    const ratio = (a + 0.05) / (b + 0.05);
    const size = parseFloat(style.fontSize);
    const bold = parseInt(style.fontWeight, 10) >= 700;
    const large = size >= 24 || (bold && size >= 18.66);
    if (ratio < (large ? 3 : 4.5)) {
      const where = `${el.tagName.toLowerCase()}.${el.className}`;
      short.push(`${ratio.toFixed(2)}:1 "${text.slice(0, 40)}" (${where})`);
    }
  }
  return short;
}
"""

# Words whose text spans two lines (a Range per word, split on white space: more than one line
# of client rects), and controls cut short: a button, link or field whose text needs more
# than its box, or that an overflow-hidden box around it cuts. A line may end at a word's own
# hyphen between letters, as in print ("re-|sends"); names and keys ("everyone-e2e",
# "2026-12-03", "task-2-notice-1") hold digits and must stay whole.
READS = """
() => {
  const where = (el) => {
    const id = el.id ? `#${el.id}` : "";
    const names = typeof el.className === "string" ? el.className.trim() : "";
    return `${el.tagName.toLowerCase()}${id}${names ? "." + names.split(/\\s+/).join(".") : ""}`;
  };
  const prose = /^[(“"]?[A-Za-z]+(-[A-Za-z]+)+[)”".,;:!?]*$/;
  const broken = [];
  const range = document.createRange();
  const shown = new Map();
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  while (walker.nextNode()) {
    const node = walker.currentNode;
    const el = node.parentElement;
    if (!el || el.closest("script, style, template, option")) continue;
    if (!shown.has(el)) shown.set(el, el.checkVisibility({ visibilityProperty: true }));
    if (!shown.get(el)) continue;
    const words = /\\S+/g;
    let m;
    while ((m = words.exec(node.textContent))) {
      range.setStart(node, m.index);
      range.setEnd(node, m.index + m[0].length);
      const rects = Array.from(range.getClientRects()).filter((r) => r.width > 0);
      if (rects.length < 2 || !rects.some((r) => r.top >= rects[0].bottom - 1)) continue;
      if (prose.test(m[0])) continue;
      broken.push(`"${m[0].slice(0, 40)}" in ${where(el)}`);
    }
  }
  const cut = [];
  const controls = "a, button, input:not([type=hidden]), select, textarea, summary, .button";
  for (const el of document.querySelectorAll(controls)) {
    const box = el.getBoundingClientRect();
    if (box.width === 0 || !el.checkVisibility({ visibilityProperty: true })) continue;
    if (el.closest(".visually-hidden")) continue;
    const text = `"${(el.value || el.textContent || "").trim().slice(0, 30)}"`;
    const inline = getComputedStyle(el).display === "inline";
    if (!inline && el.tagName !== "INPUT" && el.scrollWidth > el.clientWidth + 1) {
      cut.push(`${where(el)} ${text} needs ${el.scrollWidth} px, has ${el.clientWidth}`);
      continue;
    }
    for (let up = el.parentElement; up && up !== document.body; up = up.parentElement) {
      const style = getComputedStyle(up);
      const hides = [style.overflowX, style.overflowY].some((v) => v === "hidden" || v === "clip");
      if (!hides) continue;
      const outer = up.getBoundingClientRect();
      if (box.left < outer.left - 1 || box.right > outer.right + 1
          || box.top < outer.top - 1 || box.bottom > outer.bottom + 1) {
        cut.push(`${where(el)} ${text} is cut by ${where(up)}`);
        break;
      }
    }
  }
  return { broken, cut };
}
"""

# What sticks out past the right edge of the screen, for the failure message.
WIDE = """
(width) => Array.from(document.querySelectorAll("body *"))
  .filter((el) => el.getBoundingClientRect().right > width + 0.5)
  .filter((el) => !el.closest(".scroll"))
  .slice(0, 8)
  .map((el) => {
    const right = Math.round(el.getBoundingClientRect().right);
    return `${el.tagName.toLowerCase()}.${el.className} right=${right}`;
  })
"""


@pytest.fixture
def everyone(transactional_db: None) -> User:
    """A person holding every role, so that every page shows every action it has."""
    user = User.objects.create_user("everyone-e2e", password=PASSWORD)
    assign(user, list(Role))
    return user


@pytest.fixture
def objects(everyone: User) -> dict[str, Any]:
    """Tasks and an operation for the pages to show: a finished read, and a write in doubt."""
    read = task_start(
        agent="paging",
        input={"collection": "reports"},
        enqueue=lambda task_id: None,
        actor=everyone,
    )
    runner.drive(read.id)
    doubt = task_start(
        agent="test_notices",
        input={"count": 2, "lose": 1, "auto_lookup": False},
        enqueue=lambda task_id: None,
        actor=everyone,
    )
    runner.drive(doubt.id)
    doubt.refresh_from_db()
    assert doubt.state == TaskState.NEEDS_HUMAN
    operation = Operation.objects.get(task=doubt, state=OperationState.UNKNOWN)
    # A channel told about tasks that need a human, with the notices those two made.
    notifications.channel_add(
        actor=everyone,
        reason="tell the desk's on-call",
        name="on-call desk",
        transport="email",
        kinds=["needs_human", "unknown_too_long", "restart_loop"],
        address="oncall@example.com, desk-lead@example.com",
    )
    notifications.route_events(now=timezone.now() + timedelta(hours=1))
    # A refund over the limit, held for approval: the queue and its task page show the call.
    seed_demo_data()
    # And one answered already: the queue's Answered table shows who, what and why.
    answered = task_start(
        agent="support_desk",
        input={**REFUND, "order": 43},
        enqueue=lambda task_id: None,
        actor=everyone,
    )
    assert runner.drive(answered.id) == "NEEDS_HUMAN/approval_required"
    approval_reject(
        approval_id=Approval.objects.get(task=answered).id,
        actor=everyone,
        reason="order 43 was refunded by hand at the desk yesterday",
        resume=False,
    )
    refund = task_start(
        agent="support_desk",
        input=REFUND,
        enqueue=lambda task_id: None,
        actor=everyone,
    )
    assert runner.drive(refund.id) == "NEEDS_HUMAN/approval_required"
    approval = Approval.objects.get(task=refund)
    # An attached agent's task, running, its client's long name shown on a phone too.
    answer, _ = attached.attached_start(
        actor=everyone,
        request_id="every-page",
        lease="e2e:attached",
        agent="incident-bot",
        client="incident-service/2.14.0 (langchain 1.2; guard.remote/1) on worker-eu-west-1a",
        tools={"read_incident": "read", "notify": "write"},
        fingerprint="every-page",
    )
    # Another, whose client's lease lapsed: it waits for its client, and its page says since
    # when (and when it will stop for a person).
    gone, _ = attached.attached_start(
        actor=everyone,
        request_id="every-page-gone",
        lease="e2e:gone",
        agent="incident-bot",
        client="incident-service/2.14.0 (crashed)",
        tools={"read_incident": "read"},
        fingerprint="every-page-gone",
    )
    lapsed = timezone.now() - timedelta(seconds=5)
    Task.objects.filter(id=gone["task"]).update(lease_expires_at=lapsed)
    runner.sweep(lambda task_id: None)
    waiting = Task.objects.get(id=gone["task"])
    assert waiting.waiting_for_client_since == lapsed
    tasks = [read, doubt, refund, Task.objects.get(id=answer["task"]), waiting]
    return {"tasks": tasks, "operation": operation, "approval": approval}


def _patterns(
    resolvers: list[URLPattern | URLResolver], prefix: str = ""
) -> Iterator[tuple[str, URLPattern]]:
    for entry in resolvers:
        if isinstance(entry, URLResolver):
            if str(entry.pattern).startswith("api"):
                continue  # the API has its own tests
            yield from _patterns(entry.url_patterns, prefix + str(entry.pattern))
        elif entry.name and entry.name not in NOT_PAGES:
            yield entry.name, entry


def page_urls(objects: dict[str, Any], user: User) -> list[str]:
    """Every console URL filled in with the objects, kept if it is an HTML page."""
    client = Client()
    client.force_login(user)
    values: dict[str, list[Any]] = {
        "task_id": [task.id for task in objects["tasks"]],
        "key": [objects["operation"].key],
        "channel_id": [1],  # the notification routes take POSTs only: their GETs are 405
        "approval_id": [objects["approval"].id],  # its answer takes POSTs only, too
    }
    found: list[str] = []
    for name, pattern in _patterns(get_resolver().url_patterns):
        params = list(pattern.pattern.regex.groupindex)
        unknown = [p for p in params if p not in values]
        assert not unknown, f"{name}: no value to fill {unknown} with; add one to this test"
        combos: list[dict[str, Any]] = [{}]
        for param in params:
            combos = [{**c, param: v} for c in combos for v in values[param]]
        for kwargs in combos:
            url = reverse(name, kwargs=kwargs)
            answer = client.get(url)
            if answer.status_code == 200 and answer["Content-Type"].startswith("text/html"):
                found.append(url)
    assert len(found) >= 8, found  # dashboard, lists, two tasks, forms, audit, ...
    return found


def _check(page: Page, url: str, problems: list[str], theme: str) -> None:
    """One load of ``url``: its width, its contrast, its words and its controls."""
    page.goto(url)
    page.wait_for_load_state("load")
    screen = page.viewport_size["width"] if page.viewport_size else PHONE["width"]
    seen = f"{url} ({theme}, {screen} px)"
    width = page.evaluate("document.documentElement.scrollWidth")
    if width > screen:
        wide = page.evaluate(WIDE, screen)
        problems.append(f"{seen}: {width} px wide: {wide}")
    for short in page.evaluate(CONTRAST):
        problems.append(f"{seen}: contrast {short}")
    reads = page.evaluate(READS)
    problems += [f"{seen}: a word on two lines: {word}" for word in reads["broken"]]
    problems += [f"{seen}: cut short: {control}" for control in reads["cut"]]


@pytest.mark.parametrize("screen", [PHONE, LAPTOP], ids=["phone", "laptop"])
@pytest.mark.parametrize("theme", ["light", "dark"])
def test_every_page_fits_its_screen_and_its_text_reads(
    console: Console,
    everyone: User,
    objects: dict[str, Any],
    theme: str,
    screen: dict[str, int],
    shoot: Callable[[Page, str], Path],
) -> None:
    urls = page_urls(objects, everyone)
    page = console.sign_in(everyone, viewport=screen, color_scheme=theme)
    problems: list[str] = []
    # The phone's screenshots (tests/artifacts/screenshots/): the pages a table used to squeeze.
    shots = {
        reverse("audit"): "15-audit-log-phone",
        reverse("task", args=[objects["tasks"][1].id]): "16-task-phone",
        reverse("tasks"): "17-tasks-phone",
    }

    for url in urls:
        _check(page, url, problems, theme)
        if screen is PHONE and theme == "light" and url in shots:
            shoot(page, shots[url])
    # Signed out: the sign-in page, and a page that does not exist.
    signed_out = console.open(viewport=screen, color_scheme=theme)
    _check(signed_out, reverse("login"), problems, theme)
    _check(page, "/no-such-page/", problems, theme)

    assert problems == [], "\n".join(problems)


def test_on_a_phone_the_trace_reads_as_cards_and_a_laptop_scrolls_it_in_its_box(
    console: Console, everyone: User, objects: dict[str, Any]
) -> None:
    task = objects["tasks"][1]
    phone = console.sign_in(everyone, viewport=PHONE)

    phone.goto(f"/tasks/{task.id}/")

    rows = phone.locator("#trace-rows > tr")
    assert rows.count() >= 2
    # Each event is a block of its own, its cells named: "Tool send_notice", not a column.
    assert rows.first.evaluate("(el) => getComputedStyle(el).display") == "block"
    tool = rows.nth(1).locator("td[data-label='Tool']")
    expect(tool).to_have_text("send_notice")
    assert tool.evaluate("(el) => getComputedStyle(el, '::before').content") == '"Tool"'
    assert phone.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]

    laptop = console.sign_in(everyone, viewport=LAPTOP)
    laptop.goto(f"/tasks/{task.id}/")
    box = laptop.locator(".scroll", has=laptop.locator("table.trace"))
    assert box.count() == 1
    assert box.evaluate("(el) => getComputedStyle(el).overflowX") == "auto"
    assert laptop.locator("table.trace thead").is_visible()
    assert laptop.evaluate("document.documentElement.scrollWidth") <= LAPTOP["width"]


def test_on_a_phone_the_navigation_is_one_menu_a_keyboard_opens(
    console: Console, everyone: User
) -> None:
    page = console.sign_in(everyone, viewport=PHONE)
    audit = page.get_by_role("link", name="Audit log", exact=True)
    expect(audit).to_be_hidden()
    header = page.locator("header.top").bounding_box()
    assert header is not None and header["height"] < 60  # one row, not three

    page.keyboard.press("Tab")  # the skip link
    page.keyboard.press("Tab")  # the brand
    page.keyboard.press("Tab")
    menu = page.get_by_text("Menu", exact=True)
    expect(menu).to_be_focused()
    page.keyboard.press("Enter")
    expect(audit).to_be_visible()
    page.keyboard.press("Tab")
    expect(page.get_by_role("link", name="Dashboard", exact=True)).to_be_focused()
    audit.focus()
    page.keyboard.press("Enter")

    expect(page.get_by_role("heading", name="Audit log")).to_be_visible()
    expect(page.get_by_role("link", name="Audit log", exact=True)).to_be_hidden()  # closed


def test_a_browser_in_tokyo_sees_tokyo_times_and_is_told_so(
    console: Console, everyone: User, objects: dict[str, Any]
) -> None:
    task = objects["tasks"][0]
    page = console.sign_in(everyone, timezone_id="Asia/Tokyo")

    page.goto(f"/tasks/{task.id}/")

    # The first page tells the console the browser's zone (a cookie) and reloads once.
    expect(page.locator("footer")).to_contain_text("Times are shown in Asia/Tokyo")
    expect(page.locator("#facts")).to_contain_text(" JST")


def test_an_operator_ticks_a_task_with_the_keyboard_and_the_live_list_leaves_it_ticked(
    console: Console, everyone: User, objects: dict[str, Any]
) -> None:
    from console.models import Task

    doubt = task_start(agent="test_reader", input={"pages": 2}, enqueue=lambda task_id: None)
    page = console.sign_in(everyone)
    page.goto("/tasks/?state=QUEUED")
    box = page.get_by_label(f"Select task #{doubt.id}")

    box.focus()
    page.keyboard.press("Space")
    # Something on the list changes; its next polls would redraw it, but not under a tick.
    Task.objects.filter(id=doubt.id).update(model_calls=41)
    page.wait_for_timeout(6_500)
    expect(box).to_be_checked()

    page.get_by_label("Reason (for each task's audit entry)").fill("cancel the stuck one")
    page.keyboard.press("Enter")

    expect(page.locator(".messages")).to_contain_text(
        f"Stopped 1 task: #{doubt.id}."
    )
    assert Task.objects.get(id=doubt.id).state == "CANCELLED"


def test_the_first_tab_offers_to_skip_the_navigation(console: Console, everyone: User) -> None:
    page = console.sign_in(everyone)

    page.keyboard.press("Tab")
    skip = page.get_by_role("link", name="Skip to the content")
    expect(skip).to_be_focused()
    expect(skip).to_be_in_viewport()  # visible once it has the focus
    page.keyboard.press("Enter")

    expect(page.locator("main")).to_be_focused()
