"""The guard's vocabulary: states, reasons, result kinds and the value types it exchanges."""

from __future__ import annotations

import json
import math
import types
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from enum import StrEnum
from typing import Any, Literal, get_args, get_type_hints

__all__ = [
    "Approval",
    "Call",
    "Effect",
    "Evidence",
    "Finish",
    "Kind",
    "Limits",
    "Nudge",
    "OperationState",
    "Price",
    "Reason",
    "Result",
    "Settlement",
    "State",
    "Usage",
]


class State(StrEnum):
    """Terminal state of a task. Once reached it never changes within a guard."""

    COMPLETED = "COMPLETED"
    PARTIAL = "PARTIAL"
    FAILED = "FAILED"
    NEEDS_HUMAN = "NEEDS_HUMAN"
    CANCELLED = "CANCELLED"


class Reason(StrEnum):
    """Why a task stopped. The words are part of the public contract."""

    GOAL_MET = "goal_met"
    GOAL_UNVERIFIED = "goal_unverified"
    DEADLINE = "deadline"
    MODEL_BUDGET = "model_budget"
    REQUEST_BUDGET = "request_budget"
    EXECUTION_BUDGET = "execution_budget"
    TOKEN_BUDGET = "token_budget"  # noqa: S105 - a reason word, not a secret
    POLL_BUDGET = "poll_budget"
    SAME_CALL = "same_call"
    SHORT_CYCLE = "short_cycle"
    NO_PROGRESS = "no_progress"
    PLANNER_ERROR = "planner_error"
    BAD_CALL = "bad_call"
    BAD_ARGS = "bad_args"
    MISSING_OPERATION_KEY = "missing_operation_key"
    OPERATION_CONFLICT = "operation_conflict"
    OPERATION_IN_FLIGHT = "operation_in_flight"
    UNKNOWN_COMMIT = "unknown_commit"
    EXECUTOR_ERROR = "executor_error"
    BAD_RESULT = "bad_result"
    INVALID_EVIDENCE = "invalid_evidence"
    FATAL = "fatal"
    PRECONDITION = "precondition"
    INVALID_WAIT = "invalid_wait"
    OPERATOR_STOP = "operator_stop"
    SPEND_BUDGET = "spend_budget"
    APPROVAL_REQUIRED = "approval_required"
    APPROVAL_REJECTED = "approval_rejected"


class Kind(StrEnum):
    """The closed set of outcomes a tool adapter may report."""

    SUCCESS = "SUCCESS"
    RETRYABLE = "RETRYABLE"
    PENDING = "PENDING"
    PRECONDITION = "PRECONDITION"
    FATAL = "FATAL"


class OperationState(StrEnum):
    """Where one business action of a write tool stands in the ledger."""

    IN_FLIGHT = "IN_FLIGHT"
    UNKNOWN = "UNKNOWN"
    COMMITTED = "COMMITTED"
    NOT_COMMITTED = "NOT_COMMITTED"


Effect = Literal["read", "write"]
"""What a tool does: reads, or writes (a business action, which needs an operation key)."""


@dataclass(frozen=True, slots=True)
class Limits:
    """Budgets for one task, cumulative across its phases.

    ``same`` is how many times one call may be made without verified progress; the next
    identical request is refused. ``stagnant`` is how many requests in a row may go by
    without the revision rising. ``polls`` bounds the polling of one ``PENDING`` job,
    ``tokens`` the model usage reported by the planner (``None``: unbounded), ``spend``
    the money model calls may cost, in an integer minor unit (``None``: unbounded; each
    call's maximum cost is reserved before it starts, see :class:`Price`), ``explore``
    how many never-seen results may count as progress when the host has no trusted
    inspector (``None``: unbounded; see below) and ``max_period`` the longest cycle
    (A→B→…→A→B→…) that is detected.

    ``explore`` is the exploration budget of the observed-evidence policy (``inspect=None``:
    a successful read whose result was never seen before in the task is progress). Its
    default, 20, is half the default request budget: room for a legitimate run of a dozen
    or two distinct pages or searches, while a model that keeps finding something new
    without ever writing or finishing still meets ``no_progress`` long before the request
    budget. Once it is spent new results simply stop counting; the task stops
    ``no_progress`` after ``stagnant`` more requests unless a committed write moves it on.
    Beside the host's own inspector it bounds exploration too: a never-seen ``SUCCESS``
    read that the inspector does not count as progress restarts the no-progress count,
    within ``explore`` (``explore=0``: it never does).

    Each budget's field is the ``limit`` of its :data:`DIMENSIONS` entry and is checked
    from there: a count of at least 0, ``None`` only where its type allows it. The other
    fields (``same``, ``stagnant``, ``max_period``, ``exempt``) are the detector's settings.
    A field of neither kind, or a dimension without its field, stops ``import guard``.
    """

    deadline_ms: int = 60_000
    model_calls: int = 20
    requests: int = 40
    executions: int = 30
    same: int = 2
    stagnant: int = 3
    polls: int = 10
    tokens: int | None = None
    spend: int | None = None
    explore: int | None = 20
    max_period: int = 4
    exempt: frozenset[str] = frozenset()
    """Tools whose identical repetition is legitimate: not checked for repeats or cycles."""

    def __post_init__(self) -> None:
        for dimension in DIMENSIONS:
            value = getattr(self, dimension.limit)
            if value is not None or dimension.limit not in _UNBOUNDED:
                _require_count(dimension.limit, value, minimum=0)
        for name in _AT_LEAST_ONE:
            _require_count(name, getattr(self, name), minimum=1)
        exempt: Any = self.exempt
        if isinstance(exempt, str) or not all(isinstance(t, str) for t in exempt):
            raise TypeError("Limits.exempt must be a collection of tool names")
        object.__setattr__(self, "exempt", frozenset(self.exempt))

    def remaining(self, used: Usage) -> dict[str, int | None]:
        """Budget left per dimension after ``used`` (``None``: that dimension is unbounded),
        keyed by the :class:`Limits` field of each task-wide budget in :data:`DIMENSIONS`."""
        left: dict[str, int | None] = {}
        for dimension in DIMENSIONS:
            if dimension.per_job:
                continue
            limit: int | None = getattr(self, dimension.limit)
            spent: int = getattr(used, dimension.used)
            left[dimension.limit] = None if limit is None else max(0, limit - spent)
        return left


def _require_count(name: str, value: object, *, minimum: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"Limits.{name} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"Limits.{name} must be at least {minimum}, got {value}")


@dataclass(frozen=True, slots=True)
class Usage:
    """What a task has already spent: carried into a new guard when a task resumes."""

    model_calls: int = 0
    requests: int = 0
    executions: int = 0
    tokens: int = 0
    spend: int = 0
    explored: int = 0
    polls: int = 0
    elapsed_ms: int = 0

    def to_dict(self) -> dict[str, int]:
        """The counters as a JSON-ready mapping, one per :data:`DIMENSIONS` entry, in order."""
        return {dimension.used: getattr(self, dimension.used) for dimension in DIMENSIONS}


@dataclass(frozen=True, slots=True)
class Dimension:
    """One budget: what a task spends (a :class:`Usage` field), its limit (a :class:`Limits`
    field), the reason a task stops when it runs out, and its name for people.

    ``per_job`` marks a limit that bounds each ``PENDING`` job rather than the task's total
    (the polls): such a budget has no task-wide "remaining".

    ``stops`` is ``False`` for a budget whose end does not stop the task by itself: the
    exploration budget. Once it is spent new results no longer count as progress, and the
    task stops with its ``reason`` (``no_progress``) only if nothing else moves the revision
    for ``stagnant`` requests. So that reason does not, by itself, mean this budget ran out
    (most ``no_progress`` stops have nothing to do with it): a host that asks for a grant
    of "the budget that ran out" reads it from the stopping dimensions only."""

    used: str
    limit: str
    reason: Reason
    label: str
    per_job: bool = False
    stops: bool = True


DIMENSIONS: tuple[Dimension, ...] = (
    Dimension("model_calls", "model_calls", Reason.MODEL_BUDGET, "model calls"),
    Dimension("requests", "requests", Reason.REQUEST_BUDGET, "requests"),
    Dimension("executions", "executions", Reason.EXECUTION_BUDGET, "executions"),
    Dimension("tokens", "tokens", Reason.TOKEN_BUDGET, "tokens"),
    Dimension("spend", "spend", Reason.SPEND_BUDGET, "spend"),
    Dimension("explored", "explore", Reason.NO_PROGRESS, "new results", stops=False),
    Dimension("polls", "polls", Reason.POLL_BUDGET, "polls", per_job=True),
    Dimension("elapsed_ms", "deadline_ms", Reason.DEADLINE, "time (ms)"),
)
"""Every budget a task has, declared once: the checks of :class:`Limits`, reports,
checkpoints, the console's saves, gauges and metrics derive theirs from this. A budget
also needs its field in :class:`Limits` and :class:`Usage` (named fields, for their users
and for mypy; a test and :func:`_check_dimensions` keep the three in step)."""

_AT_LEAST_ONE = ("same", "stagnant", "max_period")
"""The detector's settings: counts of at least one."""
_SETTINGS = (*_AT_LEAST_ONE, "exempt")
"""The fields of :class:`Limits` that are not a budget of :data:`DIMENSIONS`."""


def _check_dimensions(
    dimensions: Sequence[Dimension], limits: type[Any], usage: type[Any]
) -> frozenset[str]:
    """Raise ``TypeError`` unless ``limits`` has a field for each budget's limit and for
    the detector's settings and no other, and ``usage`` one for each budget's counter, in
    the order of ``dimensions`` (what :meth:`Usage.to_dict` and checkpoints follow). Return
    the limits that may be ``None`` (unbounded): those whose field's type says so."""
    for attribute in ("used", "limit"):
        names = [getattr(d, attribute) for d in dimensions]
        if twice := sorted({name for name in names if names.count(name) > 1}):
            raise TypeError(f"DIMENSIONS declares the {attribute} {twice} more than once")
    declared = [f.name for f in fields(limits)]
    budgets = [d.limit for d in dimensions]
    if missing := [name for name in budgets if name not in declared]:
        raise TypeError(f"DIMENSIONS names limits that Limits has no field for: {missing}")
    if stray := [name for name in declared if name not in (*budgets, *_SETTINGS)]:
        raise TypeError(
            f"Limits has fields that are neither a budget of DIMENSIONS nor a setting: {stray}"
        )
    counters = [f.name for f in fields(usage)]
    if counters != [d.used for d in dimensions]:
        raise TypeError(
            f"Usage's fields {counters} must be the counters of DIMENSIONS, in its order: "
            f"{[d.used for d in dimensions]}"
        )
    hints = get_type_hints(limits)
    return frozenset(name for name in budgets if types.NoneType in get_args(hints[name]))


_UNBOUNDED = _check_dimensions(DIMENSIONS, Limits, Usage)
"""The limits that may be ``None``, read from their fields' types (``int | None``)."""


@dataclass(frozen=True, slots=True)
class Call:
    """One tool call proposed by the model.

    A ``write`` must carry an ``operation_key`` naming the business action (for example
    ``incident-42-first-notice``), never the model's call id.
    """

    tool: str
    args: Mapping[str, Any] = field(default_factory=dict)
    effect: Effect = "read"
    operation_key: str | None = None


@dataclass(frozen=True, slots=True)
class Finish:
    """The model declares the task done. Only verified evidence turns this into ``COMPLETED``."""

    answer: Any = None


@dataclass(frozen=True, slots=True)
class Result:
    """What a tool adapter returns for one execution.

    ``wait_ms`` is required for ``RETRYABLE`` and ``PENDING``. ``attempts`` counts the
    adapter's own internal tries; every one of them is charged to the execution budget.
    """

    kind: Kind | str
    data: Any = None
    wait_ms: int | None = None
    attempts: int = 1

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready form; data that JSON cannot hold is shown as its ``repr``."""
        return {
            "kind": str(self.kind),
            "data": _json_ready(self.data),
            "wait_ms": self.wait_ms,
            "attempts": self.attempts,
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Result:
        """Rebuild a result stored by :meth:`to_dict`."""
        return cls(
            kind=Kind(raw["kind"]),
            data=raw.get("data"),
            wait_ms=raw.get("wait_ms"),
            attempts=int(raw.get("attempts", 1)),
        )


@dataclass(frozen=True, slots=True)
class Evidence:
    """What the application verified from trusted records after a step.

    ``revision`` is the business-progress counter and may only rise; ``done`` says the
    task's goal is met; ``committed`` says whether a write took effect (``None``: unknown).
    """

    revision: int
    done: bool
    committed: bool | None = None


@dataclass(frozen=True, slots=True)
class Settlement:
    """What a tool's ``lookup(operation_key)`` found out about an uncertain write.

    ``committed=None`` means the lookup could not tell; the operation stays ``UNKNOWN``.
    """

    committed: bool | None
    result: Result | None = None
    evidence: str = ""


@dataclass(frozen=True, slots=True)
class Approval:
    """A person's answer to one call the guard held back (a stop report's ``pending``,
    ``NEEDS_HUMAN``/``approval_required``), for the guard of the task's next phase.

    It is bound to the call's ``fingerprint`` and ``operation_key`` and used once: an
    approved call runs (through the ledger, as any call) the first time it is asked for;
    another call, even of the same tool, needs its own. With ``call`` (the exact call, as
    the report's ``pending`` gives it) the guard runs it without asking the model again
    (``Guard.before_approved``). A rejection is told to the model with its ``reason``, and
    the same call asked for again ends the task ``PARTIAL``/``approval_rejected``.
    """

    fingerprint: str
    operation_key: str | None
    approved: bool
    call: Call | None = None
    reason: str = ""
    tool: str = ""


@dataclass(frozen=True, slots=True)
class Price:
    """What a model charges, in the spend budget's minor unit per million tokens.

    ``cost`` rounds up: a reservation is never less than what the call can cost.
    """

    input: int
    output: int

    def __post_init__(self) -> None:
        for name in ("input", "output"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"Price.{name} must be a non-negative int, got {value!r}")

    def cost(self, input_tokens: int, output_tokens: int) -> int:
        """The cost of a call with these token counts, rounded up to a whole minor unit."""
        for name, value in (("input_tokens", input_tokens), ("output_tokens", output_tokens)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{name} must be a non-negative int, got {value!r}")
        total = input_tokens * self.input + output_tokens * self.output
        return -(-total // 1_000_000)


@dataclass(frozen=True, slots=True)
class Nudge:
    """An observation the guard gives the model instead of running a repeated call."""

    message: str
    tool: str
    fingerprint: str
    reason: Reason


def _json_ready(value: Any, depth: int = 0) -> Any:
    """Best effort: keep what JSON can hold, show the rest as text (bounded in depth)."""
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        if depth >= 32:
            return "…"
        if isinstance(value, float) and not math.isfinite(value):
            return str(value)
        if isinstance(value, Mapping):
            return {str(k): _json_ready(v, depth + 1) for k, v in value.items()}
        if isinstance(value, Sequence) and not isinstance(value, str | bytes):
            return [_json_ready(v, depth + 1) for v in value]
        return repr(value)
    return value
