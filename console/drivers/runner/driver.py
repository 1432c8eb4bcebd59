"""The hosted driver: one stretch of one task, step after step (:class:`_Driver`), under
a lease that lets only one driver in (:func:`drive`).

Its parts, each with one job: the model call (``model``), the tool step (``tools``), the
saves and the checkpoint (``saves``), the lease and the stop fact (``watch``).
"""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from functools import partial
from typing import Any, cast

from django.db import DatabaseError
from django.utils import timezone

from console import lifecycle
from console.agents import Agent, Tool, agent_class
from console.drivers import trace
from console.drivers.ledger import DatabaseLedger
from console.drivers.runner.model import ModelCall, in_money
from console.drivers.runner.recovery import recover_lost
from console.drivers.runner.saves import NEXT_CALL, Saves, decode
from console.drivers.runner.tools import ToolStep, transient
from console.drivers.runner.watch import Heartbeat, StopFact, lease_seconds
from console.models import (
    Decision,
    EventKind,
    Operation,
    OperationState,
    Task,
    lease_lapsed,
)
from console.records.logs import task_context
from console.store import LeaseLost, StepStore, open_store
from guard import Call, Finish, Nudge, Reason, Report, Result
from guard.steps import Sequencer, Ticket

logger = logging.getLogger(__name__)

__all__ = ["drive", "new_owner"]


def new_owner() -> str:
    """A lease owner name that says where the driver runs."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def drive(task_id: int, *, owner: str | None = None) -> str:
    """Drive one task until the guard stops it, or return at once if it is not ours to drive.

    Returns a short description of what happened, for the worker's log.
    """
    with task_context(task_id):  # every log line of this run says task=<id>
        return _drive(task_id, owner or new_owner())


def _drive(task_id: int, owner: str) -> str:
    if Task.objects.filter(id=task_id).exclude(client="").exists():
        # An attached task's own client drives it (console.drivers.attached); a worker never does.
        logger.warning("task %s is attached: its client drives it, not a worker", task_id)
        return "attached: its client drives it"
    lost = Task.objects.filter(lease_lapsed(timezone.now()), id=task_id)
    if Operation.objects.filter(task__in=lost, state=OperationState.IN_FLIGHT).exists():
        # A driver was lost inside a write and no sweep has recovered the task yet: its
        # tools' lookups are asked first, as the sweep asks them, outside the lease's
        # transaction (whose recovery could only leave the write to a person).
        recover_lost(task_id, None)
        if lost.exists():
            logger.info("task %s: its lost driver's write is looked up again later", task_id)
            return "a lost driver's write waits to be looked up"
    store = open_store(task_id, owner)
    acquired = store.take_lease(lease_seconds())
    if isinstance(acquired, str):
        logger.info("task %s: %s", task_id, acquired)
        return acquired
    heartbeat = Heartbeat(store)
    heartbeat.start()
    try:
        return _Driver(acquired, store, heartbeat).drive()
    except LeaseLost as exc:
        logger.warning("task %s: lease lost, leaving it to its new driver (%s)", task_id, exc)
        return f"lease lost: {exc}"
    finally:
        heartbeat.halt()


class _Driver:
    """One stretch of one task: rebuilds the guard and agent, then loops over steps,
    each step's parts to their own: the model call (:class:`ModelCall`), each admitted
    call (:class:`ToolStep`), what is saved and when (:class:`Saves`), whether to stop
    (:class:`StopFact`, also the guard's cancel signal)."""

    def __init__(self, task: Task, store: StepStore, heartbeat: Heartbeat) -> None:
        self.store = store
        checkpoint = task.checkpoint if isinstance(task.checkpoint, dict) else {}
        self.agent: Agent = agent_class(task.agent)(
            task.id, task.input, dict(checkpoint.get("agent") or {})
        )
        tools: dict[str, Tool] = {tool.name: tool for tool in self.agent.tools()}
        self.ledger = DatabaseLedger(store=store)
        self.stop = StopFact(task, store, heartbeat)
        options: dict[str, Any] = {
            "now": _monotonic_ms,
            "wait": self.stop.wait,
            "ledger": self.ledger,
            "cancel": self.stop.asked,
            "nudge": self.agent.nudge,
            "tools": {name: tool.effect for name, tool in tools.items()},
            "transient": transient,
            "needs_approval": self.agent.approval_policy(),
            "approvals": lifecycle.approvals_for(task),
        }
        self.fresh = not lifecycle.of_this_phase(task)
        self.guard = lifecycle.guard_of(
            task, options, history=partial(store.history, task.phase)
        )
        # The order of the guard's steps, as every driver keeps it (each tool's lookup is
        # given per call: it is the tool's own).
        self.seq = Sequencer(self.guard, inspect=self.agent.inspect)
        self.saves = Saves(
            task.phase,
            store,
            self.ledger,
            self.guard,
            self.agent,
            self.stop,
            observation=decode(checkpoint.get("observation")),
            gated=options["needs_approval"] is not None or bool(options["approvals"]),
        )
        self.model = ModelCall(task, self.agent, self.guard, self.stop)
        self.tools = ToolStep(
            self.guard, self.seq, self.agent, tools, self.ledger, self.saves, self.stop
        )

    # -- the loop -------------------------------------------------------------------------

    def drive(self) -> str:
        guard, seq, saves = self.guard, self.seq, self.saves
        reserved = False  # the next model call is already counted in the row
        if self.fresh and (rejected := guard.rejection()) is not None:
            saves.observation = rejected  # a person said no: the model hears it first
            told = trace.event(
                EventKind.NOTE, tool=rejected.tool, detail=f"told the model: {rejected.message}"
            )
            saves.pending.append(told)  # saved with the first step
        approved = guard.before_approved()  # a person said yes: that call runs first
        seq.approved(approved)
        if approved is not None:
            stopped = self._run_approved(approved)
            if stopped is not None:
                return self._finish(stopped)
            reserved = isinstance(approved, list)  # its step's save counted the next call
        while True:
            if not reserved:
                saves.save(ahead=NEXT_CALL)
            reserved = False
            try:
                reserve = self.model.reservation(saves.observation)
            except Exception as exc:
                return self._finish(seq.planner_failed(exc))
            stop = seq.model(reserve=reserve)
            if stop is not None:
                return self._finish(in_money(stop, reserve))
            if reserve:
                # Money is reserved before it is spent: stored before the paid call goes out.
                saves.save()
            planned = self.model.ask(saves.observation, reserve)
            if planned.failure is not None:
                saves.save(planned.event)
                return self._finish(seq.planner_failed(planned.failure))
            proposal, model_event = planned.proposal, planned.event
            admitted = seq.proposed(proposal)
            if isinstance(proposal, Finish):
                saves.save(model_event)
                return self._finish(cast(Report, admitted))  # a finish ends in its report
            if isinstance(admitted, Report):
                saves.observation = None  # none of its calls ran
                saves.save(model_event, trace.blocked_event(admitted))
                return self._finish(admitted)
            if isinstance(admitted, Nudge):
                saves.observation = admitted
                nudged = trace.nudge_event(admitted, guard.revision)
                saves.save(model_event, nudged, checkpoint=True)
                continue
            saves.hand_over(model_event, proposal, admitted, planned.started)
            stopped = self._run(admitted, batch=not isinstance(proposal, Call))
            if stopped is not None:
                return self._finish(stopped)
            reserved = True  # the last step's save counted the next model call ahead

    def _run(
        self, admitted: list[Ticket], *, batch: bool, results: list[Result] | None = None
    ) -> Report | None:
        """The admitted calls of one model call (after ``results``, those of its calls that
        ran already), then the wait they asked for."""
        results = [] if results is None else results
        for index, ticket in enumerate(admitted):
            last = index == len(admitted) - 1
            stopped = self.tools.run(ticket, results, last=last, batch=batch)
            if stopped is not None:
                return stopped
        pause = self.seq.pause()
        if isinstance(pause, Report):
            return pause
        if pause:
            waiting = trace.event(EventKind.WAIT, detail=f"waiting {pause:.0f} ms")
            self.saves.save(waiting, ahead=NEXT_CALL)
            self.stop.wait(pause)
        return None

    def _run_approved(self, admitted: list[Ticket] | Nudge | Report) -> Report | None:
        """The call a person approved, run as it was asked, before the model is asked
        again; its result is the model's next observation."""
        if isinstance(admitted, Report):
            return admitted
        if isinstance(admitted, Nudge):
            self.saves.observation = admitted
            return None
        self.tools.approving = True
        call = admitted[0].call
        note = trace.event(
            EventKind.NOTE,
            decision=Decision.PLANNED,
            tool=call.tool,
            operation_key=call.operation_key or "",
            detail=f"running the call a person approved: {call.tool}",
        )
        # Not waiting for the disk, as after a model call: the claim's commit flushes it.
        self.saves.save(note, ahead=(0, 0, 1), durable=False)
        # The call was one of several the model asked for at once: its result follows
        # those of the calls before it that ran, as if the batch had gone on.
        observation = self.saves.observation
        before = observation if isinstance(observation, list) else None
        return self._run(admitted, batch=before is not None, results=before)

    # -- the end ----------------------------------------------------------------------------

    def _finish(self, report: Report) -> str:
        """Record the guard's stop as the task's terminal state."""
        if self.stop.heartbeat.lost:
            raise LeaseLost("the lease was lost before the stop could be recorded")
        if self.ledger.unavailable is not None:
            # A step failed on the database: that is no verdict on the task. Record nothing;
            # recovery settles what was in flight and resumes from the last checkpoint.
            failed = self.ledger.unavailable
            raise DatabaseError(f"the ledger failed ({failed}); left to recovery") from failed
        if report.reason is Reason.OPERATOR_STOP and not self.stop.asked(again=True):
            # The guard stopped because the stop fact could not be read, not because an
            # operator asked: record nothing and let recovery resume the task.
            raise DatabaseError("stopped on an unreadable stop fact; leaving it to recovery")
        observation = self.saves.observation
        prompt, reserve = self.model.summary_turn(observation)
        # The summary turn's reservation is stored with the stop, in its transaction: it is
        # spent before the call goes out, and a resumption meanwhile cannot lose it.
        summary = self.guard.usage if prompt is not None else None
        self.store.finish(report, checkpoint=self.saves.checkpoint(), summary=summary)
        if prompt is not None:
            self.model.summarise(prompt, reserve, observation)
        return f"{report.state}/{report.reason}"


def _monotonic_ms() -> float:
    return time.monotonic() * 1000.0
