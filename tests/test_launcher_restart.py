"""``manage.py up`` starts a worker or beat again when it dies, a few times at most.

Celery can exit a whole worker (``WorkerLostError: Could not start worker processes``) when
a pool process dies while it starts; before, ``up`` then stopped the whole console. The
supervisor tests run real child processes (small Python programs that die when told to)
under the real :class:`~console.project.launcher.Supervisor`; the last test kills the worker of a
real ``manage.py up`` in standalone mode and uses the console afterwards.
"""

from __future__ import annotations

import os
import re
import signal
import sqlite3
import sys
from collections.abc import Callable, Iterator
from contextlib import closing
from pathlib import Path
from types import ModuleType

import pytest

from console.project import launcher
from console.project.launcher import Child, Restarts, Supervisor
from tests.processes import standalone_environment
from tests.up_process import (
    ROOT,
    Proc,
    Up,
    free_port,
    manage,
    survivors,
    venv_is_current,
)
from tests.waiting import wait_for

# A child that appends a line to a file each time it starts, then either stays up or exits
# with a status: ``python -c PROGRAM starts-file exit-on-starts status``.
PROGRAM = """
import sys, time
path, dying, status = sys.argv[1], sys.argv[2].split(","), sys.argv[3]
with open(path, "a") as starts:
    starts.write("started\\n")
with open(path) as starts:
    count = len(starts.readlines())
if str(count) in dying or "all" in dying:
    sys.exit(int(status))
time.sleep(120)
"""


def program(starts: Path, *, dies_on: str = "", status: int = 1) -> list[str]:
    """The command of a child that dies with ``status`` on the starts listed in ``dies_on``
    ("1,2": its first two, "all": every one) and otherwise stays up."""
    return [sys.executable, "-c", PROGRAM, str(starts), dies_on, str(status)]


def starts_of(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


@pytest.fixture
def supervise(capsys: pytest.CaptureFixture[str]) -> Iterator[Callable[..., Supervisor]]:
    """Start a supervisor over the given children; stop it and restore pytest's signal
    handlers (Supervisor.start installs its own) afterwards."""
    handlers = {
        sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    }
    made: list[Supervisor] = []

    def start(*processes: Child, restarts: Restarts | None = None) -> Supervisor:
        supervisor = Supervisor(list(processes), grace=1.0, restarts=restarts)
        supervisor.start({**os.environ, "PYTHONUNBUFFERED": "1"})
        made.append(supervisor)
        return supervisor

    try:
        yield start
    finally:
        for supervisor in made:
            supervisor.stop()
        for sig, handler in handlers.items():
            signal.signal(sig, handler)


def watch(supervisor: Supervisor, until: Callable[[], bool], *, timeout: float = 30) -> None:
    """Do what ``up``'s loop does (mend, then look again) until ``until()``; fails if a child
    died for good meanwhile."""

    def mended() -> bool:
        given_up = supervisor.mend()
        assert given_up is None, f"gave {given_up.name} up"
        return until()

    wait_for(mended, timeout=timeout, what="the supervisor to mend its children", every=0.05)


def lines(capsys: pytest.CaptureFixture[str]) -> list[str]:
    return [line for line in capsys.readouterr().out.splitlines() if line.startswith("manage.py")]


# -- the supervisor ------------------------------------------------------------------------------


def test_a_worker_that_dies_is_started_again_and_the_web_server_goes_on(
    supervise: Callable[..., Supervisor], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    web = Child("web", program(tmp_path / "web"))
    worker = Child("worker", program(tmp_path / "worker", dies_on="1", status=3), restartable=True)
    supervisor = supervise(web, worker)
    web_pid, first_worker = web.pid, worker.pid

    watch(supervisor, lambda: starts_of(tmp_path / "worker") == 2)

    assert worker.exited() is None and worker.pid != first_worker
    assert web.exited() is None and web.pid == web_pid
    assert starts_of(tmp_path / "web") == 1
    assert lines(capsys) == [
        f"manage.py up: the worker process (pid {first_worker}) exited unexpectedly with status "
        f"3; started it again as pid {worker.pid} (restart 1, at most 5 in 10 minutes)"
    ]


def test_a_beat_that_dies_is_started_again_too(
    supervise: Callable[..., Supervisor], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    web = Child("web", program(tmp_path / "web"))
    beat = Child("beat", program(tmp_path / "beat", dies_on="1,2"), restartable=True)
    supervisor = supervise(web, beat)

    watch(supervisor, lambda: starts_of(tmp_path / "beat") == 3)

    assert beat.exited() is None and web.exited() is None
    said = lines(capsys)
    assert [re.sub(r".*\((restart \d+).*", r"\1", line) for line in said] == [
        "restart 1",
        "restart 2",
    ]


def test_a_worker_that_keeps_dying_is_given_up_after_five_restarts_and_the_rest_is_stopped(
    supervise: Callable[..., Supervisor], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    web = Child("web", program(tmp_path / "web"))
    worker = Child("worker", program(tmp_path / "worker", dies_on="all"), restartable=True)
    supervisor = supervise(web, worker)

    given_up = wait_for(supervisor.mend, timeout=60, what="the supervisor to give up", every=0.05)
    last = worker.pid
    supervisor.stop()

    assert given_up is worker
    assert starts_of(tmp_path / "worker") == 6  # the first start and five restarts
    said = lines(capsys)
    assert len([line for line in said if "started it again" in line]) == 5
    assert said[-1] == (
        f"manage.py up: the worker process (pid {last}) exited unexpectedly with status 1, "
        "after 5 restarts within 10 minutes: giving up; stopping the others"
    )
    assert web.exited() is not None, "the web server was left running"


def test_a_web_server_that_dies_is_not_started_again_and_stops_the_console(
    supervise: Callable[..., Supervisor], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    web = Child("web", program(tmp_path / "web", dies_on="1", status=4))
    worker = Child("worker", program(tmp_path / "worker"), restartable=True)
    supervisor = supervise(web, worker)

    given_up = wait_for(supervisor.mend, timeout=30, what="the web server's death", every=0.05)

    assert given_up is web
    assert starts_of(tmp_path / "web") == 1
    assert lines(capsys) == [
        f"manage.py up: the web process (pid {web.pid}) exited unexpectedly with status 4; "
        "stopping the others"
    ]


def test_restarts_older_than_the_window_no_longer_count() -> None:
    restarts = Restarts(limit=2, window=600.0)

    assert [restarts.allow("worker", at) for at in (0.0, 100.0, 200.0)] == [1, 2, None]
    # Beat has a bound of its own.
    assert restarts.allow("beat", 200.0) == 1
    # Ten minutes after the first restart, one more is allowed; the refused one never counted.
    assert restarts.allow("worker", 600.0) == 2
    assert restarts.allow("worker", 650.0) is None
    assert restarts.allow("worker", 700.0) == 2


def test_up_starts_the_worker_and_beat_again_but_not_the_web_server() -> None:
    options = launcher.parse([])
    config = ModuleType("settings")

    restartable = {child.name: child.restartable for child in launcher.children(options, config)}

    assert restartable == {"web": False, "worker": True, "beat": True}


# -- manage.py up ----------------------------------------------------------------------------------


@pytest.mark.slow
def test_up_starts_a_killed_worker_again_and_the_console_keeps_running_tasks(
    tmp_path: Path,
) -> None:
    if not venv_is_current():
        pytest.skip(".venv is older than pyproject.toml: run `python3 manage.py check` once")
    data_dir = tmp_path / "loopguard-data"
    env = standalone_environment(data_dir)
    up = Up(ROOT, env, free_port(), tmp_path / "up.log")
    started: list[Proc] = []
    try:
        up.start()
        up.ready()
        assert up.process is not None
        started = up.tree()
        worker = next(p for p in started if p.ppid == up.process.pid and " worker " in p.command)

        os.kill(worker.pid, signal.SIGKILL)
        again = up.wait_for_line(
            re.compile(
                rf"the worker process \(pid {worker.pid}\) exited unexpectedly with status -9; "
                r"started it again as pid (\d+) \(restart 1, at most 5 in 10 minutes\)"
            ),
            timeout=15,
        )
        new_worker = int(again.group(1))
        started += up.tree()

        # The new worker drives a task started now.
        task_id = int(manage(env, "start_task", "paging", "{}").split()[-1])

        def state() -> str | None:
            with closing(sqlite3.connect(data_dir / "loopguard.sqlite3", timeout=10)) as db:
                row = db.execute(
                    "SELECT state FROM console_task WHERE id = ?", [task_id]
                ).fetchone()
            return row[0] if row and row[0] not in {"QUEUED", "RUNNING"} else None

        assert wait_for(state, timeout=60, what=f"task {task_id} to finish") == "COMPLETED"
        assert up.process.poll() is None, up.output[-3000:]
        assert any(p.pid == new_worker for p in up.tree())

        code = up.interrupt()

        assert code == 0, up.output[-3000:]
        assert survivors(started) == []
    finally:
        up.kill_everything(started)
