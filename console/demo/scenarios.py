"""The demo a first run shows: one person per role, the desk's records, and tasks in every state.

Everything here is idempotent. ``demo_users`` creates the five demo people or gives them
new passwords; ``demo_tasks`` starts each scenario only if the demo has not started it
before (the running one again once its previous run has ended, so that a new run of
``manage.py up`` shows work in progress); ``demo_stop_due`` has the admin stop the
scenario that shows an operator's stop, once it has been running for a few seconds.

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

from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone

from ..models import ACTIVE_STATES, Phase, Task, TaskState
from ..roles import Role, assign, ensure_groups
from ..services import Enqueue, ServiceError, input_fingerprint, task_start, task_stop
from .desk import seed_demo_data

logger = logging.getLogger(__name__)

__all__ = [
    "SCENARIOS",
    "DemoUser",
    "Scenario",
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
    """Start it again when its previous run has ended: there is always work in progress."""
    stop_after_s: float | None = None
    """The admin stops it once it has been running this long (an operator's stop)."""


SCENARIOS: tuple[Scenario, ...] = (
    Scenario("paging", {"collection": "reports"}, "completed: three verified pages"),
    Scenario(
        "support_desk",
        {"order": 44, "amount_cents": 2500, "reason": "the parcel arrived damaged"},
        "completed: a refund and a notice, each exactly once",
    ),
    Scenario("oscillation", {"incident": 7}, "partial: stopped on a short cycle"),
    Scenario(
        "lost_response",
        {"incident": 102},
        "needs a human: a notice went out but its response was lost (UNKNOWN)",
    ),
    Scenario("unverified_finish", {"order": 42}, "partial: the model claimed a finish"),
    Scenario(
        "long_runner",
        {"pages": 100, "delay_ms": 2000},
        "running: a hundred slow pages, a few minutes of progress",
        limits={"deadline_ms": 300_000},
        keep_running=True,
    ),
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
    start = task_start if enqueue is None else partial(task_start, enqueue=enqueue)
    seed_demo_data()
    starter = _demo_person(STARTER)
    if starter is None:
        raise ServiceError(f"the demo needs its {STARTER} account: run demo_users first")
    shown = []
    for scenario in SCENARIOS:
        last = _demo_runs(scenario, starter).first()
        if last is not None and not (scenario.keep_running and last.state not in ACTIVE_STATES):
            shown.append((scenario, last, False))
            continue
        task = start(
            agent=scenario.agent,
            input=dict(scenario.input),
            limits=dict(scenario.limits) or None,
            actor=starter,
            reason=f"demo: {scenario.shows}",
        )
        shown.append((scenario, task, True))
    return shown


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
