"""The step protocol's values as this client writes and reads them (``docs/protocol.md``):
the version it speaks, its bounds, and the guard's values to and from a step's JSON."""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Mapping
from dataclasses import fields as dataclass_fields
from typing import Any

from .._checks import describe, evidence_problem, safe_repr
from .._sequence import Inspect
from .._ticket import Ticket
from .._values import Call, Effect, Finish, Limits, Nudge, Reason, Result
from ._transport import _invalid

PROTOCOL = 1
"""The version of the step protocol this client speaks."""

MAX_CALLS = 64
"""The most calls one ``tools`` step may carry (the protocol's bound)."""

DEFAULT_CLIENT = "guard.remote/1"
"""What the console shows as the task's client when ``start`` is not told."""

_TEXT_LIMIT = 2000  # an error's message, a wrong return value's repr


def _new_lease() -> str:
    """``host:pid:random``: one value per client process (and per guard in it)."""
    host = "".join(c for c in socket.gethostname() if c.isascii() and c.isprintable())
    host = host.replace(":", "-")[:100] or "host"
    return f"{host}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def _effects(tools: Mapping[str, Any]) -> dict[str, Effect]:
    """Tool name → effect, from effects or from :class:`guard.adapters.ToolSpec` values."""
    effects: dict[str, Effect] = {}
    for name, declared in tools.items():
        effect = getattr(declared, "effect", declared)
        if not isinstance(name, str) or effect not in ("read", "write"):
            raise ValueError(f"tool {name!r} must be declared 'read' or 'write', not {effect!r}")
        effects[name] = effect
    return effects


def _limits(limits: Limits | Mapping[str, Any]) -> dict[str, Any]:
    """The limits as the start request carries them (a :class:`Limits` sends every field)."""
    if isinstance(limits, Limits):
        raw = {field.name: getattr(limits, field.name) for field in dataclass_fields(limits)}
    else:
        raw = dict(limits)
    if isinstance(raw.get("exempt"), set | frozenset):
        raw["exempt"] = sorted(raw["exempt"])
    return raw


def _remaining(raw: Any) -> dict[str, int | None]:
    if not isinstance(raw, Mapping):
        raise _invalid(f"remaining is {type(raw).__name__}, not an object")
    left: dict[str, int | None] = {}
    for name, value in raw.items():
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
            raise _invalid(f"remaining {name} is {value!r}, not a count")
        left[str(name)] = value
    return left


def _evidence(inspect: Inspect, result: Result | None, subject: Call | Finish) -> dict[str, Any]:
    """What the local, trusted inspector says, as the protocol's ``evidence``; an inspector
    that raises or answers nonsense is sent as ``{"error"}``, which the console stops
    ``invalid_evidence`` (as the local guard would)."""
    try:
        evidence = inspect(result, subject)
    except Exception as exc:
        return {"error": describe(exc)}
    # Only the types are checked here: the console knows the revision so far.
    problem = evidence_problem(evidence, 0)
    if problem is not None:
        return {"error": problem}
    return {"revision": evidence.revision, "done": evidence.done, "committed": evidence.committed}


def _printable_id(value: Any) -> bool:
    return (
        isinstance(value, str)
        and 0 < len(value) <= 100
        and value.isascii()
        and (value.isprintable() and not value.isspace())
    )


def _task_id(raw: Any, *, given: bool = False) -> int:
    if not isinstance(raw, int) or isinstance(raw, bool) or raw < 1:
        if given:
            raise ValueError(f"task must be a task id, got {raw!r}")
        raise _invalid(f"the task is {raw!r}")
    return raw


def _ticket(raw: Any, calls: list[Call]) -> Ticket:
    """An admitted ticket of the wire (``ticket`` is its index), holding the caller's own
    call: the console answers with the arguments redacted, as it stores them."""
    try:
        ticket = Ticket.from_dict({**raw, "index": raw["ticket"], "result": raw.get("result")})
        ticket.call = calls[ticket.index]
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
        raise _invalid(f"a ticket that cannot be read: {exc!r}") from exc
    return ticket


def _nudge(raw: Any) -> Nudge:
    try:
        return Nudge(
            str(raw["message"]), str(raw["tool"]), str(raw["fingerprint"]), Reason(raw["reason"])
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise _invalid(f"a nudge that cannot be read: {exc!r}") from exc


def _message(error: BaseException) -> str:
    try:
        return str(error)[:_TEXT_LIMIT]
    except Exception:  # an exception that cannot describe itself is still reported
        return ""


def _repr(value: Any) -> str:
    try:
        return repr(value)[:_TEXT_LIMIT]
    except Exception:
        return safe_repr(value)
