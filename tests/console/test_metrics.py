"""/metrics: what Prometheus reads matches the rows, in its text format, and only who may.

Rows are written straight into the real PostgreSQL database (the metrics only read), then
the endpoint's text is parsed the way a scraper would and compared with what was written.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import prometheus_client
import pytest
from django.test import Client
from django.utils import timezone
from pytest_django import DjangoAssertNumQueries, Settings

from console import rollups
from console.models import (
    EventKind,
    Operation,
    OperationState,
    StopReport,
    Task,
    TaskState,
    TraceEvent,
)

pytestmark = pytest.mark.django_db

TOKEN = "metrics-token-for-the-tests-0123456789"

# -- a small parser for the text exposition format (version 0.0.4) -------------------------------

NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
SAMPLE = re.compile(rf"^(?P<name>{NAME})(?:\{{(?P<labels>.*)\}})? (?P<value>\S+)$")
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"(?:,|$)')
COMMENT = re.compile(rf"^# (?P<what>HELP|TYPE) (?P<name>{NAME}) (?P<text>.*)$")
SUFFIXES = {"histogram": ("_bucket", "_sum", "_count"), "summary": ("", "_sum", "_count")}
Labels = frozenset[tuple[str, str]]


@dataclass
class Exposition:
    types: dict[str, str] = field(default_factory=dict)
    samples: dict[tuple[str, Labels], float] = field(default_factory=dict)

    def value(self, name: str, **labels: str) -> float:
        return self.samples[(name, frozenset(labels.items()))]

    def series(self, name: str) -> dict[Labels, float]:
        return {labels: v for (n, labels), v in self.samples.items() if n == name}


def _unescape(text: str) -> str:
    return re.sub(r"\\(.)", lambda m: "\n" if m.group(1) == "n" else m.group(1), text)


def parse(text: str) -> Exposition:
    """Parse Prometheus text, failing on anything a scraper would reject or misread.

    Every sample line is ``name{labels} value``; each family has one HELP and one TYPE,
    both before its samples, and its samples follow them without another family between.
    """
    assert text.endswith("\n"), "the exposition ends with a newline"
    out = Exposition()
    helped: set[str] = set()
    current: str | None = None
    for number, line in enumerate(text.splitlines(), 1):
        where = f"line {number}: {line!r}"
        if line.startswith("#"):
            comment = COMMENT.match(line)
            assert comment, where
            name = comment["name"]
            if comment["what"] == "HELP":
                assert name not in helped, f"a second HELP for {name} ({where})"
                helped.add(name)
            else:
                assert name in helped, f"TYPE before HELP ({where})"
                assert name not in out.types, f"a second TYPE for {name} ({where})"
                assert comment["text"] in {"counter", "gauge", "histogram", "summary", "untyped"}
                out.types[name] = comment["text"]
            current = name
            continue
        sample = SAMPLE.match(line)
        assert sample, f"not `name{{labels}} value` ({where})"
        assert current is not None and current in out.types, f"a sample before TYPE ({where})"
        name = sample["name"]
        allowed = {current + s for s in SUFFIXES.get(out.types[current], ("",))}
        assert name in allowed, f"{name} outside its family {current} ({where})"
        raw = sample["labels"] or ""
        pairs = LABEL.findall(raw)
        rebuilt = ",".join(f'{k}="{v}"' for k, v in pairs)
        assert rebuilt == raw, f"malformed labels ({where})"
        labels = frozenset((k, _unescape(v)) for k, v in pairs)
        assert (name, labels) not in out.samples, f"a duplicate series ({where})"
        out.samples[(name, labels)] = float(sample["value"])
    return out


def test_the_parser_rejects_what_prometheus_would() -> None:
    with pytest.raises(AssertionError, match="sample before TYPE"):
        parse("up 1\n")
    with pytest.raises(AssertionError, match="TYPE before HELP"):
        parse("# TYPE up gauge\nup 1\n")
    with pytest.raises(AssertionError, match="labels"):
        parse('# HELP up Up.\n# TYPE up gauge\nup{a="1" b="2"} 1\n')
    with pytest.raises(AssertionError, match="outside its family"):
        parse("# HELP up Up.\n# TYPE up gauge\ndown 1\n")


# -- rows ------------------------------------------------------------------------------------------


def _task(state: str = TaskState.QUEUED, *, agent: str = "paging", **fields: Any) -> Task:
    terminal = state not in (TaskState.QUEUED, TaskState.RUNNING)
    return Task.objects.create(
        agent=agent,
        input_fingerprint="f" * 64,
        state=state,
        reason=fields.pop("reason", "goal_met" if terminal else ""),
        finished_at=fields.pop("finished_at", timezone.now() if terminal else None),
        **fields,
    )


def _running(*, lease_left: timedelta, **fields: Any) -> Task:
    return _task(
        TaskState.RUNNING,
        lease_owner="worker-1",
        lease_expires_at=timezone.now() + lease_left,
        **fields,
    )


def _operation(task: Task, state: str, key: str) -> Operation:
    return Operation.objects.create(
        key=key, fingerprint="a" * 64, state=state, tool="send_notice", task=task
    )


def _event(task: Task, kind: str, latency_ms: int | None, *, ago: timedelta = timedelta()) -> None:
    seq = TraceEvent.objects.filter(task=task).count() + 1
    TraceEvent.objects.create(
        task=task,
        phase=1,
        seq=seq,
        kind=kind,
        latency_ms=latency_ms,
        at=timezone.now() - ago,
    )


@pytest.fixture
def scrape(client: Client) -> Callable[[], Exposition]:
    def _scrape() -> Exposition:
        response = client.get("/metrics")
        assert response.status_code == 200, response.content
        return parse(response.content.decode())

    return _scrape


# -- values ----------------------------------------------------------------------------------------


def test_it_counts_tasks_by_state_and_shows_empty_states_as_zero(
    scrape: Callable[[], Exposition],
) -> None:
    _task(TaskState.QUEUED)
    _task(TaskState.QUEUED, agent="oscillation")
    _running(lease_left=timedelta(seconds=30))
    _running(lease_left=timedelta(seconds=-5))  # its driver died; the sweep has not run yet
    _task(TaskState.NEEDS_HUMAN, reason="unknown_commit")

    metrics = scrape()

    assert metrics.types["loopguard_tasks"] == "gauge"
    assert {
        dict(labels)["state"]: v for labels, v in metrics.series("loopguard_tasks").items()
    } == {
        "QUEUED": 2,
        "RUNNING": 2,
        "COMPLETED": 0,
        "PARTIAL": 0,
        "FAILED": 0,
        "NEEDS_HUMAN": 1,
        "CANCELLED": 0,
    }
    assert metrics.value("loopguard_tasks_lease_expired") == 1


def test_it_counts_unknown_operations_and_in_flight_ones_whose_driver_is_gone(
    scrape: Callable[[], Exposition],
) -> None:
    alive = _running(lease_left=timedelta(seconds=30))
    dead = _running(lease_left=timedelta(seconds=-1))
    stopped = _task(TaskState.NEEDS_HUMAN, reason="unknown_commit")
    _operation(alive, OperationState.IN_FLIGHT, "alive-1")
    _operation(dead, OperationState.IN_FLIGHT, "dead-1")
    _operation(dead, OperationState.IN_FLIGHT, "dead-2")
    _operation(stopped, OperationState.UNKNOWN, "lost-1")
    _operation(stopped, OperationState.UNKNOWN, "lost-2")
    _operation(stopped, OperationState.UNKNOWN, "lost-3")
    _operation(stopped, OperationState.COMMITTED, "done-1")
    _operation(stopped, OperationState.NOT_COMMITTED, "never-1")

    metrics = scrape()

    assert metrics.value("loopguard_operations_unknown") == 3
    assert metrics.value("loopguard_operations_in_flight") == 3
    assert metrics.value("loopguard_operations_in_flight_lease_expired") == 2


def test_it_totals_stops_by_state_and_reason_over_every_phase(
    scrape: Callable[[], Exposition],
) -> None:
    resumed = _task(TaskState.COMPLETED)
    StopReport.objects.create(
        task=resumed, phase=1, state="PARTIAL", reason="model_budget", report={}
    )
    StopReport.objects.create(
        task=resumed, phase=2, state="COMPLETED", reason="goal_met", report={}
    )
    for _ in range(2):
        other = _task(TaskState.PARTIAL, reason="model_budget")
        StopReport.objects.create(
            task=other, phase=1, state="PARTIAL", reason="model_budget", report={}
        )

    metrics = scrape()

    assert metrics.types["loopguard_stops_total"] == "counter"
    assert metrics.series("loopguard_stops_total") == {
        frozenset({("state", "PARTIAL"), ("reason", "model_budget")}): 3,
        frozenset({("state", "COMPLETED"), ("reason", "goal_met")}): 1,
    }


def test_it_buckets_the_step_latency_of_the_last_hour_only(
    scrape: Callable[[], Exposition],
) -> None:
    task = _task(TaskState.RUNNING)
    for ms in (3, 40, 40, 900):
        _event(task, EventKind.MODEL_CALL, ms)
    _event(task, EventKind.REQUEST, 5)  # on a bucket's bound: counted in that bucket
    _event(task, EventKind.REQUEST, 120_000)  # beyond the last bound: only in +Inf
    _event(task, EventKind.REQUEST, 7, ago=timedelta(hours=2))  # outside the window
    _event(task, EventKind.REQUEST, None)  # a blocked request: no latency
    _event(task, EventKind.STOP, 1)  # not a step

    metrics = scrape()

    name = "loopguard_step_latency_seconds"
    assert metrics.types[name] == "histogram"
    model = {
        le: metrics.value(f"{name}_bucket", kind="model_call", le=le)
        for le in ("0.005", "0.025", "0.05", "0.5", "1", "60", "+Inf")
    }
    assert model == {"0.005": 1, "0.025": 1, "0.05": 3, "0.5": 3, "1": 4, "60": 4, "+Inf": 4}
    assert metrics.value(f"{name}_count", kind="model_call") == 4
    assert metrics.value(f"{name}_sum", kind="model_call") == pytest.approx(0.983)
    assert metrics.value(f"{name}_bucket", kind="request", le="0.005") == 1
    assert metrics.value(f"{name}_bucket", kind="request", le="60") == 1
    assert metrics.value(f"{name}_bucket", kind="request", le="+Inf") == 2
    assert metrics.value(f"{name}_sum", kind="request") == pytest.approx(120.005)


def test_its_histogram_buckets_are_cumulative(scrape: Callable[[], Exposition]) -> None:
    task = _task(TaskState.RUNNING)
    for ms in (1, 8, 30, 70, 200, 600, 2000, 4000, 9000, 20_000, 50_000, 70_000):
        _event(task, EventKind.REQUEST, ms)

    buckets = scrape().series("loopguard_step_latency_seconds_bucket")

    for kind in ("model_call", "request"):
        by_bound = sorted(
            (float(dict(labels)["le"]), v)
            for labels, v in buckets.items()
            if dict(labels)["kind"] == kind
        )
        counts = [v for _, v in by_bound]
        assert counts == sorted(counts), f"{kind} buckets must never decrease"
    request = [v for labels, v in buckets.items() if dict(labels)["kind"] == "request"]
    assert sorted(request) == [1, 2, 2, 3, 4, 5, 5, 6, 7, 8, 9, 10, 11, 12]


def test_it_sums_the_budgets_spent_by_each_agent(scrape: Callable[[], Exposition]) -> None:
    _task(TaskState.COMPLETED, agent="paging", model_calls=3, executions=2, tokens=100)
    _task(TaskState.PARTIAL, agent="paging", reason="same_call", model_calls=4, executions=1)
    _task(TaskState.QUEUED, agent="oscillation", requests=5, executions=5)

    metrics = scrape()

    assert metrics.value("loopguard_model_calls", agent="paging") == 7
    assert metrics.value("loopguard_model_calls", agent="oscillation") == 0
    assert metrics.value("loopguard_executions", agent="paging") == 3
    assert metrics.value("loopguard_executions", agent="oscillation") == 5
    assert metrics.value("loopguard_requests", agent="oscillation") == 5
    assert metrics.value("loopguard_tokens", agent="paging") == 100


def test_label_values_are_escaped(scrape: Callable[[], Exposition]) -> None:
    odd = 'team "alpha"\\beta\nline two'
    _task(TaskState.QUEUED, agent=odd, model_calls=2)

    assert scrape().value("loopguard_model_calls", agent=odd) == 2


def test_an_empty_database_still_gives_every_family(scrape: Callable[[], Exposition]) -> None:
    metrics = scrape()

    assert set(metrics.types) == {
        "loopguard_tasks",
        "loopguard_tasks_lease_expired",
        "loopguard_operations_unknown",
        "loopguard_operations_in_flight",
        "loopguard_operations_in_flight_lease_expired",
        "loopguard_stops_total",
        "loopguard_model_calls",
        "loopguard_requests",
        "loopguard_executions",
        "loopguard_tokens",
        "loopguard_spend",
        "loopguard_explored",
        "loopguard_step_latency_seconds",
        "loopguard_trace_exported_events_total",
        "loopguard_trace_export_failures_total",
        "loopguard_trace_export_waiting_events",
    }
    assert metrics.value("loopguard_operations_unknown") == 0


def test_no_process_holds_a_part_of_the_metrics(scrape: Callable[[], Exposition]) -> None:
    """Under gunicorn any worker answers a scrape: nothing may come from one process's memory
    (prometheus_client's global registry, its process and garbage-collector series)."""
    _task(TaskState.QUEUED, model_calls=2)

    metrics = scrape()

    assert metrics.value("loopguard_model_calls", agent="paging") == 2
    assert all(name.startswith("loopguard_") for name in metrics.types)
    assert (
        prometheus_client.REGISTRY.get_sample_value("loopguard_model_calls", {"agent": "paging"})
        is None
    )


def test_it_reads_in_seven_queries_however_many_rows(
    client: Client, django_assert_num_queries: DjangoAssertNumQueries
) -> None:
    for n in range(20):
        state = TaskState.RUNNING if n % 2 else TaskState.FAILED
        task = _task(state, agent=f"agent-{n % 4}", reason="fatal" if n % 2 == 0 else "")
        _operation(task, OperationState.UNKNOWN, f"op-{n}")
        _event(task, EventKind.REQUEST, n * 10)

    later = timezone.now() + 2 * rollups.SETTLE
    rolled = rollups.roll_tasks(later, until=time.monotonic() + 10)
    assert rolled == 10  # the failed ones; the running ones are counted as they are
    _task(TaskState.RUNNING, agent="agent-new")

    # Tasks: their totals and the ones not rolled; stops: the count and those since; the
    # operations; the latency; the trace's export.
    with django_assert_num_queries(7):
        response = client.get("/metrics")

    assert response.status_code == 200


# -- the response and who may read it ------------------------------------------------------------


def test_it_answers_loopback_in_prometheus_text_without_a_login(client: Client) -> None:
    response = client.get("/metrics")  # the test client comes from 127.0.0.1

    assert response.status_code == 200
    assert response["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
    assert "no-cache" in response["Cache-Control"]


@pytest.mark.parametrize("address", ["127.0.0.1", "127.8.9.10", "::1", "::ffff:127.0.0.1"])
def test_without_a_token_loopback_clients_may_read(client: Client, address: str) -> None:
    assert client.get("/metrics", REMOTE_ADDR=address).status_code == 200


@pytest.mark.parametrize("address", ["10.0.0.7", "192.168.1.2", "2001:db8::1", "", "junk"])
def test_without_a_token_other_clients_are_refused(client: Client, address: str) -> None:
    response = client.get("/metrics", REMOTE_ADDR=address)

    assert response.status_code == 403
    assert b"LOOPGUARD_METRICS_TOKEN" in response.content
    assert b"loopguard_tasks" not in response.content


def test_with_a_token_set_it_is_required_even_from_loopback(
    client: Client, settings: Settings
) -> None:
    settings.LOOPGUARD_METRICS_TOKEN = TOKEN

    missing = client.get("/metrics")
    wrong = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}x")
    basic = client.get("/metrics", HTTP_AUTHORIZATION=f"Basic {TOKEN}")

    for response in (missing, wrong, basic):
        assert response.status_code == 401
        assert response["WWW-Authenticate"].startswith("Bearer")
        assert b"loopguard_tasks" not in response.content


def test_with_the_token_any_address_may_read(client: Client, settings: Settings) -> None:
    settings.LOOPGUARD_METRICS_TOKEN = TOKEN

    response = client.get(
        "/metrics", REMOTE_ADDR="10.0.0.7", HTTP_AUTHORIZATION=f"bearer  {TOKEN} "
    )

    assert response.status_code == 200
    parse(response.content.decode())


def test_it_refuses_anything_but_get(client: Client) -> None:
    assert client.post("/metrics").status_code == 405
