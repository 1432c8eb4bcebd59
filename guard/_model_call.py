"""The model-call step: one model call after another, each admitted before it happens, then
its proposal admitted as one batch (or its finish verified), then the wait its calls asked
for.

Before a new model call (or the call a person approved, which needs none) the last batch
must be done: a call still executing was never reported, so its outcome is lost; then the
budget counts the model call (its maximum cost reserved in the spend budget) and a stop
asked for is honoured. The proposal goes to the admission step; a finish to the outcome
step, with the inspector or the evidence read from results.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ._admission import AdmissionStep
from ._checks import Refusal, present
from ._ending import Ending
from ._parts import Parts, PartsAtHand
from ._report import Report
from ._sequence import Inspect
from ._ticket import Status, Ticket
from ._values import Effect, Finish, Nudge, Reason, State

__all__ = ["ModelCallStep"]

_UNPLANNED = "each proposal needs its own before_model() first"
_CANCELLED = Refusal(State.CANCELLED, Reason.OPERATOR_STOP)
_PAST_DEADLINE = Refusal(State.PARTIAL, Reason.DEADLINE)

# Read on every step: bound once here, since looking a member up on its enum costs each time.
_EXECUTING = Status.EXECUTING


class ModelCallStep(PartsAtHand):
    """One task's model calls, one at a time; every answer is ``None`` (go on), what to go
    on with, or the stop report.

    ``planning`` says that a model call was admitted and its proposal is awaited.
    """

    __slots__ = ("_admission", "planning")

    def __init__(self, parts: Parts, ending: Ending, tools: Mapping[str, Effect] | None) -> None:
        super().__init__(parts, ending)
        self._admission = AdmissionStep(parts.budget, parts.detector, parts.settlement, tools)
        self.planning = False

    def start(self, reserve: int) -> Report | None:
        """Check, then count, one model call of maximum cost ``reserve``."""
        if (stop := self._between_calls()) is not None:
            return stop
        budget = self._budget
        refused = budget.start_model_call(reserve)
        if refused is not None:
            detail = ""
            if refused is Reason.SPEND_BUDGET:
                left = budget.remaining().get("spend")
                detail = f"the call may cost {reserve}; {left} left"
            return self._ending.stop(Refusal(State.PARTIAL, refused, detail))
        self.planning = True
        return None

    def approved(self) -> list[Ticket] | Nudge | Report | None:
        """Admit the call a person approved for this phase, once, without a model call."""
        if self._record.report is not None:
            return self._record.report
        call = self._approvals.runnable()
        if call is None:
            return None
        if (stop := self._between_calls()) is not None:
            return stop
        if self._budget.start_unplanned() is not None:
            return self._ending.stop(_PAST_DEADLINE)
        self.planning = True
        return self.admit(call)

    def admit(self, proposal: Any) -> list[Ticket] | Nudge | Report:
        """Admit the calls of the model call's ``proposal``, as one batch."""
        if (report := self._record.report) is not None:
            return report
        if not self.planning:
            raise ValueError(_UNPLANNED)
        self.planning = False  # and the batch is still empty: start() emptied it
        admitted = self._admission.admit(proposal)
        if isinstance(admitted, list):
            self._batch.tickets = admitted
            return admitted
        if isinstance(admitted, Nudge):
            return admitted
        return self._ending.stop(admitted.refusal, admitted)

    def finish(self, finish: Finish, inspect: Inspect | None) -> Report:
        """The model call's answer is a finish: ``COMPLETED`` only if verified."""
        if self._record.report is not None:
            return self._record.report
        if not self.planning:
            raise ValueError(_UNPLANNED)
        self.planning = False
        if inspect is None:
            inspect = self._observer.about(None)
        return self._ending.stop(self._outcome.finish(finish, inspect))

    def pause(self) -> float | Report:
        """Milliseconds to wait before the next model call (0: none), or the stop report."""
        if self._record.report is not None:
            return self._record.report
        pause = self._outcome.wait_ms
        if pause <= 0:
            return 0
        if self._cancel.requested():
            return self._ending.stop(_CANCELLED)
        if self._budget.wait_crosses_deadline(pause):
            detail = f"waiting {pause} ms would cross it"
            return self._ending.stop(Refusal(State.PARTIAL, Reason.DEADLINE, detail))
        return pause

    def halt(self, state: State, reason: Reason, detail: str) -> Report:
        """Stop now for the host's reason: no proposal is awaited any more."""
        state, reason = State(state), Reason(reason)  # refused before anything changes
        if (report := self._record.report) is not None:
            return report
        self.planning = False
        return self._ending.stop(Refusal(state, reason, detail))

    def _between_calls(self) -> Report | None:
        """Before new calls (planned or approved): an execution never reported is lost,
        the last batch is done, a stop asked for is honoured."""
        if self._record.report is not None:
            return self._record.report
        for ticket in self._batch.tickets:
            if ticket.status is _EXECUTING:
                # The caller never reported this execution's outcome: treat it as lost.
                lost = self._outcome.lose(ticket, "no result was reported")
                return self._ending.stop(present(lost), ticket)
        self._batch.tickets = []
        self._outcome.wait_ms = 0
        if self._cancel.requested():
            return self._ending.stop(_CANCELLED)
        return None
