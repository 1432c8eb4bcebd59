"""The attached driver: an agent that runs its own loop asks the console's guard over the
step protocol (docs/protocol.md), one step per API request.

Its parts, each with one job: ``requests`` (a request's life: the start, and each step on
the task row as read, saved only while it is unchanged, or else in one transaction that
locks the row; a retried request answered from its stored answer; the lease taken),
``driver`` (one step: the guard restored from the checkpoint, the step judged by the
sequencer, the save made last with the answer), ``steps`` (a handler per protocol step,
and ``PROTOCOL_STEPS``, the table that names them), ``lost`` (the calls a lost client left
running: interrupted, settled by trusted evidence, audited) and ``fields`` (the request's
fields read, checked and bounded; a refusal in the protocol's words).
"""

from __future__ import annotations

from console.drivers.attached.driver import PROTOCOL, ProtocolRefused
from console.drivers.attached.driver import _Driver as _Driver
from console.drivers.attached.driver import lease_seconds as lease_seconds
from console.drivers.attached.fields import MAX_AMOUNT as MAX_AMOUNT
from console.drivers.attached.fields import MAX_ATTEMPTS as MAX_ATTEMPTS
from console.drivers.attached.fields import MAX_CALLS
from console.drivers.attached.fields import MAX_REVISION as MAX_REVISION
from console.drivers.attached.fields import MAX_TOKENS as MAX_TOKENS
from console.drivers.attached.fields import MAX_WAIT_MS as MAX_WAIT_MS
from console.drivers.attached.requests import attached_start, attached_step, body_hash
from console.drivers.attached.steps import HALT_REASONS, PROTOCOL_STEPS, STEPS, ProtocolStep

__all__ = [
    "HALT_REASONS",
    "MAX_CALLS",
    "PROTOCOL",
    "PROTOCOL_STEPS",
    "STEPS",
    "ProtocolRefused",
    "ProtocolStep",
    "attached_start",
    "attached_step",
    "body_hash",
]
