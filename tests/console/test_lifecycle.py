"""The task state machine: every move from the state it starts from, or loudly not at all."""

from __future__ import annotations

import ast
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone

from console import lifecycle
from console.models import Phase, StopReport, Task, TaskState, TraceEvent
from guard import Reason, State

pytestmark = pytest.mark.django_db

Start = Callable[..., Task]
CONSOLE = Path(__file__).resolve().parents[2] / "console"


def _running(task: Task, owner: str = "driver-a") -> Task:
    with transaction.atomic():
        taken = lifecycle.start_drive(task.id, owner, lease_seconds=30)
    assert isinstance(taken, Task)
    return taken


def test_a_driver_that_lost_the_lease_cannot_record_its_stop(start: Start) -> None:
    task = _running(start("test_reader", {"pages": 2}))
    Task.objects.filter(id=task.id).update(lease_owner="driver-b")
    report = lifecycle.report_from_task(task, State.COMPLETED, Reason.GOAL_MET)

    with pytest.raises(lifecycle.LostRace, match="no longer driven by driver-a"):
        lifecycle.finish_drive(task.id, "driver-a", report)

    assert Task.objects.get(id=task.id).state == TaskState.RUNNING
    assert not StopReport.objects.filter(task=task).exists()
    assert not TraceEvent.objects.filter(task=task, kind="stop").exists()


def test_a_stop_requested_on_a_task_that_finished_meanwhile_is_refused(
    start: Start, operator: User
) -> None:
    seen = _running(start("test_reader", {"pages": 2}))
    report = lifecycle.report_from_task(seen, State.COMPLETED, Reason.GOAL_MET)
    lifecycle.finish_drive(seen.id, "driver-a", report)

    with pytest.raises(lifecycle.LostRace, match="no longer RUNNING"):
        lifecycle.request_stop(seen, actor=operator, note="too late")

    task = Task.objects.get(id=seen.id)
    assert (task.state, task.stop_requested_at) == (TaskState.COMPLETED, None)


def test_a_resumption_approved_twice_from_the_same_view_opens_one_phase(
    start: Start, operator: User
) -> None:
    task = start("test_reader", {"pages": 2})
    with transaction.atomic():
        lifecycle.cancel(task, actor=operator, note="wrong input")
    seen = Task.objects.get(id=task.id)
    lifecycle.resume(seen, actor=operator, note="fixed", grant={}, limits=seen.limits)

    with pytest.raises(lifecycle.LostRace):
        lifecycle.resume(seen, actor=operator, note="fixed", grant={}, limits=seen.limits)

    assert Phase.objects.filter(task=task).count() == 2
    assert Task.objects.get(id=task.id).state == TaskState.QUEUED


@pytest.mark.parametrize("state", [TaskState.QUEUED, TaskState.COMPLETED])
def test_a_move_from_a_state_the_table_does_not_allow_is_refused(start: Start, state: str) -> None:
    task = start("test_reader", {"pages": 2})
    Task.objects.filter(id=task.id).update(
        state=state, reason="" if state == TaskState.QUEUED else "goal_met"
    )
    task.refresh_from_db()

    with pytest.raises(lifecycle.LostRace, match="cannot requeue"):
        lifecycle.requeue(task)

    assert Task.objects.get(id=task.id).state == state


def test_a_lost_driver_is_recovered_before_a_new_one_takes_over(start: Start) -> None:
    task = _running(start("test_reader", {"pages": 2}), owner="gone")
    Task.objects.filter(id=task.id).update(lease_expires_at=timezone.now() - timedelta(seconds=1))

    taken = _running(task, owner="driver-b")

    assert (taken.state, taken.lease_owner, taken.recoveries) == (TaskState.RUNNING, "driver-b", 1)


def test_the_moves_start_from_the_states_the_product_promises() -> None:
    moves = lifecycle.TASK_MOVES
    assert moves["finish"][0] == {TaskState.RUNNING}
    assert TaskState.COMPLETED not in moves["resume"][0]  # completed is final
    assert moves["cancel"][1] == {TaskState.CANCELLED}


# -- who may import what ---------------------------------------------------------------------


def _imports(path: Path) -> set[str]:
    """The console modules ``path`` imports, as dotted names."""
    package = ".".join(path.relative_to(CONSOLE.parent).with_suffix("").parts[:-1])
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, *([base] if base else [])])
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return {name for name in names if name.startswith("console")}


def test_nothing_but_the_celery_tasks_imports_the_runner() -> None:
    importers = sorted(
        str(path.relative_to(CONSOLE.parent))
        for path in CONSOLE.rglob("*.py")
        if "console.runner" in _imports(path) and path.name != "runner.py"
    )

    assert importers == ["console/tasks.py"]


def test_the_step_stores_are_reached_only_through_their_interface() -> None:
    implementations = {"console.store.postgresql", "console.store.sqlite"}
    importers = sorted(
        str(path.relative_to(CONSOLE.parent))
        for path in CONSOLE.rglob("*.py")
        if implementations & _imports(path) and path.parent.name != "store"
    )

    assert importers == []
