"""Real Celery workers for tests: started against the test database, stopped without a trace.

A worker is a process group of its own (prefork pool with two children, plus embedded beat
for the recovery sweep) consuming a queue of its own, talking to the real Redis and to the
test's PostgreSQL database. ``stop_worker`` takes the whole group down and leaves Redis as
it was found; ``kill_worker`` is a crash: SIGKILL to the group, no clean-up code runs.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import redis
from django.conf import settings

from tests.databases import on_test_database
from tests.waiting import wait_for

ROOT = Path(__file__).resolve().parents[1]
READY = re.compile(r"@\S+ ready\.")
STARTUP_S = 30.0
SHUTDOWN_S = 10.0


def worker_environment(queue: str, extra_env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a Celery worker or beat on ``queue`` (:func:`on_test_database`),
    plus ``extra_env``."""
    celery = {
        "CELERY_QUEUE": queue,
        # console.project.settings builds the beat schedule from this variable when it is
        # imported; tests.settings' own value comes too late to change it (see
        # test_the_beat_sweeps_as_often_as_the_test_settings_say).
        "LOOPGUARD_SWEEP_SECONDS": str(settings.LOOPGUARD_SWEEP_SECONDS),
        "PYTHONUNBUFFERED": "1",
    }
    return on_test_database(**{**celery, **(extra_env or {})})


@dataclass
class Worker:
    """A running Celery worker process group consuming ``queue``."""

    queue: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def start_worker(
    queue: str,
    directory: Path,
    *,
    beat: bool = True,
    extra_env: Mapping[str, str] | None = None,
) -> Worker:
    """Start a worker on ``queue`` and return once it is ready to consume it.

    Each start in ``directory`` gets a number of its own (the first is 1): its log is
    ``worker-<n>.log`` and its node name ``<queue>-<n>@host``, so that a worker started
    again after a crash neither reuses nor overwrites them.
    """
    number = len(list(directory.glob("worker-*.log"))) + 1
    log_path = directory / f"worker-{number}.log"
    env = worker_environment(queue, extra_env)
    command = [
        sys.executable, "-m", "celery", "-A", "console", "worker",
        "--pool=prefork", "-c", "2", "-Q", queue,
        "--without-mingle", "--without-gossip", "-l", "info",
        "-n", f"{queue}-{number}@%h",
    ]  # fmt: skip
    if beat:
        command += ["-B"]
    with log_path.open("wb") as log:
        process = subprocess.Popen(  # noqa: S603 - our own interpreter and arguments
            command,
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group, so that a kill takes all of it
        )
    worker = Worker(queue, process, log_path)
    try:
        wait_for(
            lambda: process.poll() is not None or READY.search(worker.log()),
            timeout=STARTUP_S,
            what=f"worker {number} on {queue} to be ready",
        )
        assert process.poll() is None, f"the worker exited:\n{worker.log()}"
    except BaseException:
        stop_worker(worker)  # nothing is left behind when the start fails
        raise
    return worker


def kill_worker(worker: Worker) -> None:
    """SIGKILL the whole worker process group: pool children and beat die mid-step."""
    with contextlib.suppress(ProcessLookupError):  # it may have died on its own
        os.killpg(worker.process.pid, signal.SIGKILL)
    worker.process.wait(timeout=10)


def stop_worker(worker: Worker) -> None:
    """Warm shutdown first (a running task acknowledges its message), then kill the group.

    The group is killed in every case and we wait until none of its processes is left, so
    that no pool child or beat outlives the test; then the queue is forgotten.
    """
    process = worker.process
    with contextlib.suppress(ProcessLookupError):
        os.kill(process.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=SHUTDOWN_S)
    kill_worker(worker)

    def group_gone() -> bool:
        try:
            os.killpg(process.pid, 0)
        except ProcessLookupError:
            return True
        return False

    wait_for(group_gone, timeout=10, what=f"worker process group {process.pid} to exit")
    forget_queue(worker.queue)


def forget_queue(queue: str) -> None:
    """Leave Redis as found: the queue, its priority lists, kombu's bindings for it, and the
    unacknowledged messages a killed worker left for it.

    Otherwise kombu's Redis transport would put those messages back on the queue after the
    visibility timeout, where no worker will ever read them.
    """
    client = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    try:
        client.delete(
            queue,
            *client.scan_iter(f"{queue}\x06\x16*"),
            *client.scan_iter(f"_kombu.binding*.{queue}"),
        )
        for tag, raw in client.hscan_iter("unacked"):
            _message, _exchange, routing_key = json.loads(raw)
            if routing_key == queue:
                client.zrem("unacked_index", tag)
                client.hdel("unacked", tag)
    finally:
        client.close()
