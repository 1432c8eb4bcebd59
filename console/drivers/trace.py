"""A task's trace events as its drivers record them: the hosted runner and the attached
driver write the same events for the same steps, built here (redacted, timed; the step
store numbers them). Each is a mapping of ``TraceEvent`` fields, handed to ``Step.events``."""

from __future__ import annotations

from typing import Any

from django.utils import timezone

from console.models import Decision, EventKind
from console.records.redaction import preview, redact_text
from guard import Finish, Nudge, Report
from guard.steps import Ticket

__all__ = ["blocked_event", "event", "model_event", "ms", "nudge_event", "request_event"]


def event(kind: str, **fields: Any) -> dict[str, Any]:
    """A trace event of ``kind`` happening now; its ``detail`` redacted."""
    detail = fields.get("detail")
    if detail:
        fields["detail"] = redact_text(detail)  # error messages may quote credentials
    return {"kind": kind, "at": timezone.now(), **fields}


def model_event(
    proposal: Any, latency_ms: int, tokens: int, revision: int, detail: str = ""
) -> dict[str, Any]:
    """A model call that proposed ``proposal`` (calls, a finish, or ``None`` when it
    failed: then ``detail`` says why)."""
    if isinstance(proposal, Finish):
        decision, summary = Decision.FINISHED, "finish: " + preview(proposal.answer, 500)
    elif proposal is None:
        decision, summary = Decision.BLOCKED, detail
    else:
        calls = proposal if isinstance(proposal, list | tuple) else [proposal]
        names = ", ".join(str(getattr(c, "tool", "?")) for c in calls)
        decision, summary = Decision.PLANNED, f"{len(calls)} call(s): {names}"[:500]
    return event(
        EventKind.MODEL_CALL,
        decision=decision,
        latency_ms=latency_ms,
        tokens=tokens or None,
        revision=revision,
        detail=summary,
    )


def request_event(
    ticket: Ticket,
    decision: str,
    latency: float | None,
    *,
    args_preview: str,
    revision: int,
    reason: str = "",
    detail: str = "",
) -> dict[str, Any]:
    """One tool request as it stands now (``latency`` in seconds, when it ran)."""
    call, result = ticket.call, ticket.result
    return event(
        EventKind.REQUEST,
        decision=decision,
        reason=reason,
        tool=call.tool,
        fingerprint=ticket.fingerprint,
        args_preview=args_preview,
        result_kind="" if result is None else str(result.kind),
        result_preview="" if result is None else preview(result.data),
        revision=revision,
        # A read's key means nothing to the ledger (only writes are claimed): kept out, so
        # that the phase's history read back from the trace names only operations it met.
        operation_key=(call.operation_key or "") if call.effect == "write" else "",
        latency_ms=None if latency is None else ms(latency),
        detail=detail,
    )


def blocked_event(report: Report) -> dict[str, Any]:
    """A model call's calls refused before any ran (the stop is about ``report.call``)."""
    about = report.call or {}
    return event(
        EventKind.REQUEST,
        decision=Decision.BLOCKED,
        reason=report.reason,
        tool=str(about.get("tool") or "")[:200],
        fingerprint=str(about.get("fingerprint") or ""),
        operation_key=str(about.get("operation_key") or "")[:200],
        revision=report.revision,
        detail=report.detail[:2000],
    )


def nudge_event(nudge: Nudge, revision: int) -> dict[str, Any]:
    """A repeat or cycle answered with a message to the model instead of running."""
    return event(
        EventKind.REQUEST,
        decision=Decision.NUDGED,
        reason=nudge.reason,
        tool=nudge.tool,
        fingerprint=nudge.fingerprint,
        revision=revision,
        detail=nudge.message,
    )


def ms(seconds: float) -> int:
    """``seconds`` as whole milliseconds, never negative."""
    return max(0, round(seconds * 1000))
