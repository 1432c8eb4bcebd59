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

:class:`Sequencer` keeps that order for a host and says what comes next (:class:`Next`);
``Guard.run``, ``guard.contrib.langchain`` and ``guard.contrib.openai_agents`` drive it, so a
loop ends the same way under each. It is also where three rules live: a reuse is settled
at its entry, a
tool's exception (every attempt of a retry layer charged) ends the task
``FAILED``/``executor_error``, and a run that ends without the model's final answer ends
``PARTIAL``/``goal_unverified`` (:data:`ENDED_WITHOUT_ANSWER`).

A host that keeps a guard across processes stores ``guard.checkpoint(history=False)`` (of
:data:`CHECKPOINT_VERSION`) and what grows with the phase (:data:`HISTORY`, the latest
:data:`COMPLETED_KEPT` completed requests) elsewhere, and gives both back to
``Guard.restore``. :data:`DIMENSIONS` declares every budget once; :data:`RESUME_CONDITIONS`
says what each stop reason asks of an approver. Calls are told apart by
:func:`fingerprint` (sha256 over the tool and :func:`canonical_json` of the arguments).

A write whose key another execution holds ``IN_FLIGHT`` is not run: ``before_tool`` answers
``REUSE`` with a ``PENDING`` result (wait :data:`IN_FLIGHT_WAIT_MS`, then ask again). A
write whose error :func:`transient_error` (or the guard's ``transient``) calls passing, and
that a trusted lookup proves did not happen, comes back ``RETRYABLE``
(:data:`RETRY_WAIT_MS`) instead of stopping the task.

A ledger implements :class:`guard.Ledger` with :class:`Claim`, :class:`ClaimStatus`,
:class:`Operation` and :class:`LedgerError`, moves entries only as
:data:`OPERATION_MOVES` allows (trusted evidence by :data:`SETTLE_MOVES`) and answers a
claim as :data:`CLAIM_ANSWERS` says; a ledger
that keeps its task's stop fact answers ``ClaimStatus.STOPPING`` once the stop is recorded
(seen in the claim's own atomic step), and the guard ends ``CANCELLED``/``operator_stop``.

A call that ``needs_approval`` says a person must approve stops the task
``NEEDS_HUMAN``/``approval_required`` at the executor's entry, before its claim; the next
phase's guard takes the answers (``approvals``) and runs an approved call first
(``before_approved``) or tells the model of a rejection (``rejection``). ``before_model``
takes the call's maximum cost (``reserve``) and ``settle_spend`` the real one. After a stop
for one of :data:`SUMMARY_REASONS`, ``summary_turn`` hands out one last prompt for a model
call with no tools, and ``record_summary`` keeps its text in the report.

:class:`StepGuard` is the interface a host drives (the local ``Guard`` offers it); the
framework integrations ``guard.contrib.langchain`` and ``guard.contrib.openai_agents`` take any
object that offers it.

A host with no trusted inspector passes ``inspect=None`` to ``after_tool`` and ``finish``
(and ``run``): a never-seen ``SUCCESS`` read result is then progress, drawn from
``Limits.explore``; a ``SUCCESS`` write is committed on the tool's word; a finish is
``goal_unverified`` (docs/guard.md, "Progress without an inspector").
"""

from ._checkpoint import CHECKPOINT_VERSION, HISTORY
from ._checks import transient_error
from ._fingerprint import BadArguments, canonical_json, fingerprint
from ._ledger import (
    CLAIM_ANSWERS,
    OPERATION_MOVES,
    SETTLE_MOVES,
    Claim,
    ClaimStatus,
    LedgerError,
    Operation,
)
from ._protocol import StepGuard
from ._report import COMPLETED_KEPT, RESUME_CONDITIONS, SUMMARY_REASONS
from ._sequence import ENDED_WITHOUT_ANSWER, Next, OutOfOrder, Sequencer, Step
from ._settlement import IN_FLIGHT_WAIT_MS, RETRY_WAIT_MS
from ._ticket import Action, Decision, Ticket
from ._values import DIMENSIONS, Dimension, Effect

__all__ = [
    "CHECKPOINT_VERSION",
    "CLAIM_ANSWERS",
    "COMPLETED_KEPT",
    "DIMENSIONS",
    "ENDED_WITHOUT_ANSWER",
    "HISTORY",
    "IN_FLIGHT_WAIT_MS",
    "OPERATION_MOVES",
    "RESUME_CONDITIONS",
    "RETRY_WAIT_MS",
    "SETTLE_MOVES",
    "SUMMARY_REASONS",
    "Action",
    "BadArguments",
    "Claim",
    "ClaimStatus",
    "Decision",
    "Dimension",
    "Effect",
    "LedgerError",
    "Next",
    "Operation",
    "OutOfOrder",
    "Sequencer",
    "Step",
    "StepGuard",
    "Ticket",
    "canonical_json",
    "fingerprint",
    "transient_error",
]
