"""A PostgreSQL database of a test's own, beside the test database, and Django's command line
run on it: for the tests that migrate a database from an older state (``migrate`` to a
migration, rows written as they were then, ``migrate`` again). And a session of a test's own
on the test database, beside Django's (:func:`other_session`), to end Django's from outside
(:func:`end_session`), as a restart or an idle timeout would. And the test database for a
process the test starts: its URL (:func:`database_url`) and environment
(:func:`on_test_database`)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import quote

import psycopg
from django.conf import settings
from django.db import connection

from tests.processes import clean_environment, run
from tests.waiting import wait_for


def database_url() -> str:
    """The URL of the database this test runs against, for processes started by the test."""
    db = connection.settings_dict
    user = quote(str(db.get("USER") or ""), safe="")
    password = quote(str(db.get("PASSWORD") or ""), safe="")
    auth = f"{user}:{password}@" if password else (f"{user}@" if user else "")
    port = f":{db['PORT']}" if db.get("PORT") else ""
    return f"postgres://{auth}{db.get('HOST') or '127.0.0.1'}{port}/{db['NAME']}"


def on_test_database(**overrides: str) -> dict[str, str]:
    """This process's environment with the test settings and the test database's URL, plus
    ``overrides``: for a process the test starts to work on that database."""
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "DATABASE_URL": database_url(),
        **overrides,
    }


def other_session() -> psycopg.Connection[tuple[object, ...]]:
    """A new autocommit session on the test database, not Django's."""
    db = connection.settings_dict
    return psycopg.connect(
        host=db["HOST"], port=db["PORT"], user=db["USER"], password=db["PASSWORD"] or None,
        dbname=db["NAME"], autocommit=True,
    )  # fmt: skip


def end_session(pid: int) -> None:
    """End the database session ``pid`` from a session of our own, and wait until the
    server has let it go."""
    with other_session() as other:
        other.execute("SELECT pg_terminate_backend(%s)", [pid])

        def gone() -> bool:
            found = other.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", [pid])
            return found.fetchone() is None

        wait_for(gone, timeout=5, what=f"session {pid} to end")


def cut_own_session() -> None:
    """End Django's own session (this thread's) from a session of our own and wait until it
    is gone: a real lost database for the next statement Django sends."""
    connection.ensure_connection()
    end_session(connection.connection.info.backend_pid)


@contextmanager
def own_database(suffix: str) -> Iterator[str]:
    """A new, empty database named after the test database and ``suffix`` (one left by an
    earlier run is dropped first), dropped again afterwards: its URL."""
    db = settings.DATABASES["default"]
    name = f"{db['NAME']}_{suffix}"
    server = f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}"
    with psycopg.connect(f"{server}/postgres", autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"{server}/{name}"
    finally:
        with psycopg.connect(f"{server}/postgres", autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def django(url: str, *argv: str) -> str:
    """``python -m django *argv`` on the database at ``url``: what it printed; the test fails
    with what it said on stderr if it did not succeed."""
    done = run(
        [sys.executable, "-m", "django", *argv],
        env=clean_environment(DATABASE_URL=url, DJANGO_SETTINGS_MODULE="console.project.settings"),
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout
