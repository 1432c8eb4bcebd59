"""The tool step: one admitted call at the executor's entry, claimed (a write), run,
recorded and saved (:class:`ToolStep`)."""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any

from django.db import InterfaceError, OperationalError

from console.agents import Agent, Tool
from console.drivers import trace
from console.drivers.ledger import DatabaseLedger
from console.drivers.runner.saves import NEXT_STEP, NOTHING, Saves
from console.drivers.runner.watch import StopFact
from console.models import Decision
from console.records.redaction import preview
from guard import Guard, Reason, Report, Result, State
from guard.steps import Action, LedgerError, Sequencer, Ticket, transient_error

__all__ = ["ToolStep", "transient"]


@dataclass(eq=False)
class ToolStep:
    """One admitted call of the agent's ``tools``: its entry decided by the sequencer (a
    write's claim, which reads the stop fact in its own statement), the tool run only on
    ``EXECUTE``, its outcome settled and saved with the write's record."""

    guard: Guard
    seq: Sequencer
    agent: Agent
    tools: dict[str, Tool]
    ledger: DatabaseLedger
    saves: Saves
    stop: StopFact
    args_preview: str = ""  # the redacted arguments of the call in progress
    approving: bool = False  # the approved call is about to run: checkpoint it first

    def run(
        self, ticket: Ticket, results: list[Result], *, last: bool, batch: bool
    ) -> Report | None:
        """One admitted call: claim, run, record. Returns the report if the task stops."""
        call, saves = ticket.call, self.saves
        tool = self.tools[call.tool]
        # Redacted once: for the operation's row (a write) and for the request's event.
        self.args_preview = preview(call.args)
        self.ledger.describe(call, self.args_preview)
        # A retry of a write settled NOT_COMMITTED asks the tool's lookup first (whatever
        # auto_lookup says: it can only stop the write, never settle it).
        # A reuse is reported by the sequencer with its entry.
        decision = self.seq.enter(ticket, lookup=tool.lookup)
        saves.entered()
        if decision.action is Action.STOP:
            report = decision.report
            if report is None:  # pragma: no cover - STOP always carries its report
                raise RuntimeError("a stop decision without a report")
            saves.observation = list(results) if batch else None  # this call did not run
            saves.save(self._request(ticket, Decision.BLOCKED, None, reason=report.reason))
            return report
        started = time.monotonic()
        outcome: Any = decision.result
        error: Exception | None = None
        executed = decision.action is Action.EXECUTE
        if self.approving:
            # The approval is used now: checkpointed before the call runs, so that a crash
            # while it runs never hands it over again (a write would meet its ledger entry;
            # a read would run twice).
            self.approving = False
            saves.save(checkpoint=True)
        if executed:
            self.stop.forget()  # the tool may take a while: ask again afterwards
            try:
                outcome = tool.run(call)
            except Exception as exc:
                error = exc
        latency = time.monotonic() - started
        stop = decision.report
        if executed:
            stop = self._settle(ticket, tool, outcome, error, last=last)
        ran = (executed, error, latency)
        return self._record(ticket, results, stop, ran, last=last, batch=batch)

    def _settle(
        self, ticket: Ticket, tool: Tool, outcome: Any, error: Exception | None, *, last: bool
    ) -> Report | None:
        """What the executed call came to, by the sequencer; the report if it stops."""
        lookup = tool.lookup if self.agent.auto_lookup else None
        # The save after it follows at once: a write's record may ride on it.
        self.ledger.defer = last
        try:
            if error is not None:
                return self.seq.raised(ticket, error, lookup=lookup)
            return self.seq.returned(ticket, outcome, lookup=lookup)
        finally:
            self.ledger.defer = False

    def _record(
        self,
        ticket: Ticket,
        results: list[Result],
        stop: Report | None,
        ran: tuple[bool, Exception | None, float],
        *,
        last: bool,
        batch: bool,
    ) -> Report | None:
        """The request's event saved with the checkpoint (and a write's record); ``ran``:
        whether the tool was executed (else its result reused), its error, its latency."""
        executed, error, latency = ran
        if ticket.result is not None:
            results.append(ticket.result)
        # What this model call's calls came to so far, checkpointed with the agent's memory
        # by the save below, so that a crash mid-batch or a stop resumes with it: the calls
        # without a result did not run.
        self.saves.observation = list(results) if batch else (results[0] if results else None)
        detail = "" if error is None else f"{type(error).__name__}: {error}"[:500]
        event = self._request(
            ticket,
            Decision.EXECUTED if executed else Decision.REUSED,
            latency,
            reason="" if stop is None else stop.reason,
            detail=detail,
        )
        # Going on: count the next model call now, and one request and execution of it,
        # sparing a save before it when it proposes one call.
        ahead = NEXT_STEP if last and stop is None else NOTHING
        record = self.ledger.take_record()
        saved = self.saves.save(event, checkpoint=True, ahead=ahead, record=record)
        return _unrecorded(self.guard, stop, saved.record_failed or self.ledger.record_failed)

    def _request(self, ticket: Ticket, decision: str, latency: float | None, **why: str) -> Any:
        """The trace event of ``ticket``'s request, as it stands now."""
        return trace.request_event(
            ticket,
            decision,
            latency,
            args_preview=self.args_preview,
            revision=self.guard.revision,
            **why,
        )


def transient(error: BaseException) -> bool:
    """An error after which a write may run again once its lookup proved it did not happen:
    a lost connection or a timeout, the database's own included (a cut connection, a
    restart, a serialization failure)."""
    return transient_error(error) or isinstance(error, (OperationalError, InterfaceError))


def _unrecorded(guard: Guard, stop: Report | None, failed: LedgerError | None) -> Report | None:
    """``stop``, unless a verified write's record ``failed``: the write ran and inspect saw
    it commit, but meanwhile its operation was settled by someone else (its lease had run
    out), which ends the task ``NEEDS_HUMAN``/``unknown_commit`` as when a record fails."""
    if failed is None or (stop is not None and stop.reason is Reason.UNKNOWN_COMMIT):
        return stop
    detail = f"ledger: {failed!r}"
    if stop is None:
        return guard.halt(State.NEEDS_HUMAN, Reason.UNKNOWN_COMMIT, detail)
    return replace(stop, state=State.NEEDS_HUMAN, reason=Reason.UNKNOWN_COMMIT, detail=detail)
