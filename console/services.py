"""The only places task and operation state moves by human or API action.

Each service is one short transaction: it locks the row, checks the state it expects
("from this state to that one"), makes the change and writes its audit entry in the same
transaction, and raises a :class:`ServiceError` the caller can show when the state is
not what the person saw (someone else acted first). Workers are enqueued on commit.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AnonymousUser, User
from django.db import transaction
from django.utils import timezone

from console import lifecycle
from console.agents import Agent, UnknownAgent, agent_class
from console.models import (
    UNSETTLED_STATES,
    Approval,
    AuditAction,
    AuditEntry,
    OnReject,
    Operation,
    OperationState,
    Phase,
    Task,
    TaskState,
    lease_alive,
)
from console.records.inputs import (
    KEPT_DEPTH,
    MAX_AGENT_CHARS,
    MAX_INPUT_BYTES,
    MAX_NAME_CHARS,
    MAX_RESULT_BYTES,
    MAX_TEXT_CHARS,
    InputRefused,
    check_bounded,
    json_size,
    key_problem,
    typed_text,
    unstorable,
)
from console.records.redaction import redact, redact_text
from console.records.spend import price_of
from console.store.queries import lock_goal
from guard import Kind, Limits, Result
from guard.steps import DIMENSIONS
from guard.steps import canonical_json as guard_canonical_json

logger = logging.getLogger(__name__)

# The budget each stop reason says ran out, and the budgets a resumption may grant.
# A budget that does not stop a task when spent (the exploration budget) names no reason.
BUDGET_REASONS = {d.reason.value: d.limit for d in DIMENSIONS if d.stops}
GRANTABLE = tuple(d.limit for d in DIMENSIONS)
LIMIT_FIELDS = tuple(f.name for f in fields(Limits))
_UNLIMITED = Limits()  # a limit a task does not name is the default one


class ServiceError(Exception):
    """A service refused; the message is meant for the person who asked."""


class NotFound(ServiceError):
    """No such task or operation."""


class StaleState(ServiceError):
    """The task or operation is no longer in the state the action was meant for."""


class Refused(ServiceError):
    """The action is not allowed now (the message says why)."""


class InvalidInput(ServiceError):
    """The request itself is malformed (the message says what is wrong)."""


def _enqueue(task_id: int) -> None:
    from console.tasks import run_task  # tasks import this module's callers; keep the edge one-way

    run_task.delay(task_id)


Enqueue = Callable[[int], None]


# -- start -----------------------------------------------------------------------------------


def input_fingerprint(agent: str, input: Mapping[str, Any]) -> str:
    """What identifies "the same goal" for restart-loop detection."""
    return hashlib.sha256(f"{agent}\x00{guard_canonical_json(input)}".encode()).hexdigest()


def parse_limits(
    agent_defaults: Mapping[str, Any], given: Mapping[str, Any] | None
) -> dict[str, Any]:
    """Defaults from settings, then the agent's, then the caller's; validated by ``Limits``."""
    merged: dict[str, Any] = {
        **settings.LOOPGUARD_DEFAULT_LIMITS,
        **agent_defaults,
        **(given or {}),
    }
    unknown = sorted(set(merged) - set(LIMIT_FIELDS))
    if unknown:
        raise InvalidInput(f"unknown limit(s): {', '.join(unknown)}")
    try:
        value = dict(merged)
        value["exempt"] = frozenset(value.get("exempt", ()))
        Limits(**value)
    except (TypeError, ValueError) as exc:
        raise InvalidInput(f"invalid limits: {exc}") from exc
    merged["exempt"] = sorted(merged.get("exempt", ()))
    return merged


MAX_TOOLS = 200
AGENT_NAME = f"[A-Za-z0-9._-]{{1,{MAX_AGENT_CHARS}}}"
"""An attached agent's name, as a pattern (the API's document describes it with this)."""


def attached_tools(tools: Mapping[str, str] | None) -> dict[str, str]:
    """An attached client's tool declarations (name → ``"read"``/``"write"``), checked."""
    if not isinstance(tools, Mapping) or not tools:
        raise InvalidInput('tools must name every tool the agent may call: {"name": "read"}')
    if len(tools) > MAX_TOOLS:
        raise InvalidInput(f"tools names more than {MAX_TOOLS} tools")
    for name, effect in tools.items():
        if (
            not isinstance(name, str)
            or not 0 < len(name) <= MAX_NAME_CHARS
            or not name.isprintable()
        ):
            raise InvalidInput(f"a tool's name is 1 to {MAX_NAME_CHARS} printable characters")
        if effect not in ("read", "write"):
            raise InvalidInput(f'tools.{name} must be "read" or "write"')
    return dict(tools)


def attached_approval(approval: Any, tools: Mapping[str, str]) -> list[str]:
    """An attached client's ``approval``: the names of its declared ``tools`` whose every
    call waits for a person's approval first, checked (absent or null: none)."""
    if approval is None:
        return []
    if not isinstance(approval, list) or not all(isinstance(name, str) for name in approval):
        raise InvalidInput('approval must be a list of tool names: ["refund"]')
    if len(approval) > MAX_TOOLS:
        raise InvalidInput(f"approval names more than {MAX_TOOLS} tools")
    # Refused rather than ignored: a misspelt name would let its tool's calls run unasked.
    unknown = [name for name in approval if name not in tools]
    if unknown:
        raise InvalidInput(
            f"approval names {', '.join(map(repr, unknown[:5]))}, not among the declared tools"
        )
    return list(dict.fromkeys(approval))


def agent_name_problem(name: str) -> str | None:
    """Why ``name`` cannot name an attached agent, or ``None``."""
    if re.fullmatch(AGENT_NAME, name) is None:
        return f"agent must be 1 to {MAX_AGENT_CHARS} letters, digits, dots, underscores or hyphens"
    return None


def task_start(
    *,
    agent: str,
    input: Mapping[str, Any] | None = None,
    limits: Mapping[str, Any] | None = None,
    actor: User | AnonymousUser | None = None,
    reason: str = "",
    enqueue: Enqueue = _enqueue,
    client: str = "",
    tools: Mapping[str, str] | None = None,
    approval: Any = None,
) -> Task:
    """Create a task and enqueue its first phase, unless the same goal keeps coming back.

    The same agent started with the same input ``LOOPGUARD_RESTART_LIMIT`` times inside
    ``LOOPGUARD_RESTART_WINDOW_SECONDS`` is held (``NEEDS_HUMAN``/``restart_loop``) for an
    operator instead of running: a per-run budget cannot see an outer trigger loop.

    With a ``client`` the task is attached (``console.drivers.attached``): ``agent`` is the name
    its client gives it, ``tools`` its declared tools, ``approval`` the names of those whose
    calls wait for a person's approval, and nothing is enqueued (the client drives it); the
    console's default limits apply where ``limits`` is silent.
    """
    input = dict(input or {})
    reason = _optional(reason)
    cls = None
    approval_tools: list[str] = []
    if client:
        client, tools, approval_tools = _task_client(client, tools, approval)
    else:
        cls = _task_hosted_agent(agent, approval)
    _task_input_check(input)
    fingerprint = _task_goal(agent, input, cls)
    task_limits = _task_limits(agent, cls, limits)
    user = actor if isinstance(actor, User) else None

    with transaction.atomic():
        starts = _task_goal_starts(agent, fingerprint) + 1
        held = starts > settings.LOOPGUARD_RESTART_LIMIT
        task = _task_create(
            agent=agent,
            input=input,
            fingerprint=fingerprint,
            limits=task_limits,
            user=user,
            client=client,
            tools=dict(tools or {}),
            approval_tools=approval_tools,
        )
        if held:
            lifecycle.hold(task, _task_restart_loop_detail(starts))
        elif not client:
            transaction.on_commit(lambda: enqueue(task.id))
        if user is not None:
            _task_audit_start(user, task, reason=reason, held=held)
    task.refresh_from_db()
    return task


def _task_client(
    client: str, tools: Mapping[str, str] | None, approval: Any
) -> tuple[str, dict[str, str], list[str]]:
    """An attached task's client name (secrets masked), declared tools and the tools whose
    calls wait for approval, each checked."""
    # Refused rather than cut: the column holds MAX_NAME_CHARS, and a cut name would
    # show another client than the one that drives the task.
    if len(client) > MAX_NAME_CHARS or not client.isprintable():
        raise InvalidInput(f"client must be 1 to {MAX_NAME_CHARS} printable characters")
    # Shown on every page and export of the task, as a reason is: secrets masked.
    client = redact_text(client)
    checked = attached_tools(tools)
    return client, checked, attached_approval(approval, checked)


def _task_hosted_agent(agent: str, approval: Any) -> type[Agent]:
    """The registered agent class a hosted task runs; it names its own approvals."""
    if approval is not None:
        raise InvalidInput("approval is for an attached task: a hosted agent says its own")
    try:
        return agent_class(agent)
    except UnknownAgent as exc:
        raise InvalidInput(str(exc)) from exc


def _task_input_check(input: Mapping[str, Any]) -> None:
    """Refuse a task's input that cannot be stored whole: too deep, not JSON, too large."""
    # Before anything walks the input recursively (the encoder, the fingerprint, redaction):
    # this check is iterative, so any depth gets an answer instead of a RecursionError.
    problem = unstorable(input, what="input", max_depth=KEPT_DEPTH)
    if problem is not None:
        raise InvalidInput(f"the input cannot be stored: {problem}")
    try:
        size = json_size(input)
    except InputRefused as exc:
        raise InvalidInput(f"the input is {exc}") from exc
    if size > MAX_INPUT_BYTES:
        raise InvalidInput(
            f"the input is larger than {MAX_INPUT_BYTES // 1024} KiB as JSON ({size:,} bytes)"
        )


def _task_goal(agent: str, input: Mapping[str, Any], cls: type[Agent] | None) -> str:
    """The task's goal fingerprint (:func:`input_fingerprint`), once a hosted agent has
    accepted the input."""
    try:
        if cls is not None:
            cls.validate_input(input)
        return input_fingerprint(agent, input)
    except ValueError as exc:
        raise InvalidInput(f"invalid input for {agent}: {exc}") from exc


def _task_limits(
    agent: str, cls: type[Agent] | None, limits: Mapping[str, Any] | None
) -> dict[str, Any]:
    """The task's limits (:func:`parse_limits`), refused when a hosted agent could not keep
    the spend budget they name."""
    task_limits = parse_limits({} if cls is None else cls.default_limits, limits)
    # An attached client reserves each call's maximum cost itself (guard.remote).
    if cls is not None and task_limits.get("spend") is not None:
        # Money is reserved before it is spent: without a price no call's maximum cost is
        # known, and a paid call would start with nothing reserved.
        model = cls.model_name()
        if price_of(model) is None:
            raise InvalidInput(
                f"{agent} cannot keep a spend budget: its model "
                f"{model or '(none named)'} has no price in LOOPGUARD_MODEL_PRICES"
            )
    return task_limits


def _task_goal_starts(agent: str, fingerprint: str) -> int:
    """How many tasks started this goal within the restart window, counted under the
    goal's lock, which the caller's transaction holds until its task is inserted."""
    # Counting the recent starts and inserting this one is one decision: without the
    # lock, concurrent starts of one goal each count the same committed tasks and all run.
    lock_goal(fingerprint)
    window = timezone.now() - timedelta(seconds=settings.LOOPGUARD_RESTART_WINDOW_SECONDS)
    return Task.objects.filter(
        agent=agent, input_fingerprint=fingerprint, created_at__gte=window
    ).count()


def _task_create(
    *,
    agent: str,
    input: Mapping[str, Any],
    fingerprint: str,
    limits: dict[str, Any],
    user: User | None,
    client: str,
    tools: dict[str, str],
    approval_tools: list[str],
) -> Task:
    """The task's row and its first phase's."""
    task = Task.objects.create(
        agent=agent,
        # Secrets never reach the database: an agent gets its credentials from its own
        # configuration, not from a task's input.
        input=redact(input),
        input_fingerprint=fingerprint,
        limits=limits,
        created_by=user,
        client=client,
        tools=tools,
        approval_tools=approval_tools,
    )
    Phase.objects.create(task=task, number=1, usage_at_start={})
    return task


def _task_audit_start(user: User, task: Task, *, reason: str, held: bool) -> None:
    """The audit entry of a task a person started: its agent, the state it starts in (held
    for a restart loop, or queued) and, when attached, its client."""
    state = TaskState.NEEDS_HUMAN if held else task.state
    client = {"client": task.client} if task.client else {}
    after = {"agent": task.agent, "state": state, **client}
    _audit(user, AuditAction.START, reason or "started from the console", task=task, after=after)


def _task_restart_loop_detail(starts: int) -> str:
    """What the stop report of a task held for a restart loop says happened."""
    return (
        f"started {starts} times within "
        f"{settings.LOOPGUARD_RESTART_WINDOW_SECONDS} s with the same input"
    )


# -- stop ------------------------------------------------------------------------------------


def task_stop(*, task_id: int, actor: User, reason: str) -> Task:
    """Stop a task: at once if it has not started, else by recording the stop fact.

    A running task's driver sees the recorded stop before its next model call, at the
    executor's entry (in the claim's own transaction) and while waiting; it then ends
    ``CANCELLED``/``operator_stop`` (or ``NEEDS_HUMAN`` if a write was left uncertain).
    """
    reason = _required(reason)
    with transaction.atomic():
        task = _lock_task(task_id)
        before = {"state": task.state, "stop_requested": task.stop_requested_at is not None}
        if not (task.can_stop or task.can_cancel):
            if task.stop_requested_at is not None and not task.is_terminal:
                raise StaleState(f"task {task.id} is already stopping")
            raise StaleState(f"task {task.id} has already stopped ({task.state})")
        if task.state == TaskState.RUNNING:
            _moving(lifecycle.request_stop, task, actor=actor, note=reason)
        else:
            # Not started (queued, or held for a restart loop): it ends here, with a stop
            # report of its own after the hold's.
            _moving(lifecycle.cancel, task, actor=actor, note=reason)
        task.refresh_from_db()
        _audit(
            actor,
            AuditAction.STOP,
            reason,
            task=task,
            before=before,
            after={"state": task.state, "stop_requested": True},
        )
    return task


# -- reconciliation --------------------------------------------------------------------------


BULK_LIMIT = 200
"""Tasks one bulk action changes at the most; the rest wait for the next one."""


@dataclass(frozen=True)
class BulkOutcome:
    """What one action on many tasks did: the tasks it changed, those it could not (with
    why), and how many it left for another run (past :data:`BULK_LIMIT`)."""

    changed: list[int]
    refused: dict[int, str]
    left: int = 0


def tasks_stop(*, task_ids: Sequence[int], actor: User, reason: str) -> BulkOutcome:
    """:func:`task_stop` for each task, each its own conditional move and audit entry;
    one that cannot be stopped (already stopped, unknown) is named with why."""
    reason = _required(reason)  # once, for all: a bad reason changes nothing
    return _each(task_ids, lambda task_id: task_stop(task_id=task_id, actor=actor, reason=reason))


def tasks_approve_resumption(
    *, task_ids: Sequence[int], actor: User, reason: str, enqueue: Enqueue = _enqueue
) -> BulkOutcome:
    """:func:`task_approve_resumption` for each task, with no budget grant: a task with an
    uncertain write, or out of a budget that needs an explicit grant, is refused (and
    named) as it would be alone."""
    reason = _required(reason)
    return _each(
        task_ids,
        lambda task_id: task_approve_resumption(
            task_id=task_id, actor=actor, reason=reason, enqueue=enqueue
        ),
    )


def _each(task_ids: Sequence[int], act: Callable[[int], Any]) -> BulkOutcome:
    unique = list(dict.fromkeys(task_ids))
    changed: list[int] = []
    refused: dict[int, str] = {}
    for task_id in unique[:BULK_LIMIT]:
        try:
            act(task_id)
        except ServiceError as exc:
            refused[task_id] = str(exc)
        else:
            changed.append(task_id)
    return BulkOutcome(changed, refused, max(0, len(unique) - BULK_LIMIT))


_RESULT_FIELDS = frozenset(f.name for f in fields(Result))
_RESULT_KINDS = frozenset(kind.value for kind in Kind)


def looks_like_a_result(value: Any) -> bool:
    """Whether ``value`` has exactly the shape of a stored result: a mapping whose ``kind``
    is one of the result kinds, with nothing besides ``data``, ``wait_ms`` and ``attempts``.
    Taken as a committed write's data, it would be handed to the agent wrapped twice."""
    if not isinstance(value, Mapping):
        return False
    kind = value.get("kind")
    return isinstance(kind, str) and kind in _RESULT_KINDS and set(value) <= _RESULT_FIELDS


def operation_mark_committed(
    *,
    key: str,
    actor: User,
    evidence: str,
    result: Any = None,
) -> Operation:
    """A reconciler verified in the business system that the action took effect.

    ``result`` is the tool's data (any JSON value; ``None``: not known): stored as the data
    of a ``SUCCESS`` result, it is what the agent is given when it asks for the write again.
    A value shaped like a whole result is refused (:func:`looks_like_a_result`).
    """
    return _settle(key, actor, evidence, committed=True, result=result)


class LookupDisagrees(Refused):
    """Marking an action not committed that the tool's own lookup finds in the business
    system: refused unless the person overrides it, with a reason of its own."""


def operation_mark_not_committed(
    *, key: str, actor: User, evidence: str, override: str = ""
) -> Operation:
    """A reconciler verified that the action did not take effect; it may be retried.

    Marking it so lets the write run again, so the tool's lookup is asked first: if it
    finds the action, this is refused (:class:`LookupDisagrees`) unless ``override`` says
    why the person knows better; the override, and what the lookup said, go to the audit
    log. A lookup that fails or cannot tell does not stand in the way.
    """
    evidence = _required(evidence, what="evidence")
    override = _optional(override, what="the override")
    op = None
    if key_problem(key) is None:
        op = Operation.objects.filter(key=key).select_related("task").first()
    if op is None:
        raise NotFound(f"there is no operation {key!r}")
    found = _look_up(op)  # I/O on the business system: before the transaction
    if found.get("committed") is True and not override:
        said = f": {found['evidence']}" if found.get("evidence") else ""
        raise LookupDisagrees(
            f"the business system's lookup finds this action{said}. Marking it not "
            "committed would let it be tried again; give an override with its reason if you "
            "know the lookup is wrong"
        )
    return _settle(
        key,
        actor,
        evidence,
        committed=False,
        result=None,
        override=override if found.get("committed") is True else "",
        found=found,
    )


def _settle(
    key: str,
    actor: User,
    evidence: str,
    *,
    committed: bool,
    result: Any,
    override: str = "",
    found: Mapping[str, Any] | None = None,
) -> Operation:
    """Settle the operation ``key`` as a reconciler verified it: ``committed`` (the tool's
    ``result`` kept for the agent) or not, audited with what the lookup ``found`` and the
    person's ``override`` of it."""
    evidence = _required(evidence, what="evidence")
    if committed:
        _operation_result_check(result)
    if key_problem(key) is not None:
        raise NotFound(f"there is no operation {key!r}")  # no stored key holds such text
    with transaction.atomic():
        op = Operation.objects.select_for_update().filter(key=key).first()
        if op is None:
            raise NotFound(f"there is no operation {key!r}")
        # Only an IN_FLIGHT whose driver is gone may be settled by a human: a live
        # driver may still be inside the tool.
        if op.state == OperationState.IN_FLIGHT and _operation_driver_alive(op):
            raise Refused(f"{key} is being executed right now; wait for it to finish")
        before = {"state": op.state}
        _operation_settle_move(op, actor, evidence, committed=committed, result=result)
        _operation_audit_settle(
            actor, op, evidence, committed=committed, before=before, found=found, override=override
        )
    return op


def _operation_result_check(result: Any) -> None:
    """Refuse a committed write's result that the agent could not be handed as given: one
    shaped like a whole result, or one that cannot be stored whole."""
    if looks_like_a_result(result):
        raise InvalidInput(
            "the result is the tool's data, which the agent is given as the reused "
            "result's data; this one has the shape of a whole result "
            '({"kind": …, "data": …}) and would reach the agent wrapped twice: send the '
            "data alone"
        )
    # What is stored is what the agent is handed when it asks again: refuse what could
    # only be stored altered (cut below the depth redaction walks) or not at all.
    problem = unstorable(result, what="result", max_depth=KEPT_DEPTH)
    if problem is not None:
        raise InvalidInput(f"the result cannot be stored: {problem}")
    try:
        check_bounded(result, what="the result", most_bytes=MAX_RESULT_BYTES)
    except InputRefused as exc:
        raise InvalidInput(str(exc)) from None


def _operation_driver_alive(op: Operation) -> bool:
    """Whether a driver of ``op``'s task may still be inside its tool: a hosted worker
    holding the task's lease, or an attached client within its lease of the task's end."""
    now = timezone.now()
    live = Task.objects.filter(lease_alive(now), id=op.task_id).exists()
    # An attached client runs a batch at once: a write may still be running in it
    # when another call stopped the task. It reports within its lease, or is gone.
    lease = timedelta(seconds=settings.LOOPGUARD_ATTACHED_LEASE_SECONDS)
    return live or (
        Task.objects.filter(id=op.task_id, finished_at__gt=now - lease).exclude(client="").exists()
    )


def _operation_settle_move(
    op: Operation, actor: User, evidence: str, *, committed: bool, result: Any
) -> None:
    """Move ``op`` to committed, its ``result`` stored as a ``SUCCESS``'s data (what the
    agent is handed when it asks for the write again), or to not committed."""
    move = "settle_committed" if committed else "settle_not_committed"
    stored = None
    if committed:
        stored = {"kind": "SUCCESS", "data": redact(result), "wait_ms": None, "attempts": 1}
    try:
        lifecycle.operation_move(
            op, move, task_id=None, actor=actor, evidence=evidence, result=stored
        )
    except lifecycle.LostRace as exc:
        raise StaleState(f"{op.key} is already {op.state}") from exc


def _operation_audit_settle(
    actor: User,
    op: Operation,
    evidence: str,
    *,
    committed: bool,
    before: Mapping[str, Any],
    found: Mapping[str, Any] | None,
    override: str,
) -> None:
    """The audit entry of a settlement: the evidence, what the tool's lookup found and,
    when the person overrode it, why."""
    action = AuditAction.MARK_COMMITTED if committed else AuditAction.MARK_NOT_COMMITTED
    after: dict[str, Any] = {"state": op.state}
    if found is not None:
        after["lookup"] = dict(found)
    if override:
        after["override"] = override
    _audit(
        actor,
        action,
        f"{evidence} (override of the lookup: {override})" if override else evidence,
        task_id=op.task_id,
        operation=op,
        before=before,
        after=after,
    )


# -- resumption ------------------------------------------------------------------------------


def task_approve_resumption(
    *,
    task_id: int,
    actor: User,
    reason: str,
    grant: Mapping[str, int] | None = None,
    enqueue: Enqueue = _enqueue,
) -> Task:
    """Open a new phase for a stopped task; its spent budgets carry over.

    Refused while any of its operations is ``UNKNOWN`` or ``IN_FLIGHT``. When the task
    stopped because a budget ran out, ``grant`` must add to that budget explicitly.
    """
    reason = _required(reason)
    grant = _resumption_grant(grant)
    with transaction.atomic():
        task = _lock_task(task_id)
        _resumption_require_stopped(task)
        _require_settled(task)
        _resumption_require_budget(task, grant)
        limits = _resumption_limits(task.limits, grant)
        before = {"state": task.state, "reason": task.reason, "limits": task.limits}
        number = _moving(
            lifecycle.resume, task, actor=actor, note=reason, grant=grant, limits=limits
        )
        _audit(
            actor,
            AuditAction.APPROVE_RESUMPTION,
            reason,
            task=task,
            before=before,
            after={"state": TaskState.QUEUED, "phase": number, "grant": grant, "limits": limits},
        )
        if not task.is_attached:  # an attached task's client takes the new phase
            transaction.on_commit(lambda: enqueue(task.id))
    task.refresh_from_db()
    return task


def _resumption_grant(grant: Mapping[str, int] | None) -> dict[str, int]:
    """A resumption's grant, checked: budgets that can be granted, whole amounts ≥ 0."""
    grant = dict(grant or {})
    for name, amount in grant.items():
        if name not in GRANTABLE:
            raise InvalidInput(f"{name} is not a budget that can be granted")
        if not isinstance(amount, int) or isinstance(amount, bool) or amount < 0:
            raise InvalidInput(f"the grant of {name} must be a whole number ≥ 0")
    return grant


def _resumption_require_stopped(task: Task) -> None:
    """Refuse to resume a task that is not stopped, or whose stop only its approval or a
    restored trace can end; the message says what to do instead."""
    if task.waits_for_approval:
        raise Refused(
            "a call waits for approval: approve or reject it in the approval queue, "
            "which resumes the task"
        )
    if not task.can_resume:
        if task.resumes_once_restored and (archive := task.trace_archive) is not None:
            raise Refused(
                f"task {task.id}'s trace is archived in {archive.file_name}: bring it "
                f"back first (manage.py restore_archive {archive.manifest_path}), then resume"
            )
        if task.state == TaskState.COMPLETED:
            raise StaleState(f"task {task.id} is completed: there is nothing to resume")
        raise StaleState(f"task {task.id} is {task.state}, not stopped")


def _resumption_require_budget(task: Task, grant: Mapping[str, int]) -> None:
    """Refuse to resume a task that ran out of a budget unless ``grant`` adds to it."""
    needed = BUDGET_REASONS.get(task.reason)
    if needed and grant.get(needed, 0) <= 0:
        label = next((d.label for d in DIMENSIONS if d.limit == needed), needed)
        raise Refused(f"the task ran out of {label}: grant an explicit amount to resume")


def _resumption_limits(limits: Mapping[str, Any], grant: Mapping[str, int]) -> dict[str, Any]:
    """The task's limits with ``grant`` added; a limit it does not name is the default one."""
    limits = dict(limits)
    for name, amount in grant.items():
        current = limits.get(name, getattr(_UNLIMITED, name))
        if current is None:
            continue  # unbounded stays unbounded (tokens, spend)
        limits[name] = int(current) + amount
    return limits


# -- approvals -------------------------------------------------------------------------------


def approval_approve(
    *, approval_id: int, actor: User, reason: str, enqueue: Enqueue = _enqueue
) -> Approval:
    """Say yes to the call a stopped task holds back: the task resumes in a new phase that
    runs exactly that call first, once, through the ledger; its budgets carry over."""
    return _answer(approval_id, actor, reason, approve=True, resume=True, enqueue=enqueue)


def approval_reject(
    *,
    approval_id: int,
    actor: User,
    reason: str,
    resume: bool,
    enqueue: Enqueue = _enqueue,
) -> Approval:
    """Say no to the call a stopped task holds back. With ``resume`` the task goes on in a
    new phase whose model is told the call was refused and why (asking for it again ends
    the task); without, the task ends ``PARTIAL``/``approval_rejected``."""
    return _answer(approval_id, actor, reason, approve=False, resume=resume, enqueue=enqueue)


def _answer(
    approval_id: int,
    actor: User,
    reason: str,
    *,
    approve: bool,
    resume: bool,
    enqueue: Enqueue,
) -> Approval:
    reason = _required(reason)
    with transaction.atomic():
        found = Approval.objects.filter(id=approval_id).values_list("task_id", flat=True).first()
        if found is None:
            raise NotFound(f"there is no approval {approval_id}")
        task = _lock_task(found)  # the task's row first, as every service locks it
        approval = Approval.objects.select_for_update().get(id=approval_id)
        if not approval.is_pending:
            who = approval.decided_by.get_username() if approval.decided_by else "someone"
            raise StaleState(f"approval {approval.id} was already {approval.state} by {who}")
        if not (task.waits_for_approval and task.phase == approval.phase):
            raise StaleState(f"task {task.id} no longer waits for this call ({task.state})")
        if resume:
            _require_settled(task)
        on_reject = "" if approve else (OnReject.RESUME if resume else OnReject.END)
        before = {"state": task.state, "reason": task.reason, "approval": approval.state}
        try:
            lifecycle.approval_move(
                approval,
                "approve" if approve else "reject",
                actor=actor,
                reason=reason,
                on_reject=on_reject,
            )
        except lifecycle.LostRace as exc:  # pragma: no cover - the row is locked above
            raise StaleState(f"approval {approval.id} was answered meanwhile") from exc
        after: dict[str, Any] = {"approval": approval.state, "tool": approval.tool}
        if approval.operation_key:
            after["operation_key"] = approval.operation_key
        if resume:
            number = _moving(
                lifecycle.resume, task, actor=actor, note=reason, grant={}, limits=task.limits
            )
            after |= {"state": TaskState.QUEUED, "phase": number}
            if not task.is_attached:
                transaction.on_commit(lambda: enqueue(task.id))
        else:
            detail = f"a person rejected the call to {approval.tool}: {reason}"
            _moving(lifecycle.close, task, detail=detail)
            after |= {"state": TaskState.PARTIAL, "reason": "approval_rejected"}
        action = AuditAction.APPROVE_CALL if approve else AuditAction.REJECT_CALL
        _audit(actor, action, reason, task=task, approval=approval, before=before, after=after)
    return approval


def _require_settled(task: Task) -> None:
    """A new phase may open only once no write of the task is uncertain."""
    uncertain = list(
        Operation.objects.filter(task_id=task.id, state__in=sorted(UNSETTLED_STATES)).values_list(
            "key", flat=True
        )
    )
    if uncertain:
        raise Refused("reconcile first: " + ", ".join(uncertain) + " may or may not have happened")


# -- helpers ---------------------------------------------------------------------------------


def operation_look_up(*, key: str, actor: User) -> tuple[Operation, dict[str, Any]]:
    """Ask the tool's own lookup what the business system knows of ``key``; settle nothing.

    Returns the operation, in the state it keeps for a reconciler to decide, and what was
    found, redacted, as the audit log records it: ``committed``, ``evidence`` and ``result``,
    or an ``error`` saying why nothing could be told. Raises :class:`NotFound` for an unknown
    key and :class:`Refused` for someone not signed in.
    """
    if not actor.is_authenticated:
        raise Refused("a signed-in person is required")
    if key_problem(key) is not None:
        raise NotFound(f"there is no operation {key}")  # no stored key holds such text
    op = Operation.objects.filter(key=key).select_related("task").first()
    if op is None:
        raise NotFound(f"there is no operation {key}")
    # The lookup is I/O on the business system: it runs outside any transaction, and the
    # audit entry, written after it, is the only thing this records.
    found = _look_up(op)
    with transaction.atomic():
        _audit(
            actor,
            AuditAction.LOOKUP,
            "looked the operation up in the business system",
            task_id=op.task_id,
            operation=op,
            after=found,
        )
    return op, found


def _look_up(op: Operation) -> dict[str, Any]:
    """What the tool's own lookup says of ``op``, redacted: ``committed``, ``evidence`` and
    ``result``, or an ``error`` saying why nothing could be told. Never raises."""
    key = op.key
    found: dict[str, Any]
    if op.task.is_attached:
        name = op.tool or "the tool"
        found = {"error": f"{name} runs in the attached client: it has no lookup here"}
        return dict(redact(found))
    try:
        agent = agent_class(op.task.agent)(op.task.id, op.task.input, {})
        tool = next((t for t in agent.tools() if t.name == op.tool), None)
        if tool is None or tool.lookup is None:
            found = {"error": f"the tool {op.tool or '?'} has no lookup"}
        else:
            settlement = tool.lookup(key)
            found = {
                "committed": settlement.committed,
                "evidence": settlement.evidence,
                "result": None if settlement.result is None else settlement.result.to_dict(),
            }
    except Exception as exc:  # the business system failing is an answer to show, not a 500
        logger.exception("lookup of %s failed", key)
        found = {"error": f"the lookup failed: {type(exc).__name__}: {exc}"[:500]}
    found = redact(found)  # what a business system answers may hold secrets too
    return dict(found)


def _moving[T](move: Callable[..., T], task: Task, **kwargs: Any) -> T:
    """A lifecycle move, its lost race told as the person's stale view."""
    try:
        return move(task, **kwargs)
    except lifecycle.LostRace as exc:
        raise StaleState(str(exc)) from exc


def _lock_task(task_id: int) -> Task:
    task = Task.objects.select_for_update().filter(id=task_id).first()
    if task is None:
        raise NotFound(f"there is no task {task_id}")
    return task


def _required(text: str, *, what: str = "a reason") -> str:
    """What a person typed (a reason, evidence), checked and redacted before it is stored."""
    text = _optional(text, what=what)
    if not text:
        raise InvalidInput(f"{what} is required")
    return text


def _optional(text: str, *, what: str = "the reason") -> str:
    """Free text as stored (:func:`console.records.inputs.typed_text`: trimmed, refused if it cannot
    be stored, secrets masked), because reasons and evidence are shown and exported as
    typed."""
    try:
        return typed_text(text, what=what)
    except InputRefused as exc:
        raise InvalidInput(str(exc)) from None


def _audit(
    actor: User,
    action: str,
    reason: str,
    *,
    task: Task | None = None,
    task_id: int | None = None,
    operation: Operation | None = None,
    approval: Approval | None = None,
    before: Mapping[str, Any] | None = None,
    after: Mapping[str, Any] | None = None,
) -> AuditEntry:
    if not actor.is_authenticated:
        raise Refused("a signed-in person is required")
    return AuditEntry.objects.create(
        actor=actor,
        action=action,
        task_id=task.id if task is not None else task_id,
        operation=operation,
        approval=approval,
        reason=reason,
        before=dict(before or {}),
        after=dict(after or {}),
    )


__all__ = [
    "AGENT_NAME",
    "BULK_LIMIT",
    "MAX_TEXT_CHARS",
    "MAX_TOOLS",
    "BulkOutcome",
    "InvalidInput",
    "LookupDisagrees",
    "NotFound",
    "Refused",
    "ServiceError",
    "StaleState",
    "agent_name_problem",
    "approval_approve",
    "approval_reject",
    "attached_approval",
    "attached_tools",
    "lock_goal",
    "looks_like_a_result",
    "operation_look_up",
    "operation_mark_committed",
    "operation_mark_not_committed",
    "task_approve_resumption",
    "task_start",
    "task_stop",
    "tasks_approve_resumption",
    "tasks_stop",
]
