"""The budget: what a task has spent of every dimension in ``DIMENSIONS``, and the checks
before a model call, a request and an execution.

Budgets are cumulative across phases: a budget starts from what earlier phases spent
(:class:`Usage`), and its checkpoint is that usage again.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ._checks import amount, count
from ._values import DIMENSIONS, Dimension, Limits, Reason, Usage

__all__ = ["Budget", "usage_from"]

_BY_USED = {dimension.used: dimension for dimension in DIMENSIONS}
_ELAPSED = "elapsed_ms"  # the one dimension read from the clock instead of counted


def _dimensions(*used: str) -> tuple[Dimension, ...]:
    return tuple(_BY_USED[name] for name in used)


# When each budget is checked; the reason it stops with comes from its Dimension.
_BEFORE_MODEL = _dimensions("tokens", "spend", "model_calls")  # after the deadline
_BEFORE_REQUEST = _dimensions("requests")
_COUNTED = tuple(d.used for d in DIMENSIONS if d.used != _ELAPSED)

Checks = tuple[tuple[str, int, Reason], ...]
"""Budgets to check at one moment: (counter, limit, reason), the unbounded left out."""


def _checks(limits: Limits, dimensions: tuple[Dimension, ...]) -> Checks:
    bounded = ((d, getattr(limits, d.limit)) for d in dimensions)
    return tuple((d.used, limit, d.reason) for d, limit in bounded if limit is not None)


class Budget:
    """The counters of one task and the limits they are checked against.

    Admitting the calls of one model call reserves their executions (``admit_execution``):
    a batch is checked whole before anything runs. Each entry into a tool is then checked
    and counted for real (``entry``, ``enter``), so that a tool's internal retries still
    use up the room of the calls after it.
    """

    __slots__ = (
        "_before_model",
        "_before_request",
        "_deadline",
        "_executions",
        "_now",
        "_reserved",
        "_spend_held",
        "_start",
        "limits",
        "spent",
    )

    def __init__(self, limits: Limits, now: Callable[[], float], used: Usage) -> None:
        self.limits = limits
        self._now = now
        self.spent: dict[str, int] = {name: getattr(used, name) for name in _COUNTED}
        self._start = now() - used.elapsed_ms
        self._deadline = self._start + limits.deadline_ms
        # The checks are read on every step: resolved once, here.
        self._before_model = _checks(limits, _BEFORE_MODEL)
        self._before_request = _checks(limits, _BEFORE_REQUEST)
        self._executions = limits.executions
        self._reserved = 0
        # The spend reserved for the model call in progress; None: no call to settle.
        self._spend_held: int | None = None

    # -- reading -------------------------------------------------------------------------

    def elapsed(self) -> int:
        """Milliseconds spent, including earlier phases."""
        return max(0, int(self._now() - self._start))

    def usage(self) -> Usage:
        """What has been spent, as the public value."""
        return Usage(**self.spent, elapsed_ms=self.elapsed())

    def remaining(self) -> dict[str, int | None]:
        """Budget left per dimension (``None``: unbounded)."""
        return self.limits.remaining(self.usage())

    def entry(self) -> Reason | None:
        """Whether a tool may be entered now: ``DEADLINE`` once the task's time is up, else
        ``EXECUTION_BUDGET`` if one more execution does not fit, else ``None``."""
        if self._now() >= self._deadline:
            return Reason.DEADLINE
        if self.spent["executions"] >= self._executions:  # has_room, inlined
            return Reason.EXECUTION_BUDGET
        return None

    def wait_crosses_deadline(self, pause: float) -> bool:
        """Whether waiting ``pause`` ms would reach the deadline."""
        return pause >= self._deadline - self._now()  # compared, not added: pause may be huge

    # -- checks, each counting what it lets through --------------------------------------

    def start_model_call(self, reserve: int = 0) -> Reason | None:
        """Count one model call and reserve ``reserve`` of the spend budget for it (its
        maximum cost), or say which budget refuses it (the deadline first). Nothing is
        reserved for its calls yet."""
        self._reserved = 0
        if self._now() >= self._deadline:
            return Reason.DEADLINE
        for used, limit, reason in self._before_model:  # read on every step: no call more
            if self.spent[used] >= limit:
                return reason
        if reserve and not self._reserve(reserve):
            return Reason.SPEND_BUDGET
        self._spend_held = reserve
        self.spent["model_calls"] += 1
        return None

    def start_unplanned(self) -> Reason | None:
        """Calls come without a model call (an approved call run as it was asked): nothing
        is reserved for them yet; ``DEADLINE`` once the task's time is up."""
        self._reserved = 0
        return Reason.DEADLINE if self._now() >= self._deadline else None

    def settle_spend(self, cost: int) -> None:
        """The model call's real ``cost`` replaces its reservation (``ValueError`` unless an
        amount, or with no model call to settle: one call is settled once). A cost above
        the reservation is charged too: the money is gone."""
        cost = amount("cost", cost)
        if self._spend_held is None:
            raise ValueError("settle_spend() needs a model call not settled yet")
        self.spent["spend"] += cost - self._spend_held
        self._spend_held = None

    def held(self) -> int | None:
        """The spend reserved for the model call in progress (``None``: none to settle)."""
        return self._spend_held

    def hold(self, reserve: Any) -> None:
        """Take back :meth:`held` from a checkpoint (``ValueError`` unless an amount)."""
        self._spend_held = None if reserve is None else amount("spend_held", reserve)

    def reserve_past_stop(self, reserve: int) -> bool:
        """Reserve the spend of one model call after the task stopped (the summary turn):
        the other budgets no longer apply, the spend budget still does."""
        if not self._reserve(reserve):
            return False
        self._spend_held = reserve
        return True

    def _reserve(self, reserve: int) -> bool:
        """Count ``reserve`` as spent if it fits in the spend budget (``ValueError`` unless
        an amount): spent now and settled after the call, so a crash in between keeps it
        spent."""
        reserve = amount("reserve", reserve)
        spend = self.limits.spend
        if spend is not None and self.spent["spend"] + reserve > spend:
            return False
        self.spent["spend"] += reserve
        return True

    def start_request(self) -> Reason | None:
        """Count one request, or say which budget refuses it."""
        spent = self.spent
        for used, limit, reason in self._before_request:
            if spent[used] >= limit:
                return reason
        spent["requests"] += 1
        return None

    def has_room(self, *, admitting: bool = False) -> bool:
        """Whether one more execution fits (``admitting``: beside those already reserved
        for the calls of this model call admitted so far)."""
        reserved = self._reserved if admitting else 0
        return self.spent["executions"] + reserved < self._executions

    def admit_execution(self) -> bool:
        """Reserve one execution for an admitted call, if it fits."""
        if self.spent["executions"] + self._reserved >= self._executions:  # has_room, inlined
            return False
        self._reserved += 1
        return True

    def enter(self) -> None:
        """Count one real entry into a tool (the caller checked :meth:`entry`)."""
        self.spent["executions"] += 1

    def charge_retries(self, attempts: int) -> None:
        """A tool's own retries beyond its first try are executions too."""
        self.spent["executions"] += attempts - 1

    def spend_tokens(self, tokens: int) -> None:
        """Charge model usage reported by the planner (``ValueError`` unless a count)."""
        self.spent["tokens"] += amount("tokens", tokens)

    def explore(self) -> bool:
        """Spend one of the exploration budget on a never-seen result, if any is left:
        whether that result counts as progress."""
        if self.explore_spent():
            return False
        self.spent["explored"] += 1
        return True

    def explore_spent(self) -> bool:
        """Whether the exploration budget is spent (never, while unbounded)."""
        limit = self.limits.explore
        return limit is not None and self.spent["explored"] >= limit

    def count_polls(self, polls: int) -> None:
        """Charge polls of ``PENDING`` jobs (their per-job bound is the detector's)."""
        self.spent["polls"] += polls

    # -- checkpoint ----------------------------------------------------------------------

    def checkpoint(self) -> dict[str, int]:
        """The budget's part of a checkpoint: what has been spent."""
        return self.usage().to_dict()


def usage_from(raw: Mapping[str, Any]) -> Usage:
    """The :class:`Usage` of a budget's checkpoint part (raises ``TypeError`` if malformed)."""
    return Usage(**{name: count(value) for name, value in raw.items()})
