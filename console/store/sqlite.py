"""The step store on SQLite (standalone mode): the same promises as on PostgreSQL.

SQLite has no row locks; its transactions begin IMMEDIATE (settings), which holds the
database's write lock from the first statement to the commit. So a claim reads its gate
(the stop fact and the lease) and claims in one such transaction, and the stop service's
update waits for it as it waits for the share lock on PostgreSQL: a stop is either seen by
the claim or lands after the claim it could not prevent. A step carried by a claim, and a
record carried by a save, commit in that same transaction. Times are stored as the ORM
stores them (text, compared as text). Operation moves go by ``guard.steps.OPERATION_MOVES``.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import nullcontext
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from console.lifecycle import entry_of
from console.models import Operation, OperationEvent, Task, TraceEvent
from console.store import LeaseLost, Record, Saved, Step
from console.store.base import _DIMENSIONS, BaseStore, _claimed_from, _states
from console.store.statements import fetch_one
from guard.steps import CLAIM_ANSWERS, OPERATION_MOVES, Claim, ClaimStatus, LedgerError
from guard.steps import Operation as Entry

# One statement decides the claim (SQLite 3.35+ has upsert and RETURNING). The WHERE of
# DO UPDATE makes the reclaim of a NOT_COMMITTED key a compare-and-set.
_CLAIM = f"""
INSERT INTO console_operation
    (key, fingerprint, state, tool, task_id, args_preview, result, attempts, evidence,
     claimed_at, updated_at)
VALUES (%s, %s, '{OPERATION_MOVES["claim"][1].value}', %s, %s, %s, NULL, 1, '', %s, %s)
ON CONFLICT (key) DO UPDATE
    SET state = EXCLUDED.state, attempts = console_operation.attempts + 1,
        task_id = EXCLUDED.task_id, result = NULL, updated_at = EXCLUDED.updated_at
    WHERE console_operation.state IN ({_states("claim")})
      AND console_operation.fingerprint = EXCLUDED.fingerprint
RETURNING id, attempts
"""  # noqa: S608 - built from OPERATION_MOVES' fixed words
_GATE = "SELECT stop_requested_at, lease_owner FROM console_task WHERE id = %s"
_STOP_FACT = "SELECT stop_requested_at FROM console_task WHERE id = %s"
_SAVE = (
    "UPDATE console_task SET "  # noqa: S608 - column names from DIMENSIONS
    + ", ".join(f"{name} = %s" for name in (*_DIMENSIONS, "revision"))
    + ", next_seq = %s, last_step_at = %s{checkpoint}"
    " WHERE id = %s AND lease_owner = %s AND state = 'RUNNING'"
    " RETURNING stop_requested_at, lease_owner"
)
_SAVE_PLAIN = _SAVE.format(checkpoint="")
_SAVE_CHECKPOINT = _SAVE.format(checkpoint=", checkpoint = %s")
_CHECKPOINT_FIELD = Task._meta.get_field("checkpoint")


class SqliteStore(BaseStore):
    """:class:`console.store.StepStore` on SQLite."""

    def stop_requested(self) -> bool:
        row = fetch_one(_STOP_FACT, [self.task_id])
        return row is None or row[0] is not None

    def claim(
        self, key: str, fingerprint: str, *, tool: str, args: str, carry: Step | None = None
    ) -> Claim:
        now = connection.ops.adapt_datetimefield_value(timezone.now())
        stopping = False
        carried: Saved | None = None
        claimed: tuple[Any, ...] | None = None
        with transaction.atomic():
            if carry is not None:
                # Its gate: the row as the save found it (LeaseLost if not ours).
                carried = self._write(carry)
                stop_requested_at, lease_owner = carried.stop_requested, self.owner
            else:
                gate = fetch_one(_GATE, [self.task_id])
                if gate is None:
                    raise LeaseLost(f"task {self.task_id} does not exist")
                stop_requested_at, lease_owner = gate
            if stop_requested_at:
                # Answered once the transaction commits: a carried step is saved all the same.
                stopping = True
            elif lease_owner != self.owner:
                driver = "another driver" if lease_owner else "nobody"
                raise LeaseLost(f"task {self.task_id} is driven by {driver}")
            else:
                claimed = fetch_one(_CLAIM, [key, fingerprint, tool, self.task_id, args, now, now])
                row = Operation.objects.get(key=key)
                if claimed is not None:
                    OperationEvent.objects.create(
                        operation=row,
                        from_state=_claimed_from(claimed[1]),
                        to_state=OPERATION_MOVES["claim"][1].value,
                        task_id=self.task_id,
                    )
        # Committed: only now is the carried step saved (a rollback leaves it to be sent
        # again, its events still pending).
        if carry is not None and carried is not None:
            self._took(carry, carried)
        if stopping:
            return Claim(ClaimStatus.STOPPING)
        entry = entry_of(row)
        if claimed is not None:
            return Claim(ClaimStatus.CLAIMED, entry)
        if entry.fingerprint != fingerprint:
            return Claim(ClaimStatus.CONFLICT, entry)
        answer = CLAIM_ANSWERS[entry.state]
        if answer is ClaimStatus.CLAIMED:
            # Cannot be: the claim's upsert takes every such key in this same transaction.
            raise LedgerError(f"operation {key!r} is {entry.state} and was not claimed")
        return Claim(answer, entry)

    def settle(
        self, key: str, fingerprint: str, move: str, result: Mapping[str, Any] | None = None
    ) -> Entry:
        return self._move(key, move, fingerprint=fingerprint, result=result)

    def _save(self, step: Step, record: Record | None) -> Saved:
        if record is None and not step.events and step.answer is None:
            return self._took(step, self._write(step))
        with transaction.atomic():
            failed: LedgerError | None = None
            if record is not None:
                try:
                    self._move(
                        record.key, "record", fingerprint=record.fingerprint, result=record.result
                    )
                except LedgerError as exc:
                    failed = exc
            saved = self._write(step)
            if step.answer is not None:
                self.remember(step.answer)
        return self._took(step, Saved(saved.stop_requested, failed))

    def _took(self, step: Step, saved: Saved) -> Saved:
        """``step`` is committed: its events are numbered, ``step.saved`` says so."""
        self.next_seq += len(step.events)
        step.saved = saved
        return saved

    def _write(self, step: Step) -> Saved:
        """The counters' UPDATE, then the events, in the caller's transaction; what the
        row says. Nothing is taken as saved here (:meth:`_took`, once it commits)."""
        usage = step.usage
        params: list[Any] = [usage[name] for name in _DIMENSIONS]
        params += (
            step.revision,
            self.next_seq + len(step.events),
            connection.ops.adapt_datetimefield_value(timezone.now()),
        )
        sql = _SAVE_PLAIN
        if step.checkpoint is not None:
            sql = _SAVE_CHECKPOINT
            params.append(_CHECKPOINT_FIELD.get_db_prep_save(step.checkpoint, connection))
        with transaction.atomic() if step.events else nullcontext():
            row = fetch_one(sql, [*params, self.task_id, self.owner])
            if row is None:
                raise LeaseLost(f"task {self.task_id} is no longer driven by this driver")
            if step.events:
                TraceEvent.objects.bulk_create(
                    TraceEvent(task_id=self.task_id, phase=self.phase, seq=seq, **event)
                    for seq, event in enumerate(step.events, start=self.next_seq)
                )
        return Saved(row[0] is not None)
