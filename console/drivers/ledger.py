"""The guard's ledger in the database: ``guard.Ledger`` over a task's step store.

Invariant 2 is kept by the store's claim (``console.store``): one atomic statement (or
IMMEDIATE transaction) gated by the task's stop fact and lease. This adapter only speaks
the guard's protocol, redacts what it stores, and lets its driver do three things with the
step in progress: ``carry`` it on the next claim (its save rides on the claim), ``defer``
the next record so that the save after the tool makes it (:meth:`take_record`), and
``assume`` the next claim of a fresh key or record made, so that the step's save makes it
and is made only with it (:meth:`take_assumed`, an attached step's).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

from django.db import DatabaseError

from console.records.redaction import preview, redact
from console.store import Claiming, MoveRefused, Record, Step, StepStore, open_store
from guard import Call, OperationState, Result
from guard.steps import OPERATION_MOVES, SETTLE_MOVES, Claim, ClaimStatus, LedgerError
from guard.steps import Operation as Entry

logger = logging.getLogger(__name__)

_RECORDED = OPERATION_MOVES["record"][1]
"""What a write's record makes of its operation: what one made later, by a save, answers."""

__all__ = ["DatabaseLedger"]


class DatabaseLedger:
    """:class:`guard.Ledger` over ``store`` (by default the database's step store of
    ``task_id`` driven by ``owner``): a claim answers ``STOPPING`` once the task's stop is
    recorded, and raises ``LeaseLost`` once its lease has passed to another driver.
    """

    def __init__(
        self, *, task_id: int = 0, owner: str = "", store: StepStore | None = None
    ) -> None:
        self.store = store if store is not None else open_store(task_id, owner)
        self.unavailable: DatabaseError | None = None
        """The last database failure: the driver must not turn it into a verdict."""
        self.carry: Step | None = None
        """The driver's step so far, saved with the next claim (``Step.saved`` says so)."""
        self.defer = False
        """The driver saves right after the next record: let that save make it."""
        self.record_failed: LedgerError | None = None
        """A deferred record made early (the ledger was read first) could not be made."""
        self.assume = False
        """Take the next claim (as of a fresh key) or record as made without a statement:
        the step's save makes it in its own (``Step.assumes``), and is made only with it;
        refused there, nothing is saved (``MoveRefused``) and the step is run again without
        assuming. For a store that ``carries_moves`` (an attached step's)."""
        self._assumed: Claiming | Record | None = None
        self._refused: MoveRefused | None = None
        self._deferred: Record | None = None
        self._described: dict[str, tuple[str, str]] = {}
        self._claimed: dict[str, tuple[int, str]] = {}  # key: attempts, evidence

    @property
    def task_id(self) -> int:
        return self.store.task_id

    @property
    def owner(self) -> str:
        return self.store.owner

    def describe(self, call: Call, args_preview: str | None = None) -> None:
        """Remember the tool and a redacted preview of the arguments for ``call``'s row
        (``args_preview``: the driver's, when it made one already)."""
        if call.operation_key:
            shown = preview(call.args) if args_preview is None else args_preview
            self._described = {call.operation_key: (call.tool, shown)}

    def take_record(self) -> Record | None:
        """The deferred record, for the driver's save to make (``store.save(record=)``)."""
        record, self._deferred = self._deferred, None
        return record

    def take_assumed(self) -> Claiming | Record | None:
        """The move assumed made, for the driver's save to make (``Step.assumes``);
        :class:`MoveRefused` again once one was refused in this step (the guard may have
        swallowed it, stopping on a ledger error or reporting without the ledger: that
        step must not be saved either)."""
        if self._refused is not None:
            raise self._refused
        assumed, self._assumed = self._assumed, None
        return assumed

    # -- guard.Ledger ----------------------------------------------------------------------

    def get(self, key: str) -> Entry | None:
        self.flush()
        with self._watch():
            return self.store.get(key)

    def get_many(self, keys: list[str]) -> dict[str, Entry]:
        self.flush()
        with self._watch():
            return self.store.get_many(keys)

    def claim(self, key: str, fingerprint: str) -> Claim:
        self.flush()
        tool, args = self._described.get(key, ("", ""))
        if self.assume and self.carry is None:
            # Claimed by the step's save, as a fresh key is: attempt 1, no evidence.
            self._assumed = Claiming(key, fingerprint, tool, args)
            entry = Entry(key, fingerprint, OPERATION_MOVES["claim"][1], None, 1, "")
            return Claim(ClaimStatus.CLAIMED, entry)
        carry, self.carry = self.carry, None  # sent once, whatever happens
        with self._watch():
            claim = self.store.claim(key, fingerprint, tool=tool, args=args, carry=carry)
        if claim.status is ClaimStatus.CLAIMED and claim.operation is not None:
            self._claimed = {key: (claim.operation.attempts, claim.operation.evidence)}
        return claim

    def record(self, key: str, fingerprint: str, result: Result) -> Entry:
        stored = redact(result.to_dict())
        claimed = self._claimed.pop(key, None)
        if self.assume:
            self.flush()
            self._assumed = Record(key, fingerprint, stored)
            # The claim's attempts and evidence stay as they are; a claim made in an
            # earlier step is not read for them (the guard reads neither).
            attempts, evidence = claimed or (1, "")
            return Entry(key, fingerprint, _RECORDED, result, attempts, evidence)
        if self.defer and claimed is not None and self._deferred is None:
            # Made by the driver's save that follows, or by flush() if the ledger is
            # read first.
            self._deferred = Record(key, fingerprint, stored)
            return Entry(key, fingerprint, _RECORDED, result, *claimed)
        self.flush()
        with self._watch():
            return self.store.settle(key, fingerprint, "record", stored)

    def mark_unknown(self, key: str, fingerprint: str) -> Entry:
        self.flush()
        with self._watch():
            try:
                return self.store.settle(key, fingerprint, "lose")
            except LedgerError:
                # Lost already: recovery made it UNKNOWN when its driver's lease ran out,
                # before the guard of the driver's successor settled the call as lost.
                entry = self.store.get(key)
                lost = entry is not None and entry.state is OperationState.UNKNOWN
                if lost and entry is not None and entry.fingerprint == fingerprint:
                    return entry
                raise

    def resolve(
        self, key: str, *, committed: bool, result: Result | None = None, evidence: str = ""
    ) -> Entry:
        self.flush()
        stored = redact(result.to_dict()) if committed and result is not None else None
        with self._watch():
            move = SETTLE_MOVES[committed]
            return self.store.resolve(key, move, result=stored, evidence=evidence)

    # -- helpers ---------------------------------------------------------------------------

    def flush(self) -> None:
        """Make a deferred record or an assumed move now: before the ledger is read, so
        reads see it, and before a write of the driver's own that is not the save carrying
        it (a stop's save, a lone answer). An assumed move that cannot be made as assumed
        (the key was claimed before, the write settled meanwhile) is :class:`MoveRefused`:
        the step was decided on it, and is run again."""
        assumed = self.take_assumed()
        if isinstance(assumed, Claiming):
            with self._watch():
                claim = self.store.claim(
                    assumed.key, assumed.fingerprint, tool=assumed.tool, args=assumed.args
                )
            made = claim.operation
            if claim.status is not ClaimStatus.CLAIMED or made is None or made.attempts != 1:
                self._refused = MoveRefused(f"{assumed.key!r} was not a fresh key to claim")
                raise self._refused
        elif assumed is not None:
            try:
                with self._watch():
                    self.store.settle(assumed.key, assumed.fingerprint, "record", assumed.result)
            except LedgerError as exc:
                self._refused = MoveRefused(str(exc))
                raise self._refused from exc
        record = self.take_record()
        if record is None:
            return
        try:
            with self._watch():
                self.store.settle(record.key, record.fingerprint, "record", record.result)
        except LedgerError as exc:
            self.record_failed = exc

    @contextmanager
    def _watch(self) -> Iterator[None]:
        try:
            yield
        except DatabaseError as exc:
            self.unavailable = exc
            raise
