"""What both step stores do the same way, through the ORM: the lease, reads, the general
operation move, the finish and the trace history. Their own SQL is in their modules."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone

from guard import Kind, Reason, Report
from guard.steps import COMPLETED_KEPT, OPERATION_MOVES, LedgerError
from guard.steps import Operation as Entry

from .. import lifecycle
from ..models import Decision, EventKind, Operation, OperationEvent, Task, TaskState, TraceEvent
from . import LeaseLost


class BaseStore:
    """A step store's shared part; ``next_seq``/``phase`` come from :meth:`take_lease`."""

    def __init__(self, task_id: int, owner: str) -> None:
        self.task_id = task_id
        self.owner = owner
        self.next_seq = 1
        self.phase = 1

    # -- the lease -------------------------------------------------------------------------

    def take_lease(self, seconds: float) -> Task | str:
        with transaction.atomic():
            task = lifecycle.start_drive(self.task_id, self.owner, lease_seconds=seconds)
        if isinstance(task, Task):
            self.next_seq, self.phase = task.next_seq, task.phase
        return task

    def renew_lease(self, seconds: float) -> bool:
        expires = timezone.now() + timedelta(seconds=seconds)
        renewed = Task.objects.filter(
            id=self.task_id, lease_owner=self.owner, state=TaskState.RUNNING
        ).update(lease_expires_at=expires)
        return renewed == 1

    def release_lease(self) -> bool:
        released = Task.objects.filter(id=self.task_id, lease_owner=self.owner).update(
            lease_owner="", lease_expires_at=None
        )
        return released == 1

    # -- reads -----------------------------------------------------------------------------

    def get(self, key: str) -> Entry | None:
        row = Operation.objects.filter(key=key).first()
        return None if row is None else lifecycle.entry_of(row)

    def get_many(self, keys: Sequence[str]) -> dict[str, Entry]:
        rows = Operation.objects.filter(key__in=list(keys)).values_list(*lifecycle.ENTRY_FIELDS)
        return {row[0]: lifecycle.entry_from(*row) for row in rows}

    # -- operation moves -------------------------------------------------------------------

    def resolve(
        self, key: str, move: str, *, result: Mapping[str, Any] | None, evidence: str
    ) -> Entry:
        return self._move(key, move, result=result, evidence=evidence)

    def _move(
        self,
        key: str,
        move: str,
        *,
        fingerprint: str | None = None,
        result: Mapping[str, Any] | None = None,
        evidence: str = "",
    ) -> Entry:
        """``OPERATION_MOVES[move]`` under the row's lock, with its history row."""
        sources, target = OPERATION_MOVES[move]
        with transaction.atomic():
            row = Operation.objects.select_for_update().filter(key=key).first()
            if row is None:
                raise LedgerError(f"no operation {key!r}")
            if fingerprint is not None and row.fingerprint != fingerprint:
                raise LedgerError(f"operation {key!r} belongs to another input")
            if row.state not in sources:
                raise LedgerError(f"operation {key!r} is {row.state}, cannot become {target}")
            before = row.state
            row.state = target.value
            row.result = None if result is None else dict(result)
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
        return lifecycle.entry_of(row)

    def _why_not(self, key: str, fingerprint: str, move: str) -> LedgerError:
        """Why an operation could not make ``move``, from the row as it is."""
        target = OPERATION_MOVES[move][1]
        current = Operation.objects.filter(key=key).first()
        if current is None:
            return LedgerError(f"no operation {key!r}")
        if current.fingerprint != fingerprint:
            return LedgerError(f"operation {key!r} belongs to another input")
        return LedgerError(f"operation {key!r} is {current.state}, cannot become {target}")

    # -- the end, and the way back ---------------------------------------------------------

    def finish(self, report: Report, *, checkpoint: Mapping[str, Any] | None) -> None:
        try:
            with transaction.atomic():
                lifecycle.finish_drive(self.task_id, self.owner, report, checkpoint=checkpoint)
        except LeaseLost:
            raise
        except lifecycle.LostRace as exc:
            raise LeaseLost(str(exc)) from exc

    def history(self, phase: int) -> dict[str, list[Any]]:
        """``touched``: the operation keys the phase's requests named, in first-seen order
        (one never claimed has no ledger entry, so the stop report cannot list it).
        ``completed``: the latest ``COMPLETED_KEPT`` requests that executed or reused a
        successful result."""
        requests = (
            TraceEvent.objects.filter(task_id=self.task_id, phase=phase, kind=EventKind.REQUEST)
            .order_by("seq")
            .values_list(
                "tool",
                "fingerprint",
                "operation_key",
                "decision",
                "reason",
                "result_kind",
                "revision",
            )
        )
        touched: dict[str, None] = {}
        completed: list[list[Any]] = []
        for tool, fp, key, decision, reason, kind, revision in requests.iterator():
            ran = decision in (Decision.EXECUTED, Decision.REUSED)
            if key and (ran or reason in _MET_THE_LEDGER):
                touched.setdefault(key, None)
            if ran and kind == Kind.SUCCESS and reason in _COMPLETED_THEN:
                reused = decision == Decision.REUSED
                completed.append([tool, fp, key or None, reused, revision or 0])
        return {"touched": list(touched), "completed": completed[-COMPLETED_KEPT:]}


# A request blocked for these reasons had its key looked up in the ledger first.
_MET_THE_LEDGER = frozenset(
    {Reason.OPERATION_CONFLICT, Reason.OPERATION_IN_FLIGHT, Reason.UNKNOWN_COMMIT}
)
# A successful request counts as completed unless it stopped the task before the guard
# could count it (its evidence was refused, its commit could not be settled).
_COMPLETED_THEN = frozenset({"", Reason.GOAL_MET, Reason.NO_PROGRESS, Reason.INVALID_WAIT})
