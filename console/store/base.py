"""What both step stores do the same way, through the ORM: the lease, reads, the general
operation move, the rescue of a save carrying a record, the finish and the trace history,
and the words both stores' SQL is built from. Their own SQL is in their modules."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

from django.db import DatabaseError, connection, transaction
from django.utils import timezone

from console import lifecycle
from console.models import Decision, EventKind, Operation, StepRequest, Task, TaskState, TraceEvent
from console.store import Answer, LeaseLost, NeedsLock, Record, Saved, Step, StepStore
from guard import Kind, Reason, Report, Usage
from guard.steps import COMPLETED_KEPT, DIMENSIONS, OPERATION_MOVES, LedgerError
from guard.steps import Operation as Entry

logger = logging.getLogger(__name__)

# The task row's counter columns: ``Usage`` field names are ``Task`` column names.
_DIMENSIONS = tuple(d.used for d in DIMENSIONS)

# A claim's history row starts from no entry (a fresh key: the insert, attempt 1) or from
# the one state a claim takes a key back from (the update, a later attempt): the rule once,
# for the PostgreSQL statement and for the SQLite store's ORM row.
(_TAKEN_BACK,) = [state for state in OPERATION_MOVES["claim"][0] if state is not None]
_CLAIMED_FROM_SQL = f"CASE WHEN attempts = 1 THEN '' ELSE '{_TAKEN_BACK.value}' END"


def _claimed_from(attempts: int) -> str:
    """The ``from_state`` of the history row of a claim that made attempt ``attempts``."""
    return "" if attempts == 1 else _TAKEN_BACK.value


def _states(move: str) -> str:
    """The SQL list of the states ``move`` may leave (the enum's fixed words)."""
    return ", ".join(sorted(f"'{s.value}'" for s in OPERATION_MOVES[move][0] if s is not None))


class BaseStore:
    """A step store's shared part; ``next_seq``/``phase`` come from :meth:`take_lease`."""

    carries_moves = False
    """SQLite's saves run in a transaction holding the database's one write lock: a move
    made by the save itself would spare no round trip there (PostgreSQL's does)."""

    def __init__(self, task_id: int, owner: str) -> None:
        self.task_id = task_id
        self.owner = owner
        self.next_seq = 1
        self.phase = 1

    # -- an attached step --------------------------------------------------------------------

    def open_step(self, request_id: str | None) -> tuple[Task, Answer | None] | None:
        task = Task.objects.select_for_update().filter(id=self.task_id).first()
        if task is None:
            return None
        return task, None if request_id is None else self.answered(request_id)

    def read_step(self, request_id: str) -> tuple[Task, Answer | None, StepStore] | None:
        # SQLite: its transactions hold the database's one write lock anyway.
        raise NeedsLock("every step of this store takes the lock")

    def answered(self, request_id: str) -> Answer | None:
        row = (
            StepRequest.objects.filter(task_id=self.task_id, request_id=request_id)
            .values_list("step", "body_hash", "answer")
            .first()
        )
        return None if row is None else Answer(request_id, *row)

    def remember(self, answer: Answer) -> None:
        # SQLite: open_step looked the request id up first, in an IMMEDIATE transaction
        # that holds the database's one write lock, so this insert never conflicts.
        StepRequest.objects.create(
            task_id=self.task_id,
            request_id=answer.request_id,
            step=answer.step,
            body_hash=answer.body_hash,
            answer=dict(answer.answer),
        )

    # -- the lease -------------------------------------------------------------------------

    def take_lease(self, seconds: float) -> Task | str:
        with transaction.atomic():
            task = lifecycle.start_drive(self.task_id, self.owner, lease_seconds=seconds)
        if isinstance(task, Task):
            self.next_seq, self.phase = task.next_seq, task.phase
        return task

    def go_on(self, task: Task) -> None:
        if task.lease_owner != self.owner:
            driver = "another driver" if task.lease_owner else "nobody"
            raise LeaseLost(f"task {task.id} is driven by {driver}")
        self.next_seq, self.phase = task.next_seq, task.phase

    def renew_lease(self, seconds: float) -> bool:
        expires = timezone.now() + timedelta(seconds=seconds)
        renewed = Task.objects.filter(
            id=self.task_id, lease_owner=self.owner, state=TaskState.RUNNING
        ).update(lease_expires_at=expires)
        return renewed == 1

    def release_lease(self) -> bool:
        # Expired, not cleared: a running task without an expiry is one the recovery sweep
        # never finds. Expired, the sweep (or the next driver) settles what is in flight
        # and requeues it, as for a lost driver.
        released = Task.objects.filter(
            id=self.task_id, lease_owner=self.owner, state=TaskState.RUNNING
        ).update(lease_expires_at=timezone.now())
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
        """``OPERATION_MOVES[move]`` under the row's lock (``lifecycle.operation_move``)."""
        with transaction.atomic():
            row = Operation.objects.select_for_update().filter(key=key).first()
            if row is None:
                raise LedgerError(f"no operation {key!r}")
            if fingerprint is not None and row.fingerprint != fingerprint:
                raise LedgerError(f"operation {key!r} belongs to another input")
            try:
                lifecycle.operation_move(
                    row, move, task_id=self.task_id, evidence=evidence, result=result
                )
            except lifecycle.LostRace as exc:
                raise LedgerError(str(exc)) from exc
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

    # -- the step's save -----------------------------------------------------------------

    def settle(
        self, key: str, fingerprint: str, move: str, result: Mapping[str, Any] | None = None
    ) -> Entry:
        raise NotImplementedError

    def save(self, step: Step, *, record: Record | None = None) -> Saved:
        if record is None:
            return self._save(step, None)
        try:
            return self._save(step, record)
        except DatabaseError:
            self._rescue(record)
            raise

    def _save(self, step: Step, record: Record | None) -> Saved:
        """The save of ``step`` (with ``record``) in this database's statements."""
        raise NotImplementedError

    def _rescue(self, record: Record) -> None:
        """The save carrying a verified write's record failed on the database (a dropped
        connection, ``database is locked``): make the record on its own, on a new
        connection, if the database answers, so that recovery finds it ``COMMITTED``
        rather than losing it to ``UNKNOWN``; keep quiet if not (the save's error goes on)."""
        try:
            connection.close()
            self.settle(record.key, record.fingerprint, "record", record.result)
        except (DatabaseError, LedgerError):
            logger.warning(
                "task %s: %s could not be recorded; recovery will see it", self.task_id, record.key
            )

    # -- the end, and the way back ---------------------------------------------------------

    def finish(
        self, report: Report, *, checkpoint: Mapping[str, Any] | None, summary: Usage | None = None
    ) -> None:
        try:
            with transaction.atomic():
                lifecycle.finish_drive(
                    self.task_id, self.owner, report, checkpoint=checkpoint, summary=summary
                )
        except LeaseLost:
            raise
        except lifecycle.LostRace as exc:
            raise LeaseLost(str(exc)) from exc

    def history(self, phase: int) -> dict[str, list[Any]]:
        """``touched``: the operation keys the phase's requests named, in first-seen order
        (one never claimed has no ledger entry, so the stop report cannot list it).
        ``completed``: the latest ``COMPLETED_KEPT`` requests that executed or reused a
        successful result. Keys are in the order the requests were settled (a batch run at
        once may have settled its calls out of order); a write admitted and never asked
        for (``not_run``, written by the attached driver) counts as touched."""
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
            if key and (ran or reason in _MET_THE_LEDGER or decision == Decision.NOT_RUN):
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
