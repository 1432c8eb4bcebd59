"""Guarded steps per second of one in-process driver on PostgreSQL, against a raw psycopg loop.

Run: ``.venv/bin/python benchmarks/runner_throughput.py [--steps N] [--quick]``.

One *step* is one model call and one tool request; steps alternate between reading a desk
page and sending a desk notice with its own operation key. The guarded side is
``console.runner.drive`` in this process (no Celery), persisting every step as it does in a
worker. The baseline, measured in the same run, is a bare psycopg loop on an autocommit
connection doing the same business work, and for each write the same claim and commit on a
bare ledger table of its own: one ``INSERT … ON CONFLICT … DO UPDATE … WHERE … RETURNING``
to claim, one ``UPDATE … SET state = 'COMMITTED'`` to record.

A third side, for reference, is that raw loop plus one synchronous commit per step of its
number and last result (``_RAW_STEP``): the least a hand-written loop must commit to resume
after a crash, which the guarded loop must do too (with its trace events and counters).
The target (guarded ≥ 0.5x) is against the raw loop without it.

Every side sends the same business statements (``_RAW_READ``, ``_RAW_SEND``), prepared: the
benchmark agent's tools run them on the driver's connection, so the difference between the
sides is what LoopGuard adds, not how an agent's tools talk to their database.

Database work per step is counted twice over. Client side, an ``execute_wrapper`` on every
Django connection (the lease heartbeat's thread included) counts queries, and from the
psycopg connection's transaction status the ``BEGIN`` and ``COMMIT`` the wrapper cannot see:
round trips are the queries plus two per explicit transaction. Server side, the delta of
``pg_stat_database.xact_commit`` for the benchmark database counts commits (every
autocommit statement, reads included, is a transaction of its own there).

Stop latency is the time from calling ``console.services.task_stop`` on a task whose driver
is waiting on a ``PENDING`` result until its row reads ``CANCELLED``.

Everything runs in a database of its own, created afresh and migrated at the start and
dropped at the end. Nothing fails on a missed target; the numbers are printed.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import logging
import os
import re
import statistics
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psycopg
from psycopg import sql
from psycopg.pq import TransactionStatus
from psycopg.types.json import Jsonb

from console.agents.base import Agent, Tool
from console.statements import fetch_one
from guard import Call, Evidence, Finish, Kind, Result, Settlement

SERVER = "postgres://postgres@127.0.0.1:5432"
DATABASE = "loopguard_bench"
COLLECTION = "bench"
MIX_AGENT = "bench_read_write"
WAIT_AGENT = "bench_waiter"
RAW = "raw psycopg"
RAW_STEP_COMMIT = "raw + step commit"
STOP_ROUNDS = 5
PROFILE_STEPS = 40  # steps in the attributed run that breaks queries down by caller

# -- agents ------------------------------------------------------------------------------------


@dataclass
class _Probe:
    """What the agents tell the benchmark: when each step was planned, and its kind."""

    plan_times: list[float] = field(default_factory=list)
    kind: str = "read"


_probe = _Probe()


class ReadWriteMix(Agent):
    """Alternates a page read and a notice send (``steps`` model calls), then is done.

    Progress is counted in ``memory`` and a write counts as committed when the desk
    returned its notice row, so ``inspect`` adds no queries of its own: what the benchmark
    sees on top of the business work is the runner's.
    """

    name = MIX_AGENT
    title = "Read/write mix (benchmark)"

    def __init__(self, task_id: int, input: Mapping[str, Any], memory: dict[str, Any]) -> None:
        super().__init__(task_id, input, memory)
        self.steps = int(input["steps"])
        self.run = str(input["run"])
        self._sent: set[str] = set()

    def tools(self) -> Sequence[Tool]:
        """``read_page`` (read) and ``send_notice`` (write, with a lookup by key)."""
        return [
            Tool("read_page", "read", self._read),
            Tool("send_notice", "write", self._send, lookup=self._lookup),
        ]

    def _read(self, call: Call) -> Result:
        page = fetch_one(_RAW_READ, [call.args["collection"], call.args["number"]])
        if page is None:
            return Result(Kind.FATAL, {"missing": call.args["number"]})
        return Result(Kind.SUCCESS, {"page": page[0], "items": page[1]})

    def _send(self, call: Call) -> Result:
        key = str(call.operation_key)
        sent = fetch_one(_RAW_SEND, ["ops@example.com", str(call.args["text"]), key])
        if sent is None:
            return Result(Kind.FATAL, {"unsent": key})
        self._sent.add(key)
        return Result(Kind.SUCCESS, {"notice": sent[0]})

    def _lookup(self, key: str) -> Settlement:
        from console.demo import desk

        return Settlement(committed=desk.notice_find(key) is not None)

    def plan(self, observation: Any) -> Call | Finish:
        """Step n reads page (n + 1) / 2 when n is odd and sends notice n when it is even."""
        _probe.plan_times.append(time.perf_counter())
        n = int(self.memory.get("done", 0)) + 1
        if n > self.steps:
            return Finish(f"{self.steps} steps")
        if n % 2:
            _probe.kind = "read"
            return Call("read_page", {"collection": COLLECTION, "number": (n + 1) // 2})
        _probe.kind = "write"
        key = f"bench-{self.run}-notice-{n}"
        return Call("send_notice", {"text": f"benchmark notice {n}"}, "write", key)

    def inspect(self, result: Result | None, step: Call | Finish) -> Evidence:
        """One unit of progress per successful step; the goal is ``steps`` of them."""
        done = int(self.memory.get("done", 0))
        committed: bool | None = None
        if isinstance(step, Call):
            if result is not None and result.kind == Kind.SUCCESS:
                done += 1
                self.memory["done"] = done
            if step.effect == "write":
                committed = step.operation_key in self._sent
        return Evidence(done, done >= self.steps, committed)


class Waiter(Agent):
    """Polls a job that stays ``PENDING`` and asks to wait ``wait_ms`` before the next poll."""

    name = WAIT_AGENT
    title = "Waiter (benchmark)"

    def tools(self) -> Sequence[Tool]:
        """``job_status`` (read), always ``PENDING``."""
        return [Tool("job_status", "read", self._status)]

    def _status(self, call: Call) -> Result:
        return Result(Kind.PENDING, {"job": 1}, wait_ms=int(self.input["wait_ms"]))

    def plan(self, observation: Any) -> Call:
        """Ask for the job's status, every time."""
        return Call("job_status", {"job": 1})

    def inspect(self, result: Result | None, step: Call | Finish) -> Evidence:
        """The job never progresses."""
        return Evidence(0, False)


def _path(cls: type[Agent]) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _limits(steps: int) -> dict[str, Any]:
    return {
        "deadline_ms": 3_600_000,
        "model_calls": steps + 10,
        "requests": steps + 10,
        "executions": steps + 10,
        "same": 2,
        "stagnant": 5,
        "polls": 20,
    }


# -- counting database work ----------------------------------------------------------------------

_VERB = re.compile(
    r"^\s*(SELECT|INSERT INTO|UPDATE|DELETE FROM|SAVEPOINT|RELEASE SAVEPOINT|"
    r"ROLLBACK TO SAVEPOINT)\b",
    re.IGNORECASE,
)
_PART = re.compile(r"(?<!DO )\b(UPDATE|INSERT INTO|DELETE FROM)\s+\"?(\w+)\"?", re.IGNORECASE)
_TABLE = re.compile(r'\b(?:FROM|INTO|UPDATE)\s+"?(\w+)"?', re.IGNORECASE)
_PACKAGES = (f"{os.sep}console{os.sep}", f"{os.sep}guard{os.sep}")
_ONE_OFF = frozenset({"_acquire", "_Driver._finish", "Guard._stop", "_Heartbeat.run"})


def statement_shape(text: str) -> str:
    """A statement without its columns and values: verb, main table, locking and conflicts."""
    flat = " ".join(text.split())
    if flat.upper().startswith("WITH "):
        # One statement of several parts: each part's verb and table, in order.
        parts = [
            f"{verb.split()[0].upper()} {table.removeprefix('console_')}"
            for verb, table in _PART.findall(flat)
        ]
        lock = " … FOR SHARE" if "FOR SHARE" in flat.upper() else ""
        return "WITH " + " + ".join(parts) + lock
    match = _VERB.match(flat)
    if match is None:
        return flat[:40]
    verb = match.group(1).upper()
    if "SAVEPOINT" in verb:
        return verb
    table = _TABLE.search(flat)
    shape = f"{verb} {table.group(1) if table else '?'}"
    upper = flat.upper()
    if verb == "SELECT" and upper.startswith("SELECT 1 AS"):
        shape = f"SELECT EXISTS {table.group(1) if table else '?'}"
    for clause in ("FOR SHARE", "FOR UPDATE", "ON CONFLICT", "RETURNING"):
        if clause in upper:
            shape += f" … {clause}"
    return shape


def _caller(frame: FrameType | None) -> tuple[str, str]:
    """Who sent a query: the innermost LoopGuard function and the driver's method above it.

    Also names the one-off it belongs to, if any: queries sent once per drive whatever its
    length, to take the lease, to finish (``Guard._stop`` reads back every operation the
    task touched, for its report) and to renew the lease from the heartbeat.
    """
    inner, driver, between = "", "", 0
    one_off = ""
    while frame is not None:
        code = frame.f_code
        package = next((p for p in _PACKAGES if p in code.co_filename), None)
        if package is not None:
            if not one_off and code.co_qualname in _ONE_OFF:
                one_off = code.co_qualname
            module = code.co_filename.rsplit(package, 1)[1].removesuffix(".py")
            name = f"{module.replace(os.sep, '.')}.{code.co_qualname}"
            if not inner:
                inner = name
            elif not driver and name.startswith("runner.") and name != inner:
                driver = name
            elif not driver:
                between += 1
        frame = frame.f_back
    if not driver:
        return inner or "?", one_off
    return f"{inner} {'← … ←' if between else '←'} {driver}", one_off


class QueryLog:
    """An ``execute_wrapper`` for every Django connection: counts queries and transactions.

    A query on a connection outside ``atomic`` is a transaction of its own; one inside
    ``atomic`` on an idle connection makes psycopg send ``BEGIN`` first, and that
    transaction later ends with a ``COMMIT``: two round trips the wrapper never sees.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.recording = False
        self.attribute = False
        self.queries = 0
        self.begins = 0
        self.autocommits = 0
        self.by_thread: Counter[str] = Counter()
        self.by_caller: Counter[tuple[str, str, str]] = Counter()

    def start(self, *, attribute: bool = False) -> None:
        """Reset the counts and record from now on."""
        with self._lock:
            self.queries = self.begins = self.autocommits = 0
            self.by_thread.clear()
            self.by_caller.clear()
            self.attribute = attribute
            self.recording = True

    def stop(self) -> None:
        """Stop recording; the counts stay."""
        self.recording = False

    @property
    def transactions(self) -> int:
        """Transactions this process committed (autocommit statements and atomic blocks)."""
        return self.begins + self.autocommits

    @property
    def round_trips(self) -> int:
        """Queries, plus a ``BEGIN`` and a ``COMMIT`` for every explicit transaction."""
        return self.queries + 2 * self.begins

    def __call__(
        self,
        execute: Callable[..., Any],
        sql_text: str,
        params: Any,
        many: bool,
        context: Mapping[str, Any],
    ) -> Any:
        """Count the statement, then run it."""
        if self.recording:
            raw = context["connection"].connection
            autocommit = bool(raw.autocommit)
            begins = not autocommit and raw.info.transaction_status == TransactionStatus.IDLE
            thread = threading.current_thread().name
            group = "heartbeat" if thread.startswith("lease-") else "driver"
            attributed: tuple[str, str, str] | None = None
            if self.attribute:
                where, one_off = _caller(sys._getframe(1))
                kind = _probe.kind
                if one_off:
                    kind, where = "one-off", f"{where}, in {one_off}"
                attributed = (kind, statement_shape(sql_text), where)
            with self._lock:
                self.queries += 1
                self.begins += begins
                self.autocommits += autocommit
                self.by_thread[group] += 1
                if attributed is not None:
                    self.by_caller[attributed] += 1
        return execute(sql_text, params, many, context)


def install(log: QueryLog) -> None:
    """Put ``log`` on this thread's connection and on every connection opened from now on."""
    from django.db import connections
    from django.db.backends.base.base import BaseDatabaseWrapper
    from django.db.backends.signals import connection_created

    def add(wrapper: BaseDatabaseWrapper) -> None:
        if not any(w is log for w in wrapper.execute_wrappers):
            wrapper.execute_wrappers.append(log)

    def on_connect(sender: Any, connection: BaseDatabaseWrapper, **kwargs: Any) -> None:
        add(connection)

    connection_created.connect(on_connect, weak=False)
    for wrapper in connections.all():
        add(wrapper)


class ServerStats:
    """``xact_commit`` of the benchmark database, and the server's WAL flushes
    (``pg_stat_wal.wal_sync``: commits that waited for the disk, and the WAL writer's own
    flushes), read from a session on another database.

    The reader sits in ``postgres`` so that its own statements never count. A backend
    flushes its statistics at most once a second while alive and always when it exits,
    so callers close their connections first and the reader waits for the value to settle.
    """

    def __init__(self, server: str, database: str) -> None:
        self._conn = psycopg.connect(f"{server}/postgres", autocommit=True)
        self._database = database

    def _read(self) -> tuple[int, int]:
        self._conn.execute("SELECT pg_stat_clear_snapshot()")
        row = self._conn.execute(
            "SELECT xact_commit, (SELECT wal_sync FROM pg_stat_wal) FROM pg_stat_database"
            " WHERE datname = %s",
            [self._database],
        ).fetchone()
        if row is None:
            raise RuntimeError(f"no statistics for database {self._database}")
        return int(row[0]), int(row[1])

    def commits(self) -> tuple[int, int]:
        """The settled commit and WAL flush counts (unchanged over 100 ms; at most 5 s)."""
        last = self._read()
        for _ in range(50):
            time.sleep(0.1)
            now = self._read()
            if now == last:
                return now
            last = now
        return last

    def close(self) -> None:
        """Close the reader's session."""
        self._conn.close()


# -- the runs --------------------------------------------------------------------------------------


@dataclass
class Run:
    """One measured run: how long it took and what it asked of the database."""

    steps: int
    seconds: float
    queries: int
    round_trips: int
    transactions: int
    server_commits: int
    disk_flushes: int
    cpu_seconds: float
    heartbeat_queries: int = 0
    step_seconds: list[float] = field(default_factory=list)

    @property
    def rate(self) -> float:
        """Steps per second."""
        return self.steps / self.seconds


def _no_enqueue(task_id: int) -> None:
    """The benchmark drives its tasks itself."""


def guarded(url: str, steps: int, log: QueryLog, stats: ServerStats, *, attribute: bool) -> Run:
    """Drive one task of ``steps`` steps in this thread; counts cover ``drive`` only."""
    from django.db import connections

    from console.runner import drive
    from console.services import task_start

    run_id = uuid.uuid4().hex[:12]
    task = task_start(
        agent=MIX_AGENT,
        input={"steps": steps, "run": run_id},
        limits=_limits(steps),
        enqueue=_no_enqueue,
    )
    task_id = int(task.pk)
    connections.close_all()  # the drive opens its own connection, as the raw loop does
    before = stats.commits()
    _probe.plan_times.clear()
    _probe.kind = "read"
    log.start(attribute=attribute)
    cpu, started = time.process_time(), time.perf_counter()
    outcome = drive(task_id)
    seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    log.stop()
    connections.close_all()
    after = stats.commits()
    if outcome != "COMPLETED/goal_met":
        raise SystemExit(f"the guarded run ended {outcome}, not COMPLETED/goal_met")
    with psycopg.connect(url, autocommit=True) as check:
        row = check.execute(
            "SELECT count(*) FROM desk_notice WHERE idempotency_key LIKE %s",
            [f"bench-{run_id}-notice-%"],
        ).fetchone()
    if row is None or row[0] != steps // 2:
        raise SystemExit(f"the guarded run sent {row} notices, expected {steps // 2}")
    times = _probe.plan_times
    return Run(
        steps=steps,
        seconds=seconds,
        queries=log.queries,
        round_trips=log.round_trips,
        transactions=log.transactions,
        server_commits=after[0] - before[0],
        disk_flushes=after[1] - before[1],
        cpu_seconds=cpu,
        heartbeat_queries=log.by_thread["heartbeat"],
        step_seconds=[b - a for a, b in itertools.pairwise(times)],
    )


_RAW_CLAIM = """
INSERT INTO bench_ledger (key, fingerprint, state, attempts, result, updated_at)
VALUES (%s, %s, 'IN_FLIGHT', 1, NULL, now())
ON CONFLICT (key) DO UPDATE
    SET state = 'IN_FLIGHT', attempts = bench_ledger.attempts + 1, result = NULL,
        updated_at = now()
    WHERE bench_ledger.state = 'NOT_COMMITTED'
      AND bench_ledger.fingerprint = EXCLUDED.fingerprint
RETURNING attempts
"""
_RAW_RECORD = """
UPDATE bench_ledger SET state = 'COMMITTED', result = %s, updated_at = now()
WHERE key = %s AND state = 'IN_FLIGHT'
"""
_RAW_READ = "SELECT number, items FROM desk_page WHERE collection = %s AND number = %s"
_RAW_SEND = """
INSERT INTO desk_notice (order_id, recipient, text, idempotency_key, created_at)
VALUES (NULL, %s, %s, %s, now())
RETURNING id
"""


_RAW_STEP = "UPDATE bench_progress SET step = %s, state = %s WHERE id = 1"


def raw(url: str, steps: int, stats: ServerStats, *, step_commit: bool = False) -> Run:
    """The same business work, claims and commits with bare psycopg, autocommit.

    ``step_commit``: the reference loop that could resume after a crash, which also
    commits each step before the next (``_RAW_STEP``: its number and its last result,
    one row, synchronous), as the guarded loop must.
    """
    run_id = uuid.uuid4().hex[:12]
    before = stats.commits()
    queries = 0
    cpu, started = time.process_time(), time.perf_counter()
    with psycopg.connect(url, autocommit=True) as conn:
        for n in range(1, steps + 1):
            if n % 2:
                page = conn.execute(_RAW_READ, [COLLECTION, (n + 1) // 2]).fetchone()
                queries += 1
                if page is None:
                    raise SystemExit(f"page {(n + 1) // 2} is missing")
                outcome: dict[str, Any] = {"page": page[0], "items": page[1]}
            else:
                key, text = f"raw-{run_id}-notice-{n}", f"benchmark notice {n}"
                fingerprint = hashlib.sha256(f"send_notice\x00{text}".encode()).hexdigest()
                if conn.execute(_RAW_CLAIM, [key, fingerprint]).fetchone() is None:
                    raise SystemExit(f"{key} could not be claimed")
                sent = conn.execute(_RAW_SEND, ["ops@example.com", text, key]).fetchone()
                if sent is None:
                    raise SystemExit(f"{key} was not sent")
                outcome = {"notice": sent[0]}
                conn.execute(_RAW_RECORD, [Jsonb({"kind": "SUCCESS", "data": outcome}), key])
                queries += 3
            if step_commit:
                conn.execute(_RAW_STEP, [n, Jsonb({"step": n, "observation": outcome})])
                queries += 1
    seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    after = stats.commits()
    # Autocommit: every statement is one round trip and one transaction. (psycopg also
    # prepares each statement after its 5th use, one extra round trip apiece.)
    commits, flushes = after[0] - before[0], after[1] - before[1]
    return Run(steps, seconds, queries, queries, queries, commits, flushes, cpu)


def stop_latencies(url: str, rounds: int) -> list[float]:
    """Seconds from ``task_stop`` to a ``CANCELLED`` row, for drivers waiting on a job."""
    from django.contrib.auth.models import User

    from console.runner import STOP_POLL_S
    from console.services import task_start, task_stop

    actor = User.objects.create_user(f"bench-{uuid.uuid4().hex[:8]}")
    latencies: list[float] = []
    with psycopg.connect(url, autocommit=True) as observer:
        for i in range(rounds):
            task = task_start(
                agent=WAIT_AGENT,
                input={"wait_ms": 600_000, "round": i, "run": uuid.uuid4().hex},
                limits=_limits(10),
                enqueue=_no_enqueue,
            )
            task_id = int(task.pk)
            driver = threading.Thread(
                target=_drive_and_close, args=(task_id,), name=f"bench-waiter-{i}", daemon=True
            )
            driver.start()
            _poll(
                observer,
                "SELECT 1 FROM console_traceevent WHERE task_id = %s AND kind = 'wait'",
                [task_id],
                what=f"task {task_id} to start waiting",
            )
            # Spread the stops over the driver's polling interval rather than always
            # landing at the same point of it.
            time.sleep(0.05 + STOP_POLL_S * (i + 0.5) / rounds)
            started = time.perf_counter()
            task_stop(task_id=task_id, actor=actor, reason="benchmark: stop latency")
            _poll(
                observer,
                "SELECT 1 FROM console_task WHERE id = %s AND state = 'CANCELLED'",
                [task_id],
                what=f"task {task_id} to be CANCELLED",
            )
            latencies.append(time.perf_counter() - started)
            driver.join(timeout=10)
    return latencies


def _drive_and_close(task_id: int) -> None:
    """Drive a task in a thread of its own, closing the thread's connection afterwards."""
    from django.db import connection

    from console.runner import drive

    try:
        drive(task_id)
    finally:
        connection.close()


def _poll(conn: psycopg.Connection[Any], query: str, params: Sequence[Any], *, what: str) -> None:
    deadline = time.monotonic() + 30
    while conn.execute(query, params).fetchone() is None:
        if time.monotonic() > deadline:
            raise SystemExit(f"gave up waiting for {what}")
        time.sleep(0.002)


# -- the database ---------------------------------------------------------------------------------


def recreate(server: str, database: str) -> None:
    """Drop ``database`` if it exists (closing its sessions) and create it empty."""
    with psycopg.connect(f"{server}/postgres", autocommit=True) as admin:
        name = sql.Identifier(database)
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(name))
        admin.execute(sql.SQL("CREATE DATABASE {}").format(name))


def drop(server: str, database: str) -> None:
    """Drop ``database``, closing whatever sessions are left on it."""
    with psycopg.connect(f"{server}/postgres", autocommit=True) as admin:
        name = sql.Identifier(database)
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(name))


def prepare(url: str, pages: int) -> None:
    """Seed the pages both sides read and create the raw loop's ledger table."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            """
            INSERT INTO desk_page (collection, number, items)
            SELECT %s, n, jsonb_build_array(
                jsonb_build_object('id', %s || '-' || n || '-1', 'line', n * 3 - 2),
                jsonb_build_object('id', %s || '-' || n || '-2', 'line', n * 3 - 1),
                jsonb_build_object('id', %s || '-' || n || '-3', 'line', n * 3))
            FROM generate_series(1, %s) AS n
            """,
            [COLLECTION, COLLECTION, COLLECTION, COLLECTION, pages],
        )
        conn.execute(
            """
            CREATE TABLE bench_progress (id integer PRIMARY KEY, step integer, state jsonb)
            """
        )
        conn.execute("INSERT INTO bench_progress VALUES (1, 0, NULL)")
        conn.execute(
            """
            CREATE TABLE bench_ledger (
                key text PRIMARY KEY,
                fingerprint text NOT NULL,
                state text NOT NULL,
                attempts integer NOT NULL,
                result jsonb,
                updated_at timestamptz NOT NULL
            )
            """
        )


def server_facts(url: str) -> dict[str, str]:
    """Server version and the settings that decide what a commit costs."""
    with psycopg.connect(url, autocommit=True) as conn:
        facts = {}
        for name in ("server_version", "synchronous_commit", "fsync"):
            row = conn.execute(sql.SQL("SHOW {}").format(sql.Identifier(name))).fetchone()
            facts[name] = "?" if row is None else str(row[0])
        return facts


@dataclass(frozen=True)
class TaskRowFacts:
    """What the runs did to ``console_task``: checkpoint size and how its rows were updated."""

    checkpoint_bytes: int
    updates: int
    hot_updates: int


def task_row_facts(url: str) -> TaskRowFacts:
    """The largest checkpoint a benchmark task left, and the table's (HOT) update counts."""
    with psycopg.connect(url, autocommit=True) as conn:
        size = conn.execute(
            "SELECT max(octet_length(checkpoint::text)) FROM console_task WHERE agent = %s",
            [MIX_AGENT],
        ).fetchone()
        updates = conn.execute(
            "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables"
            " WHERE relname = 'console_task'"
        ).fetchone()
    return TaskRowFacts(
        checkpoint_bytes=0 if size is None or size[0] is None else int(size[0]),
        updates=0 if updates is None else int(updates[0]),
        hot_updates=0 if updates is None else int(updates[1]),
    )


# -- the report -----------------------------------------------------------------------------------


def _median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def _segment_ms(runs: Sequence[Run]) -> tuple[float, float]:
    """Median ms per step over the first and the last quarter of the guarded runs' steps."""
    first: list[float] = []
    last: list[float] = []
    for run in runs:
        quarter = max(1, len(run.step_seconds) // 4)
        first.extend(run.step_seconds[:quarter])
        last.extend(run.step_seconds[-quarter:])
    return _median(first) * 1000, _median(last) * 1000


def print_report(
    facts: Mapping[str, str],
    steps: int,
    rounds: int,
    sides: Mapping[str, Sequence[Run]],
    stops: Sequence[float],
    task_rows: TaskRowFacts,
) -> None:
    """The summary table: one column per side, guarded first, then the ratios."""
    rates = {name: _median([r.rate for r in runs]) for name, runs in sides.items()}
    total = rounds * steps

    def per_step(value: Callable[[Run], float], scale: float = 1.0) -> list[str]:
        return [f"{sum(value(r) for r in runs) / total * scale:.2f}" for runs in sides.values()]

    guarded_runs = sides["guarded"]
    first, last = _segment_ms(guarded_runs)
    heartbeat = sum(r.heartbeat_queries for r in guarded_runs)
    stop_median, stop_max = _median(stops), max(stops)
    rows = [
        ("steps/s (median of runs)", [f"{rate:.1f}" for rate in rates.values()]),
        ("ms/step", [f"{1000 / rate:.2f}" for rate in rates.values()]),
        ("CPU ms/step in this process", per_step(lambda r: r.cpu_seconds, 1000)),
        ("queries/step (execute_wrapper)", per_step(lambda r: r.queries)),
        ("round trips/step (+BEGIN/COMMIT)", per_step(lambda r: r.round_trips)),
        ("transactions/step (client side)", per_step(lambda r: r.transactions)),
        ("commits/step (server xact_commit)", per_step(lambda r: r.server_commits)),
        ("WAL flushes/step (pg_stat_wal)", per_step(lambda r: r.disk_flushes)),
    ]
    stop_met = "met" if stop_max < 1.0 else "NOT met"
    print(
        f"python {sys.version.split()[0]}; PostgreSQL {facts['server_version']} "
        f"(fsync={facts['fsync']}, synchronous_commit={facts['synchronous_commit']}); "
        f"{steps} steps per run ({(steps + 1) // 2} page reads, {steps // 2} notice sends); "
        f"{rounds} run(s) per side"
    )
    print(f"{'':<36}" + "".join(f" {name:>20}" for name in sides))
    for label, values in rows:
        print(f"{label:<36}" + "".join(f" {value:>20}" for value in values))
    for name, rate in rates.items():
        if name == "guarded":
            continue
        ratio = rates["guarded"] / rate
        target = f" (target ≥ 0.5x: {'met' if ratio >= 0.5 else 'NOT met'})" if name == RAW else ""
        print(f"ratio guarded / {name}: {ratio:.2f}x{target}")
    print(
        f"guarded ms/step, first vs last quarter of a run: {first:.2f} → {last:.2f} "
        f"(the checkpoint grows to {task_rows.checkpoint_bytes / 1024:.1f} KiB of JSON)"
    )
    print(
        f"console_task updates: {task_rows.updates}, of which HOT: {task_rows.hot_updates} "
        "(a non-HOT update rewrites every index on the row)"
    )
    print(
        f"heartbeat queries in the guarded runs: {heartbeat} "
        "(counted above; one lease renewal every LOOPGUARD_LEASE_SECONDS / 3)"
    )
    print(
        f"stop latency over {len(stops)} stops: median {stop_median * 1000:.0f} ms, "
        f"max {stop_max * 1000:.0f} ms (target < 1 s: {stop_met})"
    )


def print_breakdown(log: QueryLog, steps: int) -> None:
    """Queries per read and per write step, by statement shape and the code that sent them."""
    reads, writes = (steps + 1) // 2, steps // 2
    print(
        f"\nwhere the guarded queries go ({steps}-step attributed run; a step's first "
        "cancel check and save run before its plan, so they are counted on the step before):"
    )
    print(f"{'read':>5} {'write':>6}  {'statement':<82} sent by")
    rows: dict[tuple[str, str], dict[str, int]] = {}
    for (kind, shape, where), count in log.by_caller.items():
        rows.setdefault((shape, where), {})[kind] = count
    totals = {"read": 0.0, "write": 0.0}

    def order(item: tuple[tuple[str, str], dict[str, int]]) -> tuple[str, str]:
        return item[0][1], item[0][0]

    one_offs: list[str] = []
    for (shape, where), kinds in sorted(rows.items(), key=order):
        r, w = kinds.get("read", 0) / reads, kinds.get("write", 0) / writes
        totals["read"] += r
        totals["write"] += w
        if r or w:
            print(f"{r:>5.2f} {w:>6.2f}  {shape:<82} {where}")
        if kinds.get("one-off"):
            one_offs.append(f"{kinds['one-off']} x {shape} ({where})")
    print(f"{totals['read']:>5.2f} {totals['write']:>6.2f}  total queries per step")
    if one_offs:
        print("once per drive (lease, finish, heartbeat): " + "; ".join(one_offs))


# -- main -----------------------------------------------------------------------------------------


def main(argv: list[str]) -> int:
    """Create the database, measure both sides and stop latency, print, drop the database."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--steps", type=int, default=None, help="steps per run (default 400)")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 60 steps, one run")
    options = parser.parse_args(argv)
    steps = options.steps if options.steps is not None else (60 if options.quick else 400)
    if steps < 2:
        parser.error("--steps must be at least 2")
    rounds = 1 if options.quick else 3
    url = f"{SERVER}/{DATABASE}"

    recreate(SERVER, DATABASE)
    try:
        os.environ["DJANGO_SETTINGS_MODULE"] = "console.project.settings"
        os.environ["DATABASE_URL"] = url
        import django
        from django.conf import settings
        from django.core.management import call_command
        from django.db import connections

        django.setup()
        # As in production: with DEBUG on, Django also records and formats every query,
        # which costs the driver more than the database does.
        settings.DEBUG = False
        logging.getLogger("console").setLevel(logging.WARNING)  # one line per task otherwise
        settings.LOOPGUARD_AGENTS = {
            **settings.LOOPGUARD_AGENTS,
            MIX_AGENT: _path(ReadWriteMix),
            WAIT_AGENT: _path(Waiter),
        }
        call_command("migrate", verbosity=0)
        prepare(url, max(steps, PROFILE_STEPS) // 2 + 1)
        facts = server_facts(url)
        log = QueryLog()
        install(log)
        stats = ServerStats(SERVER, DATABASE)
        try:
            # Warm both sides up (imports, caches, psycopg's prepared statements) unmeasured.
            guarded(url, 20, log, stats, attribute=False)
            raw(url, 20, stats)
            raw(url, 20, stats, step_commit=True)
            sides: dict[str, list[Run]] = {"guarded": [], RAW: [], RAW_STEP_COMMIT: []}
            for _ in range(rounds):  # interleaved, so that a noisy spell hits every side
                sides[RAW].append(raw(url, steps, stats))
                sides["guarded"].append(guarded(url, steps, log, stats, attribute=False))
                sides[RAW_STEP_COMMIT].append(raw(url, steps, stats, step_commit=True))
            profile_steps = min(steps, PROFILE_STEPS)
            guarded(url, profile_steps, log, stats, attribute=True)
            stops = stop_latencies(url, STOP_ROUNDS)
        finally:
            stats.close()
            connections.close_all()
        print_report(facts, steps, rounds, sides, stops, task_row_facts(url))
        print_breakdown(log, profile_steps)
    finally:
        drop(SERVER, DATABASE)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
