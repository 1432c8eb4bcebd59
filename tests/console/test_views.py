"""The browser console: who may see and do what, and how every page holds up.

Each test signs in one of a handful of personas (one person per role, plus someone signed
in with no role at all) and drives the console through Django's test client against the
real PostgreSQL database, the way a person in a browser would: read a page, take the form
and its CSRF token from it, post it, follow the redirect, read the message.
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection, transaction
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from console import runner, selectors
from console.agents import Agent, Tool
from console.ledger import DatabaseLedger
from console.models import (
    AuditEntry,
    Operation,
    OperationState,
    Phase,
    Task,
    TaskState,
    TraceEvent,
)
from console.roles import Role, assign
from guard import Call, Evidence, Finish, Kind, Result, Settlement

pytestmark = pytest.mark.django_db

Start = Callable[..., Task]
SignIn = Callable[..., Client]

PERSONAS: dict[str, tuple[Role, ...]] = {
    "viewer": (Role.VIEWER,),
    "operator": (Role.OPERATOR,),
    "reconciler": (Role.RECONCILER,),
    "approver": (Role.APPROVER,),
    "admin": (Role.ADMIN,),
    "nobody": (),  # signed in, but holds no role
}
READERS = ("viewer", "operator", "reconciler", "approver", "admin")
MAY = {
    "start": ("operator", "admin"),
    "stop": ("operator", "admin"),
    "reconcile": ("reconciler", "admin"),
    "approve": ("approver", "admin"),
}


def _may_not(action: str) -> list[str]:
    return [name for name in PERSONAS if name not in MAY[action]]


KEY = "orders/42/first-notice"  # a slash, as real keys have: the URL must carry it intact
XSS = "<script>alert(1)</script>"
XSS_ESCAPED = "&lt;script&gt;alert(1)&lt;/script&gt;"
ATTRIBUTE_BREAKER = '" onmouseover="alert(2)'
POLLER = 'hx-trigger="every 1s"'
STOP_POLLING = 286  # htmx: "stop polling"


class ReceiptDesk(Agent):
    """A write tool whose business system answers a lookup with a receipt holding a secret."""

    name = "test_receipts"
    title = "Receipt desk (view tests)"

    def tools(self) -> list[Tool]:
        return [Tool("send_notice", "write", self._send, lookup=self._lookup)]

    def _send(self, call: Call) -> Result:
        return Result(Kind.SUCCESS, {})

    def _lookup(self, key: str) -> Settlement:
        receipt = {"receipt": "R-17", "api_token": "hunter2"}
        return Settlement(True, Result(Kind.SUCCESS, receipt), evidence="receipt R-17")

    def plan(self, observation: Any) -> Finish:
        return Finish()

    def inspect(self, result: Result | None, step: Call | Finish) -> Evidence:
        return Evidence(0, True)


# -- people and state ----------------------------------------------------------------------


@pytest.fixture(autouse=True)
def enqueued(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Task ids handed to Celery, kept here instead of going to Redis."""
    from console.tasks import run_task

    ids: list[int] = []
    monkeypatch.setattr(run_task, "delay", ids.append)
    yield ids


@pytest.fixture
def people(db: None) -> dict[str, User]:
    found = {}
    for name, roles in PERSONAS.items():
        user = User.objects.create_user(name, password=f"pw-{name}")
        assign(user, roles)
        found[name] = user
    return found


@pytest.fixture
def signed_in(people: dict[str, User]) -> SignIn:
    """A browser with ``name`` signed in; ``csrf=True`` checks CSRF like a real browser."""

    def sign_in(name: str, *, csrf: bool = False) -> Client:
        client = Client(enforce_csrf_checks=csrf)
        client.force_login(people[name])
        return client

    return sign_in


@dataclass
class World:
    queued: Task  # waiting for a worker: it can be stopped
    stopped: Task  # cancelled, with a stop report: it can be resumed
    uncertain: Task  # NEEDS_HUMAN/unknown_commit because of ``op``
    op: Operation  # an UNKNOWN write

    def reload(self) -> None:
        for task in (self.queued, self.stopped, self.uncertain):
            task.refresh_from_db()
        self.op.refresh_from_db()


@pytest.fixture
def world(start: Start) -> World:
    queued = start("test_reader", {"pages": 2})
    stopped = _finish(start("test_reader", {"pages": 3}), "CANCELLED", "operator_stop")
    uncertain = start("test_notices", {"count": 1})
    op = _unknown_operation(uncertain)
    uncertain.refresh_from_db()
    return World(queued, stopped, uncertain, op)


def _finish(task: Task, state: str, reason: str, detail: str = "") -> Task:
    """End ``task`` the way the runner does: terminal state, stop report, stop event."""
    with transaction.atomic():
        locked = Task.objects.select_for_update().get(id=task.id)
        report = runner.report_from_task(locked, state, reason, detail).to_dict()
        runner.finish_task(locked, state, reason, report, detail=detail)
    task.refresh_from_db()
    return task


def _run(task: Task) -> Task:
    """A worker holds ``task`` now."""
    Task.objects.filter(id=task.id).update(
        state=TaskState.RUNNING,
        lease_owner="worker:1",
        lease_expires_at=timezone.now() + timedelta(minutes=5),
    )
    task.refresh_from_db()
    return task


def _unknown_operation(task: Task, key: str = KEY, args: dict[str, Any] | None = None) -> Operation:
    """A write whose worker died mid-execution: claimed, then left UNKNOWN by recovery."""
    Task.objects.filter(id=task.id).update(
        state=TaskState.RUNNING, lease_owner="gone:1", lease_expires_at=timezone.now()
    )
    ledger = DatabaseLedger(task_id=task.id, owner="gone:1")
    ledger.describe(Call("send_notice", args or {"text": "notice 1"}, "write", key))
    ledger.claim(key, "a" * 64)
    task.refresh_from_db()
    with transaction.atomic():
        runner.recover(task, why="the worker died")
    return Operation.objects.get(key=key)


def _add_events(task: Task, count: int, **fields: Any) -> None:
    """Append ``count`` tool requests to the task's trace."""
    first = Task.objects.values_list("next_seq", flat=True).get(id=task.id)
    TraceEvent.objects.bulk_create(
        TraceEvent(
            task_id=task.id,
            phase=1,
            seq=seq,
            kind="request",
            decision="executed",
            **{
                "tool": "read_page",
                "args_preview": json.dumps({"page": seq}),
                "result_kind": "SUCCESS",
                **fields,
            },
        )
        for seq in range(first, first + count)
    )
    Task.objects.filter(id=task.id).update(next_seq=first + count)


def _rows(html: str) -> list[int]:
    """The sequence numbers of the trace rows in ``html``."""
    return [int(n) for n in re.findall(r'<td class="num mono">(\d+)</td>', html)]


def _token(html: str) -> str:
    found = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', html)
    assert found, "the page has no form with a CSRF token"
    return found.group(1)


def _html(response: Any) -> str:
    return response.content.decode()


def _streamed(response: Any) -> str:
    return b"".join(response.streaming_content).decode()


def _audit_count() -> int:
    return AuditEntry.objects.count()


def _pages(w: World) -> dict[str, str]:
    """Every page a person reads, by name."""
    return {
        "dashboard": "/",
        "tasks": "/tasks/",
        "task": f"/tasks/{w.stopped.id}/",
        "live": f"/tasks/{w.queued.id}/live?after=0",
        "report.json": f"/tasks/{w.stopped.id}/report.json",
        "operations": "/operations/",
        "audit": "/audit/",
        "audit.csv": "/audit.csv",
        "audit.json": "/audit.json",
    }


READ_PAGES = (
    "dashboard",
    "tasks",
    "task",
    "live",
    "report.json",
    "operations",
    "audit",
    "audit.csv",
    "audit.json",
)


# -- signing in ----------------------------------------------------------------------------


@pytest.mark.parametrize("page", [*READ_PAGES, "stop", "resume", "new"])
def test_someone_not_signed_in_is_sent_to_the_login_page_from_every_page(
    world: World, page: str
) -> None:
    urls = {
        **_pages(world),
        "stop": f"/tasks/{world.queued.id}/stop",
        "resume": f"/tasks/{world.stopped.id}/resume",
        "new": "/tasks/new",
    }

    response = Client().get(urls[page])

    assert response.status_code == 302
    assert response.url.startswith("/login?next=")


@pytest.mark.parametrize("action", ["resolve", "lookup"])
def test_someone_not_signed_in_cannot_post_an_action_and_is_sent_to_log_in(
    world: World, action: str
) -> None:
    response = Client().post(
        f"/operations/{KEY}/{action}", {"decision": "committed", "evidence": "trust me"}
    )

    assert response.status_code == 302
    assert response.url.startswith("/login?next=")
    world.reload()
    assert world.op.state == OperationState.UNKNOWN
    assert _audit_count() == 0


def test_the_health_check_answers_without_signing_in(db: None) -> None:
    response = Client().get("/healthz")

    assert response.status_code == 200
    assert response.json()["status"] == "ok"


def test_the_login_page_itself_is_open(db: None) -> None:
    response = Client().get("/login")

    assert response.status_code == 200
    assert "Sign in" in _html(response)


# -- who may read --------------------------------------------------------------------------


@pytest.mark.parametrize("page", READ_PAGES)
@pytest.mark.parametrize("persona", READERS)
def test_every_role_reads_every_page(
    signed_in: SignIn, world: World, persona: str, page: str
) -> None:
    response = signed_in(persona).get(_pages(world)[page])

    assert response.status_code == 200


@pytest.mark.parametrize("page", READ_PAGES)
def test_someone_signed_in_without_a_role_reads_nothing(
    signed_in: SignIn, world: World, page: str
) -> None:
    response = signed_in("nobody").get(_pages(world)[page])

    assert response.status_code == 403
    assert world.queued.agent not in _html(response)


def test_the_refusal_page_says_what_is_missing(signed_in: SignIn, world: World) -> None:
    response = signed_in("nobody").get("/tasks/")

    assert response.status_code == 403
    assert "Your roles do not include this action" in _html(response)


# -- who may act ---------------------------------------------------------------------------

START_FORM = {"agent": "test_reader", "input": '{"pages": 2}', "limits": "", "reason": "nightly"}


@pytest.mark.parametrize("persona", MAY["start"])
def test_operators_and_admins_may_start_a_task(signed_in: SignIn, persona: str) -> None:
    client = signed_in(persona)

    page = client.get("/tasks/new")
    response = client.post("/tasks/new", START_FORM)

    assert page.status_code == 200
    task = Task.objects.get()
    assert response.status_code == 302
    assert response.url == f"/tasks/{task.id}/"
    assert (task.agent, task.input, task.state) == ("test_reader", {"pages": 2}, "QUEUED")
    entry = AuditEntry.objects.get(task=task)
    assert (entry.actor.username, entry.action, entry.reason) == (persona, "start", "nightly")


@pytest.mark.parametrize("persona", _may_not("start"))
def test_no_one_else_may_start_a_task(signed_in: SignIn, persona: str) -> None:
    client = signed_in(persona)

    assert client.get("/tasks/new").status_code == 403
    assert client.post("/tasks/new", START_FORM).status_code == 403
    assert not Task.objects.exists()
    assert _audit_count() == 0


def test_starting_a_task_from_the_form_queues_it_for_a_worker(
    signed_in: SignIn,
    enqueued: list[int],
    django_capture_on_commit_callbacks: Callable[..., Any],
) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        response = signed_in("operator").post("/tasks/new", START_FORM, follow=True)

    task = Task.objects.get()
    assert enqueued == [task.id]
    assert f"Task {task.id} started." in _html(response)


@pytest.mark.parametrize("persona", MAY["stop"])
def test_operators_and_admins_may_stop_a_task(
    signed_in: SignIn, world: World, persona: str
) -> None:
    client = signed_in(persona)
    url = f"/tasks/{world.queued.id}/stop"

    page = client.get(url)
    response = client.post(url, {"reason": "wrong customer"}, follow=True)

    assert page.status_code == 200
    assert "Stop the task" in _html(page)
    world.reload()
    assert (world.queued.state, world.queued.reason) == ("CANCELLED", "operator_stop")
    assert response.redirect_chain == [(f"/tasks/{world.queued.id}/", 302)]
    assert f"Task {world.queued.id} stopped." in _html(response)
    entry = AuditEntry.objects.get(action="stop")
    assert (entry.actor.username, entry.reason) == (persona, "wrong customer")


@pytest.mark.parametrize("persona", _may_not("stop"))
def test_no_one_else_may_stop_a_task(signed_in: SignIn, world: World, persona: str) -> None:
    client = signed_in(persona)
    url = f"/tasks/{world.queued.id}/stop"

    assert client.get(url).status_code == 403
    assert client.post(url, {"reason": "let me"}).status_code == 403
    world.reload()
    assert world.queued.state == "QUEUED"
    assert world.queued.stop_requested_at is None
    assert _audit_count() == 0


def _resolve_form(op: Operation, decision: str = "not_committed", **extra: str) -> dict[str, str]:
    """The resolve form as the reconciliation queue renders it (prefixed per operation)."""
    prefix = f"op{op.id}"
    data = {
        "prefix": prefix,
        f"{prefix}-decision": decision,
        f"{prefix}-evidence": "no notice with this key in the desk",
    }
    data.update({f"{prefix}-{name}": value for name, value in extra.items()})
    return data


@pytest.mark.parametrize("persona", MAY["reconcile"])
def test_reconcilers_and_admins_may_resolve_an_uncertain_write(
    signed_in: SignIn, world: World, persona: str
) -> None:
    response = signed_in(persona).post(
        f"/operations/{KEY}/resolve", _resolve_form(world.op), follow=True
    )

    world.reload()
    assert world.op.state == OperationState.NOT_COMMITTED
    assert world.op.evidence == "no notice with this key in the desk"
    assert response.redirect_chain == [("/operations/", 302)]
    assert f"{KEY} marked not committed." in _html(response)
    entry = AuditEntry.objects.get(action="mark_not_committed")
    assert (entry.actor.username, entry.operation) == (persona, world.op)


@pytest.mark.parametrize("persona", MAY["reconcile"])
def test_reconcilers_and_admins_may_mark_a_write_committed_with_its_result(
    signed_in: SignIn, world: World, persona: str
) -> None:
    form = _resolve_form(world.op, "committed", result='{"notice": 17}')

    response = signed_in(persona).post(f"/operations/{KEY}/resolve", form, follow=True)

    world.reload()
    assert world.op.state == OperationState.COMMITTED
    assert world.op.result["data"] == {"notice": 17}
    assert f"{KEY} marked committed." in _html(response)


@pytest.mark.parametrize("persona", _may_not("reconcile"))
def test_no_one_else_may_resolve_an_uncertain_write(
    signed_in: SignIn, world: World, persona: str
) -> None:
    response = signed_in(persona).post(f"/operations/{KEY}/resolve", _resolve_form(world.op))

    assert response.status_code == 403
    world.reload()
    assert world.op.state == OperationState.UNKNOWN
    assert _audit_count() == 0


@pytest.mark.parametrize("persona", MAY["reconcile"])
def test_reconcilers_and_admins_may_look_a_write_up_in_the_business_system(
    signed_in: SignIn, world: World, persona: str
) -> None:
    response = signed_in(persona).post(f"/operations/{KEY}/lookup")

    assert response.status_code == 200
    html = _html(response)
    assert "It did not happen." in html  # no notice with this key exists in the desk
    assert "Nothing was changed" in html
    world.reload()
    assert world.op.state == OperationState.UNKNOWN  # a lookup informs, it does not settle
    entry = AuditEntry.objects.get()
    assert (entry.actor.username, entry.action, entry.after["committed"]) == (
        persona,
        "lookup",
        False,
    )


def test_a_lookup_posted_without_htmx_comes_back_as_a_whole_page(
    signed_in: SignIn, world: World
) -> None:
    # The lookup button is a plain form too (method and action): without JavaScript the
    # person must land on a page with the console around it, not on a bare fragment.
    response = signed_in("reconciler").post(f"/operations/{KEY}/lookup")

    assert response.status_code == 200
    assert "<html" in _html(response)
    assert "It did not happen." in _html(response)


@pytest.mark.parametrize("persona", _may_not("reconcile"))
def test_no_one_else_may_run_a_lookup(signed_in: SignIn, world: World, persona: str) -> None:
    response = signed_in(persona).post(f"/operations/{KEY}/lookup")

    assert response.status_code == 403
    assert _audit_count() == 0


@pytest.mark.parametrize("persona", MAY["approve"])
def test_approvers_and_admins_may_approve_a_resumption(
    signed_in: SignIn, world: World, persona: str
) -> None:
    client = signed_in(persona)
    url = f"/tasks/{world.stopped.id}/resume"

    page = client.get(url)
    response = client.post(url, {"reason": "the customer confirmed"}, follow=True)

    assert page.status_code == 200
    assert "Approve resumption" in _html(page)
    world.reload()
    assert (world.stopped.state, world.stopped.phase) == ("QUEUED", 2)
    assert f"Task {world.stopped.id} resumes in a new phase." in _html(response)
    phase = Phase.objects.get(task=world.stopped, number=2)
    assert (phase.approved_by.username, phase.approval_note) == (persona, "the customer confirmed")
    assert AuditEntry.objects.get(action="approve_resumption").actor.username == persona


@pytest.mark.parametrize("persona", _may_not("approve"))
def test_no_one_else_may_approve_a_resumption(
    signed_in: SignIn, world: World, persona: str
) -> None:
    client = signed_in(persona)
    url = f"/tasks/{world.stopped.id}/resume"

    assert client.get(url).status_code == 403
    assert client.post(url, {"reason": "let me"}).status_code == 403
    world.reload()
    assert (world.stopped.state, world.stopped.phase) == ("CANCELLED", 1)
    assert _audit_count() == 0


# -- pages offer only what the person may do -----------------------------------------------

CONTROLS_OF = {
    "viewer": set(),
    "operator": {"start", "stop"},
    "reconciler": {"resolve", "lookup"},
    "approver": {"approve"},
    "admin": {"start", "stop", "resolve", "lookup", "approve"},
}


@pytest.mark.parametrize("persona", READERS)
def test_each_role_is_shown_exactly_the_buttons_and_forms_it_may_use(
    signed_in: SignIn, world: World, persona: str
) -> None:
    client = signed_in(persona)
    dashboard = _html(client.get("/"))
    live_task = _html(client.get(f"/tasks/{world.queued.id}/"))
    stopped_task = _html(client.get(f"/tasks/{world.stopped.id}/"))
    queue = _html(client.get("/operations/"))

    shown = {
        "start": 'href="/tasks/new"' in dashboard,
        "stop": f'href="/tasks/{world.queued.id}/stop"' in live_task,
        "approve": f'href="/tasks/{world.stopped.id}/resume"' in stopped_task,
        "resolve": f'action="/operations/{KEY}/resolve"' in queue,
        "lookup": f'action="/operations/{KEY}/lookup"' in queue,
    }
    assert {name for name, visible in shown.items() if visible} == CONTROLS_OF[persona]
    # Nobody is offered to stop a task that has already stopped.
    assert f"/tasks/{world.stopped.id}/stop" not in stopped_task


def test_a_viewer_reading_the_reconciliation_queue_is_told_settling_needs_another_role(
    signed_in: SignIn, world: World
) -> None:
    queue = _html(signed_in("viewer").get("/operations/"))

    assert KEY in queue
    assert "settling an operation needs the reconciler role" in queue
    assert "<form" not in queue.split("<main", 1)[1]  # only the sign-out form, in the header


# -- CSRF ----------------------------------------------------------------------------------


@dataclass
class Action:
    persona: str  # who may do it
    form_page: str  # where that person finds the form
    url: str
    data: dict[str, str]
    happened: Callable[[], bool]


def _actions(w: World) -> dict[str, Action]:
    return {
        "start": Action(
            "operator",
            "/tasks/new",
            "/tasks/new",
            {"agent": "test_reader", "input": '{"pages": 9}', "reason": "csrf check"},
            lambda: Task.objects.filter(input={"pages": 9}).exists(),
        ),
        "stop": Action(
            "operator",
            f"/tasks/{w.queued.id}/stop",
            f"/tasks/{w.queued.id}/stop",
            {"reason": "runaway"},
            lambda: Task.objects.get(id=w.queued.id).state != TaskState.QUEUED,
        ),
        "resume": Action(
            "approver",
            f"/tasks/{w.stopped.id}/resume",
            f"/tasks/{w.stopped.id}/resume",
            {"reason": "fixed"},
            lambda: Task.objects.get(id=w.stopped.id).phase == 2,
        ),
        "resolve": Action(
            "reconciler",
            "/operations/",
            f"/operations/{KEY}/resolve",
            _resolve_form(w.op),
            lambda: Operation.objects.get(id=w.op.id).state != OperationState.UNKNOWN,
        ),
        "lookup": Action(
            "reconciler",
            "/operations/",
            f"/operations/{KEY}/lookup",
            {},
            lambda: AuditEntry.objects.filter(action="lookup").exists(),
        ),
    }


ACTIONS = ("start", "stop", "resume", "resolve", "lookup")


@pytest.mark.parametrize("action", ACTIONS)
def test_an_action_posted_without_its_csrf_token_is_refused_and_changes_nothing(
    signed_in: SignIn, world: World, action: str
) -> None:
    a = _actions(world)[action]
    client = signed_in(a.persona, csrf=True)
    assert client.get(a.form_page).status_code == 200  # the browser has its CSRF cookie

    response = client.post(a.url, a.data)

    assert response.status_code == 403
    assert not a.happened()
    assert _audit_count() == 0


@pytest.mark.parametrize("action", ACTIONS)
def test_an_action_posted_with_the_token_from_its_page_works(
    signed_in: SignIn, world: World, action: str
) -> None:
    a = _actions(world)[action]
    client = signed_in(a.persona, csrf=True)
    token = _token(_html(client.get(a.form_page)))

    response = client.post(a.url, {**a.data, "csrfmiddlewaretoken": token})

    assert response.status_code in (200, 302)
    assert a.happened()
    assert _audit_count() == 1


def test_an_htmx_post_carries_the_token_the_page_puts_on_its_body(
    signed_in: SignIn, world: World
) -> None:
    client = signed_in("reconciler", csrf=True)
    html = _html(client.get("/operations/"))
    found = re.search(r'hx-headers=\'\{"X-CSRFToken": "([^"]+)"\}\'', html)
    assert found

    response = client.post(
        f"/operations/{KEY}/lookup",
        headers={"HX-Request": "true", "X-CSRFToken": found.group(1)},
    )

    assert response.status_code == 200
    assert "<html" not in _html(response)
    assert f'id="lookup-{world.op.id}"' in _html(response)


@pytest.mark.parametrize("action", ACTIONS)
def test_a_viewer_forging_an_action_with_a_valid_token_is_refused_and_changes_nothing(
    signed_in: SignIn, world: World, action: str
) -> None:
    a = _actions(world)[action]
    client = signed_in("viewer", csrf=True)
    token = _token(_html(client.get("/")))  # the sign-out form carries one

    response = client.post(a.url, {**a.data, "csrfmiddlewaretoken": token})

    assert response.status_code == 403
    assert not a.happened()
    assert _audit_count() == 0


# -- stale actions -------------------------------------------------------------------------


def test_stopping_a_task_that_has_already_stopped_says_so_and_stops_it_once(
    signed_in: SignIn, world: World
) -> None:
    client = signed_in("operator")
    url = f"/tasks/{world.queued.id}/stop"
    client.post(url, {"reason": "first"})

    again = client.post(url, {"reason": "second, from a stale tab"}, follow=True)

    assert again.status_code == 200
    assert f"task {world.queued.id} has already stopped (CANCELLED)" in _html(again)
    assert AuditEntry.objects.filter(action="stop").count() == 1
    world.reload()
    assert world.queued.stop_note == "first"
    page = _html(client.get(url))
    assert "This task has already stopped" in page
    assert "Stop the task" not in page


def test_stopping_a_running_task_twice_says_it_is_already_stopping(
    signed_in: SignIn, world: World
) -> None:
    task = _run(world.queued)
    client = signed_in("operator")
    first = client.post(f"/tasks/{task.id}/stop", {"reason": "runaway"}, follow=True)

    again = client.post(f"/tasks/{task.id}/stop", {"reason": "still?"}, follow=True)

    assert f"Stop recorded: task {task.id} ends before its next step." in _html(first)
    assert f"task {task.id} is already stopping" in _html(again)
    assert AuditEntry.objects.filter(action="stop").count() == 1
    task.refresh_from_db()
    assert (task.state, task.stop_note) == ("RUNNING", "runaway")
    # The task page no longer offers a second stop; it shows the one recorded.
    page = _html(client.get(f"/tasks/{task.id}/"))
    assert f"/tasks/{task.id}/stop" not in page
    assert "stop requested" in page


def test_resolving_an_operation_someone_already_resolved_says_so_and_keeps_their_verdict(
    signed_in: SignIn, world: World
) -> None:
    signed_in("reconciler").post(f"/operations/{KEY}/resolve", _resolve_form(world.op))

    stale = signed_in("admin").post(
        f"/operations/{KEY}/resolve", _resolve_form(world.op, "committed"), follow=True
    )

    assert stale.status_code == 200
    assert f"{KEY} is already NOT_COMMITTED" in _html(stale)
    world.reload()
    assert world.op.state == OperationState.NOT_COMMITTED
    assert AuditEntry.objects.filter(operation=world.op).count() == 1
    assert KEY not in _html(signed_in("admin").get("/operations/"))  # it left the queue


def test_approving_a_running_task_is_refused_with_a_message(
    signed_in: SignIn, world: World
) -> None:
    task = _run(world.queued)
    client = signed_in("approver")

    page = client.get(f"/tasks/{task.id}/resume")
    response = client.post(f"/tasks/{task.id}/resume", {"reason": "go on"}, follow=True)

    assert "This task is RUNNING: there is nothing to resume." in _html(page)
    assert "Approve resumption</button>" not in _html(page)
    assert f"task {task.id} is RUNNING, not stopped" in _html(response)
    task.refresh_from_db()
    assert (task.state, task.phase) == ("RUNNING", 1)
    assert _audit_count() == 0


def test_approving_a_task_with_an_uncertain_write_shows_the_refusal_and_its_keys(
    signed_in: SignIn, world: World
) -> None:
    client = signed_in("approver")
    url = f"/tasks/{world.uncertain.id}/resume"

    page = client.get(url)
    posted = client.post(url, {"reason": "surely it is fine"})

    for response in (page, posted):
        assert response.status_code == 200
        html = _html(response)
        assert "Resumption is refused while these writes may or may not have happened" in html
        assert KEY in html
        assert "Approve resumption</button>" not in html
    world.reload()
    assert (world.uncertain.state, world.uncertain.phase) == ("NEEDS_HUMAN", 1)
    assert _audit_count() == 0


def test_approving_the_same_task_twice_opens_one_new_phase(signed_in: SignIn, world: World) -> None:
    url = f"/tasks/{world.stopped.id}/resume"
    signed_in("approver").post(url, {"reason": "first"})

    again = signed_in("admin").post(url, {"reason": "second"}, follow=True)

    assert f"task {world.stopped.id} is QUEUED, not stopped" in _html(again)
    assert Phase.objects.filter(task=world.stopped).count() == 2
    assert AuditEntry.objects.filter(action="approve_resumption").count() == 1


def test_approving_a_completed_task_says_there_is_nothing_to_resume(
    signed_in: SignIn, start: Start
) -> None:
    task = _finish(start("test_reader", {"pages": 1}), "COMPLETED", "goal_met")
    client = signed_in("approver")

    task_page = _html(client.get(f"/tasks/{task.id}/"))
    page = _html(client.get(f"/tasks/{task.id}/resume"))
    response = client.post(f"/tasks/{task.id}/resume", {"reason": "again"}, follow=True)

    assert f"/tasks/{task.id}/resume" not in task_page
    assert "This task is COMPLETED: there is nothing to resume." in page
    assert f"task {task.id} is completed: there is nothing to resume" in _html(response)
    assert _audit_count() == 0


def test_a_task_held_for_a_restart_loop_can_be_cancelled_from_its_page(
    signed_in: SignIn, start: Start
) -> None:
    for _ in range(3):
        start("test_reader", {"pages": 1})
    held = start("test_reader", {"pages": 1})
    assert (held.state, held.reason) == ("NEEDS_HUMAN", "restart_loop")
    client = signed_in("operator")

    page = _html(client.get(f"/tasks/{held.id}/"))
    response = client.post(
        f"/tasks/{held.id}/stop", {"reason": "the trigger is broken"}, follow=True
    )

    assert f'href="/tasks/{held.id}/stop">Cancel…' in page
    held.refresh_from_db()
    assert (held.state, held.reason) == ("CANCELLED", "operator_stop")
    assert f"Task {held.id} stopped." in _html(response)
    assert AuditEntry.objects.filter(action="stop").count() == 1


def test_a_write_still_being_executed_cannot_be_settled_and_the_person_is_told_why(
    signed_in: SignIn, start: Start
) -> None:
    task = _run(start("test_notices", {"count": 1}))
    DatabaseLedger(task_id=task.id, owner="worker:1").claim("orders/7/refund", "b" * 64)
    op = Operation.objects.get(key="orders/7/refund")
    client = signed_in("reconciler")

    queue = _html(client.get("/operations/"))
    response = client.post("/operations/orders/7/refund/resolve", _resolve_form(op), follow=True)

    assert "orders/7/refund" not in queue  # its worker is alive and holds the task
    assert "orders/7/refund is being executed right now; wait for it to finish" in _html(response)
    op.refresh_from_db()
    assert op.state == OperationState.IN_FLIGHT
    assert _audit_count() == 0


def test_a_task_that_ran_out_of_budget_resumes_only_with_an_explicit_grant(
    signed_in: SignIn, start: Start
) -> None:
    task = start("test_reader", {"pages": 5}, model_calls=4)
    Task.objects.filter(id=task.id).update(model_calls=4, requests=4, executions=4)
    task = _finish(task, "PARTIAL", "model_budget")
    client = signed_in("approver")
    url = f"/tasks/{task.id}/resume"

    page = _html(client.get(url))
    refused = client.post(url, {"reason": "one more go"})
    granted = client.post(url, {"reason": "one more go", "grant_model_calls": "6"})

    assert "This task ran out of model_calls." in page
    assert refused.status_code == 200
    assert "the task ran out of model_calls: grant an explicit amount to resume" in _html(refused)
    assert granted.status_code == 302
    task.refresh_from_db()
    assert (task.state, task.phase) == ("QUEUED", 2)
    assert task.limits["model_calls"] == 10
    assert task.model_calls == 4  # what was spent carries over
    assert AuditEntry.objects.filter(action="approve_resumption").count() == 1


def test_a_grant_that_is_not_a_whole_positive_number_is_a_form_error(
    signed_in: SignIn, start: Start
) -> None:
    task = _finish(start("test_reader", {"pages": 5}), "PARTIAL", "model_budget")

    response = signed_in("approver").post(
        f"/tasks/{task.id}/resume", {"reason": "more", "grant_model_calls": "-3"}
    )

    assert response.status_code == 200
    assert "Ensure this value is greater than or equal to 0." in _html(response)
    task.refresh_from_db()
    assert task.phase == 1


@pytest.mark.parametrize("suffix", ["/", "/stop", "/resume", "/report.json"])
@pytest.mark.parametrize("task_id", ["987654", "99999999999999999999"])
def test_a_task_that_does_not_exist_is_not_found(
    signed_in: SignIn, suffix: str, task_id: str
) -> None:
    client = signed_in("admin")
    url = f"/tasks/{task_id}{suffix}"

    assert client.get(url).status_code == 404
    if suffix in ("/stop", "/resume"):
        assert client.post(url, {"reason": "x"}).status_code == 404
    assert _audit_count() == 0


def test_the_stop_report_of_a_task_that_has_not_stopped_is_not_found(
    signed_in: SignIn, world: World
) -> None:
    assert signed_in("viewer").get(f"/tasks/{world.queued.id}/report.json").status_code == 404


def test_the_live_view_of_a_task_that_does_not_exist_tells_the_poller_to_stop(
    signed_in: SignIn,
) -> None:
    response = signed_in("viewer").get("/tasks/987654/live?after=0")

    assert response.status_code == STOP_POLLING


@pytest.mark.parametrize("action", ["resolve", "lookup"])
def test_an_operation_key_that_does_not_exist_is_not_found(
    signed_in: SignIn, world: World, action: str
) -> None:
    response = signed_in("admin").post(
        f"/operations/no/such/key/{action}",
        {"decision": "committed", "evidence": "looked"},
    )

    assert response.status_code == 404
    assert _audit_count() == 0


def test_a_page_or_action_that_does_not_accept_the_method_says_so(
    signed_in: SignIn, world: World
) -> None:
    client = signed_in("admin")

    assert client.get(f"/operations/{KEY}/resolve").status_code == 405
    assert client.post("/tasks/").status_code == 405
    assert _audit_count() == 0


# -- bad input -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("input", "{not json", "not valid JSON"),
        ("input", "[1, 2]", "must be a JSON object"),
        ("input", "NaN", "must be a JSON object"),
        ("input", '{"x": NaN}', "the input is not JSON"),
        ("limits", '{"model_calls": ', "not valid JSON"),
        ("limits", '"ten"', "must be a JSON object"),
        ("limits", '{"laps": 3}', "unknown limit(s): laps"),
        ("limits", '{"model_calls": -1}', "invalid limits"),
        ("limits", '{"model_calls": "ten"}', "invalid limits"),
        ("agent", "no_such_agent", "Select a valid choice"),
    ],
)
def test_a_start_form_with_bad_input_shows_the_error_and_creates_nothing(
    signed_in: SignIn, field: str, value: str, message: str
) -> None:
    response = signed_in("operator").post("/tasks/new", {**START_FORM, field: value})

    assert response.status_code == 200
    assert message in _html(response)
    assert not Task.objects.exists()
    assert _audit_count() == 0


def test_a_start_form_with_a_null_character_escaped_in_its_json_is_a_form_error(
    signed_in: SignIn,
) -> None:
    # PostgreSQL's jsonb cannot hold U+0000: the person must be told, not shown a 500.
    response = signed_in("operator").post(
        "/tasks/new", {**START_FORM, "input": '{"note": "a\\u0000b"}'}
    )

    assert response.status_code == 200
    assert "errorlist" in _html(response)
    assert not Task.objects.exists()


def test_the_start_form_keeps_what_was_typed_when_it_shows_an_error(signed_in: SignIn) -> None:
    response = signed_in("operator").post(
        "/tasks/new", {**START_FORM, "limits": '{"model_calls": '}
    )

    assert "{&quot;pages&quot;: 2}" in _html(response)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"result": "{oops"}, "result: not valid JSON"),
        ({"evidence": ""}, "evidence: This field is required."),
        ({"decision": "maybe"}, "decision: Select a valid choice."),
    ],
)
def test_a_resolve_form_with_bad_input_leaves_the_write_uncertain(
    signed_in: SignIn, world: World, fields: dict[str, str], message: str
) -> None:
    prefix = f"op{world.op.id}"
    form = {**_resolve_form(world.op, "committed")}
    form.update({f"{prefix}-{name}": value for name, value in fields.items()})

    response = signed_in("reconciler").post(f"/operations/{KEY}/resolve", form, follow=True)

    assert response.status_code == 200
    html = _html(response)
    assert f"{KEY} was not changed: {message}" in html
    world.reload()
    assert world.op.state == OperationState.UNKNOWN
    assert _audit_count() == 0


def test_a_resolve_form_whose_result_holds_a_null_character_is_refused_not_a_500(
    signed_in: SignIn, world: World
) -> None:
    form = _resolve_form(world.op, "committed", result='{"note": "a\\u0000b"}')

    response = signed_in("reconciler").post(f"/operations/{KEY}/resolve", form, follow=True)

    assert response.status_code == 200
    assert f"{KEY} was not changed" in _html(response)
    world.reload()
    assert world.op.state == OperationState.UNKNOWN


@pytest.mark.parametrize(
    "target", ["//evil.example/phish", "/\\evil.example/phish", "https://evil.example/"]
)
def test_the_resolve_form_sends_people_back_only_within_the_console(
    signed_in: SignIn, world: World, target: str
) -> None:
    form = {**_resolve_form(world.op), "next": target}

    response = signed_in("reconciler").post(f"/operations/{KEY}/resolve", form)

    assert response.status_code == 302
    assert "evil.example" not in response.url


def test_the_resolve_form_sends_people_back_to_the_page_they_came_from(
    signed_in: SignIn, world: World
) -> None:
    form = {**_resolve_form(world.op), "next": f"/tasks/{world.uncertain.id}/"}

    response = signed_in("reconciler").post(f"/operations/{KEY}/resolve", form)

    assert response.url == f"/tasks/{world.uncertain.id}/"


def test_garbage_task_filters_show_what_is_wrong_and_still_list_the_tasks(
    signed_in: SignIn, world: World
) -> None:
    response = signed_in("viewer").get("/tasks/?state=BOGUS&since=notadate&page=zzz")

    assert response.status_code == 200
    html = _html(response)
    assert "state: unknown state &#x27;BOGUS&#x27;" in html
    assert "since: &#x27;notadate&#x27; is not a date and time" in html
    assert "3 tasks" in html  # the bad filters are dropped, not applied
    assert "page 1 of 1" in html


def test_garbage_audit_filters_show_what_is_wrong(signed_in: SignIn, world: World) -> None:
    signed_in("operator").post(f"/tasks/{world.queued.id}/stop", {"reason": "r"})

    response = signed_in("viewer").get("/audit/?task=abc&until=2024-99-99&page=zzz")

    assert response.status_code == 200
    html = _html(response)
    assert "task: &#x27;abc&#x27; is not a task id" in html
    assert "until: &#x27;2024-99-99&#x27; is not a date and time" in html
    assert "1 entry" in html


@pytest.mark.parametrize(
    "url",
    [
        "/tasks/?q=%00",
        "/tasks/?reason=%00",
        "/tasks/?agent=%00",
        "/audit/?actor=%00",
        "/audit/?action=%00",
        "/audit.csv?actor=%00",
        "/audit.json?action=%00",
    ],
)
def test_a_null_character_in_a_filter_is_not_a_server_error(
    signed_in: SignIn, world: World, url: str
) -> None:
    response = signed_in("viewer").get(url)

    assert response.status_code in (200, 400)
    if response.streaming:  # an export fails while it streams: read it to the end
        _streamed(response)


def test_an_out_of_range_trace_cursor_is_not_a_server_error(
    signed_in: SignIn, world: World
) -> None:
    client = signed_in("viewer")
    huge = "99999999999999999999"

    assert client.get(f"/tasks/{world.stopped.id}/?before={huge}").status_code == 200
    assert client.get(f"/tasks/{world.stopped.id}/live?after={huge}").status_code in (
        200,
        STOP_POLLING,
    )


# -- escaping and CSP ----------------------------------------------------------------------


def _assert_escaped(html: str) -> None:
    assert "<script>" not in html
    assert XSS not in html
    assert XSS_ESCAPED in html
    assert ATTRIBUTE_BREAKER not in html


def test_agent_supplied_text_on_the_task_page_is_shown_escaped(
    signed_in: SignIn, start: Start
) -> None:
    task = start("test_reader", {"note": XSS})
    _add_events(
        task,
        1,
        tool=XSS,
        args_preview=f"{XSS}{ATTRIBUTE_BREAKER}",
        result_preview=f"{XSS}{ATTRIBUTE_BREAKER}",
        detail=XSS,
    )
    _finish(task, "FAILED", "fatal", detail=XSS)

    html = _html(signed_in("viewer").get(f"/tasks/{task.id}/"))

    _assert_escaped(html)
    assert html.count(XSS_ESCAPED) >= 6  # input, tool, args, result, detail, stop report


def test_agent_supplied_text_in_new_live_rows_is_shown_escaped(
    signed_in: SignIn, world: World
) -> None:
    task = _run(world.queued)
    _add_events(task, 1, args_preview=f"{XSS}{ATTRIBUTE_BREAKER}", detail=XSS)

    html = _html(signed_in("viewer").get(f"/tasks/{task.id}/live?after=0"))

    _assert_escaped(html)


def test_agent_supplied_text_in_the_reconciliation_queue_and_dashboard_is_shown_escaped(
    signed_in: SignIn, start: Start
) -> None:
    key = f"notice-{XSS}"
    _unknown_operation(start("test_notices", {"count": 1}), key, {"text": XSS})
    client = signed_in("reconciler")

    queue = _html(client.get("/operations/"))
    board = _html(client.get("/"))

    for html in (queue, board):
        assert "<script>" not in html
        assert XSS_ESCAPED in html
    # The key travels in the form's URL percent-encoded, and the form still works.
    assert 'action="/operations/notice-%3Cscript%3Ealert(1)%3C/script%3E/resolve"' in queue
    op = Operation.objects.get(key=key)
    response = client.post(
        "/operations/notice-%3Cscript%3Ealert(1)%3C/script%3E/resolve", _resolve_form(op)
    )
    assert response.status_code == 302
    op.refresh_from_db()
    assert op.state == OperationState.NOT_COMMITTED


def test_a_reason_typed_by_a_person_is_shown_escaped_in_the_audit_log(
    signed_in: SignIn, world: World
) -> None:
    signed_in("operator").post(f"/tasks/{world.queued.id}/stop", {"reason": XSS})
    client = signed_in("viewer")

    for url in ("/audit/", f"/tasks/{world.queued.id}/"):
        html = _html(client.get(url))
        assert "<script>" not in html
        assert XSS_ESCAPED in html


@pytest.mark.parametrize(
    "url", ["/", "/tasks/", "/operations/", "/audit/", "/tasks/987654/", "/login"]
)
def test_pages_carry_a_content_security_policy_allowing_only_our_own_origin(
    signed_in: SignIn, url: str
) -> None:
    response = signed_in("viewer").get(url)

    assert "default-src 'self'" in response["Content-Security-Policy"]


def test_a_refusal_page_carries_the_content_security_policy_too(signed_in: SignIn) -> None:
    response = signed_in("nobody").get("/")

    assert response.status_code == 403
    assert "default-src 'self'" in response["Content-Security-Policy"]


# -- htmx ----------------------------------------------------------------------------------


def test_an_htmx_filter_of_the_task_list_gets_only_the_results(
    signed_in: SignIn, world: World
) -> None:
    response = signed_in("viewer").get(
        "/tasks/?state=QUEUED", headers={"HX-Request": "true", "HX-Target": "results"}
    )

    html = _html(response).strip()
    assert response.status_code == 200
    assert html.startswith('<section id="results"')
    assert "<html" not in html
    assert 'class="filters' not in html
    assert f'href="/tasks/{world.queued.id}/"' in html
    assert f'href="/tasks/{world.stopped.id}/"' not in html


def test_the_same_task_list_url_without_htmx_is_the_whole_page(
    signed_in: SignIn, world: World
) -> None:
    html = _html(signed_in("viewer").get("/tasks/?state=QUEUED"))

    assert "<html" in html
    assert 'id="results"' in html


def test_an_htmx_filter_of_the_audit_log_gets_only_the_results(
    signed_in: SignIn, history: World
) -> None:
    response = signed_in("viewer").get(
        "/audit/?action=stop", headers={"HX-Request": "true", "HX-Target": "results"}
    )

    html = _html(response).strip()
    assert html.startswith('<section id="results"')
    assert "<html" not in html
    assert "1 entry" in html


def test_an_htmx_poll_of_the_dashboard_gets_only_the_board(signed_in: SignIn, world: World) -> None:
    response = signed_in("viewer").get("/", headers={"HX-Request": "true", "HX-Target": "board"})

    html = _html(response).strip()
    assert html.startswith('<div id="board"')
    assert "<html" not in html
    assert "<h1>Dashboard</h1>" not in html
    assert KEY in html  # the uncertain write is on the board


def test_an_htmx_request_for_a_region_a_page_does_not_have_gets_the_whole_page(
    signed_in: SignIn, world: World
) -> None:
    response = signed_in("viewer").get("/", headers={"HX-Request": "true", "HX-Target": "main"})

    assert "<html" in _html(response)


def test_a_running_task_page_polls_for_rows_after_its_last_one(
    signed_in: SignIn, world: World
) -> None:
    task = _run(world.queued)
    _add_events(task, 3)

    html = _html(signed_in("viewer").get(f"/tasks/{task.id}/"))

    assert _rows(html) == [1, 2, 3]
    assert f'hx-get="/tasks/{task.id}/live?after=3" {POLLER}' in html


def test_the_live_view_returns_only_the_rows_after_the_last_one_seen_and_keeps_polling(
    signed_in: SignIn, world: World
) -> None:
    task = _run(world.queued)
    _add_events(task, 5)

    response = signed_in("viewer").get(f"/tasks/{task.id}/live?after=3")

    assert response.status_code == 200
    html = _html(response)
    assert "<html" not in html
    assert _rows(html) == [4, 5]
    assert f'hx-get="/tasks/{task.id}/live?after=5" {POLLER}' in html


def test_the_live_view_with_nothing_new_returns_no_rows_and_keeps_polling(
    signed_in: SignIn, world: World
) -> None:
    task = _run(world.queued)
    _add_events(task, 2)

    html = _html(signed_in("viewer").get(f"/tasks/{task.id}/live?after=2"))

    assert _rows(html) == []
    assert f'hx-get="/tasks/{task.id}/live?after=2" {POLLER}' in html


def test_the_live_view_reloads_the_whole_page_once_the_task_stops(
    signed_in: SignIn, world: World
) -> None:
    # The stop report, phases and audit trail appear only on the whole page: when the
    # task stops, the live view asks htmx for one reload, and that page has no poller.
    task = _run(world.queued)
    _add_events(task, 2)
    _finish(task, "PARTIAL", "no_progress")

    response = signed_in("viewer").get(f"/tasks/{task.id}/live?after=2")

    assert response.status_code == 200
    assert response["HX-Refresh"] == "true"
    assert POLLER not in _html(response)
    page = _html(signed_in("viewer").get(f"/tasks/{task.id}/"))
    assert "PARTIAL" in page and "no_progress" in page
    assert POLLER not in page


def test_the_live_view_of_a_task_that_is_gone_stops_polling(signed_in: SignIn) -> None:
    response = signed_in("viewer").get("/tasks/987654/live?after=1")

    assert response.status_code == STOP_POLLING


def test_a_finished_task_page_does_not_poll(signed_in: SignIn, world: World) -> None:
    html = _html(signed_in("viewer").get(f"/tasks/{world.stopped.id}/"))

    assert POLLER not in html
    assert "/live?" not in html


# -- audit exports -------------------------------------------------------------------------


@pytest.fixture
def history(signed_in: SignIn, world: World) -> World:
    """A few human actions: a start, a stop with a formula for a reason, a settlement."""
    signed_in("operator").post("/tasks/new", START_FORM)
    signed_in("operator").post(
        f"/tasks/{world.queued.id}/stop", {"reason": '=HYPERLINK("http://evil.example")'}
    )
    signed_in("reconciler").post(f"/operations/{KEY}/resolve", _resolve_form(world.op))
    return world


def test_the_csv_export_holds_the_filtered_entries_and_defuses_formulas(
    signed_in: SignIn, history: World
) -> None:
    response = signed_in("viewer").get("/audit.csv?action=stop")

    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/csv")
    assert "attachment" in response["Content-Disposition"]
    rows = list(csv.DictReader(io.StringIO(_streamed(response))))
    assert len(rows) == 1
    row = rows[0]
    assert (row["actor"], row["action"], row["task"]) == (
        "operator",
        "stop",
        str(history.queued.id),
    )
    assert row["reason"] == """'=HYPERLINK("http://evil.example")"""
    assert json.loads(row["before"]) == {"state": "QUEUED", "stop_requested": False}
    assert json.loads(row["after"]) == {"state": "CANCELLED", "stop_requested": True}


def test_the_json_export_holds_the_filtered_entries_as_they_were_written(
    signed_in: SignIn, history: World
) -> None:
    response = signed_in("viewer").get("/audit.json?actor=reconciler")

    assert response.status_code == 200
    entries = json.loads(_streamed(response))
    assert [
        (e["actor"], e["action"], e["operation"], e["reason"], e["before"], e["after"])
        for e in entries
    ] == [
        (
            "reconciler",
            "mark_not_committed",
            KEY,
            "no notice with this key in the desk",
            {"state": "UNKNOWN"},
            {"state": "NOT_COMMITTED"},
        )
    ]


def test_the_json_export_of_everything_lists_every_action_newest_first(
    signed_in: SignIn, history: World
) -> None:
    entries = json.loads(_streamed(signed_in("viewer").get("/audit.json")))

    assert [e["action"] for e in entries] == ["mark_not_committed", "stop", "start"]
    assert entries[1]["reason"] == '=HYPERLINK("http://evil.example")'  # JSON is not a sheet


def test_the_audit_page_links_exports_that_keep_its_filters(
    signed_in: SignIn, history: World
) -> None:
    html = _html(signed_in("viewer").get("/audit/?action=stop&page=1"))

    assert 'href="/audit.csv?action=stop"' in html
    assert 'href="/audit.json?action=stop"' in html


@pytest.mark.parametrize("fmt", ["xml", "html", "csv.exe"])
def test_an_audit_export_in_another_format_is_not_found(signed_in: SignIn, fmt: str) -> None:
    assert signed_in("viewer").get(f"/audit.{fmt}").status_code == 404


# -- query counts --------------------------------------------------------------------------


def _queries(client: Client, url: str) -> int:
    with CaptureQueriesContext(connection) as context:
        response = client.get(url)
        assert response.status_code == 200
    return len(context.captured_queries)


def test_the_task_list_costs_as_many_queries_for_60_tasks_as_for_5(
    signed_in: SignIn, start: Start, django_assert_max_num_queries: Any
) -> None:
    client = signed_in("viewer")
    for n in range(5):
        _finish(start("test_reader", {"pages": n}), "CANCELLED", "operator_stop")
    few = _queries(client, "/tasks/")

    for n in range(5, 60):
        start("test_reader", {"pages": n})
    many = _queries(client, "/tasks/")

    assert many == few
    with django_assert_max_num_queries(few):
        html = _html(client.get("/tasks/"))
    assert "60 tasks" in html
    assert html.count('<td><a href="/tasks/') == 50  # one page


def test_the_task_page_costs_as_many_queries_for_300_trace_events_as_for_5(
    signed_in: SignIn, world: World
) -> None:
    client = signed_in("viewer")
    task = world.queued
    signed_in("operator").post(f"/tasks/{task.id}/stop", {"reason": "r"})
    _add_events(task, 5)
    few = _queries(client, f"/tasks/{task.id}/")

    _add_events(task, 295)
    many = _queries(client, f"/tasks/{task.id}/")

    assert many == few
    html = _html(client.get(f"/tasks/{task.id}/"))
    assert len(_rows(html)) == selectors.TRACE_WINDOW  # the latest window; older: a link away
    assert "Earlier events" in html


def test_the_reconciliation_queue_costs_as_many_queries_for_12_writes_as_for_2(
    signed_in: SignIn, start: Start
) -> None:
    client = signed_in("reconciler")
    for n in range(2):
        _unknown_operation(start("test_notices", {"count": 1, "n": n}), f"notice-{n}")
    few = _queries(client, "/operations/")

    for n in range(2, 12):
        _unknown_operation(start("test_notices", {"count": 1, "n": n}), f"notice-{n}")
    many = _queries(client, "/operations/")

    assert many == few


def test_the_audit_log_and_dashboard_cost_the_same_queries_for_150_entries_as_for_5(
    signed_in: SignIn, world: World, people: dict[str, User]
) -> None:
    client = signed_in("viewer")

    def add(count: int) -> None:
        AuditEntry.objects.bulk_create(
            AuditEntry(actor=people["operator"], action="stop", task=world.queued, reason="r")
            for _ in range(count)
        )

    add(5)
    few = (_queries(client, "/audit/"), _queries(client, "/"))
    add(145)
    many = (_queries(client, "/audit/"), _queries(client, "/"))

    assert many == few


# -- secrets -------------------------------------------------------------------------------


def _shows_secret(text: str) -> bool:
    return "hunter2" in text or re.search(r"\babc\b", text) is not None


def test_a_password_and_token_typed_into_the_start_form_never_show_in_the_console(
    signed_in: SignIn,
) -> None:
    operator = signed_in("operator")
    started = operator.post(
        "/tasks/new",
        {**START_FORM, "input": '{"pages": 1, "password": "hunter2", "token": "abc"}'},
        follow=True,
    )
    task = Task.objects.get()
    operator.post(f"/tasks/{task.id}/stop", {"reason": "done looking"})

    assert started.status_code == 200
    assert not _shows_secret(_html(started))
    assert "[redacted]" in _html(started)
    viewer = signed_in("viewer")
    for url in (f"/tasks/{task.id}/", f"/tasks/{task.id}/report.json", "/tasks/", "/", "/audit/"):
        assert not _shows_secret(_html(viewer.get(url))), url
    for url in ("/audit.csv", "/audit.json"):
        assert not _shows_secret(_streamed(viewer.get(url))), url
    assert task.input == {"pages": 1, "password": "[redacted]", "token": "[redacted]"}


def test_a_secret_in_what_a_lookup_finds_is_neither_shown_nor_written_to_the_audit_log(
    signed_in: SignIn, start: Start, settings: Any
) -> None:
    settings.LOOPGUARD_AGENTS = {
        **settings.LOOPGUARD_AGENTS,
        "test_receipts": f"{__name__}.ReceiptDesk",
    }
    _unknown_operation(start("test_receipts", {}), "receipts/17")

    found = _html(signed_in("reconciler").post("/operations/receipts/17/lookup"))

    assert "It happened." in found
    assert "R-17" in found
    assert "hunter2" not in found
    assert "hunter2" not in json.dumps(AuditEntry.objects.get(action="lookup").after)
    assert "hunter2" not in _html(signed_in("viewer").get("/audit/"))


def test_a_secret_inside_a_resolve_result_is_redacted_before_it_is_stored(
    signed_in: SignIn, world: World
) -> None:
    form = _resolve_form(world.op, "committed", result='{"notice": 1, "api_key": "hunter2"}')

    signed_in("reconciler").post(f"/operations/{KEY}/resolve", form)

    world.reload()
    assert world.op.result["data"] == {"notice": 1, "api_key": "[redacted]"}
    assert not _shows_secret(_html(signed_in("viewer").get(f"/tasks/{world.uncertain.id}/")))
