"""Guarded steps per second on PostgreSQL, against a raw loop of the same durability and DBOS.

Run: ``.venv/bin/python benchmarks/runner_throughput.py [--steps N] [--rounds N] [--quick]
[--grown DATABASE]`` (``--help`` says what every column and row means).

With ``--grown``, the guarded side also runs (1 worker, in the same rounds) in an existing
console database of the size a deployment reaches, e.g. the million tasks and ten million
trace events ``console_pages.py --keep`` leaves: whether the step stays as fast once the
tables have grown (issue 23: the trace partitioned, the history indexed).

One *step* is one model call and one tool request; steps alternate between reading a desk
page and sending a desk notice with its own operation key. Every side below does that same
mix, and every side's business statements are the same text (``_RAW_READ``, ``_RAW_SEND``):

- **guarded**: ``console.drivers.runner.drive`` driving one task in the worker process (no Celery),
  persisting every step as it does in a Celery worker.
- **(a) raw + step commit**: the yardstick. A bare psycopg loop on an autocommit connection;
  for each write the same claim and record on a bare ledger table of its own (one
  ``INSERT … ON CONFLICT … DO UPDATE … WHERE … RETURNING`` to claim, one ``UPDATE … SET
  state = 'COMMITTED'`` to record), and after every step one synchronous commit of its number
  and last result (``_RAW_STEP``): the least a hand-written loop must commit to resume after
  a crash, which the guarded loop must do too (with its trace events and counters).
- **raw, no step commit**: the same loop without ``_RAW_STEP``, for reference only: it is not
  durable, so it judges nothing (the old ≥ 0.5x target against it is withdrawn).
- **DBOS**: a DBOS Transact workflow (the optional ``bench`` extra) of the same mix, each
  step a durable DBOS step: the read is a ``DBOS.step`` running ``_RAW_READ`` on a psycopg
  connection of its own; the write is a transaction of a DBOS ``SQLAlchemyDatasource``
  on the benchmark database (READ COMMITTED, as the guarded side), which sends the notice
  and records the step's output in the same transaction, so a recovered workflow never sends
  it twice. What differs: DBOS's idempotency is the workflow id and the step's number, not an
  operation key in a ledger; it has no budgets, no loop detection, no stop fact and no trace;
  its write runs the same statement text through SQLAlchemy (DBOS has no transactional step on
  a bare psycopg connection); it starts its workflow inside the timed window (the guarded
  task is created before it). Without the ``dbos`` package the column is skipped with a note.

Each side runs at 1, 2 and 4 workers: separate processes (started once, each with Django set
up, its own connections and, with DBOS, its own executor), each driving its own task or
workflow of ``--steps`` steps, all released at once; steps/s is all workers' steps over the
wall time from the release to the last worker's end. Sides are interleaved round by round so
that a noisy spell hits each. Connections are opened and warm before the timed window.

Database work per step is counted twice over. Client side, an ``execute_wrapper`` on every
Django connection (the lease heartbeat's thread included), a SQLAlchemy ``before_cursor_
execute`` listener on every DBOS engine, and a count in the raw loops give statements; round
trips add a ``BEGIN`` and a ``COMMIT`` for every explicit transaction. Server side, the delta
of ``pg_stat_database.xact_commit`` over the benchmark database and DBOS's system database
counts commits (every autocommit statement, reads included, is a transaction of its own
there), and ``pg_stat_wal.wal_sync`` counts WAL flushes (server-wide: another database's
traffic during the run counts too).

CPU per step: client, each worker process's own CPU time (all its threads: the heartbeat,
DBOS's background threads) over the window; server, the CPU time (``/proc/<pid>/schedstat``)
of the PostgreSQL backends serving that process's connections over the window (read before
the connections close; the WAL writer, checkpointer and autovacuum are not in it). When the
server is not on this machine the server column reads n/a.

Stop latency is the time from calling ``console.services.task_stop`` on a task whose driver
is waiting on a ``PENDING`` result until its row reads ``CANCELLED``.

The server is ``DATABASE_URL``'s (default ``postgres://postgres@127.0.0.1:5432/loopguard``);
the benchmark works in a database of its own there, ``<name>_throughput`` (and DBOS's system
database ``<name>_throughput_dbos``), created afresh and migrated at the start and dropped at
the end: the database ``DATABASE_URL`` names is never touched. Nothing fails on a missed
target; the numbers are printed.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib
import importlib.util
import itertools
import logging
import multiprocessing
import os
import re
import statistics
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from types import FrameType
from typing import Any
from urllib.parse import urlsplit, urlunsplit

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psycopg
from psycopg import sql
from psycopg.pq import TransactionStatus
from psycopg.types.json import Jsonb

from console.agents.base import Agent, Tool
from guard import Call, Evidence, Finish, Kind, Result, Settlement

DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/loopguard"
COLLECTION = "bench"
MIX_AGENT = "bench_read_write"
WAIT_AGENT = "bench_waiter"
GUARDED = "guarded"
GROWN = "guarded, grown db"
RAW_STEP_COMMIT = "(a) raw+step commit"
RAW = "raw, no step commit"
DBOS = "DBOS"
SIDES = (GUARDED, GROWN, RAW_STEP_COMMIT, RAW, DBOS)
SHORT = {RAW_STEP_COMMIT: "(a)", DBOS: DBOS}
WORKERS = (1, 2, 4)
STOP_ROUNDS = 5
PROFILE_STEPS = 40  # steps in the attributed run that breaks queries down by caller
DBOS_TARGET = 3.0
"""Issue 20: the guarded step at least this many times DBOS's rate, at every worker count.
(Issue 9's 0.75x against (a) is withdrawn: ``benchmarks/statement_ceiling.py`` showed the
replay of the step's own statements reaches only ~0.73x of (a); its target is there.)"""

COLUMNS = f"""\
sides (columns):
  {GUARDED:<22}console.drivers.runner.drive over one task per worker, every step persisted
  {GROWN:<22}(with --grown DATABASE) the same, 1 worker, in that existing database
  {RAW_STEP_COMMIT:<22}the yardstick: bare psycopg, ledger claim + record per write, and
  {"":<22}one synchronous commit of the step per step (same durability)
  {RAW:<22}the same loop without the step commit: not durable, reference only
  {DBOS:<22}a DBOS Transact workflow: read = DBOS.step, write = datasource
  {"":<22}transaction (notice + step output in one commit); needs the bench extra

rows, for each number of workers (separate processes, released together):
  steps/s                all workers' steps / wall time (median of the rounds)
  ms/step                wall time / steps of one worker: one step as a worker sees it
                         (median of the rounds)
  client CPU ms/step     the worker processes' CPU time (all threads) / steps
  server CPU ms/step     CPU time of the PostgreSQL backends serving the workers'
                         connections (/proc/<pid>/schedstat) / steps; n/a off this machine
  statements/step        statements the client sent (execute_wrapper, SQLAlchemy listener,
                         raw counts), the heartbeat's and DBOS's background threads' included
  round trips/step       statements + a BEGIN and a COMMIT per explicit transaction
  commits/step           pg_stat_database.xact_commit delta, benchmark database (+ DBOS's
                         system database, less its executors' idle polling, for DBOS)
  WAL flushes/step       pg_stat_wal.wal_sync delta (server-wide, so other traffic counts)
  guarded / (a), guarded / DBOS   ratio of steps/s (> 1: guarded is faster), then
                         the CPU ms/step (client + server) of each side

Every number moves with the machine's load (printed): on a shared machine, compare the
sides of one run, not one run with another.
"""

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
        from console.store.statements import fetch_one  # the store's package needs Django

        page = fetch_one(_RAW_READ, [call.args["collection"], call.args["number"]])
        if page is None:
            return Result(Kind.FATAL, {"missing": call.args["number"]})
        return Result(Kind.SUCCESS, {"page": page[0], "items": page[1]})

    def _send(self, call: Call) -> Result:
        from console.store.statements import fetch_one

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
# Taking the lease was ``_acquire`` in the runner; the task lifecycle's ``start_drive`` now.
_ONE_OFF = frozenset(
    {"BaseStore.take_lease", "start_drive", "_Driver._finish", "Ending.stop", "Heartbeat.run"}
)


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
    length, to take the lease, to finish (``Ending.stop`` reads back every operation the
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
            elif not driver and name.startswith("drivers.runner.") and name != inner:
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
        self.backends: set[int] = set()  # the PostgreSQL backends of every connection

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
    """Put ``log`` on this thread's connection and on every connection opened from now on.

    Also notes each connection's backend, whose CPU time the run is charged.
    """
    from django.db import connections
    from django.db.backends.base.base import BaseDatabaseWrapper
    from django.db.backends.signals import connection_created

    def add(wrapper: BaseDatabaseWrapper) -> None:
        if not any(w is log for w in wrapper.execute_wrappers):
            wrapper.execute_wrappers.append(log)
        if wrapper.connection is not None:
            log.backends.add(int(wrapper.connection.info.backend_pid))

    def on_connect(sender: Any, connection: BaseDatabaseWrapper, **kwargs: Any) -> None:
        add(connection)

    connection_created.connect(on_connect, weak=False)
    for wrapper in connections.all():
        add(wrapper)


def backend_cpu(pid: int) -> float | None:
    """CPU seconds a PostgreSQL backend on this machine has used (None: not ours to see)."""
    try:
        with open(f"/proc/{pid}/comm") as comm:
            if comm.read().strip() != "postgres":
                return None
        with open(f"/proc/{pid}/schedstat") as schedstat:
            return int(schedstat.read().split()[0]) / 1e9
    except (OSError, ValueError, IndexError):
        return None


class BackendClock:
    """The CPU time of the backends serving a process's connections, over a window.

    A backend that connects inside the window started from nothing (a fork of the
    postmaster); one that disconnects inside it is lost, and counted in ``lost``.
    """

    def __init__(self, backends: set[int]) -> None:
        self._backends = backends
        self._start: dict[int, float] = {}
        self._known: set[int] = set()

    def start(self) -> None:
        """Read every known backend's CPU time now."""
        self._known = set(self._backends)
        self._start = {}
        for pid in self._known:
            cpu = backend_cpu(pid)
            if cpu is not None:
                self._start[pid] = cpu

    def stop(self) -> tuple[float | None, int]:
        """CPU seconds since ``start`` and how many backends went unread (None: none read)."""
        total, read, lost = 0.0, 0, 0
        for pid in set(self._backends):
            if pid in self._known and pid not in self._start:
                continue  # gone (or not on this machine) before the window
            cpu = backend_cpu(pid)
            if cpu is None:
                lost += 1
                continue
            total += cpu - self._start.get(pid, 0.0)
            read += 1
        return (total if read else None), lost


@dataclass(frozen=True)
class Counts:
    """The server's counters at one moment (see ``ServerStats``)."""

    commits: int = 0
    system_commits: int = 0
    wal_flushes: int = 0
    idle_rate: float = 0.0  # commits a second in DBOS's system database, nothing running
    at: float = 0.0  # time.monotonic() of the reading


class ServerStats:
    """``xact_commit`` of the benchmark's databases, and the server's WAL flushes
    (``pg_stat_wal.wal_sync``: commits that waited for the disk, and the WAL writer's own
    flushes), read from a session on another database (``postgres``).

    The reader sits elsewhere so that its own statements never count. A backend
    flushes its statistics at most once a second while alive (and within a second of going
    idle), so the reader waits for the values to hold still for longer than that.
    """

    SETTLED_S = 1.2

    def __init__(self, server_url: str, database: str, system_database: str) -> None:
        self._conn = psycopg.connect(server_url, autocommit=True)
        self._database = database
        self._system_database = system_database

    def _read(self) -> tuple[int, int, int]:
        self._conn.execute("SELECT pg_stat_clear_snapshot()")
        row = self._conn.execute(
            "SELECT coalesce(sum(xact_commit) FILTER (WHERE datname = %s), 0),"
            " coalesce(sum(xact_commit) FILTER (WHERE datname = %s), 0),"
            " (SELECT wal_sync FROM pg_stat_wal) FROM pg_stat_database",
            [self._database, self._system_database],
        ).fetchone()
        if row is None:
            raise RuntimeError("no statistics from pg_stat_database")
        return int(row[0]), int(row[1]), int(row[2])

    def commits(self) -> Counts:
        """Commits in the benchmark database once settled (unchanged for SETTLED_S, at most
        8 s), then in DBOS's system database and the server's WAL flushes as they are: an
        idle DBOS executor polls its queues several times a second, so those never settle;
        how fast the system database's count rose meanwhile is ``idle_rate``."""
        first = last = self._read()
        began = since = time.monotonic()
        while since < began + 8:
            time.sleep(0.1)
            reading = self._read()
            if reading[0] != last[0]:
                since = time.monotonic()
            last = reading
            if time.monotonic() - since >= self.SETTLED_S:
                break
        at = time.monotonic()
        return Counts(last[0], last[1], last[2], (last[1] - first[1]) / (at - began), at)

    def close(self) -> None:
        """Close the reader's session."""
        self._conn.close()


# -- the runs --------------------------------------------------------------------------------------


@dataclass
class WorkerRun:
    """What one worker process did in one timed window."""

    steps: int
    started: float  # time.perf_counter(): CLOCK_MONOTONIC, the same in every process
    finished: float
    cpu_seconds: float
    server_cpu_seconds: float | None
    lost_backends: int
    statements: int
    round_trips: int
    background_statements: int = 0  # the heartbeat's, or DBOS's own threads'
    step_seconds: list[float] = field(default_factory=list)


@dataclass
class Run:
    """One measured run of one side at some number of workers, all workers summed."""

    workers: int
    steps: int  # all workers' steps
    seconds: float  # from the first worker's release to the last one's end
    statements: int
    round_trips: int
    server_commits: int
    disk_flushes: int
    cpu_seconds: float
    server_cpu_seconds: float | None
    lost_backends: int
    background_statements: int
    step_seconds: list[float] = field(default_factory=list)

    @property
    def rate(self) -> float:
        """Steps per second, all workers together."""
        return self.steps / self.seconds

    @property
    def ms_per_step(self) -> float:
        """Milliseconds one step takes as one worker sees it."""
        return 1000 * self.seconds * self.workers / self.steps


def _no_enqueue(task_id: int) -> None:
    """The benchmark drives its tasks itself."""


Window = Callable[[], WorkerRun]  # a prepared run: call it to run the timed part


def _timed(
    steps: int,
    clock: BackendClock,
    work: Callable[[], tuple[int, int, int]],
) -> WorkerRun:
    """Run ``work`` (which returns statements, round trips, background statements) timed."""
    clock.start()
    cpu, started = time.process_time(), time.perf_counter()
    statements, round_trips, background = work()
    finished, cpu = time.perf_counter(), time.process_time() - cpu
    server_cpu, lost = clock.stop()
    return WorkerRun(
        steps=steps,
        started=started,
        finished=finished,
        cpu_seconds=cpu,
        server_cpu_seconds=server_cpu,
        lost_backends=lost,
        statements=statements,
        round_trips=round_trips,
        background_statements=background,
    )


def prepare_guarded(url: str, steps: int, log: QueryLog, *, attribute: bool = False) -> Window:
    """A task of ``steps`` steps, created and ready to drive; the window covers ``drive``."""
    from django.db import connection, connections

    from console.drivers.runner import drive
    from console.services import task_start

    run_id = uuid.uuid4().hex[:12]
    task = task_start(
        agent=MIX_AGENT,
        input={"steps": steps, "run": run_id},
        limits=_limits(steps),
        enqueue=_no_enqueue,
    )
    task_id = int(task.pk)
    # The driver's connection: opened before the window, its backend known. A new one,
    # as for (a) and DBOS: a backend sends its first statistics at once, and all of them
    # when it exits, so closing it after the window makes the server's counts exact.
    connections.close_all()
    connection.ensure_connection()
    clock = BackendClock(log.backends)

    def work() -> tuple[int, int, int]:
        _probe.plan_times.clear()
        _probe.kind = "read"
        log.start(attribute=attribute)
        outcome = drive(task_id)
        log.stop()
        if outcome != "COMPLETED/goal_met":
            raise SystemExit(f"the guarded run ended {outcome}, not COMPLETED/goal_met")
        return log.queries, log.round_trips, log.by_thread["heartbeat"]

    def window() -> WorkerRun:
        run = _timed(steps, clock, work)
        connections.close_all()
        with psycopg.connect(url, autocommit=True) as check:
            row = check.execute(
                "SELECT count(*) FROM desk_notice WHERE idempotency_key LIKE %s",
                [f"bench-{run_id}-notice-%"],
            ).fetchone()
        if row is None or row[0] != steps // 2:
            raise SystemExit(f"the guarded run sent {row} notices, expected {steps // 2}")
        run.step_seconds = [b - a for a, b in itertools.pairwise(_probe.plan_times)]
        return run

    return window


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
_RAW_STEP = "UPDATE bench_progress SET step = %s, state = %s WHERE id = %s"


def prepare_raw(url: str, steps: int, worker: int, *, step_commit: bool) -> Window:
    """The same business work, claims and commits with bare psycopg, autocommit.

    ``step_commit``: the reference loop that could resume after a crash, which also
    commits each step before the next (``_RAW_STEP``: its number and its last result,
    one row per worker, synchronous), as the guarded loop must.
    """
    run_id = uuid.uuid4().hex[:12]
    conn = psycopg.connect(url, autocommit=True)  # closed after the window, see guarded
    clock = BackendClock({int(conn.info.backend_pid)})

    def work() -> tuple[int, int, int]:
        queries = 0
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
                step = Jsonb({"step": n, "observation": outcome})
                conn.execute(_RAW_STEP, [n, step, worker + 1])
                queries += 1
        # Autocommit: every statement is one round trip and one transaction. (psycopg also
        # prepares each statement after its 5th use on a connection, once.)
        return queries, queries, 0

    def window() -> WorkerRun:
        try:
            return _timed(steps, clock, work)
        finally:
            conn.close()

    return window


class DbosWorkflow:
    """The peer: a DBOS Transact workflow of the same mix, in this process's DBOS executor.

    ``dbos`` and ``sqlalchemy`` are loaded by name: they are the optional ``bench`` extra,
    and a type check without them installed still has to pass.
    """

    def __init__(self, url: str, system_url: str, worker: int) -> None:
        dbos: Any = importlib.import_module("dbos")
        sa: Any = importlib.import_module("sqlalchemy")
        self.recording = False
        self.statements = self.transactions = self.background = 0
        self.backends: set[int] = set()
        self._main = threading.get_ident()
        self._set_workflow_id = dbos.SetWorkflowID

        def on_execute(*args: Any) -> None:
            if self.recording:
                self.statements += 1
                self.background += threading.get_ident() != self._main

        def on_commit(*args: Any) -> None:
            if self.recording:
                self.transactions += 1

        def on_connect(dbapi_connection: Any, record: Any) -> None:
            self.backends.add(int(dbapi_connection.info.backend_pid))

        # Every engine DBOS makes (system database, datasource): listeners on the class.
        sa.event.listen(sa.Engine, "before_cursor_execute", on_execute)
        sa.event.listen(sa.Engine, "commit", on_commit)
        sa.event.listen(sa.Engine, "connect", on_connect)
        self._url = url
        self._instance = dbos.DBOS(
            config={
                "name": "loopguard-bench",
                "system_database_url": system_url,
                "executor_id": f"bench-worker-{worker}",
                "log_level": "WARNING",
            }
        )
        datasource = self._datasource = dbos.SQLAlchemyDatasource.create(url)
        self.conn = psycopg.connect(url, autocommit=True)  # the read step's, as (a)'s
        text = sa.text(
            "INSERT INTO desk_notice (order_id, recipient, text, idempotency_key, created_at)"
            " VALUES (NULL, :recipient, :text, :key, now()) RETURNING id"
        )
        reads = [0]

        def read_page(number: int) -> dict[str, Any]:
            page = self.conn.execute(_RAW_READ, [COLLECTION, number]).fetchone()
            reads[0] += 1
            if page is None:
                raise RuntimeError(f"page {number} is missing")
            return {"page": page[0], "items": page[1]}

        def send_notice(body: str, key: str) -> dict[str, Any]:
            session = datasource.sql_session()
            params = {"recipient": "ops@example.com", "text": body, "key": key}
            return {"notice": session.execute(text, params).scalar_one()}

        step = dbos.DBOS.step(name="bench_read_page")(read_page)
        transaction = datasource.transaction(
            name="bench_send_notice", isolation_level="READ COMMITTED"
        )(send_notice)

        def mix(run: str, steps: int) -> int:
            for n in range(1, steps + 1):
                if n % 2:
                    step((n + 1) // 2)
                else:
                    transaction(f"benchmark notice {n}", f"dbos-{run}-notice-{n}")
            return steps

        self._reads = reads
        self._mix = dbos.DBOS.workflow(name="bench_read_write")(mix)
        dbos.DBOS.launch()
        self._dbos = dbos.DBOS

    def prepare(self, steps: int) -> Window:
        """A workflow of ``steps`` steps ready to start; the window covers all of it."""
        run_id = uuid.uuid4().hex[:12]
        # Fresh connections, warm before the window, closed after it (see guarded).
        self.conn = psycopg.connect(self._url, autocommit=True)
        self.backends.add(int(self.conn.info.backend_pid))
        for engine in self._engines():
            with engine.connect() as warm:
                warm.exec_driver_sql("SELECT 1")
        clock = BackendClock(self.backends)

        def work() -> tuple[int, int, int]:
            self.statements = self.transactions = self.background = 0
            self._reads[0] = 0
            self.recording = True
            with self._set_workflow_id(f"bench-{run_id}"):
                done = self._mix(run_id, steps)
            self.recording = False
            if done != steps:
                raise SystemExit(f"the DBOS workflow returned {done}, expected {steps}")
            statements = self.statements + self._reads[0]
            return statements, statements + 2 * self.transactions, self.background

        def window() -> WorkerRun:
            run = _timed(steps, clock, work)
            row = self.conn.execute(
                "SELECT count(*) FROM desk_notice WHERE idempotency_key LIKE %s",
                [f"dbos-{run_id}-notice-%"],
            ).fetchone()
            self.conn.close()
            for engine in self._engines():
                engine.dispose()  # DBOS's background threads connect again as they need
            if row is None or row[0] != steps // 2:
                raise SystemExit(f"the DBOS run sent {row} notices, expected {steps // 2}")
            return run

        return window

    def _engines(self) -> list[Any]:
        # The system database's engine is not public API; the datasource's is.
        return [self._datasource.engine, self._instance._sys_db.engine]

    def close(self) -> None:
        """Stop this process's DBOS executor."""
        self._dbos.destroy()
        self.conn.close()


# -- the worker processes --------------------------------------------------------------------------


@dataclass(frozen=True)
class Job:
    """One worker's part of one run: which side, how many steps."""

    side: str
    steps: int


def setup_django(url: str) -> None:
    """Set Django up on ``url`` with the benchmark's agents, as a worker would run."""
    os.environ["DJANGO_SETTINGS_MODULE"] = "console.project.settings"
    os.environ["DATABASE_URL"] = url
    import django
    from django.conf import settings

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


def worker_main(pipe: Connection, url: str, system_url: str | None, worker: int) -> None:
    """A worker process: prepare a job, report ready, run it on "go", report what it did."""
    setup_django(url)
    log = QueryLog()
    install(log)
    peer = DbosWorkflow(url, system_url, worker) if system_url else None
    pipe.send("ready")
    try:
        while (job := pipe.recv()) is not None:
            assert isinstance(job, Job)  # noqa: S101 (our own pipe)
            if job.side == GUARDED:
                window = prepare_guarded(url, job.steps, log)
            elif job.side in (RAW, RAW_STEP_COMMIT):
                window = prepare_raw(url, job.steps, worker, step_commit=job.side != RAW)
            elif peer is not None:
                window = peer.prepare(job.steps)
            else:
                raise SystemExit(f"worker {worker} has no DBOS executor")
            pipe.send("ready")
            if pipe.recv() != "go":
                return
            pipe.send(window())
    finally:
        if peer is not None:
            peer.close()


class Pool:
    """Worker processes, started one after another (DBOS migrates its schema on launch)."""

    def __init__(self, url: str, system_url: str | None, size: int) -> None:
        context = multiprocessing.get_context("spawn")
        self._pipes: list[Connection] = []
        self._processes: list[multiprocessing.process.BaseProcess] = []
        for worker in range(size):
            ours, theirs = context.Pipe()
            process = context.Process(
                target=worker_main,
                args=(theirs, url, system_url, worker),
                name=f"bench-worker-{worker}",
                daemon=True,
            )
            process.start()
            self._pipes.append(ours)
            self._processes.append(process)
            self._expect(ours, "ready")

    def _expect(self, pipe: Connection, what: str) -> Any:
        try:
            if not pipe.poll(120):
                raise SystemExit(f"a worker did not answer in 120 s (waiting for {what!r})")
            message = pipe.recv()
        except (EOFError, ConnectionError) as exc:
            raise SystemExit("a worker died (its error is above)") from exc
        if what and message != what:
            raise SystemExit(f"a worker answered {message!r}, not {what!r}")
        return message

    def run(
        self, side: str, workers: int, steps: int, stats: ServerStats, *, measure: bool = True
    ) -> Run:
        """One run of ``side`` on the first ``workers`` workers, released together.

        ``measure=False`` skips waiting for the server's counts to settle (a warm-up).
        """
        pipes = self._pipes[:workers]
        for pipe in pipes:
            pipe.send(Job(side, steps))
        for pipe in pipes:
            self._expect(pipe, "ready")
        before = stats.commits() if measure else Counts()
        for pipe in pipes:
            pipe.send("go")
        parts: list[WorkerRun] = [self._expect(pipe, "") for pipe in pipes]
        after = stats.commits() if measure else Counts()
        seconds = max(p.finished for p in parts) - min(p.started for p in parts)
        commits = after.commits - before.commits
        if side == DBOS:
            # Less what every DBOS executor's idle polling committed between the readings.
            polling = before.idle_rate * (after.at - before.at)
            commits += after.system_commits - before.system_commits - round(polling)
        server_cpu = [p.server_cpu_seconds for p in parts]
        return Run(
            workers=workers,
            steps=sum(p.steps for p in parts),
            seconds=seconds,
            statements=sum(p.statements for p in parts),
            round_trips=sum(p.round_trips for p in parts),
            server_commits=commits,
            disk_flushes=after.wal_flushes - before.wal_flushes,
            cpu_seconds=sum(p.cpu_seconds for p in parts),
            server_cpu_seconds=None if None in server_cpu else sum(c or 0.0 for c in server_cpu),
            lost_backends=sum(p.lost_backends for p in parts),
            background_statements=sum(p.background_statements for p in parts),
            step_seconds=[s for p in parts for s in p.step_seconds],
        )

    def close(self) -> None:
        """Tell every worker to finish, and wait for it (a dead one is only waited for)."""
        for pipe in self._pipes:
            with contextlib.suppress(OSError):  # it died: its error is above
                pipe.send(None)
        for process in self._processes:
            process.join(timeout=30)
            if process.is_alive():
                process.terminate()


def stop_latencies(url: str, rounds: int) -> list[float]:
    """Seconds from ``task_stop`` to a ``CANCELLED`` row, for drivers waiting on a job."""
    from django.contrib.auth.models import User

    from console.drivers.runner import STOP_POLL_S
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

    from console.drivers.runner import drive

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


@dataclass(frozen=True)
class Databases:
    """Where the benchmark works: ``DATABASE_URL``'s server, in databases of its own."""

    server: str  # a URL of the server's ``postgres`` database, for the administrative work
    url: str  # the benchmark database
    system_url: str  # DBOS's system database
    name: str
    system_name: str

    @classmethod
    def from_url(cls, database_url: str) -> Databases:
        """The benchmark's databases beside the one ``database_url`` names (never it)."""
        parts = urlsplit(database_url)
        if parts.scheme not in ("postgres", "postgresql"):
            raise SystemExit(f"DATABASE_URL must be a PostgreSQL URL, not {parts.scheme}://…")
        base = parts.path.lstrip("/") or "loopguard"
        name, system_name = f"{base}_throughput", f"{base}_throughput_dbos"

        def on(database: str) -> str:
            return urlunsplit(parts._replace(path=f"/{database}"))

        return cls(on("postgres"), on(name), on(system_name), name, system_name)


def recreate(server: str, database: str) -> None:
    """Drop ``database`` if it exists (closing its sessions) and create it empty."""
    with psycopg.connect(server, autocommit=True) as admin:
        name = sql.Identifier(database)
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(name))
        admin.execute(sql.SQL("CREATE DATABASE {}").format(name))


def drop(server: str, database: str) -> None:
    """Drop ``database``, closing whatever sessions are left on it."""
    with psycopg.connect(server, autocommit=True) as admin:
        name = sql.Identifier(database)
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(name))


def seed_pages(url: str, pages: int) -> None:
    """The desk pages every side reads (those already there are left as they are)."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            """
            INSERT INTO desk_page (collection, number, items)
            SELECT %s, n, jsonb_build_array(
                jsonb_build_object('id', %s || '-' || n || '-1', 'line', n * 3 - 2),
                jsonb_build_object('id', %s || '-' || n || '-2', 'line', n * 3 - 1),
                jsonb_build_object('id', %s || '-' || n || '-3', 'line', n * 3))
            FROM generate_series(1, %s) AS n
            ON CONFLICT (collection, number) DO NOTHING
            """,
            [COLLECTION, COLLECTION, COLLECTION, COLLECTION, pages],
        )


def prepare(url: str, pages: int, workers: int) -> None:
    """Seed the pages every side reads and create the raw loops' tables."""
    seed_pages(url, pages)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            """
            CREATE TABLE bench_progress (id integer PRIMARY KEY, step integer, state jsonb)
            """
        )
        # One row per worker: the step commit of one loop never waits on another's row.
        conn.execute(
            "INSERT INTO bench_progress SELECT n, 0, NULL FROM generate_series(1, %s) AS n",
            [workers],
        )
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


def _segment_ms(runs: Iterable[Run]) -> tuple[float, float]:
    """Median ms per step over the first and the last quarter of the guarded runs' steps."""
    first: list[float] = []
    last: list[float] = []
    for run in runs:
        quarter = max(1, len(run.step_seconds) // 4)
        first.extend(run.step_seconds[:quarter])
        last.extend(run.step_seconds[-quarter:])
    return _median(first) * 1000, _median(last) * 1000


Results = Mapping[int, Mapping[str, Sequence[Run]]]  # workers → side → its runs


def _row(runs: Sequence[Run], label: str) -> str:
    """One cell: the median rate's numbers, or every run's totals over every run's steps."""
    steps = sum(r.steps for r in runs)
    rate = _median([r.rate for r in runs])
    if label == "steps/s":
        return f"{rate:.1f}"
    if label == "ms/step":
        return f"{_median([r.ms_per_step for r in runs]):.2f}"
    if label == "client CPU ms/step":
        return f"{sum(r.cpu_seconds for r in runs) / steps * 1000:.3f}"
    if label == "server CPU ms/step":
        if any(r.server_cpu_seconds is None for r in runs):
            return "n/a"
        return f"{sum(r.server_cpu_seconds or 0.0 for r in runs) / steps * 1000:.3f}"
    value = {
        "statements/step": sum(r.statements for r in runs),
        "round trips/step": sum(r.round_trips for r in runs),
        "commits/step": sum(r.server_commits for r in runs),
        "WAL flushes/step": sum(r.disk_flushes for r in runs),
    }[label]
    return f"{value / steps:.2f}"


def _cpu_ms(runs: Sequence[Run]) -> str:
    """Client and server CPU ms per step, as ``client + server``."""
    client, server = _row(runs, "client CPU ms/step"), _row(runs, "server CPU ms/step")
    return f"{client} + {server}"


ROWS = (
    "steps/s",
    "ms/step",
    "client CPU ms/step",
    "server CPU ms/step",
    "statements/step",
    "round trips/step",
    "commits/step",
    "WAL flushes/step",
)


def print_report(
    facts: Mapping[str, str],
    steps: int,
    rounds: int,
    results: Results,
    notes: Sequence[str],
    load: tuple[float, float],
) -> None:
    """The summary table: one column per side, one block of rows per number of workers."""
    import console

    sides = [side for side in SIDES if any(side in by_side for by_side in results.values())]
    print(
        f"python {sys.version.split()[0]}; PostgreSQL {facts['server_version']} "
        f"(fsync={facts['fsync']}, synchronous_commit={facts['synchronous_commit']}); "
        f"{os.cpu_count()} CPUs (load average {load[0]:.1f} at the start, {load[1]:.1f} at the "
        f"end); code: {Path(console.__file__).resolve().parent.parent}"
    )
    print(
        f"{steps} steps per worker per run ({(steps + 1) // 2} page reads, {steps // 2} "
        f"notice sends); {rounds} round(s), sides interleaved; server CPU: the run's own "
        "backends, /proc/<pid>/schedstat"
    )
    for note in notes:
        print(note)
    width = 21
    print(f"{'':<30}" + "".join(f" {side:>{width}}" for side in sides))
    for workers, by_side in results.items():
        plural = "worker" if workers == 1 else "workers"
        for i, label in enumerate(ROWS):
            head = f"{workers} {plural}" if i == 0 else ""
            cells = [_row(by_side[side], label) if side in by_side else "-" for side in sides]
            print(f"{head:<10}{label:<20}" + "".join(f" {cell:>{width}}" for cell in cells))
    print()
    for workers, by_side in results.items():
        rate = {side: _median([r.rate for r in runs]) for side, runs in by_side.items()}
        cpu = {side: _cpu_ms(runs) for side, runs in by_side.items()}
        parts = []
        if GROWN in rate:
            paired = zip(by_side[GROWN], by_side[GUARDED], strict=True)
            spread = " ".join(f"{g.rate / p.rate:.2f}" for g, p in paired)
            parts.append(
                f"guarded in the grown database / in a new one: {rate[GROWN] / rate[GUARDED]:.2f}x"
                f" (round by round {spread}; the step no slower there: ≥ 1.0x within the noise)"
            )
        for peer in (RAW_STEP_COMMIT, DBOS):
            if peer in rate:
                ratio = rate[GUARDED] / rate[peer]
                # Each round's guarded run beside the same round's peer run: how far the
                # machine's noise moves the ratio.
                paired = zip(by_side[GUARDED], by_side[peer], strict=True)
                spread = " ".join(f"{g.rate / p.rate:.2f}" for g, p in paired)
                mark = f"round by round {spread}"
                if peer == DBOS:
                    met = "met" if ratio >= DBOS_TARGET else "NOT met"
                    mark = f"target ≥ {DBOS_TARGET:g}x: {met}; {mark}"
                parts.append(f"guarded / {SHORT[peer]}: {ratio:.2f}x ({mark})")
        head = f"{workers} {'worker ' if workers == 1 else 'workers'}: "
        print(head + "; ".join(parts))
        shown = [
            f"{SHORT.get(side, side)} {cpu[side]}" for side in (GUARDED, *SHORT) if side in cpu
        ]
        print(" " * len(head) + "CPU ms/step, client + server: " + ", ".join(shown))


def print_facts(results: Results, stops: Sequence[float], task_rows: TaskRowFacts) -> None:
    """What the table does not show: the step time over a run, the task row, the stops."""
    alone = results.get(1, {}).get(GUARDED, [])
    first, last = _segment_ms(alone)
    print(
        f"guarded ms/step (1 worker), first vs last quarter of a run: {first:.2f} → {last:.2f} "
        f"(the checkpoint grows to {task_rows.checkpoint_bytes / 1024:.1f} KiB of JSON)"
    )
    print(
        f"console_task updates: {task_rows.updates}, of which HOT: {task_rows.hot_updates} "
        "(a non-HOT update rewrites every index on the row)"
    )
    for side, what in ((GUARDED, "the lease heartbeat's"), (DBOS, "DBOS's own threads'")):
        count = sum(
            r.background_statements for runs in results.values() for r in runs.get(side, [])
        )
        if any(side in runs for runs in results.values()):
            print(f"{side}: {count} of the statements counted were {what} (counted above)")
    lost = sum(r.lost_backends for runs in results.values() for rs in runs.values() for r in rs)
    if lost:
        print(f"{lost} backend(s) disconnected before their CPU time was read (not counted)")
    stop_median, stop_max = _median(stops), max(stops)
    stop_met = "met" if stop_max < 1.0 else "NOT met"
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


def _grown(where: Databases, name: str, steps: int) -> tuple[Pool, ServerStats]:
    """One worker on the existing database ``name`` (refused unless it is a console database
    at this checkout's migrations), with the pages its steps read, and its counts."""
    url = urlunsplit(urlsplit(where.url)._replace(path=f"/{name}"))
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            tasks = conn.execute("SELECT count(*) FROM console_task").fetchone()
    except psycopg.Error as exc:
        raise SystemExit(f"--grown {name}: not a console database on this server ({exc})") from exc
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor

    executor = MigrationExecutor(connection)
    targets = executor.loader.graph.leaf_nodes()
    with psycopg.connect(url, autocommit=True) as conn:
        applied = {
            (app, migration)
            for app, migration in conn.execute("SELECT app, name FROM django_migrations")
        }
    missing = sorted(
        f"{app}.{migration}" for app, migration in targets if (app, migration) not in applied
    )
    if missing:
        raise SystemExit(f"--grown {name}: migrate it first (it lacks {', '.join(missing)})")
    seed_pages(url, max(steps, PROFILE_STEPS) // 2 + 1)
    print(f"grown database {name}: {tasks[0] if tasks else 0:,} tasks before this run")
    return Pool(url, None, 1), ServerStats(where.server, name, where.system_name)


def main(argv: list[str]) -> int:
    """Create the databases, measure every side and stop latency, print, drop the databases."""
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0] if __doc__ else None,
        epilog=COLUMNS,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--steps", type=int, default=None, help="steps per worker per run (default 200)"
    )
    parser.add_argument("--rounds", type=int, default=None, help="rounds of runs (default 3)")
    parser.add_argument(
        "--quick", action="store_true", help="a smoke run: 60 steps per worker, one round"
    )
    parser.add_argument(
        "--no-dbos", action="store_true", help="leave the DBOS column out even if installed"
    )
    parser.add_argument(
        "--grown",
        metavar="DATABASE",
        help="also run the guarded side (1 worker) in DATABASE, an existing console database"
        " on the same server, e.g. the million tasks `console_pages.py --keep` leaves: the"
        " step in a grown database against the step in a new one, in the same rounds (its"
        " tasks are left there)",
    )
    options = parser.parse_args(argv)
    steps = options.steps if options.steps is not None else (60 if options.quick else 200)
    rounds = options.rounds if options.rounds is not None else (1 if options.quick else 3)
    if steps < 2 or rounds < 1:
        parser.error("--steps must be at least 2 and --rounds at least 1")
    where = Databases.from_url(os.environ.get("DATABASE_URL") or DEFAULT_DATABASE_URL)
    notes: list[str] = []
    with_dbos = not options.no_dbos and importlib.util.find_spec("dbos") is not None
    if not with_dbos:
        why = "--no-dbos" if options.no_dbos else "dbos is not installed (pip install '.[bench]')"
        notes.append(f"DBOS column skipped: {why}")

    load_before = os.getloadavg()[0]
    recreate(where.server, where.name)
    if with_dbos:
        recreate(where.server, where.system_name)
    try:
        setup_django(where.url)
        from django.core.management import call_command
        from django.db import connections

        call_command("migrate", verbosity=0)
        prepare(where.url, max(steps, PROFILE_STEPS) // 2 + 1, max(WORKERS))
        facts = server_facts(where.url)
        connections.close_all()
        log = QueryLog()
        install(log)
        stats = ServerStats(where.server, where.name, where.system_name)
        started: list[Pool] = []
        grown: tuple[Pool, ServerStats] | None = None
        try:
            plain = Pool(where.url, None, max(WORKERS))
            started.append(plain)
            pools = {GUARDED: plain, RAW_STEP_COMMIT: plain, RAW: plain}
            if with_dbos:
                pools[DBOS] = Pool(where.url, where.system_url, max(WORKERS))
                started.append(pools[DBOS])
            if options.grown:
                grown = _grown(where, options.grown, steps)
                started.append(grown[0])
            # Warm every worker up (imports, caches, prepared statements) unmeasured.
            for side, pool in pools.items():
                pool.run(side, max(WORKERS), 20, stats, measure=False)
            if grown is not None:
                grown[0].run(GUARDED, 1, 20, grown[1], measure=False)
            results: dict[int, dict[str, list[Run]]] = {w: {} for w in WORKERS}
            for _ in range(rounds):  # interleaved, so that a noisy spell hits every side
                for workers in WORKERS:
                    for side, pool in pools.items():
                        run = pool.run(side, workers, steps, stats)
                        results[workers].setdefault(side, []).append(run)
                    if grown is not None and workers == 1:
                        run = grown[0].run(GUARDED, 1, steps, grown[1])
                        results[1].setdefault(GROWN, []).append(run)
            profile_steps = min(steps, PROFILE_STEPS)
            prepare_guarded(where.url, profile_steps, log, attribute=True)()
            stops = stop_latencies(where.url, STOP_ROUNDS)
        finally:
            for pool in started:
                pool.close()
            stats.close()
            if grown is not None:
                grown[1].close()
            connections.close_all()
        load = (load_before, os.getloadavg()[0])
        print_report(facts, steps, rounds, results, notes, load)
        print_facts(results, stops, task_row_facts(where.url))
        print_breakdown(log, profile_steps)
    finally:
        drop(where.server, where.name)
        if with_dbos:
            drop(where.server, where.system_name)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
