"""The step's saves: what the hosted driver persists, and when, each a short transaction
conditional on the lease (:class:`Saves`), and the checkpoint a restart resumes from."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from console.agents import Agent
from console.drivers.ledger import DatabaseLedger
from console.drivers.runner.watch import StopFact
from console.records.redaction import redact
from console.store import Record, Saved, Step, StepStore
from guard import Call, Guard, Nudge, Reason, Result
from guard.steps import Ticket

QUICK_MODEL_CALL_S = 0.05  # a model call this quick has its event saved with its read

# What a save counts ahead: (model calls, requests, executions).
NOTHING = (0, 0, 0)
NEXT_CALL = (1, 0, 0)  # the next model call
NEXT_STEP = (1, 1, 1)  # the next model call, one request and its execution

__all__ = ["NEXT_CALL", "NEXT_STEP", "NOTHING", "Saves", "checkpoint_of", "decode"]


@dataclass(eq=False)
class Saves:
    """What is saved, and when (each a short transaction conditional on the lease):

    - after each tool request: its trace event, the counters and the checkpoint (guard,
      agent memory, observation) that a restart of this phase resumes from; for a write,
      its record (``COMMITTED``) in the same statement. Going on, this save also counts
      the next model call, one request and its execution ahead, so that a crash while
      the model thinks or the next tool runs never gives them back;
    - after the model call, when it proposed one call: nothing of its own. Its event
      waits for the next statement: a write's claim, which also reads the stop fact in
      its own transaction (the gate), or, for a read after a quick model call
      (``QUICK_MODEL_CALL_S``) that spent nothing else (tokens, a poll), the save after
      it, the stop fact being read just before the read starts;
    - after any other model call (several calls, a read after a slow model call, the
      first of a drive): its event and counters, executions counted ahead. That commit
      does not wait for the disk: a worker crash cannot lose it (the database has it),
      and the next synchronous commit (a claim, or the reads' own save) flushes it.
      Only a crash of the database server in between can lose it, and with it the
      count of those reads;
    - before a drive's first model call and before a wait: the model-call counter,
      already counting the next call.

    Counters saved ahead are corrected by the next save; when a task resumes after a
    worker crash they can only be too high, never too low (after a crash of the database
    server, too low by at most the reads of one model call).

    Every save reads back the stop fact, and hands it to the driver's :class:`StopFact`.
    ``observation`` is what the last model call's calls came to, the model's next
    observation: it is checkpointed with the agent's memory, the two go together (a
    model-planned agent answers its calls from it), in a new phase too.
    """

    phase: int
    store: StepStore
    ledger: DatabaseLedger
    guard: Guard
    agent: Agent
    stop: StopFact
    observation: Any
    # The guard may hold a write for approval before its claim (which reads the stop
    # fact): then the stop fact must be read again before the call, to be named.
    gated: bool
    pending: list[dict[str, Any]] = field(default_factory=list)  # waiting for the next save
    carried: Step | None = None  # the step so far, riding on the next claim
    one_ahead: bool = False  # the row counts the next model call, request, execution

    def save(
        self,
        *events: dict[str, Any],
        checkpoint: bool = False,
        ahead: tuple[int, int, int] = NOTHING,
        durable: bool = True,
        record: Record | None = None,
    ) -> Saved:
        """Persist counters (and the checkpoint, the pending events and ``events``) in one
        short transaction, with ``record`` (a write's) when there is one; ``ahead``: the
        model calls, requests and executions counted ahead.

        Conditional on still holding the lease: a driver that lost it stops here.
        ``durable=False`` lets the commit return before its WAL is flushed (PostgreSQL).
        """
        step = self._step_of(
            (*self.pending, *events), checkpoint=checkpoint, ahead=ahead, durable=durable
        )
        saved = self.store.save(step, record=record)
        self._took(saved)
        self.one_ahead = ahead == NEXT_STEP
        return saved

    def hand_over(
        self, model_event: dict[str, Any], proposal: Any, admitted: list[Ticket], started: float
    ) -> None:
        """Where the model call's event goes before its calls run (see the class's note)."""
        way = _carriage(
            proposal,
            admitted[0],
            one_ahead=self.one_ahead,
            tokens=self.agent.tokens,
            quick=time.monotonic() - started < QUICK_MODEL_CALL_S,
        )
        if way is _Carriage.CLAIM:
            # It rides on the claim, which reads the stop fact in its own transaction: the
            # stop fact read before the model call may stand, unless the guard may refuse
            # before claiming (then a stop recorded meanwhile must be seen, to be named as
            # the reason).
            self.pending.append(model_event)
            self.carried = self._step_of(tuple(self.pending), ahead=(0, 0, 1))
            self.ledger.carry = self.carried
            if self.gated or 0 in self.guard.remaining().values():
                self.stop.forget()
        elif way is _Carriage.READ:
            # A read: its event goes with the read's save. After a slow model call (a real
            # one) it is saved at once instead, so that the live trace shows what runs
            # while it runs; beside the model, that costs nothing.
            self.pending.append(model_event)
            self.stop.forget()  # ask again, just before the read starts
        else:
            # Not waiting for the disk here: what follows is either a claim, whose
            # synchronous commit flushes this save too before any write runs, or reads,
            # followed by their own synchronous save.
            self.save(model_event, ahead=(0, 0, len(admitted)), durable=False)

    def entered(self) -> None:
        """The call's entry is decided: a step that rode on its claim is saved if the claim
        committed it (``Step.saved``), and rides on nothing else."""
        carried, self.carried, self.ledger.carry = self.carried, None, None
        if carried is not None and carried.saved is not None:
            self._took(carried.saved)

    def checkpoint(self) -> dict[str, Any]:
        """What a restart of this phase resumes from, as it stands now."""
        return checkpoint_of(self.phase, self.guard, self.agent, self.observation)

    def _step_of(
        self,
        events: tuple[dict[str, Any], ...],
        *,
        checkpoint: bool = False,
        ahead: tuple[int, int, int] = NOTHING,
        durable: bool = True,
    ) -> Step:
        """The step so far as the store's value: counters (with what is counted ahead),
        the events and, if asked, the checkpoint."""
        usage = self.guard.usage.to_dict()
        usage["model_calls"] += ahead[0]
        usage["requests"] += ahead[1]
        usage["executions"] += ahead[2]
        saved = self.checkpoint() if checkpoint else None
        return Step(usage, self.guard.revision, events, saved, durable)

    def _took(self, saved: Saved) -> None:
        """Take in what a save said: the pending events are stored, and the stop fact."""
        self.pending.clear()
        self.stop.take(saved)


class _Carriage(Enum):
    """Where a model call's event goes before its calls run."""

    CLAIM = "rides on the write's claim"
    READ = "goes with the read's save"
    NOW = "saved at once, not waiting for the disk"


def _carriage(
    proposal: Any, first: Ticket, *, one_ahead: bool, tokens: int, quick: bool
) -> _Carriage:
    """When the last save counted this model call, one request and its execution ahead,
    a one-call proposal's event can wait for the next statement, unless the step spent
    what was not counted ahead (tokens, a poll); a read's waits only after a quick model
    call."""
    if not one_ahead or not isinstance(proposal, Call) or tokens or first.poll:
        return _Carriage.NOW
    if proposal.effect == "write":
        return _Carriage.CLAIM
    return _Carriage.READ if quick else _Carriage.NOW


def checkpoint_of(phase: int, guard: Guard, agent: Agent, observation: Any) -> dict[str, Any]:
    """What a restart of ``phase`` resumes from. What grows with the phase stays out (the
    trace holds it, ``StepStore.history`` rebuilds it), so that a step's cost does not
    grow with the phase's length.

    Secrets stay out (invariant 10): the agent's memory (a model's conversation quotes tool
    results) and the last observation are stored redacted, as the trace and the ledger store
    them; a resumed agent reads them as a re-requested committed write reads its stored
    result. An agent's credentials come from its configuration, never from its memory. The
    guard's part is counters, fingerprints and operation keys, kept exact: it holds nothing
    a tool returned or a person typed, and loop detection needs it unchanged.
    """
    return {
        "phase": phase,
        "guard": guard.checkpoint(history=False),
        "agent": redact(agent.memory),
        "observation": redact(_encode(observation)),
    }


def _encode(observation: Any) -> Any:
    """The observation as JSON-ready data for the checkpoint."""
    if observation is None:
        return None
    if isinstance(observation, Result):
        return {"result": observation.to_dict()}
    if isinstance(observation, Nudge):
        return {
            "nudge": {
                "message": observation.message,
                "tool": observation.tool,
                "fingerprint": observation.fingerprint,
                "reason": observation.reason.value,
            }
        }
    if isinstance(observation, list):
        return {"results": [item.to_dict() for item in observation]}
    raise TypeError(f"cannot checkpoint an observation of type {type(observation).__name__}")


def decode(raw: Any) -> Any:
    if not isinstance(raw, dict):
        return None
    if "result" in raw:
        return Result.from_dict(raw["result"])
    if "results" in raw:
        return [Result.from_dict(item) for item in raw["results"]]
    if "nudge" in raw:
        nudge = raw["nudge"]
        return Nudge(nudge["message"], nudge["tool"], nudge["fingerprint"], Reason(nudge["reason"]))
    return None
