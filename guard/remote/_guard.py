"""The steps of :class:`RemoteGuard` (:class:`guard.steps.StepGuard`), each one request to the
console, its answer read back as the local guard's values; and ``run``, which drives them
in the order every driver keeps."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .._checks import amount, as_calls, describe, plain, transient_error
from .._driver import Execute, Plan, Reserve, loop
from .._fingerprint import canonical_json
from .._report import Report
from .._sequence import Inspect, Sequencer
from .._ticket import Action, Decision, Status, Ticket, execute, reuse
from .._values import Finish, Nudge, Reason, Result, State, _json_ready
from ._coming_back import _Making
from ._transport import _invalid
from ._wire import _TEXT_LIMIT, MAX_CALLS, _evidence, _message, _nudge, _repr, _ticket

if TYPE_CHECKING:
    from .._protocol import StepGuard


class RemoteGuard(_Making):
    """One attached task's guard on the console, driven step by step from this process.

    Make one with :meth:`start` (a new task) or :meth:`attach` (a task that exists: after
    an approved resumption, or from a new process); then drive it like a local guard (see
    :mod:`guard.steps`) and :meth:`close` it (or use it as a context manager). ``task`` is
    the task's id, ``lease`` this client's lease, ``page_url`` the task's page on the
    console, ``state`` and ``phase`` as the latest answer gave them.

    The steps are serialised (one request at a time); the heartbeat goes beside them. Every
    step may raise :exc:`ConsoleUnreachable` or :exc:`ProtocolError` (see the module's
    docstring); neither ever lets a tool run.
    """

    # -- steps -----------------------------------------------------------------------------

    def before_model(self, *, reserve: int = 0) -> Report | None:
        """Ask for one model call (``reserve``: its maximum cost, for the spend budget):
        ``None`` if it may happen, else the stop report."""
        reserve = amount("reserve", reserve)
        with self._lock:
            if self._report is not None:
                return self._report
            self._wait_ahead = None
            if self._model_ahead:
                # Allowed (and counted) with the last result, without a spend budget to
                # reserve in: nothing to ask again.
                self._model_ahead = False
                self._batch.tickets = []
                self._settleable = True
                return None
            answer = self._step("model", {"reserve": reserve})
            if (stop := self._stopped()) is not None:
                return stop
            if answer.get("allowed") is not True:
                raise _invalid("a model step answered neither allowed nor a stop")
            self._batch.tickets = []
            self._settleable = True
            return None

    def before_tools(self, proposal: Any, *, enter: bool = False) -> list[Ticket] | Nudge | Report:
        """Admit the calls of one model call (a :class:`~guard.Call` or a list of them):
        the tickets, a :class:`~guard.Nudge` to show the model instead, or the stop report.

        ``enter=True`` promises that the host calls :meth:`before_tool` for a proposal of
        one call at once, with nothing in between (no person asked, no other check that
        may drop the call): the console then decides the call's entry — its claim, for a
        write — in the same request, and :meth:`before_tool` hands that decision back
        without asking again. A step is then two requests, not three. A host that may not
        run an admitted call straight away (an approval step of its framework, say) must
        not promise it: a write claimed and never run waits for a person as ``UNKNOWN``.
        With several calls ``enter`` is ignored (each is entered on its own).

        A proposal that is not well-formed calls, or whose arguments JSON cannot hold, is
        not sent: the task is halted ``FAILED``/``bad_call`` or ``bad_args`` (unlike the
        local guard, without counting a request for it). So is a model call of more than
        :data:`MAX_CALLS` calls.
        """
        with self._lock:
            if self._report is not None:
                return self._report
            calls = as_calls(proposal, None)
            if isinstance(calls, str):
                return self.halt(State.FAILED, Reason.BAD_CALL, calls)
            if len(calls) > MAX_CALLS:
                detail = f"{len(calls)} calls in one model call; at most {MAX_CALLS} are checked"
                return self.halt(State.FAILED, Reason.BAD_CALL, detail)
            wire: list[dict[str, Any]] = []
            for call in calls:
                try:
                    args = json.loads(canonical_json(plain(call.args)))
                except Exception as exc:  # BadArguments, or a Mapping that cannot be read
                    return self.halt(State.FAILED, Reason.BAD_ARGS, describe(exc))
                item: dict[str, Any] = {"tool": call.tool, "args": args, "effect": call.effect}
                if call.operation_key is not None:
                    item["operation_key"] = call.operation_key
                wire.append(item)
            entering = enter and len(wire) == 1
            fields: dict[str, Any] = {"calls": wire}
            if entering:
                fields["enter"] = True
            answer = self._step("tools", fields)
            self._batch.tickets = []
            self._entered = None
            if (stop := self._stopped()) is not None:
                return stop
            if "nudge" in answer:
                return _nudge(answer["nudge"])
            admitted = answer.get("admitted")
            if not isinstance(admitted, list) or not admitted:
                raise _invalid("a tools step answered neither tickets, a nudge nor a stop")
            self._batch.tickets = [_ticket(item, calls) for item in admitted]
            if entering:
                self._entered = answer
            return list(self._batch.tickets)

    def before_tool(self, ticket: Ticket, *, lookup: Any = None) -> Decision:
        """Ask, at the executor's entry, whether this admitted call may run now: ``EXECUTE``
        (run it once, then :meth:`after_tool`), ``REUSE`` with the stored result (do not
        run it) or ``STOP``. Raises rather than allow when the console cannot be asked.

        ``lookup`` is accepted for the local guard's signature and not used: protocol 1
        runs no lookups for attached tools."""
        with self._lock:
            if self._report is not None:
                return Decision(Action.STOP, ticket, report=self._report)
            self._batch.entering(ticket)
            answer, self._entered = self._entered, None
            if answer is None or "action" not in answer:  # not decided with the admission
                answer = self._step("call", {"ticket": ticket.index})
            if (stop := self._stopped()) is not None:
                self._batch.stopped()  # the calls never entered will not be
                return Decision(Action.STOP, ticket, report=stop)
            action = answer.get("action")
            if action == Action.EXECUTE:
                return execute(ticket)
            if action == Action.REUSE:
                try:
                    result = Result.from_dict(answer["result"])
                except (KeyError, TypeError, ValueError, AttributeError) as exc:
                    raise _invalid(f"a reuse without a readable result: {exc!r}") from exc
                return reuse(ticket, result)
            raise _invalid(f"a call step answered the action {action!r} without a stop")

    def after_tool(
        self,
        ticket: Ticket,
        result: Any = None,
        *,
        error: BaseException | None = None,
        inspect: Inspect | None = None,
        lookup: Any = None,
    ) -> Report | None:
        """Report what one executed (or reused) call came to; the stop report if the task
        stops here.

        Pass the tool's return value as ``result`` (a :class:`~guard.Result`; anything else
        is sent as such, and the console stops ``bad_result``), or the exception it raised
        as ``error``. A reused call sends no result: the stored one counts. ``inspect``, the
        application's trusted inspector, runs here and its evidence is sent with a result
        (``None``: the console reads progress from the results). ``lookup`` is not used.
        """
        with self._lock:
            if self._report is not None and ticket.status is not Status.EXECUTING:
                return self._report
            fields: dict[str, Any] = {"ticket": ticket.index}
            fields |= self._then(ticket)
            if ticket.status is Status.REUSING:
                if inspect is not None:
                    fields["evidence"] = _evidence(inspect, ticket.result, ticket.call)
                self._ahead(self._step("result", fields))
                ticket.status = Status.REUSED
                return self._report
            if ticket.status is not Status.EXECUTING:
                raise ValueError("after_tool() needs a ticket that before_tool() let execute")
            returned: Result | None = None
            if error is not None:
                fields["error"] = {
                    "type": type(error).__name__,
                    "message": _message(error),
                    "transient": transient_error(error),
                }
            elif isinstance(result, Result):
                returned = result
                fields["result"] = _json_ready(result.to_dict())
                if inspect is not None:
                    fields["evidence"] = _evidence(inspect, result, ticket.call)
            else:
                # Not a result: the console stops bad_result, as the local guard does.
                fields["result"] = {"kind": "<not a result>", "data": _repr(result)}
            self._ahead(self._step("result", fields))
            ticket.status = Status.RAN
            ticket.result = returned
            return self._report

    def before_wait(self) -> float | Report:
        """Milliseconds to wait before the next model call (0: none), or the stop report."""
        with self._lock:
            if self._report is not None:
                return self._report
            if self._wait_ahead is not None:
                ahead, self._wait_ahead = self._wait_ahead, None
                return ahead
            answer = self._step("wait", {})
            if (stop := self._stopped()) is not None:
                return stop
            wait_ms = answer.get("wait_ms")
            if (
                not isinstance(wait_ms, int | float)
                or isinstance(wait_ms, bool)
                or not math.isfinite(wait_ms)
                or wait_ms < 0
            ):
                raise _invalid(f"a wait step answered wait_ms={wait_ms!r}")
            return float(wait_ms)

    def finish(self, finish: Finish, inspect: Inspect | None) -> Report:
        """The model says it is done: ``COMPLETED`` only if ``inspect`` (run here, on the
        finish) verifies the goal; with no inspector ``PARTIAL``/``goal_unverified``."""
        with self._lock:
            if self._report is not None:
                return self._report
            fields: dict[str, Any] = {"answer": _json_ready(finish.answer)}
            if inspect is not None:
                fields["evidence"] = _evidence(inspect, None, finish)
            return self._final("finish", fields)

    def planner_failed(self, error: BaseException) -> Report:
        """The model call raised instead of proposing: ``FAILED``/``planner_error``."""
        with self._lock:
            if self._report is not None:
                return self._report
            return self._final("failed", {"error": describe(error)})

    def halt(self, state: State, reason: Reason, detail: str = "") -> Report:
        """Stop now for a reason found outside the guard (``ValueError`` for a state or
        reason that is not one of the guard's words)."""
        state, reason = State(state), Reason(reason)
        with self._lock:
            if self._report is not None:
                return self._report
            return self._final(
                "halt",
                {"state": str(state), "reason": str(reason), "detail": str(detail)[:_TEXT_LIMIT]},
            )

    # -- driving ---------------------------------------------------------------------------

    def run(
        self,
        plan: Plan,
        execute: Execute,
        inspect: Inspect | None,
        *,
        reserve: Reserve | None = None,
    ) -> Report:
        """Drive ``plan`` / ``execute`` / ``inspect`` until the console stops the task, in
        the order ``Guard.run`` keeps (the same sequencer): ``plan(observation)`` returns a
        :class:`~guard.Call`, a list of them or a :class:`~guard.Finish`; ``execute(call)``
        runs one call the console let execute and returns its :class:`~guard.Result`;
        ``inspect`` is the trusted inspector (``None``: the console reads progress from
        the results). A wait a result asked for is slept here. Raises what a step raises
        (:exc:`ConsoleUnreachable`, :exc:`ProtocolError`); no tool runs without an allow.
        """
        seq = Sequencer(self, inspect=inspect)

        def wait(ms: float) -> None:
            self._sleep(ms / 1000.0)

        def cancelled() -> bool:
            return self._stop_requested

        report, _ = loop(seq, plan, execute, reserve=reserve, wait=wait, cancelled=cancelled)
        return report

    # -- internals -------------------------------------------------------------------------

    def _then(self, ticket: Ticket) -> dict[str, Any]:
        """For the last call of a model call to report: ask for what follows in the same
        request — the wait, and, without a spend budget (no reservation to make), the next
        model call too. That call is then counted even if none follows (as the hosted runner
        counts the next one ahead): a client that ends here has one model call too many."""
        others = (t for t in self._batch.tickets if t is not ticket)
        if any(t.status in (Status.ADMITTED, Status.EXECUTING, Status.REUSING) for t in others):
            return {}
        if self._remaining.get("spend") is None:
            return {"then": "model"}
        return {"then": "wait"}

    def _ahead(self, answer: Any) -> None:
        """Keep what a result's ``then`` answered ahead."""
        if self._report is not None or not isinstance(answer, Mapping):
            return
        wait_ms = answer.get("wait_ms")
        if isinstance(wait_ms, int | float) and not isinstance(wait_ms, bool) and wait_ms >= 0:
            self._wait_ahead = float(wait_ms)
        if answer.get("allowed") is True:
            self._model_ahead = True


if TYPE_CHECKING:

    def _offers_the_steps(guard: RemoteGuard) -> StepGuard:
        return guard  # mypy checks that RemoteGuard satisfies the StepGuard protocol
