"""Plain input checks: what planners, tools, inspectors, lookups and hosts hand the guard.

Planners, tools and inspectors are other people's code, so every value they return is
checked before the guard acts on it. Each check answers with what is wrong (a short text for
the stop report) or ``None``; none of them raises or changes anything. The common case is
tested first in exact types: these checks run on every step.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple, Protocol

from ._values import Call, Effect, Evidence, Kind, Reason, Result, Settlement, State

__all__ = [
    "Cancellation",
    "Refusal",
    "as_calls",
    "count",
    "describe",
    "evidence_problem",
    "inspected",
    "plain",
    "positive_ms",
    "present",
    "result_problem",
    "safe_repr",
    "settlement",
    "text",
]

_KINDS = frozenset(Kind)


class Refusal(NamedTuple):
    """A part's answer that the task must stop: the terminal state, why, and a detail.

    ``named`` says whether the stop report names the refused call's fingerprint (a write
    refused for a missing key or an unreadable ledger never did)."""

    state: State
    reason: Reason
    detail: str = ""
    named: bool = True


class _IsSet(Protocol):
    def is_set(self) -> bool: ...


Cancel = Callable[[], bool] | _IsSet
"""An operator's stop as the host sees it: an event (``is_set()``) or a callable."""


class Cancellation:
    """Whether the task was asked to stop: by :meth:`set`, or by the host's signal.

    Once seen, a stop stays seen; a signal that cannot be read counts as a stop.
    """

    __slots__ = ("_seen", "_signal")

    def __init__(self, signal: Cancel | None) -> None:
        self._signal = signal
        self._seen = False

    def set(self) -> None:
        """Ask for the stop from inside the process."""
        self._seen = True

    def requested(self) -> bool:
        """Whether a stop was asked for (reads the host's signal until one is seen)."""
        if self._seen:
            return True
        signal = self._signal
        if signal is None:
            return False
        try:
            flag = signal.is_set() if not callable(signal) else signal()
        except Exception:
            flag = True  # a cancel signal that cannot be read is not a licence to go on
        if flag:
            self._seen = True
        return bool(flag)


def as_calls(proposal: Any, tools: Mapping[str, Effect] | None) -> list[Call] | str:
    """The proposal as a list of well-formed calls, or what is wrong with it.

    With ``tools`` (name → effect), a call must name a known tool with its real effect: the
    effect of a tool is the application's fact, not the model's claim.
    """
    if (  # the common case, in exact types: one well-formed call
        type(proposal) is Call
        and tools is None
        and type(proposal.tool) is str
        and proposal.tool
        and type(proposal.args) is dict
        and proposal.effect in ("read", "write")
        and (proposal.operation_key is None or type(proposal.operation_key) is str)
    ):
        return [proposal]
    calls: list[Any]
    if isinstance(proposal, Call):
        calls = [proposal]
    elif isinstance(proposal, list | tuple):
        calls = list(proposal)
        if not calls:
            return "an empty list of calls"
    else:
        return f"the planner returned {type(proposal).__name__}, not Call, list or Finish"
    for call in calls:
        if not isinstance(call, Call):  # the list itself may hold anything
            return f"{type(call).__name__} is not a Call"
        # The fields are typed, but planners are other people's code: check them anyway.
        tool: Any = call.tool
        args: Any = call.args
        effect: Any = call.effect
        key: Any = call.operation_key
        if not isinstance(tool, str) or not tool:
            return f"tool {tool!r} is not a non-empty string"
        if not isinstance(args, Mapping):
            return f"args of {tool} is {type(args).__name__}, not an object"
        if effect not in ("read", "write"):
            return f"effect {effect!r} of {tool} is neither 'read' nor 'write'"
        if key is not None and not isinstance(key, str):
            return f"operation_key {key!r} of {tool} is not a string"
        if tools is not None:
            if tool not in tools:
                return f"there is no tool named {tool!r}"
            if tools[tool] != effect:
                return f"{tool} is a {tools[tool]} tool, not a {effect}"
    return calls


def plain(args: Mapping[str, Any]) -> Any:
    """A call's arguments as a dict, as the fingerprint reads them."""
    return args if isinstance(args, dict) else dict(args)


def result_problem(result: Any) -> str | None:
    """What is wrong with a tool's return value as a :class:`Result`, or ``None``."""
    if (
        type(result) is Result
        and type(result.kind) is Kind  # exact type: hashable, and one of the set
        and type(result.attempts) is int
        and result.attempts >= 1
    ):
        return None
    if result is None:
        return "the tool returned no result"
    if not isinstance(result, Result):
        return f"the tool returned {type(result).__name__}, not Result"
    kind: Any = result.kind
    if not isinstance(kind, str) or kind not in _KINDS:
        return f"unknown result kind {safe_repr(kind)}"
    attempts = result.attempts
    if not isinstance(attempts, int) or isinstance(attempts, bool) or attempts < 1:
        return f"attempts {attempts!r} is not a positive int"
    return None


def inspected(
    inspect: Callable[[Result | None, Any], Any], result: Result | None, about: Any, revision: int
) -> Evidence | str:
    """What ``inspect`` verified about ``about`` (a call and its ``result``, or a finish),
    or what is wrong with its answer (or its error), given the verified ``revision`` so far."""
    try:
        evidence = inspect(result, about)
    except Exception as exc:
        return describe(exc)
    if (  # the common case in exact types, tested first: this runs after every request
        type(evidence) is Evidence
        and type(evidence.revision) is int
        and evidence.revision >= revision
        and type(evidence.done) is bool
        and (evidence.committed is None or type(evidence.committed) is bool)
    ):
        return evidence
    problem = evidence_problem(evidence, revision)
    return evidence if problem is None else problem


def evidence_problem(evidence: Any, revision: int) -> str | None:
    """What is wrong with an inspector's answer, given the verified ``revision`` so far."""
    if not isinstance(evidence, Evidence):
        return f"inspect returned {type(evidence).__name__}, not Evidence"
    found = evidence.revision
    if not isinstance(found, int) or isinstance(found, bool):
        return f"revision {found!r} is not an int"
    if found < revision:
        return f"revision went back from {revision} to {found}"
    done: Any = evidence.done
    committed: Any = evidence.committed
    if not isinstance(done, bool):
        return f"done {done!r} is not a bool"
    if committed is not None and not isinstance(committed, bool):
        return f"committed {committed!r} is not a bool or None"
    return None


def settlement(found: Any) -> Settlement | None:
    """A lookup's answer if it is a well-formed :class:`Settlement`, else ``None``
    (a lookup that cannot be read settles nothing)."""
    if not isinstance(found, Settlement) or found.committed not in (True, False, None):
        return None
    if found.result is not None and result_problem(found.result) is not None:
        return None
    return found


def positive_ms(value: Any) -> bool:
    """Whether ``value`` is a wait a tool may ask for: a positive, finite number of ms."""
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return value > 0  # no float conversion: an int may be larger than any float
    return isinstance(value, float) and math.isfinite(value) and value > 0


def safe_repr(value: Any) -> str:
    """A short ``repr`` that never raises."""
    try:
        return repr(value)[:200]
    except Exception:
        return f"<{type(value).__name__}>"


def transient_error(exc: BaseException) -> bool:
    """The guard's default ``transient``: a lost connection or a timeout
    (``ConnectionError``, ``TimeoutError``), which the same call may well not meet again."""
    return isinstance(exc, (ConnectionError, TimeoutError))


def describe(exc: BaseException) -> str:
    """An exception as a line of a stop report (bounded; never raises)."""
    name = type(exc).__name__
    try:
        text = str(exc)
    except Exception:  # an exception that cannot describe itself still stops the task
        text = ""
    return f"{name}: {text[:500]}" if text else name


def amount(name: str, value: Any) -> int:
    """``value`` if it is a non-negative int; ``ValueError`` naming ``name`` otherwise (for
    what a host hands the guard: tokens, a reservation, a cost)."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{name} must be a non-negative int, got {value!r}")
    return value


def count(value: Any) -> int:
    """``value`` if it is a count (a non-negative int); raises ``TypeError`` otherwise."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise TypeError(f"{value!r} is not a count")
    return value


def text(value: Any) -> str:
    """``value`` if it is a string; raises ``TypeError`` otherwise."""
    if not isinstance(value, str):
        raise TypeError(f"{value!r} is not a string")
    return value


def present[T](value: T | None) -> T:
    """``value``, which the guard's own bookkeeping guarantees is set at this point."""
    if value is None:
        raise RuntimeError("guard invariant broken: a value the guard set is missing")
    return value
