"""The parts one task's guard is made of, made together and shared by its steps.

Each part decides its own rules and keeps what happened to them: the budget (``_budget``),
the loop detector (``_detector``), the settlement of writes against the ledger
(``_settlement``), the record of what was done (``_report``), the approval gate
(``_approval``), the evidence read from results (``_observed``) and the outcome step
(``_outcome``), which asks several of them what one call came to. Beside them: whether a
stop was asked for, and the calls of the current model call.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from ._approval import ApprovalGate, NeedsApproval
from ._budget import Budget
from ._checks import Cancel, Cancellation
from ._detector import Detector
from ._ledger import Ledger
from ._observed import Observer
from ._outcome import OutcomeStep
from ._report import Record
from ._settlement import SettlementStep
from ._ticket import Batch
from ._values import Approval, Limits, Usage

if TYPE_CHECKING:
    from ._ending import Ending

__all__ = ["Parts", "PartsAtHand"]


class Parts:
    """One task's parts (see the module's docstring), each made once."""

    __slots__ = (
        "approvals",
        "batch",
        "budget",
        "cancel",
        "detector",
        "observer",
        "outcome",
        "record",
        "settlement",
    )

    def __init__(
        self,
        limits: Limits,
        ledger: Ledger,
        now: Callable[[], float],
        used: Usage,
        revision: int,
        *,
        nudge: bool,
        cancel: Cancel | None,
        needs_approval: NeedsApproval | None,
        approvals: Iterable[Approval],
    ) -> None:
        self.cancel = Cancellation(cancel)
        self.budget = Budget(limits, now, used)
        self.detector = Detector(limits, revision, nudge=nudge)
        self.settlement = SettlementStep(ledger, self.cancel)
        self.record = Record()
        self.approvals = ApprovalGate(needs_approval, approvals)
        self.observer = Observer(self.budget, self.detector)
        self.outcome = OutcomeStep(self.detector, self.settlement, self.record, self.observer)
        self.batch = Batch()  # the calls of the current model call


class PartsAtHand:
    """The parts (and the ending their refusals go to) as a step of the guard holds them:
    each one its own attribute, since a step runs for every call and none of its lookups
    should go through another object."""

    __slots__ = (
        "_approvals",
        "_batch",
        "_budget",
        "_cancel",
        "_ending",
        "_observer",
        "_outcome",
        "_record",
        "_settlement",
    )

    def __init__(self, parts: Parts, ending: Ending) -> None:
        self._approvals = parts.approvals
        self._batch = parts.batch
        self._budget = parts.budget
        self._cancel = parts.cancel
        self._observer = parts.observer
        self._outcome = parts.outcome
        self._record = parts.record
        self._settlement = parts.settlement
        self._ending = ending
