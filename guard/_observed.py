"""The observed-evidence policy: what counts as progress when the host has no trusted
inspector (``inspect=None``), as framework agents (LangChain, the OpenAI Agents SDK) have none.

Without an inspector the revision would never rise and ``no_progress`` would stop every
such agent after ``stagnant`` requests. This policy reads progress from what the tools
themselves return instead, and stands in for ``inspect``:

- a ``SUCCESS`` read whose result (the tool's name and the canonical JSON of its data) was
  never seen before in the task is new information: the revision rises by one and one unit
  of the exploration budget (``Limits.explore``) is spent; a result seen before does not
  count, and once the budget is spent no new result counts either;
- a write that ran and returned ``SUCCESS`` is ``COMMITTED`` on the tool's own word (its
  trusted lookup, when it has one, is asked too: if it finds nothing the write is
  ``UNKNOWN`` for a human) and the revision rises by one; a reused result is not progress;
  a write that did not return ``SUCCESS`` has no commit state from this policy, so the
  ledger's usual rules apply (a lookup may settle it, else it is ``UNKNOWN``);
- ``done`` is never true: a finish ends ``PARTIAL``/``goal_unverified``.

Beside a trusted inspector the same memory tells information gathered from a loop
(:meth:`Observer.gathered`): a ``SUCCESS`` read whose result was never seen before, in a
step where the inspector saw no progress, spends one unit of the exploration budget and
starts the count of stagnant requests again from itself (the revision stays the
inspector's). ``Limits(explore=0)`` turns that off.

Only a hash of each result that counted is kept (128 bits of sha256), so the memory, and
the checkpoint part that carries it (``observed``), are bounded by the exploration budget.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

from ._budget import Budget
from ._checks import text
from ._detector import Detector
from ._fingerprint import BadArguments, canonical_json
from ._sequence import Inspect
from ._settlement import Lookup, look_up
from ._ticket import Status, Ticket
from ._values import Call, Evidence, Finish, Kind, Result

__all__ = ["Observer", "result_hash"]

_HASH_HEX = 32  # 128 bits: collisions are out of reach, and a collision only fails closed

# Read on every step: bound once here, since looking a member up on its enum costs each time.
_SUCCESS, _RAN = Kind.SUCCESS, Status.RAN


def result_hash(tool: str, data: Any) -> str:
    """A short hash of what ``tool`` returned: its name and the canonical JSON of ``data``
    (data JSON cannot hold is read by its ``repr``). Arguments are left out on purpose:
    the same answer to reworded arguments is not new information."""
    try:
        body = canonical_json(data)
    except BadArguments:
        try:
            body = "repr:" + repr(data)
        except Exception:  # a result that cannot describe itself tells nothing new
            body = "unreadable"
    digest = hashlib.sha256(f"{tool}\x00{body}".encode(errors="replace")).hexdigest()
    return digest[:_HASH_HEX]


class Observer:
    """One task's memory of the results that counted (as progress, or beside an inspector
    as exploration), and the evidence it gives in place of an inspector."""

    __slots__ = ("_budget", "_detector", "_missed", "_policy", "seen")

    def __init__(self, budget: Budget, detector: Detector) -> None:
        self._budget = budget
        self._detector = detector
        self.seen: dict[str, None] = {}  # hashes of the results that counted, in order
        self._policy = False  # this task's progress is read from its tools' results
        self._missed = False  # beside an inspector, a new result came after the budget

    @property
    def used(self) -> bool:
        """Whether this task read its tools' results at all (its checkpoint then carries
        the observer's part)."""
        return self._policy or bool(self.seen)

    def about(self, ticket: Ticket | None, lookup: Lookup | None = None) -> _Observed:
        """An inspector for one step: ``ticket``'s call (``None``: the model's finish);
        ``lookup`` is the tool's trusted lookup, asked about a write that says
        ``SUCCESS``."""
        self._policy = True
        return _Observed(self, ticket, lookup)

    def evidence(
        self, ticket: Ticket | None, result: Result | None, lookup: Lookup | None
    ) -> Evidence:
        """What this policy makes of ``ticket``'s ``result`` (see the module's rules)."""
        revision = self._detector.revision
        if ticket is None or result is None or result.kind != Kind.SUCCESS:
            return Evidence(revision, False)
        call = ticket.call
        if call.effect == "write":
            if ticket.status is not Status.RAN:
                return Evidence(revision, False)  # a reused result: counted when it ran
            found = None if lookup is None else look_up(lookup, call.operation_key or "")
            if found is not None and found.committed is False:
                # The tool says it succeeded, its lookup finds nothing: nobody knows.
                return Evidence(revision, False, committed=False)
            return Evidence(revision + 1, False, committed=True)
        if self._new(call.tool, result.data) is not True:
            return Evidence(revision, False)
        return Evidence(revision + 1, False)

    def gathered(self, ticket: Ticket, result: Result, inspect: Inspect) -> bool:
        """Beside a trusted ``inspect`` that saw no progress in this step: whether
        ``ticket``'s read brought back a result never seen before in the task, counted as
        exploration (one unit of ``Limits.explore`` spent). Under this policy itself
        (``inspect`` is :meth:`about`'s) a new result is progress instead, and with
        ``Limits(explore=0)`` nothing is gathered: the host opted out."""
        if (
            isinstance(inspect, _Observed)
            or ticket.call.effect != "read"
            or result.kind != _SUCCESS
            or ticket.status is not _RAN
            or self._budget.limits.explore == 0
        ):
            return False
        new = self._new(ticket.call.tool, result.data)
        if new is None:
            self._missed = True
        return new is True

    def _new(self, tool: str, data: Any) -> bool | None:
        """Whether ``tool``'s ``data`` was never seen before in the task and counts (its
        hash kept, one of the exploration budget spent); ``None``: new, but the budget is
        spent, so it does not count."""
        seen = result_hash(tool, data)
        if seen in self.seen:
            return False
        if not self._budget.explore():
            return None
        self.seen[seen] = None
        return True

    def exhausted(self) -> bool:
        """Whether the exploration budget is spent and that mattered to this task: its
        progress is read from its results, or a new result beside its inspector could no
        longer count. Then a ``no_progress`` stop says so."""
        return (self._policy or self._missed) and self._budget.explore_spent()

    # -- checkpoint ----------------------------------------------------------------------

    def checkpoint(self) -> dict[str, Any]:
        """The observer's part of a checkpoint: the hashes of the results that counted."""
        return {"seen": list(self.seen)}

    def load(self, raw: Mapping[str, Any]) -> None:
        """Take back a part made by :meth:`checkpoint` (``TypeError``/``KeyError`` if not)."""
        self.seen = {text(seen): None for seen in raw["seen"]}


class _Observed:
    """The observer as an ``inspect`` for one step (called once, by the outcome step)."""

    __slots__ = ("_lookup", "_observer", "_ticket")

    def __init__(self, observer: Observer, ticket: Ticket | None, lookup: Lookup | None) -> None:
        self._observer = observer
        self._ticket = ticket
        self._lookup = lookup

    def __call__(self, result: Result | None, subject: Call | Finish) -> Evidence:
        return self._observer.evidence(self._ticket, result, self._lookup)
