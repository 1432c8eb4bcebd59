"""What the console's page tests share: personas, a small world of tasks, and helpers that
put tasks and operations into the states the pages show, the way a driver would."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.db import transaction
from django.test import Client
from django.utils import timezone

from console import lifecycle
from console.models import AuditEntry, Operation, Task, TaskState, TraceEvent
from console.records.roles import Role
from tests.console import doubt

Start = Callable[..., Task]
SignIn = Callable[..., Client]

PERSONAS: dict[str, tuple[Role, ...]] = {
    "viewer": (Role.VIEWER,),
    "operator": (Role.OPERATOR,),
    "reconciler": (Role.RECONCILER,),
    "approver": (Role.APPROVER,),
    "agent": (Role.AGENT,),  # an attached agent's process: it may read, and drive its tasks
    "admin": (Role.ADMIN,),
    "nobody": (),  # signed in, but holds no role
}
READERS = ("viewer", "operator", "reconciler", "approver", "agent", "admin")
MAY = {
    "start": ("operator", "admin"),
    "stop": ("operator", "admin"),
    "reconcile": ("reconciler", "admin"),
    "approve": ("approver", "admin"),
    "drive": ("agent", "admin"),
}


def may_not(action: str) -> list[str]:
    return [name for name in PERSONAS if name not in MAY[action]]


KEY = "orders/42/first-notice"  # a slash, as real keys have: the URL must carry it intact
XSS = "<script>alert(1)</script>"
XSS_ESCAPED = "&lt;script&gt;alert(1)&lt;/script&gt;"
ATTRIBUTE_BREAKER = '" onmouseover="alert(2)'
POLLER = 'hx-trigger="every 1s"'
STOP_POLLING = 286  # htmx: "stop polling"


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


def finish(task: Task, state: str, reason: str, detail: str = "") -> Task:
    """End ``task`` the way its driver does: it runs, then stops in ``state`` with a stop
    report and a stop event."""
    running(task)
    with transaction.atomic():
        locked = Task.objects.select_for_update().get(id=task.id)
        report = lifecycle.report_from_task(locked, state, reason, detail).to_dict()
        lifecycle.finish_task(locked, state, reason, report, detail=detail)
    task.refresh_from_db()
    return task


def running(task: Task) -> Task:
    """A worker holds ``task`` now."""
    Task.objects.filter(id=task.id).update(
        state=TaskState.RUNNING,
        lease_owner="worker:1",
        lease_expires_at=timezone.now() + timedelta(minutes=5),
    )
    task.refresh_from_db()
    return task


def unknown_operation(task: Task, key: str = KEY, args: dict[str, Any] | None = None) -> Operation:
    """:func:`tests.console.doubt.unknown_operation`, under the pages' usual key."""
    return doubt.unknown_operation(task, key, args)


def add_events(task: Task, count: int, **fields: Any) -> None:
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


def trace_rows(html: str) -> list[int]:
    """The sequence numbers of the trace rows in ``html``."""
    return [int(n) for n in re.findall(r'<td class="num mono">(\d+)</td>', html)]


def csrf_token(html: str) -> str:
    found = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', html)
    assert found, "the page has no form with a CSRF token"
    return found.group(1)


def body(response: Any) -> str:
    return response.content.decode()


def poller(task_id: int, after: int) -> str:
    """The live view's poller as a page holds it, asking for the rows after ``after``."""
    return f'hx-get="/tasks/{task_id}/live?after={after}" {POLLER}'


def region(client: Client, url: str, target: str) -> Any:
    """What htmx gets when it asks ``url`` for the element ``target`` (its id)."""
    return client.get(url, headers={"HX-Request": "true", "HX-Target": target})


def streamed(response: Any) -> str:
    return b"".join(response.streaming_content).decode()


def audit_count() -> int:
    return AuditEntry.objects.count()


def pages_of(w: World) -> dict[str, str]:
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



START_FORM = {"agent": "test_reader", "input": '{"pages": 2}', "limits": "", "reason": "nightly"}


def resolve_form(op: Operation, decision: str = "not_committed", **extra: str) -> dict[str, str]:
    """The resolve form as the reconciliation queue renders it (prefixed per operation)."""
    prefix = f"op{op.id}"
    data = {
        "prefix": prefix,
        f"{prefix}-decision": decision,
        f"{prefix}-evidence": "no notice with this key in the desk",
    }
    data.update({f"{prefix}-{name}": value for name, value in extra.items()})
    return data
