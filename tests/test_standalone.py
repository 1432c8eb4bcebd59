"""Standalone mode end to end: SQLite and a filesystem broker, no PostgreSQL, no Redis.

The one test that needs neither server: ``manage.py up`` is forced into standalone mode
(``LOOPGUARD_STANDALONE=1``) with ``DATABASE_URL`` and ``REDIS_URL`` pointing at closed
ports, so that any use of them would fail. A task started through the console finishes,
another one started with ``manage.py start_task`` is stopped through the console, and the
demo's lost response leaves an ``UNKNOWN`` operation in the SQLite ledger — the same code
paths as with PostgreSQL and Redis.
"""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path
from typing import Any

import pytest

from tests.processes import standalone_environment
from tests.up_process import (
    ROOT,
    Browser,
    Proc,
    Up,
    free_port,
    manage,
    survivors,
    venv_is_current,
)
from tests.waiting import wait_for

pytestmark = pytest.mark.slow


class Api:
    """The JSON API with a bearer token, through the running console."""

    def __init__(self, browser: Browser, token: str) -> None:
        self.browser = browser
        self.headers = {"Authorization": f"Bearer {token}"}

    def get(self, path: str) -> Any:
        reply = self.browser.get(path, headers=self.headers)
        assert reply.status == 200, reply.body
        return reply.json()

    def task(self, task_id: int) -> dict[str, Any]:
        task: dict[str, Any] = self.get(f"/api/tasks/{task_id}")["task"]
        return task

    def wait_state(self, task_id: int, state: str, *, timeout: float = 30) -> dict[str, Any]:
        return wait_for(
            lambda: (t := self.task(task_id))["state"] == state and t,
            timeout=timeout,
            what=f"task {task_id} to be {state}",
        )


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    if not venv_is_current():
        pytest.skip(".venv is older than pyproject.toml: run `python3 manage.py check` once")
    return tmp_path / "loopguard-data"


def test_standalone_mode_runs_finishes_and_stops_tasks_on_sqlite_and_folders(
    data_dir: Path, tmp_path: Path
) -> None:
    env = standalone_environment(data_dir)
    up = Up(ROOT, env, free_port(), tmp_path / "up.log")
    started: list[Proc] = []
    try:
        up.start()
        url, people = up.ready()
        started = up.tree()

        said = [line for line in up.lines if line.startswith("manage.py up:")]
        assert said[0].startswith("manage.py up: STANDALONE MODE"), said
        assert (data_dir / "loopguard.sqlite3").is_file()
        browser = Browser(url)
        health = browser.get("/healthz")
        assert health.json() == {"status": "ok", "checks": {"database": "ok", "broker": "ok"}}

        assert browser.sign_in("operator", people["operator"])
        token = manage(env, "create_api_token", "operator", "--name", "standalone-test")
        api = Api(browser, token.strip().splitlines()[-1])

        # Started through the console, it runs to the end.
        started_page = browser.submit(
            "/tasks/new",
            {
                "agent": "paging",
                "input": '{"collection": "reports"}',
                "limits": "",
                "reason": "standalone test",
            },
        )
        assert started_page.status == 302, started_page.body[-2000:]
        found = re.fullmatch(r"/tasks/(\d+)/", started_page.headers["Location"])
        assert found is not None, started_page.headers["Location"]
        paging = int(found.group(1))
        # Started from the shell, it is stopped through the console while it runs.
        runner = int(
            manage(env, "start_task", "long_runner", '{"pages": 60, "delay_ms": 300}').split()[-1]
        )

        done = api.wait_state(paging, "COMPLETED")
        assert (done["reason"], done["counters"]["executions"]) == ("goal_met", 3)
        wait_for(
            lambda: api.task(runner)["state"] == "RUNNING" and api.task(runner)["revision"] >= 1,
            timeout=30,
            what="the long runner to make progress",
        )
        stop = browser.submit(f"/tasks/{runner}/stop", {"reason": "standalone test: stop it"})
        assert stop.status == 302, stop.body[-2000:]
        stopped = api.wait_state(runner, "CANCELLED")
        assert stopped["reason"] == "operator_stop"
        assert stopped["revision"] < 60

        # The demo's own work: an operator stop, and a lost response left UNKNOWN.
        up.wait_for_line(re.compile(r"demo: the admin stopped task \d+"), timeout=30)
        operations = api.get("/api/operations")
        unknown = [op for op in operations["operations"] if op["state"] == "UNKNOWN"]
        assert [op["key"] for op in unknown] == ["incident-102-first-notice"], operations

        code = up.interrupt()

        assert code == 0, up.output[-3000:]
        assert survivors(started) == []
    finally:
        up.kill_everything(started)


def test_when_the_web_server_dies_up_stops_the_others_and_says_so(
    data_dir: Path, tmp_path: Path
) -> None:
    # A worker or beat that dies is started again (tests/test_launcher_restart.py); the web
    # server is not: the console would be gone from the address it printed.
    env = standalone_environment(data_dir)
    up = Up(ROOT, env, free_port(), tmp_path / "up.log")
    started: list[Proc] = []
    try:
        up.start()
        up.ready()
        started = up.tree()
        assert up.process is not None
        web = next(p for p in started if p.ppid == up.process.pid and " gunicorn " in p.command)

        os.kill(web.pid, signal.SIGKILL)

        assert up.process.wait(timeout=30) == 1
        up.wait_for_line(
            re.compile(rf"the web process \(pid {web.pid}\) exited unexpectedly"), timeout=5
        )
        assert survivors(started) == []
    finally:
        up.kill_everything(started)
