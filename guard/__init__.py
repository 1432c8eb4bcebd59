"""LoopGuard's guard: decide before each model call and tool execution whether it may happen.

Standard library only. The public contract::

    from guard import Guard, Limits, Call, Finish, Result, Evidence, Report, InMemoryLedger

    guard = Guard(Limits(deadline_ms=1000, model_calls=8, requests=8, executions=6),
                  now=clock_ms, wait=sleep_ms, ledger=InMemoryLedger())
    report = guard.run(plan, execute, inspect)

``guard.adapters`` reads the tool calls of OpenAI and Anthropic replies into ``Call``s and
answers them with the results.
"""

from ._fingerprint import BadArguments, canonical_json, fingerprint
from ._guard import COMPLETED_KEPT, Action, Decision, Guard, Ticket
from ._ledger import Claim, ClaimStatus, InMemoryLedger, Ledger, LedgerError, Operation
from ._report import RESUME_CONDITIONS, Report
from ._values import (
    Call,
    Effect,
    Evidence,
    Finish,
    Kind,
    Limits,
    Nudge,
    OperationState,
    Reason,
    Result,
    Settlement,
    State,
    Usage,
)
from .adapters import (
    MalformedModelOutput,
    ToolSpec,
    Turn,
    anthropic_tool_results,
    calls_from_anthropic,
    calls_from_openai,
    openai_tool_messages,
    tool_effects,
)

__all__ = [
    "COMPLETED_KEPT",
    "RESUME_CONDITIONS",
    "Action",
    "BadArguments",
    "Call",
    "Claim",
    "ClaimStatus",
    "Decision",
    "Effect",
    "Evidence",
    "Finish",
    "Guard",
    "InMemoryLedger",
    "Kind",
    "Ledger",
    "LedgerError",
    "Limits",
    "MalformedModelOutput",
    "Nudge",
    "Operation",
    "OperationState",
    "Reason",
    "Report",
    "Result",
    "Settlement",
    "State",
    "Ticket",
    "ToolSpec",
    "Turn",
    "Usage",
    "anthropic_tool_results",
    "calls_from_anthropic",
    "calls_from_openai",
    "canonical_json",
    "fingerprint",
    "openai_tool_messages",
    "tool_effects",
]
