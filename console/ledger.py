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

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.db import DatabaseError, connection, transaction
from django.utils import timezone

from guard import Call, Claim, ClaimStatus, LedgerError, Result
from guard import Operation as Entry
from guard import OperationState as State

from .models import Operation, OperationEvent
from .redaction import preview, redact


class StopRecorded(RuntimeError):
    """The task's stop is recorded: no new claim may be taken for it."""


class LeaseLost(RuntimeError):
    """Another driver holds the task now: this one must not touch it any more."""


# One statement decides the claim. The WHERE of DO UPDATE makes the reclaim of a
# NOT_COMMITTED key a compare-and-set; any other existing row is left as it is and no
# row comes back.
_CLAIM = """
INSERT INTO console_operation
    (key, fingerprint, state, tool, task_id, args_preview, result, attempts, evidence,
     claimed_at, updated_at)
VALUES (%s, %s, 'IN_FLIGHT', %s, %s, %s, NULL, 1, '', now(), now())
ON CONFLICT (key) DO UPDATE
    SET state = 'IN_FLIGHT', attempts = console_operation.attempts + 1,
        task_id = EXCLUDED.task_id, result = NULL, updated_at = now()
    WHERE console_operation.state = 'NOT_COMMITTED'
      AND console_operation.fingerprint = EXCLUDED.fingerprint
RETURNING id, attempts
"""

_GATE = "SELECT stop_requested_at, lease_owner FROM console_task WHERE id = %s"
_GATE_PG = _GATE + " FOR SHARE"  # SQLite has no row locks; it serialises writers anyway

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
        self._described: dict[str, tuple[str, str]] = {}

    def describe(self, call: Call) -> None:
        """Remember the tool and a redacted preview of the arguments for ``call``'s row."""
        if call.operation_key:
            self._described[call.operation_key] = (call.tool, preview(call.args))

    def get(self, key: str) -> Entry | None:
        with self._watch():
            row = Operation.objects.filter(key=key).first()
        return None if row is None else entry_of(row)

    def claim(self, key: str, fingerprint: str) -> Claim:
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
        tool, args = self._described.get(key, ("", ""))
        with transaction.atomic(), connection.cursor() as cursor:
            # The stop service updates this row, so it waits for this share lock: a stop
            # is either visible here or lands after the claim it could not prevent.
            cursor.execute(_GATE_PG if connection.vendor == "postgresql" else _GATE, [self.task_id])
            gate = cursor.fetchone()
            if gate is None:
                raise LeaseLost(f"task {self.task_id} does not exist")
            stop_requested_at, lease_owner = gate
            if stop_requested_at is not None:
                raise StopRecorded(f"task {self.task_id} is stopping")
            if lease_owner != self.owner:
                raise LeaseLost(f"task {self.task_id} is driven by {lease_owner or 'nobody'}")
            cursor.execute(_CLAIM, [key, fingerprint, tool, self.task_id, args])
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

    def record(self, key: str, fingerprint: str, result: Result) -> Entry:
        return self._move(
            key,
            {State.IN_FLIGHT},
            State.COMMITTED,
            fingerprint=fingerprint,
            result=redact(result.to_dict()),
        )

    def mark_unknown(self, key: str, fingerprint: str) -> Entry:
        return self._move(key, {State.IN_FLIGHT}, State.UNKNOWN, fingerprint=fingerprint)

    def resolve(
        self,
        key: str,
        *,
        committed: bool,
        result: Result | None = None,
        evidence: str = "",
    ) -> Entry:
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
