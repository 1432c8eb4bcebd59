"""What a host drives, step by step: the local :class:`~guard.Guard` offers it, and so will
the remote guard that speaks the console's step protocol. The framework integrations
(``guard.contrib.langchain``, ``guard.contrib.openai_agents``) take any object that offers it."""

from __future__ import annotations

from typing import Any, Protocol

from ._report import Report
from ._sequence import Inspect
from ._settlement import Lookup
from ._ticket import Decision, Ticket
from ._values import Finish, Nudge, Reason, State

__all__ = ["StepGuard", "require_reservation"]


class StepGuard(Protocol):
    """The step-wise guard (see :mod:`guard.steps` for what each step decides)."""

    @property
    def report(self) -> Report | None:
        """The stop report once the guard has stopped, else ``None``."""

    def before_model(self, *, reserve: int = 0) -> Report | None:
        """Check, then count, one model call (reserving its maximum cost)."""

    def settle_spend(self, cost: int) -> None:
        """The last model call's real cost replaces its reservation."""

    def spend_tokens(self, tokens: int) -> None:
        """Charge model usage to the token budget."""

    def before_tools(self, proposal: Any, *, enter: bool = False) -> list[Ticket] | Nudge | Report:
        """Admit the calls of one model call (``enter``: the host enters a one-call
        proposal at once, so its entry may be decided with its admission)."""

    def before_tool(self, ticket: Ticket, *, lookup: Lookup | None = None) -> Decision:
        """Decide at the executor's entry: execute, reuse or stop (``lookup``: the tool's
        trusted lookup, for a write claimed back from ``NOT_COMMITTED``)."""

    def after_tool(
        self,
        ticket: Ticket,  # that before_tool() let execute, or reuse
        result: Any = None,  # what the tool returned (a Result; anything else is bad_result)
        *,
        error: BaseException | None = None,  # or what it raised instead
        inspect: Inspect | None,  # always given: None is the observed-evidence policy
        lookup: Lookup | None = None,  # the tool's trusted lookup by operation key
    ) -> Report | None:
        """Record what one executed (or reused) call returned; the report if it stops here."""

    def before_wait(self) -> float | Report:
        """Milliseconds to wait before the next model call, or the stop report."""

    def finish(self, finish: Finish, inspect: Inspect | None) -> Report:
        """The model says it is done: ``COMPLETED`` only if verified."""

    def planner_failed(self, error: BaseException) -> Report:
        """The model call raised instead of proposing."""

    def halt(self, state: State, reason: Reason, detail: str = "") -> Report:
        """Stop now for a reason found outside the guard."""

    def remaining(self) -> dict[str, int | None]:
        """Budget left per dimension."""


def require_reservation(guard: StepGuard, reserve: int) -> None:
    """Refuse a host that would make paid calls under a spend budget with nothing reserved:
    money is reserved before it is spent (``ValueError`` naming what to pass)."""
    if reserve <= 0 and guard.remaining().get("spend") is not None:
        raise ValueError(
            "the task has a spend budget: pass reserve=, the most one model call may cost "
            "(reserved before each call starts)"
        )
