"""The step store: everything that persists a guard step, behind one interface.

A driver (the hosted runner today, the attached-agent API next) holds a task's lease and
hands the store *values*: the step to save (:class:`Step`), the write's record to make
with it (:class:`Record`), the claim to take. The store answers with values (:class:`Saved`,
``guard.steps.Claim``, ``guard.steps.Operation``), the task's stop fact among them (a save's
``Saved.stop_requested``, a claim's ``ClaimStatus.STOPPING``), or raises :class:`LeaseLost`.
Each implementation owns all of its SQL: ``postgresql`` combines its statements (a claim
carrying the step's save as its gate, a save carrying the record), ``sqlite`` runs the same
in one IMMEDIATE transaction. No SQL text leaves its module.

Nothing here assumes a Celery worker or a heartbeat thread: a lease is an owner and an
expiry, taken with :meth:`StepStore.take_lease` and renewed with
:meth:`StepStore.renew_lease` by whichever driver holds it (a heartbeat thread, or each
request of an attached client); the owner may take it again while it holds it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from django.db import connection

from console.lifecycle import LostRace
from console.models import Task
from guard import Report, Usage
from guard.steps import Claim, LedgerError, Operation


class LeaseLost(LostRace):
    """Another driver holds the task now (or nobody): this one must not touch it any more."""


class MoveRefused(Exception):
    """The ledger move a step was decided on (:attr:`Step.assumes`) could not be made with
    its save: the key was claimed before, the write was settled meanwhile. Nothing of the
    step was saved; its driver runs it again, asking the ledger first."""


class NeedsLock(Exception):
    """An attached step run on the task row read without its lock
    (:meth:`StepStore.read_step`) could not be finished so: the row changed before its
    save, or the step came to something only a step holding the lock may do (a stop, the
    lease taken, the ledger or the trace read, a write of its own). Nothing was written;
    the driver runs the step again, holding the row's lock."""


class AnsweredBefore(Exception):
    """An attached step's answer could not be stored: its request id was answered before
    (the request is a retry). The step's transaction must roll back; the stored answer is
    :meth:`StepStore.answered`'s, read after it."""


@dataclass(frozen=True, slots=True)
class Answer:
    """An attached step's answer, kept under its request id so that a retried request (the
    same id) gets it again and changes nothing; ``body_hash`` tells a retry from another
    request under the same id. Stored with the step's save (:attr:`Step.answer`), or on its
    own (:meth:`StepStore.remember`)."""

    request_id: str
    step: str
    body_hash: str
    answer: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Claiming:
    """The claim of a fresh operation key (no entry yet), made by the save of the step
    that assumed it (:attr:`Step.assumes`); ``tool`` and ``args`` (a redacted preview)
    describe the operation's row."""

    key: str
    fingerprint: str
    tool: str
    args: str


@dataclass(slots=True)
class Step:
    """What a driver saves after a step: the task's counters as they stand (``usage``,
    by ``guard.steps.DIMENSIONS`` names, including what is counted ahead), its verified
    ``revision``, the trace ``events`` since the last save (each a mapping of
    ``TraceEvent`` fields; the store numbers them) and, when it changed, the
    ``checkpoint`` a restart of the phase resumes from.

    ``durable=False`` lets the commit return before it reaches the disk (PostgreSQL):
    only for a save that the next synchronous commit follows before any write runs.
    ``answer``: the attached step's answer, stored with the save (not with a save carried
    by a claim). ``assumes``: the ledger move an attached step was decided on without
    asking the ledger (a fresh key's claim at a write's entry, a write's record after it),
    made by the save in its own statement, and the save only with it
    (:class:`MoveRefused` otherwise); only for a store that :attr:`StepStore.carries_moves`.
    ``saved`` is set by the store once the step is committed (also when it rode on a claim
    that then refused).
    """

    usage: Mapping[str, int]
    revision: int
    events: Sequence[Mapping[str, Any]] = ()
    checkpoint: Mapping[str, Any] | None = None
    durable: bool = True
    answer: Answer | None = None
    assumes: Claiming | Record | None = None
    saved: Saved | None = None


@dataclass(frozen=True, slots=True)
class Record:
    """A verified write's record (``IN_FLIGHT`` → ``COMMITTED``), made with the step's save.
    ``result`` is the stored (redacted) form of the result."""

    key: str
    fingerprint: str
    result: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Saved:
    """What a committed save says: whether the task's stop is recorded, and, when it
    carried a record, why that record could not be made (``None``: made)."""

    stop_requested: bool
    record_failed: LedgerError | None = None


class StepStore(Protocol):
    """The persistence of one task's steps for the driver ``owner``.

    Every write is conditional on ``owner`` holding the lease (:class:`LeaseLost`
    otherwise), except :meth:`resolve` (trusted evidence) and reads.
    """

    task_id: int
    owner: str
    carries_moves: bool
    """Whether a save makes the ledger move its step assumed (:attr:`Step.assumes`), one
    statement fewer (PostgreSQL); else a driver asks the ledger first."""

    def open_step(self, request_id: str | None) -> tuple[Task, Answer | None] | None:
        """Lock the task's row until the caller's transaction ends and read it, with the
        answer stored under ``request_id`` (``None``: none is looked for); ``None`` if
        there is no such task. An attached step's first statement. PostgreSQL looks
        nothing up (the answer is ``None``): a retry is told by its answer's insert
        conflicting (:class:`AnsweredBefore`), one statement fewer for every request that
        is not one."""
        ...

    def read_step(self, request_id: str) -> tuple[Task, Answer | None, StepStore] | None:
        """An attached step's first statement when it may run without the row's lock
        (PostgreSQL): the task row as it is, with the answer stored under ``request_id``,
        in one snapshot, and the store to run the step with. That store's one write is the
        step's last save (its answer with it, and the move it assumed), in one statement
        made only while the row is still at the version read: a compare-and-set on it, no
        transaction held open; the answer's insert meeting a retry's fails it whole
        (:class:`AnsweredBefore`). Anything else, or a row changed meanwhile, is
        :class:`NeedsLock` with nothing written, as is this call where every step takes
        the lock (SQLite). ``None`` if there is no such task."""
        ...

    def answered(self, request_id: str) -> Answer | None:
        """The answer stored under ``request_id``, if any (after :class:`AnsweredBefore`,
        or a refusal that a retry may have met)."""
        ...

    def remember(self, answer: Answer) -> None:
        """Store an attached step's ``answer`` when no save carries it;
        :class:`AnsweredBefore` when its request id was answered before."""
        ...

    def take_lease(self, seconds: float) -> Task | str:
        """Take (or, by its holder, take again) the lease for ``seconds``; the task as it
        is now, or why not (held by another, finished, stopped before it ran)."""
        ...

    def renew_lease(self, seconds: float) -> bool:
        """Extend the lease by ``seconds`` from now; False if ``owner`` lost it."""
        ...

    def go_on(self, task: Task) -> None:
        """Go on driving ``task`` (as read under its row lock, its lease ``owner``'s) without
        taking the lease again: the store numbers the trace from it. Statement-free."""
        ...

    def release_lease(self) -> bool:
        """Give the lease up without ending the task ("done with it for now"): the lease
        expires at once, so the recovery sweep (or the next driver to take it) settles
        what is in flight and requeues the task; False if ``owner`` did not hold the lease
        of a running task."""
        ...

    def stop_requested(self) -> bool:
        """Whether the task's stop is recorded (a missing task counts as stopped)."""
        ...

    def get(self, key: str) -> Operation | None:
        """The operation ``key``, if any."""
        ...

    def get_many(self, keys: Sequence[str]) -> dict[str, Operation]:
        """The operations of ``keys`` that exist."""
        ...

    def claim(
        self, key: str, fingerprint: str, *, tool: str, args: str, carry: Step | None = None
    ) -> Claim:
        """Claim ``key`` for one execution (see ``guard.Ledger.claim``), gated by the stop
        fact and the lease in the claim's own transaction: ``ClaimStatus.STOPPING`` (nothing
        claimed) once the stop is recorded; ``carry``: the step's save, committed with the
        claim (also when the stop then refuses the claim)."""
        ...

    def settle(
        self, key: str, fingerprint: str, move: str, result: Mapping[str, Any] | None = None
    ) -> Operation:
        """Move an ``IN_FLIGHT`` operation by ``OPERATION_MOVES[move]`` (``record``,
        ``lose``); ``LedgerError`` when it is not in flight (any more)."""
        ...

    def resolve(
        self, key: str, move: str, *, result: Mapping[str, Any] | None, evidence: str
    ) -> Operation:
        """Settle an uncertain operation from trusted evidence (``settle_committed``,
        ``settle_not_committed``)."""
        ...

    def save(self, step: Step, *, record: Record | None = None) -> Saved:
        """Save ``step`` (and make ``record`` with it) in one transaction. If the database
        fails while ``record`` rides on it, the record is tried on its own before the
        error goes on, so that a verified write is not left for recovery to lose.
        :class:`AnsweredBefore` when ``step.answer``'s request id was answered before;
        :class:`MoveRefused`, with nothing saved, when the move ``step.assumes`` cannot be
        made."""
        ...

    def finish(
        self, report: Report, *, checkpoint: Mapping[str, Any] | None, summary: Usage | None = None
    ) -> None:
        """Record the guard's stop as the task's terminal state (``lifecycle.finish_drive``);
        ``summary``: a summary turn follows, and the task has spent this (its reservation
        included) by then."""
        ...

    def history(self, phase: int) -> dict[str, list[Any]]:
        """What ``Guard.checkpoint(history=False)`` left out, rebuilt from the phase's trace."""
        ...


def open_store(task_id: int, owner: str) -> StepStore:
    """The step store of the default database for ``task_id`` driven by ``owner``."""
    if connection.vendor == "postgresql":
        from console.store.postgresql import PostgresStore

        return PostgresStore(task_id, owner)
    from console.store.sqlite import SqliteStore

    return SqliteStore(task_id, owner)


__all__ = [
    "Answer",
    "AnsweredBefore",
    "Claiming",
    "LeaseLost",
    "MoveRefused",
    "NeedsLock",
    "Record",
    "Saved",
    "Step",
    "StepStore",
    "open_store",
]
