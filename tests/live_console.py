"""A live console served by gunicorn exactly as ``manage.py up`` serves it (its own command
line: two workers of four threads), on the test database, for the tests that kill, cut and
restart what production runs (tests/console/test_database_cut.py,
tests/console/test_attached_chaos.py).

``serve`` starts it and stops it (the whole process group); ``LiveConsole.call`` is one
request on a connection of its own, as a person's program sends it.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.client import HTTPConnection
from pathlib import Path
from types import ModuleType
from typing import Any

from console.project import launcher
from tests.databases import database_url
from tests.processes import ROOT, clean_environment
from tests.up_process import descendants, free_port
from tests.waiting import wait_for


@dataclass(frozen=True)
class Answer:
    status: int
    retry_after: str | None
    body: Any


@dataclass(frozen=True)
class LiveConsole:
    url: str
    log: Callable[[], str]
    pid: int  # gunicorn's master

    def call(self, token: str, method: str, path: str, body: Any = None) -> Answer:
        """One request on a connection of its own, as a person's program sends it."""
        conn = HTTPConnection(self.url.removeprefix("http://"), timeout=15)
        headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        try:
            conn.request(method, path, None if body is None else json.dumps(body), headers)
            response = conn.getresponse()
            raw = response.read()
        finally:
            conn.close()
        try:
            parsed = json.loads(raw)
        except ValueError:
            parsed = raw.decode(errors="replace")
        return Answer(response.status, response.getheader("Retry-After"), parsed)

    def workers(self) -> list[int]:
        """The pids of gunicorn's worker processes now (the master respawns a killed one)."""
        return [proc.pid for proc in descendants(self.pid) if proc.pid != self.pid]


@contextmanager
def serve(log_dir: Path, *, debug: bool = False, **settings: str) -> Iterator[LiveConsole]:
    """gunicorn with ``up``'s own command line on the test database; ``settings`` are
    more environment variables (``LOOPGUARD_ATTACHED_LEASE_SECONDS="1.5"``, say)."""
    port = free_port()
    options = launcher.parse(["--port", str(port)])
    children = launcher.children(options, ModuleType("settings"))
    (web,) = [child for child in children if child.name == "web"]
    env = clean_environment(
        DJANGO_SETTINGS_MODULE="console.project.settings",
        PYTHONPATH=str(ROOT),
        DATABASE_URL=database_url(),
        REDIS_URL=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"),
        DJANGO_DEBUG="true" if debug else "false",
        DJANGO_SECRET_KEY=secrets.token_urlsafe(50),
        DJANGO_LOG_LEVEL="WARNING",
        **settings,
    )
    log_path = log_dir / "gunicorn.log"
    with log_path.open("w") as log:
        process = subprocess.Popen(  # noqa: S603 - our own interpreter and arguments
            web.argv, cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=log,
            stderr=subprocess.STDOUT, process_group=0,
        )  # fmt: skip
    try:
        served = LiveConsole(f"http://127.0.0.1:{port}", log_path.read_text, process.pid)

        def up() -> bool:
            if process.poll() is not None:
                raise AssertionError(f"gunicorn exited:\n{log_path.read_text()[-4000:]}")
            try:
                return served.call("", "GET", "/healthz").status == 200
            except OSError:
                return False

        wait_for(up, timeout=60, what="gunicorn to answer /healthz", every=0.2)
        yield served
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
