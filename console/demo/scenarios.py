"""The demo a first run shows: one person per role, the desk's records, and tasks in every state.

Everything here is idempotent. ``demo_users`` creates the five demo people or gives them
new passwords; ``demo_tasks`` starts each scenario only if the demo has not started it
before (the running one again once its previous run has ended); ``demo_keep_running``,
which ``manage.py up`` calls every few seconds while the console runs, starts the running
one again whenever it has ended, so that there is always a task to watch and to stop;
``demo_stop_due`` has the admin stop the scenario that shows an operator's stop, once it
has been running for a few seconds.

A demo person is recognised by the e-mail address the demo gave them: an account that
happens to be called ``admin`` but was not made here is never touched.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from functools import partial
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone

from console.demo.desk import seed_demo_data
from console.models import ACTIVE_STATES, Phase, Task, TaskState
from console.records.roles import Role, assign, ensure_groups
from console.services import Enqueue, ServiceError, input_fingerprint, task_start, task_stop

logger = logging.getLogger(__name__)

__all__ = [
    "APPROVAL_INPUT",
    "KEEP_RUNNING",
    "SCENARIOS",
    "DemoUser",
    "Scenario",
    "demo_keep_running",
    "demo_stop_due",
    "demo_stop_pending",
    "demo_tasks",
    "demo_users",
]

DEMO_DOMAIN = "demo.loopguard.invalid"  # .invalid: reserved, never a real mailbox
STARTER = Role.OPERATOR.value
STOPPER = Role.ADMIN.value


@dataclass(frozen=True)
class Scenario:
    """One demo task: which agent, with what, and what the dashboard shows of it."""

    agent: str
    input: Mapping[str, Any]
    shows: str
    limits: Mapping[str, Any] = field(default_factory=dict)
    keep_running: bool = False
    """Start it again whenever its previous run has ended (``demo_keep_running``): there is
    always work in progress."""
    stop_after_s: float | None = None
    """The admin stops it once it has been running this long (an operator's stop)."""


# The task that is always running while `up` runs. The worker sleeps inside the tool
# between pages (no CPU), and the guard looks for a stop before every page, so Stop ends it
# within 5 s. One run is 120 pages, about 10 minutes: inside its deadline and call budgets
# (tests/console/test_demo_scenarios.py), and well inside the broker's visibility timeout
# (an hour), past which Redis would hand its message to a second worker. Then `up` starts
# the next. What it writes in an hour: 720 pages, each two trace events (~275 bytes of row
# each), and six tasks with a phase, a stop report, a start in the audit log and its first
# and last trace events (~4 KB each): about 1,500 rows, 0.4 MB an hour, 10 MB a day of
# console time. (`up` itself looks every 10 s whether it has ended: two small reads.)
KEEP_RUNNING_PAGES = 120
KEEP_RUNNING_DELAY_MS = 5000

# A refund above its limit waits for a person: order 46 cost 128.00 and the desk would
# refund it all, but above 100.00 an approver must say yes first.
APPROVAL_INPUT: Mapping[str, Any] = {
    "order": 46,
    "amount_cents": 12800,
    "reason": "the wrong size was sent twice",
    "approve_above_cents": 10000,
}

KEEP_RUNNING = Scenario(
    "long_runner",
    {"pages": KEEP_RUNNING_PAGES, "delay_ms": KEEP_RUNNING_DELAY_MS},
    "running: a page every 5 s; when it ends, the next starts (always one to stop)",
    limits={"deadline_ms": 900_000},
    keep_running=True,
)

SCENARIOS: tuple[Scenario, ...] = (
    Scenario("paging", {"collection": "reports"}, "completed: three verified pages"),
    Scenario(
        "support_desk",
        {"order": 44, "amount_cents": 2500, "reason": "the parcel arrived damaged"},
        "completed: a refund and a notice, each exactly once",
    ),
    Scenario(
        "support_desk",
        APPROVAL_INPUT,
        "needs a human: a 128.00 refund (over 100.00) waits in the approval queue",
    ),
    Scenario("oscillation", {"incident": 7}, "partial: stopped on a short cycle"),
    Scenario(
        "lost_response",
        {"incident": 102},
        "needs a human: a notice went out but its response was lost (UNKNOWN)",
    ),
    Scenario("unverified_finish", {"order": 42}, "partial: the model claimed a finish"),
    KEEP_RUNNING,
    Scenario(
        "long_runner",
        {"pages": 120, "delay_ms": 500},
        "stopped: the admin stops it a few seconds in",
        stop_after_s=4.0,
    ),
)


@dataclass(frozen=True)
class DemoUser:
    """A demo person and the password set for them now (None: not a demo account, left alone)."""

    username: str
    role: Role
    password: str | None


def demo_users() -> list[DemoUser]:
    """Create one person per role, named after it, with a new random password each time."""
    ensure_groups()
    people = []
    for role in (Role.ADMIN, Role.OPERATOR, Role.RECONCILER, Role.APPROVER, Role.VIEWER):
        username, email = role.value, f"{role.value}@{DEMO_DOMAIN}"
        password: str | None = secrets.token_urlsafe(12)
        with transaction.atomic():
            user, created = User.objects.select_for_update().get_or_create(
                username=username, defaults={"email": email}
            )
            if not created and user.email != email:
                logger.warning("user %s exists and is not a demo account: left alone", username)
                password = None
            else:
                user.set_password(password)
                user.is_staff = role is Role.ADMIN
                user.is_active = True
                user.save()
                assign(user, [role])
        people.append(DemoUser(username, role, password))
    return people


def _demo_person(username: str) -> User | None:
    return User.objects.filter(username=username, email=f"{username}@{DEMO_DOMAIN}").first()


def _demo_runs(scenario: Scenario, starter: User) -> Any:
    """The tasks the demo started for ``scenario``, newest first."""
    fingerprint = input_fingerprint(scenario.agent, scenario.input)
    return Task.objects.filter(
        agent=scenario.agent, input_fingerprint=fingerprint, created_by=starter
    ).order_by("-created_at", "-id")


def demo_tasks(*, enqueue: Enqueue | None = None) -> list[tuple[Scenario, Task, bool]]:
    """Start the scenarios that need starting; returns each one's task and whether it is new.

    Needs the demo operator (``demo_users``); seeds the desk's records first. ``enqueue``
    replaces sending the task to the workers (tests).
    """
    seed_demo_data()
    starter = _demo_starter()
    shown = []
    for scenario in SCENARIOS:
        last = _demo_runs(scenario, starter).first()
        if last is None or _starts_again(scenario, last):
            shown.append((scenario, _start(scenario, starter, enqueue), True))
        else:
            shown.append((scenario, last, False))
    return shown


def demo_keep_running(*, enqueue: Enqueue | None = None) -> list[tuple[Scenario, Task]]:
    """Start again each ``keep_running`` scenario whose last run has ended; returns those
    started (usually none: two small queries per scenario).

    Never more often than the console's restart-loop rule lets one goal start
    (``LOOPGUARD_RESTART_LIMIT`` in ``LOOPGUARD_RESTART_WINDOW_SECONDS``): a person who
    keeps pressing Stop sees the next run a few minutes later, not a task held as a loop.
    """
    starter = _demo_person(STARTER)
    if starter is None:
        return []
    started = []
    for scenario in SCENARIOS:
        if not scenario.keep_running:
            continue
        last = _demo_runs(scenario, starter).first()
        if last is None or _starts_again(scenario, last):
            started.append((scenario, _start(scenario, starter, enqueue)))
    return started


def _demo_starter() -> User:
    starter = _demo_person(STARTER)
    if starter is None:
        raise ServiceError(f"the demo needs its {STARTER} account: run demo_users first")
    return starter


def _starts_again(scenario: Scenario, last: Task) -> bool:
    """Whether a ``keep_running`` scenario whose last run is ``last`` is due to start now."""
    if not scenario.keep_running or last.state in ACTIVE_STATES:
        return False
    # The same count task_start makes: one more start must not be held as a restart loop.
    window = timezone.now() - timedelta(seconds=settings.LOOPGUARD_RESTART_WINDOW_SECONDS)
    recent = Task.objects.filter(
        agent=scenario.agent, input_fingerprint=last.input_fingerprint, created_at__gte=window
    ).count()
    return recent < settings.LOOPGUARD_RESTART_LIMIT


def _start(scenario: Scenario, starter: User, enqueue: Enqueue | None) -> Task:
    start = task_start if enqueue is None else partial(task_start, enqueue=enqueue)
    return start(
        agent=scenario.agent,
        input=dict(scenario.input),
        limits=dict(scenario.limits) or None,
        actor=starter,
        reason=f"demo: {scenario.shows}",
    )


def demo_stop_due() -> list[Task]:
    """Have the admin stop each demo task that is due for its stop; returns those stopped.

    A scenario's task is due once it has run ``stop_after_s`` seconds. Returns nothing
    (and is cheap) once every such task has stopped.
    """
    starter, admin = _demo_person(STARTER), _demo_person(STOPPER)
    if starter is None or admin is None:
        return []
    stopped = []
    for scenario in SCENARIOS:
        if scenario.stop_after_s is None:
            continue
        due = timezone.now() - timedelta(seconds=scenario.stop_after_s)
        running = _demo_runs(scenario, starter).filter(
            state=TaskState.RUNNING, stop_requested_at__isnull=True
        )
        for task in running:
            started = (
                Phase.objects.filter(task=task, number=task.phase)
                .values_list("started_at", flat=True)
                .first()
            )
            if started is None or started > due:
                continue
            try:
                stopped.append(
                    task_stop(
                        task_id=task.id,
                        actor=admin,
                        reason="demo: the admin stops this run to show an operator's stop",
                    )
                )
            except ServiceError as exc:  # it stopped on its own meanwhile
                logger.info("demo: task %s was not stopped: %s", task.id, exc)
    return stopped


def demo_stop_pending() -> bool:
    """Whether a demo task is still to be stopped by the admin (it has not run long enough)."""
    starter = _demo_person(STARTER)
    if starter is None:
        return False
    return any(
        _demo_runs(scenario, starter)
        .filter(state__in=ACTIVE_STATES, stop_requested_at__isnull=True)
        .exists()
        for scenario in SCENARIOS
        if scenario.stop_after_s is not None
    )
