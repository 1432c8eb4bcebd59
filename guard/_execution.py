"""The execution step: one admitted call at the executor, its entry and then what it came to.

At the entry a stop asked for is honoured, then the deadline, then the approval gate (after
every other check, before the claim), then a write claims its operation key in the ledger
(``SettlementStep.claim``), which may hand back a committed result instead of a run; a read
needs room for one more execution. What the call came to (its result, the exception it
raised, or the stored result it reused) goes to the outcome step; a host with no inspector
has its evidence read from the results (``_observed``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ._checks import Refusal, describe, present, result_problem
from ._ending import Ending
from ._parts import Parts, PartsAtHand
from ._report import Report
from ._sequence import Inspect
from ._settlement import Lookup
from ._ticket import Action, Decision, Status, Ticket, execute, reuse
from ._values import Reason, Result, State

__all__ = ["ExecutionStep"]

_CANCELLED = Refusal(State.CANCELLED, Reason.OPERATOR_STOP)
_PAST_DEADLINE = Refusal(State.PARTIAL, Reason.DEADLINE)
_NO_ROOM = Refusal(State.PARTIAL, Reason.EXECUTION_BUDGET)

# Read on every step: bound once here, since looking a member up on its enum costs each time.
_EXECUTING, _REUSING, _RAN = Status.EXECUTING, Status.REUSING, Status.RAN
_DEADLINE = Reason.DEADLINE


class ExecutionStep(PartsAtHand):
    """The entries of one task's admitted calls and their outcomes; ``transient`` tells an
    error worth one more try."""

    __slots__ = ("_transient",)

    def __init__(
        self, parts: Parts, ending: Ending, transient: Callable[[BaseException], bool]
    ) -> None:
        super().__init__(parts, ending)
        self._transient = transient

    def enter(self, ticket: Ticket, lookup: Lookup | None) -> Decision:
        """Whether this admitted call may run now: ``EXECUTE``, ``REUSE`` or ``STOP``."""
        if (report := self._record.report) is not None:
            return Decision(Action.STOP, ticket, report=report)
        self._batch.entering(ticket)
        if self._cancel.requested():
            return self._ending.refuse(ticket, _CANCELLED)
        budget = self._budget
        refused = budget.entry()  # the deadline first, then room for one more execution
        if refused is _DEADLINE:
            return self._ending.refuse(ticket, _PAST_DEADLINE)
        call = ticket.call
        if self._approvals.active and (held := self._held(ticket, room=refused is None)):
            return self._ending.refuse(ticket, held)
        if call.effect == "write":
            key = present(call.operation_key)
            claimed = self._settlement.claim(
                key, ticket.fingerprint, room=refused is None, lookup=lookup
            )
            if claimed is not None:
                if isinstance(claimed, Refusal):
                    return self._ending.refuse(ticket, claimed)
                if isinstance(claimed, Result):  # PENDING: another execution holds it
                    return reuse(ticket, claimed)
                return reuse(ticket, claimed.result)
        elif refused is not None:
            return self._ending.refuse(ticket, _NO_ROOM)
        budget.enter()
        return execute(ticket)

    def record(
        self,
        ticket: Ticket,
        result: Any,
        error: BaseException | None,
        inspect: Inspect | None,
        lookup: Lookup | None,
    ) -> Report | None:
        """What one executed (or reused) call came to: the report if the task stops here."""
        record = self._record
        if record.report is not None and ticket.status is not _EXECUTING:
            return record.report
        if inspect is None:
            # The lookup is asked about a write's own SUCCESS; an outcome that was lost
            # meets the lookup in the settlement instead, once.
            returned = error is None and result_problem(result) is None
            inspect = self._observer.about(ticket, lookup if returned else None)
        outcome = self._outcome
        if ticket.status is _REUSING:
            ticket.status = Status.REUSED
            refused = outcome.verify(ticket, present(ticket.result), inspect)
        elif ticket.status is not _EXECUTING:
            raise ValueError("after_tool() needs a ticket that before_tool() let execute")
        elif error is not None:
            ticket.status = _RAN
            if ticket.call.effect != "write" and self._cancel.requested():
                return self._ending.stop(_CANCELLED, ticket)
            transient = self._transient(error)
            refused = outcome.lose(ticket, describe(error), lookup, inspect, transient=transient)
        elif (problem := result_problem(result)) is not None:  # else it is a Result
            refused = outcome.lose(ticket, problem, lookup, inspect, Reason.BAD_RESULT)
        else:
            ticket.status = _RAN
            ticket.result = result
            if result.attempts != 1:
                self._budget.charge_retries(result.attempts)  # the adapter's own retries count too
            refused = outcome.verify(ticket, result, inspect, lookup=lookup)
        # Settled after the task stopped (a batch run at once): the first stop stands.
        return record.report if refused is None else self._ending.stop(refused, ticket)

    def _held(self, ticket: Ticket, *, room: bool) -> Refusal | None:
        """Why an admitted call must wait for (or was refused by) a person, if it must: the
        approval gate, after every other check and before the claim. A write whose key the
        ledger holds committed for this very call only reuses its result: nothing runs, so
        nothing needs approving."""
        if not room:
            return None  # only a reuse could follow, or the stop for the execution budget
        call = ticket.call
        held = self._approvals.check(call, ticket.fingerprint)
        if not isinstance(held, Refusal):
            return None
        if held.reason is Reason.APPROVAL_REQUIRED and call.effect == "write":
            # A write that would only reuse its result, or that the ledger refuses anyway
            # (another input under its key, an uncertain entry), is not a person's to
            # approve: its claim says what becomes of it.
            looked = self._settlement.look(present(call.operation_key), ticket.fingerprint)
            # Only a reuse, or another input under the key (which no answer changes), may
            # skip the gate: a ledger that cannot be read, or an uncertain entry that a
            # reconciler may yet settle "not committed", still waits for a person.
            if looked is True or (
                isinstance(looked, Refusal) and looked.reason is Reason.OPERATION_CONFLICT
            ):
                return None
        return held
