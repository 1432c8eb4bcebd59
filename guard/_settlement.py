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

from collections.abc import Callable, Mapping
from typing import Any

from ._checks import Cancellation, Refusal, present, settlement, text
from ._ledger import ClaimStatus, Ledger, Operation
from ._values import Call, Evidence, Kind, OperationState, Reason, Result, Settlement, State

__all__ = ["Lookup", "SettlementStep"]

Lookup = Callable[[str], Any]
"""A trusted lookup by operation key; may return a :class:`Settlement`."""

_CONFLICT = Refusal(State.NEEDS_HUMAN, Reason.OPERATION_CONFLICT)
_IN_FLIGHT = Refusal(State.NEEDS_HUMAN, Reason.OPERATION_IN_FLIGHT)
_UNKNOWN = Refusal(State.NEEDS_HUMAN, Reason.UNKNOWN_COMMIT)
_MISSING_KEY = Refusal(State.NEEDS_HUMAN, Reason.MISSING_OPERATION_KEY, named=False)
_NO_ROOM = Refusal(State.PARTIAL, Reason.EXECUTION_BUDGET)
_CANCELLED = Refusal(State.CANCELLED, Reason.OPERATOR_STOP)
_CLAIM_STOPS = {
    ClaimStatus.CONFLICT: _CONFLICT,
    ClaimStatus.IN_FLIGHT: _IN_FLIGHT,
    ClaimStatus.UNKNOWN: _UNKNOWN,
}


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
        return self._peek(key, fp) if look else False

    def _peek(self, key: str, fp: str) -> Refusal | bool:
        try:
            entry = self.ledger.get(key)
        except Exception as exc:
            return Refusal(State.FAILED, Reason.EXECUTOR_ERROR, repr(exc), named=False)
        if entry is None:
            return False
        self.touched[key] = None
        if entry.fingerprint != fp:
            return _CONFLICT
        if entry.state is OperationState.IN_FLIGHT:
            return _IN_FLIGHT
        if entry.state is OperationState.UNKNOWN:
            return _UNKNOWN
        return entry.state is OperationState.COMMITTED

    # -- the executor's entry ------------------------------------------------------------

    def claim(self, key: str, fp: str, *, room: bool) -> Refusal | Operation | None:
        """Claim ``key`` for one execution: ``None`` means this caller owns it and may
        execute; an :class:`Operation` is a committed entry whose result is reused. Without
        ``room`` in the execution budget only a reuse is possible."""
        try:
            if not room:
                entry = self.ledger.get(key)
                if entry is None or not _reusable(entry, fp):
                    return _NO_ROOM
                return entry
            claim = self.ledger.claim(key, fp)
        except Exception as exc:
            if self._cancel.requested():
                # A ledger may refuse the claim because the stop was recorded in the same
                # transaction: that is a cancellation, and nothing was claimed.
                return _CANCELLED
            return Refusal(State.FAILED, Reason.EXECUTOR_ERROR, f"ledger: {exc!r}")
        self.touched[key] = None
        if claim.status is ClaimStatus.COMMITTED:
            return claim.operation
        if claim.status is not ClaimStatus.CLAIMED:
            return _CLAIM_STOPS[claim.status]
        return None

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
    ) -> Refusal | Result:
        """A call's outcome is lost. A write becomes ``UNKNOWN`` unless a trusted lookup
        settles it; with ``settle``, a lookup's "committed" hands back the result to verify."""
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
