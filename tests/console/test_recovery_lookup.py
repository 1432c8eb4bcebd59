"""Recovery asks a lost write's own lookup before it asks a person (invariant 14).

A worker dies inside a write: the write's operation is left ``IN_FLIGHT`` and the task
``RUNNING`` past its lease. Recovery (the sweep, or the next driver that comes for the task)
asks the write's tool, by operation key, whether it happened — outside any transaction,
within a bound of tries and time — and settles it from the answer, in the operation's
history and the audit log. Only a lookup that cannot tell, fails, hangs or is not there
(or not allowed) leaves the write ``UNKNOWN`` and the task ``NEEDS_HUMAN``/``unknown_commit``.

The worker's death is real enough: the tool raises an exception that no ``except Exception``
catches, so the driver stops where it is, as a killed process does: the operation claimed,
the lease held, the checkpoint of the step before.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.utils import timezone
from pytest_django import Settings

from console import lifecycle, services
from console.agents import Agent, Tool
from console.demo import desk
from console.demo.models import Notice
from console.drivers import runner
from console.models import (
    AuditEntry,
    NotificationEvent,
    Operation,
    OperationEvent,
    Task,
    TaskState,
    TraceEvent,
)
from guard import Call, Evidence, Finish, Kind, Result, Settlement

pytestmark = pytest.mark.django_db(transaction=True)  # lookups run on threads of their own

Start = Callable[..., Task]


class WorkerKilled(BaseException):
    """What a SIGKILL is to the driver: nothing in it catches this."""


# What the lookups of the agents below do, by the name the task's input gives.
RELEASE = threading.Event()  # lets a hanging lookup go at the end of its test
ASKED: list[str] = []  # every key a lookup was asked about, in order


def _desk(key: str) -> Settlement:
    ASKED.append(key)
    notice = Notice.objects.filter(idempotency_key=key).first()
    if notice is None:
        return Settlement(False, evidence=f"the desk holds no notice {key}")
    return Settlement(
        True, Result(Kind.SUCCESS, {"notice": notice.pk}), evidence=f"desk notice #{notice.pk}"
    )


def _raises(key: str) -> Settlement:
    ASKED.append(key)
    raise ConnectionError("the desk is unreachable")


def _blind(key: str) -> Settlement:
    ASKED.append(key)
    return Settlement(None, evidence="the desk's records are being rebuilt")


def _hangs(key: str) -> Settlement:
    ASKED.append(key)
    RELEASE.wait(60)
    return Settlement(True, evidence="too late")


LOOKUPS: dict[str, Callable[[str], Settlement] | None] = {
    "desk": _desk,
    "raises": _raises,
    "blind": _blind,
    "hangs": _hangs,
    "none": None,
}


class KilledWriter(Agent):
    """Sends ``count`` notices, one write each, planned from its own memory (so that after a
    restart it asks again for the write that was running). Its worker dies once inside
    notice ``die_at``: ``die`` ``"after"`` the desk has it, or ``"before"``."""

    name = "test_killed_writer"
    title = "Notice writer whose worker dies (recovery tests)"

    def __init__(self, task_id: int, input: Mapping[str, Any], memory: dict[str, Any]) -> None:
        super().__init__(task_id, input, memory)
        self.auto_lookup = bool(input.get("auto_lookup", True))

    def key(self, n: int) -> str:
        return f"killed-{self.task_id}-notice-{n}"

    def tools(self) -> Sequence[Tool]:
        lookup = LOOKUPS[str(self.input.get("lookup", "desk"))]
        return [Tool("send_notice", "write", self._send, lookup=lookup)]

    def _send(self, call: Call) -> Result:
        key = str(call.operation_key)
        dies = key == self.key(int(self.input.get("die_at", 0)))
        die = str(self.input.get("die", "after"))
        if dies and die == "before" and desk.fault_trip_once(operation_key=f"{key}#die"):
            raise WorkerKilled(key)
        desk.notice_send(
            order_number=None, recipient="ops@example.com", text=key, idempotency_key=key
        )
        if dies and die == "after" and desk.fault_trip_once(operation_key=f"{key}#die"):
            raise WorkerKilled(key)
        return Result(Kind.SUCCESS, {"sent": key})

    def plan(self, observation: Any) -> Call | Finish:
        if isinstance(observation, Result) and observation.kind == Kind.SUCCESS:
            self.memory["done"] = int(self.memory.get("done", 0)) + 1
        done = int(self.memory.get("done", 0))
        if done >= int(self.input.get("count", 2)):
            return Finish("all sent")
        key = self.key(done + 1)
        return Call("send_notice", {"text": key}, "write", key)

    def inspect(self, result: Result | None, step: Call | Finish) -> Evidence:
        keys = [self.key(n) for n in range(1, int(self.input.get("count", 2)) + 1)]
        sent = Notice.objects.filter(idempotency_key__in=keys).count()
        committed = None
        if isinstance(step, Call):
            committed = Notice.objects.filter(idempotency_key=step.operation_key).exists()
        return Evidence(sent, sent >= len(keys), committed)


@pytest.fixture(autouse=True)
def agents(settings: Settings) -> Iterator[None]:
    settings.LOOPGUARD_AGENTS = {
        **settings.LOOPGUARD_AGENTS,
        KilledWriter.name: f"{__name__}.KilledWriter",
    }
    settings.LOOPGUARD_RECOVERY_QUIET_SECONDS = 0  # no frozen drivers here, unless a test says
    ASKED.clear()
    RELEASE.clear()
    yield
    RELEASE.set()


def killed(start: Start, **input: Any) -> tuple[Task, str]:
    """A task whose worker died inside its second notice, its lease now run out; and the
    key of that notice."""
    task = start(KilledWriter.name, {"count": 2, "die_at": 2, **input})
    with pytest.raises(WorkerKilled):
        runner.drive(task.id)
    key = f"killed-{task.id}-notice-2"
    assert Operation.objects.get(key=key).state == "IN_FLIGHT"
    Task.objects.filter(id=task.id).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    task.refresh_from_db()
    assert task.state == TaskState.RUNNING
    return task, key


def history(key: str) -> list[tuple[str, str]]:
    return list(
        OperationEvent.objects.filter(operation__key=key)
        .order_by("id")
        .values_list("from_state", "to_state")
    )


def executions_of(key: str) -> list[str]:
    return list(
        TraceEvent.objects.filter(kind="request", operation_key=key)
        .order_by("id")
        .values_list("decision", flat=True)
    )


# -- the lookup settles it -----------------------------------------------------------------------


def test_a_killed_write_the_lookup_finds_is_committed_and_the_task_completes_without_a_person(
    start: Start,
) -> None:
    task, key = killed(start, die="after")
    resumed: list[int] = []

    counts = runner.sweep(enqueue=resumed.append)

    assert (counts["recovered"], counts["resumed"], resumed) == (1, 1, [task.id])
    op = Operation.objects.get(key=key)
    assert (op.state, op.result, op.attempts) == (
        "COMMITTED",
        {
            "kind": "SUCCESS",
            "data": {"notice": Notice.objects.get(idempotency_key=key).pk},
            "wait_ms": None,
            "attempts": 1,
        },
        1,
    )
    assert history(key) == [("", "IN_FLIGHT"), ("IN_FLIGHT", "UNKNOWN"), ("UNKNOWN", "COMMITTED")]
    settled = OperationEvent.objects.filter(operation=op).last()
    assert settled is not None and settled.actor is not None
    assert "desk notice #" in settled.evidence
    entry = AuditEntry.objects.get(operation=op)
    assert (entry.actor, entry.action, entry.task_id) == (settled.actor, "mark_committed", task.id)
    assert entry.after["lookup"]["committed"] is True
    assert entry.after["lookup"]["evidence"].startswith("desk notice #")
    assert entry.actor.username == lifecycle.RECOVERY_ACCOUNT
    assert not entry.actor.is_active and not entry.actor.has_usable_password()

    assert runner.drive(task.id) == "COMPLETED/goal_met"

    task.refresh_from_db()
    assert (task.state, task.reason) == (TaskState.COMPLETED, "goal_met")
    # The restored guard asked for the write again and reused what the lookup found (the
    # killed execution's own event died with its worker, before its save).
    assert executions_of(key) == ["reused"]
    assert Notice.objects.filter(idempotency_key=key).count() == 1
    assert not NotificationEvent.objects.filter(task=task).exists()  # nobody was paged


def test_a_killed_write_the_lookup_does_not_find_is_claimed_again_once_and_happens_once(
    start: Start,
) -> None:
    task, key = killed(start, die="before")

    runner.sweep(enqueue=lambda task_id: None)

    op = Operation.objects.get(key=key)
    assert op.state == "NOT_COMMITTED"
    entry = AuditEntry.objects.get(operation=op)
    assert (entry.action, entry.after["lookup"]["committed"]) == ("mark_not_committed", False)
    assert [key] == ASKED

    assert runner.drive(task.id) == "COMPLETED/goal_met"

    op.refresh_from_db()
    assert (op.state, op.attempts) == ("COMMITTED", 2)
    assert history(key) == [
        ("", "IN_FLIGHT"),
        ("IN_FLIGHT", "UNKNOWN"),
        ("UNKNOWN", "NOT_COMMITTED"),
        ("NOT_COMMITTED", "IN_FLIGHT"),
        ("IN_FLIGHT", "COMMITTED"),
    ]
    assert [key, key] == ASKED  # the claim back asked the lookup first, as every retry does
    assert Notice.objects.filter(idempotency_key=key).count() == 1
    assert not NotificationEvent.objects.filter(task=task).exists()


def test_the_next_driver_of_a_task_no_sweep_recovered_asks_the_lookup_itself(
    start: Start,
) -> None:
    task, key = killed(start, die="after")

    assert runner.drive(task.id) == "COMPLETED/goal_met"  # a redelivered message, say

    assert Operation.objects.get(key=key).state == "COMMITTED"
    assert AuditEntry.objects.filter(operation__key=key, action="mark_committed").count() == 1
    assert Notice.objects.filter(idempotency_key=key).count() == 1


def test_a_write_not_found_while_its_driver_may_still_be_running_it_waits_to_be_asked_again(
    start: Start, settings: Settings
) -> None:
    # A frozen or cut-off driver's lease runs out too, and it may still make the write: a
    # "not found" then is no proof, and a retry could make it happen twice.
    task, key = killed(start, die="before")
    settings.LOOPGUARD_RECOVERY_QUIET_SECONDS = 3600

    assert runner.sweep(enqueue=lambda task_id: None)["recovered"] == 0
    assert runner.drive(task.id) == "a lost driver's write waits to be looked up"

    assert Operation.objects.get(key=key).state == "IN_FLIGHT"
    task.refresh_from_db()
    assert (task.state, task.recoveries) == (TaskState.RUNNING, 0)
    assert not AuditEntry.objects.exists()

    settings.LOOPGUARD_RECOVERY_QUIET_SECONDS = 0  # it has been quiet long enough now
    assert runner.sweep(enqueue=lambda task_id: None)["resumed"] == 1
    assert Operation.objects.get(key=key).state == "NOT_COMMITTED"


# -- nobody but a person can tell ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("input", "asked", "said"),
    [
        ({"lookup": "raises"}, 3, "ConnectionError: the desk is unreachable"),
        ({"lookup": "blind"}, 3, "it cannot tell"),
        ({"lookup": "none"}, 0, "the tool send_notice has no lookup"),
        ({"auto_lookup": False}, 0, "its agent's auto_lookup is off"),
    ],
    ids=["lookup-raises", "cannot-tell", "no-lookup", "auto-lookup-off"],
)
def test_a_killed_write_nobody_but_a_person_can_settle_stays_unknown_for_a_person(
    start: Start, input: dict[str, Any], asked: int, said: str
) -> None:
    task, key = killed(start, die="after", **input)

    runner.sweep(enqueue=lambda task_id: None)

    task.refresh_from_db()
    assert (task.state, task.reason) == (TaskState.NEEDS_HUMAN, "unknown_commit")
    assert Operation.objects.get(key=key).state == "UNKNOWN"
    assert history(key) == [("", "IN_FLIGHT"), ("IN_FLIGHT", "UNKNOWN")]
    assert len(ASKED) == asked  # tried again within its bound, no more
    assert said in task.detail  # why a person is asked, in the stop report they read
    assert NotificationEvent.objects.filter(task=task, reason="unknown_commit").count() == 1
    assert not AuditEntry.objects.exists()
    assert Notice.objects.filter(idempotency_key=key).count() == 1


def test_a_lookup_that_hangs_costs_its_bound_and_leaves_the_write_to_a_person(
    start: Start, settings: Settings
) -> None:
    settings.LOOPGUARD_RECOVERY_LOOKUP_SECONDS = 0.5
    task, key = killed(start, die="after", lookup="hangs")

    began = time.monotonic()
    runner.sweep(enqueue=lambda task_id: None)
    took = time.monotonic() - began

    assert took < 3, f"the sweep waited {took:.1f} s for a lookup bounded at 0.5 s"
    task.refresh_from_db()
    assert (task.state, task.reason) == (TaskState.NEEDS_HUMAN, "unknown_commit")
    assert "did not answer within 0.5 s" in task.detail
    assert Operation.objects.get(key=key).state == "UNKNOWN"
    assert [key] == ASKED  # a hung lookup is not asked again on top of itself


# -- races ---------------------------------------------------------------------------------------


def test_two_sweeps_at_once_settle_a_lost_write_once(start: Start) -> None:
    task, key = killed(start, die="after")
    both = threading.Barrier(2, timeout=20)
    original = LOOKUPS["desk"]

    def together(key: str) -> Settlement:
        both.wait()  # both sweeps have read the task and asked before either settles
        return _desk(key)

    LOOKUPS["desk"] = together
    resumed: list[int] = []
    outcomes: list[dict[str, int]] = []

    def sweeping() -> None:
        try:
            outcomes.append(runner.sweep(enqueue=resumed.append))
        finally:
            connection.close()

    try:
        sweeps = [threading.Thread(target=sweeping) for _ in range(2)]
        for sweep in sweeps:
            sweep.start()
        for sweep in sweeps:
            sweep.join(timeout=30)
    finally:
        LOOKUPS["desk"] = original

    assert [key, key] == ASKED
    assert sorted(o["recovered"] for o in outcomes) == [0, 1]
    assert resumed == [task.id]
    assert history(key) == [("", "IN_FLIGHT"), ("IN_FLIGHT", "UNKNOWN"), ("UNKNOWN", "COMMITTED")]
    assert AuditEntry.objects.filter(operation__key=key).count() == 1
    assert Task.objects.get(id=task.id).recoveries == 1


def test_a_reconciler_who_settles_first_keeps_their_answer(start: Start, operator: User) -> None:
    task, key = killed(start, die="after")
    original = LOOKUPS["desk"]

    def meanwhile(key: str) -> Settlement:
        found = _desk(key)
        services.operation_mark_committed(key=key, actor=operator, evidence="I saw it in the desk")
        return found

    LOOKUPS["desk"] = meanwhile
    try:
        runner.sweep(enqueue=lambda task_id: None)
    finally:
        LOOKUPS["desk"] = original

    op = Operation.objects.get(key=key)
    assert (op.state, op.evidence) == ("COMMITTED", "I saw it in the desk")
    assert history(key) == [("", "IN_FLIGHT"), ("IN_FLIGHT", "COMMITTED")]
    assert list(AuditEntry.objects.values_list("actor", flat=True)) == [operator.id]
    assert runner.drive(task.id) == "COMPLETED/goal_met"


def test_a_reconciler_who_comes_after_the_lookup_is_told_it_is_settled(
    start: Start, operator: User
) -> None:
    _, key = killed(start, die="after")
    runner.sweep(enqueue=lambda task_id: None)

    with pytest.raises(services.StaleState):
        services.operation_mark_committed(key=key, actor=operator, evidence="I saw it too")

    assert AuditEntry.objects.filter(operation__key=key).count() == 1


def test_nothing_is_settled_in_the_name_of_a_person_who_took_the_recovery_accounts_name(
    start: Start, django_user_model: type[User]
) -> None:
    django_user_model.objects.create_user(lifecycle.RECOVERY_ACCOUNT, password="a-person's")
    task, key = killed(start, die="after")

    runner.sweep(enqueue=lambda task_id: None)

    task.refresh_from_db()
    assert (task.state, task.reason) == (TaskState.NEEDS_HUMAN, "unknown_commit")
    assert Operation.objects.get(key=key).state == "UNKNOWN"
    assert not AuditEntry.objects.exists()
