"""A refund over the support desk's limit, held for a person's approval as the runner holds
it: the one held call the approval tests, pages and walkers share."""

from __future__ import annotations

from collections.abc import Callable

from console.drivers import runner
from console.models import Approval, Task

REFUND = {"order": 42, "amount_cents": 1500, "reason": "damaged", "approve_above_cents": 1000}
"""The support desk's input whose refund (1,500 cents) is above its approval limit."""


def hold_refund(start: Callable[..., Task]) -> Approval:
    """Start the refund and drive it to its stop for approval; the held call, with its task."""
    task = start("support_desk", REFUND)
    assert runner.drive(task.id) == "NEEDS_HUMAN/approval_required"
    return Approval.objects.select_related("task").get(task=task)
