"""Who may do what: roles are Django groups, checked on the server for every action.

Any role may read. Each action needs its own role; ``admin`` (and superusers) hold all.
Driving an attached task is checked per object too: only the person whose token started it
may send its steps (``console.drivers.attached.attached_step``), whatever their roles.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum

from django.contrib.auth.models import AnonymousUser, Group, User


class Role(StrEnum):
    VIEWER = "viewer"
    OPERATOR = "operator"
    RECONCILER = "reconciler"
    APPROVER = "approver"
    AGENT = "agent"
    """An attached agent's process: it drives its own tasks over the step protocol."""
    ADMIN = "admin"


class Capability(StrEnum):
    """What a page may offer and a view must check."""

    READ = "read"
    START = "start"
    STOP = "stop"
    RECONCILE = "reconcile"
    APPROVE = "approve"
    NOTIFY = "notify"
    """Manage where notices go: a channel's URL receives what the console knows (admins)."""
    DRIVE = "drive"
    """Create attached tasks and drive the ones its person started, step by step
    (docs/protocol.md, "Who may do what")."""


GRANTS: dict[Role, frozenset[Capability]] = {
    Role.VIEWER: frozenset({Capability.READ}),
    Role.OPERATOR: frozenset({Capability.READ, Capability.START, Capability.STOP}),
    Role.RECONCILER: frozenset({Capability.READ, Capability.RECONCILE}),
    Role.APPROVER: frozenset({Capability.READ, Capability.APPROVE}),
    Role.AGENT: frozenset({Capability.READ, Capability.DRIVE}),
    Role.ADMIN: frozenset(Capability),
}


def roles_of(user: User | AnonymousUser) -> frozenset[Role]:
    """The roles ``user`` holds (all of them for a superuser)."""
    if not user.is_authenticated or not user.is_active:
        return frozenset()
    if getattr(user, "is_superuser", False):
        return frozenset(Role)
    cached: frozenset[Role] | None = getattr(user, "_loopguard_roles", None)
    if cached is None:
        names = set(user.groups.values_list("name", flat=True))
        cached = remember_roles(user, (role for role in Role if role.value in names))
    return cached


def remember_roles(user: User | AnonymousUser, roles: Iterable[Role]) -> frozenset[Role]:
    """Keep ``user``'s roles, as read with it (one query per request, not per check)."""
    held = frozenset(roles)
    user.__dict__["_loopguard_roles"] = held
    return held


def capabilities_of(user: User | AnonymousUser) -> frozenset[Capability]:
    """Everything ``user`` may do."""
    found: set[Capability] = set()
    for role in roles_of(user):
        found |= GRANTS[role]
    return frozenset(found)


def can(user: User | AnonymousUser, capability: Capability) -> bool:
    return capability in capabilities_of(user)


def ensure_groups() -> list[Group]:
    """Create the role groups if they are missing."""
    return [Group.objects.get_or_create(name=role.value)[0] for role in Role]


def assign(user: User, roles: Iterable[Role]) -> None:
    """Give ``user`` exactly ``roles``."""
    groups = [Group.objects.get_or_create(name=role.value)[0] for role in roles]
    user.groups.set(groups)
    if hasattr(user, "_loopguard_roles"):
        del user._loopguard_roles
