"""Real Celery workers drive tasks, die mid-step, get duplicate messages and are stopped.

Each test starts a worker process group (prefork pool with two children, plus embedded
beat for the recovery sweep) on a queue of its own, talking to the real Redis and to this
test's PostgreSQL database, and asserts what an operator would see afterwards. A worker is
"crashed" with SIGKILL to its whole process group: no clean-up code runs, exactly as when a
machine dies.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth.models import User

from console import services
from console.demo.models import Notice
from console.models import (
    Decision,
    EventKind,
    Operation,
    OperationEvent,
    StopReport,
    Task,
    TaskState,
    TraceEvent,
)
from console.records.roles import Role, assign
from console.tasks import run_task
from tests import workers
from tests.workers import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


class Worker:
    """A Celery worker process group on its own queue; can be crashed and started again."""

    def __init__(self, queue: str, directory: Path) -> None:
        self.queue = queue
        self.directory = directory
        self.started: list[workers.Worker] = []
        self.running: workers.Worker | None = None

    def start(self) -> None:
        """Start a fresh worker (with beat) and return once it consumes the queue."""
        assert self.running is None, "a worker is already running"
        self.running = workers.start_worker(self.queue, self.directory)
        self.started.append(self.running)

    def kill(self) -> None:
        """SIGKILL the whole worker process group: pool children and beat die mid-step."""
        if self.running is not None:
            workers.kill_worker(self.running)
            self.running = None

    def restart(self) -> None:
        """Crash this worker and start a fresh one on the same queue."""
        self.kill()
        self.start()

    def enqueue(self, task_id: int) -> None:
        """Send a ``run_task`` message to this worker's queue (what ``delay`` does there)."""
        run_task.apply_async((task_id,), queue=self.queue)

    def log(self) -> str:
        """Everything every worker started by this fixture has logged so far."""
        return "".join(started.log() for started in self.started)


@pytest.fixture
def worker(transactional_db: None, tmp_path: Path) -> Iterator[Worker]:
    """A running worker; killed before the test database is emptied."""
    running = Worker(f"loopguard-test-{uuid.uuid4().hex[:12]}", tmp_path)
    running.start()
    try:
        yield running
    finally:
        # A kill, not a warm shutdown: the test is over, and the messages it leaves
        # unacknowledged are forgotten with the queue.
        running.kill()
        workers.forget_queue(running.queue)


def story(worker: Worker, task: Task) -> Callable[[], str]:
    """What a failed wait shows: the task row, its trace and the end of the worker logs."""

    def tell() -> str:
        row = (
            Task.objects.filter(id=task.id)
            .values(
                "state",
                "reason",
                "lease_owner",
                "lease_expires_at",
                "recoveries",
                "executions",
                "detail",
            )
            .first()
        )
        trace = list(
            TraceEvent.objects.filter(task_id=task.id)
            .order_by("seq")
            .values_list("seq", "kind", "decision", "reason", "tool")
        )
        return f"task: {row}\ntrace: {trace}\nworker logs (end):\n{worker.log()[-6000:]}"

    return tell


def start_on(worker: Worker, agent: str, input: dict[str, Any], **limits: Any) -> Task:
    """Start a task whose first message goes to ``worker``'s queue."""
    return services.task_start(agent=agent, input=input, limits=limits, enqueue=worker.enqueue)


def current(task: Task) -> Task:
    return Task.objects.get(id=task.id)


def finished(task: Task) -> Task | None:
    """The task once it has stopped (any terminal state), else None."""
    return (
        Task.objects.exclude(state__in=[TaskState.QUEUED, TaskState.RUNNING])
        .filter(id=task.id)
        .first()
    )


def reads(task: Task) -> list[str]:
    """The arguments of the reads the task executed, in trace order."""
    return list(
        TraceEvent.objects.filter(task=task, kind=EventKind.REQUEST, decision=Decision.EXECUTED)
        .order_by("seq")
        .values_list("args_preview", flat=True)
    )


def pages(n: int) -> list[str]:
    return [f'{{"page": {page}}}' for page in range(1, n + 1)]


def recovery_timeout() -> float:
    """Lease expiry plus a few sweeps, plus room for a fresh worker to start."""
    return settings.LOOPGUARD_LEASE_SECONDS + 3 * settings.LOOPGUARD_SWEEP_SECONDS + 10


# -- configuration ---------------------------------------------------------------------------


def test_the_beat_sweeps_as_often_as_the_test_settings_say() -> None:
    # Without this, a crashed driver waits for console.project.settings' default sweep period.
    schedule = settings.CELERY_BEAT_SCHEDULE["recover-expired-leases"]["schedule"]

    assert schedule == settings.LOOPGUARD_SWEEP_SECONDS


# -- a worker dies -----------------------------------------------------------------------------


def test_a_worker_killed_inside_a_write_leaves_it_unknown_and_never_runs_it_again(
    worker: Worker,
) -> None:
    # auto_lookup off: the person's path (the lookup's is tests/console/test_recovery_lookup.py).
    task = start_on(
        worker,
        "test_notices",
        {"count": 1, "sleep_ms": 3000, "prefix": "crash", "auto_lookup": False},
    )
    key = f"crash-{task.id}-notice-1"
    # The notice is committed and the tool is asleep before returning: the response is lost.
    wait_for(
        lambda: (
            Operation.objects.filter(key=key, state="IN_FLIGHT").exists()
            and Notice.objects.filter(idempotency_key=key).exists()
        ),
        timeout=20,
        what="the notice to be sent while its operation is in flight",
    )

    worker.restart()
    stopped = wait_for(
        lambda: finished(task),
        timeout=recovery_timeout(),
        what="recovery",
        explain=story(worker, task),
    )

    assert (stopped.state, stopped.reason) == ("NEEDS_HUMAN", "unknown_commit")
    assert key in stopped.detail
    assert (stopped.executions, stopped.recoveries) == (1, 1)
    operation = Operation.objects.get(key=key)
    assert (operation.state, operation.attempts, operation.task_id) == ("UNKNOWN", 1, task.id)
    assert list(
        OperationEvent.objects.filter(operation=operation)
        .order_by("id")
        .values_list("from_state", "to_state", "evidence")
    ) == [("", "IN_FLIGHT", ""), ("IN_FLIGHT", "UNKNOWN", "recovery: lease expired")]
    assert Notice.objects.filter(idempotency_key=key).count() == 1
    assert Notice.objects.count() == 1
    report = StopReport.objects.get(task=task)
    assert (report.state, report.reason) == ("NEEDS_HUMAN", "unknown_commit")
    assert report.report["operation_key"] == key
    assert report.report["operation_state"] == "UNKNOWN"
    # The write never went through the executor again, in the trace either.
    assert not TraceEvent.objects.filter(
        task=task, kind=EventKind.REQUEST, decision=Decision.EXECUTED
    ).exists()


def test_a_worker_killed_inside_a_read_is_resumed_from_its_checkpoint_with_its_counters(
    worker: Worker,
) -> None:
    total = 4
    task = start_on(worker, "test_reader", {"pages": total, "sleep_ms": 800})
    # The second model call's event is saved just before its read runs (for 800 ms).
    wait_for(
        lambda: TraceEvent.objects.filter(task_id=task.id, kind=EventKind.MODEL_CALL).count() == 2,
        timeout=20,
        what="the second read to start",
        explain=story(worker, task),
    )

    worker.kill()
    at_kill = current(task)
    read_at_kill = at_kill.checkpoint["agent"]["read"]
    worker.start()
    done = wait_for(
        lambda: finished(task),
        timeout=recovery_timeout() + 5,
        what="completion",
        explain=story(worker, task),
    )

    assert read_at_kill == 1, "the kill was meant to land inside the second read"
    assert (done.state, done.reason, done.revision) == ("COMPLETED", "goal_met", total)
    assert done.recoveries == 1
    # Page 2 is read again after the crash; everything spent before it still counts.
    left = total - read_at_kill
    assert done.executions == at_kill.executions + left
    assert done.requests == at_kill.requests + left
    assert done.model_calls == at_kill.model_calls + left
    assert done.tokens == at_kill.tokens + 10 * left
    assert done.elapsed_ms >= at_kill.elapsed_ms
    # Resumed from the checkpoint: page 1 was not read again.
    assert reads(task) == pages(total)


# -- the same task delivered more than once -----------------------------------------------------


def test_a_redelivered_message_and_a_duplicate_enqueue_do_not_start_a_second_driver(
    worker: Worker,
) -> None:
    total = 4
    sent: list[str] = []

    def enqueue(task_id: int) -> None:
        sent.append(str(run_task.apply_async((task_id,), queue=worker.queue).id))

    task = services.task_start(
        agent="test_reader", input={"pages": total, "sleep_ms": 500}, enqueue=enqueue
    )
    wait_for(lambda: current(task).executions >= 1, timeout=20, what="the first read")
    # The broker handing the same message out again, and a second enqueue of the task.
    run_task.apply_async((task.id,), queue=worker.queue, task_id=sent[0])
    run_task.apply_async((task.id,), queue=worker.queue)

    done = wait_for(
        lambda: finished(task), timeout=20, what="completion", explain=story(worker, task)
    )
    runs = re.compile(r"console\.tasks\.run_task\[\S+\] succeeded")

    def handled_all_three() -> str | None:
        log = worker.log()
        return log if len(runs.findall(log)) >= 3 else None

    log = wait_for(handled_all_three, timeout=10, what="all three deliveries to be handled")

    assert (done.state, done.reason) == ("COMPLETED", "goal_met")
    assert (done.executions, done.requests, done.model_calls) == (total, total, total)
    assert done.recoveries == 0
    assert reads(task) == pages(total)
    assert len(runs.findall(log)) == 3
    refused = r"(?:another driver holds the lease|nothing to do: the task is)"
    refusals = re.findall(rf"task {task.id}: {refused}", log)
    assert len(refusals) == 2, log
    assert StopReport.objects.filter(task=task).count() == 1


# -- an operator stops a waiting task ---------------------------------------------------------


def test_a_stop_during_a_long_wait_cancels_the_task_within_a_second(worker: Worker) -> None:
    operator = User.objects.create_user("olivia", password="correct horse")
    assign(operator, [Role.OPERATOR])
    task = start_on(worker, "test_waiter", {"wait_ms": 10_000}, deadline_ms=600_000)
    # Stopped once it waits (its WAIT event is saved): between the poll's save, which counts
    # the next execution ahead, and the wait's, which counts it back, it is not waiting yet.
    wait_for(
        lambda: TraceEvent.objects.filter(task=task, kind=EventKind.WAIT).exists(),
        timeout=20,
        what="the task to wait after the first poll of the job",
    )

    asked = time.monotonic()
    stopping = services.task_stop(task_id=task.id, actor=operator, reason="customer cancelled")
    stopped = wait_for(
        lambda: Task.objects.filter(id=task.id, state=TaskState.CANCELLED).first(),
        timeout=5,
        what="the task to be cancelled",
    )
    took = time.monotonic() - asked

    assert took < 1.0, f"the stop took {took:.2f} s to land"
    assert stopped.reason == "operator_stop"
    assert stopped.executions == stopping.executions == 1
    assert not TraceEvent.objects.filter(
        task=task, kind=EventKind.REQUEST, at__gt=stopping.stop_requested_at
    ).exists()
    report = StopReport.objects.get(task=task)
    assert (report.state, report.reason) == ("CANCELLED", "operator_stop")


# -- approval and spend on a worker ------------------------------------------------------------


def test_a_refund_over_the_limit_waits_for_approval_then_runs_once_on_a_worker(
    worker: Worker, django_user_model: type[User]
) -> None:
    from console.demo.desk import seed_demo_data
    from console.demo.models import Refund
    from console.models import Approval

    seed_demo_data()
    approver = django_user_model.objects.create_user("ada")
    assign(approver, [Role.APPROVER])
    from tests.console.held import REFUND

    task = start_on(worker, "support_desk", REFUND)
    held = wait_for(lambda: finished(task), timeout=20, what="the stop for approval")
    assert (held.state, held.reason) == (TaskState.NEEDS_HUMAN, "approval_required")
    assert Refund.objects.count() == 0

    approval = Approval.objects.get(task=task)
    services.approval_approve(
        approval_id=approval.id, actor=approver, reason="checked", enqueue=worker.enqueue
    )
    done = wait_for(
        lambda: finished(task), timeout=20, what="completion", explain=story(worker, task)
    )

    assert (done.state, done.reason) == (TaskState.COMPLETED, "goal_met")
    assert Refund.objects.filter(order__number=42).count() == 1
    assert done.phase == 2


def test_spend_runs_out_on_a_worker_with_the_right_amount_left(worker: Worker) -> None:
    from console.demo.desk import seed_demo_data

    seed_demo_data()
    task = start_on(worker, "paid_reader", {"pages": 10})

    done = wait_for(lambda: finished(task), timeout=20, what="the spend stop")

    assert (done.state, done.reason) == (TaskState.PARTIAL, "spend_budget")
    report = StopReport.objects.get(task=task).report
    assert report["remaining_budget"]["spend"] == 20_000 - 4 * 3_600
