"""benchmarks/runner_throughput.py: where it works, what it charges a run, what it prints.

The benchmark itself prints numbers and fails on no target; these tests hold the parts its
numbers rest on (the databases it may touch, the server CPU it charges a run) and, once,
a whole small run end to end.
"""

from __future__ import annotations

import importlib.util

import psycopg
import pytest
from django.db import connection

from tests.benchmarks.support import load, run

bench = load("runner_throughput")


def _burn(conn: psycopg.Connection) -> None:
    """Make the backend behind ``conn`` work for a moment (a few hundred ms of CPU)."""
    conn.execute("SELECT sum(i) FROM generate_series(1, 3000000) AS i").fetchone()


def test_it_works_in_databases_of_its_own_beside_the_one_database_url_names() -> None:
    where = bench.Databases.from_url("postgres://lg:secret@db.internal:6543/shop?sslmode=require")

    assert (where.name, where.system_name) == ("shop_throughput", "shop_throughput_dbos")
    assert where.url == "postgres://lg:secret@db.internal:6543/shop_throughput?sslmode=require"
    assert where.system_url.endswith(":6543/shop_throughput_dbos?sslmode=require")
    assert where.server == "postgres://lg:secret@db.internal:6543/postgres?sslmode=require"


def test_it_refuses_a_database_url_that_is_not_postgresql() -> None:
    with pytest.raises(SystemExit, match="PostgreSQL"):
        bench.Databases.from_url("sqlite:///loopguard.sqlite3")


@pytest.mark.django_db
def test_it_charges_a_window_the_cpu_time_of_the_backend_that_served_it() -> None:
    connection.ensure_connection()
    params = connection.get_connection_params()
    with psycopg.connect(**params, autocommit=True) as busy:
        pid = int(busy.info.backend_pid)
        if bench.backend_cpu(pid) is None:
            pytest.skip("the PostgreSQL server is not on this machine")
        clock = bench.BackendClock({pid})
        clock.start()
        _burn(busy)
        seconds, lost = clock.stop()

    assert seconds is not None and seconds > 0.05
    assert lost == 0


@pytest.mark.django_db
def test_it_counts_a_backend_that_left_inside_the_window_as_lost_not_as_free() -> None:
    connection.ensure_connection()
    params = connection.get_connection_params()
    backends: set[int] = set()
    clock = bench.BackendClock(backends)
    with psycopg.connect(**params, autocommit=True) as stays:
        backends.add(int(stays.info.backend_pid))
        if bench.backend_cpu(int(stays.info.backend_pid)) is None:
            pytest.skip("the PostgreSQL server is not on this machine")
        clock.start()
        with psycopg.connect(**params, autocommit=True) as leaves:  # opened in the window
            backends.add(int(leaves.info.backend_pid))
            _burn(leaves)
        _burn(stays)
        seconds, lost = clock.stop()

    assert lost == 1
    assert seconds is not None and seconds > 0.05  # the one that stayed


def test_its_help_says_what_every_column_and_row_means() -> None:
    done = run("runner_throughput", "--help")
    assert done.returncode == 0, done.stderr

    for name in (*bench.SIDES, *bench.ROWS, "guarded / (a)", "guarded / DBOS"):
        assert name in done.stdout


@pytest.mark.slow
def test_a_small_run_prints_every_side_at_one_two_and_four_workers() -> None:
    done = run("runner_throughput", "--steps", "6", "--rounds", "1", timeout=600)

    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert "1 worker  steps/s" in out
    assert "2 workers steps/s" in out
    assert "4 workers steps/s" in out
    assert "guarded / (a):" in out
    assert "server CPU ms/step" in out
    if importlib.util.find_spec("dbos") is not None:
        assert "guarded / DBOS:" in out
    else:
        assert "DBOS column skipped" in out
    assert "stop latency over 5 stops" in out


def test_the_one_offs_it_names_are_functions_of_the_product() -> None:
    # The statement count tells per-step work from once-per-drive work by these qualified
    # names; a rename in the product would silently count a drive's lease or report as
    # per-step work.
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    names: set[str] = set()
    for path in [*(root / "console").rglob("*.py"), *(root / "guard").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef) and node.col_offset == 0:
                names.add(node.name)
            elif isinstance(node, ast.ClassDef):
                names |= {
                    f"{node.name}.{item.name}"
                    for item in node.body
                    if isinstance(item, ast.FunctionDef)
                }

    assert sorted(bench._ONE_OFF - names) == []
    # ... and the driver's own frames by the runner's package, console/drivers/runner/.
    assert (root / "console" / "drivers" / "runner" / "driver.py").is_file()
