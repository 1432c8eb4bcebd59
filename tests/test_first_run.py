"""The README's first command, from a clean clone, brings up a console people can sign in to.

The clone is the files git would hand out (tracked and new, not ignored: ``git ls-files
-co --exclude-standard``) copied into a temporary folder. Its ``.venv`` is this checkout's,
linked in, so that the test does not spend minutes installing packages: manage.py then
finds a venv that matches pyproject.toml and installs nothing, and everything else is the
real first run — choosing PostgreSQL and Redis, creating the database, migrating, the demo,
gunicorn, the worker and beat, from the clone's own code (``up`` puts the clone first on
the children's PYTHONPATH). Set ``LOOPGUARD_TEST_FRESH_VENV=1`` to build a venv from
scratch instead (needs the package index and a few minutes).

It runs against its own database on the test PostgreSQL (dropped afterwards) and its own
queue on the test Redis, so it cannot take work from another console on this machine.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psycopg
import pytest
from django.conf import settings
from psycopg import sql

from tests.processes import clean_environment
from tests.up_process import (
    ROOT,
    Browser,
    Proc,
    Up,
    free_port,
    survivors,
    venv_is_current,
)
from tests.waiting import wait_for

pytestmark = pytest.mark.slow

FRESH_VENV = os.environ.get("LOOPGUARD_TEST_FRESH_VENV", "") == "1"


def clone_into(target: Path) -> None:
    """Copy what a clone of this checkout (with its uncommitted work) would contain."""
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"],  # noqa: S607
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if not source.is_file():  # deleted in the working tree
            continue
        (target / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target / name)


def database_url(name: str) -> str:
    db = settings.DATABASES["default"]
    user = quote(str(db.get("USER") or ""), safe="")
    password = quote(str(db.get("PASSWORD") or ""), safe="")
    auth = f"{user}:{password}@" if password else (f"{user}@" if user else "")
    port = f":{db['PORT']}" if db.get("PORT") else ""
    return f"postgres://{auth}{db.get('HOST') or '127.0.0.1'}{port}/{name}"


def connect(name: str) -> psycopg.Connection[Any]:
    db: dict[str, Any] = settings.DATABASES["default"]
    return psycopg.connect(
        host=db.get("HOST") or None,
        port=db.get("PORT") or None,
        user=db.get("USER") or None,
        password=db.get("PASSWORD") or None,
        dbname=name,
        autocommit=True,
    )


def drop_database(name: str) -> None:
    with connect("postgres") as conn:
        drop = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)")
        conn.execute(drop.format(sql.Identifier(name)))


def rows(database: str, query: str) -> list[tuple[Any, ...]]:
    """What ``query`` finds in the console's database now."""
    with connect(database) as conn:
        return conn.execute(query).fetchall()


def environ(pid: int) -> dict[str, str]:
    """The environment process ``pid`` was started with."""
    pairs = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(pair.decode().split("=", 1) for pair in pairs if b"=" in pair)


@pytest.fixture
def clone(tmp_path: Path) -> Path:
    if not FRESH_VENV and not venv_is_current():
        pytest.skip(".venv is older than pyproject.toml: run `python3 manage.py check` once")
    folder = tmp_path / "loopguard"
    folder.mkdir()
    clone_into(folder)
    if not FRESH_VENV:
        (folder / ".venv").symlink_to(ROOT / ".venv")
    return folder


@pytest.fixture
def database() -> Iterator[str]:
    name = f"lg_first_run_{uuid.uuid4().hex[:10]}"
    yield name
    drop_database(name)


def test_the_first_command_brings_up_a_console_and_ctrl_c_takes_all_of_it_down(
    clone: Path, database: str, tmp_path: Path
) -> None:
    port = free_port()
    env = clean_environment(
        DATABASE_URL=database_url(database),
        REDIS_URL=str(settings.REDIS_URL),
        CELERY_QUEUE=f"loopguard-first-run-{uuid.uuid4().hex[:8]}",
    )
    env.pop("LOOPGUARD_PUBLIC_URL", None)  # a first run has none: `up` tells its own
    up = Up(clone, env, port, tmp_path / "up.log")
    started: list[Proc] = []
    try:
        up.start()
        url, people = up.ready(timeout=600 if FRESH_VENV else 60)

        assert url == f"http://127.0.0.1:{port}/"
        said = [line for line in up.lines if line.startswith("manage.py up:")]
        assert said[0].startswith("manage.py up: PostgreSQL at "), said  # not standalone
        assert "created the database" in up.output
        started = up.tree()
        names = " ".join(proc.command for proc in started)
        assert "gunicorn" in names and "celery" in names and " beat " in names, names
        # The clone's code runs, not this checkout's.
        assert all(Path(f"/proc/{p.pid}/cwd").resolve() == clone.resolve() for p in started)
        # Notices the worker and beat send link to the address `up` serves.
        public = {environ(p.pid).get("LOOPGUARD_PUBLIC_URL") for p in started}
        assert public == {f"http://127.0.0.1:{port}"}, public

        browser = Browser(url)
        login = browser.get("/login")
        assert login.status == 200 and 'name="password"' in login.body
        health = browser.get("/healthz")
        assert health.status == 200, health.body
        assert health.json() == {"status": "ok", "checks": {"database": "ok", "redis": "ok"}}

        assert set(people) == {"admin", "operator", "reconciler", "approver", "viewer"}
        for username, password in people.items():
            assert Browser(url).sign_in(username, password), f"{username} cannot sign in"
        assert not Browser(url).sign_in("admin", "not-the-password")
        assert browser.sign_in("viewer", people["viewer"])
        tasks = browser.get("/tasks/")
        assert tasks.status == 200
        assert "long_runner" in tasks.body and "lost_response" in tasks.body

        # Something to do at once: a refund waiting for an approver, a task to stop.
        pending = wait_for(
            lambda: rows(
                database,
                "SELECT tool, operation_key FROM console_approval WHERE state = 'PENDING'",
            ),
            timeout=60,
            what="the demo's refund to wait in the approval queue",
            every=0.5,
        )
        assert pending == [("refund", "order-46-refund")]
        running = wait_for(
            lambda: rows(
                database,
                # The one `up` keeps running, not the one the admin stops.
                "SELECT id FROM console_task WHERE agent = 'long_runner' AND state = 'RUNNING' "
                "AND input->>'delay_ms' = '5000' AND stop_requested_at IS NULL",
            ),
            timeout=60,
            what="the demo's running task",
            every=0.5,
        )
        assert len(running) == 1, running

        code = up.interrupt()

        assert code == 0, up.output[-3000:]
        assert up.lines[-1] == "manage.py up: stopped"
        assert survivors(started) == []
    finally:
        up.kill_everything(started)
