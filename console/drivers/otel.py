"""The trace where teams already look: each task's trace sent as OpenTelemetry spans.

A task is a trace (its id derived from the task, so every pass and every worker gives the
same one), a phase a span (``invoke_agent <agent>``), and each model call (``chat``) and tool
request (``execute_tool <tool>``) a child span of its phase, with the guard's decision, the
result kind, the operation key and its state, and what was spent. Names follow the
OpenTelemetry semantic conventions for generative-AI spans where they apply
(``gen_ai.operation.name``, ``gen_ai.tool.name``, ``gen_ai.agent.name``); the rest is ours,
under ``loopguard.*``. It goes to the OTLP/HTTP endpoint the standard variables name
(``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_ENDPOINT``, with
``_HEADERS``, ``_TIMEOUT``, ``_COMPRESSION``...); with neither set, nothing is exported.

The export runs behind the step, never in it: a step writes its trace events as it always
has and nothing more. The trace is the outbox (append-only; within a task ``seq`` is written
in order, under the task row's lock), and a :class:`~console.models.TraceExport` row per
task is its cursor. Each pass of :func:`export_pass` (beat, every
``LOOPGUARD_OTEL_EXPORT_SECONDS``):

1. **reads** the trace events added since the last pass, by id, and raises each task's
   ``seen_seq`` (one pass at a time: the totals row is locked, a second pass skips this);
2. **claims** tasks whose cursor is behind, with a compare-and-set that holds each for
   :data:`CLAIM` (two passes never send the same batch; a pass that died lets go when the
   claim runs out);
3. **sends** their events as spans with the exporter's ``export()``, outside any transaction,
   and moves a task's cursor only when the collector accepted them. A collector that is down,
   slow or refusing loses nothing: the claim is let go, the failure is counted, and a later
   pass sends the same events again. Delivery is at least once (a pass that dies after the
   collector accepted but before the cursor moved sends them again); span ids are the same
   every time, so a backend that keeps one span per id shows no repeat.

What leaves is what the trace stored: previews and details redacted before they were
written (``console/records/redaction.py``); no argument is read from anywhere else.

The SDK is an optional extra (``loopguard-console[otel]``), imported only when a pass runs
with an endpoint set: ``import console`` works without it, and a pass with an endpoint but
no SDK says which extra to install.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.core.exceptions import ImproperlyConfigured
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from console.models import (
    EventKind,
    Operation,
    Phase,
    StopReport,
    Task,
    TaskState,
    TraceEvent,
    TraceExport,
    TraceExportTotals,
)
from guard.steps import DIMENSIONS

if TYPE_CHECKING:
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import ReadableSpan
    from opentelemetry.sdk.trace.export import SpanExporter

__all__ = [
    "ENDPOINT_VARIABLES",
    "Pass",
    "endpoint",
    "export_pass",
    "exporter",
    "span_id",
    "trace_id",
    "unsent_tasks",
]

logger = logging.getLogger(__name__)

ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
"""Either one turns the export on (the first wins, as the SDK reads them)."""
EXTRA = "loopguard-console[otel]"
READ_BATCH = 5000
"""Trace events read per pass when looking for new ones (bounded: a first pass over a
trace of years reads it in steps, not at once)."""
SETTLED = timedelta(seconds=30)
"""How old an event must be before the reading moves past its id. Ids are handed out when
a row is inserted, not when its transaction commits, so a younger id may appear after an
older one was read; a step's transaction is short (no I/O runs inside one), far shorter
than this, so an event older than this has committed or never will."""
TASKS_PER_BATCH = 20
EVENTS_PER_TASK = 200
"""One export call holds at most ``TASKS_PER_BATCH * EVENTS_PER_TASK`` spans (and a phase
span per stop among them): small enough for any collector's request limit."""
CLAIM = timedelta(seconds=60)
"""How long a pass holds the tasks it claimed; longer than any export's timeout."""
PASS_SECONDS = 4.0
"""A pass sends batch after batch while there is work, for about this long at most."""
SCOPE = "loopguard.console"


def endpoint() -> str | None:
    """The OTLP endpoint the environment names, or ``None``: then the export is off."""
    for name in ENDPOINT_VARIABLES:
        value = os.environ.get(name, "").strip()
        if value:
            return value
    return None


_EXPORTERS: dict[tuple[str, ...], SpanExporter] = {}


def exporter() -> SpanExporter:
    """The OTLP/HTTP span exporter configured by the ``OTEL_EXPORTER_OTLP_*`` variables, one
    per process (a new one if they changed). :class:`ImproperlyConfigured` if the extra that
    brings it is not installed."""
    settings = tuple(
        f"{name}={value}" for name, value in sorted(os.environ.items()) if name.startswith("OTEL_")
    )
    found = _EXPORTERS.get(settings)
    if found is None:
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        except ImportError as missing:
            raise ImproperlyConfigured(
                f"{' or '.join(ENDPOINT_VARIABLES)} is set, so the trace is to be exported to"
                f" OpenTelemetry, but the exporter is not installed: pip install '{EXTRA}'"
                f" (or unset the variable) [{missing}]"
            ) from missing
        _EXPORTERS.clear()
        found = _EXPORTERS[settings] = OTLPSpanExporter()
    return found


@dataclass(frozen=True, slots=True)
class Pass:
    """What one pass did: events found in the trace, events the collector accepted, and
    export calls that failed (each one's events wait for a later pass)."""

    found: int = 0
    exported: int = 0
    failures: int = 0


def export_pass(*, to: SpanExporter | None = None, budget_s: float = PASS_SECONDS) -> Pass:
    """Read what the trace gained, then send the tasks whose cursor is behind, batch after
    batch for about ``budget_s`` seconds, stopping at the first failure (a collector that is
    down would fail the rest the same way). ``to``: an exporter of the caller's (tests);
    without it, the environment's, and nothing at all happens when it names no endpoint."""
    if to is None:
        if endpoint() is None:
            return Pass()
        to = exporter()
    found = read_trace()
    exported = failures = 0
    started = time.monotonic()
    while time.monotonic() - started < budget_s:
        sent = _send_one_batch(to)
        if sent is None:
            break
        if sent < 0:
            failures += 1
            break
        exported += sent
    return Pass(found, exported, failures)


# -- 1. reading the trace --------------------------------------------------------------------


def read_trace(now: datetime | None = None) -> int:
    """Raise the ``seen_seq`` of each task whose trace grew since the last reading; returns
    the events read. One reading at a time: a pass that finds the totals row locked leaves
    the reading to the pass that holds it."""
    now = now or timezone.now()
    # Migration 0020 made the row; made again here if it went (a flushed database), once.
    TraceExportTotals.objects.bulk_create([TraceExportTotals(id=1)], ignore_conflicts=True)
    with transaction.atomic():
        totals = TraceExportTotals.objects.select_for_update(skip_locked=True).filter(id=1).first()
        if totals is None:
            return 0
        # (id, task_id) is the trace's primary key on every partition: an index range scan.
        rows = list(
            TraceEvent.objects.filter(id__gt=totals.read_id)
            .order_by("id")
            .values_list("id", "task_id", "seq", "at")[:READ_BATCH]
        )
        if not rows:
            return 0
        last: dict[int, int] = {}
        for _, task_id, seq, _ in rows:
            last[task_id] = max(seq, last.get(task_id, 0))
        # Readings are one at a time and only move forward, and a task's seq rises with its
        # ids: the latest reading's last seq is never below an earlier one's.
        TraceExport.objects.bulk_create(
            [TraceExport(task_id=task_id, seen_seq=seq) for task_id, seq in last.items()],
            update_conflicts=True,
            unique_fields=["task"],
            update_fields=["seen_seq"],
        )
        settled = [event_id for event_id, _, _, at in rows if at <= now - SETTLED]
        if settled:
            TraceExportTotals.objects.filter(id=1).update(read_id=max(settled))
    return len(rows)


def unsent_tasks(low: int | None, high: int | None, *, most: int = 10) -> list[int]:
    """Up to ``most`` tasks with ids in ``[low, high)`` (``None``: unbounded) whose trace the
    export has not all sent (a cursor behind its trace, or events the reading has not
    reached yet), lowest id first: what an archive must wait for."""
    ids = Q()
    if low is not None:
        ids &= Q(task_id__gte=low)
    if high is not None:
        ids &= Q(task_id__lt=high)
    behind = list(
        TraceExport.objects.filter(ids, seen_seq__gt=F("exported_seq"))
        .order_by("task_id")
        .values_list("task_id", flat=True)[:most]
    )
    if behind:
        return behind
    read = TraceExportTotals.objects.filter(id=1).values_list("read_id", flat=True).first()
    unread = TraceEvent.objects.filter(ids, id__gt=read or 0).order_by("task_id")
    return list(unread.values_list("task_id", flat=True).distinct()[:most])


# -- 2. claiming, 3. sending -----------------------------------------------------------------


def _send_one_batch(to: SpanExporter) -> int | None:
    """Claim a batch of tasks whose cursor is behind and send it: the events accepted, -1 if
    the send failed, ``None`` if there was nothing to claim."""
    from opentelemetry.sdk.trace.export import SpanExportResult

    token = uuid.uuid4().hex
    claimed = _claim(token)
    if not claimed:
        return None
    events = {
        cursor.task_id: list(
            TraceEvent.objects.filter(task_id=cursor.task_id, seq__gt=cursor.exported_seq)
            .order_by("seq")[:EVENTS_PER_TASK]
        )
        for cursor in claimed
    }
    spans: list[ReadableSpan] = []
    try:
        spans = build_spans(events)
        # Network I/O, outside any transaction (the claim is what keeps others off).
        result = to.export(spans)
    except Exception:
        logger.exception("trace export: the batch of tasks %s could not be sent", sorted(events))
        result = SpanExportResult.FAILURE
    now = timezone.now()
    if result is not SpanExportResult.SUCCESS:
        TraceExport.objects.filter(task_id__in=events, claimed_by=token).update(
            claimed_by="", claimed_until=None, failures=F("failures") + 1
        )
        TraceExportTotals.objects.filter(id=1).update(failures=F("failures") + 1)
        logger.warning(
            "trace export: the collector did not take %d span(s) of tasks %s (sent again later)",
            len(spans),
            sorted(events),
        )
        return -1
    sent = 0
    for cursor in claimed:
        batch = events[cursor.task_id]
        upto = batch[-1].seq if batch else cursor.seen_seq
        moved = TraceExport.objects.filter(task_id=cursor.task_id, claimed_by=token).update(
            exported_seq=upto, claimed_by="", claimed_until=None, failures=0, exported_at=now
        )
        if moved:
            sent += len(batch)
        else:  # the claim ran out mid-send: another pass may send these again (at least once)
            logger.warning("trace export: task %s's claim ran out while sending", cursor.task_id)
    TraceExportTotals.objects.filter(id=1).update(exported=F("exported") + sent)
    return sent


def _claim(token: str) -> list[TraceExport]:
    """Hold up to :data:`TASKS_PER_BATCH` tasks whose cursor is behind, for :data:`CLAIM`:
    the update re-checks that each is still free, so of two passes only one gets a task."""
    now = timezone.now()
    behind = Q(seen_seq__gt=F("exported_seq"))
    free = Q(claimed_until__isnull=True) | Q(claimed_until__lte=now)
    # Fewest failures first: a batch the collector refuses every time (too large, say) falls
    # behind the others instead of holding every pass up at its first send.
    candidates = list(
        TraceExport.objects.filter(behind & free)
        .order_by("failures", F("exported_at").asc(nulls_first=True), "task_id")
        .values_list("task_id", flat=True)[:TASKS_PER_BATCH]
    )
    if not candidates:
        return []
    TraceExport.objects.filter(behind & free, task_id__in=candidates).update(
        claimed_by=token, claimed_until=now + CLAIM
    )
    return list(TraceExport.objects.filter(task_id__in=candidates, claimed_by=token))


# -- the spans ---------------------------------------------------------------------------------


def trace_id(task: Task) -> int:
    """The task's trace id: the same from every pass and worker, distinct across databases
    (the task's creation time is in it, not only its id)."""
    return _id(f"loopguard task {task.pk} {task.created_at.isoformat()}", 16)


def span_id(task: Task, phase: int, seq: int | None = None) -> int:
    """A phase's span id (``seq`` None), or the span id of the trace event ``seq``."""
    what = f"phase {phase}" if seq is None else f"event {seq}"
    return _id(f"loopguard task {task.pk} {task.created_at.isoformat()} {what}", 8)


def _id(text: str, size: int) -> int:
    value = int.from_bytes(hashlib.sha256(text.encode()).digest()[:size], "big")
    return value or 1  # an all-zero id is invalid in OpenTelemetry


def _ns(at: datetime) -> int:
    """``at`` in nanoseconds since the epoch, exactly (a float would round microseconds)."""
    return (at - _EPOCH) // timedelta(microseconds=1) * 1000


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True, slots=True)
class _Context:
    """What the spans of a batch need besides its events, read in a few queries."""

    tasks: Mapping[int, Task]
    phases: Mapping[tuple[int, int], Phase]
    reports: Mapping[tuple[int, int], Mapping[str, Any]]
    operations: Mapping[str, str]
    first_stops: frozenset[tuple[int, int]]

    @classmethod
    def of(cls, events: Mapping[int, Sequence[TraceEvent]]) -> _Context:
        everything = [e for batch in events.values() for e in batch]
        stops = [e for e in everything if e.kind == EventKind.STOP]
        tasks = Task.objects.only("id", "agent", "client", "created_at").in_bulk(list(events))
        phase_numbers = {e.phase for e in everything}
        phases = {
            (p.task_id, p.number): p
            for p in Phase.objects.filter(task_id__in=list(events), number__in=phase_numbers)
        }
        reports: dict[tuple[int, int], Mapping[str, Any]] = {}
        if stops:
            rows = StopReport.objects.filter(
                task_id__in={e.task_id for e in stops}, phase__in={e.phase for e in stops}
            ).order_by("id")
            for row in rows:  # a phase's first: the one its span ends with (_first_stops)
                reports.setdefault((row.task_id, row.phase), row.report)
        keys = {e.operation_key for e in everything if e.operation_key}
        operations = dict(
            Operation.objects.filter(key__in=keys).values_list("key", "state") if keys else []
        )
        return cls(tasks, phases, reports, operations, _first_stops(stops))

    def report(self, event: TraceEvent) -> Mapping[str, Any]:
        return self.reports.get((event.task_id, event.phase), {})


def _first_stops(stops: Iterable[TraceEvent]) -> frozenset[tuple[int, int]]:
    """The (task, seq) of each stop that is its phase's first. A phase usually stops once;
    a task held before it ran (restart_loop) and then cancelled stops twice in phase 1, and
    only the first ends the phase's span (a span id is sent once): the second is a child."""
    first = set()
    for stop in stops:
        earlier = TraceEvent.objects.filter(
            task_id=stop.task_id, seq__lt=stop.seq, phase=stop.phase, kind=EventKind.STOP
        )
        if not earlier.exists():
            first.add((stop.task_id, stop.seq))
    return frozenset(first)


def build_spans(events: Mapping[int, Sequence[TraceEvent]]) -> list[ReadableSpan]:
    """The spans of each task's ``events`` (task id → its events in order): a child span per
    event, and its phase's span at the stop that ended the phase."""
    context = _Context.of(events)
    resource = _resource()
    spans = []
    for task_id, batch in events.items():
        task = context.tasks[task_id]
        for event in batch:
            if event.kind == EventKind.STOP and (task_id, event.seq) in context.first_stops:
                spans.append(_phase_span(task, event, context, resource))
            else:
                spans.append(_event_span(task, event, context, resource))
    return spans


def _attributes(**values: object) -> dict[str, str | int | bool]:
    """Attributes without the empty ones (OpenTelemetry takes no None)."""
    return {
        key.replace("__", "."): value
        for key, value in values.items()
        if isinstance(value, str | int | bool) and value != ""
    }


def _phase_span(
    task: Task, stop: TraceEvent, context: _Context, resource: Resource
) -> ReadableSpan:
    """The phase's span: from its start to the stop that ended it, with the stop's state and
    reason and the budgets spent and left as the phase's stop report says."""
    from opentelemetry.trace import SpanKind, Status, StatusCode

    phase = context.phases.get((task.pk, stop.phase))
    report = context.report(stop)
    state = stop.detail.partition(":")[0]  # "STATE: detail", as lifecycle writes a stop
    started = (phase.started_at or phase.created_at) if phase is not None else stop.at
    attributes = _attributes(
        gen_ai__operation__name="invoke_agent",
        gen_ai__agent__name=task.agent,
        loopguard__task__id=task.pk,
        loopguard__task__attached=task.is_attached,
        loopguard__phase=stop.phase,
        loopguard__seq=stop.seq,
        loopguard__state=state,
        loopguard__reason=stop.reason,
        loopguard__detail=stop.detail,
        loopguard__revision=report.get("revision"),
    )
    used, left = report.get("used") or {}, report.get("remaining_budget") or {}
    for dim in DIMENSIONS:
        if isinstance(used.get(dim.used), int):
            attributes[f"loopguard.used.{dim.used}"] = used[dim.used]
        if isinstance(left.get(dim.used), int):
            attributes[f"loopguard.remaining.{dim.used}"] = left[dim.used]
    operations = report.get("operations") or []
    uncertain = [
        str(op.get("key")) for op in operations if op.get("state") in ("UNKNOWN", "IN_FLIGHT")
    ]
    if uncertain:
        attributes["loopguard.operations.uncertain"] = ", ".join(uncertain)[:2000]
    status = Status(StatusCode.UNSET)
    if state == TaskState.COMPLETED:
        status = Status(StatusCode.OK)
    elif state == TaskState.FAILED:
        status = Status(StatusCode.ERROR, stop.reason)
        attributes["error.type"] = stop.reason
    return _span(
        f"invoke_agent {task.agent}",
        task,
        span_id(task, stop.phase),
        None,
        attributes,
        start=min(_ns(started), _ns(stop.at)),
        end=_ns(stop.at),
        kind=SpanKind.INTERNAL,
        status=status,
        resource=resource,
    )


def _event_span(
    task: Task, event: TraceEvent, context: _Context, resource: Resource
) -> ReadableSpan:
    """A model call (``chat``), a tool request (``execute_tool <tool>``), a wait, a note or a
    later stop of the phase, as a child of its phase's span."""
    from opentelemetry.trace import SpanKind, Status, StatusCode

    common = _attributes(
        loopguard__task__id=task.pk,
        loopguard__phase=event.phase,
        loopguard__seq=event.seq,
        loopguard__decision=event.decision,
        loopguard__reason=event.reason,
        loopguard__revision=event.revision,
        loopguard__detail=event.detail,
        loopguard__latency_ms=event.latency_ms,
    )
    kind, status = SpanKind.INTERNAL, Status(StatusCode.UNSET)
    if event.kind == EventKind.MODEL_CALL:
        name, kind = "chat", SpanKind.CLIENT
        # The trace keeps a model call's tokens as one total, which the conventions'
        # gen_ai.usage.input_tokens / output_tokens would misstate: it is ours, named so.
        specific = _attributes(
            gen_ai__operation__name="chat",
            loopguard__usage__tokens=event.tokens,
            loopguard__usage__spend=event.cost,
        )
    elif event.kind == EventKind.REQUEST:
        name = f"execute_tool {event.tool}".strip()
        specific = _attributes(
            gen_ai__operation__name="execute_tool",
            gen_ai__tool__name=event.tool,
            loopguard__result_kind=event.result_kind,
            loopguard__fingerprint=event.fingerprint,
            loopguard__operation__key=event.operation_key,
            loopguard__operation__state=context.operations.get(event.operation_key, ""),
            loopguard__args_preview=event.args_preview,
            loopguard__result_preview=event.result_preview,
        )
    elif event.kind == EventKind.STOP:  # a later stop of the phase (see _first_stops)
        name, specific = "stop", _attributes(loopguard__state=event.detail.partition(":")[0])
    else:  # a wait or a note
        name, specific = str(event.kind), {}
    failed = event.decision == "blocked" or event.result_kind == "FATAL"
    if failed:
        specific["error.type"] = event.reason or event.result_kind or "blocked"
        status = Status(StatusCode.ERROR, str(specific["error.type"]))
    end = _ns(event.at)
    # An event is written when its call came back: it started its latency earlier.
    start = end - (event.latency_ms or 0) * 1_000_000
    return _span(
        name,
        task,
        span_id(task, event.phase, event.seq),
        span_id(task, event.phase),
        {**common, **specific},
        start=start,
        end=end,
        kind=kind,
        status=status,
        resource=resource,
    )


def _span(
    name: str,
    task: Task,
    own: int,
    parent: int | None,
    attributes: dict[str, str | int | bool],
    *,
    start: int,
    end: int,
    kind: Any,
    status: Any,
    resource: Resource,
) -> ReadableSpan:
    # Spans are made from stored rows, after the fact, with ids of our own: the SDK's
    # tracer would start them now with random ids, so the exporter gets them directly.
    from opentelemetry.sdk.trace import ReadableSpan
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope
    from opentelemetry.trace import SpanContext, TraceFlags

    trace = trace_id(task)
    sampled = TraceFlags(TraceFlags.SAMPLED)
    return ReadableSpan(
        name=name,
        context=SpanContext(trace, own, is_remote=False, trace_flags=sampled),
        parent=None
        if parent is None
        else SpanContext(trace, parent, is_remote=False, trace_flags=sampled),
        resource=resource,
        attributes=attributes,
        kind=kind,
        status=status,
        start_time=start,
        end_time=end,
        instrumentation_scope=InstrumentationScope(SCOPE, _version()),
    )


def _resource() -> Resource:
    """The console as OpenTelemetry's resource: ``OTEL_SERVICE_NAME`` and
    ``OTEL_RESOURCE_ATTRIBUTES`` as the SDK reads them, ``loopguard`` when no name is set."""
    from opentelemetry.sdk.resources import SERVICE_NAME, SERVICE_VERSION, Resource

    found = Resource.create({SERVICE_VERSION: _version()})
    if str(found.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        found = found.merge(Resource({SERVICE_NAME: "loopguard"}))
    return found


@functools.cache
def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("loopguard-console")
    except PackageNotFoundError:
        return "unknown"
