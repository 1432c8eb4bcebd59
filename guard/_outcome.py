"""The outcome step: what each executed or reused call came to, and what the model's finish
came to, as the inspector verifies it.

The inspector's evidence is read first (``_checks.inspected``); a write that ran is then
settled against the ledger with it (``SettlementStep.settle``). A ``FATAL`` or
``PRECONDITION`` result stops the task before anything is observed, the tool's own words in
the stop report's detail; otherwise the detector observes the call (a never-seen read
result beside an inspector counted as exploration, see ``_observed``) and the record keeps
a ``SUCCESS``. Then a verified goal completes the task, stagnation stops it, and a
``RETRYABLE`` or ``PENDING`` result asks for a wait. A call whose outcome was lost
(``lose``) goes to the settlement, which may settle it through a trusted lookup and hand it
back to be verified like any other.
"""

from __future__ import annotations

import json
from typing import Any

from ._checks import Refusal, inspected, positive_ms, present, safe_repr
from ._detector import Detector
from ._observed import Observer
from ._report import Record
from ._sequence import Inspect
from ._settlement import Lookup, SettlementStep
from ._ticket import Status, Ticket
from ._values import Finish, Kind, Reason, Result, State

__all__ = ["OutcomeStep"]

_WAITING = (Kind.RETRYABLE, Kind.PENDING)
_GOAL_MET = Refusal(State.COMPLETED, Reason.GOAL_MET)
_GOAL_UNVERIFIED = Refusal(State.PARTIAL, Reason.GOAL_UNVERIFIED)
_NO_PROGRESS = Refusal(State.PARTIAL, Reason.NO_PROGRESS)
_EXPLORED = "the exploration budget is spent: new results no longer count as progress"
_SAID = 500  # characters of a tool's own words kept in a stop report's detail

# Read on every step: bound once here, since looking a member up on its enum costs each time.
_SUCCESS, _FATAL, _PRECONDITION, _RAN = Kind.SUCCESS, Kind.FATAL, Kind.PRECONDITION, Status.RAN


def _said(tool: str, result: Result) -> str:
    """What a tool said when it stopped the task (a ``FATAL`` or ``PRECONDITION``), for the
    stop report's detail: its name, the kind and its data, bounded."""
    data: Any = result.data
    head = f"{tool} returned {result.kind}"
    if data is None:
        return head
    if not isinstance(data, str):
        try:
            data = json.dumps(data, ensure_ascii=False, sort_keys=True, default=repr)
        except Exception:  # data that cannot describe itself: its type says enough
            data = safe_repr(data)
    return f"{head}: {data[:_SAID]}"


class OutcomeStep:
    """What one task's calls came to: each answer says why the task stops, or ``None``.

    ``wait_ms`` is the longest wait the results of the current model call asked for (the
    guard sets it back to 0 before each model call).
    """

    __slots__ = ("_detector", "_observer", "_record", "_settlement", "wait_ms")

    def __init__(
        self,
        detector: Detector,
        settlement: SettlementStep,
        record: Record,
        observer: Observer | None = None,
    ) -> None:
        self._detector = detector
        self._settlement = settlement
        self._record = record
        self._observer = observer
        self.wait_ms: float = 0

    def verify(
        self,
        ticket: Ticket,
        result: Result,
        inspect: Inspect,
        *,
        settled: bool = False,
        lookup: Lookup | None = None,
    ) -> Refusal | None:
        """Inspect what ``ticket``'s call returned, settle a write that ran (unless a lookup
        has ``settled`` it already), then apply the progress and stop rules."""
        call, fp = ticket.call, ticket.fingerprint
        detector = self._detector
        evidence = inspected(inspect, result, call, detector.revision)
        if call.effect == "write" and ticket.status is _RAN and not settled:
            refused = self._settlement.settle(call, fp, result, evidence, lookup)
            if refused is not None:
                return refused
        if isinstance(evidence, str):
            return Refusal(State.FAILED, Reason.INVALID_EVIDENCE, evidence)
        kind = result.kind
        if kind == _FATAL:
            return Refusal(State.FAILED, Reason.FATAL, _said(call.tool, result))
        if kind == _PRECONDITION:
            # The tool's own words name what is missing: the person who must provide it
            # reads them in the stop report.
            return Refusal(State.NEEDS_HUMAN, Reason.PRECONDITION, _said(call.tool, result))
        observer = self._observer
        gathered = (
            kind == _SUCCESS
            and evidence.revision <= detector.revision
            and observer is not None
            and observer.gathered(ticket, result, inspect)
        )
        stalled = detector.observe(
            call, fp, ticket.poll, kind, evidence.revision, gathered=gathered
        )
        if kind == _SUCCESS:
            reused = ticket.status is Status.REUSED
            self._record.complete(call.tool, fp, call.operation_key, reused, detector.revision)
        if evidence.done:
            return _GOAL_MET
        if stalled:
            if observer is not None and observer.exhausted():
                # Say why new results stopped counting: a grant of "explore" is what helps.
                return Refusal(State.PARTIAL, Reason.NO_PROGRESS, _EXPLORED)
            return _NO_PROGRESS
        if kind in _WAITING:
            wait_ms: Any = result.wait_ms
            if not positive_ms(wait_ms):
                return Refusal(State.FAILED, Reason.INVALID_WAIT, f"wait_ms={wait_ms!r}")
            self.wait_ms = max(self.wait_ms, wait_ms)
        return None

    def lose(
        self,
        ticket: Ticket,
        detail: str,
        lookup: Lookup | None = None,
        inspect: Inspect | None = None,
        reason: Reason = Reason.EXECUTOR_ERROR,
        *,
        transient: bool = False,
    ) -> Refusal | None:
        """``ticket``'s outcome is lost: a lookup may settle a write (then it is verified as
        usual, with ``inspect``; a ``transient`` error it proves harmless is retryable);
        otherwise the task stops, a write left ``UNKNOWN``."""
        ticket.status = Status.RAN
        call, fp, settle = ticket.call, ticket.fingerprint, inspect is not None
        outcome = self._settlement.lose(
            call, fp, detail, lookup, settle=settle, reason=reason, transient=transient
        )
        if isinstance(outcome, Refusal):
            return outcome
        ticket.result = outcome
        return self.verify(ticket, outcome, present(inspect), settled=True)

    def finish(self, finish: Finish, inspect: Inspect) -> Refusal:
        """The model says it is done: the goal is met only if ``inspect`` verifies it."""
        detector = self._detector
        evidence = inspected(inspect, None, finish, detector.revision)
        if isinstance(evidence, str):
            return Refusal(State.FAILED, Reason.INVALID_EVIDENCE, evidence)
        detector.revision = evidence.revision
        return _GOAL_MET if evidence.done else _GOAL_UNVERIFIED
