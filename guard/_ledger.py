"""The idempotency ledger: one entry per business action of a write tool."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from enum import StrEnum
from types import MappingProxyType
from typing import Any, NamedTuple, Protocol, runtime_checkable

from ._checks import count, text
from ._values import OperationState, Result

__all__ = [
    "CLAIM_ANSWERS",
    "OPERATION_MOVES",
    "SETTLE_MOVES",
    "UNSETTLED",
    "Claim",
    "ClaimStatus",
    "InMemoryLedger",
    "Ledger",
    "LedgerError",
    "Operation",
]


class ClaimStatus(StrEnum):
    """The answer to a claim."""

    CLAIMED = "claimed"  # the caller owns the key now and may execute once
    COMMITTED = "committed"  # already done: reuse ``operation.result``
    CONFLICT = "conflict"  # the key was used for different input
    IN_FLIGHT = "in_flight"  # someone is executing it right now
    UNKNOWN = "unknown"  # it may or may not have happened: a human must settle it
    STOPPING = "stopping"  # the task's stop is recorded: nothing was claimed, nothing may run


OPERATION_MOVES: dict[str, tuple[frozenset[OperationState | None], OperationState]] = {
    # A fresh key (no entry yet), or a key verified not committed, taken for one execution.
    "claim": (frozenset({None, OperationState.NOT_COMMITTED}), OperationState.IN_FLIGHT),
    # The execution's commit verified (by inspect, or by a trusted lookup).
    "record": (frozenset({OperationState.IN_FLIGHT}), OperationState.COMMITTED),
    # The execution's outcome lost: an error, no result, a dead driver.
    "lose": (frozenset({OperationState.IN_FLIGHT}), OperationState.UNKNOWN),
    # Trusted evidence (a lookup, a person) settles an uncertain entry either way.
    "settle_committed": (
        frozenset({OperationState.IN_FLIGHT, OperationState.UNKNOWN}),
        OperationState.COMMITTED,
    ),
    "settle_not_committed": (
        frozenset({OperationState.IN_FLIGHT, OperationState.UNKNOWN}),
        OperationState.NOT_COMMITTED,
    ),
}
"""Every move an operation may make: name -> (states it may leave, the state it reaches).
``None`` is "no entry yet". Nothing else moves an operation; every ledger (in memory,
PostgreSQL, SQLite), recovery and reconciliation go by this table."""

# A claim that cannot take the key leaves the entry as it is; its answer says why.
_REFUSED = {
    OperationState.COMMITTED: ClaimStatus.COMMITTED,
    OperationState.IN_FLIGHT: ClaimStatus.IN_FLIGHT,
    OperationState.UNKNOWN: ClaimStatus.UNKNOWN,
}

CLAIM_ANSWERS: Mapping[OperationState | None, ClaimStatus] = MappingProxyType(
    {
        state: ClaimStatus.CLAIMED if state in OPERATION_MOVES["claim"][0] else _REFUSED[state]
        for state in (None, *OperationState)
    }
)
"""What a claim answers by the state of the key's entry (``None``: no entry yet), when the
entry is of the claim's own fingerprint (another fingerprint is ``CONFLICT`` in any state):
``CLAIMED`` from every state ``OPERATION_MOVES["claim"]`` may leave, else why not. Every
ledger answers by this table."""

SETTLE_MOVES: Mapping[bool, str] = MappingProxyType(
    {True: "settle_committed", False: "settle_not_committed"}
)
"""The move trusted evidence makes, by what it says: committed or not (``resolve``)."""

UNSETTLED = OPERATION_MOVES["settle_committed"][0] | OPERATION_MOVES["settle_not_committed"][0]
"""The states trusted evidence settles: the entry may or may not have happened, and the
task may not go on until it is settled (a stop report's ``uncertain``)."""


class LedgerError(RuntimeError):
    """A ledger transition was asked from a state that does not allow it."""


class Operation(NamedTuple):
    """One ledger entry as it stands now (immutable; a named tuple because it is made on
    every write and must be cheap)."""

    key: str
    fingerprint: str
    state: OperationState
    result: Result | None = None
    attempts: int = 1
    evidence: str = ""

    def to_dict(self) -> dict[str, object]:
        """A JSON-ready form for stop reports."""
        return {
            "key": self.key,
            "state": str(self.state),
            "fingerprint": self.fingerprint,
            "result": None if self.result is None else self.result.to_dict(),
            "attempts": self.attempts,
            "evidence": self.evidence,
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Operation:
        """The entry :meth:`to_dict` describes, rebuilt (a stop report read back from the
        console, say); ``ValueError`` if ``raw`` is not such a description."""
        try:
            result = raw["result"]
            return cls(
                key=text(raw["key"]),
                fingerprint=text(raw["fingerprint"]),
                state=OperationState(raw["state"]),
                result=None if result is None else Result.from_dict(result),
                attempts=count(raw.get("attempts", 1)),
                evidence=text(raw.get("evidence", "")),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ValueError(f"malformed operation: {exc!r}") from exc


class Claim(NamedTuple):
    """What :meth:`Ledger.claim` decided, with the entry it decided on (``None`` only with
    ``STOPPING``: the claim was refused before the entry was looked at)."""

    status: ClaimStatus
    operation: Operation | None = None


@runtime_checkable
class Ledger(Protocol):
    """Storage for operations, shared by every guard that may touch the same business actions.

    ``claim`` must be atomic across everything sharing the ledger: of any number of
    concurrent claims on a fresh key, exactly one gets ``CLAIMED``. Nothing is deleted.

    A ledger that keeps its task's stop fact beside the entries (the console's) answers
    ``STOPPING`` when the stop is recorded as the claim is decided, in the same atomic step:
    a stop either precedes the claim and refuses it, or follows the execution the claim
    allowed. The guard ends the task ``CANCELLED``/``operator_stop`` on that answer.
    """

    def get(self, key: str) -> Operation | None:
        """The entry for ``key``, if any (a read; decides nothing)."""
        ...

    # A ledger may also offer ``get_many(keys) -> dict[str, Operation]``: the guard uses
    # it, when present, to read every operation of a stop report at once.

    def claim(self, key: str, fingerprint: str) -> Claim:
        """Take ``key`` for one execution of ``fingerprint``.

        A fresh key, or a ``NOT_COMMITTED`` one with the same fingerprint, becomes
        ``IN_FLIGHT`` and is ``CLAIMED``. Otherwise the entry is left as it is: the answer
        says why (``CLAIM_ANSWERS``, or ``STOPPING``).
        """
        ...

    def record(self, key: str, fingerprint: str, result: Result) -> Operation:
        """``IN_FLIGHT`` → ``COMMITTED`` with the result to hand to later requests."""
        ...

    def mark_unknown(self, key: str, fingerprint: str) -> Operation:
        """``IN_FLIGHT`` → ``UNKNOWN``: the execution's outcome was lost."""
        ...

    def resolve(
        self, key: str, *, committed: bool, result: Result | None = None, evidence: str = ""
    ) -> Operation:
        """Settle an ``IN_FLIGHT`` or ``UNKNOWN`` entry from trusted evidence."""
        ...


class InMemoryLedger:
    """A ledger in this process's memory, safe to share between threads and guards.

    It gives the same answers as a database ledger but forgets everything when the
    process ends: use it for tests, replays and single-process tools.
    """

    def __init__(self) -> None:
        self._entries: dict[str, Operation] = {}
        self._lock = threading.Lock()

    def get(self, key: str) -> Operation | None:
        """The entry for ``key``, if any."""
        with self._lock:
            return self._entries.get(key)

    def get_many(self, keys: list[str]) -> dict[str, Operation]:
        """The entries for ``keys`` that exist."""
        with self._lock:
            return {key: self._entries[key] for key in keys if key in self._entries}

    def claim(self, key: str, fingerprint: str) -> Claim:
        """Atomically take ``key`` for one execution (see :class:`Ledger`)."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                if entry.fingerprint != fingerprint:
                    return Claim(ClaimStatus.CONFLICT, entry)
                answer = CLAIM_ANSWERS[entry.state]
                if answer is not ClaimStatus.CLAIMED:
                    return Claim(answer, entry)
            # A fresh key (``CLAIM_ANSWERS[None]``), or one the claim may take back.
            attempts, evidence = (1, "") if entry is None else (entry.attempts + 1, entry.evidence)
            entry = Operation(
                key, fingerprint, OPERATION_MOVES["claim"][1], None, attempts, evidence
            )
            self._entries[key] = entry
            return Claim(ClaimStatus.CLAIMED, entry)

    def record(self, key: str, fingerprint: str, result: Result) -> Operation:
        """``IN_FLIGHT`` → ``COMMITTED`` (``OPERATION_MOVES["record"]``)."""
        return self._move(key, fingerprint, "record", result=result)

    def mark_unknown(self, key: str, fingerprint: str) -> Operation:
        """``IN_FLIGHT`` → ``UNKNOWN`` (``OPERATION_MOVES["lose"]``)."""
        return self._move(key, fingerprint, "lose")

    def resolve(
        self, key: str, *, committed: bool, result: Result | None = None, evidence: str = ""
    ) -> Operation:
        """``IN_FLIGHT``/``UNKNOWN`` → ``COMMITTED`` or ``NOT_COMMITTED``
        (``OPERATION_MOVES[SETTLE_MOVES[committed]]``)."""
        kept = result if committed else None
        return self._move(key, None, SETTLE_MOVES[committed], result=kept, evidence=evidence)

    def operations(self) -> list[Operation]:
        """Every entry, in the order the keys were first claimed."""
        with self._lock:
            return list(self._entries.values())

    def _move(
        self,
        key: str,
        fingerprint: str | None,
        move: str,
        *,
        result: Result | None = None,
        evidence: str = "",
    ) -> Operation:
        """``OPERATION_MOVES[move]`` under the lock, or :class:`LedgerError` and no change."""
        sources, state = OPERATION_MOVES[move]
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                raise LedgerError(f"no operation {key!r}")
            if fingerprint is not None and entry.fingerprint != fingerprint:
                raise LedgerError(f"operation {key!r} belongs to another input")
            if entry.state not in sources:
                raise LedgerError(f"operation {key!r} is {entry.state}, cannot become {state}")
            entry = Operation(
                key, entry.fingerprint, state, result, entry.attempts, evidence or entry.evidence
            )
            self._entries[key] = entry
            return entry
