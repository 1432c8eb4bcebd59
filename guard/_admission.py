"""The admission step: every call of one model call checked before any of them runs.

The proposal must be well-formed calls (``_checks.as_calls``). Each call is counted as a
request against the budget, fingerprinted, looked at by the settlement step if it is a
write, checked by the loop detector, and given one of the budget's executions (a committed
result it will reuse needs none). A batch is checked whole: the budget reserves the
executions of the calls admitted so far, the detector counts them as repeats and cycle
members, the settlement knows their operation keys. The first refusal ends the admission,
and nothing of that model call runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from ._budget import Budget
from ._checks import Refusal, as_calls, describe, plain
from ._detector import Detector
from ._fingerprint import fingerprint
from ._settlement import SettlementStep
from ._ticket import Ticket
from ._values import Call, Effect, Nudge, Reason, State

__all__ = ["AdmissionStep", "Refused"]

_NO_ROOM = Refusal(State.PARTIAL, Reason.EXECUTION_BUDGET)
_IN_FLIGHT = Refusal(State.NEEDS_HUMAN, Reason.OPERATION_IN_FLIGHT)


class Refused(NamedTuple):
    """A proposal refused while it was admitted: why, and what the stop report names of it
    (the call refused, if one was, and its fingerprint, when the report may show one)."""

    refusal: Refusal
    call: Call | None = None
    fingerprint: str | None = None

    def describe(self) -> dict[str, Any] | None:
        """A JSON-ready line for the stop report's ``call``."""
        if self.call is None:
            return None
        tool: Any = self.call.tool  # a refused call may carry anything here
        return {
            "tool": tool if isinstance(tool, str) else repr(tool),
            "fingerprint": self.fingerprint,
            "operation_key": self.call.operation_key,
        }


class AdmissionStep:
    """The admission of one task's model calls against its budget, detector and settlement;
    with ``tools`` (name → effect), only calls of those tools with their real effects."""

    __slots__ = ("_budget", "_detector", "_settlement", "_tools")

    def __init__(
        self,
        budget: Budget,
        detector: Detector,
        settlement: SettlementStep,
        tools: Mapping[str, Effect] | None,
    ) -> None:
        self._budget = budget
        self._detector = detector
        self._settlement = settlement
        self._tools = None if tools is None else dict(tools)

    def admit(self, proposal: Any) -> list[Ticket] | Nudge | Refused:
        """Admit the calls of one model call's ``proposal``: a ticket for each, in order, or
        a :class:`Nudge` to show the model instead, or what was refused."""
        calls = as_calls(proposal, self._tools)
        if isinstance(calls, str):
            return Refused(Refusal(State.FAILED, Reason.BAD_CALL, calls))
        budget, detector, settlement = self._budget, self._detector, self._settlement
        several = len(calls) > 1
        if several:
            settlement.begin_batch()
        tickets: list[Ticket] = []
        for index, call in enumerate(calls):
            refused = budget.start_request()
            if refused is not None:
                return Refused(Refusal(State.PARTIAL, refused), call)
            try:
                fp = fingerprint(call.tool, plain(call.args))
            except Exception as exc:  # BadArguments, or a Mapping that cannot be read
                return Refused(Refusal(State.FAILED, Reason.BAD_ARGS, describe(exc)), call)
            reuse: Refusal | bool = False
            if call.effect == "write":
                # One call alone meets the ledger's answers at its claim, with nothing run in
                # between; a batch, or a call with no room left to run, is looked at now.
                look = several or not budget.has_room(admitting=True)
                reuse = settlement.admit(call, fp, look=look, batch=several)
                if reuse is not False and reuse is not True:
                    return Refused(reuse, call, fp if reuse.named else None)
            poll = detector.admit(call, fp)
            if poll is not False and poll is not True:
                if isinstance(poll, Nudge):
                    return poll
                # Out of polls while another execution still holds the write: that one
                # is for a human to look at, not a budget to raise.
                if (
                    poll.reason is Reason.POLL_BUDGET
                    and call.effect == "write"
                    and settlement.in_flight(str(call.operation_key))
                ):
                    return Refused(_IN_FLIGHT, call, fp)
                return Refused(poll, call, fp)
            if not reuse and not budget.admit_execution():
                return Refused(_NO_ROOM, call, fp)
            tickets.append(Ticket(index, call, fp, poll))
        polls = detector.end_admission()
        if polls:
            budget.count_polls(polls)
        return tickets
