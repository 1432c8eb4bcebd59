"""Act on many tasks at once from the task list: one reason, an audit entry per task, and a
word for each task that could not be changed."""

from __future__ import annotations

import pytest

from console import services
from console.models import AuditAction, AuditEntry, Task, TaskState

from .support import SignIn, Start, body, finish, unknown_operation

pytestmark = pytest.mark.django_db


def _held(start: Start, n: int) -> list[Task]:
    """``n`` tasks held before they ran (a restart loop), as an operator finds them."""
    return [
        finish(start("test_reader", {"pages": 1, "n": i}), "NEEDS_HUMAN", "restart_loop")
        for i in range(n)
    ]


def test_stopping_the_ticked_tasks_cancels_each_with_its_own_audit_entry(
    signed_in: SignIn, start: Start
) -> None:
    held = _held(start, 3)
    ticked = [held[0].id, held[2].id]

    answer = signed_in("operator").post(
        "/tasks/bulk",
        {"action": "stop", "scope": "selected", "reason": "a loop upstream", "task": ticked},
        follow=True,
    )

    assert f"Stopped 2 tasks: #{ticked[0]}, #{ticked[1]}." in body(answer)
    states = dict(Task.objects.values_list("id", "state"))
    assert [states[t.id] for t in held] == ["CANCELLED", "NEEDS_HUMAN", "CANCELLED"]
    entries = AuditEntry.objects.filter(action=AuditAction.STOP)
    assert sorted(entries.values_list("task_id", flat=True)) == sorted(ticked)
    assert set(entries.values_list("reason", flat=True)) == {"a loop upstream"}


def test_every_task_the_filters_match_and_why_some_could_not_be_changed(
    signed_in: SignIn, start: Start
) -> None:
    held = _held(start, 3)
    done = finish(start("test_reader", {"pages": 2}), "COMPLETED", "goal_met")
    query = "state=NEEDS_HUMAN"

    answer = signed_in("operator").post(
        "/tasks/bulk",
        {"action": "stop", "scope": "matching", "reason": "clear them", "query": query},
        follow=True,
    )

    html = body(answer)
    assert "Stopped 3 tasks: #" in html
    assert answer.redirect_chain[-1][0] == "/tasks/?state=NEEDS_HUMAN"  # the same list
    assert all(t.state == "CANCELLED" for t in Task.objects.filter(id__in=[h.id for h in held]))
    assert Task.objects.get(id=done.id).state == TaskState.COMPLETED  # not matched: untouched

    again = body(
        signed_in("operator").post(
            "/tasks/bulk",
            {"action": "stop", "scope": "selected", "reason": "again", "task": [held[0].id]},
            follow=True,
        )
    )
    assert f"#{held[0].id} was not changed: task {held[0].id} has already stopped" in again


def test_bulk_approval_skips_a_task_with_an_uncertain_write(
    signed_in: SignIn, start: Start
) -> None:
    fine = finish(start("test_reader", {"pages": 2}), "PARTIAL", "no_progress")
    doubtful = start("test_notices", {"count": 1})
    unknown_operation(doubtful)
    ids = [fine.id, doubtful.id]

    html = body(
        signed_in("approver").post(
            "/tasks/bulk",
            {"action": "resume", "scope": "selected", "reason": "go on", "task": ids},
            follow=True,
        )
    )

    assert f"Approved the resumption of 1 task: #{fine.id}." in html
    assert f"#{doubtful.id} was not changed:" in html
    assert Task.objects.get(id=fine.id).state == TaskState.QUEUED
    assert Task.objects.get(id=doubtful.id).state == TaskState.NEEDS_HUMAN


@pytest.mark.parametrize(
    ("persona", "action"), [("viewer", "stop"), ("operator", "resume"), ("approver", "stop")]
)
def test_each_action_needs_its_own_role(
    signed_in: SignIn, start: Start, persona: str, action: str
) -> None:
    (task,) = _held(start, 1)

    answer = signed_in(persona).post(
        "/tasks/bulk", {"action": action, "scope": "selected", "reason": "r", "task": [task.id]}
    )

    assert answer.status_code == 403
    assert Task.objects.get(id=task.id).state == TaskState.NEEDS_HUMAN
    assert not AuditEntry.objects.exists()


def test_a_bulk_action_without_a_reason_or_a_task_changes_nothing(
    signed_in: SignIn, start: Start
) -> None:
    (task,) = _held(start, 1)
    client = signed_in("operator")

    no_reason = body(
        client.post(
            "/tasks/bulk",
            {"action": "stop", "scope": "selected", "reason": "", "task": [task.id]},
            follow=True,
        )
    )
    no_task = body(
        client.post(
            "/tasks/bulk", {"action": "stop", "scope": "selected", "reason": "r"}, follow=True
        )
    )

    assert "Nothing was changed" in no_reason
    assert "no task was chosen" in no_task
    assert Task.objects.get(id=task.id).state == TaskState.NEEDS_HUMAN
    assert not AuditEntry.objects.exists()


def test_the_list_offers_the_bulk_form_and_a_box_per_task(signed_in: SignIn, start: Start) -> None:
    (task,) = _held(start, 1)

    operator = body(signed_in("operator").get("/tasks/"))
    viewer = body(signed_in("viewer").get("/tasks/"))

    assert 'id="bulk"' in operator
    assert f'name="task" value="{task.id}" form="bulk"' in operator
    assert 'id="bulk"' not in viewer and 'name="task"' not in viewer


def test_at_most_the_limit_is_changed_at_once(start: Start, people: dict[str, object]) -> None:
    outcome = services.tasks_stop(
        task_ids=[987_000 + i for i in range(services.BULK_LIMIT + 5)],
        actor=people["operator"],  # type: ignore[arg-type]
        reason="r",
    )

    assert outcome.changed == []
    assert len(outcome.refused) == services.BULK_LIMIT  # unknown tasks, each named
    assert outcome.left == 5
