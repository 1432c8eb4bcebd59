"""An action someone else already took, or one the state no longer allows, is told plainly
and happens once; what does not exist is not found."""

from __future__ import annotations

import pytest

from console.drivers.ledger import DatabaseLedger
from console.models import AuditEntry, Operation, OperationState, Phase, Task

from .support import (
    KEY,
    STOP_POLLING,
    SignIn,
    Start,
    World,
    audit_count,
    body,
    finish,
    resolve_form,
    running,
)

pytestmark = pytest.mark.django_db


def test_stopping_a_task_that_has_already_stopped_says_so_and_stops_it_once(
    signed_in: SignIn, world: World
) -> None:
    client = signed_in("operator")
    url = f"/tasks/{world.queued.id}/stop"
    client.post(url, {"reason": "first"})

    again = client.post(url, {"reason": "second, from a stale tab"}, follow=True)

    assert again.status_code == 200
    assert f"task {world.queued.id} has already stopped (CANCELLED)" in body(again)
    assert AuditEntry.objects.filter(action="stop").count() == 1
    world.reload()
    assert world.queued.stop_note == "first"
    page = body(client.get(url))
    assert "This task has already stopped" in page
    assert "Stop the task" not in page


def test_stopping_a_running_task_twice_says_it_is_already_stopping(
    signed_in: SignIn, world: World
) -> None:
    task = running(world.queued)
    client = signed_in("operator")
    first = client.post(f"/tasks/{task.id}/stop", {"reason": "runaway"}, follow=True)

    again = client.post(f"/tasks/{task.id}/stop", {"reason": "still?"}, follow=True)

    assert f"Stop recorded: task {task.id} ends before its next step." in body(first)
    assert f"task {task.id} is already stopping" in body(again)
    assert AuditEntry.objects.filter(action="stop").count() == 1
    task.refresh_from_db()
    assert (task.state, task.stop_note) == ("RUNNING", "runaway")
    # The task page no longer offers a second stop; it shows the one recorded.
    page = body(client.get(f"/tasks/{task.id}/"))
    assert f"/tasks/{task.id}/stop" not in page
    assert "stop requested" in page


def test_resolving_an_operation_someone_already_resolved_says_so_and_keeps_their_verdict(
    signed_in: SignIn, world: World
) -> None:
    signed_in("reconciler").post(f"/operations/{KEY}/resolve", resolve_form(world.op))

    stale = signed_in("admin").post(
        f"/operations/{KEY}/resolve", resolve_form(world.op, "committed"), follow=True
    )

    assert stale.status_code == 200
    assert f"{KEY} is already NOT_COMMITTED" in body(stale)
    world.reload()
    assert world.op.state == OperationState.NOT_COMMITTED
    assert AuditEntry.objects.filter(operation=world.op).count() == 1
    assert KEY not in body(signed_in("admin").get("/operations/"))  # it left the queue


def test_approving_a_running_task_is_refused_with_a_message(
    signed_in: SignIn, world: World
) -> None:
    task = running(world.queued)
    client = signed_in("approver")

    page = client.get(f"/tasks/{task.id}/resume")
    response = client.post(f"/tasks/{task.id}/resume", {"reason": "go on"}, follow=True)

    assert "This task is RUNNING: there is nothing to resume." in body(page)
    assert "Approve resumption</button>" not in body(page)
    assert f"task {task.id} is RUNNING, not stopped" in body(response)
    task.refresh_from_db()
    assert (task.state, task.phase) == ("RUNNING", 1)
    assert audit_count() == 0


def test_approving_a_task_with_an_uncertain_write_shows_the_refusal_and_its_keys(
    signed_in: SignIn, world: World
) -> None:
    client = signed_in("approver")
    url = f"/tasks/{world.uncertain.id}/resume"

    page = client.get(url)
    posted = client.post(url, {"reason": "surely it is fine"})

    for response in (page, posted):
        assert response.status_code == 200
        html = body(response)
        assert "Resumption is refused while these writes may or may not have happened" in html
        assert KEY in html
        assert "Approve resumption</button>" not in html
    world.reload()
    assert (world.uncertain.state, world.uncertain.phase) == ("NEEDS_HUMAN", 1)
    assert audit_count() == 0


def test_approving_the_same_task_twice_opens_one_new_phase(signed_in: SignIn, world: World) -> None:
    url = f"/tasks/{world.stopped.id}/resume"
    signed_in("approver").post(url, {"reason": "first"})

    again = signed_in("admin").post(url, {"reason": "second"}, follow=True)

    assert f"task {world.stopped.id} is QUEUED, not stopped" in body(again)
    assert Phase.objects.filter(task=world.stopped).count() == 2
    assert AuditEntry.objects.filter(action="approve_resumption").count() == 1


def test_approving_a_completed_task_says_there_is_nothing_to_resume(
    signed_in: SignIn, start: Start
) -> None:
    task = finish(start("test_reader", {"pages": 1}), "COMPLETED", "goal_met")
    client = signed_in("approver")

    task_page = body(client.get(f"/tasks/{task.id}/"))
    page = body(client.get(f"/tasks/{task.id}/resume"))
    response = client.post(f"/tasks/{task.id}/resume", {"reason": "again"}, follow=True)

    assert f"/tasks/{task.id}/resume" not in task_page
    assert "This task is COMPLETED: there is nothing to resume." in page
    assert f"task {task.id} is completed: there is nothing to resume" in body(response)
    assert audit_count() == 0


def test_a_task_held_for_a_restart_loop_can_be_cancelled_from_its_page(
    signed_in: SignIn, start: Start
) -> None:
    for _ in range(3):
        start("test_reader", {"pages": 1})
    held = start("test_reader", {"pages": 1})
    assert (held.state, held.reason) == ("NEEDS_HUMAN", "restart_loop")
    client = signed_in("operator")

    page = body(client.get(f"/tasks/{held.id}/"))
    response = client.post(
        f"/tasks/{held.id}/stop", {"reason": "the trigger is broken"}, follow=True
    )

    assert f'href="/tasks/{held.id}/stop">Cancel…' in page
    held.refresh_from_db()
    assert (held.state, held.reason) == ("CANCELLED", "operator_stop")
    assert f"Task {held.id} cancelled." in body(response)  # the page said cancel, too
    assert AuditEntry.objects.filter(action="stop").count() == 1


def test_a_write_still_being_executed_cannot_be_settled_and_the_person_is_told_why(
    signed_in: SignIn, start: Start
) -> None:
    task = running(start("test_notices", {"count": 1}))
    DatabaseLedger(task_id=task.id, owner="worker:1").claim("orders/7/refund", "b" * 64)
    op = Operation.objects.get(key="orders/7/refund")
    client = signed_in("reconciler")

    queue = body(client.get("/operations/"))
    response = client.post("/operations/orders/7/refund/resolve", resolve_form(op), follow=True)

    assert "orders/7/refund" not in queue  # its worker is alive and holds the task
    assert "orders/7/refund is being executed right now; wait for it to finish" in body(response)
    op.refresh_from_db()
    assert op.state == OperationState.IN_FLIGHT
    assert audit_count() == 0


def test_a_task_that_ran_out_of_budget_resumes_only_with_an_explicit_grant(
    signed_in: SignIn, start: Start
) -> None:
    task = start("test_reader", {"pages": 5}, model_calls=4)
    Task.objects.filter(id=task.id).update(model_calls=4, requests=4, executions=4)
    task = finish(task, "PARTIAL", "model_budget")
    client = signed_in("approver")
    url = f"/tasks/{task.id}/resume"

    page = body(client.get(url))
    refused = client.post(url, {"reason": "one more go"})
    granted = client.post(url, {"reason": "one more go", "grant_model_calls": "6"})

    assert "This task ran out of model calls." in page
    assert refused.status_code == 200
    assert "the task ran out of model calls: grant an explicit amount to resume" in body(refused)
    assert granted.status_code == 302
    task.refresh_from_db()
    assert (task.state, task.phase) == ("QUEUED", 2)
    assert task.limits["model_calls"] == 10
    assert task.model_calls == 4  # what was spent carries over
    assert AuditEntry.objects.filter(action="approve_resumption").count() == 1


def test_a_grant_that_is_not_a_whole_positive_number_is_a_form_error(
    signed_in: SignIn, start: Start
) -> None:
    task = finish(start("test_reader", {"pages": 5}), "PARTIAL", "model_budget")

    response = signed_in("approver").post(
        f"/tasks/{task.id}/resume", {"reason": "more", "grant_model_calls": "-3"}
    )

    assert response.status_code == 200
    assert "Ensure this value is greater than or equal to 0." in body(response)
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
    assert audit_count() == 0


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
    assert audit_count() == 0


def test_a_page_or_action_that_does_not_accept_the_method_says_so(
    signed_in: SignIn, world: World
) -> None:
    client = signed_in("admin")

    assert client.get(f"/operations/{KEY}/resolve").status_code == 405
    assert client.post("/tasks/").status_code == 405
    assert audit_count() == 0
