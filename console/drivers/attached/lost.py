"""The calls a lost client left running, and what becomes of them.

A request that takes the lease from another client (a new process after its predecessor
vanished, or a client whose lease ran out) finds the calls that were running as orphans
(:class:`~console.drivers.attached.driver._Driver` restores them). A heartbeat names them
(:func:`_interrupted`); a result step reports what the tool's lookup found (:func:`_found`),
or the very client that ran it its late ``SUCCESS`` (:func:`_late`); the step that ends
the model call's calls settles the rest first (:func:`_settled_first`) and serves the wait
they ask for (:func:`_waited_while_lost`). A write is never run again on anyone's word:
only trusted evidence settles it, and each write settled so is audited as an automatic
settle (:func:`_audit_settled`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from console.drivers.attached.fields import _bounded, _outcome, _text, _ToolError
from console.lifecycle import audit_automatic_settle
from console.models import Decision, Operation
from console.records.inputs import MAX_RESULT_BYTES
from console.records.redaction import preview
from console.services import InvalidInput
from guard import Kind, OperationState, Reason, Report, Result, Settlement, State
from guard.steps import RETRY_WAIT_MS, Next, Ticket

if TYPE_CHECKING:  # the driver imports this module: its class is named for the types only
    from console.drivers.attached.driver import _Driver


def _interrupted(driver: _Driver, index: int) -> dict[str, Any]:
    """An interrupted call as a heartbeat names it, for the new process to report."""
    ticket = driver._ticket(index)
    call = ticket.call
    return {
        "ticket": ticket.index,
        "tool": call.tool,
        "effect": call.effect,
        "operation_key": call.operation_key,
        "status": str(ticket.status),
    }


def _interrupt(
    driver: _Driver, ticket: Ticket, found: Settlement | None, inspect: Any
) -> Report | None:
    """Settle a call its lost client left running. A reuse counts its stored result; a
    read is re-askable (``RETRYABLE``: the model may ask for it again, within the
    repeat limit); a write is lost — settled by ``found`` (the tool's lookup, asked by
    the new process) or ``UNKNOWN`` for a person. Never run again on anyone's word."""
    driver.clock.orphans = tuple(i for i in driver.clock.orphans if i != ticket.index)
    why = "interrupted: the client running it was lost before it reported"
    if str(ticket.status) == "reusing":
        stop = driver.guard.after_tool(ticket, inspect=inspect)
        decision = Decision.REUSED
    elif ticket.call.effect == "write":
        decision = Decision.EXECUTED
        key = ticket.call.operation_key or ""
        if found is None or found.committed is None:
            # Recovery made it UNKNOWN when the lease ran out; nobody can tell more.
            if found is not None:
                why = f"{why}; its lookup could not tell: {found.evidence}"
            stop = driver.guard.halt(State.NEEDS_HUMAN, Reason.UNKNOWN_COMMIT, f"{why} ({key})")
        else:
            error = _ToolError(why, transient=True)
            settled = driver.guard.after_tool(
                ticket, error=error, inspect=inspect, lookup=lambda _key: found
            )
            stop = settled
            driver.settled.append((key, found))
            said = "committed" if found.committed else "not committed"
            why = f"{why}; its lookup found it {said}: {found.evidence}"
    else:
        retry = Result(Kind.RETRYABLE, {"interrupted": why}, wait_ms=RETRY_WAIT_MS)
        stop = driver.guard.after_tool(ticket, retry, inspect=inspect)
        decision = Decision.EXECUTED
    driver.events.append(
        driver._request(
            ticket,
            decision,
            None,
            preview(ticket.call.args),
            reason="" if stop is None else stop.reason,
            detail=why[:500],
        )
    )
    return stop


def _settled_first(driver: _Driver) -> Report | None:
    """Before a step that ends the model call's calls: the calls a lost client left
    running are settled as interrupted (the stop, if one of them stops the task), before
    the sequencer judges the step (:attr:`_Driver.seq`)."""
    if not driver.clock.orphans:
        return None
    for index in driver.clock.orphans:
        stop = _interrupt(driver, driver._ticket(index), None, None)
        if stop is not None:
            return stop
    return _waited_while_lost(driver)


def _waited_while_lost(driver: _Driver) -> Report | None:
    """Once the calls a lost client left are settled: the wait they ask for (a read
    asked again, a write a lookup proved not committed) passed while the lease ran out
    and the new process took over, so it is served here; the new process is never
    refused a model step for a wait nobody told it of."""
    if driver.seq.next().next is not Next.WAIT:
        return None
    pause = driver._guarded(driver.seq.pause)
    return pause if isinstance(pause, Report) else None


def _late(result: Any, error: Any) -> Settlement | None:
    """A write's own outcome, reported by the client that ran it after its lease ran out:
    a ``SUCCESS`` settles it committed with that result; anything else is still unknown."""
    outcome, failed = _outcome(result, error)
    if failed is not None or not isinstance(outcome, Result) or outcome.kind is not Kind.SUCCESS:
        return None
    return Settlement(True, outcome, "its client reported SUCCESS after its lease ran out")


def _found(raw: Any, ticket: Ticket) -> Settlement | None:
    """A client's report of what its tool's trusted lookup found about an interrupted
    write, or ``None`` (no lookup: the write is lost)."""
    if raw is None:
        return None
    if ticket.call.effect != "write":
        raise InvalidInput("lookup is for a write: an interrupted read is asked again")
    if not isinstance(raw, Mapping) or set(raw) - {"committed", "result", "evidence"}:
        raise InvalidInput('lookup is {"committed": true|false|null, "result"?, "evidence"}')
    committed = raw.get("committed")
    if not (committed is None or isinstance(committed, bool)):
        raise InvalidInput("lookup.committed must be true, false or null (cannot tell)")
    evidence = _text(raw.get("evidence"), "lookup.evidence")
    if committed is not None and not evidence.strip():
        raise InvalidInput("lookup.evidence must say what the lookup found")
    result = None
    if raw.get("result") is not None:
        if committed is not True:
            raise InvalidInput("lookup.result only goes with committed: true")
        _bounded(raw["result"], "lookup.result", MAX_RESULT_BYTES)
        reported, error = _outcome(raw["result"], None)
        if error is not None or not isinstance(reported, Result):
            raise InvalidInput("lookup.result must be a result, {kind, data?}")
        result = reported
    return Settlement(committed, result, evidence)


def _audit_settled(driver: _Driver) -> None:
    """Every write a client's lookup settled, in the audit log as an automatic settle
    in the name of the token's person (its evidence is in the operation's history)."""
    for key, found in driver.settled:
        reached = OperationState.COMMITTED if found.committed else OperationState.NOT_COMMITTED
        op = Operation.objects.filter(key=key, state=reached).first()
        if op is None:  # the ledger refused the move (a person settled it first)
            continue
        audit_automatic_settle(
            op, actor=driver.actor, task_id=driver.task.id, before=OperationState.UNKNOWN,
            said=found.evidence, client=driver.task.client,
        )  # fmt: skip
    driver.settled = []
