"""LoopGuard's guard: decide before each model call and tool execution whether it may happen.

Standard library only. The public contract::

    from guard import Guard, Limits, Call, Finish, Result, Evidence, Report, InMemoryLedger

    guard = Guard(Limits(deadline_ms=1000, model_calls=8, requests=8, executions=6),
                  now=clock_ms, wait=sleep_ms, ledger=InMemoryLedger())
    report = guard.run(plan, execute, inspect)
"""

from ._fingerprint import BadArguments, canonical_json, fingerprint
from ._guard import Action, Decision, Guard, Ticket
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

__all__ = [
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
    "Nudge",
    "Operation",
    "OperationState",
    "Reason",
    "Report",
    "Result",
    "Settlement",
    "State",
    "Ticket",
    "Usage",
    "canonical_json",
    "fingerprint",
]
