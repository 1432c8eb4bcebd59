"""What a client's step request may say: its fields read, checked and bounded.

Every reader refuses what it cannot take as it was sent (``InvalidInput``, a 400), never
cuts or guesses: a tool's calls (:func:`_calls`), a count, a text, a bounded value, the
tool's outcome as the client reported it (:func:`_outcome`), the client's inspector's word
(:func:`_inspector`). Beside them, how a call in progress is kept and shown
(:func:`_stored`, :func:`_ticket`), and a step out of order said in the protocol's words
(:data:`_IN_PROTOCOL_WORDS`, :func:`_refusal`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from console.records.inputs import (
    MAX_ARGS_BYTES,
    MAX_NAME_CHARS,
    MAX_TEXT_CHARS,
    InputRefused,
    check_bounded,
    key_problem,
)
from console.records.redaction import redact
from console.services import InvalidInput
from guard import Call, Evidence, Result
from guard.steps import Next, OutOfOrder, Ticket

MAX_CALLS = 64
# What one step may report, bounded where the database's columns are (a trace event's
# tokens are a 32-bit integer; the task's counters 64-bit).
MAX_TOKENS = 10**9  # of one model call
MAX_AMOUNT = 10**15  # a reservation or a cost, in the spend budget's minor unit
MAX_ATTEMPTS = 10_000  # a tool's own tries in one execution
MAX_WAIT_MS = 7 * 24 * 3600 * 1000  # a week
MAX_REVISION = 2**53


class _ToolError(Exception):
    """What a client's tool raised, as the client described it."""

    def __init__(self, message: str, *, transient: bool) -> None:
        super().__init__(message)
        self.transient = transient


def _calls(raw: Any, tools: Mapping[str, Any]) -> list[Call]:
    """The calls of a tools step, each checked; an absent effect is the one ``tools``
    declares (a read when the tool is not declared)."""
    if not isinstance(raw, list) or not 0 < len(raw) <= MAX_CALLS:
        raise InvalidInput(f"calls must be a list of 1 to {MAX_CALLS} calls")
    calls = []
    for index, item in enumerate(raw):
        where = f"calls[{index}]"
        if not isinstance(item, Mapping) or set(item) - {
            "tool",
            "args",
            "effect",
            "operation_key",
        }:
            raise InvalidInput(f"{where} must be {{tool, args, effect?, operation_key?}}")
        tool, args = item.get("tool"), item.get("args", {})
        # No tool is declared with a longer name: one is a malformed call, not a bad one.
        if not isinstance(tool, str) or not 0 < len(tool) <= MAX_NAME_CHARS:
            raise InvalidInput(f"{where}.tool must be a tool's name (1 to {MAX_NAME_CHARS})")
        if not isinstance(args, Mapping):
            raise InvalidInput(f"{where}.args must be an object")
        _bounded(args, f"{where}.args", MAX_ARGS_BYTES)
        # Only an absent effect (or null) takes the declared one: a false or an empty
        # list is a malformed effect, not a request for the default.
        effect = item.get("effect")
        if effect is None:
            effect = tools.get(tool, "read")
        if effect not in ("read", "write"):
            raise InvalidInput(f'{where}.effect must be "read" or "write"')
        key = item.get("operation_key")
        if key is not None and not isinstance(key, str):
            raise InvalidInput(f"{where}.operation_key must be a string")
        # Never cut: a shorter key names another business action.
        problem = None if key is None else key_problem(key)
        if problem is not None:
            raise InvalidInput(f"{where}: {problem}")
        calls.append(Call(tool, dict(args), effect, key))
    return calls


def _outcome(result: Any, error: Any) -> tuple[Any, BaseException | None]:
    """The tool's outcome as the client reported it: a result (anything that is not one is
    the guard's ``bad_result``), or the error it raised."""
    if (result is None) == (error is None):
        raise InvalidInput("a result step for a call that ran carries result or error")
    if error is not None:
        if not isinstance(error, Mapping) or set(error) - {"type", "message", "transient"}:
            raise InvalidInput('error is {"type", "message", "transient"}')
        kind = _text(error.get("type"), "error.type", MAX_NAME_CHARS) or "Error"
        message = _text(error.get("message"), "error.message")
        transient = error.get("transient", False)
        if not isinstance(transient, bool):
            # Read as false, "true" would make a retryable error final: refused instead.
            raise InvalidInput("error.transient must be true or false")
        # Named as the client's exception was, so that the report reads as it would locally.
        named = kind if kind.isidentifier() else "ToolError"
        cls = type(named, (_ToolError,), {})
        return None, cls(message, transient=transient)
    if isinstance(result, Mapping):
        # Checked before the kind: a count of the wrong type is a malformed result (400),
        # while a result that is not one at all is the guard's bad_result.
        attempts, wait = result.get("attempts", 1), result.get("wait_ms")
        if not isinstance(attempts, int) or isinstance(attempts, bool):
            raise InvalidInput("result.attempts must be a whole number")
        _count(attempts, "result.attempts", MAX_ATTEMPTS)
        if wait is not None and (
            not isinstance(wait, int | float)
            or isinstance(wait, bool)
            or not 0 <= wait <= MAX_WAIT_MS
        ):
            raise InvalidInput(f"result.wait_ms must be milliseconds, at most {MAX_WAIT_MS:,}")
    try:
        reported = Result.from_dict(result)
    except (KeyError, TypeError, ValueError, AttributeError, OverflowError):
        return result, None  # not a result: the guard stops it as bad_result
    return reported, None


def _inspector(evidence: Any) -> Any:
    """The client's inspector's word as an ``inspect`` for the guard, or ``None`` (the
    observed-evidence policy)."""
    if evidence is None:
        return None
    if not isinstance(evidence, Mapping):
        raise InvalidInput('evidence is {"revision", "done", "committed"}')
    if "error" in evidence:
        if not isinstance(evidence["error"], str):
            raise InvalidInput('evidence.error must say, as a string, what the inspector raised')
        failure = _text(evidence["error"], "evidence.error")

        def failed(_result: Any, _call: Any) -> Evidence:
            raise ValueError(f"the client's inspector failed: {failure}")

        return failed
    if set(evidence) - {"revision", "done", "committed"}:
        raise InvalidInput('evidence is {"revision", "done", "committed"}')
    revision, done, committed = (
        evidence.get("revision"),
        evidence.get("done", False),
        evidence.get("committed"),
    )
    # Malformed evidence is the client's error (400), not the guard's verdict on evidence it
    # cannot trust: that one is for an inspector that raised (above).
    if not isinstance(revision, int) or isinstance(revision, bool):
        raise InvalidInput("evidence.revision must be a whole number")
    if abs(revision) > MAX_REVISION:
        raise InvalidInput(f"evidence.revision must be at most {MAX_REVISION:,}")
    if not isinstance(done, bool):
        raise InvalidInput("evidence.done must be true or false")
    if not (committed is None or isinstance(committed, bool)):
        raise InvalidInput("evidence.committed must be true, false or null")

    def inspect(_result: Any, _call: Any) -> Evidence:
        return Evidence(revision, done, committed)

    return inspect


def _count(value: Any, what: str, most: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise InvalidInput(f"{what} must be a whole number ≥ 0")
    if value > most:
        raise InvalidInput(f"{what} must be at most {most:,}")
    return value


def _text(value: Any, what: str, most: int = MAX_TEXT_CHARS) -> str:
    """Words a client reports (an error's message, a detail, evidence), refused rather than
    cut when longer than ``most``: the stop report and the trace say what was sent."""
    if value is None:
        return ""
    if not isinstance(value, str):
        raise InvalidInput(f"{what} must be a string")
    if len(value) > most:
        raise InvalidInput(f"{what} is {len(value):,} characters long: at most {most:,} are taken")
    return value


def _bounded(value: Any, what: str, most_bytes: int) -> None:
    """Refuse a value that would be stored other than it was sent (cut below the depth the
    redaction keeps) or is larger than its bound (:mod:`console.records.inputs`)."""
    try:
        check_bounded(value, what=what, most_bytes=most_bytes)
    except InputRefused as exc:
        raise InvalidInput(str(exc)) from None


def _stored(raw: Mapping[str, Any]) -> dict[str, Any]:
    """A call in progress as it is kept (in the checkpoint, in an answer): its arguments and
    result redacted, as the trace keeps them; its tool, operation key and fingerprint exact,
    for the ledger and loop detection work on those (a redacted key would name another
    business action)."""
    result = raw.get("result")
    return {
        **raw,
        "args": redact(raw.get("args") or {}),
        "result": None if result is None else redact(result),
    }


def _ticket(ticket: Ticket) -> dict[str, Any]:
    """An admitted call as the answer shows it (the client knows its own arguments: they
    are stored redacted with the answer, which a retry gets again)."""
    raw = _stored(ticket.to_dict())
    raw["ticket"] = raw.pop("index")
    return raw


# The guard's refusals of a step out of order, as a client of the protocol reads them.
_IN_PROTOCOL_WORDS = {
    "each proposal needs its own before_model() first": (
        "send a model step before each tools or finish step: every model call is allowed first"
    ),
    "before_tool() needs a fresh ticket from the current before_tools()": (
        "a call step needs a ticket admitted by the current model call's tools step"
    ),
    "after_tool() needs a ticket that before_tool() let execute": (
        "a result step needs a ticket whose call step answered execute or reuse"
    ),
}


def _refusal(step: str, ticket: Ticket | None, refused: OutOfOrder) -> tuple[str, str]:
    """The sequencer's refusal of a client's step as the protocol says it: its code (the
    more specific ones for a result), and the step that was due."""
    status = None if ticket is None else str(ticket.status)
    if step == "result" and ticket is not None and status in ("admitted", "not_run"):
        return "call_not_allowed", f"call {ticket.index} was never allowed to run"
    if step == "result" and ticket is not None and status in ("ran", "reused"):
        return "result_given", f"call {ticket.index} has its result already"
    due = refused.expected
    about = "" if due.ticket is None else f"call {due.ticket.index} ({due.ticket.call.tool})"
    said = {
        Next.MODEL: "send a model step first: every model call is allowed before its tools "
        "or finish step",
        Next.PROPOSAL: "the model call allowed last comes first: send its tools, finish or "
        "failed step",
        Next.ENTER: f"a call step for {about} is due first",
        Next.RESULT: f"report the result of {about} first, with a result step",
        Next.WAIT: "a wait step is due first: "
        + (
            "the model call's calls asked to wait"
            if refused.wait_ms is None
            else f"wait {refused.wait_ms:.0f} ms before the next model call"
        ),
        Next.DONE: "the task has stopped",
    }[due.next]
    return "step_out_of_order", f"a {step} step does not fit here: {said}"
