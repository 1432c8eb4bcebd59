"""What the step-wise guard hands its host: a ticket per admitted call, a decision per entry."""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Any, NamedTuple

from ._checks import count, plain, text
from ._report import Report
from ._values import Call, Kind, Result

__all__ = ["Action", "Batch", "Decision", "Status", "Ticket", "execute", "reuse"]


class Action(StrEnum):
    """What the caller must do with one admitted call."""

    EXECUTE = "execute"
    REUSE = "reuse"
    STOP = "stop"


class Status(StrEnum):
    """Where one admitted call stands (shown in the stop report's batch)."""

    ADMITTED = "admitted"
    EXECUTING = "executing"
    REUSING = "reusing"
    RAN = "ran"
    REUSED = "reused"
    NOT_RUN = "not_run"


# Read on every step: bound once here, since looking a member up on its enum costs each time.
_ADMITTED, _EXECUTING, _EXECUTE = Status.ADMITTED, Status.EXECUTING, Action.EXECUTE


class Ticket:
    """One call of the current model call, admitted by :meth:`Guard.before_tools`."""

    __slots__ = ("call", "fingerprint", "index", "poll", "result", "status")

    def __init__(self, index: int, call: Call, fingerprint: str, poll: bool) -> None:
        self.index = index
        self.call = call
        self.fingerprint = fingerprint
        self.poll = poll
        self.result: Result | None = None
        self.status = _ADMITTED

    def to_dict(self) -> dict[str, Any]:
        """The ticket as JSON-ready data, for a checkpoint taken between steps."""
        call = self.call
        return {
            "index": self.index,
            "tool": call.tool,
            "args": plain(call.args),
            "effect": call.effect,
            "operation_key": call.operation_key,
            "fingerprint": self.fingerprint,
            "poll": self.poll,
            "status": str(self.status),
            "result": None if self.result is None else self.result.to_dict(),
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Ticket:
        """A ticket made by :meth:`to_dict` (``KeyError``/``TypeError``/``ValueError`` if
        malformed)."""
        effect = raw["effect"]
        if effect not in ("read", "write"):
            raise ValueError(f"a ticket's effect is read or write, not {effect!r}")
        key = raw["operation_key"]
        call = Call(
            text(raw["tool"]), dict(raw["args"]), effect, None if key is None else text(key)
        )
        ticket = cls(count(raw["index"]), call, text(raw["fingerprint"]), bool(raw["poll"]))
        ticket.status = Status(raw["status"])
        result = raw["result"]
        ticket.result = None if result is None else Result.from_dict(result)
        return ticket

    def describe(self) -> dict[str, Any]:
        """A JSON-ready line for the stop report's batch."""
        return {
            "index": self.index,
            "tool": self.call.tool,
            "fingerprint": self.fingerprint,
            "operation_key": self.call.operation_key,
            "status": str(self.status),
            "kind": None if self.result is None else str(self.result.kind),
        }


class Decision(NamedTuple):
    """The answer of :meth:`Guard.before_tool`: execute, reuse ``result``, or stop."""

    action: Action
    ticket: Ticket
    result: Result | None = None
    report: Report | None = None


def execute(ticket: Ticket) -> Decision:
    """``Decision(Action.EXECUTE, ticket)``, the ticket marked ``EXECUTING``. Made before
    every execution: built as the tuple it is, without the named tuple's constructor (a
    Python function), for speed."""
    ticket.status = _EXECUTING
    return tuple.__new__(Decision, (_EXECUTE, ticket, None, None))


def reuse(ticket: Ticket, result: Result | None) -> Decision:
    """``Decision(Action.REUSE, ticket, result)`` for a committed ``result`` (a bare
    ``SUCCESS`` if the write was recorded without one), the ticket marked ``REUSING``."""
    ticket.status = Status.REUSING
    ticket.result = result or Result(Kind.SUCCESS)
    return Decision(Action.REUSE, ticket, result=ticket.result)


class Batch:
    """The admitted calls of the current model call, in order: what a step-wise guard, the
    local one or the remote one, keeps between the steps of one model call."""

    __slots__ = ("tickets",)

    def __init__(self, tickets: list[Ticket] | None = None) -> None:
        self.tickets: list[Ticket] = [] if tickets is None else tickets

    def entering(self, ticket: Ticket) -> None:
        """Refuse (``ValueError``) an entry for a ticket that is not a fresh one of this
        batch: nothing may run twice, nor run for another model call."""
        if ticket not in self.tickets or ticket.status is not _ADMITTED:
            raise ValueError("before_tool() needs a fresh ticket from the current before_tools()")

    def stopped(self) -> tuple[dict[str, Any], ...]:
        """The lines of a stopped model call for its report: the calls admitted but not
        entered are marked ``NOT_RUN`` first, since they never will be."""
        for ticket in self.tickets:
            if ticket.status is Status.ADMITTED:
                ticket.status = Status.NOT_RUN
        return tuple(ticket.describe() for ticket in self.tickets)
