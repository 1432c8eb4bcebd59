"""The stop report: what was done, why the task stopped and what it takes to go on."""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ._budget import Budget
from ._checks import Refusal, count, present, text
from ._ledger import UNSETTLED, Operation
from ._settlement import SettlementStep
from ._values import DIMENSIONS, Reason, State, Usage

__all__ = ["COMPLETED_KEPT", "RESUME_CONDITIONS", "SUMMARY_REASONS", "Record", "Report"]

COMPLETED_KEPT = 50
"""How many of the latest completed requests a report and a checkpoint keep."""

RESUME_CONDITIONS: Mapping[Reason, str] = {
    Reason.GOAL_MET: "Nothing to resume: the goal is verified as met.",
    Reason.GOAL_UNVERIFIED: (
        "The model declared the task finished but the goal is not verified; check what is "
        "missing before approving another phase."
    ),
    Reason.DEADLINE: "Grant more time; the work done so far is kept.",
    Reason.MODEL_BUDGET: "Grant more model calls; the work done so far is kept.",
    Reason.REQUEST_BUDGET: "Grant more tool requests; the work done so far is kept.",
    Reason.EXECUTION_BUDGET: "Grant more tool executions; the work done so far is kept.",
    Reason.TOKEN_BUDGET: "Grant more model tokens; the work done so far is kept.",
    Reason.POLL_BUDGET: (
        "The job is still pending after its polling budget; check the job itself before "
        "granting more polls."
    ),
    Reason.SAME_CALL: (
        "The model repeated the same call without verified progress; change the input, the "
        "prompt or the tool before resuming."
    ),
    Reason.SHORT_CYCLE: (
        "The model went round a cycle of calls without verified progress; resolve what it was "
        "oscillating over before resuming."
    ),
    Reason.NO_PROGRESS: (
        "Requests went on without the verified revision rising; find out why the work does "
        "not advance before resuming."
    ),
    Reason.PLANNER_ERROR: "The planner raised an error; fix it before resuming.",
    Reason.BAD_CALL: "The model proposed a malformed tool call; fix the planner or its tools.",
    Reason.BAD_ARGS: "The model sent arguments JSON cannot represent; fix the planner.",
    Reason.MISSING_OPERATION_KEY: (
        "A write was proposed without an operation key; give the tool a stable business key."
    ),
    Reason.OPERATION_CONFLICT: (
        "The operation key was already used for a different input; decide which input is "
        "right. A new business action needs a new key and a real new intent."
    ),
    Reason.OPERATION_IN_FLIGHT: (
        "Another execution of this operation is in flight; wait for it to settle or "
        "reconcile it before resuming."
    ),
    Reason.UNKNOWN_COMMIT: (
        "Check in the business system whether the uncertain operation took effect, mark it "
        "committed or not committed with evidence, then approve resumption."
    ),
    Reason.EXECUTOR_ERROR: "The tool failed; fix the cause, reconciling any uncertain write.",
    Reason.BAD_RESULT: (
        "The tool returned a result outside the closed set of kinds; fix the adapter and "
        "reconcile any uncertain write."
    ),
    Reason.INVALID_EVIDENCE: (
        "The inspector could not verify the step; fix it and reconcile any uncertain write."
    ),
    Reason.FATAL: "The tool reported a permanent error; retrying will not help.",
    Reason.PRECONDITION: "Provide the missing precondition, then approve resumption.",
    Reason.INVALID_WAIT: "The tool asked to wait without saying how long; fix the adapter.",
    Reason.OPERATOR_STOP: (
        "Stopped by an operator; reconcile any uncertain write, then approve resumption."
    ),
    Reason.SPEND_BUDGET: (
        "Grant more spend; the next model call's maximum cost did not fit in what was left."
    ),
    Reason.APPROVAL_REQUIRED: (
        "A call waits for a person's approval: approve it (it then runs once, exactly as "
        "asked) or reject it, with a reason."
    ),
    Reason.APPROVAL_REJECTED: (
        "A person rejected a call the task needed; change the input or the goal before "
        "starting it again."
    ),
}
"""What each stop reason asks of an approver before the task may go on."""

SUMMARY_REASONS = frozenset(
    {
        *(d.reason for d in DIMENSIONS if d.reason is not Reason.SPEND_BUDGET),
        Reason.SAME_CALL,
        Reason.SHORT_CYCLE,
        Reason.NO_PROGRESS,
    }
)
"""The stops after which a summary turn may be taken (``Guard.summary_turn``): a budget or
the deadline ran out, or the work went round without progress. Never after an uncertain
write, a conflict, an operator's stop, a pending approval or a failure — nor after the
spend budget ran out: money is reserved before it is spent, a summary's included."""


@dataclass(frozen=True, slots=True)
class Report:
    """The guard's final word on a task; the same object is returned on every later call."""

    state: State
    reason: Reason
    model_calls: int
    requests: int
    executions: int
    revision: int
    operations: tuple[Operation, ...] = ()
    tokens: int = 0
    polls: int = 0
    elapsed_ms: int = 0
    remaining: Mapping[str, int | None] = field(default_factory=dict)
    completed: tuple[Mapping[str, Any], ...] = ()
    """The latest completed requests (at most ``guard.COMPLETED_KEPT``), oldest first."""
    completed_total: int = 0
    """How many requests completed in all, including those no longer listed."""
    call: Mapping[str, Any] | None = None
    """The request the stop is about, when there is one: tool, fingerprint, operation key."""
    batch: tuple[Mapping[str, Any], ...] = ()
    """Every call of the last model call and what became of it (ran, reused, not run…)."""
    detail: str = ""
    spend: int = 0
    explored: int = 0
    """How many never-seen results counted as progress (the observed-evidence policy)."""
    pending: Mapping[str, Any] | None = None
    """The call held for a person's approval (``approval_required``): tool, arguments,
    effect, operation key and fingerprint — what an :class:`Approval` answers."""
    summary: str | None = None
    """The text of the summary turn taken after this stop, if one was."""

    @property
    def uncertain(self) -> tuple[Operation, ...]:
        """Operations whose commit state a human must settle before the task may go on."""
        return tuple(op for op in self.operations if op.state in UNSETTLED)

    @property
    def resume_condition(self) -> str:
        """What has to be true before an approver lets this task go on."""
        if self.uncertain and self.reason is not Reason.UNKNOWN_COMMIT:
            keys = ", ".join(op.key for op in self.uncertain)
            return f"Reconcile {keys} first. " + RESUME_CONDITIONS[self.reason]
        return RESUME_CONDITIONS[self.reason]

    @property
    def usage(self) -> Usage:
        """The spent counters, to carry into the guard of the next phase."""
        return Usage(**{dimension.used: getattr(self, dimension.used) for dimension in DIMENSIONS})

    def to_dict(self) -> dict[str, Any]:
        """The full stop report as JSON-ready data."""
        focus = self.uncertain[0] if self.uncertain else None
        return {
            "state": str(self.state),
            "reason": str(self.reason),
            "detail": self.detail,
            "completed": [dict(step) for step in self.completed],
            "completed_total": self.completed_total,
            "operation_key": None if focus is None else focus.key,
            "operation_state": None if focus is None else str(focus.state),
            "operations": [op.to_dict() for op in self.operations],
            "revision": self.revision,
            "used": {**self.usage.to_dict()},
            "remaining_budget": dict(self.remaining),
            "call": None if self.call is None else dict(self.call),
            "batch": [dict(item) for item in self.batch],
            "pending": None if self.pending is None else dict(self.pending),
            "summary": self.summary,
            "resume_condition": self.resume_condition,
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Report:
        """The report :meth:`to_dict` describes, rebuilt: a stop report read back from JSON
        (the console's answer to an attached agent, say). ``operation_key``,
        ``operation_state`` and ``resume_condition`` are derived from the rest and not read;
        a counter missing from ``used`` is 0. ``ValueError`` if ``raw`` is not a stop
        report."""
        try:
            used = raw["used"]
            counters: dict[str, Any] = {
                dimension.used: count(used.get(dimension.used, 0)) for dimension in DIMENSIONS
            }
            summary = raw.get("summary")
            return cls(
                state=State(raw["state"]),
                reason=Reason(raw["reason"]),
                revision=count(raw["revision"]),
                operations=tuple(Operation.from_dict(op) for op in raw["operations"]),
                remaining={
                    text(name): None if left is None else count(left)
                    for name, left in raw["remaining_budget"].items()
                },
                completed=tuple(dict(step) for step in raw["completed"]),
                completed_total=count(raw["completed_total"]),
                call=_mapping(raw.get("call")),
                batch=tuple(dict(item) for item in raw["batch"]),
                detail=text(raw.get("detail", "")),
                pending=_mapping(raw.get("pending")),
                summary=None if summary is None else text(summary),
                **counters,
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ValueError(f"malformed stop report: {exc!r}") from exc

    def to_json(self, **kwargs: Any) -> str:
        """The full stop report as JSON text (keyword arguments go to :func:`json.dumps`)."""
        return json.dumps(self.to_dict(), ensure_ascii=False, **kwargs)


def _mapping(value: Any) -> dict[str, Any] | None:
    """An optional object of a stop report's JSON as a dict (``TypeError`` if it is not one)."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise TypeError(f"{value!r} is not an object")
    return dict(value)


_COMPLETED_FIELDS = ("tool", "fingerprint", "operation_key", "reused", "revision")


class Record:
    """What a task has done so far — its latest completed requests — and, once it has
    stopped, its one stop report."""

    __slots__ = ("completed", "report", "total")

    def __init__(self) -> None:
        # The latest completed requests, and how many in all: a long run's report and
        # checkpoint stay small.
        self.completed: deque[tuple[str, str, str | None, bool, int]] = deque(maxlen=COMPLETED_KEPT)
        self.total = 0
        self.report: Report | None = None

    def complete(self, tool: str, fp: str, key: str | None, reused: bool, revision: int) -> None:
        """One request executed (or reused) with a ``SUCCESS``."""
        self.completed.append((tool, fp, key, reused, revision))
        self.total += 1

    def stop(
        self,
        state: State,
        reason: Reason,
        *,
        usage: Usage,
        remaining: Mapping[str, int | None],
        revision: int,
        operations: Iterable[Operation],
        call: Mapping[str, Any] | None,
        batch: tuple[Mapping[str, Any], ...],
        detail: str,
        pending: Mapping[str, Any] | None = None,
    ) -> Report:
        """Record the terminal state once; later stops return the first report."""
        if self.report is None:
            counters: dict[str, Any] = dict(usage.to_dict())  # one field per dimension
            self.report = Report(
                state=state,
                reason=reason,
                revision=revision,
                operations=tuple(operations),
                remaining=remaining,
                completed=tuple(
                    dict(zip(_COMPLETED_FIELDS, step, strict=True)) for step in self.completed
                ),
                completed_total=self.total,
                call=call,
                batch=batch,
                detail=detail,
                pending=pending,
                **counters,
            )
        return self.report

    def close(
        self,
        refusal: Refusal,
        *,
        call: Mapping[str, Any] | None,
        batch: tuple[Mapping[str, Any], ...],
        budget: Budget,
        revision: int,
        settlement: SettlementStep,
        pending: Mapping[str, Any] | None = None,
    ) -> Report:
        """Stop for ``refusal`` with what the parts know now: the entries of the operations
        the settlement touched, what the budget has spent and has left, the detector's
        ``revision``. Like :meth:`stop`, the first stop's report stands."""
        if self.report is not None:
            return self.report
        operations = settlement.operations()
        usage = budget.usage()
        return self.stop(
            refusal.state,
            refusal.reason,
            usage=usage,
            remaining=budget.limits.remaining(usage),
            revision=revision,
            operations=operations,
            call=call,
            batch=batch,
            detail=refusal.detail,
            pending=pending,
        )

    def summarise(self, summary: str, budget: Budget) -> Report:
        """Add the summary turn's text to the stop report, with what it spent: a fact added
        to the stop, which stays what it was."""
        report = present(self.report)
        usage = budget.usage()
        self.report = replace(
            report,
            summary=summary,
            tokens=usage.tokens,
            spend=usage.spend,
            remaining=budget.limits.remaining(usage),
        )
        return self.report

    def checkpoint(self, *, history: bool = True) -> dict[str, Any]:
        """The record's part of a checkpoint (``completed`` is history: see ``HISTORY``;
        without it, only the total)."""
        if not history:
            return {"completed_total": self.total}
        return {"completed": [list(step) for step in self.completed], "completed_total": self.total}

    def load(self, raw: Mapping[str, Any]) -> None:
        """Take back a part made by :meth:`checkpoint` (``TypeError``/``KeyError`` if not)."""
        self.total = count(raw.get("completed_total", 0))
        self.completed.extend(_completed(raw["completed"]))

    def recall(self, completed: Iterable[Sequence[Any]]) -> None:
        """Put the requests completed before a restore back ahead of those completed since
        (the total was in the checkpoint)."""
        earlier = list(_completed(completed))  # checked whole before anything moves
        since = list(self.completed)
        self.completed.clear()
        self.completed.extend(earlier)
        self.completed.extend(since)


def _completed(raw: Iterable[Sequence[Any]]) -> Iterator[tuple[str, str, str | None, bool, int]]:
    """Completed requests as a checkpoint keeps them, checked."""
    for t, fp, key, r, rev in raw:
        yield text(t), text(fp), key if key is None else text(key), bool(r), count(rev)
