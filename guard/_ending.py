"""How a task ends: every refusal made into the one stop report, and what may follow it.

Whichever step refuses (the model call, the admission, the entry, the outcome, the host's
own word), the refusal comes to :meth:`Ending.stop` and becomes the stop report: why, about
which call, the batch it stopped, the budget, the verified revision and the operations the
settlement touched. The first stop stands; every later one returns its report. A guard
restored with its history left with the host (``Guard.restore(history=callable)``) asks for
that history here, once, when a report or a whole checkpoint needs it. After a stop for a
budget, the deadline or no progress, one summary turn may follow (``summary_turn``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ._admission import Refused
from ._approval import pending_of
from ._checks import Refusal, safe_repr, text
from ._parts import Parts
from ._report import RESUME_CONDITIONS, SUMMARY_REASONS, Report
from ._ticket import Action, Decision, Ticket
from ._values import Call, Finish, Reason

__all__ = ["Ending"]


class Ending:
    """The end of one task: its stop report, made once, and its one summary turn.

    ``earlier`` is where the history left out of a restored checkpoint is, asked for only
    when a report or a whole checkpoint needs it (``restore(history=callable)``).
    """

    __slots__ = ("_parts", "_summarised", "earlier")

    def __init__(self, parts: Parts) -> None:
        self._parts = parts
        self._summarised = False  # the stop's one summary turn was handed out
        self.earlier: Callable[[], Mapping[str, Any]] | None = None

    def stop(self, refusal: Refusal, subject: Ticket | Refused | None = None) -> Report:
        """Record the terminal state once, about ``subject`` (a ticket, or a call refused
        while it was admitted); later stops return the first report."""
        parts = self._parts
        if parts.record.report is not None:
            return parts.record.report
        self.recall()
        batch = parts.batch.stopped()  # first: the report's call then shows it was not run
        pending = None
        if refusal.reason is Reason.APPROVAL_REQUIRED and isinstance(subject, Ticket):
            pending = pending_of(subject.call, subject.fingerprint)
        return parts.record.close(
            refusal,
            call=None if subject is None else subject.describe(),
            batch=batch,
            budget=parts.budget,
            revision=parts.detector.revision,
            settlement=parts.settlement,
            pending=pending,
        )

    def refuse(self, ticket: Ticket, refusal: Refusal) -> Decision:
        """The ``STOP`` decision for a call refused at its entry, the task stopped."""
        return Decision(Action.STOP, ticket, report=self.stop(refusal, ticket))

    def recall(self, *, strict: bool = False) -> None:
        """Put back the history a restore left with the host (``restore(history=callable)``),
        once, before what was done since. A source that fails is asked again next time; a
        stop report is made without it (``strict=False``: the ledger keeps the truth), a
        whole checkpoint is not (the error goes on)."""
        source = self.earlier
        if source is None:
            return
        try:
            earlier = source()
            touched = [text(key) for key in earlier["touched"]]
            self._parts.record.recall(earlier["completed"])  # checked whole, or nothing moves
        except Exception:
            if strict:
                raise
            return
        self._parts.settlement.recall(touched)
        self.earlier = None

    def summary_turn(self, reserve: int) -> str | None:
        """The prompt of the summary turn after a stop that has one (see
        ``Guard.summary_turn``), handed out once; else ``None``."""
        report = self._parts.record.report
        if report is None or self._summarised or report.reason not in SUMMARY_REASONS:
            return None
        if not self._parts.budget.reserve_past_stop(reserve):
            return None
        self._summarised = True
        return (
            f"The task was stopped ({report.reason}): {RESUME_CONDITIONS[report.reason]} "
            "No tool may be called any more. Tell the user, in a few sentences, what was "
            "done, what was not, and why."
        )

    def record_summary(self, reply: Any, tokens: int, cost: int | None) -> Report:
        """Keep the summary turn's ``reply`` in the stop report, its ``tokens`` and ``cost``
        charged (see ``Guard.record_summary``)."""
        record, budget = self._parts.record, self._parts.budget
        report = record.report
        if report is None or not self._summarised or report.summary is not None:
            raise ValueError("record_summary() needs the summary_turn() of this stop")
        budget.spend_tokens(tokens)
        if cost is not None:
            budget.settle_spend(cost)
        if isinstance(reply, Finish):
            reply = reply.answer
        if isinstance(reply, str):
            summary = reply.strip()
        elif isinstance(reply, Call) or (
            isinstance(reply, list | tuple) and all(isinstance(c, Call) for c in reply)
        ):
            calls = [reply] if isinstance(reply, Call) else list(reply)
            names = ", ".join(str(c.tool) for c in calls)
            summary = f"(the summary turn asked for {names}; no tool may run after a stop)"
        else:
            summary = "" if reply is None else safe_repr(reply)
        return record.summarise(summary, budget)
