"""The step store on PostgreSQL: every statement of a guarded step, combined here.

Invariant 2 lives in the claim: one ``INSERT … ON CONFLICT … DO UPDATE … WHERE`` under a
gate on the task row. Of any number of concurrent claims on a fresh key exactly one
inserts, and a ``NOT_COMMITTED`` entry is taken back by compare-and-set. The gate holds
the task row (``FOR SHARE``, ``FOR UPDATE`` in an attached step's save, or the UPDATE of
the step's save riding on the claim) so that a stop committed by an operator either
precedes the claim (and is seen) or waits for it (and the execution it allows was decided
before the stop).

A step costs a handful of fixed texts, run as prepared statements (``console.store.statements``):

- the claim, carrying the step's save so far (the model call's event and counters) as
  its gate when the driver has one: one round trip, one synchronous commit;
- the save after the tool, carrying the write's record (``IN_FLIGHT`` → ``COMMITTED``):
  the record commits with its step;
- an attached step's save, with its answer, and the claim of a fresh key (at a write's
  entry) or the write's record (after it) that the step assumed (``Step.assumes``): one
  statement, the save made only with the move (else ``MoveRefused``, nothing saved);
- other saves, the trace events in the same statement as the counters; a save that the
  next synchronous commit follows before any write runs may skip the wait for the disk
  (``Step.durable=False``: ``synchronous_commit`` off for that transaction only).

An attached step run without the task row's lock (``read_step``) reads the row with its
version (``xmin``) and the answer stored under its request id in one statement, and saves
in one more, only while the row is still at that version (:class:`_Unlocked`).

Every operation move goes by ``guard.steps.OPERATION_MOVES``: the WHERE clauses below are
built from it. Times are the application's clock (``timezone.now()``, a parameter), as on
the ORM's paths and SQLite, never the database's ``now()``: the reconciliation queue sorts
operations by ``updated_at`` whichever path wrote it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import cache
from typing import Any

import psycopg
from django.db import IntegrityError, connection, transaction
from django.db.models import UniqueConstraint
from django.utils import timezone

from console.lifecycle import entry_of
from console.models import Operation, StepRequest, Task
from console.store import (
    Answer,
    AnsweredBefore,
    Claiming,
    LeaseLost,
    MoveRefused,
    NeedsLock,
    Record,
    Saved,
    Step,
    StepStore,
)
from console.store.base import _CLAIMED_FROM_SQL, _DIMENSIONS, BaseStore, _states
from console.store.statements import fetch_one, fetch_read
from guard import Report, Result, Usage
from guard.steps import CLAIM_ANSWERS, OPERATION_MOVES, Claim, ClaimStatus, LedgerError
from guard.steps import Operation as Entry


def _target(move: str) -> str:
    return f"'{OPERATION_MOVES[move][1].value}'"


def _claim_ctes(*, source: str, conflict: str, returning: str, from_state: str) -> str:
    """A claim's insert (``claimed``) and its history row (``history``), as CTEs: taken
    ``FROM source``, an existing key met with ``ON CONFLICT (key) conflict``, the history's
    from-state ``from_state``. Written once for both claims below."""
    target = _target("claim")
    return f"""claimed AS (
    INSERT INTO console_operation
        (key, fingerprint, state, tool, task_id, args_preview, result, attempts, evidence,
         claimed_at, updated_at)
    SELECT %s, %s, {target}, %s, %s, %s, NULL, 1, '', %s, %s
    FROM {source}
    ON CONFLICT (key) {conflict}
    RETURNING {returning}
), history AS (
    INSERT INTO console_operationevent (operation_id, at, from_state, to_state, task_id,
                                        evidence)
    SELECT id, %s, {from_state}, {target}, %s, ''
    FROM claimed
)"""  # noqa: S608 - built from OPERATION_MOVES' fixed words


# The claim: the gate (a CTE named ``saved`` giving the task row's stop fact and lease
# owner while holding a lock on it), the claim and its history row in one statement.
# The WHERE of DO UPDATE makes the reclaim of a NOT_COMMITTED key a compare-and-set; any
# other existing row is left as it is and ``claimed`` is empty.
_CLAIM = (
    "\nWITH {gate}, "
    + _claim_ctes(
        source="saved WHERE NOT saved.stopping AND saved.lease_owner = %s",
        conflict=f"""DO UPDATE
        SET state = EXCLUDED.state, attempts = console_operation.attempts + 1,
            task_id = EXCLUDED.task_id, result = NULL, updated_at = EXCLUDED.updated_at
        WHERE console_operation.state IN ({_states("claim")})
          AND console_operation.fingerprint = EXCLUDED.fingerprint""",  # noqa: S608 - fixed words
        returning="id, attempts, evidence",
        from_state=_CLAIMED_FROM_SQL,
    )
    + """
SELECT saved.stopping, saved.lease_owner, claimed.id, claimed.attempts,
       claimed.evidence
FROM saved LEFT JOIN claimed ON true
"""
)
_GATE = (
    "saved AS (SELECT stop_requested_at IS NOT NULL AS stopping, lease_owner"
    " FROM console_task WHERE id = %s FOR SHARE)"
)

# An IN_FLIGHT operation settled (``record`` or ``lose``) with its history row, as CTEs:
# ``moved`` has a row if and only if the move was made. On its own, or in the save after
# the tool, so that a write's record commits with its step.
_MOVE = """moved AS (
    UPDATE console_operation SET state = %s, result = %s::jsonb, updated_at = %s
    WHERE key = %s AND fingerprint = %s AND state IN ({sources}){gated}
    RETURNING id, attempts, evidence
), history AS (
    INSERT INTO console_operationevent (operation_id, at, from_state, to_state, task_id,
                                        evidence)
    SELECT id, %s, %s, %s, %s, '' FROM moved
)"""

# The step's counters in one statement, conditional on the lease; it also reads back the
# stop fact (as a boolean: a time would cost a time zone conversion for nothing), so that
# the check before the next model call or execution costs nothing extra.
_SAVE = """
UPDATE console_task SET {counters}, next_seq = %s, last_step_at = %s{checkpoint}
WHERE id = %s AND lease_owner = %s AND state = 'RUNNING'{version}{asynchronous}{assumed}
RETURNING stop_requested_at IS NOT NULL AS stopping, lease_owner
"""
_STOP_FACT = "SELECT stop_requested_at IS NOT NULL FROM console_task WHERE id = %s"
# A save whose transaction commits without waiting for its WAL to reach the disk (only
# this transaction: the setting is local to it). PostgreSQL writes WAL in order, so the
# next synchronous commit (every claim, every save after a tool) makes it durable too.
_ASYNCHRONOUS = "\n    AND set_config('synchronous_commit', 'off', true) IS NOT NULL"
# The row still at the version an attached step read it at, unlocked (``read_step``):
# ``xmin``, PostgreSQL's own, which every update of the row changes, whoever makes it (a
# lock does not). Checked again on the row's newest version once its lock is had, so a
# change committed meanwhile fails it: the compare-and-set of a step run without a lock.
_VERSION = "\n    AND xmin = %s::xid"

# A save that makes the ledger move its attached step assumed (``Step.assumes``): the task
# row read first and locked, as the claim's gate does, so that the move is made only from
# a row this driver still drives (a claim also only while no stop is recorded), then the
# move, then the save only if the move was made: a move refused leaves nothing saved
# (``MoveRefused``; the step is run again, asking the ledger first), a lease lost nothing
# moved. The claim is a fresh key's only (DO NOTHING on any entry): a key claimed before is
# the ledger's to answer, as the claim statement above does.
_GATE_FOR_MOVE = (
    "gate AS (SELECT stop_requested_at IS NOT NULL AS stopping FROM console_task"
    " WHERE id = %s AND lease_owner = %s AND state = 'RUNNING'{version} FOR UPDATE)"
)
_CLAIM_FRESH = _claim_ctes(
    source="gate WHERE NOT gate.stopping", conflict="DO NOTHING", returning="id", from_state="''"
)
_ASSUMED = {
    "claim": (_CLAIM_FRESH, "claimed"),
    "record": (
        _MOVE.format(sources=_states("record"), gated=" AND EXISTS (SELECT FROM gate)"),
        "moved",
    ),
}

# The step's trace events travel as one JSON array, unpacked by the server into rows of
# console_traceevent: one parameter instead of one per column per event (binding each costs
# the driver more than parsing the array costs the server), and one statement text for any
# number of events. Missing text fields are blank, missing numbers NULL.
_EVENT_TEXT = (
    "kind",
    "decision",
    "reason",
    "tool",
    "fingerprint",
    "args_preview",
    "result_kind",
    "result_preview",
    "operation_key",
    "detail",
)
_EVENT_NUMBERS = ("revision", "latency_ms", "tokens", "cost")
_EVENTS = (
    "INSERT INTO console_traceevent (task_id, phase, seq, at, "  # noqa: S608 - constants only
    + ", ".join((*_EVENT_TEXT, *_EVENT_NUMBERS))
    + ") SELECT %s, %s, %s + e.ordinality - 1, e.at, "
    + ", ".join(f"coalesce(e.{name}, '')" for name in _EVENT_TEXT)
    + ", "
    + ", ".join(f"e.{name}" for name in _EVENT_NUMBERS)
    + " FROM json_populate_recordset(NULL::console_traceevent, %s::json)"
    " WITH ORDINALITY AS e CROSS JOIN saved"
)

_COUNTERS = ", ".join(f"{name} = %s" for name in (*_DIMENSIONS, "revision"))

# An attached step's answer, stored by the step's save (only if the save found the row) or
# on its own. A retried request (its id answered before) is told by this insert conflicting
# on the unique (task, request_id), not by a lookup before every request: the save's last
# column (or the lone insert's row) says whether it was stored, and the retry's step, run
# again, rolls back (AnsweredBefore). The lock serialises a task's requests, so a retry that
# came while its original ran conflicts with the original's committed row.
_ANSWER_ROW = (
    "INSERT INTO console_steprequest (task_id, request_id, step, body_hash, answer, at)"
    " {source}{conflict} RETURNING 1"
)
_ON_CONFLICT = " ON CONFLICT (task_id, request_id) DO NOTHING"
_ANSWERED_BY_SAVE = "SELECT %s, %s, %s, %s, %s::jsonb, %s FROM saved"
_ANSWER = f"answered AS ({_ANSWER_ROW.format(source=_ANSWERED_BY_SAVE, conflict=_ON_CONFLICT)})"
# A step run without the row's lock holds no transaction open around its one save, so a
# retry's insert may not just do nothing: the save around it would stand. It conflicts,
# and the statement fails whole (the unique constraint below names it; AnsweredBefore).
_ANSWER_ONCE = f"answered AS ({_ANSWER_ROW.format(source=_ANSWERED_BY_SAVE, conflict='')})"
_ANSWERED_ONCE = next(
    str(c.name) for c in StepRequest._meta.constraints if isinstance(c, UniqueConstraint)
)
_REMEMBER = _ANSWER_ROW.format(
    source="VALUES (%s, %s, %s, %s, %s::jsonb, %s)", conflict=_ON_CONFLICT
)

# An attached step's first statement: the task row, locked until the step commits (a Stop,
# a resumption or another request of the task waits for it). Only the columns a step reads:
# the goal's input (JSON of any size, decoded for nothing) and what the pages show (the
# agent's name, the detail, the times) are left deferred; a step that read one would send
# a statement of its own for it (tests/console/api/test_attached_statements.py counts).
_STEP_UNREAD = frozenset(
    {"agent", "input", "input_fingerprint", "detail", "created_at", "updated_at",
     "last_step_at", "finished_at"}
)  # fmt: skip
_TASK_FIELDS = tuple(
    field for field in Task._meta.concrete_fields if field.attname not in _STEP_UNREAD
)
_TASK_COLUMNS = ", ".join(str(field.column) for field in _TASK_FIELDS)
_OPEN_STEP = f"SELECT {_TASK_COLUMNS} FROM console_task WHERE id = %s FOR UPDATE"  # noqa: S608
# Or, for a step run without the row's lock (``read_step``), the row as it is, with its
# version and the answer stored under the request id (a retry's), in one snapshot: the
# original request's save and answer commit together, so a retry sees both or neither.
_READ_STEP = (
    "SELECT t.xmin::text, "  # noqa: S608 - column names from the model
    + ", ".join(f"t.{field.column}" for field in _TASK_FIELDS)
    + ", a.step, a.body_hash, a.answer FROM console_task t"
    " LEFT JOIN console_steprequest a ON a.task_id = t.id AND a.request_id = %s"
    " WHERE t.id = %s"
)
# A retry's answer, read once its step has rolled back. The unique (task, request_id)
# makes it one row at most.
_ANSWERED = (
    "SELECT step, body_hash, answer FROM console_steprequest WHERE task_id = %s AND request_id = %s"
)
_TASK_NAMES = [field.attname for field in _TASK_FIELDS]
# What the ORM does to a column's value on the way in (JSON arrives as text: Django decodes
# it itself, as the answer's is decoded below); None where it takes the value as it comes.
_TASK_CONVERTERS = tuple(getattr(field, "from_db_value", None) for field in _TASK_FIELDS)


@cache
def _save_ctes(
    events: int, checkpoint: bool, durable: bool, assumed: str = "", versioned: bool = False
) -> str:
    """A save as CTEs: ``saved`` (the counters' UPDATE, returning the stop fact and the
    lease owner) feeding ``added`` (the trace events' INSERT, when there are ``events``),
    so both happen or neither does, and a lost lease inserts nothing; ``assumed``: the CTE
    of the move the save is made only with; ``versioned``: only on the row's version read
    (``_VERSION``). Every value is a parameter: a handful of texts, each prepared once."""
    save = _SAVE.format(
        counters=_COUNTERS,
        checkpoint=", checkpoint = %s::jsonb" if checkpoint else "",
        version=_VERSION if versioned else "",
        asynchronous="" if durable else _ASYNCHRONOUS,
        assumed=f"\n    AND EXISTS (SELECT FROM {assumed})" if assumed else "",
    ).strip()
    if not events:
        return f"saved AS ({save})"
    return f"saved AS ({save}), added AS ({_EVENTS})"


@cache
def _save_sql(
    events: int,
    checkpoint: bool,
    durable: bool,
    answer: bool = False,
    assumes: str = "",
    versioned: bool = False,
) -> str:
    """A save (with the answer: its third column says whether it was stored, not a
    retry's); ``assumes``, the move its step assumed (``_ASSUMED``): then the row is the
    gate's, its save's columns NULL when the move was refused; ``versioned``: a step's run
    without the row's lock, made only on the row's version it read (no row otherwise), its
    answer's insert failing the statement on a retry's row (``_ANSWER_ONCE``)."""
    answered = _ANSWER_ONCE if versioned else _ANSWER
    if not assumes:
        ctes = _save_ctes(events, checkpoint, durable, versioned=versioned)
        if answer:
            ctes = f"{ctes}, {answered}"
            stored = "EXISTS (SELECT FROM answered)"
            return f"WITH {ctes} SELECT stopping, lease_owner, {stored} FROM saved"  # noqa: S608
        return f"WITH {ctes} SELECT stopping, lease_owner FROM saved"  # noqa: S608
    move, made = _ASSUMED[assumes]
    gate = _GATE_FOR_MOVE.format(version=_VERSION if versioned else "")
    save = _save_ctes(events, checkpoint, durable, made, versioned)
    ctes = f"{gate}, {move}, {save}"
    columns = "saved.stopping, saved.lease_owner"
    if answer:
        ctes = f"{ctes}, {answered}"
        columns += ", EXISTS (SELECT FROM answered)"
    return f"WITH {ctes} SELECT {columns} FROM gate LEFT JOIN saved ON true"  # noqa: S608


@cache
def _save_with_record_sql(events: int, checkpoint: bool) -> str:
    """A save that also makes a write's record (the runner's, after its tool); its third
    column says whether it did."""
    move = _MOVE.format(sources=_states("record"), gated="")
    ctes = _save_ctes(events, checkpoint, True)
    return (
        f"WITH {move}, {ctes} "  # noqa: S608 - constants only
        "SELECT saved.stopping, saved.lease_owner, (SELECT count(*) FROM moved) FROM saved"
    )


@cache
def _move_sql(move: str) -> str:
    ctes = _MOVE.format(sources=_states(move), gated="")
    return f"WITH {ctes} SELECT attempts, evidence FROM moved"  # noqa: S608 - constants


@cache
def _claim_sql(carried_events: int | None, checkpoint: bool = False) -> str:
    """The claim, gated by ``FOR SHARE`` or by a save of ``carried_events`` events (with
    the ``checkpoint`` when the carried step has one)."""
    gate = _GATE if carried_events is None else _save_ctes(carried_events, checkpoint, True)
    return _CLAIM.format(gate=gate)


class PostgresStore(BaseStore):
    """:class:`console.store.StepStore` on PostgreSQL."""

    carries_moves = True
    _version: str | None = None
    """The row's version an unlocked step read (:class:`_Unlocked`): its save's condition."""

    def open_step(self, request_id: str | None) -> tuple[Task, Answer | None] | None:
        # No lookup of request_id: its answer's insert tells a retry (_ANSWER_ROW).
        row = fetch_one(_OPEN_STEP, [self.task_id])
        if row is None:
            return None
        return _task_of(row), None

    def read_step(self, request_id: str) -> tuple[Task, Answer | None, StepStore] | None:
        # The request's first statement, a read: the kept session's health check too.
        row = fetch_read(_READ_STEP, [request_id, self.task_id])
        if row is None:
            return None
        version, *values, step, body_hash, answer = row
        prior = None if step is None else Answer(request_id, step, body_hash, json.loads(answer))
        return _task_of(values), prior, _Unlocked(self.task_id, self.owner, version)

    def answered(self, request_id: str) -> Answer | None:
        row = fetch_one(_ANSWERED, [self.task_id, request_id])
        if row is None:
            return None
        step, body_hash, answer = row
        return Answer(request_id, step, body_hash, json.loads(answer))

    def remember(self, answer: Answer) -> None:
        if fetch_one(_REMEMBER, [*self._answer_params(answer)]) is None:
            raise AnsweredBefore(f"request {answer.request_id} was answered before")

    def _answer_params(self, answer: Answer) -> tuple[Any, ...]:
        return (
            self.task_id,
            answer.request_id,
            answer.step,
            answer.body_hash,
            json.dumps(answer.answer),
            timezone.now(),
        )

    def stop_requested(self) -> bool:
        row = fetch_one(_STOP_FACT, [self.task_id])
        return row is None or bool(row[0])

    # -- claims and moves ------------------------------------------------------------------

    def claim(
        self, key: str, fingerprint: str, *, tool: str, args: str, carry: Step | None = None
    ) -> Claim:
        return self._claim(key, fingerprint, tool, args, carry, again=True)

    def _claim(
        self, key: str, fingerprint: str, tool: str, args: str, carry: Step | None, *, again: bool
    ) -> Claim:
        task, now = self.task_id, timezone.now()
        claim = [key, fingerprint, tool, task, args, now, now, self.owner, now, task]
        if carry is None:
            row = fetch_one(_claim_sql(None), [task, *claim])
        else:
            sql = _claim_sql(min(len(carry.events), 1), carry.checkpoint is not None)
            row = fetch_one(sql, [*self._save_params(carry, now), *claim])
        if row is None:
            if carry is not None:  # the save's UPDATE found no row this owner drives
                raise LeaseLost(f"task {task} is no longer driven by this driver")
            raise LeaseLost(f"task {task} does not exist")
        stopping, lease_owner, claimed_id, attempts, evidence = row
        if carry is not None:
            self._saved(carry, row)
        if stopping:
            return Claim(ClaimStatus.STOPPING)  # the gate saw the stop: nothing was inserted
        if lease_owner != self.owner:
            driver = "another driver" if lease_owner else "nobody"
            raise LeaseLost(f"task {task} is driven by {driver}")
        if claimed_id is not None:
            entry = Entry(key, fingerprint, OPERATION_MOVES["claim"][1], None, attempts, evidence)
            return Claim(ClaimStatus.CLAIMED, entry)
        # Read after the claim's own transaction: the entry may have moved since.
        existing = entry_of(Operation.objects.get(key=key))
        if existing.fingerprint != fingerprint:
            return Claim(ClaimStatus.CONFLICT, existing)
        answer = CLAIM_ANSWERS[existing.state]
        if answer is ClaimStatus.CLAIMED:
            # NOT_COMMITTED in between: the execution that held it was settled as not having
            # happened. It may be claimed now (the step rode on the first statement already);
            # beaten to it once more, this write waits and asks again, as for IN_FLIGHT.
            if again:
                return self._claim(key, fingerprint, tool, args, None, again=False)
            return Claim(ClaimStatus.IN_FLIGHT, existing)
        return Claim(answer, existing)

    def settle(
        self, key: str, fingerprint: str, move: str, result: Mapping[str, Any] | None = None
    ) -> Entry:
        row = fetch_one(_move_sql(move), self._move_params(key, fingerprint, move, result))
        if row is None:
            raise self._why_not(key, fingerprint, move)
        stored = None if result is None else Result.from_dict(dict(result))
        return Entry(key, fingerprint, OPERATION_MOVES[move][1], stored, row[0], row[1])

    def _move_params(
        self, key: str, fingerprint: str, move: str, result: Mapping[str, Any] | None
    ) -> list[Any]:
        sources, target = OPERATION_MOVES[move]
        (source,) = sources  # the moves a driver makes leave one state
        stored = None if result is None else json.dumps(result)
        now = timezone.now()
        return [
            target.value,
            stored,
            now,
            key,
            fingerprint,
            now,
            source.value if source else "",
            target.value,
            self.task_id,
        ]

    # -- the step's save -------------------------------------------------------------------

    def _save(self, step: Step, record: Record | None) -> Saved:
        events, checkpoint = min(len(step.events), 1), step.checkpoint is not None
        answer = step.answer
        answered = [] if answer is None else self._answer_params(answer)
        if record is not None and (step.assumes is not None or answer is not None):
            # A record rides alone on the runner's save: never a move or an answer dropped.
            raise ValueError(f"task {self.task_id}: a save with a record and more to make")
        if step.assumes is not None:
            return self._save_assuming(step, step.assumes, answered)
        if record is None:
            sql = _save_sql(
                events, checkpoint, step.durable, answer is not None, "", self._version is not None
            )
            row = self._fetch(sql, [*self._save_params(step), *answered])
            saved = self._saved(step, row)
            if answer is not None and row is not None and not row[2]:
                # The answer's insert conflicted: a retry.
                raise AnsweredBefore(f"request {answer.request_id} was answered before")
            return saved
        params = self._move_params(record.key, record.fingerprint, "record", record.result)
        row = fetch_one(
            _save_with_record_sql(events, checkpoint), [*params, *self._save_params(step)]
        )
        failed = None
        if row is not None and row[2] == 0:
            failed = self._why_not(record.key, record.fingerprint, "record")
        return self._saved(step, row, failed)

    def _save_assuming(
        self, step: Step, move: Claiming | Record, answered: Sequence[Any]
    ) -> Saved:
        """The save that makes the move its step assumed, in one statement (``_ASSUMED``)."""
        now = timezone.now()
        task = self.task_id
        if isinstance(move, Claiming):
            assumes = "claim"
            made = [move.key, move.fingerprint, move.tool, task, move.args, now, now, now, task]
        else:
            assumes = "record"
            made = self._move_params(move.key, move.fingerprint, "record", move.result)
        sql = _save_sql(
            min(len(step.events), 1),
            step.checkpoint is not None,
            step.durable,
            step.answer is not None,
            assumes,
            self._version is not None,
        )
        gate = [task, self.owner] if self._version is None else [task, self.owner, self._version]
        row = self._fetch(sql, [*gate, *made, *self._save_params(step, now), *answered])
        if row is None:  # the gate found no row this driver drives: nothing was moved
            raise LeaseLost(f"task {task} is no longer driven by this driver")
        if row[1] is None:
            raise MoveRefused(f"task {task}: the {assumes} of {move.key!r} was not made")
        saved = self._saved(step, row)
        if step.answer is not None and not row[2]:
            raise AnsweredBefore(f"request {step.answer.request_id} was answered before")
        return saved

    def _save_params(self, step: Step, now: datetime | None = None) -> list[Any]:
        """The parameters of a save: counters, the time, the checkpoint, the lease, then
        the events."""
        usage = step.usage
        params: list[Any] = [usage[name] for name in _DIMENSIONS]
        params += (step.revision, self.next_seq + len(step.events), now or timezone.now())
        if step.checkpoint is not None:
            params.append(json.dumps(step.checkpoint))
        params += (self.task_id, self.owner)
        if self._version is not None:
            params.append(self._version)
        if step.events:
            # Times as ISO text by the encoder, sparing a copy of every event.
            events = json.dumps(list(step.events), default=_iso)
            params += (self.task_id, self.phase, self.next_seq, events)
        return params

    def _saved(
        self, step: Step, row: tuple[Any, ...] | None, failed: LedgerError | None = None
    ) -> Saved:
        """Take in what a save returned: the stop fact, or that the lease is gone."""
        if row is None:
            raise LeaseLost(f"task {self.task_id} is no longer driven by this driver")
        self.next_seq += len(step.events)
        step.saved = Saved(bool(row[0]), failed)
        return step.saved

    def _fetch(self, sql: str, params: list[Any]) -> tuple[Any, ...] | None:
        """A save's statement; an unlocked step's that met a retry's answer failed whole.

        An unlocked step's save runs in autocommit (the API opens no transaction around a
        request); inside a transaction all the same (a caller's, a test's), it runs in a
        savepoint of its own, so that failing whole leaves that transaction usable for the
        stored answer's read."""
        if self._version is not None and connection.in_atomic_block:
            with transaction.atomic():
                return self._fetch_once(sql, params)
        return self._fetch_once(sql, params)

    def _fetch_once(self, sql: str, params: list[Any]) -> tuple[Any, ...] | None:
        try:
            return fetch_one(sql, params)
        except IntegrityError as exc:
            if self._version is None or not _violates(exc, _ANSWERED_ONCE):
                raise
            raise AnsweredBefore(f"task {self.task_id}: the request was answered before") from exc


class _Unlocked(PostgresStore):
    """The store of an attached step run on the task row as read without its lock
    (:meth:`PostgresStore.read_step`): its one write is the step's last save, the one that
    stores its answer, made only while the row is still at the version read (and with the
    claim or record the step assumed). Anything else the step would do — any other write,
    a read of the ledger or the trace, taking the lease — and a row changed meanwhile raise
    :class:`NeedsLock`, nothing written; so does every call after the first refusal (the
    guard may have swallowed it, as a ledger error it stops on). Its driver runs the step
    again, holding the row's lock."""

    def __init__(self, task_id: int, owner: str, version: str) -> None:
        super().__init__(task_id, owner)
        self._version = version
        self._refused: NeedsLock | None = None

    def _refuse(self, what: str) -> NeedsLock:
        if self._refused is None:
            self._refused = NeedsLock(f"task {self.task_id}: {what} needs the row's lock")
        return self._refused

    def save(self, step: Step, *, record: Record | None = None) -> Saved:
        if self._refused is not None:
            raise self._refused
        if record is not None or step.answer is None:
            raise self._refuse("a save before the step's last")
        try:
            return self._save(step, None)
        except LeaseLost:
            # The row is no longer at the version read (or no longer this driver's):
            # nothing was saved; with the lock, the step meets the row as it is now.
            raise self._refuse("a row changed since it was read") from None

    def open_step(self, request_id: str | None) -> tuple[Task, Answer | None] | None:
        raise self._refuse("locking the row")

    def read_step(self, request_id: str) -> tuple[Task, Answer | None, StepStore] | None:
        raise self._refuse("reading the row again")

    def remember(self, answer: Answer) -> None:
        raise self._refuse("an answer stored without a save")

    def take_lease(self, seconds: float) -> Task | str:
        raise self._refuse("taking the lease")

    def renew_lease(self, seconds: float) -> bool:
        raise self._refuse("renewing the lease")

    def release_lease(self) -> bool:
        raise self._refuse("releasing the lease")

    def stop_requested(self) -> bool:
        raise self._refuse("reading the stop fact again")

    def get(self, key: str) -> Entry | None:
        raise self._refuse("reading the ledger")

    def get_many(self, keys: Sequence[str]) -> dict[str, Entry]:
        raise self._refuse("reading the ledger")

    def claim(
        self, key: str, fingerprint: str, *, tool: str, args: str, carry: Step | None = None
    ) -> Claim:
        raise self._refuse("a claim of its own")

    def settle(
        self, key: str, fingerprint: str, move: str, result: Mapping[str, Any] | None = None
    ) -> Entry:
        raise self._refuse("an operation's move of its own")

    def resolve(
        self, key: str, move: str, *, result: Mapping[str, Any] | None, evidence: str
    ) -> Entry:
        raise self._refuse("an operation's move of its own")

    def finish(
        self, report: Report, *, checkpoint: Mapping[str, Any] | None, summary: Usage | None = None
    ) -> None:
        raise self._refuse("a stop")

    def history(self, phase: int) -> dict[str, list[Any]]:
        raise self._refuse("reading the trace")


def _task_of(row: Sequence[Any]) -> Task:
    """The task, as the ORM would load it, from the step's read of its columns."""
    values = [
        value if convert is None else convert(value, None, connection)
        for convert, value in zip(_TASK_CONVERTERS, row, strict=True)
    ]
    return Task.from_db(connection.alias, _TASK_NAMES, values)


def _violates(exc: IntegrityError, constraint: str) -> bool:
    """Whether ``exc`` is the violation of ``constraint`` (a unique one, by its name)."""
    cause = exc.__cause__
    diag = getattr(cause, "diag", None)
    return isinstance(cause, psycopg.errors.UniqueViolation) and (
        getattr(diag, "constraint_name", None) == constraint
    )


def _iso(value: Any) -> str:
    """A trace event's time (``at``) as JSON text; nothing else in an event needs it."""
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")
