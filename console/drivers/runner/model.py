"""The model call: its reservation and cost, the call itself with what it spent, and the
summary turn after a stop (:class:`ModelCall`)."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace
from typing import Any

from console import lifecycle
from console.agents import Agent
from console.drivers import trace
from console.drivers.runner.watch import StopFact
from console.models import Decision, EventKind, Task
from console.records.spend import money, price_of
from guard import Guard, Reason, Report

logger = logging.getLogger(__name__)

__all__ = ["ModelCall", "Planned", "in_money"]


@dataclass(frozen=True, slots=True)
class Planned:
    """What one model call came to: the ``proposal`` (``None`` when the planner failed, and
    ``failure`` says why), its trace ``event``, and when it ``started`` (monotonic)."""

    proposal: Any
    event: dict[str, Any]
    failure: Exception | None
    started: float


class ModelCall:
    """The agent's model, asked by the driver: ``reservation`` before a call (its maximum
    cost, reserved by the guard), ``ask`` for the call (tokens and cost spent on the guard,
    even when the planner fails after its model answered), and the summary turn."""

    def __init__(self, task: Task, agent: Agent, guard: Guard, stop: StopFact) -> None:
        self.task_id, self.phase = task.id, task.phase
        self.agent = agent
        self.guard = guard
        self.stop = stop
        self.price = price_of(type(agent).model_name())

    def reservation(self, observation: Any) -> int:
        """The next model call's maximum cost at the agent's model's price (0 unpriced)."""
        if self.price is None:
            return 0
        agent = self.agent
        return self.price.cost(agent.prompt_tokens(observation), agent.max_output_tokens)

    def ask(self, observation: Any, reserve: int) -> Planned:
        """One model call on ``observation``, its usage spent on the guard."""
        agent, guard = self.agent, self.guard
        started = time.monotonic()
        agent.usage_reset()
        proposal: Any = None
        failure: Exception | None = None
        try:
            proposal = agent.plan(observation)
        except Exception as exc:
            failure = exc
        cost = self._cost(reserve)
        try:  # a planner that failed after its model answered still spent the tokens
            if agent.tokens:
                guard.spend_tokens(agent.tokens)
            if cost is not None:
                guard.settle_spend(cost)
        except ValueError as exc:
            failure = failure or exc
        latency = _since(started)
        if failure is not None:
            detail = f"planner: {failure!r}"
            event = trace.model_event(None, latency, agent.tokens, guard.revision, detail)
            return Planned(None, event, failure, started)
        event = trace.model_event(proposal, latency, agent.tokens, guard.revision)
        if cost is not None:
            event["cost"] = cost
        return Planned(proposal, event, None, started)

    def summary_turn(self, observation: Any) -> tuple[str | None, int]:
        """The summary turn's prompt and reservation, if the agent takes one after this stop
        (never after an operator asked to stop, whatever the stop's own reason)."""
        if not self.agent.summary_turn or self.stop.asked(again=True):
            return None, 0
        try:
            reserve = self.reservation(observation)
        except Exception:
            logger.exception("task %s: no summary turn, its cost cannot be estimated", self.task_id)
            return None, 0
        return self.guard.summary_turn(reserve=reserve), reserve

    def summarise(self, prompt: str, reserve: int, observation: Any) -> None:
        """The summary turn, after the stop is recorded: one model call with no tools,
        its text added to the stop report. A crash during it leaves the stop as it was
        (and the reservation, stored with it, spent)."""
        guard, agent = self.guard, self.agent
        started = time.monotonic()
        agent.usage_reset()
        try:
            reply = agent.summarise(prompt, observation)
        except Exception as exc:
            logger.exception("task %s: the summary turn failed", self.task_id)
            reply = f"(the summary turn failed: {type(exc).__name__})"
        cost = self._cost(reserve)
        try:
            report = guard.record_summary(reply, tokens=agent.tokens, cost=cost)
        except ValueError as exc:  # the agent reported usage that is not a count
            cost = reserve if self.price is not None else None
            report = guard.record_summary(f"(the summary turn failed: {exc})", cost=cost)
        event = trace.event(
            EventKind.MODEL_CALL,
            decision=Decision.FINISHED,
            latency_ms=_since(started),
            tokens=agent.tokens or None,
            cost=cost,
            revision=report.revision,
            detail="summary: " + (report.summary or "")[:480],
        )
        lifecycle.add_summary(self.task_id, self.phase, report, event)

    def _cost(self, reserve: int) -> int | None:
        """What the model call really cost: as the agent reports it, or from its token
        counts at the model's price; the reservation when it says neither; ``None`` for a
        call that is neither priced nor reported (nothing to settle)."""
        agent = self.agent
        if agent.cost is not None:
            return agent.cost
        if self.price is None:
            return None
        if agent.input_tokens is not None:
            return self.price.cost(agent.input_tokens, agent.output_tokens or 0)
        return reserve


def in_money(stop: Report, reserve: int) -> Report:
    """A spend stop's detail as people read money (the guard knows no currency)."""
    if stop.reason is not Reason.SPEND_BUDGET:
        return stop
    left = stop.remaining.get("spend")
    return replace(
        stop, detail=f"the next model call may cost {money(reserve)}; {money(left)} left"
    )


def _since(started: float) -> int:
    """Whole milliseconds since ``started`` (``time.monotonic()``)."""
    return trace.ms(time.monotonic() - started)
