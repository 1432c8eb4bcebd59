"""The protocol's steps: one handler each, and the table that names them.

Each handler answers one step (docs/protocol.md) for a driver restored for it
(:class:`~console.drivers.attached.driver._Driver`): it asks the sequencer whether the
step fits, asks the guard, appends the step's trace events and saves, or stops.
:data:`PROTOCOL_STEPS` (at the end, after the handlers it names) is what the driver
dispatches through and what the API's schemas and OpenAPI document are built from: a new
step is one entry there and its handler here (and its row in docs/protocol.md).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from console.drivers import trace
from console.drivers.attached.driver import _Driver, lease_seconds
from console.drivers.attached.fields import (
    MAX_AMOUNT,
    _calls,
    _count,
    _inspector,
    _outcome,
    _text,
    _ticket,
)
from console.drivers.attached.lost import (
    _found,
    _interrupt,
    _interrupted,
    _late,
    _settled_first,
    _waited_while_lost,
)
from console.models import Decision, EventKind
from console.records.redaction import preview, redact
from console.services import InvalidInput
from guard import Finish, Nudge, Reason, Report, State
from guard.steps import Action, Next, Ticket

# Reasons a client may stop its own task for (what the integrations find outside the
# guard); the console's own (an operator's stop, approvals) are not the client's to claim.
HALT_REASONS = frozenset(Reason) - {
    Reason.OPERATOR_STOP,
    Reason.APPROVAL_REQUIRED,
    Reason.APPROVAL_REJECTED,
}


@dataclass(frozen=True, slots=True)
class ProtocolStep:
    """One step of the protocol (docs/protocol.md): what answers it and what it carries.

    ``takes`` and ``gives`` name the request fields it reads and the answer fields it may
    give beyond every step's own, as :mod:`console.api.serializers` declares them (the request
    and answer schemas, and so the OpenAPI document, are built from this table). A new
    step is one entry here and its handler (and its row in docs/protocol.md)."""

    name: str
    handler: Callable[[_Driver, Mapping[str, Any]], dict[str, Any]]
    takes: tuple[str, ...]
    gives: tuple[str, ...]
    summary: str
    kept: bool = True
    """Its answer is stored under its request id (a retry gets it again) and it charges the
    ``usage`` it carries; a heartbeat's is not: it changes nothing a retry could repeat."""


def _heartbeat(driver: _Driver, fields: Mapping[str, Any]) -> dict[str, Any]:
    stopping = driver.task.stop_requested_at is not None
    answer = driver._answer(stop_requested=stopping, lease_seconds=lease_seconds())
    if driver.clock.orphans:
        answer["interrupted"] = [_interrupted(driver, index) for index in driver.clock.orphans]
        if driver.handover:
            driver._save()  # the calls stay interrupted for this lease's next steps
    return answer


def _model(driver: _Driver, fields: Mapping[str, Any]) -> dict[str, Any]:
    if (stop := _settled_first(driver)) is not None:
        return driver._stop(stop)
    driver.seq.check(Next.MODEL)
    for ticket in driver.guard.tickets:
        if ticket.status == "admitted":
            # Admitted and never asked for (its framework dropped it: a person said no,
            # another middleware answered): the trace says so, and keeps its key for the
            # phase's history (a batch's admission looked it up).
            shown = preview(ticket.call.args)
            detail = "admitted; the client called the model again without asking to run it"
            driver.events.append(
                driver._request(ticket, Decision.NOT_RUN, None, shown, detail=detail)
            )
    return _allow_model(driver, fields)


def _tools(driver: _Driver, fields: Mapping[str, Any]) -> dict[str, Any]:
    if (stop := _settled_first(driver)) is not None:
        return driver._stop(stop)
    driver.seq.check(Next.PROPOSAL)
    calls = _calls(fields.get("calls"), driver.task.tools)
    enter = fields.get("enter", False)
    if not isinstance(enter, bool):
        raise InvalidInput("enter must be true or false")
    if enter and len(calls) != 1:
        raise InvalidInput("enter is for a model call of exactly one call")
    proposal: Any = calls[0] if len(calls) == 1 else calls
    model = driver._model_event(proposal)
    if driver.task.stop_requested_at is not None:
        # Heard now rather than at each call's entry: none of them would run.
        driver.events.append(model)
        return driver._stop(driver.seq.halt(State.CANCELLED, Reason.OPERATOR_STOP))
    admitted = driver._guarded(lambda: driver.seq.proposed(proposal, enter=enter))
    driver.events.append(model)
    if isinstance(admitted, Report):
        driver.events.append(trace.blocked_event(admitted))
        return driver._stop(admitted)
    if isinstance(admitted, Nudge):
        driver.events.append(trace.nudge_event(admitted, driver.guard.revision))
        driver._save()
        nudge = {
            "message": admitted.message,
            "tool": admitted.tool,
            "fingerprint": admitted.fingerprint,
            "reason": str(admitted.reason),
        }
        return driver._answer(nudge=nudge)
    driver.clock.entered = {}
    tickets = [_ticket(ticket) for ticket in admitted]
    if enter:
        # The client runs its one call as soon as it hears: this request is the call's
        # entry too, decided after its admission in the same transaction, as the
        # runner claims right after admitting.
        return _enter(driver, admitted[0], admitted=tickets)
    # Admitting runs nothing: each call's entry (a claim, or a read's save) commits
    # synchronously before its tool may run, and flushes this commit with it (WAL is
    # written in order). A crash of the database server in between loses the
    # admission, and the client's next step is refused (unknown_call): nothing ran.
    driver._save(durable=False)
    return driver._answer(admitted=tickets)


def _call(driver: _Driver, fields: Mapping[str, Any]) -> dict[str, Any]:
    return _enter(driver, driver._ticket(fields.get("ticket")))


def _enter(driver: _Driver, ticket: Ticket, **answer: Any) -> dict[str, Any]:
    """The executor's entry of an admitted call: execute (its claim made), reuse the
    stored result, or stop."""
    driver.seq.check(Next.ENTER, ticket)
    shown = preview(ticket.call.args)
    driver.ledger.describe(ticket.call, shown)
    decision = driver._guarded(lambda: driver.seq.enter(ticket))
    if decision.action is Action.STOP:
        report = decision.report
        if report is None:  # pragma: no cover - STOP always carries its report
            raise RuntimeError("a stop decision without a report")
        event = driver._request(ticket, Decision.BLOCKED, None, shown, reason=report.reason)
        driver.events.append(event)
        return driver._stop(report)
    entered = dict(driver.clock.entered or {})
    entered[str(ticket.index)] = driver.now
    driver.clock.entered = entered
    driver._save()
    if decision.action is Action.EXECUTE:
        return driver._answer(**answer, action="execute")
    result = decision.result
    shown_result = None if result is None else redact(result.to_dict())
    return driver._answer(**answer, action="reuse", result=shown_result)


def _result(driver: _Driver, fields: Mapping[str, Any]) -> dict[str, Any]:
    ticket = driver._ticket(fields.get("ticket"))
    orphan = ticket.index in driver.clock.orphans
    if not orphan:  # a call a lost client left is settled by the driver (_interrupt)
        driver.seq.check(Next.RESULT, ticket)
    then = fields.get("then")
    if then is not None and then not in ("wait", "model"):
        raise InvalidInput('then must be "wait" or "model"')
    if then == "model":  # checked before the result moves anything (a 400 is final)
        _count(fields.get("reserve", 0), "reserve", MAX_AMOUNT)
    reported = fields.get("result") is not None or fields.get("error") is not None
    if orphan and (not reported or ticket.call.effect == "write"):
        # Interrupted with its client: what the tool's lookup found, or nothing (lost).
        # Recovery has made a write UNKNOWN; only trusted evidence settles it now: a
        # lookup, or the very client that ran it reporting its SUCCESS after its lease
        # ran out (nobody else can have run it: an UNKNOWN write never runs again).
        if reported and fields.get("lookup") is not None:
            raise InvalidInput("a result step carries a result, an error or a lookup")
        found = _found(fields.get("lookup"), ticket)
        if reported and driver.clock.orphaned_by == driver.store.owner:
            found = _late(fields.get("result"), fields.get("error"))
        stop = _interrupt(driver, ticket, found, _inspector(fields.get("evidence")))
        if stop is None and not driver.clock.orphans:
            stop = _waited_while_lost(driver)
        if stop is not None:
            return driver._stop(stop)
        return _after_results(driver, fields, then)
    if fields.get("lookup") is not None:
        raise InvalidInput("lookup is only for a call its client left running (interrupted)")
    executed = str(ticket.status) == "executing"
    outcome: Any = None
    error: BaseException | None = None
    if executed:
        outcome, error = _outcome(fields.get("result"), fields.get("error"))
    stop = driver._guarded(
        lambda: driver.seq.returned(ticket, outcome)
        if error is None
        else driver.seq.raised(ticket, error)
    )
    entered = (driver.clock.entered or {}).get(str(ticket.index))
    latency = None if entered is None else max(0.0, driver.now - float(entered)) / 1000.0
    detail = "" if error is None else str(error)[:500]
    driver.events.append(
        driver._request(
            ticket,
            Decision.EXECUTED if executed else Decision.REUSED,
            latency,
            preview(ticket.call.args),
            reason="" if stop is None else stop.reason,
            detail=detail,
        )
    )
    if stop is not None:
        return driver._stop(stop)
    return _after_results(driver, fields, then)


def _after_results(
    driver: _Driver, fields: Mapping[str, Any], then: str | None
) -> dict[str, Any]:
    if then is None or driver.seq.next().next is not Next.WAIT:
        driver._save()  # calls of this model call are still to come: nothing follows yet
        return driver._answer()
    # The model call's last result, and what the client does next in the same request:
    # the wait, and (when there is none) the next model call, counted now, as the
    # runner counts it ahead with the step's save.
    return _wait(driver, fields, model=then == "model")


def _wait(driver: _Driver, fields: Mapping[str, Any], *, model: bool = False) -> dict[str, Any]:
    if (stop := _settled_first(driver)) is not None:
        return driver._stop(stop)
    driver.seq.check(Next.WAIT)
    if driver.task.stop_requested_at is not None:
        # Heard now rather than after the wait: the next model call would refuse anyway.
        return driver._stop(driver.seq.halt(State.CANCELLED, Reason.OPERATOR_STOP))
    pause = driver._guarded(driver.seq.pause)
    if isinstance(pause, Report):
        return driver._stop(pause)
    if pause:
        driver.events.append(trace.event(EventKind.WAIT, detail=f"waiting {pause:.0f} ms"))
    elif model:
        return _allow_model(driver, fields, wait_ms=pause)
    driver._save()
    return driver._answer(wait_ms=pause)


def _allow_model(driver: _Driver, fields: Mapping[str, Any], **answer: Any) -> dict[str, Any]:
    """Count the next model call (reserving ``reserve``), or stop."""
    reserve = _count(fields.get("reserve", 0), "reserve", MAX_AMOUNT)
    stop = driver._guarded(lambda: driver.seq.model(reserve=reserve))
    if stop is not None:
        return driver._stop(stop)
    driver.clock.model_at = driver.now
    driver._save()
    return driver._answer(**answer, allowed=True)


def _finish(driver: _Driver, fields: Mapping[str, Any]) -> dict[str, Any]:
    if (stop := _settled_first(driver)) is not None:
        return driver._stop(stop)
    driver.seq.check(Next.PROPOSAL)
    finish = Finish(fields.get("answer"))
    report = driver._guarded(lambda: driver.seq.proposed(finish))
    driver.events.append(driver._model_event(finish))
    return driver._stop(report)


def _failed(driver: _Driver, fields: Mapping[str, Any]) -> dict[str, Any]:
    why = _text(fields.get("error"), "error") or "the model call failed"
    detail = f"planner: {why}"
    driver.events.append(driver._model_event(None, detail=detail))
    return driver._stop(driver.seq.planner_failed(RuntimeError(why)))


def _halt(driver: _Driver, fields: Mapping[str, Any]) -> dict[str, Any]:
    try:
        state = State(str(fields.get("state")))
        reason = Reason(str(fields.get("reason")))
    except ValueError:
        raise InvalidInput("halt needs a state and a reason in the guard's words") from None
    if reason not in HALT_REASONS or state is State.COMPLETED:
        raise InvalidInput(f"a client may not stop its task {state}/{reason}")
    detail = _text(fields.get("detail"), "detail")
    return driver._stop(driver.seq.halt(state, reason, detail))


def _steps(*steps: ProtocolStep) -> dict[str, ProtocolStep]:
    return {step.name: step for step in steps}


PROTOCOL_STEPS: Mapping[str, ProtocolStep] = _steps(
    ProtocolStep(
        "model", _model, ("reserve",), ("allowed",),
        "before a model call: allowed, or the stop report",
    ),
    ProtocolStep(
        "tools", _tools, ("calls", "enter"), ("admitted", "nudge", "action", "result"),
        "before the model call's calls: their tickets, a nudge for the model, or the stop",
    ),
    ProtocolStep(
        "call", _call, ("ticket",), ("action", "result"),
        "at a call's entry: execute it, reuse its stored result, or the stop",
    ),
    ProtocolStep(
        "result", _result,
        ("ticket", "result", "error", "lookup", "evidence", "then", "reserve"),
        ("wait_ms", "allowed"),
        "after a call: what it came to (with then, what wait and model answer too)",
    ),
    ProtocolStep(
        "wait", _wait, (), ("wait_ms",),
        "before waiting: how long to wait before the next model call",
    ),
    ProtocolStep(
        "finish", _finish, ("answer", "evidence"), (),
        "the model's final answer: the stop report, COMPLETED only if verified",
    ),
    ProtocolStep(
        "failed", _failed, ("error",), (),
        "the model call raised: the stop report, FAILED/planner_error",
    ),
    ProtocolStep(
        "halt", _halt, ("state", "reason", "detail"), (),
        "the client stops its task for a reason it found: the stop report",
    ),
    ProtocolStep(
        "heartbeat", _heartbeat, (), ("stop_requested", "lease_seconds", "interrupted"),
        "renew the lease (or take it, coming back): the calls a lost client left running",
        kept=False,
    ),
)  # fmt: skip
"""The protocol's steps by name, in the order docs/protocol.md lists them."""

STEPS = tuple(PROTOCOL_STEPS)
"""The steps' names."""
