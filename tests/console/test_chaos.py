"""Chaos: many tasks write through the ledger while their workers are killed, frozen and cut off.

Twenty-four support desk tasks (an order lookup, a refund, a notice to the customer) run
on three real Celery workers consuming one queue, with a beat of their own for the
recovery sweep. Meanwhile, at random: a worker's whole process group is SIGKILLed (and
started again a moment later), frozen with SIGSTOP for longer than its lease (then let go
with SIGCONT: a driver that wakes up after another took its task), or its PostgreSQL
connections are cut with ``pg_terminate_backend``. Eight orders get two tasks each, so
two drivers meet on the same operation keys.

Afterwards, with the sweep running until everything settles, what a reconciler would
check must hold: no business action happened twice, every operation the ledger calls
``COMMITTED`` is in the desk's tables and every one it calls ``NOT_COMMITTED`` is not, no
operation is left ``IN_FLIGHT``, and every task has stopped with a reason and a stop report.
And a person is asked last (invariant 14): a write a killed worker left behind goes to a
person only when its tool's lookup could not settle it. The figures (tasks, faults, writes
recovery lost, how many a lookup settled, how many tasks wait for a person) are printed,
and head every failure.

The desk's own idempotency keys would hide a second execution (the second refund with a
key returns the first), so the notice channel of this agent forgets them on purpose: each
real execution of ``notify_customer`` leaves a notice of its own, and two notices for one
operation key mean the guard let the write run twice.

The schedule (task inputs, which fault, when, to which worker) comes from one seed, printed
in every failure; ``CHAOS_SEED=<n>`` replays it (timing on a busy machine still varies).
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar

import pytest
from django.conf import settings
from django.db import connection
from pytest_django import Settings

from console import lifecycle, services
from console.agents import Tool
from console.demo import desk
from console.demo.models import Notice, Order, Refund
from console.demo.support_desk import SupportDesk
from console.demo.tools import Field, notice_data
from console.models import AuditEntry, Operation, OperationEvent, StopReport, Task, TaskState
from console.tasks import run_task
from guard import Call, Evidence, Kind, Result, Settlement
from tests import workers
from tests.databases import database_url
from tests.waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

SEED = int(os.environ.get("CHAOS_SEED", "") or 20261201)
WORKERS = 3
ORDERS = 16
SHARED = 8  # orders that get a second task with the same input
CHAOS_S = 40.0  # faults are injected for this long; tasks arrive during the first 30 s
ARRIVALS_S = 30.0
SETTLE_S = 60.0  # then everything must settle within this
FREEZE_S = (1.0, 3.0)  # frozen for the lease plus this much
RESTART_AFTER_S = (0.3, 2.0)
FAULT_EVERY_S = (0.8, 2.5)
AGENT = "chaos_desk"
AGENT_PATH = "tests.console.test_chaos.ChaosDesk"
SEPARATOR = "~"  # between the operation key and the execution in a notice's desk key
TERMINAL = {"COMPLETED", "PARTIAL", "FAILED", "NEEDS_HUMAN", "CANCELLED"}


# -- the agent ----------------------------------------------------------------------------------


class ChaosDesk(SupportDesk):
    """The support desk agent, slower, and with a notice channel that does not deduplicate.

    Each tool sleeps ``pause_ms`` (half before it acts, half after, so a fault lands both
    before a write happens and between the write and its response). ``notify_customer``
    sends a notice under ``<operation key>~<execution>``: a second execution is a second
    notice. Its lookup and the inspector find notices by the operation key's prefix.
    """

    name = AGENT
    title = "Support desk (chaos test)"
    fields: ClassVar[Mapping[str, Field]] = {
        **SupportDesk.fields,
        "pause_ms": Field(int, default=0, minimum=0, maximum=5000),
    }

    def __init__(self, task_id: int, input: Mapping[str, Any], memory: dict[str, Any]) -> None:
        super().__init__(task_id, input, memory)
        self.pause_s = int(input.get("pause_ms") or 0) / 1000

    def tools(self) -> Sequence[Tool]:
        """The desk's lookup and refund, and a notice that is sent again if run again."""
        lookup, refund, _ = super().tools()
        notify = Tool("notify_customer", "write", self._notify, lookup=notice_settlement)
        return [replace(tool, run=self._paused(tool.run)) for tool in (lookup, refund, notify)]

    def _paused(self, run: Callable[[Call], Result]) -> Callable[[Call], Result]:
        def paused(call: Call) -> Result:
            time.sleep(self.pause_s / 2)
            result = run(call)
            time.sleep(self.pause_s / 2)
            return result

        return paused

    def _notify(self, call: Call) -> Result:
        order, recipient, text = (call.args.get(k) for k in ("order", "recipient", "text"))
        if not call.operation_key or not isinstance(order, int):
            return Result(Kind.FATAL, {"error": "a notice needs an operation key and an order"})
        notice = desk.notice_send(
            order_number=order,
            recipient=str(recipient),
            text=str(text),
            idempotency_key=f"{call.operation_key}{SEPARATOR}{uuid.uuid4().hex}",
        )
        return Result(Kind.SUCCESS, notice_data(notice))

    def inspect(self, result: Result | None, step: Any) -> Evidence:
        """The support desk's facts, with notices found by their operation key."""
        facts: dict[str, bool] = self.memory.setdefault("verified", {})
        if isinstance(step, Call) and step.tool == "order_lookup" and result is not None:
            order = desk.order_get(self.order)
            confirmed = result.kind == Kind.SUCCESS and isinstance(result.data, Mapping)
            confirmed = confirmed and result.data.get("customer_email") == order.customer_email
            facts["order"] = facts.get("order", False) or confirmed
        refund = desk.refund_find(self.refund_key)
        refunded = refund is not None and refund.amount_cents == self.amount_cents
        notified = sent(self.notice_key).exists()
        committed: bool | None = None
        if isinstance(step, Call) and step.tool == "refund":
            committed = refunded
        elif isinstance(step, Call) and step.tool == "notify_customer":
            committed = (
                sent(step.operation_key or "")
                .filter(text=step.args.get("text"), recipient=step.args.get("recipient"))
                .exists()
            )
        revision = int(facts.get("order", False)) + int(refunded) + int(notified)
        return Evidence(revision, refunded and notified, committed)


def sent(operation_key: str) -> Any:
    """The notices sent for ``operation_key``, one per real execution of the write."""
    return Notice.objects.filter(idempotency_key__startswith=f"{operation_key}{SEPARATOR}")


def notice_settlement(operation_key: str) -> Settlement:
    """Settle a notice from the desk's records, by its operation key."""
    notice = sent(operation_key).select_related("order").first()
    if notice is None:
        return Settlement(False, evidence=f"the desk holds no notice for {operation_key}")
    return Settlement(
        True, Result(Kind.SUCCESS, notice_data(notice)), evidence=f"desk notice #{notice.pk}"
    )


# -- the processes ------------------------------------------------------------------------------


@dataclass
class Slot:
    """One of the workers: running, frozen until a time, or dead and being started again."""

    number: int
    worker: workers.Worker | None = None
    frozen_until: float | None = None
    restart_at: float | None = None
    starting: Future[workers.Worker] | None = None
    started: list[workers.Worker] = field(default_factory=list)

    @property
    def alive(self) -> bool:
        return self.worker is not None


class Chaos:
    """The workers, the beat, the faults and a timeline of what happened when."""

    def __init__(self, queue: str, directory: Path, seed: int) -> None:
        self.queue = queue
        self.directory = directory
        # One generator per purpose, so that the faults come in the same order, to the
        # same workers, whatever the timing did to the others: the cuts draw once per
        # connection found, a number the timing decides.
        self.rng = random.Random(f"{seed}-faults")
        self.cuts = random.Random(f"{seed}-cuts")
        self.began = time.monotonic()
        self.timeline: list[str] = []
        self.slots = [Slot(n) for n in range(1, WORKERS + 1)]
        # Workers start one at a time: tests.workers numbers each start by the logs present.
        self.starter = ThreadPoolExecutor(max_workers=1)
        self.env = {
            "LOOPGUARD_EXTRA_AGENTS": f"{AGENT}={AGENT_PATH}",
            # A message a killed worker had taken stays unacknowledged for the visibility
            # timeout; the sweep sends its task again after this instead.
            "LOOPGUARD_REQUEUE_AFTER_SECONDS": "5",
            "DATABASE_URL": database_url(),
        }
        self.beat: subprocess.Popen[bytes] | None = None
        self.counts = {"kill": 0, "freeze": 0, "cut": 0, "cut connections": 0}

    def note(self, what: str) -> None:
        self.timeline.append(f"{time.monotonic() - self.began:6.1f}s {what}")

    # processes

    def start(self) -> None:
        for slot in self.slots:
            slot.worker = self._start(slot)
        self.beat = self._start_beat()
        self.note(f"{WORKERS} workers and a beat started")

    def _start(self, slot: Slot) -> workers.Worker:
        worker = workers.start_worker(self.queue, self.directory, beat=False, extra_env=self.env)
        slot.started.append(worker)
        return worker

    def _start_beat(self) -> subprocess.Popen[bytes]:
        log = self.directory / "beat.log"
        env = workers.worker_environment(self.queue, self.env)
        with log.open("wb") as out:
            beat = subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", "console", "beat", "-l", "info"],
                cwd=workers.ROOT,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        wait_for(
            lambda: beat.poll() is not None or "Starting..." in log.read_text(errors="replace"),
            timeout=workers.STARTUP_S,
            what="beat to start",
        )
        assert beat.poll() is None, log.read_text(errors="replace")
        return beat

    # faults

    def tick(self, now: float) -> None:
        """Let the frozen workers whose time is up go on, and start the dead ones again."""
        for slot in self.slots:
            if slot.frozen_until is not None and now >= slot.frozen_until and slot.worker:
                self._signal(slot.worker, signal.SIGCONT)
                slot.frozen_until = None
                self.note(f"worker {slot.number} let go (SIGCONT)")
            if slot.restart_at is not None and now >= slot.restart_at:
                slot.restart_at = None
                slot.starting = self.starter.submit(self._start, slot)
            if slot.starting is not None and slot.starting.done():
                slot.worker, slot.starting = slot.starting.result(), None
                self.note(f"worker {slot.number} started again")

    def fault(self) -> None:
        """One fault, chosen by the seed: kill a worker, freeze one, or cut connections."""
        kind = self.rng.choices(["kill", "freeze", "cut"], weights=[3, 3, 4])[0]
        # The drawn worker, or the next one that runs (every draw takes the same randomness).
        drawn = self.rng.randrange(WORKERS)
        running = [self.slots[(drawn + n) % WORKERS] for n in range(WORKERS)]
        running = [slot for slot in running if slot.alive]
        if kind != "cut" and not running:
            kind = "cut"
        if kind == "kill":
            slot = running[0]
            assert slot.worker is not None
            workers.kill_worker(slot.worker)
            slot.worker, slot.frozen_until = None, None
            slot.restart_at = time.monotonic() + self.rng.uniform(*RESTART_AFTER_S)
            self.note(f"worker {slot.number} killed (SIGKILL to its process group)")
        elif kind == "freeze":
            slot = running[0]
            assert slot.worker is not None
            if slot.frozen_until is None:
                self._signal(slot.worker, signal.SIGSTOP)
            freeze = settings.LOOPGUARD_LEASE_SECONDS + self.rng.uniform(*FREEZE_S)
            slot.frozen_until = time.monotonic() + freeze
            self.note(f"worker {slot.number} frozen (SIGSTOP) for {freeze:.1f} s")
        else:
            share = self.rng.choice([1.0, 0.5])
            cut = self.cut(share)
            self.counts["cut connections"] += cut
            self.note(f"{cut} database connection(s) cut ({share:.0%} of them)")
        self.counts[kind] += 1

    def cut(self, share: float) -> int:
        """Terminate ``share`` of the other processes' connections to the test database."""
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                "AND pid <> pg_backend_pid() AND backend_type = 'client backend' ORDER BY pid"
            )
            pids = [row[0] for row in cursor.fetchall()]
            chosen = [pid for pid in pids if self.cuts.random() < share]
            for pid in chosen:
                cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
        return len(chosen)

    def calm(self) -> None:
        """No more faults: every frozen worker goes on and every dead one is running again."""
        for slot in self.slots:
            if slot.frozen_until is not None and slot.worker is not None:
                slot.frozen_until = time.monotonic()
            if slot.restart_at is not None:
                slot.restart_at = time.monotonic()

        def all_running() -> bool:
            self.tick(time.monotonic())
            return all(slot.alive for slot in self.slots)

        wait_for(all_running, timeout=2 * workers.STARTUP_S, what="every worker to run again")
        self.note("calm: every worker runs")

    def _signal(self, worker: workers.Worker, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(worker.process.pid, signum)

    def close(self) -> None:
        """Nothing outlives the test: every group let go, then killed; the queue forgotten."""
        for slot in self.slots:
            if slot.starting is not None:
                with contextlib.suppress(Exception):
                    slot.worker = slot.starting.result(timeout=2 * workers.STARTUP_S)
        self.starter.shutdown(wait=True)
        for slot in self.slots:
            for worker in slot.started:
                self._signal(worker, signal.SIGCONT)
                workers.kill_worker(worker)
        if self.beat is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.beat.pid, signal.SIGKILL)
            self.beat.wait(timeout=10)
        workers.forget_queue(self.queue)

    def logs(self) -> str:
        """The end of every worker's log, and how many tracebacks each holds."""
        parts = []
        for path in sorted(self.directory.glob("*.log")):
            text = path.read_text(errors="replace")
            parts.append(
                f"--- {path.name} ({text.count('Traceback')} tracebacks), last lines:\n"
                + "\n".join(text.splitlines()[-15:])
            )
        return "\n".join(parts)


@pytest.fixture
def chaos(transactional_db: None, tmp_path: Path, settings: Settings) -> Iterator[Chaos]:
    settings.LOOPGUARD_AGENTS = {**settings.LOOPGUARD_AGENTS, AGENT: AGENT_PATH}
    running = Chaos(f"loopguard-chaos-{uuid.uuid4().hex[:12]}", tmp_path, SEED)
    try:
        running.start()
        yield running
    finally:
        running.close()


# -- the figures --------------------------------------------------------------------------------


@dataclass
class Figures:
    """What the run came to, for people: how much was thrown at it and who must act now."""

    tasks: int
    faults: Mapping[str, int]
    lost: int  # writes recovery found in flight (before invariant 14, each paged a person)
    lost_tasks: int  # the tasks they belong to
    settled: Mapping[str, int]  # settled automatically by their lookup, by the state reached
    needs_human: Mapping[str, int]  # tasks that wait for a person, by reason
    answerable: list[str] = field(default_factory=list)  # left to a person, lookup answers

    def __str__(self) -> str:
        return (
            f"figures: {self.tasks} tasks; faults {dict(self.faults)}; "
            f"{self.lost} write(s) of {self.lost_tasks} task(s) lost by recovery (each a page "
            f"before lookups); settled by their lookup {dict(self.settled)}; NEEDS_HUMAN now "
            f"{sum(self.needs_human.values())} {dict(self.needs_human)}; left to a person "
            f"although the lookup answers: {self.answerable or 'none'}"
        )


def figures_of(tasks: Sequence[Task], faults: Mapping[str, int]) -> Figures:
    lost = OperationEvent.objects.filter(
        from_state="IN_FLIGHT", to_state="UNKNOWN", evidence__startswith="recovery:"
    )
    settled: dict[str, int] = {}
    for state in AuditEntry.objects.filter(actor__username=lifecycle.RECOVERY_ACCOUNT).values_list(
        "after__state", flat=True
    ):
        settled[str(state)] = settled.get(str(state), 0) + 1
    stopped = Task.objects.filter(id__in=[t.id for t in tasks], state=TaskState.NEEDS_HUMAN)
    needs_human: dict[str, int] = {}
    for reason in stopped.values_list("reason", flat=True):
        needs_human[reason] = needs_human.get(reason, 0) + 1
    answerable = []
    for op in Operation.objects.filter(state="UNKNOWN", id__in=lost.values("operation_id")):
        task = Task.objects.get(id=op.task_id)
        # What the desk tells now, by the key: a write the lookup settles that was still left
        # to a person must have met a lookup that could not answer then (a cut connection).
        tool = next(t for t in ChaosDesk(task.id, task.input, {}).tools() if t.name == op.tool)
        answer = tool.lookup(op.key) if tool.lookup is not None else None
        failed = "the lookup failed" in task.detail or "did not answer" in task.detail
        if answer is not None and answer.committed is not None and not failed:
            answerable.append(f"{op.key} (task {task.id}: {task.detail[:160]})")
    return Figures(
        tasks=len(tasks),
        faults=faults,
        lost=lost.count(),
        lost_tasks=lost.values("task_id").distinct().count(),
        settled=settled,
        needs_human=needs_human,
        answerable=answerable,
    )


# -- the test -----------------------------------------------------------------------------------


def test_under_kills_freezes_and_cut_connections_no_write_happens_twice_or_goes_missing(
    chaos: Chaos,
) -> None:
    rng = random.Random(f"{SEED}-tasks")
    orders = []
    for i in range(ORDERS):
        orders.append(
            Order.objects.create(
                number=7000 + i, customer_email=f"customer{i}@example.com", amount_cents=5000
            )
        )
    goals = [
        {"order": order.number, "amount_cents": 1000 + 100 * i, "reason": f"chaos {SEED}"}
        for i, order in enumerate(orders)
    ]
    goals += goals[:SHARED]
    rng.shuffle(goals)
    goals = [{**goal, "pause_ms": rng.randint(100, 600)} for goal in goals]
    arrivals = sorted(rng.uniform(0, ARRIVALS_S) for _ in goals)
    limits = {"deadline_ms": 150_000, "model_calls": 16, "requests": 16, "executions": 10}

    def enqueue(task_id: int) -> None:
        run_task.apply_async((task_id,), queue=chaos.queue)

    tasks: list[Task] = []
    began = time.monotonic()
    next_fault = began + chaos.rng.uniform(*FAULT_EVERY_S)
    while (now := time.monotonic()) < began + CHAOS_S:
        while len(tasks) < len(goals) and now - began >= arrivals[len(tasks)]:
            goal = goals[len(tasks)]
            tasks.append(
                services.task_start(agent=AGENT, input=goal, limits=limits, enqueue=enqueue)
            )
        chaos.tick(now)
        if now >= next_fault:
            chaos.fault()
            next_fault = now + chaos.rng.uniform(*FAULT_EVERY_S)
        time.sleep(0.05)
    chaos.calm()

    def settled() -> bool:
        pending = Task.objects.filter(state__in=[TaskState.QUEUED, TaskState.RUNNING])
        return not pending.exists() and not Operation.objects.filter(state="IN_FLIGHT").exists()

    def story() -> str:
        rows = Task.objects.order_by("id").values_list(
            "id", "state", "reason", "recoveries", "lease_owner", "lease_expires_at"
        )
        return (
            f"chaos seed {SEED} (replay: CHAOS_SEED={SEED}); faults {chaos.counts}\n"
            + "\n".join(chaos.timeline)
            + "\ntasks:\n"
            + "\n".join(str(row) for row in rows)
            + "\noperations:\n"
            + "\n".join(
                str(row)
                for row in Operation.objects.order_by("key").values_list("key", "state", "task_id")
            )
            + "\n"
            + chaos.logs()
        )

    def told() -> str:
        return f"{figures_of(tasks, chaos.counts)}\n{story()}"

    wait_for(settled, timeout=SETTLE_S, what="every task and operation to settle", explain=told)

    figures = figures_of(tasks, chaos.counts)
    print(figures)  # shown with the test's output when it fails
    said = f"{figures}\n{story()}"
    assert len(tasks) == ORDERS + SHARED, said
    assert chaos.counts["kill"] and chaos.counts["freeze"] and chaos.counts["cut"], said
    operations = {op.key: op for op in Operation.objects.all()}
    # No business action twice: one refund per order, one notice per operation key.
    for order in orders:
        assert Refund.objects.filter(order=order).count() <= 1, said
    notices: dict[str, int] = {}
    for key in Notice.objects.values_list("idempotency_key", flat=True):
        operation_key = key.partition(SEPARATOR)[0]
        notices[operation_key] = notices.get(operation_key, 0) + 1
    twice = {key: n for key, n in notices.items() if n > 1}
    assert not twice, f"notices sent more than once: {twice}\n{said}"
    # The ledger and the desk agree: nothing committed missing, nothing "not committed" done.
    for key, op in operations.items():
        done = desk.refund_find(key) is not None if key.endswith("-refund") else key in notices
        if op.state == "COMMITTED":
            assert done, f"{key} is COMMITTED but the desk has no record of it\n{said}"
        elif op.state == "NOT_COMMITTED":
            assert not done, f"{key} is NOT_COMMITTED but the desk did it\n{said}"
        assert op.state != "IN_FLIGHT", said
    # Every business record is in the ledger under its key.
    refund_keys = set(Refund.objects.values_list("idempotency_key", flat=True))
    assert refund_keys | set(notices) <= set(operations), said
    # No task stuck: each stopped, with a reason and a stop report; a finished one did it all.
    for task in Task.objects.filter(id__in=[t.id for t in tasks]):
        assert task.state in TERMINAL and task.reason, f"task {task.id} {task.state}\n{said}"
        assert StopReport.objects.filter(task=task).exists(), f"task {task.id}\n{said}"
        if task.state == "COMPLETED":
            number = task.input["order"]
            assert desk.refund_find(f"order-{number}-refund") is not None, said
            assert notices.get(f"order-{number}-refund-notice") == 1, said
    # A person is asked last: what recovery lost went to a person only if its lookup could
    # not tell, and every automatic settle is in the audit log.
    assert not figures.answerable, f"left to a person, yet the lookup answers\n{said}"
    assert sum(figures.settled.values()) == (
        OperationEvent.objects.filter(actor__username=lifecycle.RECOVERY_ACCOUNT).count()
    ), said
