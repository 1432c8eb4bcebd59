"""Server time of the console's pages on a database the size of a busy quarter.

Run: ``.venv/bin/python benchmarks/console_pages.py [--tasks 100000] [--events 1000000]
[--repeat 30] [--quick] [--keep] [--reuse] [--explain] [--queries]``.

A database of its own (``loopguard_pages_bench``) is created afresh, migrated, filled in
one go on the server (``INSERT … SELECT`` over ``generate_series``, never row by row
through the ORM), vacuumed and analysed, and dropped at the end unless ``--keep``. It holds:

* tasks created over eight weeks, the newest few queued or running, the rest stopped in
  every terminal state with a reason that fits it (the check constraints hold);
* trace events spread over the tasks, with ``--big-events`` of them (10,000) on the newest
  task, a running one: the task page and its live endpoint are measured on that task;
* operations for the writes in the trace (one task in thirty writes once, the big task
  every 200 steps): ``UNKNOWN`` and ``IN_FLIGHT`` where the task stopped on them or is
  running, so the reconciliation queue has what a bad day gives it;
* one phase per task, a stop report per stopped task, and audit entries for starts, stops,
  settled operations, and 150 actions on the big task.

Before the pages are timed, beat's roll-up (``console/rollups.py``) runs as on a console
just migrated: its first pass (every stopped task, every stop report, the week's hours) and
a pass with nothing new are timed, and the dashboard and ``/metrics`` are timed before it
too (every row read live), so the table ends with both, from the same run.

The dashboard page includes its charts (stops by reason over 24 h and 7 days, tasks started
and finished per hour, step latency p50/p95 per hour, ages of uncertain writes); its htmx
poll does not draw them. A table of its own times the charts' queries alone
(``selectors.trends``), one by one, with the index each one's plan uses.

Each page is requested ``--repeat`` times with Django's test client, after a warm-up, as a
signed-in admin, with ``DEBUG`` off as in production. The time is the whole request in
this process (middleware, queries, template); the SQL column is the part spent in
queries, as the driver saw it. Queries are counted per request; a second table shows that
the count does not grow with the page size. Nothing fails on a missed target (p95 ≤
100 ms); for pages over it (or all of them with ``--explain``) the slowest queries are
printed with ``EXPLAIN (ANALYZE, BUFFERS)``.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

if TYPE_CHECKING:
    from django.test import Client

SERVER = "postgres://postgres@127.0.0.1:5432"
DATABASE = "loopguard_pages_bench"
TARGET_MS = 100.0
WARMUP = 3
SPAN_SECONDS = 8 * 7 * 86_400  # tasks are created over eight weeks
ACTIVE_SHARE = 0.003  # the newest tasks are still queued or running
WRITER_EVERY = 30  # one task in this many made one write (an operation)
BIG_TASK_WRITE_EVERY = 200  # the big task writes every this many steps
BIG_TASK_AUDIT = 150  # human actions on the big task (its page shows the latest 100)
CALL_COST = 12  # what a model call costs, in the currency's minor unit (the dashboard's spend)

# -- data --------------------------------------------------------------------------------------
# Task ids are 1..n in creation order; task n is the big one. Each task's trace length is
# fixed by its id (``next_seq - 1``), so events can be generated from the tasks alone.

TASKS_SQL = """
INSERT INTO console_task (
    id, agent, client, tools, input, input_fingerprint, state, reason, detail, limits,
    model_calls, requests, executions, tokens, spend, explored, polls, elapsed_ms, revision,
    phase, checkpoint, next_seq, recoveries, lease_owner, lease_expires_at,
    stop_requested_at, stop_requested_by_id, stop_note, created_by_id,
    created_at, updated_at, finished_at
)
WITH base AS (
    SELECT g AS id, random() AS r_state, random() AS r_reason, random() AS r_agent,
           random() AS r_lease,
           %(now)s::timestamptz
               - make_interval(secs => (%(n)s::int - g) * %(span)s::float8 / %(n)s::int)
               - make_interval(secs => random() * 60) AS created_at,
           CASE WHEN g = %(n)s::int THEN %(big_events)s::int
                ELSE %(other_events)s::int / (%(n)s::int - 1)
                     + (g - 1 < %(other_events)s::int %% (%(n)s::int - 1))::int
           END AS events
    FROM generate_series(1, %(n)s::int) AS g
), shaped AS (
    SELECT base.*,
        (%(agents)s::text[])[1 + floor(r_agent * r_agent * %(n_agents)s::int)::int] AS agent,
        CASE
            WHEN id = %(n)s::int THEN 'RUNNING'
            WHEN id > %(n)s::int - %(active)s::int THEN
                CASE WHEN r_state < 0.6 THEN 'RUNNING' ELSE 'QUEUED' END
            WHEN r_state < 0.70 THEN 'COMPLETED'
            WHEN r_state < 0.80 THEN 'FAILED'
            WHEN r_state < 0.86 THEN 'PARTIAL'
            WHEN r_state < 0.96 THEN 'CANCELLED'
            ELSE 'NEEDS_HUMAN'
        END AS state
    FROM base
), reasoned AS (
    SELECT shaped.*,
        CASE state
            WHEN 'COMPLETED' THEN 'goal_met'
            WHEN 'FAILED' THEN (ARRAY['fatal', 'executor_error', 'bad_result', 'planner_error',
                'bad_args', 'precondition', 'operation_conflict'])[1 + floor(r_reason * 7)::int]
            WHEN 'PARTIAL' THEN (ARRAY['model_budget', 'request_budget', 'execution_budget',
                'token_budget', 'deadline', 'no_progress', 'same_call', 'short_cycle',
                'poll_budget', 'goal_unverified'])[1 + floor(r_reason * 10)::int]
            WHEN 'CANCELLED' THEN 'operator_stop'
            WHEN 'NEEDS_HUMAN' THEN (ARRAY['unknown_commit', 'operation_in_flight',
                'restart_loop', 'invalid_evidence', 'missing_operation_key',
                'approval_required'])[1 + floor(r_reason * 6)::int]
            ELSE ''
        END AS reason,
        created_at + make_interval(secs => events * 2.0 + 1) AS ended_at
    FROM shaped
)
SELECT
    id, agent, '', '{}'::jsonb,
    jsonb_build_object('ticket', id, 'customer', 'c' || id %% 5000 || '@example.com'),
    md5(agent || ':' || id),
    state, reason,
    CASE WHEN state = 'FAILED' THEN 'the tool gave up: ' || reason ELSE '' END,
    CASE WHEN id = %(n)s::int THEN %(big_limits)s::jsonb ELSE %(limits)s::jsonb END,
    (events + 1) / 2, events / 2, events * 2 / 5, (events + 1) / 2 * 1200::bigint,
    (events + 1) / 2 * %(call_cost)s::bigint, events / 4, 0,
    events * 2000::bigint, events / 5,
    1, NULL, events + 1, 0,
    CASE WHEN state = 'RUNNING' THEN 'worker-' || id %% 4 || ':' || 1000 + id %% 97 ELSE '' END,
    CASE WHEN state <> 'RUNNING' THEN NULL
         WHEN id <> %(n)s::int AND r_lease < 0.1 THEN %(now)s::timestamptz - interval '10 min'
         ELSE %(now)s::timestamptz + interval '20 s' END,
    CASE WHEN state = 'CANCELLED' THEN ended_at - interval '1 s' END,
    CASE WHEN state = 'CANCELLED' THEN (%(users)s::bigint[])[1 + id %% %(n_users)s::int] END,
    CASE WHEN state = 'CANCELLED' THEN 'the customer withdrew the request' ELSE '' END,
    CASE WHEN id %% 5 = 0 OR id = %(n)s::int
         THEN (%(users)s::bigint[])[1 + id %% %(n_users)s::int] END,
    created_at,
    CASE WHEN state = 'QUEUED' THEN created_at
         WHEN state = 'RUNNING' THEN %(now)s::timestamptz - make_interval(secs => r_lease * 30)
         ELSE ended_at END,
    CASE WHEN state NOT IN ('QUEUED', 'RUNNING') THEN ended_at END
FROM reasoned
"""

PHASES_SQL = """
INSERT INTO console_phase (task_id, number, started_at, ended_at, state, reason,
                           approved_by_id, approval_note, "grant", usage_at_start, created_at)
SELECT id, 1, CASE WHEN state <> 'QUEUED' THEN created_at END, finished_at,
       CASE WHEN finished_at IS NULL THEN '' ELSE state END, reason,
       NULL, '', '{}', '{}', created_at
FROM console_task
"""

REPORTS_SQL = """
INSERT INTO console_stopreport (task_id, phase, at, state, reason, report)
SELECT id, 1, finished_at, state, reason, jsonb_build_object(
    'state', state, 'reason', reason, 'detail', detail, 'completed', '[]'::jsonb,
    'operation_key', NULL, 'operation_state', NULL, 'operations', '[]'::jsonb,
    'revision', revision,
    'used', jsonb_build_object('model_calls', model_calls, 'requests', requests,
                               'executions', executions, 'tokens', tokens,
                               'elapsed_ms', elapsed_ms),
    'remaining_budget', '{}'::jsonb, 'call', NULL, 'batch', '[]'::jsonb,
    'resume_condition', CASE WHEN state = 'COMPLETED' THEN 'nothing to resume'
                             ELSE 'an approver grants more budget or settles the write' END)
FROM console_task
WHERE finished_at IS NOT NULL
"""

# Odd steps are model calls, even ones tool requests (every tenth request a wait). A step is
# a write (send_notice, with an operation key) at step 4 of one task in WRITER_EVERY, and
# every BIG_TASK_WRITE_EVERY steps of the big task.
EVENTS_SQL = """
INSERT INTO console_traceevent (
    task_id, phase, seq, at, kind, decision, reason, tool, fingerprint, args_preview,
    result_kind, result_preview, revision, operation_key, latency_ms, tokens, cost, detail
)
SELECT t.id, 1, s.seq, t.created_at + make_interval(secs => s.seq * 2.0),
    e.kind,
    CASE WHEN e.kind = 'model_call' THEN 'planned'
         WHEN s.seq %% 50 = 24 THEN 'blocked'
         WHEN s.seq %% 50 = 14 THEN 'reused'
         ELSE 'executed' END,
    CASE WHEN e.kind <> 'model_call' AND s.seq %% 50 = 24 THEN 'same_call' ELSE '' END,
    e.tool,
    CASE WHEN e.kind = 'model_call' THEN '' ELSE md5(e.tool || ':' || t.id || ':' || s.seq) END,
    CASE WHEN e.kind = 'model_call' THEN ''
         WHEN e.is_write THEN '{"recipient": "ops@example.com", "text": "ticket '
              || t.id || ': we are on it, update ' || s.seq || '"}'
         ELSE '{"q": "order ' || t.id * 7 + s.seq || '", "filters": {"status": "open", '
              || '"limit": 20}, "page": ' || s.seq / 2 || '}' END,
    CASE WHEN e.kind = 'model_call' THEN '' ELSE 'success' END,
    CASE WHEN e.kind = 'model_call' THEN ''
         ELSE '{"rows": 20, "first": {"order": ' || t.id * 7 + s.seq
              || ', "status": "open", "customer": "c' || t.id %% 5000
              || '@example.com", "amount_cents": 1500}, "next": "c' || s.seq || '"}' END,
    CASE WHEN e.kind = 'model_call' THEN NULL ELSE s.seq / 5 END,
    CASE WHEN e.is_write THEN 'task-' || t.id || '-notice-' || s.seq ELSE '' END,
    CASE WHEN e.kind = 'model_call' THEN 400 + (s.seq * 37) %% 1600
         ELSE 20 + (s.seq * 13) %% 280 END,
    CASE WHEN e.kind = 'model_call' THEN 500 + (s.seq * 53) %% 2500 END,
    CASE WHEN e.kind = 'model_call' THEN %(call_cost)s::bigint END,
    ''
FROM console_task AS t
CROSS JOIN LATERAL generate_series(1, t.next_seq - 1) AS s(seq)
CROSS JOIN LATERAL (
    SELECT
        CASE WHEN s.seq %% 2 = 1 THEN 'model_call'
             WHEN s.seq %% 20 = 0 THEN 'wait'
             ELSE 'request' END AS kind,
        CASE WHEN s.seq %% 2 = 1 THEN ''
             WHEN (t.id %% %(writer_every)s::int = 0 AND s.seq = 4)
               OR (t.id = %(big)s::int AND s.seq %% %(big_write_every)s::int = 4)
             THEN 'send_notice'
             WHEN s.seq %% 20 = 0 THEN 'wait_for_job'
             ELSE (ARRAY['search', 'read_page', 'lookup_order'])[1 + (s.seq / 2) %% 3] END
             AS tool,
        s.seq %% 2 = 0
          AND ((t.id %% %(writer_every)s::int = 0 AND s.seq = 4)
               OR (t.id = %(big)s::int AND s.seq %% %(big_write_every)s::int = 4)) AS is_write
) AS e
ORDER BY t.id, s.seq
"""

# An operation's state follows its task: uncertain where the task stopped on it or is still
# running (the big task's last write is in flight), settled otherwise.
OPERATIONS_SQL = """
INSERT INTO console_operation (key, fingerprint, state, tool, task_id, args_preview, result,
                               attempts, evidence, claimed_at, updated_at)
SELECT e.operation_key, e.fingerprint, o.state, e.tool, t.id, e.args_preview,
    CASE WHEN o.state = 'COMMITTED' THEN jsonb_build_object('notice', e.id) END,
    CASE WHEN o.state = 'UNKNOWN' THEN 2 ELSE 1 END,
    CASE WHEN o.state = 'NOT_COMMITTED' THEN 'the desk has no notice with this key' ELSE '' END,
    e.at,
    CASE WHEN o.state IN ('UNKNOWN', 'IN_FLIGHT') THEN coalesce(t.finished_at, t.updated_at)
         ELSE e.at + interval '1 s' END
FROM console_traceevent AS e
JOIN console_task AS t ON t.id = e.task_id
CROSS JOIN LATERAL (
    SELECT CASE
        WHEN t.id = %(big)s::int THEN
            CASE WHEN e.seq + %(big_write_every)s::int > t.next_seq - 1 THEN 'IN_FLIGHT'
                 ELSE 'COMMITTED' END
        WHEN t.state = 'RUNNING' THEN 'IN_FLIGHT'
        WHEN t.reason = 'unknown_commit' THEN 'UNKNOWN'
        WHEN t.reason = 'operation_in_flight' THEN 'IN_FLIGHT'
        WHEN e.id %% 10 = 0 THEN 'NOT_COMMITTED'
        ELSE 'COMMITTED'
    END AS state
) AS o
WHERE e.operation_key <> ''
ORDER BY e.id
"""

# Every task held for a call's approval holds one, still pending: the approval queue on a
# day nobody answered.
APPROVALS_SQL = """
INSERT INTO console_approval (task_id, phase, tool, effect, operation_key, fingerprint, args,
                              args_preview, state, requested_at, decided_at, reason, on_reject)
SELECT id, 1, 'send_notice', 'write', 'task-' || id || '-held', md5('held:' || id),
       jsonb_build_object('recipient', 'ops@example.com', 'text', 'refund ticket ' || id),
       '{"recipient": "ops@example.com", "text": "refund ticket ' || id || '"}',
       'PENDING', finished_at, NULL, '', ''
FROM console_task
WHERE state = 'NEEDS_HUMAN' AND reason = 'approval_required'
"""

AUDIT_SQL = """
INSERT INTO console_auditentry (at, actor_id, action, task_id, operation_id, reason,
                                before, after)
SELECT created_at, created_by_id, 'start', id, NULL::bigint,
       'ticket ' || id || ' from the queue', '{}'::jsonb,
       jsonb_build_object('state', 'QUEUED', 'agent', agent)
FROM console_task WHERE created_by_id IS NOT NULL AND id <> %(big)s::int
UNION ALL
SELECT stop_requested_at, stop_requested_by_id, 'stop', id, NULL, stop_note,
       '{"state": "RUNNING"}'::jsonb, '{"stop_requested": true}'::jsonb
FROM console_task WHERE stop_requested_at IS NOT NULL
UNION ALL
SELECT o.updated_at + interval '5 min', (%(users)s::bigint[])[1 + o.id %% %(n_users)s::int],
       CASE WHEN o.state = 'COMMITTED' THEN 'mark_committed' ELSE 'mark_not_committed' END,
       o.task_id, o.id, 'checked the desk by hand',
       '{"state": "UNKNOWN"}'::jsonb, jsonb_build_object('state', o.state)
FROM console_operation AS o WHERE o.state IN ('COMMITTED', 'NOT_COMMITTED') AND o.id %% 3 = 0
UNION ALL
SELECT t.created_at + make_interval(secs => g * 60),
       (%(users)s::bigint[])[1 + g %% %(n_users)s::int],
       CASE WHEN g = 1 THEN 'start' ELSE 'lookup' END, t.id,
       CASE WHEN g = 1 THEN NULL ELSE
           (SELECT o.id FROM console_operation AS o WHERE o.task_id = t.id
            ORDER BY o.id OFFSET g %% 10 LIMIT 1) END,
       CASE WHEN g = 1 THEN 'long-running reconciliation job'
            ELSE 'looked the operation up in the business system' END,
       '{}'::jsonb, jsonb_build_object('committed', true, 'evidence', 'notice ' || g)
FROM console_task AS t, generate_series(1, %(big_audit)s::int) AS g
WHERE t.id = %(big)s::int
ORDER BY 1
"""


@dataclass(frozen=True)
class Shape:
    """How much of everything to generate."""

    tasks: int
    events: int
    big_events: int

    @property
    def big_task(self) -> int:
        return self.tasks

    @property
    def active(self) -> int:
        return max(10, round(self.tasks * ACTIVE_SHARE))


@contextmanager
def timed(label: str, laps: list[tuple[str, float]]) -> Iterator[None]:
    """Record how long the block took under ``label``."""
    start = time.perf_counter()
    yield
    laps.append((label, time.perf_counter() - start))


def generate(conn: psycopg.Connection[Any], shape: Shape, users: list[int]) -> str:
    """Fill the migrated database; return a line saying what took how long."""
    from django.conf import settings

    from console.store import history

    agents = list(settings.LOOPGUARD_AGENTS)
    limits = dict(settings.LOOPGUARD_DEFAULT_LIMITS)
    big_limits = {
        **limits,
        "model_calls": 20_000,
        "requests": 20_000,
        "executions": 20_000,
        "deadline_ms": 86_400_000,
    }
    params: dict[str, Any] = {
        "now": datetime.now(UTC),
        "n": shape.tasks,
        "span": SPAN_SECONDS,
        "big": shape.big_task,
        "big_events": shape.big_events,
        "other_events": shape.events - shape.big_events,
        "active": shape.active,
        "agents": agents,
        "n_agents": len(agents),
        "limits": Jsonb(limits),
        "big_limits": Jsonb(big_limits),
        "users": users,
        "n_users": len(users),
        "writer_every": WRITER_EVERY,
        "big_write_every": BIG_TASK_WRITE_EVERY,
        "big_audit": BIG_TASK_AUDIT,
        "call_cost": CALL_COST,
    }
    laps: list[tuple[str, float]] = []
    start = time.perf_counter()
    with conn.cursor() as cur:
        cur.execute("SELECT setseed(0.42)")  # the same data on every run
        with timed("tasks", laps):
            cur.execute(TASKS_SQL, params)
            cur.execute(
                "SELECT setval(pg_get_serial_sequence('console_task', 'id'), %(n)s::int)", params
            )
        with timed("trace partitions", laps):
            # The trace is partitioned by ranges of task ids (migration 0019), made ahead of
            # the newest task by beat; made here as beat would, or every task past the first
            # few ranges would put its trace in the default partition.
            made = len(history.partitions_ahead())
        with timed("phases", laps):
            cur.execute(PHASES_SQL)
        with timed("stop reports", laps):
            cur.execute(REPORTS_SQL)
        with timed("trace events", laps):
            cur.execute(EVENTS_SQL, params)
        with timed("operations", laps):
            cur.execute(OPERATIONS_SQL, params)
        with timed("approvals", laps):
            cur.execute(APPROVALS_SQL)
        with timed("audit", laps):
            cur.execute(AUDIT_SQL, params)
        with timed("vacuum analyze", laps):
            # ANALYZE for the planner's statistics; VACUUM sets the visibility map that
            # autovacuum would have set on a live database, which index-only scans rely on.
            cur.execute("VACUUM (ANALYZE)")
    total = time.perf_counter() - start
    parts = ", ".join(f"{label} {seconds:.1f}" for label, seconds in laps)
    return f"generated in {total:.1f} s ({parts}); {made} trace partitions made ahead"


# -- measuring ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Page:
    """One request the benchmark makes."""

    name: str
    path: str
    headers: dict[str, str] = field(default_factory=dict)
    run: Callable[[], object] | None = None
    """Not a page but reads a process makes (the sweep's): timed as a request would be."""


@dataclass
class Timing:
    """What ``--repeat`` requests of one page took."""

    page: Page
    ms: list[float] = field(default_factory=list)
    sql_ms: list[float] = field(default_factory=list)
    queries: list[int] = field(default_factory=list)
    slowest: list[tuple[float, str]] = field(default_factory=list)  # of the last request

    @property
    def p95(self) -> float:
        return percentile(self.ms, 95)


def percentile(values: list[float], pct: int) -> float:
    """The ``pct``-th percentile (inclusive method; the maximum for fewer than 2 values)."""
    if len(values) < 2:
        return max(values)
    return statistics.quantiles(values, n=100, method="inclusive")[pct - 1]


@dataclass(frozen=True)
class Sample:
    """One request: its time, each query's time and text, and the page it returned."""

    ms: float
    queries: list[tuple[float, str]]
    body: bytes

    @property
    def sql_ms(self) -> float:
        return sum(ms for ms, _ in self.queries)


TRANSACTION = frozenset({"BEGIN", "COMMIT", "ROLLBACK"})


class Stopwatch:
    """An execute wrapper timing every query (Django's own log rounds to whole ms)."""

    def __init__(self) -> None:
        self.ms: list[float] = []

    def __call__(
        self,
        execute: Callable[..., Any],
        sql: str,
        params: Any,
        many: bool,
        context: dict[str, Any],
    ) -> Any:
        start = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            self.ms.append((time.perf_counter() - start) * 1000)


def request(client: Client, page: Page) -> Sample:
    """Request ``page``, counting and timing its queries; refuse an error status."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    watch = Stopwatch()
    body = b""
    with CaptureQueriesContext(connection) as ctx, connection.execute_wrapper(watch):
        start = time.perf_counter()
        if page.run is not None:
            page.run()
        else:
            response = client.get(page.path, headers=page.headers)
            if response.status_code != 200:
                raise SystemExit(f"{page.name}: {page.path} answered {response.status_code}")
            body = bytes(response.content)
        elapsed = (time.perf_counter() - start) * 1000
    # Django logs a transaction's BEGIN and COMMIT too (/metrics reads in one snapshot);
    # they are no query of the page's and pass no execute wrapper.
    texts = [str(q["sql"]) for q in ctx.captured_queries if q["sql"] not in TRANSACTION]
    if len(texts) != len(watch.ms):
        raise SystemExit(f"{page.name}: {len(texts)} queries logged, {len(watch.ms)} timed")
    return Sample(elapsed, list(zip(watch.ms, texts, strict=True)), body)


def sweep_reads() -> list[int]:
    """The reads of one recovery sweep (``console.drivers.runner.recovery.sweep``), in its
    order: attached tasks whose client is gone for good, running tasks whose lease ran out,
    queued tasks nobody took. The sweep itself also recovers what they find, which would
    change the database the next run measures."""
    from datetime import timedelta

    from django.conf import settings
    from django.utils import timezone

    from console.models import Task, TaskState, lease_lapsed, waiting_for_client

    now = timezone.now()
    allowed = timedelta(seconds=settings.LOOPGUARD_ATTACHED_CLIENT_LOST_SECONDS)
    stale = now - timedelta(seconds=settings.LOOPGUARD_REQUEUE_AFTER_SECONDS)
    found: list[int] = []
    for qs in (
        Task.objects.filter(waiting_for_client(now - allowed), stop_requested_at=None),
        Task.objects.filter(lease_lapsed(now)),
        Task.objects.filter(state=TaskState.QUEUED, updated_at__lt=stale, client=""),
    ):
        found.extend(qs.values_list("id", flat=True)[:500])
    return found


def measure(client: Client, page: Page, repeat: int) -> Timing:
    """``WARMUP`` requests, then ``repeat`` timed ones."""
    for _ in range(WARMUP):
        request(client, page)
    timing = Timing(page)
    for _ in range(repeat):
        sample = request(client, page)
        timing.ms.append(sample.ms)
        timing.sql_ms.append(sample.sql_ms)
        timing.queries.append(len(sample.queries))
    timing.slowest = sorted(sample.queries, reverse=True)
    return timing


def explain(conn: psycopg.Connection[Any], query: str) -> str:
    """``EXPLAIN (ANALYZE, BUFFERS)`` of a query Django ran (its parameters already inlined);
    a statement that reads nothing (``SET TRANSACTION``) has no plan."""
    if not query.lstrip().upper().startswith(("SELECT", "WITH")):
        return "(no plan: not a query)"
    with conn.cursor() as cur:
        # The text is a query Django itself just ran on this database, not outside input.
        cur.execute(b"EXPLAIN (ANALYZE, BUFFERS) " + query.encode())
        return "\n".join(str(row[0]) for row in cur.fetchall())


# -- the run -----------------------------------------------------------------------------------


def _rows(pattern: bytes, body: bytes) -> int:
    return len(re.findall(pattern, body))


TASK_ROW = rb'<td><a href="/tasks/\d+/">#'
EVENT_ROW = rb'<tr class="kind-'
AUDIT_ROW = rb'<tr><td class="meta nowrap">'


def page_size_table(client: Client, pages: dict[str, Page], repeat: int) -> list[str]:
    """Queries per request, and time, at a small and a large page size of each paged list."""
    from console import selectors

    knobs: list[tuple[str, str, Page, bytes, tuple[int, int]]] = [
        ("tasks, unfiltered", "TASKS_PER_PAGE", pages["tasks"], TASK_ROW, (5, 50)),
        ("tasks, filtered", "TASKS_PER_PAGE", pages["filtered"], TASK_ROW, (5, 50)),
        ("task detail", "TRACE_WINDOW", pages["detail"], EVENT_ROW, (20, 200)),
        ("audit log", "AUDIT_PER_PAGE", pages["audit"], AUDIT_ROW, (10, 100)),
    ]
    lines = [
        f"{'list':<18} {'setting':<15} {'rows':>5} {'queries':>8} {'p50 ms':>7}"
        f" {'rows':>5} {'queries':>8} {'p50 ms':>7}  same count"
    ]
    for label, setting, page, pattern, sizes in knobs:
        original = getattr(selectors, setting)
        found: list[str] = []
        counts: set[int] = set()
        try:
            for size in sizes:
                setattr(selectors, setting, size)
                timing = measure(client, page, repeat)
                rows = _rows(pattern, request(client, page).body)
                counts.update(timing.queries)
                found.append(f"{rows:>5} {timing.queries[-1]:>8} {percentile(timing.ms, 50):>7.1f}")
        finally:
            setattr(selectors, setting, original)
        same = "yes" if len(counts) == 1 else "NO"
        lines.append(f"{label:<18} {setting:<15} {' '.join(found)}  {same}")
    return lines


def trends_table(conn: psycopg.Connection[Any], repeat: int) -> list[str]:
    """Time ``selectors.trends`` alone, and each of its queries; name the indexes each
    query's plan reads (a chart that scans a whole table shows up here first)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from console import selectors

    for _ in range(WARMUP):
        selectors.trends()
    total: list[float] = []
    per_query: dict[int, list[float]] = {}
    texts: list[str] = []
    for _ in range(repeat):
        watch = Stopwatch()
        with CaptureQueriesContext(connection) as ctx, connection.execute_wrapper(watch):
            start = time.perf_counter()
            selectors.trends()
            total.append((time.perf_counter() - start) * 1000)
        texts = [str(q["sql"]) for q in ctx.captured_queries]
        for i, ms in enumerate(watch.ms):
            per_query.setdefault(i, []).append(ms)
    lines = [
        f"{'query':<40} {'p50':>7} {'p95':>7}  plan reads",
        f"{'all of selectors.trends()':<40} {percentile(total, 50):>7.1f} "
        f"{percentile(total, 95):>7.1f}",
    ]
    for i, text in enumerate(texts):
        plan = explain(conn, text)
        scans = sorted(set(re.findall(r"(\w+ Scan)(?: using| on) (\w+)", plan)))
        reads = ", ".join(f"{kind} {name}" for kind, name in scans)
        lines.append(
            f"{_query_name(text):<40} {percentile(per_query[i], 50):>7.1f} "
            f"{percentile(per_query[i], 95):>7.1f}  {reads}"
        )
    return lines


ROLLED_PAGES = ("dashboard", "metrics")
"""The pages that read beat's roll-ups (console/rollups.py)."""


def rolled_already() -> bool:
    from console.models import Task

    return Task.objects.filter(rolled=True).exists()


def roll_up(conn: psycopg.Connection[Any]) -> list[str]:
    """Run beat's roll-up as it runs on a console that has just been migrated: the first
    pass rolls every task that stopped, counts every stop report and the last week's
    hours; then vacuum (autovacuum would, after so many updated rows) and a pass with
    nothing new, as beat runs every minute after that."""
    from console import rollups

    lines = []
    start, cpu = time.perf_counter(), time.process_time()
    first = rollups.roll(seconds=3600)
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    lines.append(
        f"roll-ups, first pass: {seconds:.1f} s ({cpu:.1f} s CPU here): {first.tasks:,} tasks"
        f" ({first.tasks / seconds if seconds else 0:,.0f}/s), {first.stops:,} stop reports,"
        f" {first.hours} hours"
    )
    start = time.perf_counter()
    conn.execute("VACUUM (ANALYZE) console_task")
    lines.append(f"vacuum analyze console_task after it: {time.perf_counter() - start:.1f} s")
    passes = []
    for _ in range(5):
        start, cpu = time.perf_counter(), time.process_time()
        steady = rollups.roll()
        passes.append(((time.perf_counter() - start) * 1000, (time.process_time() - cpu) * 1000))
    wall = statistics.median(ms for ms, _ in passes)
    here = statistics.median(ms for _, ms in passes)
    lines.append(
        f"roll-ups, a pass with nothing new (beat's minute), median of 5: {wall:.0f} ms"
        f" ({here:.0f} ms CPU here; it recounts the last day's hours):"
        f" {steady.tasks} tasks, {steady.stops} stop reports, {steady.hours} hours"
    )
    return lines


def _query_name(text: str) -> str:
    """A short name for one of the charts' queries, from what it groups by."""
    if "console_hourstat" in text:
        return "step latency of the counted hours"
    if "percentile_cont" in text:
        return "step latency p50/p95, hours not counted"
    if '"reason"' in text.split("FROM")[0]:
        return "stops by reason (7 d, 24 h) and per hour"
    return "tasks started per hour"


def pages_for(conn: psycopg.Connection[Any], shape: Shape) -> tuple[dict[str, Page], str]:
    """The requests to time, chosen from the generated data; and a line describing it."""
    from console import selectors

    with conn.cursor() as cur:
        cur.execute("SELECT count(*) FROM console_task")
        tasks = int(_one(cur.fetchone()))
        cur.execute(
            "SELECT count(*), max(seq) FROM console_traceevent WHERE task_id = %s",
            (shape.big_task,),
        )
        big_events, last_seq = _pair(cur.fetchone())
        cur.execute("SELECT count(*) FROM console_traceevent")
        events = int(_one(cur.fetchone()))
        cur.execute(
            "SELECT count(*), count(*) FILTER (WHERE state IN ('UNKNOWN', 'IN_FLIGHT')) "
            "FROM console_operation"
        )
        operations, unsettled = _pair(cur.fetchone())
        cur.execute("SELECT key FROM console_operation ORDER BY state = 'UNKNOWN' DESC, id LIMIT 1")
        key = str(_one(cur.fetchone()))
        cur.execute("SELECT count(*) FROM console_auditentry")
        audit = int(_one(cur.fetchone()))
        deep = max(2, (tasks + selectors.TASKS_PER_PAGE - 1) // selectors.TASKS_PER_PAGE * 9 // 10)
        # The list pages from a row's place (its Older link): the place the link to page
        # ``deep`` carries, that of the last task on the page before it.
        cur.execute(
            "SELECT created_at, id FROM console_task ORDER BY created_at DESC, id DESC"
            " OFFSET %s LIMIT 1",
            ((deep - 1) * selectors.TASKS_PER_PAGE - 1,),
        )
        row = cur.fetchone()
    if row is None:
        raise SystemExit("the benchmark database is empty: run without --reuse")
    place = selectors.Place(row[0], int(row[1]))
    agent = next(iter(_agents()))
    big = shape.big_task
    board = {"HX-Request": "true", "HX-Target": "board"}
    pages = {
        "dashboard": Page("dashboard", "/"),
        "board": Page("dashboard, htmx poll", "/", board),
        "tasks": Page("tasks, page 1", "/tasks/"),
        "deep": Page(f"tasks, page {deep:,}", f"/tasks/?after={place}"),
        "filtered": Page(f"tasks, FAILED {agent}", f"/tasks/?state=FAILED&agent={agent}"),
        "search": Page("tasks, search op key", f"/tasks/?q={key}"),
        "detail": Page(f"task #{big}", f"/tasks/{big}/"),
        "live": Page(f"task #{big} live", f"/tasks/{big}/live?after={last_seq - 5}"),
        "operations": Page("reconciliation queue", "/operations/"),
        "approvals": Page("approval queue", "/approvals/"),
        "audit": Page("audit log, page 1", "/audit/"),
        "metrics": Page("/metrics", "/metrics"),
        "sweep": Page("recovery sweep's reads", "", run=sweep_reads),
    }
    described = (
        f"{tasks:,} tasks, {events:,} trace events ({big_events:,} on task #{big}), "
        f"{operations:,} operations ({unsettled:,} UNKNOWN or IN_FLIGHT), "
        f"{audit:,} audit entries"
    )
    return pages, described


def _one(row: tuple[Any, ...] | None) -> Any:
    if row is None:
        raise SystemExit("the benchmark database is empty: run without --reuse")
    return row[0]


def _pair(row: tuple[Any, ...] | None) -> tuple[int, int]:
    if row is None:
        raise SystemExit("the benchmark database is empty: run without --reuse")
    return int(row[0] or 0), int(row[1] or 0)


def _agents() -> list[str]:
    from django.conf import settings

    return list(settings.LOOPGUARD_AGENTS)


def signed_in_client() -> Client:
    """A test client signed in as a user with the admin role (and operators for the data)."""
    from django.contrib.auth import get_user_model
    from django.test import Client

    from console.records.roles import Role, assign

    user_model = get_user_model()
    admin = user_model.objects.filter(username="bench-admin").first()
    if admin is None:
        admin = user_model.objects.create_user(username="bench-admin")
    assign(admin, [Role.ADMIN])
    client = Client()
    client.force_login(admin)
    return client


def operator_ids(count: int = 5) -> list[int]:
    """Ids of a few operators, the actors of the generated tasks and audit entries."""
    from django.contrib.auth import get_user_model

    user_model = get_user_model()
    ids = []
    for i in range(1, count + 1):
        user, _ = user_model.objects.get_or_create(username=f"operator-{i}")
        ids.append(int(user.pk))
    return ids


def setup_django(url: str) -> None:
    """Point the console's settings at the benchmark database and start Django."""
    os.environ["DJANGO_SETTINGS_MODULE"] = "console.project.settings"
    os.environ["DATABASE_URL"] = url
    import django
    from django.conf import settings

    django.setup()
    # Production conditions: no template debug information, no query log outside the
    # capture; the test client's host must be allowed once DEBUG is off.
    settings.DEBUG = False
    settings.ALLOWED_HOSTS = [*settings.ALLOWED_HOSTS, "testserver"]


def create_database(server: str, name: str) -> None:
    """Create ``name`` afresh, dropping what an earlier run left behind."""
    with psycopg.connect(f"{server}/postgres", autocommit=True) as conn:
        _drop(conn, name)
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))


def drop_database(server: str, name: str) -> None:
    """Close Django's connections and drop ``name``."""
    from django.db import connections

    connections.close_all()
    with psycopg.connect(f"{server}/postgres", autocommit=True) as conn:
        _drop(conn, name)


def _drop(conn: psycopg.Connection[Any], name: str) -> None:
    # FORCE: a connection an interrupted run left open must not keep the database alive.
    conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--tasks", type=int, default=100_000)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument(
        "--big-events",
        type=int,
        default=10_000,
        help="trace events on the one task whose page is measured",
    )
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a smoke run: 5,000 tasks, 50,000 events, 5 requests a page",
    )
    parser.add_argument("--server", default=SERVER, help="PostgreSQL server URL, no database")
    parser.add_argument("--database", default=DATABASE)
    parser.add_argument("--keep", action="store_true", help="keep the database afterwards")
    parser.add_argument(
        "--reuse",
        action="store_true",
        help="measure a database an earlier --keep run left, as it is (dropped unless --keep)",
    )
    parser.add_argument(
        "--explain", action="store_true", help="EXPLAIN ANALYZE the slowest queries of every page"
    )
    parser.add_argument(
        "--queries", action="store_true", help="list every page's queries with their time"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.tasks, args.events, args.big_events, args.repeat = 5_000, 50_000, 5_000, 5
    if args.tasks < 100 or not 0 < args.big_events < args.events or args.repeat < 1:
        parser.error("need --tasks ≥ 100, 0 < --big-events < --events and --repeat ≥ 1")
    return args


def main(argv: list[str]) -> int:
    """Build the database, time every page, print the tables."""
    args = parse(argv)
    shape = Shape(args.tasks, args.events, args.big_events)
    url = f"{args.server}/{args.database}"
    if not args.reuse:
        create_database(args.server, args.database)
    setup_django(url)
    try:
        return run(args, shape, url)
    finally:
        if not args.keep:
            drop_database(args.server, args.database)


def run(args: argparse.Namespace, shape: Shape, url: str) -> int:
    from django.core.management import call_command

    with psycopg.connect(url, autocommit=True) as conn:
        version = str(_one(conn.execute("SHOW server_version").fetchone()))
        if args.reuse:
            generated = "reusing the database as it is"
        else:
            start = time.perf_counter()
            call_command("migrate", verbosity=0)
            migrated = time.perf_counter() - start
            generated = generate(conn, shape, operator_ids())
            generated = f"migrated in {migrated:.1f} s; {generated}"
        client = signed_in_client()
        pages, described = pages_for(conn, shape)
        print(f"PostgreSQL {version}, database {args.database}: {described}")
        print(generated)
        # The pages that read beat's roll-ups, as a console without them reads them (every
        # task, every stop report, the trace's whole week): the baseline, in the same run.
        baseline = not rolled_already()
        unrolled = {
            name: measure(client, pages[name], args.repeat) for name in ROLLED_PAGES if baseline
        }
        for line in roll_up(conn):
            print(line)
        # Other work on the machine shows up in the p95 and max columns: say how busy it was.
        load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
        print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load average {load}")
        print(
            f"\nserver time per request in ms, {args.repeat} requests after {WARMUP} warm-up, "
            f"DEBUG off; target p95 ≤ {TARGET_MS:.0f} ms"
        )
        print(
            f"{'page':<28} {'min':>7} {'p50':>7} {'p95':>7} {'max':>7} {'SQL p50':>8} "
            f"{'queries':>8}  p95 ≤ {TARGET_MS:.0f}"
        )
        timings = []
        for page in pages.values():
            timing = measure(client, page, args.repeat)
            timings.append(timing)
            counts = sorted(set(timing.queries))
            count = str(counts[0]) if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"
            print(
                f"{page.name:<28} {min(timing.ms):>7.1f} {percentile(timing.ms, 50):>7.1f} "
                f"{timing.p95:>7.1f} {max(timing.ms):>7.1f} {percentile(timing.sql_ms, 50):>8.1f} "
                f"{count:>8}  "
                f"{'yes' if timing.p95 <= TARGET_MS else 'NO'}"
            )
        over = [t.page.name for t in timings if t.p95 > TARGET_MS]
        print(f"pages over target: {', '.join(over) if over else 'none'}")
        if unrolled:
            print("\nthe same pages before beat's roll-ups (every row read live), p50 / p95 ms")
            after = {t.page.name: t for t in timings}
            for before in unrolled.values():
                name = before.page.name
                print(
                    f"{name:<28} before {percentile(before.ms, 50):>7.1f} / {before.p95:>7.1f}"
                    f"   after {percentile(after[name].ms, 50):>7.1f} / {after[name].p95:>7.1f}"
                )

        print(f"\nthe dashboard's chart queries (selectors.trends), {args.repeat} runs")
        for line in trends_table(conn, args.repeat):
            print(line)

        print(f"\nqueries and time per request against page size ({args.repeat} requests each)")
        for line in page_size_table(client, pages, args.repeat):
            print(line)

        if args.queries:
            for timing in timings:
                print(f"\n-- queries of {timing.page.name} ({timing.page.path}), slowest first")
                for ms, text in timing.slowest:
                    print(f"{ms:8.2f} ms  {text[:400]}")
        for timing in timings:
            if timing.p95 <= TARGET_MS and not args.explain:
                continue
            print(
                f"\n== {timing.page.name} ({timing.page.path}): p95 {timing.p95:.1f} ms; "
                f"slowest queries of the last request"
            )
            for ms, text in timing.slowest[:3]:
                print(f"\n-- {ms:.2f} ms\n{text}\n")
                print(explain(conn, text))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
