"""The loop detector: repeats, cycles, polls of a ``PENDING`` job and stagnation, measured
against the verified revision.

Only a rise in the revision is progress: it clears the memory of repeats and cycles and
resets stagnation. A read that brought back something new beside an inspector (exploration)
only starts the count of stagnant requests again, from itself. Admission reads what was
observed plus the calls of the same model call admitted before (a batch is checked whole
before anything runs) until the model call is admitted whole (``end_admission``) or nudged;
:meth:`Detector.observe` then records what each call came to. Any other refusal stops the
task, so nothing reads the rest again.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ._checks import Refusal, count, text
from ._values import Call, Kind, Limits, Nudge, Reason, State

__all__ = ["Detector"]

# Read on every step: bound once here, since looking a member up on its enum costs each time.
_PENDING = Kind.PENDING


class Detector:
    """The memory of one task's calls since its last verified progress."""

    __slots__ = (
        "_admitted",
        "_kept",
        "_nudge",
        "_polled",
        "limits",
        "nudged",
        "pending",
        "recent",
        "repeats",
        "revision",
        "stagnant",
    )

    def __init__(self, limits: Limits, revision: int, *, nudge: bool) -> None:
        self.limits = limits
        self._nudge = nudge
        self.revision = revision
        self.stagnant = 0
        # The last few fingerprints (a list, kept short by hand: cycle checks slice it).
        self.recent: list[str] = []
        self._kept = 2 * limits.max_period
        self.repeats: dict[str, int] = {}
        self.pending: dict[str, int] = {}  # fingerprint of a PENDING job -> polls so far
        self.nudged = False
        self._admitted: list[str] = []  # checked calls of the model call being admitted
        self._polled: dict[str, int] = {}  # its polls, per job

    # -- admission -----------------------------------------------------------------------

    def admit(self, call: Call, fp: str) -> bool | Refusal | Nudge:
        """Check one call against repeats, cycles and the poll budget. Admitted, the answer
        is whether the call polls a job whose last result was ``PENDING``."""
        limits = self.limits
        if fp in self.pending:
            # Polling a PENDING job is bounded by its own budget, exempt tool or not.
            polled = self._polled
            if self.pending[fp] + polled.get(fp, 0) >= limits.polls:
                return Refusal(State.PARTIAL, Reason.POLL_BUDGET)
            polled[fp] = polled.get(fp, 0) + 1
            return True
        if call.tool in limits.exempt:
            return False
        admitted = self._admitted
        seen = self.repeats.get(fp, 0) + (admitted.count(fp) if admitted else 0)
        if seen >= limits.same:
            return self._detected(Reason.SAME_CALL, call, fp, seen, 0)
        recent = self.recent + admitted if admitted else self.recent
        period = _cycle(recent, fp, limits.max_period)
        if period:
            return self._detected(Reason.SHORT_CYCLE, call, fp, 2, period)
        admitted.append(fp)
        return False

    def end_admission(self) -> int:
        """Every call of the model call was admitted: count its polls; returns how many.
        The next model call's admission starts afresh."""
        if self._admitted:
            self._admitted = []
        polled = self._polled
        if not polled:
            return 0
        self._polled = {}
        pending = self.pending
        for fp, polls in polled.items():
            pending[fp] += polls
        return sum(polled.values())

    def _detected(
        self, reason: Reason, call: Call, fp: str, seen: int, period: int
    ) -> Refusal | Nudge:
        """A repeat or cycle: nudge the model once if allowed, otherwise stop."""
        if not self._nudge or self.nudged:
            return Refusal(State.PARTIAL, reason)
        self.nudged = True
        self._admitted, self._polled = [], {}  # nothing of this model call runs
        return Nudge(_nudge_text(reason, call, seen, period), call.tool, fp, reason)

    # -- observation ---------------------------------------------------------------------

    def observe(
        self,
        call: Call,
        fp: str,
        poll: bool,
        kind: Kind | str,
        revision: int,
        *,
        gathered: bool = False,
    ) -> bool:
        """Record what one executed or reused call came to, with its verified revision.
        Returns whether ``stagnant`` requests in a row have now gone by without progress.

        ``gathered``: the call brought back information the task had not seen (a read
        beside an inspector, counted as exploration). That is not verified progress, so the
        revision and the memory of repeats and cycles stay; only the count of requests
        without progress starts again, from this request."""
        if kind == _PENDING:
            self.pending.setdefault(fp, 0)
        elif self.pending:
            self.pending.pop(fp, None)
        if revision > self.revision:
            self.revision = revision
            self.stagnant = 0
            self.repeats.clear()
            self.recent.clear()
        elif gathered:
            # The request itself still counts: "reworded calls, the same answer" stops at
            # the same request as before, since only its first answer was news.
            self.stagnant = 0 if poll else 1
        elif not poll:
            self.stagnant += 1
        if not poll and call.tool not in self.limits.exempt:
            self.repeats[fp] = self.repeats.get(fp, 0) + 1
            recent = self.recent
            recent.append(fp)
            if len(recent) > self._kept:
                del recent[0]
        return self.stagnant >= self.limits.stagnant

    # -- checkpoint ----------------------------------------------------------------------

    def checkpoint(self) -> dict[str, Any]:
        """The detector's part of a checkpoint."""
        return {
            "revision": self.revision,
            "stagnant": self.stagnant,
            "recent": list(self.recent),
            "repeats": dict(self.repeats),
            "pending": dict(self.pending),
            "nudged": self.nudged,
        }

    def load(self, raw: Mapping[str, Any]) -> None:
        """Take back a checkpoint part made by :meth:`checkpoint` (``revision`` apart: it
        is given to the constructor). Raises ``TypeError``/``KeyError`` if malformed."""
        self.stagnant = count(raw["stagnant"])
        self.recent.extend(text(fp) for fp in raw["recent"])
        self.repeats = {text(k): count(v) for k, v in raw["repeats"].items()}
        self.pending = {text(k): count(v) for k, v in raw["pending"].items()}
        self.nudged = bool(raw["nudged"])


def _cycle(recent: list[str], fp: str, max_period: int) -> int:
    """The period if ``recent + [fp]`` ends with the same block twice, else 0.

    Only periods from 2 up are cycles (period 1 is a plain repeat), and only blocks that
    are not themselves repetitions, so that each cycle is reported at its shortest period.
    """
    for period in range(2, max_period + 1):
        span = 2 * period - 1
        if len(recent) < span:
            break
        tail = recent[-span:]
        tail.append(fp)
        block = tail[:period]
        if block == tail[period:] and _primitive(block):
            return period
    return 0


def _primitive(block: list[str]) -> bool:
    size = len(block)
    return all(block != block[p:] + block[:p] for p in range(1, size // 2 + 1) if size % p == 0)


def _nudge_text(reason: Reason, call: Call, seen: int, period: int) -> str:
    if call.effect == "write":
        # Never invite a retry of a write: its recorded outcome stands.
        return (
            f"You have already requested {call.tool} for operation {call.operation_key} "
            f"{seen} times. Its recorded outcome stands and it will not run again. Go on "
            "with the next step, or say what is blocking you."
        )
    if reason is Reason.SHORT_CYCLE:
        return (
            f"You are going round a cycle of {period} tool calls ending in {call.tool} and "
            "nothing verified has changed. Change your approach, or say what is blocking you."
        )
    return (
        f"You have called {call.tool} with exactly these arguments {seen} times and nothing "
        "verified has changed. Do not repeat it: change your approach, or say what is "
        "blocking you."
    )
