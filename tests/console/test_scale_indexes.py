"""Migration 0023: the indexes the console's pages read at a million tasks (PostgreSQL).

Each is made without stopping the console; on the partitioned trace, one partition at a
time and attached to the parent's, so that the parent's index is valid only once every
partition has its own, and a partition made later gets them from the parent."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
from django.db import connection

from console.models import Task
from console.store import history
from tests.databases import django, own_database

pytestmark = pytest.mark.django_db

TRACE_INDEXES = ("trace_spend", "trace_latency")
TASK_INDEXES = ("task_state_agent_created", "task_stopped")

_INDEXES_OF = """
SELECT parent.relname, child.relname, i.indisvalid
FROM pg_inherits h
JOIN pg_class child ON child.oid = h.inhrelid
JOIN pg_class parent ON parent.oid = h.inhparent
JOIN pg_index i ON i.indexrelid = child.oid
WHERE parent.relname = ANY(%s)
"""
_VALID = "SELECT c.relname, i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid"


def _trace_indexes_by_partition(rows: list[tuple[str, str, bool]]) -> dict[str, set[str]]:
    """Of each trace partition (by the index's name, ``<partition>_<what>``): which of the
    parent's indexes it has, attached and valid."""
    found: dict[str, set[str]] = {}
    for parent, child, valid in rows:
        if valid:
            what = parent.removeprefix("trace_")
            found.setdefault(child.removesuffix(f"_{what}"), set()).add(parent)
    return found


def test_every_trace_partition_has_both_indexes_and_a_range_made_later_gets_them_too() -> None:
    top = max(p.high or 0 for p in history.trace_partitions() if not p.default)
    Task.objects.create(agent="test_reader", input={}, limits={}, id=top + 1)
    made = history.partitions_ahead()
    assert made, "a range beyond the newest task is made"

    with connection.cursor() as cursor:
        cursor.execute(_INDEXES_OF, [list(TRACE_INDEXES)])
        by_partition = _trace_indexes_by_partition(cursor.fetchall())
        cursor.execute(f"{_VALID} WHERE c.relname = ANY(%s)", [[*TRACE_INDEXES, *TASK_INDEXES]])
        valid = dict(cursor.fetchall())

    assert valid == dict.fromkeys([*TRACE_INDEXES, *TASK_INDEXES], True)
    for name in [p.name for p in history.trace_partitions()]:
        # A range attached later is given the parent's indexes under names of its own.
        attached = {
            parent
            for child, parents in by_partition.items()
            for parent in parents
            if child == name or child.startswith(name)
        }
        assert attached == set(TRACE_INDEXES), name


# -- a database with a trace, migrated ---------------------------------------------------------


@pytest.fixture
def partitioned_database() -> Iterator[str]:
    """A database of its own at migration 0019 (the trace partitioned), with a trace in
    it: its URL."""
    with own_database("scale") as url:
        django(url, "migrate", "-v0", "console", "0019")
        with psycopg.connect(url) as conn:
            conn.execute(
                "INSERT INTO console_task (agent, client, tools, input, input_fingerprint, state,"
                " reason, detail, limits, model_calls, requests, executions, tokens, spend,"
                " explored, polls, elapsed_ms, revision, phase, next_seq, recoveries, lease_owner,"
                " stop_note, created_at, updated_at) SELECT 'test_reader', '', '{}', '{}', 'f',"
                " 'QUEUED', '', '', '{}', 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 0, '', '', now(), now()"
                " FROM generate_series(1, 3)"
            )
            conn.execute(
                "INSERT INTO console_traceevent (task_id, phase, seq, at, kind, decision, reason,"
                " tool, fingerprint, args_preview, result_kind, result_preview, operation_key,"
                " latency_ms, cost, detail) SELECT t.id, 1, s, now(), 'model_call', '', '', '', '',"
                " '', '', '', '', 100 + s, 5, '' FROM console_task t, generate_series(1, 4) s"
            )
        yield url


def test_migrating_a_database_with_a_trace_takes_up_an_interrupted_run_and_sums_the_same(
    partitioned_database: str,
) -> None:
    # Where a run stopped: the parent's index made, one partition's build failed half-way
    # (CREATE INDEX CONCURRENTLY leaves it invalid, and not attached).
    with psycopg.connect(partitioned_database, autocommit=True) as conn:
        conn.execute(
            "CREATE INDEX trace_spend ON ONLY console_traceevent (at) INCLUDE (cost)"
            " WHERE cost IS NOT NULL"
        )
        conn.execute("CREATE INDEX console_traceevent_t0_spend ON console_traceevent_t0 (at)")
        conn.execute(
            "UPDATE pg_index SET indisvalid = false"
            " WHERE indexrelid = 'console_traceevent_t0_spend'::regclass"
        )

    django(partitioned_database, "migrate", "-v0", "console", "0023")

    with psycopg.connect(partitioned_database) as conn:
        valid = dict(
            conn.execute(
                f"{_VALID} WHERE c.relname = ANY(%s)", ([*TRACE_INDEXES, *TASK_INDEXES],)
            ).fetchall()
        )
        children = conn.execute(_INDEXES_OF, (list(TRACE_INDEXES),)).fetchall()
        partitions = conn.execute(
            "SELECT count(*) FROM pg_inherits WHERE inhparent = 'console_traceevent'::regclass"
        ).fetchone()
        remade = conn.execute(
            "SELECT pg_get_indexdef('console_traceevent_t0_spend'::regclass)"
        ).fetchone()
        spent = conn.execute(
            "SELECT sum(cost) FROM console_traceevent WHERE at >= now() - interval '1 day'"
            " AND cost IS NOT NULL"
        ).fetchone()
    assert valid == dict.fromkeys([*TRACE_INDEXES, *TASK_INDEXES], True)
    assert partitions is not None and len(children) == 2 * int(str(partitions[0]))
    assert all(ok for _, _, ok in children)
    assert remade is not None and "INCLUDE (cost)" in str(remade[0])  # made anew, whole
    assert spent == (60,)  # 3 tasks x 4 model calls x 5
