"""benchmarks/statement_ceiling.py: the guarded drive's statements, replayed by a bare loop.

The script prints numbers and fails on no target; what it must get right is the replay
itself (the same statements reach the copy and do the same business work, which the
script checks by counting the notices it sent) and where it works.
"""

from __future__ import annotations

import pytest

from tests.benchmarks.support import run


@pytest.mark.slow
def test_a_small_run_replays_the_guarded_statements_and_says_where_the_server_time_goes() -> None:
    done = run("statement_ceiling", "--steps", "8", "--rounds", "1", timeout=600)

    # The script stops with a message if the replay sent another number of notices than
    # the drive did, or if the drive did not complete: exit 0 means the replay was faithful.
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    for side in ("guarded", "replay", "(a) raw+step commit"):
        assert side in out.splitlines()[1]
    assert "replay / (a):" in out
    assert "guarded / replay:" in out
    assert "WITH UPDATE task + INSERT traceevent" in out  # the step's save, attributed
    assert out.rstrip().endswith("total")


def test_it_refuses_a_database_url_that_is_not_postgresql() -> None:
    done = run(
        "statement_ceiling",
        "--steps",
        "4",
        "--rounds",
        "1",
        timeout=60,
        DATABASE_URL="sqlite:///tmp/x.sqlite3",
    )

    assert done.returncode != 0
    assert "must be a PostgreSQL URL" in done.stderr
