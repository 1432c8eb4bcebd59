"""The guarded step's own statements, replayed by a bare loop: how fast our SQL alone can go.

Run: ``.venv/bin/python benchmarks/statement_ceiling.py [--steps N] [--rounds N]``

``runner_throughput.py`` compares the guarded step with (a), a hand-written loop of the same
durability. This asks the question behind that ratio: of the gap, how much is the database
work our promises write (a stop fact read before each tool, a trace row per model call and per
request, the counters and checkpoint a restart resumes from, the ledger row and its history)
and how much is the Python around it (guard, runner, store, Django)?

Each round, one worker process (Django set up as a Celery worker has it, ``DEBUG`` off):

1. creates a guarded task of ``--steps`` steps (``runner_throughput``'s read/write mix) in
   the benchmark database, then copies that database (``CREATE DATABASE … TEMPLATE``);
2. **guarded**: drives the task with ``console.drivers.runner.drive``, recording every statement
   it sends (text and parameters, as they went to psycopg);
3. **replay**: sends exactly those statements, in order, with the same parameters, to the
   copy, from a bare psycopg connection (autocommit, every statement prepared, as the
   runner's are): the same rows, indexes, constraints, triggers and synchronous commits,
   with no Python deciding anything. No loop that stores what the console stores can send
   less work than this; its steps/s is the ceiling of any implementation of our data model;
4. **(a)**: ``runner_throughput``'s yardstick loop, in the benchmark database.

Then one more replay, on another copy, reads the backend's CPU time around every statement
and prints the server's CPU per step by statement shape: where the server's time goes.

Statements the drive sends inside ``transaction.atomic`` (taking the lease and finishing:
a handful per drive) replay one transaction each; every per-step statement is autocommit on
both sides. Databases: ``<DATABASE_URL's name>_ceiling`` and ``…_ceiling_copy``, created
afresh and dropped at the end. Nothing fails on a number; the numbers are printed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

sys.path.insert(0, str(Path(__file__).resolve().parent))

import psycopg
import runner_throughput as rt
from psycopg import sql

GUARDED, REPLAY, RAW = "guarded", "replay", "(a) raw+step commit"
REPLAY_TARGET = 0.85
"""Issue 20: the guarded step at least this share of the replay of its own statements (what
is left is the Python around them)."""


@dataclass
class Measured:
    """One side's timed window."""

    steps: int
    seconds: float
    cpu_seconds: float
    server_cpu_seconds: float | None
    statements: int


class Recorder:
    """An ``execute_wrapper`` keeping every statement's text and parameters, in order."""

    def __init__(self) -> None:
        self.recording = False
        self.statements: list[tuple[str, Any]] = []

    def __call__(
        self,
        execute: Callable[..., Any],
        sql_text: str,
        params: Any,
        many: bool,
        context: Mapping[str, Any],
    ) -> Any:
        if self.recording:
            if many:
                raise SystemExit("the guarded drive sent an executemany; replay cannot follow")
            # Copied: a caller may reuse its list after the statement.
            self.statements.append((sql_text, None if params is None else list(params)))
        return execute(sql_text, params, many, context)


def _copy(server: str, source: str, target: str) -> None:
    with psycopg.connect(server, autocommit=True) as admin:
        admin.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(target))
        )
        admin.execute(
            sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                sql.Identifier(target), sql.Identifier(source)
            )
        )


def new_task(steps: int) -> int:
    """A guarded task of ``steps`` steps, created and not yet driven."""
    from django.db import connections

    from console.services import task_start

    task = task_start(
        agent=rt.MIX_AGENT,
        input={"steps": steps, "run": os.urandom(6).hex()},
        limits=rt._limits(steps),
        enqueue=rt._no_enqueue,
    )
    connections.close_all()  # the copy needs the database without sessions
    return int(task.pk)


def drive_recorded(task_id: int, steps: int, recorder: Recorder) -> Measured:
    """Drive ``task_id`` on a fresh connection, recording and timing it."""
    from django.db import connection, connections

    from console.drivers.runner import drive

    connection.ensure_connection()
    clock = rt.BackendClock({int(connection.connection.info.backend_pid)})
    recorder.statements.clear()
    recorder.recording = True
    clock.start()
    cpu, started = time.process_time(), time.perf_counter()
    outcome = drive(task_id)
    seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    server, _ = clock.stop()
    recorder.recording = False
    connections.close_all()
    if outcome != "COMPLETED/goal_met":
        raise SystemExit(f"the guarded run ended {outcome}, not COMPLETED/goal_met")
    return Measured(steps, seconds, cpu, server, len(recorder.statements))


def replay(
    url: str, steps: int, statements: Sequence[tuple[str, Any]], *, attribute: bool = False
) -> tuple[Measured, dict[str, float]]:
    """Send ``statements`` to ``url`` from a bare autocommit connection, each prepared."""
    by_shape: dict[str, float] = {}
    encoded = [(text.encode(), params) for text, params in statements]
    shapes = [rt.statement_shape(text) for text, _ in statements] if attribute else []
    with psycopg.connect(url, autocommit=True) as conn:
        conn.prepare_threshold = 0
        pid = int(conn.info.backend_pid)
        notices = conn.execute("SELECT count(*) FROM desk_notice").fetchone()
        clock = rt.BackendClock({pid})
        cursor = conn.cursor()
        clock.start()
        cpu, started = time.process_time(), time.perf_counter()
        if attribute:
            for (text, params), shape in zip(encoded, shapes, strict=True):
                before = rt.backend_cpu(pid) or 0.0
                cursor.execute(text, params, prepare=True)
                if cursor.description is not None:
                    cursor.fetchall()
                by_shape[shape] = by_shape.get(shape, 0.0) + (rt.backend_cpu(pid) or 0.0) - before
        else:
            for text, params in encoded:
                cursor.execute(text, params, prepare=True)
                if cursor.description is not None:
                    cursor.fetchall()
        seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
        server, _ = clock.stop()
        row = conn.execute("SELECT count(*) FROM desk_notice").fetchone()
    sent = None if row is None or notices is None else row[0] - notices[0]
    if sent != steps // 2:
        raise SystemExit(f"the replay sent {sent} notices, expected {steps // 2}")
    return Measured(steps, seconds, cpu, server, len(statements)), by_shape


def raw(url: str, steps: int) -> Measured:
    """``runner_throughput``'s (a): bare psycopg, ledger claim and record, a step commit."""
    window = rt.prepare_raw(url, steps, 0, step_commit=True)
    run = window()
    return Measured(
        steps,
        run.finished - run.started,
        run.cpu_seconds,
        run.server_cpu_seconds,
        run.statements,
    )


def _per_step(values: Sequence[float | None], steps: int) -> str:
    known = [v for v in values if v is not None]
    return f"{1000 * statistics.median(known) / steps:.3f}" if known else "n/a"


def main(argv: list[str]) -> int:
    """Create the databases, measure each side every round, print, drop the databases."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--steps", type=int, default=400, help="steps per run (default 400)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds (default 5)")
    options = parser.parse_args(argv)
    if options.steps < 2 or options.rounds < 1:
        parser.error("--steps must be at least 2 and --rounds at least 1")
    steps = options.steps
    parts = urlsplit(os.environ.get("DATABASE_URL") or rt.DEFAULT_DATABASE_URL)
    if parts.scheme not in ("postgres", "postgresql"):
        raise SystemExit(f"DATABASE_URL must be a PostgreSQL URL, not {parts.scheme}://…")
    base = parts.path.lstrip("/") or "loopguard"
    name, copy = f"{base}_ceiling", f"{base}_ceiling_copy"

    def on(database: str) -> str:
        return urlunsplit(parts._replace(path=f"/{database}"))

    server, url, copy_url = on("postgres"), on(name), on(copy)
    load_before = os.getloadavg()[0]
    rt.recreate(server, name)
    try:
        rt.setup_django(url)
        from django.core.management import call_command
        from django.db import connections

        call_command("migrate", verbosity=0)
        rt.prepare(url, steps // 2 + 1, 1)
        connections.close_all()
        recorder = Recorder()
        connections["default"].execute_wrappers.append(recorder)
        from django.db.backends.signals import connection_created

        def on_connect(sender: Any, connection: Any, **kwargs: Any) -> None:
            if recorder not in connection.execute_wrappers:
                connection.execute_wrappers.append(recorder)

        connection_created.connect(on_connect, weak=False)
        results: dict[str, list[Measured]] = {GUARDED: [], REPLAY: [], RAW: []}
        statements: list[tuple[str, Any]] = []
        for round_ in range(options.rounds + 1):  # the first round warms up, unmeasured
            task_id = new_task(steps)
            _copy(server, name, copy)
            done = drive_recorded(task_id, steps, recorder)
            statements = list(recorder.statements)
            replayed, _ = replay(copy_url, steps, statements)
            yardstick = raw(url, steps)
            if round_:
                results[GUARDED].append(done)
                results[REPLAY].append(replayed)
                results[RAW].append(yardstick)
        task_id = new_task(steps)
        _copy(server, name, copy)
        drive_recorded(task_id, steps, recorder)
        _, by_shape = replay(copy_url, steps, recorder.statements, attribute=True)
        connections.close_all()
    finally:
        rt.drop(server, copy)
        rt.drop(server, name)
    load = (load_before, os.getloadavg()[0])
    _print(steps, options.rounds, results, by_shape, load)
    return 0


def _print(
    steps: int,
    rounds: int,
    results: Mapping[str, list[Measured]],
    by_shape: Mapping[str, float],
    load: tuple[float, float],
) -> None:
    print(
        f"{steps} steps per run (half page reads, half notice sends), {rounds} round(s), one "
        f"worker; load average {load[0]:.1f} at the start, {load[1]:.1f} at the end"
    )
    print(f"{'':24}{GUARDED:>14}{REPLAY:>14}{RAW:>22}")
    rows: list[tuple[str, Callable[[Measured], float | None], str]] = [
        ("steps/s", lambda m: m.steps / m.seconds, "{:.1f}"),
        ("ms/step", lambda m: 1000 * m.seconds / m.steps, "{:.2f}"),
        ("client CPU ms/step", lambda m: 1000 * m.cpu_seconds / m.steps, "{:.3f}"),
        (
            "server CPU ms/step",
            lambda m: (
                None if m.server_cpu_seconds is None else 1000 * m.server_cpu_seconds / m.steps
            ),
            "{:.3f}",
        ),
        ("statements/step", lambda m: m.statements / m.steps, "{:.2f}"),
    ]
    for label, value, form in rows:
        cells = []
        for side, width in ((GUARDED, 14), (REPLAY, 14), (RAW, 22)):
            known = [v for v in map(value, results[side]) if v is not None]
            cells.append(f"{form.format(statistics.median(known)) if known else 'n/a':>{width}}")
        print(f"{label:24}{''.join(cells)}")

    def rate(side: str) -> float:
        return statistics.median(m.steps / m.seconds for m in results[side])

    def rounds_of(a: str, b: str) -> str:
        return " ".join(
            f"{(x.steps / x.seconds) / (y.steps / y.seconds):.2f}"
            for x, y in zip(results[a], results[b], strict=True)
        )

    print()
    print(
        f"replay / (a):  {rate(REPLAY) / rate(RAW):.2f}x  (round by round {rounds_of(REPLAY, RAW)})"
        "  the ceiling: our statements with no Python deciding anything"
    )
    ratio = rate(GUARDED) / rate(REPLAY)
    met = "met" if ratio >= REPLAY_TARGET else "NOT met"
    print(
        f"guarded / replay: {ratio:.2f}x  (target ≥ {REPLAY_TARGET}x: {met}; round by round "
        f"{rounds_of(GUARDED, REPLAY)})  what the Python around them costs"
    )
    print(
        f"guarded / (a): {rate(GUARDED) / rate(RAW):.2f}x  (round by round "
        f"{rounds_of(GUARDED, RAW)}; no target: the replay above is the ceiling)"
    )
    total = sum(by_shape.values())
    if total:
        print()
        print("the replay's server CPU by statement shape (one attributed replay):")
        print(f"{'µs/step':>8} {'share':>6}  statement")
        for shape, seconds in sorted(by_shape.items(), key=lambda item: -item[1]):
            print(f"{1e6 * seconds / steps:8.1f} {seconds / total:6.1%}  {shape}")
        print(f"{1e6 * total / steps:8.1f} {1:6.0%}  total")


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
