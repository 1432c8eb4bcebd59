"""The approval gate: calls a policy says must not run unasked, and people's answers to them.

A policy (``needs_approval(call) -> bool``) names the calls a person must approve first.
The gate is asked at the executor's entry, after every other check and before the
ledger's claim (``check``): such a call without an approval does not run, the task stops
``NEEDS_HUMAN``/``approval_required`` and its report names the call (``pending``). The
answers come back as :class:`Approval` values for the guard of the next phase: each is
bound to one fingerprint and operation key and used once; a rejected call asked for again
ends the task. A policy that raises is a "yes, ask a person": the gate fails closed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ._checks import Refusal, describe, plain, text
from ._values import Approval, Call, Nudge, Reason, State

__all__ = ["ApprovalGate", "NeedsApproval", "pending_of"]

NeedsApproval = Callable[[Call], bool]
"""A policy: whether a call must wait for a person's approval before it runs."""

Bound = tuple[str, str | None]  # (fingerprint, operation key): what an approval is bound to

_REQUIRED = Refusal(State.NEEDS_HUMAN, Reason.APPROVAL_REQUIRED)


class ApprovalGate:
    """One task's approval policy and the answers given for this phase."""

    __slots__ = ("_approved", "_offered", "_policy", "_rejected", "_told", "active", "used")

    def __init__(self, policy: NeedsApproval | None, approvals: Iterable[Approval]) -> None:
        self._policy = policy
        self._approved: dict[Bound, Approval] = {}
        self._rejected: dict[Bound, Approval] = {}
        for approval in approvals:
            if not isinstance(approval, Approval):
                raise TypeError(f"approvals must be Approval values, got {approval!r}")
            bound = (approval.fingerprint, approval.operation_key)
            (self._approved if approval.approved else self._rejected)[bound] = approval
        self.used: list[Bound] = []  # approvals spent, in order (checkpointed)
        # Whether there is anything to check (a policy, or a rejection to enforce): read
        # at every executor's entry, so a plain attribute.
        self.active = policy is not None or bool(self._rejected)
        self._offered = False  # the approved call was handed out to run without the model
        self._told = False  # the rejection was handed to the model

    def check(self, call: Call, fp: str) -> Refusal | bool | None:
        """Whether ``call`` may go on to its claim: ``None`` if no approval is needed,
        ``True`` if an approval is needed and one is left (it is used up now), else why it
        must stop."""
        bound = (fp, call.operation_key)
        rejected = self._rejected.get(bound)
        if rejected is not None:
            detail = "asked for again after a person rejected it"
            if rejected.reason:
                detail += f" ({rejected.reason})"
            return Refusal(State.PARTIAL, Reason.APPROVAL_REJECTED, detail)
        if bound in self._approved and bound not in self.used:
            # A person said yes to this very call: used now, whatever the policy would say
            # (a policy that fails must not hold an approved call for ever).
            self.used.append(bound)
            return True
        if self._policy is None:
            return None
        try:
            needed = bool(self._policy(call))
        except Exception as exc:  # fail closed: a person decides
            return Refusal(State.NEEDS_HUMAN, Reason.APPROVAL_REQUIRED, describe(exc))
        return _REQUIRED if needed else None

    def runnable(self) -> Call | None:
        """The approved call to run before the model is asked again, once: an approval
        that carries its exact call, not used yet."""
        if self._offered:
            return None
        self._offered = True
        for bound, approval in self._approved.items():
            if approval.call is not None and bound not in self.used:
                return approval.call
        return None

    def rejection(self) -> Nudge | None:
        """What to tell the model about a rejected call, once: plainly that it was refused
        and will not run, never to try again."""
        if self._told or not self._rejected:
            return None
        self._told = True
        (fp, _), approval = next(iter(self._rejected.items()))
        tool = approval.tool or (approval.call.tool if approval.call is not None else "a call")
        why = f": {approval.reason}" if approval.reason else ""
        message = (
            f"A person rejected the call to {tool}{why}. It was not run and it will not be "
            "run. Do not ask for it again; go on without it, or finish and say what is left "
            "undone."
        )
        return Nudge(message, tool, fp, Reason.APPROVAL_REJECTED)

    # -- checkpoint ----------------------------------------------------------------------

    @property
    def touched(self) -> bool:
        """Whether this phase has used, offered or told anything (else no checkpoint part)."""
        return bool(self.used) or self._offered or self._told

    def checkpoint(self) -> dict[str, Any]:
        """The gate's part of a checkpoint: which approvals this phase has used, and
        whether it has offered the approved call and told the model of a rejection."""
        return {
            "used": [list(bound) for bound in self.used],
            "offered": self._offered,
            "told": self._told,
        }

    def load(self, raw: Mapping[str, Any]) -> None:
        """Take back a part made by :meth:`checkpoint` (``TypeError``/``KeyError`` if not)."""
        self.used = [(text(fp), None if key is None else text(key)) for fp, key in raw["used"]]
        self._offered = bool(raw.get("offered", self.used))
        self._told = bool(raw.get("told", False))


def pending_of(call: Call, fp: str) -> dict[str, Any]:
    """The stop report's ``pending``: the call as a person must see it to decide, and as an
    :class:`Approval` gives it back."""
    return {
        "tool": call.tool,
        "args": plain(call.args),
        "effect": call.effect,
        "operation_key": call.operation_key,
        "fingerprint": fp,
    }
