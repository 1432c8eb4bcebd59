"""LoopGuard's guard: decide before each model call and tool execution whether it may happen.

Standard library only. What an agent developer types::

    from guard import Guard, Limits, Call, Finish, Result, Evidence, Report, InMemoryLedger

    guard = Guard(Limits(deadline_ms=1000, model_calls=8, requests=8, executions=6),
                  now=clock_ms, wait=sleep_ms, ledger=InMemoryLedger())
    report = guard.run(plan, execute, inspect)

A person's answer to a call held for approval comes back as an ``Approval`` for the next
phase's guard; a model's price (``Price``) turns token counts into the spend a call
reserves.

``guard.steps`` holds the step-wise names (for hosts that run their own loop) and what a
ledger implementer needs; ``guard.adapters`` reads the tool calls of OpenAI and Anthropic
replies into ``Call``s and answers them with the results.
"""

from ._guard import Guard
from ._ledger import InMemoryLedger, Ledger
from ._report import Report
from ._values import (
    Approval,
    Call,
    Evidence,
    Finish,
    Kind,
    Limits,
    Nudge,
    OperationState,
    Price,
    Reason,
    Result,
    Settlement,
    State,
    Usage,
)

__all__ = [
    "Approval",
    "Call",
    "Evidence",
    "Finish",
    "Guard",
    "InMemoryLedger",
    "Kind",
    "Ledger",
    "Limits",
    "Nudge",
    "OperationState",
    "Price",
    "Reason",
    "Report",
    "Result",
    "Settlement",
    "State",
    "Usage",
]


def __getattr__(name: str) -> object:
    """A name that left the top level in 0.2 for ``guard.steps`` or ``guard.adapters``: it
    still imports from here, with a ``DeprecationWarning``, until the next minor release."""
    import importlib  # here, so that the package's namespace stays what __all__ says
    import warnings

    for home in ("guard.steps", "guard.adapters"):
        module = importlib.import_module(home)
        if name in module.__all__:
            warnings.warn(
                f"guard.{name} is now {home}.{name}; import it from there",
                DeprecationWarning,
                stacklevel=2,
            )
            return getattr(module, name)
    raise AttributeError(f"module 'guard' has no attribute {name!r}")
