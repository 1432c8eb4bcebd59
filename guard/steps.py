"""The guard step by step, for hosts that run their own loop (another agent framework, the
console's runner, an attached client) and for ledgers that store operations elsewhere.

``Guard.run`` is one driver over these steps::

    from guard import Guard
    from guard.steps import Action

    if (stop := guard.before_model()) is not None: ...
    admitted = guard.before_tools(proposal)        # list[Ticket] | Nudge | Report
    for ticket in admitted:
        decision = guard.before_tool(ticket)       # Action.EXECUTE / REUSE / STOP
        ...                                        # run the tool on EXECUTE only
        guard.after_tool(ticket, result, inspect=inspect)
    pause = guard.before_wait()                    # milliseconds to wait, or Report

A ledger implements :class:`guard.Ledger` with :class:`Claim`, :class:`ClaimStatus`,
:class:`Operation` and :class:`LedgerError`, and moves entries only as
:data:`OPERATION_MOVES` allows.
"""

from ._fingerprint import BadArguments, canonical_json, fingerprint
from ._guard import COMPLETED_KEPT, HISTORY, Action, Decision, Ticket
from ._ledger import OPERATION_MOVES, Claim, ClaimStatus, LedgerError, Operation
from ._report import RESUME_CONDITIONS
from ._values import DIMENSIONS, Dimension, Effect

__all__ = [
    "COMPLETED_KEPT",
    "DIMENSIONS",
    "HISTORY",
    "OPERATION_MOVES",
    "RESUME_CONDITIONS",
    "Action",
    "BadArguments",
    "Claim",
    "ClaimStatus",
    "Decision",
    "Dimension",
    "Effect",
    "LedgerError",
    "Operation",
    "Ticket",
    "canonical_json",
    "fingerprint",
]
