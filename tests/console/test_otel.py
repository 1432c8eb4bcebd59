"""The trace exported as OpenTelemetry spans, to a real OTLP/HTTP receiver.

The receiver is a small HTTP server on a free port of this machine that decodes each body
with opentelemetry-proto's ``ExportTraceServiceRequest``, as a collector would; tasks are
driven by the real runner on the real PostgreSQL, and the export pass is the one beat runs,
configured by the standard ``OTEL_EXPORTER_OTLP_*`` variables.
"""

from __future__ import annotations

import gzip
import http.server
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.exceptions import ImproperlyConfigured
from django.db import connection
from django.test import Client
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from console import services
from console.drivers import otel, runner
from console.drivers.trace import event
from console.models import (
    EventKind,
    Operation,
    OperationState,
    Task,
    TraceEvent,
    TraceExport,
    TraceExportTotals,
)
from console.records.redaction import REDACTED, preview
from tests.console.doubt import settle_sent_and_resume
from tests.processes import run_python

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parents[2]
Start = Callable[..., Task]


# -- the receiver ------------------------------------------------------------------------------


@dataclass
class Span:
    """One span as the collector decoded it."""

    name: str
    trace_id: bytes
    span_id: bytes
    parent: bytes
    attributes: dict[str, Any]
    start: int
    end: int
    status: int
    service: str


def _value(value: AnyValue) -> Any:
    return getattr(value, value.WhichOneof("value") or "string_value")


@dataclass
class Receiver:
    """An OTLP/HTTP trace receiver: answers ``status`` (200 takes the spans), after
    ``delay_s``, and keeps every request body it took, decoded."""

    port: int
    status: int = 200
    delay_s: float = 0.0
    bodies: list[bytes] = field(default_factory=list)
    spans: list[Span] = field(default_factory=list)
    posts: int = 0
    refuse_trace: bytes = b""  # a body with a span of this trace is answered 400
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def take(self, body: bytes, encoding: str) -> int:
        with self.lock:
            self.posts += 1
        time.sleep(self.delay_s)
        if self.status != 200:
            return self.status
        raw = gzip.decompress(body) if encoding == "gzip" else body
        request = ExportTraceServiceRequest()
        request.ParseFromString(raw)
        found = []
        for resource_spans in request.resource_spans:
            resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for s in scope_spans.spans:
                    found.append(
                        Span(
                            name=s.name,
                            trace_id=s.trace_id,
                            span_id=s.span_id,
                            parent=s.parent_span_id,
                            attributes={a.key: _value(a.value) for a in s.attributes},
                            start=s.start_time_unix_nano,
                            end=s.end_time_unix_nano,
                            status=s.status.code,
                            service=str(resource.get("service.name")),
                        )
                    )
        if any(span.trace_id == self.refuse_trace for span in found):
            return 400
        with self.lock:
            self.bodies.append(raw)
            self.spans.extend(found)
        return 200


def _handler(receiver: Receiver) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            if self.path != "/v1/traces":
                status = 404
            else:
                status = receiver.take(body, self.headers.get("Content-Encoding", ""))
            answer = ExportTraceServiceResponse().SerializeToString() if status == 200 else b""
            self.send_response(status)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def receiver(monkeypatch: pytest.MonkeyPatch) -> Iterator[Receiver]:
    """A receiver listening, named by OTEL_EXPORTER_OTLP_ENDPOINT (the base URL: the SDK
    adds /v1/traces), with a short timeout so that a refusal fails a pass quickly."""
    port = _free_port()
    found = Receiver(port)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), _handler(found))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", raising=False)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", found.url)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "1.5")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "loopguard-tests")
    try:
        yield found
    finally:
        server.shutdown()
        server.server_close()


def _by_trace(spans: list[Span]) -> dict[bytes, list[Span]]:
    traces: dict[bytes, list[Span]] = {}
    for span in spans:
        traces.setdefault(span.trace_id, []).append(span)
    return traces


def _own(task: Task, phase: int, seq: int | None = None) -> bytes:
    return otel.span_id(task, phase, seq).to_bytes(8, "big")


def _cursor(task: Task) -> tuple[int, int]:
    row = TraceExport.objects.get(task=task)
    return row.seen_seq, row.exported_seq


def _pass_in_a_thread() -> None:
    """An export pass as a worker runs one, on a connection of its own (closed after)."""
    try:
        otel.export_pass()
    finally:
        connection.close()


def _metrics(client: Client) -> dict[str, float]:
    text = client.get("/metrics").content.decode()
    wanted = (
        "loopguard_trace_exported_events_total",
        "loopguard_trace_export_failures_total",
        "loopguard_trace_export_waiting_events",
    )
    values = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in wanted:
            values[name.removeprefix("loopguard_trace_")] = float(value)
    return values


# -- what is exported --------------------------------------------------------------------------


def _resumed_task(start: Start, operator: User) -> Task:
    """A task of two phases: its first notice's response lost (phase 1 stops NEEDS_HUMAN), a
    person marks it committed, the resumption sends the second (phase 2 COMPLETED)."""
    task = start("test_notices", {"count": 2, "lose": 1, "auto_lookup": False})
    runner.drive(task.id)
    key = f"task-{task.id}-notice-1"
    settle_sent_and_resume(task, key, operator)
    runner.drive(task.id)
    task.refresh_from_db()
    return task


def test_a_task_is_a_trace_a_phase_a_span_and_each_call_its_child(
    start: Start, operator: User, receiver: Receiver
) -> None:
    task = _resumed_task(start, operator)
    other = start("test_reader", {"pages": 2})
    runner.drive(other.id)
    other.refresh_from_db()
    events = list(TraceEvent.objects.filter(task__in=[task, other]).order_by("task_id", "seq"))

    done = otel.export_pass()

    assert done == otel.Pass(found=len(events), exported=len(events), failures=0)
    traces = _by_trace(receiver.spans)
    assert set(traces) == {otel.trace_id(t).to_bytes(16, "big") for t in (task, other)}
    spans = traces[otel.trace_id(task).to_bytes(16, "big")]
    assert len(spans) == TraceEvent.objects.filter(task=task).count()
    assert {s.service for s in receiver.spans} == {"loopguard-tests"}

    phases = {s.attributes["loopguard.phase"]: s for s in spans if not s.parent}
    assert sorted(phases) == [1, 2]
    first, second = phases[1], phases[2]
    assert first.name == second.name == "invoke_agent test_notices"
    assert first.span_id == _own(task, 1) and second.span_id == _own(task, 2)
    assert first.attributes["gen_ai.operation.name"] == "invoke_agent"
    assert first.attributes["gen_ai.agent.name"] == "test_notices"
    assert (first.attributes["loopguard.state"], first.attributes["loopguard.reason"]) == (
        "NEEDS_HUMAN",
        "executor_error",
    )
    assert (second.attributes["loopguard.state"], second.attributes["loopguard.reason"]) == (
        "COMPLETED",
        "goal_met",
    )
    # Budgets carry over: the last phase's stop report says what the whole task spent.
    assert second.attributes["loopguard.used.model_calls"] == task.model_calls
    assert second.attributes["loopguard.used.executions"] == task.executions
    assert "loopguard.remaining.model_calls" in second.attributes

    children = [s for s in spans if s.parent]
    for child in children:
        phase = child.attributes["loopguard.phase"]
        assert child.parent == _own(task, phase)
        assert child.span_id == _own(task, phase, child.attributes["loopguard.seq"])
        assert phases[phase].start <= child.end <= phases[phase].end
    chats = [s for s in children if s.name == "chat"]
    assert len(chats) == task.model_calls
    assert {s.attributes["gen_ai.operation.name"] for s in chats} == {"chat"}
    tools = [s for s in children if s.name == "execute_tool send_notice"]
    assert {s.attributes["gen_ai.operation.name"] for s in tools} == {"execute_tool"}
    assert {s.attributes["gen_ai.tool.name"] for s in tools} == {"send_notice"}
    by_key = {s.attributes["loopguard.operation.key"]: s for s in tools}
    assert set(by_key) == {f"task-{task.id}-notice-1", f"task-{task.id}-notice-2"}
    lost = by_key[f"task-{task.id}-notice-1"].attributes
    assert lost["loopguard.decision"] == "executed"
    assert lost["loopguard.operation.state"] == OperationState.COMMITTED  # as settled since
    sent = by_key[f"task-{task.id}-notice-2"].attributes
    assert (sent["loopguard.result_kind"], sent["loopguard.operation.state"]) == (
        "SUCCESS",
        "COMMITTED",
    )
    assert Operation.objects.filter(task=task).count() == 2

    reads = traces[otel.trace_id(other).to_bytes(16, "big")]
    assert sorted(s.name for s in reads) == [
        "chat",
        "chat",
        "execute_tool read_page",
        "execute_tool read_page",
        "invoke_agent test_reader",
    ]
    # The planner reported 10 tokens per model call: the span says so, as ours.
    assert [s.attributes["loopguard.usage.tokens"] for s in reads if s.name == "chat"] == [10, 10]
    last = events[-1].seq if events[-1].task_id == task.id else max(
        e.seq for e in events if e.task_id == task.id
    )
    assert _cursor(task) == (last, last)


@pytest.mark.parametrize("between", [True, False], ids=["a-pass-between", "one-pass"])
def test_a_phase_stopped_twice_is_one_span_and_its_second_stop_a_child(
    operator: User, receiver: Receiver, between: bool
) -> None:
    # The fourth start of the same goal is held before it runs (restart_loop), then an
    # operator cancels it: two stops in phase 1, and a span id is sent only once.
    tasks = [
        services.task_start(agent="test_reader", input={"pages": 9}, enqueue=lambda i: None)
        for _ in range(4)
    ]
    held = tasks[-1]
    if between:
        otel.export_pass()  # the hold alone: phase 1's span ends there
    services.task_stop(task_id=held.id, actor=operator, reason="the trigger was a mistake")

    otel.export_pass()

    spans = _by_trace(receiver.spans)[otel.trace_id(held).to_bytes(16, "big")]
    (phase,) = [s for s in spans if not s.parent]
    assert phase.span_id == _own(held, 1)
    assert (phase.attributes["loopguard.state"], phase.attributes["loopguard.reason"]) == (
        "NEEDS_HUMAN",
        "restart_loop",
    )
    assert phase.attributes["loopguard.used.model_calls"] == 0  # the hold's report
    (stop,) = [s for s in spans if s.parent]
    assert (stop.name, stop.parent) == ("stop", _own(held, 1))
    assert (stop.attributes["loopguard.state"], stop.attributes["loopguard.reason"]) == (
        "CANCELLED",
        "operator_stop",
    )
    ids = [s.span_id for s in receiver.spans]
    assert len(ids) == len(set(ids))


def test_nothing_is_sent_again_after_the_collector_took_it(
    start: Start, receiver: Receiver, client: Client
) -> None:
    task = start("test_reader", {"pages": 1})
    runner.drive(task.id)
    otel.export_pass()
    sent = len(receiver.spans)
    posts = receiver.posts

    again = otel.export_pass()

    assert again.exported == 0 and receiver.posts == posts
    later = start("test_reader", {"pages": 1})
    runner.drive(later.id)
    otel.export_pass()
    new = receiver.spans[sent:]
    assert {s.trace_id for s in new} == {otel.trace_id(later).to_bytes(16, "big")}
    ids = [s.span_id for s in receiver.spans]
    assert len(ids) == len(set(ids))
    exported = TraceEvent.objects.filter(task__in=[task, later]).count()
    assert _metrics(client) == {
        "exported_events_total": exported,
        "export_failures_total": 0,
        "export_waiting_events": 0,
    }


def test_a_collector_that_is_down_loses_nothing_and_the_next_pass_sends_it(
    start: Start, receiver: Receiver, client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    task = start("test_reader", {"pages": 2})
    runner.drive(task.id)
    count = TraceEvent.objects.filter(task=task).count()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{_free_port()}")

    down = otel.export_pass()

    assert (down.found, down.exported, down.failures) == (count, 0, 1)
    assert _cursor(task) == (count, 0)
    assert TraceExport.objects.get(task=task).failures == 1
    assert _metrics(client) == {
        "exported_events_total": 0,
        "export_failures_total": 1,
        "export_waiting_events": count,
    }
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.url)

    back = otel.export_pass()

    assert (back.exported, back.failures) == (count, 0)
    assert len(receiver.spans) == count
    assert _cursor(task) == (count, count)
    assert TraceExport.objects.get(task=task).failures == 0
    assert _metrics(client) == {
        "exported_events_total": count,
        "export_failures_total": 1,
        "export_waiting_events": 0,
    }


def test_a_refusing_collector_is_retried_on_a_later_pass(
    start: Start, receiver: Receiver
) -> None:
    task = start("test_reader", {"pages": 1})
    runner.drive(task.id)
    count = TraceEvent.objects.filter(task=task).count()
    receiver.status = 503

    refused = otel.export_pass()

    assert (refused.exported, refused.failures) == (0, 1)
    assert receiver.posts >= 1 and receiver.spans == []
    assert _cursor(task) == (count, 0)
    receiver.status = 200

    assert otel.export_pass().exported == count
    assert len(receiver.spans) == count
    assert TraceExportTotals.objects.get().failures == 1


def test_a_batch_refused_every_time_holds_no_other_task_up(
    start: Start, receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    refused, other = start("test_reader", {"pages": 1}), start("test_reader", {"pages": 1})
    for task in (refused, other):
        runner.drive(task.id)
    receiver.refuse_trace = otel.trace_id(refused).to_bytes(16, "big")
    monkeypatch.setattr(otel, "TASKS_PER_BATCH", 1)  # the refused task's batch comes first

    first, second = otel.export_pass(), otel.export_pass()

    assert (first.exported, first.failures) == (0, 1)
    assert second.exported == TraceEvent.objects.filter(task=other).count()
    assert {s.trace_id for s in receiver.spans} == {otel.trace_id(other).to_bytes(16, "big")}
    assert _cursor(refused)[1] == 0
    assert TraceExport.objects.get(task=refused).failures == 2


def test_a_slow_collector_slows_no_step(
    start: Start, receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A step writes its trace and nothing more: while the collector holds an export for
    # seconds, another task is driven to its end, and the export is still waiting then.
    task = start("test_reader", {"pages": 2})
    runner.drive(task.id)
    receiver.delay_s = 2.0
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "10")  # slow, not down
    exporting = threading.Thread(target=_pass_in_a_thread)
    exporting.start()
    try:
        deadline = time.monotonic() + 10
        while receiver.posts == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert receiver.posts == 1  # the export is in the collector's hands now
        later = start("test_reader", {"pages": 2})
        began = time.monotonic()
        assert runner.drive(later.id) == "COMPLETED/goal_met"
        took = time.monotonic() - began
        still_waiting = exporting.is_alive()
    finally:
        exporting.join()
    assert still_waiting and took < receiver.delay_s
    assert _cursor(task)[1] == TraceEvent.objects.filter(task=task).count()


def test_two_passes_at_once_never_send_the_same_batch(
    start: Start, receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    tasks = [start("test_reader", {"pages": 1}) for _ in range(6)]
    for task in tasks:
        runner.drive(task.id)
    otel.read_trace()
    receiver.delay_s = 0.3
    # One task per batch, so that both passes find work at the same moment.
    passes = [threading.Thread(target=_pass_in_a_thread) for _ in range(2)]
    monkeypatch.setattr(otel, "TASKS_PER_BATCH", 1)
    for thread in passes:
        thread.start()
    for thread in passes:
        thread.join()

    ids = [s.span_id for s in receiver.spans]
    assert len(ids) == len(set(ids)) == TraceEvent.objects.filter(task__in=tasks).count()
    assert receiver.posts == len(tasks)


def test_what_the_trace_redacted_stays_redacted(start: Start, receiver: Receiver) -> None:
    task = start("test_reader", {"pages": 1})
    secret = "hunter2-very-secret"
    written = event(
        EventKind.REQUEST,
        decision="blocked",
        reason="bad_args",
        tool="sign_in",
        args_preview=preview({"user": "ann", "password": secret}),
        detail=f"sign-in refused: password={secret}",
    )
    TraceEvent.objects.create(task=task, phase=1, seq=1, **written)

    otel.export_pass()

    (span,) = receiver.spans
    stored = TraceEvent.objects.get(task=task, seq=1)
    assert span.name == "execute_tool sign_in"
    assert span.attributes["loopguard.args_preview"] == stored.args_preview
    assert REDACTED in span.attributes["loopguard.args_preview"]
    assert REDACTED in span.attributes["loopguard.detail"]
    assert span.attributes["error.type"] == "bad_args"
    assert span.status == 2  # STATUS_CODE_ERROR
    assert all(secret.encode() not in body for body in receiver.bodies)


# -- off, and without the extra -----------------------------------------------------------------


def test_without_an_endpoint_nothing_is_read_or_sent(
    start: Start, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in otel.ENDPOINT_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    task = start("test_reader", {"pages": 1})
    runner.drive(task.id)

    assert otel.export_pass() == otel.Pass()
    assert not TraceExport.objects.exists()
    assert set(TraceExportTotals.objects.values_list("read_id", flat=True)) <= {0}


def test_an_endpoint_without_the_extra_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://127.0.0.1:9/v1/traces")
    # None in sys.modules: the import fails as it does where the package is not installed.
    monkeypatch.setitem(sys.modules, "opentelemetry.exporter.otlp.proto.http.trace_exporter", None)
    monkeypatch.setattr(otel, "_EXPORTERS", {})

    with pytest.raises(ImproperlyConfigured, match=r"pip install 'loopguard-console\[otel\]'"):
        otel.export_pass()


def test_the_console_imports_without_the_extra() -> None:
    blocker = (
        "import sys, importlib.abc\n"
        "class NoOtel(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] == 'opentelemetry': raise ImportError(name)\n"
        "sys.meta_path.insert(0, NoOtel())\n"
        "import django; django.setup()\n"
        "import console, console.tasks, console.drivers.otel, console.web.metrics\n"
        "assert not [m for m in sys.modules if m.startswith('opentelemetry')]\n"
        "print('ok')\n"
    )
    done = run_python(blocker, env={**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings"})
    assert done.stdout.strip() == "ok", done.stderr
