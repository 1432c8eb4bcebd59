"""The guard's ledger in the database: one row per operation key, claimed atomically.

Invariant 2 lives here. A claim is one ``INSERT … ON CONFLICT … DO UPDATE … WHERE``
statement: of any number of concurrent claims on a fresh key exactly one inserts, and a
``NOT_COMMITTED`` entry is taken back by compare-and-set. The claim runs in the same short
transaction that checks the task's stop fact and lease, holding the task row ``FOR SHARE``
so that a stop committed by an operator either precedes the claim (and is seen) or waits
for it (and the execution it allows was decided before the stop). No tool runs inside any
of these transactions. Every transition also writes an ``OperationEvent``; nothing is
deleted.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from typing import Any

from django.db import DatabaseError, connection, transaction
from django.utils import timezone

from guard import Call, Claim, ClaimStatus, LedgerError, Result
from guard import Operation as Entry
from guard import OperationState as State

from .models import Operation, OperationEvent
from .redaction import preview, redact
from .statements import fetch_one

logger = logging.getLogger(__name__)


class StopRecorded(RuntimeError):
    """The task's stop is recorded: no new claim may be taken for it."""


class LeaseLost(RuntimeError):
    """Another driver holds the task now: this one must not touch it any more."""


# One statement decides the claim. The WHERE of DO UPDATE makes the reclaim of a
# NOT_COMMITTED key a compare-and-set; any other existing row is left as it is and no
# row comes back. Portable SQL (SQLite 3.35+ has upsert and RETURNING): the time is a
# parameter, since SQLite has no now().
_CLAIM = """
INSERT INTO console_operation
    (key, fingerprint, state, tool, task_id, args_preview, result, attempts, evidence,
     claimed_at, updated_at)
VALUES (%s, %s, 'IN_FLIGHT', %s, %s, %s, NULL, 1, '', %s, %s)
ON CONFLICT (key) DO UPDATE
    SET state = 'IN_FLIGHT', attempts = console_operation.attempts + 1,
        task_id = EXCLUDED.task_id, result = NULL, updated_at = EXCLUDED.updated_at
    WHERE console_operation.state = 'NOT_COMMITTED'
      AND console_operation.fingerprint = EXCLUDED.fingerprint
RETURNING id, attempts
"""

# PostgreSQL: the gate, the claim and its history row in one statement (one round trip,
# atomic on its own). ``{gate}`` is a CTE named ``saved`` giving the task row's stop fact
# and lease owner while holding a lock on the row, so that the stop service's update
# waits for the claim: either ``_GATE_CTE`` (FOR SHARE) or the driver's save of the step
# so far (console.runner.save_ctes: its UPDATE of the row, and the step's trace events),
# which then commits with the claim. A stop committed before the gate is seen there and
# nothing is claimed.
_CLAIM_PG = """
WITH {gate}, claimed AS (
    INSERT INTO console_operation
        (key, fingerprint, state, tool, task_id, args_preview, result, attempts, evidence,
         claimed_at, updated_at)
    SELECT %s, %s, 'IN_FLIGHT', %s, %s, %s, NULL, 1, '', %s, %s
    FROM saved WHERE saved.stop_requested_at IS NULL AND saved.lease_owner = %s
    ON CONFLICT (key) DO UPDATE
        SET state = 'IN_FLIGHT', attempts = console_operation.attempts + 1,
            task_id = EXCLUDED.task_id, result = NULL, updated_at = EXCLUDED.updated_at
        WHERE console_operation.state = 'NOT_COMMITTED'
          AND console_operation.fingerprint = EXCLUDED.fingerprint
    RETURNING id, attempts, evidence
), history AS (
    INSERT INTO console_operationevent (operation_id, at, from_state, to_state, task_id,
                                        evidence)
    SELECT id, %s, CASE WHEN attempts = 1 THEN '' ELSE 'NOT_COMMITTED' END,
           'IN_FLIGHT', %s, ''
    FROM claimed
)
SELECT saved.stop_requested_at, saved.lease_owner, claimed.id, claimed.attempts,
       claimed.evidence
FROM saved LEFT JOIN claimed ON true
"""
_GATE_CTE = (
    "saved AS (SELECT stop_requested_at, lease_owner FROM console_task WHERE id = %s FOR SHARE)"
)

# PostgreSQL: an IN_FLIGHT operation settled (to ``target``) with its history row, as CTEs:
# ``moved`` has a row if and only if the move was made. On its own (``_MOVE_PG``), or in
# the driver's save after the tool, so that a write's record commits with its step.
MOVE_CTES = """moved AS (
    UPDATE console_operation SET state = %s, result = %s, updated_at = %s
    WHERE key = %s AND fingerprint = %s AND state = 'IN_FLIGHT'
    RETURNING id, attempts, evidence
), history AS (
    INSERT INTO console_operationevent (operation_id, at, from_state, to_state, task_id,
                                        evidence)
    SELECT id, %s, 'IN_FLIGHT', %s, %s, '' FROM moved
)"""
_MOVE_PG = f"WITH {MOVE_CTES} SELECT attempts, evidence FROM moved"  # noqa: S608 - constants

# SQLite: no row locks; its IMMEDIATE transactions serialise writers instead.
_GATE = "SELECT stop_requested_at, lease_owner FROM console_task WHERE id = %s"

_CLAIM_ANSWERS = {
    State.COMMITTED: ClaimStatus.COMMITTED,
    State.IN_FLIGHT: ClaimStatus.IN_FLIGHT,
    State.UNKNOWN: ClaimStatus.UNKNOWN,
}


def entry_of(row: Operation) -> Entry:
    """The guard's view of an operation row."""
    return Entry(
        key=row.key,
        fingerprint=row.fingerprint,
        state=State(row.state),
        result=None if row.result is None else Result.from_dict(row.result),
        attempts=row.attempts,
        evidence=row.evidence,
    )


class DatabaseLedger:
    """:class:`guard.Ledger` over ``console_operation``, bound to one task and its driver.

    ``owner`` is the lease holder driving the task; claims are refused once the task's
    stop is recorded or its lease has passed to another driver.
    """

    def __init__(self, *, task_id: int, owner: str) -> None:
        self.task_id = task_id
        self.owner = owner
        self.unavailable: DatabaseError | None = None
        """The last database failure: the driver must not turn it into a verdict."""
        self.stop_recorded = False
        """A claim found the task's stop recorded (and claimed nothing)."""
        self._described: dict[str, tuple[str, str]] = {}
        self._carried: tuple[str, list[Any]] | None = None
        self._carried_row: tuple[Any, ...] | None = None
        self.defer_record = False
        """The driver saves right after the next record: let that save make it."""
        self.record_failed: LedgerError | None = None
        """A deferred record could not be made: the operation had left ``IN_FLIGHT``."""
        self._deferred: tuple[str, str, Any] | None = None
        self._claimed: dict[str, tuple[int, str]] = {}  # key: attempts, evidence

    def take_deferred(self) -> tuple[str, list[Any]] | None:
        """The deferred record as ``MOVE_CTES`` and their parameters, for the driver's
        save; the driver reports back with :meth:`deferred_done`."""
        if self._deferred is None:
            return None
        key, fingerprint, stored = self._deferred
        return MOVE_CTES, self._move_params(key, fingerprint, State.COMMITTED, stored)

    def deferred_done(self, made: bool) -> None:
        """The save carrying the deferred record committed; ``made``: it moved the row."""
        if self._deferred is not None and not made:
            self.record_failed = self._why_not(
                self._deferred[0], self._deferred[1], State.COMMITTED
            )
        self._deferred = None

    def rescue_deferred(self) -> None:
        """The save carrying the deferred record failed on the database: make the record
        on its own, on a new connection, if the database answers; keep quiet if not."""
        if self._deferred is None:
            return
        key = self._deferred[0]
        try:
            connection.close()
            self.flush()
        except DatabaseError:
            logger.warning("task %s: %s could not be recorded; recovery will see it", self.task_id,
                           key)

    def flush(self) -> None:
        """Make a deferred record now: before the ledger is read, so reads see it."""
        if self._deferred is None:
            return
        key, fingerprint, stored = self._deferred
        self._deferred = None
        try:
            self._settle_in_flight(key, fingerprint, State.COMMITTED, stored)
        except LedgerError as exc:
            self.record_failed = exc

    def carry(self, ctes: str, params: list[Any]) -> None:
        """Send the driver's save with the next claim, as its gate (see ``_CLAIM_PG``).

        PostgreSQL only. :meth:`carried` says whether a claim took it.
        """
        self._carried, self._carried_row = (ctes, params), None

    def carried(self) -> tuple[Any, ...] | None:
        """The ``saved`` row of the save given to :meth:`carry` if a claim committed it
        (None if no claim ran, or it failed); forgets the save either way."""
        row, self._carried, self._carried_row = self._carried_row, None, None
        return row

    def describe(self, call: Call) -> None:
        """Remember the tool and a redacted preview of the arguments for ``call``'s row."""
        if call.operation_key:
            self._described[call.operation_key] = (call.tool, preview(call.args))

    def get(self, key: str) -> Entry | None:
        self.flush()
        with self._watch():
            row = Operation.objects.filter(key=key).first()
        return None if row is None else entry_of(row)

    def get_many(self, keys: list[str]) -> dict[str, Entry]:
        self.flush()
        with self._watch():
            return {row.key: entry_of(row) for row in Operation.objects.filter(key__in=keys)}

    def claim(self, key: str, fingerprint: str) -> Claim:
        self.flush()
        with self._watch():
            return self._claim(key, fingerprint)

    @contextmanager
    def _watch(self) -> Iterator[None]:
        try:
            yield
        except DatabaseError as exc:
            self.unavailable = exc
            raise

    def _claim(self, key: str, fingerprint: str) -> Claim:
        if connection.vendor == "postgresql":
            return self._claim_pg(key, fingerprint)
        tool, args = self._described.get(key, ("", ""))
        # Stored the way the ORM stores it (SQLite compares times as text).
        now = connection.ops.adapt_datetimefield_value(timezone.now())
        # On SQLite the transaction begins IMMEDIATE (settings): it holds the database's
        # write lock from the gate to the claim, so the stop service's update waits for
        # it, as it waits for the share lock on PostgreSQL. A stop is either visible here
        # or lands after the claim it could not prevent.
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(_GATE, [self.task_id])
            gate = cursor.fetchone()
            if gate is None:
                raise LeaseLost(f"task {self.task_id} does not exist")
            stop_requested_at, lease_owner = gate
            if stop_requested_at is not None:
                self.stop_recorded = True
                raise StopRecorded(f"task {self.task_id} is stopping")
            if lease_owner != self.owner:
                raise LeaseLost(f"task {self.task_id} is driven by {lease_owner or 'nobody'}")
            cursor.execute(_CLAIM, [key, fingerprint, tool, self.task_id, args, now, now])
            claimed = cursor.fetchone()
            row = Operation.objects.get(key=key)
            if claimed is not None:
                OperationEvent.objects.create(
                    operation=row,
                    from_state="" if claimed[1] == 1 else State.NOT_COMMITTED.value,
                    to_state=State.IN_FLIGHT.value,
                    task_id=self.task_id,
                )
                return Claim(ClaimStatus.CLAIMED, entry_of(row))
        entry = entry_of(row)
        if entry.fingerprint != fingerprint:
            return Claim(ClaimStatus.CONFLICT, entry)
        return Claim(_CLAIM_ANSWERS[entry.state], entry)

    def _claim_pg(self, key: str, fingerprint: str) -> Claim:
        tool, args = self._described.get(key, ("", ""))
        now, task = timezone.now(), self.task_id
        claim = [key, fingerprint, tool, task, args, now, now, self.owner, now, task]
        carried, self._carried = self._carried, None  # sent once, whatever happens
        gate, gate_params = carried if carried is not None else (_GATE_CTE, [task])
        row = fetch_one(_claim_sql(gate), [*gate_params, *claim])
        if row is None:
            if carried is not None:  # the save's UPDATE found no row this owner drives
                raise LeaseLost(f"task {task} is no longer driven by {self.owner}")
            raise LeaseLost(f"task {task} does not exist")
        if carried is not None:
            self._carried_row = row[:2]
        stop_requested_at, lease_owner, claimed_id, attempts, evidence = row
        if stop_requested_at is not None:
            self.stop_recorded = True
            raise StopRecorded(f"task {self.task_id} is stopping")
        if lease_owner != self.owner:
            raise LeaseLost(f"task {self.task_id} is driven by {lease_owner or 'nobody'}")
        if claimed_id is not None:
            self._claimed = {key: (attempts, evidence)}
            entry = Entry(key, fingerprint, State.IN_FLIGHT, None, attempts, evidence)
            return Claim(ClaimStatus.CLAIMED, entry)
        existing = entry_of(Operation.objects.get(key=key))
        if existing.fingerprint != fingerprint:
            return Claim(ClaimStatus.CONFLICT, existing)
        return Claim(_CLAIM_ANSWERS[existing.state], existing)

    def _settle_in_flight(
        self, key: str, fingerprint: str, target: State, result: Any = None
    ) -> Entry:
        """IN_FLIGHT → ``target`` in one statement (PostgreSQL), else the general move."""
        if connection.vendor != "postgresql":
            return self._move(
                key, {State.IN_FLIGHT}, target, fingerprint=fingerprint, result=result
            )
        with self._watch():
            row = fetch_one(_MOVE_PG, self._move_params(key, fingerprint, target, result))
        if row is None:
            raise self._why_not(key, fingerprint, target)
        stored = None if result is None else Result.from_dict(result)
        return Entry(key, fingerprint, target, stored, row[0], row[1])

    def _move_params(self, key: str, fingerprint: str, target: State, result: Any) -> list[Any]:
        """The parameters of ``MOVE_CTES``."""
        now = timezone.now()
        stored = _RESULT_FIELD.get_db_prep_save(result, connection)
        return [target.value, stored, now, key, fingerprint, now, target.value, self.task_id]

    def _why_not(self, key: str, fingerprint: str, target: State) -> LedgerError:
        """Why an operation could not move from ``IN_FLIGHT``, from the row as it is."""
        current = Operation.objects.filter(key=key).first()
        if current is None:
            return LedgerError(f"no operation {key!r}")
        if current.fingerprint != fingerprint:
            return LedgerError(f"operation {key!r} belongs to another input")
        return LedgerError(f"operation {key!r} is {current.state}, cannot become {target}")

    def record(self, key: str, fingerprint: str, result: Result) -> Entry:
        stored = redact(result.to_dict())
        claimed = self._claimed.pop(key, None)
        if self.defer_record and claimed is not None and self._deferred is None:
            # Made by the driver's save that follows (take_deferred), or by flush() if
            # the ledger is read first.
            self._deferred = (key, fingerprint, stored)
            return Entry(key, fingerprint, State.COMMITTED, result, *claimed)
        self.flush()
        return self._settle_in_flight(key, fingerprint, State.COMMITTED, stored)

    def mark_unknown(self, key: str, fingerprint: str) -> Entry:
        self.flush()
        return self._settle_in_flight(key, fingerprint, State.UNKNOWN)

    def resolve(
        self,
        key: str,
        *,
        committed: bool,
        result: Result | None = None,
        evidence: str = "",
    ) -> Entry:
        self.flush()
        return self._move(
            key,
            {State.IN_FLIGHT, State.UNKNOWN},
            State.COMMITTED if committed else State.NOT_COMMITTED,
            result=redact(result.to_dict()) if committed and result is not None else None,
            evidence=evidence,
        )

    def _move(
        self,
        key: str,
        sources: set[State],
        target: State,
        *,
        fingerprint: str | None = None,
        result: Any = None,
        evidence: str = "",
    ) -> Entry:
        with self._watch(), transaction.atomic():
            row = Operation.objects.select_for_update().filter(key=key).first()
            if row is None:
                raise LedgerError(f"no operation {key!r}")
            if fingerprint is not None and row.fingerprint != fingerprint:
                raise LedgerError(f"operation {key!r} belongs to another input")
            if row.state not in sources:
                raise LedgerError(f"operation {key!r} is {row.state}, cannot become {target}")
            before = row.state
            row.state = target.value
            row.result = result
            row.evidence = evidence or row.evidence
            row.updated_at = timezone.now()
            row.save(update_fields=["state", "result", "evidence", "updated_at"])
            OperationEvent.objects.create(
                operation=row,
                from_state=before,
                to_state=target.value,
                task_id=self.task_id,
                evidence=evidence,
            )
        return entry_of(row)


_RESULT_FIELD = Operation._meta.get_field("result")


@cache
def _claim_sql(gate: str) -> str:
    return _CLAIM_PG.format(gate=gate)
