"""The settlement step: each write against the :class:`Ledger`, from admission to its
recorded outcome.

A write is looked at when it is admitted (``admit``: the same key twice in one model call,
or an entry that already blocks it), claimed at the executor's entry (``claim``: the one
atomic decision that it may run), and settled after it ran (``settle``): committed,
verified not committed, or ``UNKNOWN`` when the inspector's answer cannot be read or —
its outcome lost — unless a trusted lookup settles it (``lose``). Every key it touched is
remembered for the stop report.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ._checks import Cancellation, Refusal, present, settlement, text
from ._ledger import ClaimStatus, Ledger, Operation
from ._values import Call, Evidence, Kind, OperationState, Reason, Result, Settlement, State

__all__ = ["IN_FLIGHT_WAIT_MS", "RETRY_WAIT_MS", "Lookup", "SettlementStep"]

Lookup = Callable[[str], Any]
"""A trusted lookup by operation key; may return a :class:`Settlement`."""

_CONFLICT = Refusal(State.NEEDS_HUMAN, Reason.OPERATION_CONFLICT)
_UNKNOWN = Refusal(State.NEEDS_HUMAN, Reason.UNKNOWN_COMMIT)
_MISSING_KEY = Refusal(State.NEEDS_HUMAN, Reason.MISSING_OPERATION_KEY, named=False)
_NO_ROOM = Refusal(State.PARTIAL, Reason.EXECUTION_BUDGET)
_CANCELLED = Refusal(State.CANCELLED, Reason.OPERATOR_STOP)
_CLAIM_STOPS = {
    ClaimStatus.CONFLICT: _CONFLICT,
    ClaimStatus.UNKNOWN: _UNKNOWN,
    # The ledger found the task's stop recorded as it decided: nothing was claimed.
    ClaimStatus.STOPPING: _CANCELLED,
}
IN_FLIGHT_WAIT_MS = 1000
"""How long a write waits before asking again for an operation another execution holds."""
RETRY_WAIT_MS = 200
"""How long a write waits before its retry after a transient error proved harmless."""


class SettlementStep:
    """One task's writes against a (possibly shared) ledger."""

    __slots__ = ("_batch", "_cancel", "ledger", "touched")

    def __init__(self, ledger: Ledger, cancel: Cancellation) -> None:
        self.ledger = ledger
        self._cancel = cancel
        self.touched: dict[str, None] = {}  # operation keys, in first-touched order
        self._batch: dict[str, str] = {}  # key -> fingerprint in the model call being admitted

    # -- admission -----------------------------------------------------------------------

    def begin_batch(self) -> None:
        """The calls of a new model call of several calls are about to be admitted."""
        if self._batch:
            self._batch = {}

    def admit(self, call: Call, fp: str, *, look: bool, batch: bool) -> Refusal | bool:
        """Admit one write: ``True`` if it will reuse a committed result, else ``False``, or
        why it must not run. ``look`` reads the ledger now (a batch is checked whole before
        anything runs; one call alone meets the same answers at its claim). In a ``batch``
        (after :meth:`begin_batch`) the same key may come twice."""
        key = call.operation_key
        if not key:
            return _MISSING_KEY
        if batch:
            keys = self._batch
            if key in keys:
                # A second request for the same action in one model call: it will meet the
                # first one's ledger entry and reuse its result.
                return True if keys[key] == fp else _CONFLICT
            keys[key] = fp
        return self.look(key, fp) if look else False

    def look(self, key: str, fp: str) -> Refusal | bool:
        """What the ledger holds for ``key`` now: ``True`` if this very call (``fp``) is
        committed and would be reused, ``False`` if it may be claimed, else why not."""
        try:
            entry = self.ledger.get(key)
        except Exception as exc:
            return Refusal(State.FAILED, Reason.EXECUTOR_ERROR, repr(exc), named=False)
        if entry is None:
            return False
        self.touched[key] = None
        if entry.fingerprint != fp:
            return _CONFLICT
        # IN_FLIGHT: another execution holds it; the claim meets it and waits.
        if entry.state is OperationState.UNKNOWN:
            return _UNKNOWN
        return entry.state is OperationState.COMMITTED

    # -- the executor's entry ------------------------------------------------------------

    def claim(
        self, key: str, fp: str, *, room: bool, lookup: Lookup | None = None
    ) -> Refusal | Operation | Result | None:
        """Claim ``key`` for one execution: ``None`` means this caller owns it and may
        execute; an :class:`Operation` is a committed entry whose result is reused. Without
        ``room`` in the execution budget only a reuse is possible.

        Held ``IN_FLIGHT`` by another execution (another task, worker or thread), it is a
        ``PENDING`` :class:`Result` to hand the model instead: nothing runs, the model asks
        again after ``wait_ms`` like any pending job (the poll budget and the deadline
        bound the wait), and meets the settled entry then: committed, its result is reused;
        verified not committed, it is claimed; uncertain, the task stops for a human.

        Claiming back a ``NOT_COMMITTED`` entry (a retry) asks ``lookup`` once more first: if
        the business system has the action after all (the evidence that it had not was
        wrong), nothing runs, the entry is ``UNKNOWN`` and the task stops for a human."""
        try:
            if not room:
                entry = self.ledger.get(key)
                if entry is None or not _reusable(entry, fp):
                    return _NO_ROOM
                return entry
            claim = self.ledger.claim(key, fp)
        except Exception as exc:
            return Refusal(State.FAILED, Reason.EXECUTOR_ERROR, f"ledger: {exc!r}")
        if claim.status is ClaimStatus.STOPPING:
            self._cancel.set()  # the stop the ledger saw stands for every later check too
            return _CLAIM_STOPS[claim.status]
        self.touched[key] = None
        if claim.status is ClaimStatus.COMMITTED:
            return present(claim.operation)
        if claim.status is ClaimStatus.IN_FLIGHT:
            return in_flight_elsewhere(key)
        if claim.status is not ClaimStatus.CLAIMED:
            return _CLAIM_STOPS[claim.status]
        if lookup is not None and claim.operation is not None and claim.operation.attempts > 1:
            found = look_up(lookup, key)
            if found is not None and found.committed is True:
                detail = (
                    "the lookup finds the action that was marked not committed; it was not "
                    "run again"
                )
                return self._unknown(key, fp, detail, Reason.UNKNOWN_COMMIT)
        return None

    def in_flight(self, key: str) -> bool:
        """Whether ``key`` is ``IN_FLIGHT`` now (False if the ledger cannot say)."""
        try:
            entry = self.ledger.get(key)
        except Exception:
            return False
        return entry is not None and entry.state is OperationState.IN_FLIGHT

    # -- after the execution -------------------------------------------------------------

    def settle(
        self, call: Call, fp: str, result: Result, evidence: Evidence | str, lookup: Lookup | None
    ) -> Refusal | None:
        """Write the commit state the inspector verified (or a lookup found) to the ledger.
        An inspector's answer that cannot be read (``evidence`` is what is wrong with it)
        leaves the write ``UNKNOWN``: only a human can tell whether it took effect."""
        key = present(call.operation_key)
        if isinstance(evidence, str):
            return self._unknown(key, fp, evidence, Reason.INVALID_EVIDENCE)
        committed = evidence.committed
        if committed is None and lookup is not None:
            found = look_up(lookup, key)
            if found is not None and found.committed is not None:
                committed = found.committed
        try:
            if committed is True:
                self.ledger.record(key, fp, result)
                return None
            if committed is False and result.kind != Kind.SUCCESS:
                self.ledger.resolve(key, committed=False, evidence="verified by inspect")
                return None
        except Exception as exc:
            return Refusal(State.NEEDS_HUMAN, Reason.UNKNOWN_COMMIT, f"ledger: {exc!r}")
        if committed is False:
            # The tool says it succeeded, the records say nothing happened: nobody knows.
            return self._unknown(key, fp, "SUCCESS but not committed", Reason.INVALID_EVIDENCE)
        return self._unknown(key, fp, "commit not verified", Reason.UNKNOWN_COMMIT)

    def lose(
        self,
        call: Call,
        fp: str,
        detail: str,
        lookup: Lookup | None,
        *,
        settle: bool,
        reason: Reason = Reason.EXECUTOR_ERROR,
        transient: bool = False,
    ) -> Refusal | Result:
        """A call's outcome is lost. A write becomes ``UNKNOWN`` unless a trusted lookup
        settles it; with ``settle``, a lookup's "committed" hands back the result to verify.

        A write the lookup proves did not happen is ``NOT_COMMITTED``: the task stops, unless
        the error was ``transient`` (a connection lost, a timeout): then it is a
        ``RETRYABLE`` result, and the model's next request for it claims it again, within
        the budget and the repeat limit like any retry."""
        key = call.operation_key
        if call.effect != "write" or key is None:
            return Refusal(State.FAILED, reason, detail)
        found = look_up(lookup, key) if lookup is not None else None
        if found is None or not (found.committed is False or (found.committed is True and settle)):
            return self._unknown(key, fp, detail, reason)
        if self._cancel.requested():
            reason = Reason.OPERATOR_STOP  # why it stopped; the write's fate is in the ledger
        try:
            if found.committed:
                result = found.result or Result(Kind.SUCCESS)
                self.ledger.resolve(key, committed=True, result=result, evidence=found.evidence)
                return result
            self.ledger.resolve(key, committed=False, evidence=found.evidence)
            if transient and reason is not Reason.OPERATOR_STOP:
                return Result(
                    Kind.RETRYABLE,
                    {"operation_key": key, "error": detail, "committed": False},
                    wait_ms=RETRY_WAIT_MS,
                )
            state = State.CANCELLED if reason is Reason.OPERATOR_STOP else State.FAILED
            return Refusal(state, reason, detail)
        except Exception as exc:
            return Refusal(State.NEEDS_HUMAN, reason, f"{detail}; ledger: {exc!r}")

    def _unknown(self, key: str, fp: str, detail: str, reason: Reason) -> Refusal:
        """Nobody knows whether the write took effect: ``UNKNOWN``, for a human."""
        if self._cancel.requested():
            reason = Reason.OPERATOR_STOP  # why it stopped; the write's fate is in the ledger
        try:
            self.ledger.mark_unknown(key, fp)
        except Exception as exc:
            detail = f"{detail}; ledger: {exc!r}"
        return Refusal(State.NEEDS_HUMAN, reason, detail)

    # -- the report and the checkpoint ---------------------------------------------------

    def operations(self) -> list[Operation]:
        """The current entries of every operation this task touched."""
        keys = list(self.touched)
        if not keys:
            return []
        get_many = getattr(self.ledger, "get_many", None)  # optional: one read for all
        try:
            if callable(get_many):
                found = get_many(keys)
                return [found[key] for key in keys if key in found]
            return [entry for key in keys if (entry := self.ledger.get(key)) is not None]
        except Exception:  # the report must still be made; the ledger keeps the truth
            return []

    def checkpoint(self, *, history: bool = True) -> dict[str, Any]:
        """The settlement's part of a checkpoint: the keys touched, in order (history: see
        ``HISTORY``; without it, nothing, and nothing that grows with the phase is copied)."""
        return {"touched": list(self.touched)} if history else {}

    def load(self, raw: Mapping[str, Any]) -> None:
        """Take back a part made by :meth:`checkpoint` (``TypeError``/``KeyError`` if not)."""
        self.touched = {text(key): None for key in raw["touched"]}

    def recall(self, touched: Iterable[str]) -> None:
        """Put the keys touched before a restore back ahead of those touched since."""
        earlier = {text(key): None for key in touched}
        self.touched = earlier | self.touched


def in_flight_elsewhere(key: str) -> Result:
    """What a write gets instead of running while another execution holds its key."""
    return Result(
        Kind.PENDING,
        {"operation_key": key, "in_flight": "another execution of this operation is running"},
        wait_ms=IN_FLIGHT_WAIT_MS,
    )


def look_up(lookup: Lookup, key: str) -> Settlement | None:
    """Ask a trusted lookup about ``key``; a lookup that fails or answers oddly settles
    nothing."""
    try:
        found = lookup(key)
    except Exception:
        return None
    return settlement(found)


def _reusable(entry: Operation, fp: str) -> bool:
    return entry.state is OperationState.COMMITTED and entry.fingerprint == fp
