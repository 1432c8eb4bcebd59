"""The state machines: every move of a task's state, and nothing else moves it; the moves
of operations, approvals and notices too.

Each move is a conditional update "from this state to that one" (:data:`TASK_MOVES`)
that writes its history in the same transaction: a stop report, the phase's end and a
``STOP`` trace event when a task reaches a terminal state; the new phase when it resumes.
A move that finds the task in another state than the one it starts from raises
:class:`LostRace`: someone else moved it first. Call every move inside a transaction;
the services lock the task row first and write their audit entry in the same
transaction, the drivers and the recovery sweep hold the row or its lease.

The tables are data in ``console.models`` (layer 1), so that a task can say what it allows
(``Task.can_stop`` and its kin read :data:`TASK_MOVES` there); the moves are made here.

Operations move by :func:`operation_move`, by ``guard.steps.OPERATION_MOVES``: recovery
here, the step stores' ORM moves and the services' reconciliation all call it (the
PostgreSQL store's statements build their conditions from the same table). An approval is
answered by :func:`approval_move` (:data:`APPROVAL_MOVES`), a notice's delivery moves by
:func:`notice_move` (:data:`NOTICE_MOVES`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import replace
from datetime import UTC, timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from console import rollups
from console.models import (
    APPROVAL_MOVES,
    CLIENT_LOST,
    NOTICE_MOVES,
    RESTART_LOOP,
    TASK_MOVES,
    TERMINAL_STATES,
    Approval,
    ApprovalState,
    AuditAction,
    AuditEntry,
    EventKind,
    Notice,
    NoticeKind,
    NotificationEvent,
    Operation,
    OperationEvent,
    Phase,
    StopReport,
    Task,
    TaskState,
    TraceEvent,
)
from console.records.redaction import preview, redact, redact_text
from guard import Approval as GuardApproval
from guard import Call, Guard, Kind, Limits, Reason, Report, Result, State, Usage
from guard import OperationState as EntryState
from guard.steps import DIMENSIONS, OPERATION_MOVES, SETTLE_MOVES, Effect
from guard.steps import Operation as Entry
from guard.steps import fingerprint as call_fingerprint

logger = logging.getLogger(__name__)

_LOSE_FROM = OPERATION_MOVES["lose"][0]
# The moves made from trusted evidence: the evidence is kept on the row, not only in its
# history.
_EVIDENCED = frozenset(SETTLE_MOVES.values())


class LostRace(RuntimeError):
    """The task was not in the state a move starts from: someone else moved it first."""


# -- the task's values, from DIMENSIONS ------------------------------------------------------


def limits_of(task: Task) -> Limits:
    """The task's cumulative limits as the guard's value."""
    raw = dict(task.limits)
    raw["exempt"] = frozenset(raw.get("exempt", ()))
    return Limits(**raw)


def usage_of(task: Task) -> Usage:
    """What the task has spent, from its counters (``Usage`` fields are ``Task`` columns)."""
    return Usage(**{d.used: getattr(task, d.used) for d in DIMENSIONS})


def guard_of(
    task: Task,
    options: Mapping[str, Any],
    *,
    history: Callable[[], Mapping[str, Any]],
    elapsed_ms: int = 0,
) -> Guard:
    """The task's guard for a driver's step: restored from its checkpoint when that is of
    the task's current phase (a crash, a redelivery, an attached client's next request:
    the detectors' memory goes on, and a step in progress with it), else a new phase's
    (budgets carried over, repeat memory afresh). The counters always come from the row,
    which is never behind the checkpoint; ``elapsed_ms`` is time the row has not counted
    yet (an attached client's model thinking since its last step). ``history`` gives the
    phase's history when the guard needs it (``Guard.restore``); ``options`` are the
    guard's constructor options. The one restore path of both drivers."""
    checkpoint = task.checkpoint if isinstance(task.checkpoint, dict) else {}
    used = usage_of(task)
    if elapsed_ms:
        used = replace(used, elapsed_ms=used.elapsed_ms + elapsed_ms)
    if not of_this_phase(task):
        return Guard(limits_of(task), used=used, revision=task.revision, **options)
    saved = {**checkpoint["guard"], "usage": used.to_dict()}
    return Guard.restore(saved, limits_of(task), history=history, **options)


def approvals_for(task: Task) -> list[GuardApproval]:
    """The answers people gave to the call that stopped the phase before this one: they
    are this phase's to use, once (both drivers' guards take them). An approved call is
    handed over whole when its stored (redacted) arguments are still the exact call; when
    the redaction changed them, the model asks for it again and only that exact call
    matches (an attached client always asks again: its console never runs a call)."""
    if task.phase < 2:
        return []
    rows = Approval.objects.filter(task_id=task.id, phase=task.phase - 1).exclude(
        state=ApprovalState.PENDING
    )
    answers: list[GuardApproval] = []
    for row in rows:
        # A rejection that ended the task still binds a later resumption: the model is
        # told, and asking for that call again ends the task again.
        approved = row.state == ApprovalState.APPROVED
        key = row.operation_key or None
        effect: Effect = "write" if row.effect == "write" else "read"
        call = Call(row.tool, row.args, effect, key)
        try:
            exact = call_fingerprint(row.tool, row.args) == row.fingerprint
        except Exception:
            exact = False
        answers.append(
            GuardApproval(
                row.fingerprint,
                key,
                approved,
                call=call if exact else None,
                reason=row.reason,
                tool=row.tool,
            )
        )
    return answers


def of_this_phase(task: Task) -> bool:
    """Whether the task's checkpoint holds a guard of its current phase (else the next
    drive starts the phase afresh)."""
    checkpoint = task.checkpoint if isinstance(task.checkpoint, dict) else {}
    return checkpoint.get("phase") == task.phase and isinstance(checkpoint.get("guard"), dict)


def counters_of(usage: Usage, revision: int) -> dict[str, int]:
    """The task row's counter columns for ``usage`` and ``revision``."""
    return {**{d.used: getattr(usage, d.used) for d in DIMENSIONS}, "revision": revision}


def entry_of(row: Operation) -> Entry:
    """The guard's view of an operation row."""
    return entry_from(row.key, row.fingerprint, row.state, row.result, row.attempts, row.evidence)


ENTRY_FIELDS = ("key", "fingerprint", "state", "result", "attempts", "evidence")
"""The operation columns :func:`entry_from` takes, in its order (for ``values_list``)."""


def entry_from(
    key: str,
    fingerprint: str,
    state: str,
    result: Mapping[str, Any] | None,
    attempts: int,
    evidence: str,
) -> Entry:
    """The guard's view of an operation from its :data:`ENTRY_FIELDS` columns: a stop
    report lists every operation of the task, so these are read without model objects."""
    return Entry(
        key=key,
        fingerprint=fingerprint,
        state=EntryState(state),
        result=None if result is None else Result.from_dict(result),
        attempts=attempts,
        evidence=evidence,
    )


def report_from_task(task: Task, state: str, reason: str, detail: str = "") -> Report:
    """A stop report for a task stopped outside the guard (before it ran, or by recovery)."""
    operations = tuple(entry_of(op) for op in task.operations.order_by("claimed_at", "id"))
    return Report(
        state=State(state),
        reason=Reason(reason) if reason in Reason else Reason.OPERATOR_STOP,
        revision=task.revision,
        operations=operations,
        remaining=limits_of(task).remaining(usage_of(task)),
        detail=detail,
        **{d.used: getattr(task, d.used) for d in DIMENSIONS},
    )


# -- operation moves -------------------------------------------------------------------------


def operation_move(
    op: Operation,
    move: str,
    *,
    task_id: int | None,
    actor: User | None = None,
    evidence: str = "",
    result: Mapping[str, Any] | None = None,
) -> Operation:
    """Move ``op`` (as the caller saw it, holding its row) by ``OPERATION_MOVES[move]``, as
    a conditional update from the state seen, with its history row (caused by ``task_id``
    or ``actor``, with ``evidence``); ``result`` is the stored result (``None`` clears it).
    Raises :class:`LostRace` when ``op`` is not in a state the move may leave. Inside a
    transaction; ``op`` is updated in place."""
    sources, target = OPERATION_MOVES[move]
    if op.state not in {s.value for s in sources if s is not None}:
        raise LostRace(f"operation {op.key!r} is {op.state}, cannot become {target}")
    before, now = op.state, timezone.now()
    stored = None if result is None else dict(result)
    kept = evidence if evidence and move in _EVIDENCED else op.evidence
    moved = Operation.objects.filter(id=op.id, state=before).update(
        state=target.value, result=stored, evidence=kept, updated_at=now
    )
    if moved != 1:
        raise LostRace(f"operation {op.key!r} is no longer {before}")
    op.state, op.result, op.evidence, op.updated_at = target.value, stored, kept, now
    OperationEvent.objects.create(
        operation=op,
        from_state=before,
        to_state=target.value,
        task_id=task_id,
        actor=actor,
        evidence=evidence,
    )
    return op


# -- approval and notice moves ---------------------------------------------------------------


def approval_move(
    approval: Approval, move: str, *, actor: User, reason: str, on_reject: str = ""
) -> Approval:
    """Answer ``approval`` (as the caller saw it, holding its row and its task's) by
    ``APPROVAL_MOVES[move]``: a conditional update from the state seen, with who answered,
    when and why (``on_reject``: what a rejection does to the task). Raises
    :class:`LostRace` when it is not in a state the move may leave, or was answered
    meanwhile. Inside a transaction, whose audit entry (the caller's) is its history;
    ``approval`` is updated in place."""
    sources, target = APPROVAL_MOVES[move]
    seen = approval.state
    if seen not in sources:
        raise LostRace(f"approval {approval.id} is {seen}, cannot become {target}")
    now = timezone.now()
    answer: dict[str, Any] = {
        "decided_by": actor,
        "decided_at": now,
        "reason": reason,
        "on_reject": on_reject,
    }
    if Approval.objects.filter(id=approval.id, state=seen).update(state=target, **answer) != 1:
        raise LostRace(f"approval {approval.id} is no longer {seen}")
    approval.state = target
    for name, value in answer.items():
        setattr(approval, name, value)
    return approval


def notice_move(notice: Notice, move: str, *, when: Q | None = None, **fields: Any) -> bool:
    """Move ``notice`` by ``NOTICE_MOVES[move]`` with ``fields``, as a conditional update
    from the state and the try number it was seen in (``notice.state``,
    ``notice.attempts``), and only ``when`` that holds too (a claim: its channel is still
    active): the try number is the claim's token, so a worker whose claim ran out and was
    taken by another moves nothing. True if it moved (``notice`` is then updated in
    place); False if someone else moved it first, or the move cannot leave its state. A
    lost race is no error here: the other worker's try decides the state."""
    sources, target = NOTICE_MOVES[move]
    if notice.state not in sources:
        return False
    seen = Notice.objects.filter(
        when or Q(), id=notice.id, state=notice.state, attempts=notice.attempts
    )
    if seen.update(state=target, **fields) != 1:
        return False
    notice.state = target
    for name, value in fields.items():
        setattr(notice, name, value)
    return True


# -- moves -----------------------------------------------------------------------------------


def _moved(task: Task, move: str, target: str, *, owner: str | None = None, **fields: Any) -> None:
    """The conditional update of one move: from the state ``task`` was seen in (and the
    reason it stopped for, where the move asks), which the move may leave, to ``target``,
    and only while ``owner`` holds the lease when given; raises :class:`LostRace` unless
    exactly one row changed."""
    seen, reason = str(task.state), task.reason
    rule = TASK_MOVES[move]
    if not rule.leaves(seen, reason) or target not in rule.targets:
        stopped = f" ({reason})" if reason else ""
        raise LostRace(f"task {task.id} cannot {move} from {seen}{stopped} to {target}")
    condition: dict[str, Any] = {"id": task.id, "state": seen}
    if rule.stopped_for is not None and seen in TERMINAL_STATES:
        condition["reason"] = reason
    if owner is not None:
        condition["lease_owner"] = owner
    if seen in TERMINAL_STATES:
        rollups.unroll(task.id)  # out of /metrics' totals before it is anything else
    if Task.objects.filter(**condition).update(state=target, **fields) != 1:
        raise LostRace(f"task {task.id} is no longer {seen}")


def finish_task(
    task: Task,
    state: str,
    reason: str,
    report: Mapping[str, Any],
    *,
    detail: str = "",
    counters: Mapping[str, int] | None = None,
    checkpoint: Any = None,
    owner: str | None = None,
) -> None:
    """Move ``task`` (as the caller saw it, holding its row) to a terminal state with its
    stop report, its phase's end and a ``STOP`` trace event.

    From ``RUNNING`` it is ``finish`` (``owner``: only while that driver holds the lease),
    from ``QUEUED`` a ``hold`` (``NEEDS_HUMAN``) or a ``cancel``; a task held for a restart
    loop may be cancelled too, and one waiting for an approval is closed by its rejection.
    A ``client_lost`` stop is ``lose_client``, from either.
    """
    seen = str(task.state)
    if reason == CLIENT_LOST:
        move = "lose_client"
    elif seen == TaskState.RUNNING:
        move = "finish"
    elif reason == Reason.APPROVAL_REJECTED:
        move = "close"
    elif state == TaskState.CANCELLED:
        move = "cancel"  # a stopped task only if it was held (TASK_MOVES says for what)
    else:
        move = "hold"
    now = timezone.now()
    detail = redact_text(detail)  # error messages may quote credentials
    fields: dict[str, Any] = {
        "reason": reason,
        "detail": detail[:2000],
        "finished_at": now,
        "updated_at": now,
        "lease_owner": "",
        "lease_expires_at": None,
        **(counters or {}),
    }
    if checkpoint is not None:
        fields["checkpoint"] = checkpoint
    _moved(task, move, state, owner=owner, **fields)
    Phase.objects.filter(task_id=task.id, number=task.phase).update(
        ended_at=now, state=state, reason=reason
    )
    stored = redact(report)
    StopReport.objects.create(
        task_id=task.id, phase=task.phase, state=state, reason=reason, report=stored
    )
    if reason == Reason.APPROVAL_REQUIRED:
        _hold_for_approval(task, stored.get("pending"))
    if state == TaskState.NEEDS_HUMAN:
        # The notification outbox's row, in this transaction: a person is told only of a
        # stop that was kept, and of every one (a hold for a restart loop included).
        NotificationEvent.objects.create(
            task_id=task.id,
            kind=NoticeKind.RESTART_LOOP if reason == RESTART_LOOP else NoticeKind.NEEDS_HUMAN,
            reason=reason,
            detail=detail[:500],
        )
    TraceEvent.objects.create(
        task_id=task.id,
        phase=task.phase,
        seq=_take_seq(task.id, 1),
        kind=EventKind.STOP,
        decision="",
        reason=reason,
        detail=f"{state}" + (f": {detail}" if detail else ""),
    )
    logger.info("task %s stopped %s/%s %s", task.id, state, reason, detail)


def _hold_for_approval(task: Task, pending: Any) -> None:
    """The approval queue's row for the call a stop holds back, in the stop's transaction
    (``pending`` is the stop report's, redacted as stored)."""
    if not isinstance(pending, Mapping):
        raise ValueError(f"task {task.id} stopped approval_required without a pending call")
    args = pending.get("args")
    Approval.objects.create(
        task_id=task.id,
        phase=task.phase,
        tool=str(pending.get("tool") or "")[:200],
        effect=str(pending.get("effect") or "")[:10],
        operation_key=str(pending.get("operation_key") or "")[:200],
        fingerprint=str(pending.get("fingerprint") or "")[:64],
        args=args if isinstance(args, dict) else {},
        args_preview=preview(args),
    )


def _take_seq(task_id: int, count: int) -> int:
    """Reserve ``count`` trace sequence numbers; returns the first. Inside a transaction."""
    Task.objects.filter(id=task_id).update(next_seq=F("next_seq") + count)
    last = Task.objects.filter(id=task_id).values_list("next_seq", flat=True).get()
    return int(last) - count


def finish_drive(
    task_id: int,
    owner: str,
    report: Report,
    *,
    checkpoint: Any = None,
    summary: Usage | None = None,
) -> None:
    """A driver records the guard's stop (``RUNNING`` → the report's state) while it holds
    the lease; :class:`LostRace` if it does not any more. With ``summary`` a summary turn
    follows: the stored report says so (the page waits for it), and the counters are what
    the task has spent by then (more than the report's: the turn's reservation)."""
    task = (
        Task.objects.select_for_update()
        .filter(id=task_id, lease_owner=owner, state=TaskState.RUNNING)
        .first()
    )
    if task is None:
        raise LostRace(f"task {task_id} is no longer driven by this driver")
    stored = report.to_dict()
    if report.reason is Reason.OPERATOR_STOP and not report.detail:
        stored["detail"] = operator_stop_detail(task)
    if summary is not None:
        stored["summary_due"] = True
    finish_task(
        task,
        report.state.value,
        report.reason.value,
        stored,
        detail=stored["detail"],
        counters=counters_of(summary or report.usage, report.revision),
        checkpoint=checkpoint,
        owner=owner,
    )


def operator_stop_detail(task: Task) -> str:
    """Who asked ``task`` to stop, and why, for its stop report (the guard only knows that
    a stop was asked for)."""
    who = task.stop_requested_by
    if who is None:
        return ""
    note = task.stop_note.strip()
    return f"stopped by {who.get_username()}" + (f": {note}" if note else "")


def start_drive(task_id: int, owner: str, *, lease_seconds: float) -> Task | str:
    """Give ``owner`` the task's lease (``start``, or ``take_over`` from a lost driver), or
    say why not. Settles a lost driver's leftovers first (:func:`recover`); a stop recorded
    before the task ran ends it here. Inside a transaction."""
    task = Task.objects.select_for_update().filter(id=task_id).first()
    if task is None:
        return "no such task"
    if task.state not in (TaskState.QUEUED, TaskState.RUNNING):
        return f"nothing to do: the task is {task.state}"
    now = timezone.now()
    alive_until = task.lease_alive_until(now)
    if alive_until is not None:
        if task.lease_owner != owner:
            # Never the holder's lease itself: it is that driver's credential of the task.
            left = max(1, math.ceil((alive_until - now).total_seconds()))
            return f"another driver holds the lease for {left} more seconds"
    elif task.state == TaskState.RUNNING and not recover(task, why="driver lost"):
        return "recovered: the task stopped"
    if task.stop_requested_at is not None and task.state == TaskState.QUEUED:
        # Only a task that has not run ends here: a running one taken again by its holder
        # may have a write in flight, and learns of the stop at its next model call or
        # claim, as every driver does.
        report = report_from_task(task, State.CANCELLED, Reason.OPERATOR_STOP)
        finish_task(task, State.CANCELLED, Reason.OPERATOR_STOP, report.to_dict())
        return "stopped before it ran"
    expires = now + timedelta(seconds=lease_seconds)
    move = "start" if task.state == TaskState.QUEUED else "take_over"
    _moved(
        task,
        move,
        TaskState.RUNNING,
        lease_owner=owner,
        lease_expires_at=expires,
        updated_at=now,
    )
    task.state, task.lease_owner, task.lease_expires_at, task.updated_at = (
        TaskState.RUNNING,
        owner,
        expires,
        now,
    )
    Phase.objects.filter(task_id=task.id, number=task.phase, started_at=None).update(started_at=now)
    return task


def recover(task: Task, *, why: str, found: Mapping[str, Mapping[str, Any]] | None = None) -> bool:
    """A driver of ``task`` is gone. Settle what it left behind; True if the task may go on.

    Its ``IN_FLIGHT`` operations are lost (``OPERATION_MOVES["lose"]``: ``UNKNOWN``): they
    may or may not have happened and are never run again. ``found`` is what their tools'
    lookups said of them, by operation key, asked before this transaction (a lookup is I/O
    on the business system: ``console.drivers.runner`` asks it outside any transaction), in the
    shape of :func:`settle_by_lookup`'s ``found``; each answer that settles its write moves
    it on from ``UNKNOWN`` (:func:`settle_by_lookup`, with its history and audit entry).
    A write left ``UNKNOWN`` stops the task for a human (an attached task waits for its
    client first, which may settle them by its own lookup).
    Call inside a transaction holding the task row.
    """
    stranded = _lose_in_flight(task, why=why)
    task.recoveries += 1
    Task.objects.filter(id=task.id).update(recoveries=F("recoveries") + 1)
    answers = found or {}
    said = {op.key: answers[op.key] for op in stranded if op.key in answers}
    unsettled = [op for op in stranded if not settle_by_lookup(op, said.get(op.key), task=task)]
    logger.warning(
        "task %s recovered (%s): %d write(s) lost, %d settled by a lookup",
        task.id,
        why,
        len(stranded),
        len(stranded) - len(unsettled),
    )
    # An attached task's client may come back and settle them with its tool's own lookup
    # before anyone is paged (docs/protocol.md, "Coming back"): it waits for its client,
    # QUEUED, until it returns or is given up on (client_lost), unless asked to stop.
    waits_for_client = (
        task.is_attached
        and task.stop_requested_at is None
        and task.recoveries <= settings.LOOPGUARD_MAX_RECOVERIES
    )
    if unsettled and not waits_for_client:
        keys = ", ".join(op.key for op in unsettled)
        detail = f"{why}; in flight when it stopped: {keys}"
        told = "; ".join(
            f"{key}: {_told(said[key])}" for key in (op.key for op in unsettled) if key in said
        )
        if told:
            detail += f" (the lookup: {told})"
        report = report_from_task(task, State.NEEDS_HUMAN, Reason.UNKNOWN_COMMIT, detail)
        finish_task(task, State.NEEDS_HUMAN, Reason.UNKNOWN_COMMIT, report.to_dict(), detail=detail)
        return False
    if task.stop_requested_at is not None:
        report = report_from_task(task, State.CANCELLED, Reason.OPERATOR_STOP, why)
        finish_task(task, State.CANCELLED, Reason.OPERATOR_STOP, report.to_dict(), detail=why)
        return False
    if task.recoveries > settings.LOOPGUARD_MAX_RECOVERIES:
        detail = f"{why}; the driver was lost {task.recoveries} times"
        report = report_from_task(task, State.FAILED, Reason.EXECUTOR_ERROR, detail)
        finish_task(task, State.FAILED, Reason.EXECUTOR_ERROR, report.to_dict(), detail=detail)
        return False
    return True


RECOVERY_ACCOUNT = "loopguard-recovery"
"""The user the console's recovery acts as in the audit log when a tool's lookup settles a
lost write (:func:`recovery_actor`). Nobody signs in as it: it has no usable password, is
not active and holds no role."""


def recovery_quiet_seconds() -> float:
    """How long a lost driver must have been silent (since its lease ran out) before its
    write may be settled ``NOT_COMMITTED`` from a lookup: ``LOOPGUARD_RECOVERY_QUIET_SECONDS``,
    by default three leases (``LOOPGUARD_LEASE_SECONDS``)."""
    return float(settings.LOOPGUARD_RECOVERY_QUIET_SECONDS)


def quiet_since(task: Task) -> bool:
    """Whether the driver that lost ``task`` has been silent long enough that it cannot
    still be inside its write (:func:`recovery_quiet_seconds` since its lease ran out).

    Why it matters: a lease runs out when its driver is dead, but also when it is frozen or
    cut off from the database while its tool still reaches the business system. Such a
    driver may still make the write after a lookup found nothing; "not committed" then
    lets the write be claimed again, and it would happen twice (unless the business system
    refuses a second action under the operation key). "Committed" is safe at any time.
    """
    expired = task.lease_expires_at
    if expired is None:
        return False
    silent = (timezone.now() - expired).total_seconds()
    return silent >= recovery_quiet_seconds()


def recovery_actor() -> User | None:
    """The service account (:data:`RECOVERY_ACCOUNT`) an automatic settle is audited as,
    created on first use; ``None`` (and an error logged) when a person's account holds that
    name, which must not be made to say what a lookup said."""
    from django.contrib.auth.hashers import make_password

    user, _ = User.objects.get_or_create(
        username=RECOVERY_ACCOUNT,
        defaults={"is_active": False, "password": make_password(None)},
    )
    if user.is_active or user.has_usable_password():
        logger.error(
            "the user %r can sign in: it is not the console's recovery account, so no lost "
            "write is settled automatically in its name",
            RECOVERY_ACCOUNT,
        )
        return None
    return user


def settle_by_lookup(op: Operation, found: Mapping[str, Any] | None, *, task: Task) -> bool:
    """Settle ``op``, a write of ``task`` its lost driver left ``UNKNOWN``, from what its
    tool's lookup ``found`` (``committed`` True or False, ``evidence``, ``result``: a
    ``Result`` as a dict; or an ``error``); True if it moved.

    ``committed`` True is ``settle_committed`` with the lookup's result (what the task's
    next request for the write reuses); False is ``settle_not_committed`` (the write may be
    claimed again, and that claim asks the lookup once more first), only once the driver is
    :func:`quiet_since` long enough; anything else settles nothing. Each move is a
    conditional update with its history row and an audit entry (by :func:`recovery_actor`,
    with the lookup's answer) in the caller's transaction; a move someone made first
    (a reconciler) is theirs: this one backs off. Holding the task row."""
    if found is None or found.get("committed") not in (True, False):
        return False
    committed = found["committed"] is True
    if not committed and not quiet_since(task):
        return False
    actor = recovery_actor()
    if actor is None:
        return False
    said = str(found.get("evidence") or ("found" if committed else "not found"))
    evidence = redact_text(f"the tool's lookup, after its driver was lost: {said}")[:2000]
    result = found.get("result") if committed else None
    if committed and not isinstance(result, Mapping):
        result = Result(Kind.SUCCESS).to_dict()
    move = SETTLE_MOVES[committed]
    before = op.state
    try:
        operation_move(op, move, task_id=task.id, actor=actor, evidence=evidence, result=result)
    except LostRace:
        logger.info("operation %s was settled by someone else first", op.key)
        return False
    audit_automatic_settle(
        op, actor=actor, task_id=task.id, before=before, said=said,
        lookup=dict(redact(dict(found))),
    )  # fmt: skip
    return True


def audit_automatic_settle(
    op: Operation, *, actor: User, task_id: int, before: str, said: str, **answer: Any
) -> AuditEntry:
    """The audit entry of a write settled without a person (a tool's lookup, or the client
    that ran it): ``actor`` is in whose name, ``said`` the evidence, ``answer`` what else the
    entry keeps of it. Call after the operation's move, in its transaction."""
    committed = op.state == EntryState.COMMITTED
    return AuditEntry.objects.create(
        actor=actor,
        action=AuditAction.MARK_COMMITTED if committed else AuditAction.MARK_NOT_COMMITTED,
        task_id=task_id,
        operation=op,
        reason=f"settled automatically, without a person: {said}",
        before={"state": before},
        after={"state": op.state, "by": "automatic settle", **answer},
    )


def _told(found: Mapping[str, Any]) -> str:
    """What a lookup said, in a stop report's detail."""
    if found.get("error"):
        return str(found["error"])[:200]
    if found.get("committed") is None:
        return "it cannot tell"
    return "not found, but its driver may still be running it"


def _lose_in_flight(task: Task, *, why: str) -> list[Operation]:
    """The task's ``IN_FLIGHT`` operations, made ``UNKNOWN`` (``OPERATION_MOVES["lose"]``)
    with ``why`` in their history: their driver is gone. Holding the task row."""
    stranded = list(
        Operation.objects.select_for_update()
        .filter(task_id=task.id, state__in=[s.value for s in _LOSE_FROM if s is not None])
        .order_by("id")
    )
    for op in stranded:
        operation_move(op, "lose", task_id=task.id, evidence=f"recovery: {why}")
    return stranded


def requeue(task: Task) -> None:
    """``requeue``: a recovered task whose driver is gone goes back to the queue."""
    # An attached task keeps its lapsed lease's expiry (its owner goes): it says since when
    # the task has waited for its client, which its page shows and the client-lost rule
    # measures from (``models.waiting_for_client``). Nothing takes an expired lease for a
    # live one: a driver needs an owner and an expiry ahead.
    fields: dict[str, Any] = {"lease_owner": "", "updated_at": timezone.now()}
    if not task.is_attached:
        fields["lease_expires_at"] = None
    _moved(task, "requeue", TaskState.QUEUED, **fields)


def lose_client(task: Task) -> None:
    """``lose_client``: an attached task whose client has not come back within
    ``LOOPGUARD_ATTACHED_CLIENT_LOST_SECONDS`` of its lease lapsing stops
    ``NEEDS_HUMAN``/``client_lost``, with a stop report of its own and a notice. A write it
    left ``IN_FLIGHT`` (no sweep ran between the lapse and now) becomes ``UNKNOWN`` first,
    as recovery makes it. Inside a transaction holding the task row."""
    allowed = float(settings.LOOPGUARD_ATTACHED_CLIENT_LOST_SECONDS)
    lapsed = task.lease_expires_at
    when = "" if lapsed is None else f" at {lapsed.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC"
    detail = f"its client's lease lapsed{when} and it did not come back within {allowed:g} s"
    stranded = _lose_in_flight(task, why="the client did not come back")
    if stranded:
        detail += "; in flight when it stopped: " + ", ".join(op.key for op in stranded)
    report = report_from_task(task, State.NEEDS_HUMAN, CLIENT_LOST, detail).to_dict()
    report["reason"] = CLIENT_LOST
    report["resume_condition"] = (
        "Reconcile any UNKNOWN write; approve resumption once its client (or a new process "
        "of the same person, with the task id) is ready to go on."
    )
    finish_task(task, State.NEEDS_HUMAN, CLIENT_LOST, report, detail=detail)


def hold(task: Task, detail: str) -> None:
    """``hold``: a task started too often with the same goal waits for a person."""
    report = report_from_task(task, State.NEEDS_HUMAN, RESTART_LOOP, detail).to_dict()
    report["reason"] = RESTART_LOOP
    report["resume_condition"] = (
        "Find what keeps starting this goal again; approve resumption to run it anyway."
    )
    finish_task(task, State.NEEDS_HUMAN, RESTART_LOOP, report, detail=detail)


def request_stop(task: Task, *, actor: User, note: str) -> None:
    """``request_stop``: record the stop fact of a running task; its driver ends it."""
    now = timezone.now()
    if task.stop_requested_at is not None:
        raise LostRace(f"task {task.id} is already stopping")
    _moved(
        task,
        "request_stop",
        TaskState.RUNNING,
        stop_requested_at=now,
        stop_requested_by=actor,
        stop_note=note,
        updated_at=now,
    )


def cancel(task: Task, *, actor: User, note: str) -> None:
    """``cancel``: a task that has not run (queued, or held for a restart loop) ends
    ``CANCELLED``/``operator_stop`` at once, with a stop report of its own."""
    if not task.allows("cancel"):  # before the stop fact: a task that ran keeps its end
        stopped = f" ({task.reason})" if task.reason else ""
        raise LostRace(f"task {task.id} cannot cancel from {task.state}{stopped}")
    now = timezone.now()
    if (
        Task.objects.filter(id=task.id, state=task.state).update(
            stop_requested_at=now, stop_requested_by=actor, stop_note=note
        )
        != 1
    ):
        raise LostRace(f"task {task.id} is no longer {task.state}")
    task.stop_requested_at = now
    detail = f"stopped before it ran: {note}"
    report = report_from_task(task, State.CANCELLED, Reason.OPERATOR_STOP, detail)
    finish_task(task, State.CANCELLED, Reason.OPERATOR_STOP, report.to_dict(), detail=detail)


def close(task: Task, *, detail: str) -> None:
    """``close``: a task waiting for a call's approval ends ``PARTIAL``/``approval_rejected``
    because a person rejected the call, with a stop report of its own after the phase's
    first."""
    reason = Reason.APPROVAL_REJECTED
    report = report_from_task(task, State.PARTIAL, reason, detail)
    finish_task(task, State.PARTIAL, reason, report.to_dict(), detail=detail)


def add_summary(task_id: int, phase: int, report: Report, event: Mapping[str, Any]) -> bool:
    """Add the summary turn's text to a task stopped in ``phase``: what it spent, a stop
    report that carries the summary (after the phase's first, which stays) and its trace
    event. Nothing if the task has moved on since; returns whether it was added."""
    # Its own transaction: unlike the moves, it follows the stop after the model's answer.
    with transaction.atomic():
        task = (
            Task.objects.select_for_update()
            .filter(id=task_id, phase=phase, state=report.state.value)
            .first()
        )
        if task is None:
            return False
        rollups.unroll(task_id)  # its spend changes: out of /metrics' totals first
        Task.objects.filter(id=task_id).update(**counters_of(report.usage, task.revision))
        StopReport.objects.create(
            task_id=task_id,
            phase=phase,
            state=report.state.value,
            reason=task.reason,
            report=redact(report.to_dict()),
        )
        TraceEvent.objects.create(task_id=task_id, phase=phase, seq=_take_seq(task_id, 1), **event)
    return True


def resume(
    task: Task,
    *,
    actor: User,
    note: str,
    grant: Mapping[str, int],
    limits: Mapping[str, Any],
) -> int:
    """``resume``: open the next phase with ``limits``; the spent counters carry over.
    Returns the new phase's number."""
    number = task.phase + 1
    _moved(
        task,
        "resume",
        TaskState.QUEUED,
        reason="",
        detail="",
        limits=dict(limits),
        phase=number,
        stop_requested_at=None,
        stop_requested_by=None,
        stop_note="",
        finished_at=None,
        updated_at=timezone.now(),
    )
    Phase.objects.create(
        task=task,
        number=number,
        approved_by=actor,
        approval_note=note,
        grant=dict(grant),
        usage_at_start={d.used: getattr(task, d.used) for d in DIMENSIONS},
    )
    return number


__all__ = [
    "APPROVAL_MOVES",
    "NOTICE_MOVES",
    "RECOVERY_ACCOUNT",
    "TASK_MOVES",
    "LostRace",
    "add_summary",
    "approval_move",
    "audit_automatic_settle",
    "cancel",
    "close",
    "counters_of",
    "entry_of",
    "finish_drive",
    "finish_task",
    "hold",
    "limits_of",
    "lose_client",
    "notice_move",
    "operation_move",
    "quiet_since",
    "recover",
    "recovery_actor",
    "recovery_quiet_seconds",
    "report_from_task",
    "request_stop",
    "requeue",
    "resume",
    "settle_by_lookup",
    "start_drive",
    "usage_of",
]
