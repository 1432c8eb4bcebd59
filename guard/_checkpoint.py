"""The checkpoint's layout: each part's own checkpoint under the part's name (version 2),
and the one flat mapping of version 1 that tasks stored before the guard had parts; and
:class:`Checkpoints`, which takes one guard's checkpoint and gives it back, with the step in
progress when a host asks for it (``steps``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ._budget import usage_from
from ._checks import count
from ._ending import Ending
from ._model_call import ModelCallStep
from ._parts import Parts
from ._ticket import Ticket
from ._values import Usage

__all__ = [
    "CHECKPOINT_VERSION",
    "HISTORY",
    "Checkpoints",
    "History",
    "history_of",
    "opened",
    "parts_of",
]

History = Mapping[str, Any] | Callable[[], Mapping[str, Any]]
"""What ``Guard.restore`` takes back of a checkpoint's history: itself, or where it is."""

_NO_HISTORY: Mapping[str, Any] = {"touched": [], "completed": []}

CHECKPOINT_VERSION = 2
"""The shape :meth:`Guard.checkpoint` writes; :meth:`Guard.restore` also reads version 1."""

_PARTS = ("usage", "detector", "settlement", "record")  # the budget's part is what was used
_HISTORY_PARTS = {"touched": "settlement", "completed": "record"}
HISTORY = tuple(_HISTORY_PARTS)
"""The parts of a checkpoint that grow with the phase (see :meth:`Guard.history`)."""


def history_of(saved: Mapping[str, Any]) -> dict[str, Any]:
    """The history (see :data:`HISTORY`) of a whole version 2 checkpoint."""
    return {name: saved[part][name] for name, part in _HISTORY_PARTS.items()}


def parts_of(checkpoint: Mapping[str, Any], history: Mapping[str, Any] | None) -> dict[str, Any]:
    """The parts of a checkpoint of either version, with ``history`` put back in."""
    version = checkpoint["version"]
    if version == 1:
        return _from_version_1(
            checkpoint if history is None else {**checkpoint, **{n: history[n] for n in HISTORY}}
        )
    if version != CHECKPOINT_VERSION:
        raise ValueError(f"checkpoint version {version!r} is not supported")
    parts = {name: checkpoint[name] for name in _PARTS}
    for optional in ("approvals", "observed"):  # written only once used
        if optional in checkpoint:
            parts[optional] = checkpoint[optional]
    if history is not None:
        for name, part in _HISTORY_PARTS.items():
            parts[part] = {**parts[part], name: history[name]}
    return parts


class Checkpoints:
    """One guard's checkpoints: taken from its parts (each one's own under its name, the
    budget's ``usage``, what was spent), given back to them."""

    __slots__ = ("_ending", "_model_calls", "_parts")

    def __init__(self, parts: Parts, model_calls: ModelCallStep, ending: Ending) -> None:
        self._parts = parts
        self._model_calls = model_calls
        self._ending = ending

    def take(self, *, history: bool, steps: bool) -> dict[str, Any]:
        """The checkpoint (see ``Guard.checkpoint``). With ``history``, the history a
        restore left with the host is put back first (its source's error goes on); without
        it, what grows with the phase is left out. The approval gate's part is there only
        once the phase has used an approval, the observer's (``observed``: the hashes of
        the results that counted as progress, as many as the exploration budget allows)
        only once progress was read from results; with ``steps``, the step in progress,
        if one is."""
        if history:
            self._ending.recall(strict=True)
        parts = self._parts
        saved = {
            "version": CHECKPOINT_VERSION,
            "usage": parts.budget.checkpoint(),
            "detector": parts.detector.checkpoint(),
            "settlement": parts.settlement.checkpoint(history=history),
            "record": parts.record.checkpoint(history=history),
        }
        if parts.approvals.touched:
            saved["approvals"] = parts.approvals.checkpoint()
        if parts.observer.used:
            saved["observed"] = parts.observer.checkpoint()
        planning, batch = self._model_calls.planning, parts.batch.tickets
        if steps and (planning or batch):
            saved["steps"] = {
                "planning": planning,
                "batch": [ticket.to_dict() for ticket in batch],
                "wait_ms": parts.outcome.wait_ms,
                "spend_held": parts.budget.held(),
            }
        return saved

    def give_back(
        self, opened: Mapping[str, Any], checkpoint: Mapping[str, Any], history: History | None
    ) -> None:
        """Give each part its own checkpoint back from the ``opened`` parts of
        ``checkpoint`` (see :func:`opened`; the budget's usage and the detector's revision
        are the guard's constructor's to take), the step in progress if it holds one, and
        a ``history`` that is a callable to the ending. Raises ``TypeError``/``KeyError``
        if a part is malformed."""
        parts = self._parts
        parts.detector.load(opened["detector"])
        parts.settlement.load(opened["settlement"])
        parts.record.load(opened["record"])
        if "approvals" in opened:
            parts.approvals.load(opened["approvals"])
        if "observed" in opened:
            parts.observer.load(opened["observed"])
        if "steps" in checkpoint:
            raw = checkpoint["steps"]
            self._model_calls.planning = bool(raw["planning"])
            parts.batch.tickets = [Ticket.from_dict(item) for item in raw["batch"]]
            parts.outcome.wait_ms = float(raw["wait_ms"])
            parts.budget.hold(raw.get("spend_held"))
        self._ending.earlier = history if callable(history) else None


def opened(
    checkpoint: Mapping[str, Any], history: History | None
) -> tuple[dict[str, Any], Usage, int]:
    """The parts of ``checkpoint`` (see :func:`parts_of`; a ``history`` that is a callable
    is asked later, not now), with what the guard's constructor takes of them: the usage
    and the verified revision."""
    parts = parts_of(checkpoint, _NO_HISTORY if callable(history) else history)
    return parts, usage_from(parts["usage"]), count(parts["detector"]["revision"])


def _from_version_1(saved: Mapping[str, Any]) -> dict[str, Any]:
    """A version 1 checkpoint (one flat mapping, as tasks stored before the guard had
    parts) laid out as the parts of version 2."""
    return {
        "usage": saved["usage"],
        "detector": {
            name: saved[name]
            for name in ("revision", "stagnant", "recent", "repeats", "pending", "nudged")
        },
        "settlement": {"touched": saved["touched"]},
        "record": {
            "completed": saved["completed"],
            "completed_total": saved.get("completed_total", 0),
        },
    }
