"""Words on the pages that were wrong or stale, each a bug of its own (issue 22): every page
says what is true now, in a person's words."""

from __future__ import annotations

import html as markup
import re

import pytest

from console.models import Approval, AuditEntry, Operation, OperationState, Task

from .support import KEY, SignIn, Start, body, finish, running, unknown_operation

pytestmark = pytest.mark.django_db


def _row(page: str, task: Task) -> str:
    """The task list's row of ``task``, as its cells read (tags dropped)."""
    rows = re.findall(r"<tr>.*?</tr>", page, re.S)
    (row,) = [r for r in rows if f'href="/tasks/{task.id}/"' in r]
    return " ".join(re.sub(r"<[^>]+>", " ", row).split())


def _text(html: str) -> str:
    """``html`` as it reads: inline tags dropped, the others a space."""
    html = re.sub(r"</?(strong|code|span|a|time)\b[^>]*>", "", html)
    return markup.unescape(" ".join(re.sub(r"<[^>]+>", " ", html).split()))


def _section(page: str, heading_id: str) -> str:
    """The text of the page's section labelled by ``heading_id``."""
    found = re.search(rf'<section[^>]*aria-labelledby="{heading_id}".*?</section>', page, re.S)
    assert found, f"the page has no section {heading_id}"
    return _text(found.group(0))


def _bulk(signed_in: SignIn, who: str, action: str, tasks: list[Task]) -> str:
    form = {"action": action, "scope": "selected", "reason": "r", "task": [t.id for t in tasks]}
    return body(signed_in(who).post("/tasks/bulk", form, follow=True))


# -- the task list after a bulk stop ------------------------------------------------------------


def test_a_running_task_stopped_from_the_list_is_marked_stopping_until_it_ends(
    signed_in: SignIn, start: Start
) -> None:
    task = running(start("test_reader", {"pages": 2}))
    other = running(start("test_reader", {"pages": 3}))

    _bulk(signed_in, "operator", "stop", [task])
    page = body(signed_in("viewer").get("/tasks/"))

    assert "RUNNING stopping" in _row(page, task)
    assert "stopping" not in _row(page, other)  # nobody asked it to stop


def test_a_task_that_has_ended_is_no_longer_marked_stopping(
    signed_in: SignIn, start: Start
) -> None:
    task = running(start("test_reader", {"pages": 2}))
    _bulk(signed_in, "operator", "stop", [task])
    finish(task, "CANCELLED", "operator_stop")

    assert "stopping" not in _row(body(signed_in("viewer").get("/tasks/")), task)


# -- what the bulk actions say ---------------------------------------------------------------


def _held_before_running(start: Start, n: int) -> list[Task]:
    return [
        finish(start("test_reader", {"pages": 1, "n": i}), "NEEDS_HUMAN", "restart_loop")
        for i in range(n)
    ]


def test_a_bulk_stop_says_how_many_tasks_it_stopped_and_which(
    signed_in: SignIn, start: Start
) -> None:
    one, two = _held_before_running(start, 2)

    page = _bulk(signed_in, "operator", "stop", [one, two])

    assert f"Stopped 2 tasks: #{one.id}, #{two.id}." in page
    assert "task(s)" not in page


def test_a_bulk_stop_of_one_task_says_task_not_tasks(signed_in: SignIn, start: Start) -> None:
    (one,) = _held_before_running(start, 1)

    page = _bulk(signed_in, "operator", "stop", [one])

    assert f"Stopped 1 task: #{one.id}." in page


def test_a_bulk_approval_says_it_approved_the_resumption_of_each_task(
    signed_in: SignIn, start: Start
) -> None:
    one = finish(start("test_reader", {"pages": 2}), "PARTIAL", "no_progress")
    two = finish(start("test_reader", {"pages": 3}), "PARTIAL", "no_progress")

    page = _bulk(signed_in, "approver", "resume", [one])
    both = _bulk(signed_in, "approver", "resume", [two, one])

    assert f"Approved the resumption of 1 task: #{one.id}." in page
    assert f"Approved the resumption of 1 task: #{two.id}." in both  # #one: already queued
    assert "resumption approved for" not in page + both


# -- the Phases table ------------------------------------------------------------------------


def _answer(signed_in: SignIn, held: Approval, decision: str, reason: str) -> None:
    form = {"decision": decision, "reason": reason, "on_reject": "resume"}
    signed_in("approver").post(f"/approvals/{held.id}/answer", form)


def test_a_phase_opened_by_a_rejection_says_who_rejected_the_call(
    signed_in: SignIn, held: Approval
) -> None:
    _answer(signed_in, held, "reject", "above the goodwill limit")

    phases = _section(body(signed_in("viewer").get(f"/tasks/{held.task_id}/")), "h-phases")

    assert f"approver rejected the call to {held.tool}: above the goodwill limit" in phases
    assert "approved" not in phases.lower()


def test_a_phase_opened_by_an_approval_says_who_approved_the_call(
    signed_in: SignIn, held: Approval
) -> None:
    _answer(signed_in, held, "approve", "the customer confirmed")

    phases = _section(body(signed_in("viewer").get(f"/tasks/{held.task_id}/")), "h-phases")

    assert f"approver approved the call to {held.tool}: the customer confirmed" in phases
    assert "rejected" not in phases


def test_a_phase_opened_by_a_resumption_says_who_approved_the_resumption(
    signed_in: SignIn, start: Start
) -> None:
    task = finish(start("test_reader", {"pages": 2}), "PARTIAL", "no_progress")
    signed_in("approver").post(f"/tasks/{task.id}/resume", {"reason": "one more try"})

    phases = _section(body(signed_in("viewer").get(f"/tasks/{task.id}/")), "h-phases")

    assert "approver approved the resumption: one more try" in phases


# -- the exploration gauge -------------------------------------------------------------------


def test_the_exploration_gauge_shows_the_limit_the_task_runs_with(
    signed_in: SignIn, start: Start
) -> None:
    default = finish(start("test_reader", {"pages": 2}), "PARTIAL", "no_progress")
    five = start("test_reader", {"pages": 3}, explore=5)
    unbounded = start("test_reader", {"pages": 4}, explore=None)

    def gauge(task: Task) -> str:
        page = body(signed_in("viewer").get(f"/tasks/{task.id}/"))
        found = re.search(r'<span>new results</span>.*?<span class="mono">([^<]*)<', page, re.S)
        assert found, "the page has no exploration gauge"
        return found.group(1)

    # guard.Limits' default, as its driver runs it, and as its stop report counts what is left.
    assert gauge(default) == "0 / 20"
    report = _section(body(signed_in("viewer").get(f"/tasks/{default.id}/")), "h-report")
    assert "New results 0 20" in report
    assert gauge(five) == "0 / 5"
    assert gauge(unbounded) == "0 / ∞"


# -- the reconciliation card after a lookup --------------------------------------------------


def _swap_out_of_band(page: str, fragment: str) -> str:
    """``page`` after htmx swaps in the elements of ``fragment`` marked hx-swap-oob: each
    replaces the element of the page with its id."""
    for new in re.finditer(r'<(\w+) id="([^"]+)" hx-swap-oob="true".*?</\1>', fragment, re.S):
        tag, ident = new.group(1), new.group(2)
        page, swapped = re.subn(
            rf'<{tag} id="{ident}"[^>]*>.*?</{tag}>', new.group(0), page, count=1, flags=re.S
        )
        assert swapped == 1, f"the page has no element {ident} to swap"
    return page


def test_after_a_lookup_the_card_no_longer_says_nobody_has_looked_it_up(
    signed_in: SignIn, start: Start
) -> None:
    op = unknown_operation(start("test_notices", {"count": 1}))
    client = signed_in("reconciler")
    page = body(client.get("/operations/"))
    assert "Nobody has looked it up in the business system yet." in page

    answer = body(client.post(f"/operations/{KEY}/lookup", headers={"HX-Request": "true"}))
    page = _swap_out_of_band(page, answer)

    card = _section(page, f"h-op-{op.id}")
    assert "Nobody has looked it up" not in card
    assert "Last looked up by reconciler just now: it did not happen." in card
    assert "It did not happen." in answer  # the answer itself, under the card's line


def test_a_second_lookup_replaces_what_the_first_one_said(signed_in: SignIn, start: Start) -> None:
    from console.demo import desk

    op = unknown_operation(start("test_notices", {"count": 1}))
    client = signed_in("reconciler")
    client.post(f"/operations/{KEY}/lookup")  # nothing in the desk yet: it did not happen
    page = body(client.get("/operations/"))
    assert "it did not happen" in _section(page, f"h-op-{op.id}")
    desk.notice_send(order_number=None, recipient="ops@example.com", text="x", idempotency_key=KEY)

    answer = body(client.post(f"/operations/{KEY}/lookup", headers={"HX-Request": "true"}))
    card = _section(_swap_out_of_band(page, answer), f"h-op-{op.id}")

    assert "Last looked up by reconciler just now: it happened." in card
    assert "it did not happen" not in card


# -- a committed result through the reconciler's form ----------------------------------------


def test_the_form_refuses_a_whole_result_keeps_the_typing_and_changes_nothing(
    signed_in: SignIn, start: Start
) -> None:
    op = unknown_operation(start("test_notices", {"count": 1}))
    wrapped = '{"kind": "SUCCESS", "data": {"y": 2}}'
    form = {"decision": "committed", "evidence": "notice in the desk", "result": wrapped}

    page = body(signed_in("reconciler").post(f"/operations/{KEY}/resolve", form))

    assert f"{KEY} was not changed:" in page
    assert "send the data alone" in page
    assert markup.escape(wrapped) in page  # what was typed, to mend
    assert Operation.objects.get(key=KEY).state == OperationState.UNKNOWN
    assert not AuditEntry.objects.filter(operation=op).exists()


def test_the_form_stores_the_data_alone_as_the_results_data(
    signed_in: SignIn, start: Start
) -> None:
    unknown_operation(start("test_notices", {"count": 1}))
    form = {"decision": "committed", "evidence": "notice in the desk", "result": '{"y": 2}'}

    signed_in("reconciler").post(f"/operations/{KEY}/resolve", form)

    stored = Operation.objects.get(key=KEY)
    assert stored.state == OperationState.COMMITTED and stored.result is not None
    assert (stored.result["kind"], stored.result["data"]) == ("SUCCESS", {"y": 2})


def test_the_form_says_the_result_is_the_tools_data_alone(signed_in: SignIn, start: Start) -> None:
    unknown_operation(start("test_notices", {"count": 1}))

    page = _text(body(signed_in("reconciler").get("/operations/")))

    assert "its data alone, as JSON" in page
    assert 'do not wrap it in {"kind": …, "data": …}' in page
