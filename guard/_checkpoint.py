"""The checkpoint's layout: each part's own checkpoint under the part's name (version 2),
and the one flat mapping of version 1 that tasks stored before the guard had parts."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ._approval import ApprovalGate
from ._budget import Budget
from ._detector import Detector
from ._observed import Observer
from ._report import Record
from ._settlement import SettlementStep

__all__ = ["CHECKPOINT_VERSION", "HISTORY", "compose", "history_of", "load", "parts_of"]

CHECKPOINT_VERSION = 2
"""The shape :meth:`Guard.checkpoint` writes; :meth:`Guard.restore` also reads version 1."""

_PARTS = ("usage", "detector", "settlement", "record")  # the budget's part is what was used
_HISTORY_PARTS = {"touched": "settlement", "completed": "record"}
HISTORY = tuple(_HISTORY_PARTS)
"""The parts of a checkpoint that grow with the phase (see :meth:`Guard.history`)."""


def compose(
    budget: Budget,
    detector: Detector,
    settlement: SettlementStep,
    record: Record,
    approvals: ApprovalGate,
    observer: Observer,
    *,
    history: bool,
) -> dict[str, Any]:
    """A checkpoint of the parts, each one's own under its name (the budget's is ``usage``,
    what was spent); without ``history``, what grows with the phase left out. The approval
    gate's part is there only once the phase has used an approval, the observer's
    (``observed``: the hashes of the results that counted as progress, as many as the
    exploration budget allows) only once progress was read from results."""
    saved = {
        "version": CHECKPOINT_VERSION,
        "usage": budget.checkpoint(),
        "detector": detector.checkpoint(),
        "settlement": settlement.checkpoint(history=history),
        "record": record.checkpoint(history=history),
    }
    if approvals.touched:
        saved["approvals"] = approvals.checkpoint()
    if observer.used:
        saved["observed"] = observer.checkpoint()
    return saved


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


def load(
    parts: Mapping[str, Any],
    detector: Detector,
    settlement: SettlementStep,
    record: Record,
    approvals: ApprovalGate,
    observer: Observer,
) -> None:
    """Give each part its own checkpoint back from ``parts`` (of :func:`parts_of`); the
    budget's usage and the detector's revision are the guard's constructor's to take.
    Raises ``TypeError``/``KeyError`` if a part is malformed."""
    detector.load(parts["detector"])
    settlement.load(parts["settlement"])
    record.load(parts["record"])
    if "approvals" in parts:
        approvals.load(parts["approvals"])
    if "observed" in parts:
        observer.load(parts["observed"])


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
