"""Running ``python3 manage.py up`` as a user would, and looking at what it started.

Used by tests/test_first_run.py and tests/test_standalone.py: the command runs in a
subprocess whose output is collected line by line; a small cookie-keeping HTTP client
signs in with the credentials it printed; the process tree it started is read from /proc
so that a test can check nothing of it outlives Ctrl-C.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.cookiejar
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from tests.processes import ROOT, run
from tests.waiting import wait_for

CREDENTIAL = re.compile(r"^\s+(\w+)\s+password (\S+)$")
URL = re.compile(r"^LoopGuard console: (http://\S+)$")
CSRF_INPUT = re.compile(r'name="csrfmiddlewaretoken" value="([^"]+)"')


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def venv_is_current() -> bool:
    """Whether this checkout's .venv was installed from the pyproject.toml it has now (else
    manage.py would reinstall it under the running test suite)."""
    stamp = ROOT / ".venv" / ".loopguard-install"
    digest = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()
    return stamp.exists() and stamp.read_text().split()[:1] == [digest]


def first_python() -> str:
    """What `python3` means on this machine: the interpreter a user's first command uses."""
    return shutil.which("python3") or sys.executable


def manage(env: dict[str, str], *args: str) -> str:
    """Run ``python3 manage.py ARGS`` next to the running console; its standard output (the
    test fails with what it said if it did not succeed)."""
    done = run([first_python(), "manage.py", *args], env=env, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


# -- the process tree ------------------------------------------------------------------------


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    pgid: int
    started: int  # clock ticks after boot: tells a process from a later one with its pid
    state: str
    command: str


def processes() -> dict[int, Proc]:
    """Every process on the machine, from /proc."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
        except OSError:
            continue
        # The command name may hold spaces and parentheses: split after the last ")".
        fields = stat[stat.rindex(")") + 2 :].split()
        found[int(entry.name)] = Proc(
            pid=int(entry.name),
            ppid=int(fields[1]),
            pgid=int(fields[2]),
            started=int(fields[19]),
            state=fields[0],
            command=command,
        )
    return found


def descendants(root: int) -> list[Proc]:
    """The processes under ``root`` (children, grandchildren, ...)."""
    table = processes()
    below: list[Proc] = []
    frontier = [root]
    while frontier:
        parent = frontier.pop()
        for proc in table.values():
            if proc.ppid == parent:
                below.append(proc)
                frontier.append(proc.pid)
    return below


def survivors(started: list[Proc]) -> list[Proc]:
    """Those of ``started`` still alive, and anything else left in their process groups."""
    groups = {proc.pgid for proc in started}
    known = {(proc.pid, proc.started) for proc in started}
    return [
        proc
        for proc in processes().values()
        if proc.state != "Z" and ((proc.pid, proc.started) in known or proc.pgid in groups)
    ]


# -- manage.py up ------------------------------------------------------------------------------


class Up:
    """``python3 manage.py up`` in ``cwd``, its output collected (and copied to ``log``)."""

    def __init__(self, cwd: Path, env: dict[str, str], port: int, log: Path) -> None:
        self.cwd, self.env, self.port, self.log_path = cwd, env, port, log
        self.lines: list[str] = []
        self.process: subprocess.Popen[str] | None = None
        self._log: IO[str] | None = None
        self._reader: threading.Thread | None = None

    def start(self) -> None:
        self._log = self.log_path.open("w")
        self.process = subprocess.Popen(  # noqa: S603 - our own command
            [first_python(), "manage.py", "up", "--port", str(self.port)],
            cwd=self.cwd,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process is not None and self.process.stdout is not None
        assert self._log is not None
        for line in self.process.stdout:
            self.lines.append(line.rstrip("\n"))
            self._log.write(line)
            self._log.flush()

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def wait_for_line(self, pattern: re.Pattern[str], *, timeout: float) -> re.Match[str]:
        """The first output line matching ``pattern``; fails early if ``up`` exits."""

        def seen() -> re.Match[str] | None:
            for line in list(self.lines):
                if match := pattern.search(line):
                    return match
            if self.process is not None and self.process.poll() is not None:
                time.sleep(0.2)  # let the reader take the last lines
                raise AssertionError(
                    f"manage.py up exited ({self.process.returncode}) before printing "
                    f"{pattern.pattern!r}:\n{self.output[-4000:]}"
                )
            return None

        return wait_for(seen, timeout=timeout, what=f"{pattern.pattern!r} in the output")

    def ready(self, *, timeout: float = 60.0) -> tuple[str, dict[str, str]]:
        """Wait for the banner; return the URL and the printed credentials."""
        url = self.wait_for_line(URL, timeout=timeout).group(1)
        time.sleep(0.2)  # the banner is printed in one write; let the reader have it all
        people = {m.group(1): m.group(2) for line in self.lines if (m := CREDENTIAL.match(line))}
        return url, people

    def tree(self) -> list[Proc]:
        assert self.process is not None
        return descendants(self.process.pid)

    def interrupt(self, *, timeout: float = 30.0) -> int:
        """Ctrl-C: SIGINT to ``up`` alone (its children have process groups of their own)."""
        assert self.process is not None
        self.process.send_signal(signal.SIGINT)
        code = self.process.wait(timeout=timeout)
        if self._reader is not None:
            self._reader.join(timeout=5)
        return code

    def kill_everything(self, started: list[Proc]) -> None:
        """Clean-up after a failed test: nothing it started may outlive it."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        for proc in survivors(started):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(proc.pid, signal.SIGKILL)
        if self._log is not None:
            self._log.close()


# -- a signed-in person ------------------------------------------------------------------------


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None  # a redirect comes back as the response itself


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: str

    def json(self) -> Any:
        return json.loads(self.body)


class Browser:
    """Cookies, CSRF tokens and forms, as a browser handles them for the console's pages."""

    def __init__(self, base: str) -> None:
        self.base = base.rstrip("/")
        self.cookies = http.cookiejar.CookieJar()
        self.opener = urllib.request.build_opener(
            urllib.request.HTTPCookieProcessor(self.cookies), _NoRedirect()
        )

    def request(
        self, path: str, data: dict[str, str] | None = None, headers: dict[str, str] | None = None
    ) -> Reply:
        body = None if data is None else urllib.parse.urlencode(data).encode()
        request = urllib.request.Request(  # noqa: S310 - http://127.0.0.1 only
            self.base + path, data=body, headers=headers or {}
        )
        try:
            with self.opener.open(request, timeout=15) as response:
                return Reply(response.status, dict(response.headers), response.read().decode())
        except urllib.error.HTTPError as error:
            return Reply(error.code, dict(error.headers), error.read().decode())

    def get(self, path: str, headers: dict[str, str] | None = None) -> Reply:
        return self.request(path, headers=headers)

    def submit(self, path: str, fields: dict[str, str]) -> Reply:
        """GET the form at ``path`` for its CSRF token, then POST ``fields`` to it."""
        page = self.get(path)
        token = CSRF_INPUT.search(page.body)
        assert token is not None, f"no CSRF token in {path} ({page.status})"
        return self.request(path, {"csrfmiddlewaretoken": token.group(1), **fields})

    def sign_in(self, username: str, password: str) -> bool:
        reply = self.submit("/login", {"username": username, "password": password})
        return reply.status == 302 and self.get("/").status == 200
