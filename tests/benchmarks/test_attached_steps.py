"""benchmarks/attached_steps.py: where it works, what it prints, and that the attached runs
it times did their work exactly once.

The benchmark prints numbers and fails on no target; what it must get right is that every
attached task it drove over HTTP ended as the hosted one does (the script checks each and
stops otherwise, and prints the totals), and that it leaves nothing behind.
"""

from __future__ import annotations

import re

import psycopg
import pytest

from tests.benchmarks.support import database_url, load, run

bench = load("attached_steps")


def test_it_works_in_a_database_of_its_own_beside_the_one_database_url_names() -> None:
    where = bench.Scratch.from_url("postgres://lg:secret@db.internal:6543/shop?sslmode=require")

    assert where.name == "shop_attached"
    assert where.url == "postgres://lg:secret@db.internal:6543/shop_attached?sslmode=require"
    assert where.server == "postgres://lg:secret@db.internal:6543/postgres?sslmode=require"


def test_it_refuses_a_database_url_that_is_not_postgresql() -> None:
    with pytest.raises(SystemExit, match="PostgreSQL"):
        bench.Scratch.from_url("sqlite:///loopguard.sqlite3")


def test_its_help_says_what_every_column_and_row_means() -> None:
    done = run("attached_steps", "--help")
    assert done.returncode == 0, done.stderr

    for name in (
        *bench.HEADS,
        bench.HOSTED,
        bench.BY_CALL,
        "attached, N clients",
        "attached / hosted",
    ):
        assert name in done.stdout
    for option in ("--steps", "--clients", "--quick", "--rounds", "--against"):
        assert option in done.stdout


@pytest.mark.slow
def test_a_small_run_prints_every_row_and_every_attached_task_did_its_steps_once() -> None:
    done = run("attached_steps", "--steps", "6", "--clients", "1,2", "--rounds", "1", timeout=300)

    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    number = r"\s+[\d.]+"
    assert re.search(rf"^hosted, 1 worker(?:{number}){{2}}{number}\s+-(?:{number}){{2}}\s+-$",
                     out, re.MULTILINE), out  # fmt: skip
    for row in ("attached, 1 client ", "attached, 2 clients"):
        # Every column measured: steps/s ... total CPU, and 2.167 requests a step (tools
        # with the call's entry, and result, for each of the 6 steps, and the first model
        # call's).
        assert re.search(rf"^{row}(?:{number}){{6}}\s+2\.167$", out, re.MULTILINE), out
    # The call step entered on its own: tools, call and result.
    assert re.search(rf"^attached, call step(?:{number}){{6}}\s+3\.167$", out, re.MULTILINE)
    for row in ("attached, 1 client", "attached, call step"):
        assert f"{row} / hosted, 1 worker: wall " in out
    assert "total CPU " in out and "target <= 2x" in out
    assert re.search(r"^floor: an API request that does nothing .* costs at least [\d.]+ ms wall",
                     out, re.MULTILINE), out  # fmt: skip
    # Issue 20's two targets, each printed beside its ratio.
    assert re.search(
        r"^attached, 1 client: PG CPU attached / hosted [\d.]+x \(.*target <= 1\.5x: (NOT )?met\);"
        r" attached / floor: wall [\d.]+x \(.*target <= 1\.6x: (NOT )?met\);"
        r" CPU [\d.]+x \(.*target <= 1\.6x: (NOT )?met\)$",
        out, re.MULTILINE,
    ), out  # fmt: skip
    # 1 + 2 + 1 tasks of 6 steps, 3 writes each: each step executed once, each notice once.
    assert (
        "checked: 4 attached tasks COMPLETED/goal_met, executions 24 for 24 steps; "
        "notices 12 sent for 12 writes, 0 sent twice; 12 operations committed at the first "
        "attempt"
    ) in out

    where = bench.Scratch.from_url(database_url())
    with psycopg.connect(where.server, autocommit=True) as admin:
        left = admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", [where.name])
        assert left.fetchone() is None
