"""Chaos for attached agents: several clients in processes of their own, each sending its
incident's first notice through the console's ledger, against gunicorn as ``manage.py up``
serves it, while the clients are SIGKILLed (and restarted as the agent guide says: the same
task, ``RemoteGuard.attach`` with the tool's lookup) or frozen past their lease, gunicorn's
workers are killed mid-step and the console's database sessions are cut.

The business system (one line per notice sent, in a file) has no idempotency of its own:
only the ledger stands between a retry and a second notice. Afterwards: no notice twice,
nothing committed that the business system lacks, nothing left ``IN_FLIGHT``, and every task
stopped with its report or waiting for its client. The run is seeded
(``CHAOS_SEED``); a failure prints its timeline of faults.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection

from console.api.tokens import api_token_issue
from console.drivers import runner
from console.models import Operation, OperationState, StopReport, Task, TaskState
from console.records.roles import Role, assign
from tests.console.attached_agent import notice
from tests.live_console import LiveConsole, serve
from tests.up_process import ROOT

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

SEED = int(os.environ.get("CHAOS_SEED", "20261203"))
CLIENTS = 6
LEASE_SECONDS = 1.5
RUN_SECONDS = 40.0  # faults stop after this; the clients then get to finish
SETTLE_SECONDS = 60.0


@dataclass
class Client:
    """One agent's process (and the ones restarted after it) for one incident."""

    incident: int
    process: subprocess.Popen[str]
    task: int = 0
    restarts: int = 0
    frozen_until: float = 0.0
    outcome: dict[str, Any] = field(default_factory=dict)


class Chaos:
    def __init__(self, console: LiveConsole, token: str, record: Path, rng: random.Random):
        self.console = console
        self.token = token
        self.record = record
        self.rng = rng
        self.timeline: list[str] = []
        self.started = time.monotonic()
        self.clients = [self._spawn(incident) for incident in range(1, CLIENTS + 1)]
        self.finished: list[Client] = []
        self.incidents = CLIENTS

    def note(self, what: str) -> None:
        self.timeline.append(f"{time.monotonic() - self.started:6.2f}s {what}")

    def _spawn(self, incident: int, task: int = 0) -> Client:
        command = [
            sys.executable, "-m", "tests.console.attached_agent", "send",
            "--url", self.console.url, "--token", self.token, "--record", str(self.record),
            "--incident", str(incident), "--hold", "0.8", "--lookup",
            "--start-id", f"chaos-{SEED}-incident-{incident}",
        ]  # fmt: skip
        if task:
            command += ["--task", str(task)]
        env = {**os.environ, "PYTHONPATH": str(ROOT), "NO_PROXY": "*"}
        process = subprocess.Popen(  # noqa: S603 - our own script
            command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        return Client(incident, process, task)

    def tend(self, *, more: bool) -> None:
        """Restart every client that died before its task stopped; keep what finished, and
        (with ``more``) give its place to the next incident's client."""
        for n, client in enumerate(self.clients):
            if client.outcome:
                if more:
                    self.finished.append(client)
                    self.incidents += 1
                    self.clients[n] = self._spawn(self.incidents)
                continue
            if client.process.poll() is None:
                continue
            out, err = client.process.communicate()
            lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
            if lines and not client.task:
                client.task = int(lines[0]["task"])
            if client.process.returncode == 0 and len(lines) > 1:
                client.outcome = lines[-1]
                self.note(f"incident {client.incident}: finished {lines[-1]['state']}")
                continue
            last = err.strip().splitlines()[-1] if err.strip() else ""
            why = last or f"exit {client.process.returncode}"
            if not client.task:  # died before it saw its start's answer: the same start again
                self.note(f"incident {client.incident}: died before its start's answer ({why})")
                self.clients[n] = self._spawn(client.incident)
                continue
            self.note(f"incident {client.incident}: restarted (task {client.task}; {why[:120]})")
            again = self._spawn(client.incident, client.task)
            again.restarts = client.restarts + 1
            self.clients[n] = again

    def fault(self) -> None:
        running = [c for c in self.clients if not c.outcome and c.process.poll() is None]
        kind = self.rng.choice(["kill", "kill", "freeze", "worker", "cut"])
        if kind == "kill" and running:
            victim = self.rng.choice(running)
            victim.process.send_signal(signal.SIGKILL)
            self.note(f"KILL-CLIENT of incident {victim.incident}")
        elif kind == "freeze" and running:
            victim = self.rng.choice(running)
            if not victim.frozen_until:
                victim.process.send_signal(signal.SIGSTOP)
                victim.frozen_until = time.monotonic() + LEASE_SECONDS * 2
                self.note(f"FREEZE-CLIENT of incident {victim.incident}, past its lease")
        elif kind == "worker":
            workers = self.console.workers()
            if workers:
                pid = self.rng.choice(workers)
                os.kill(pid, signal.SIGKILL)
                self.note(f"KILL-WORKER {pid} of gunicorn")
        elif kind == "cut":
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                )
                (cut,) = cursor.fetchone()
            self.note(f"CUT-DB: {cut} sessions of the console ended")

    def thaw(self) -> None:
        now = time.monotonic()
        for client in self.clients:
            if client.frozen_until and now >= client.frozen_until:
                if client.process.poll() is None:
                    client.process.send_signal(signal.SIGCONT)
                client.frozen_until = 0.0
                self.note(f"thaw incident {client.incident}'s client")

    def done(self) -> bool:
        return all(client.outcome for client in self.clients)

    @property
    def every(self) -> list[Client]:
        return [*self.finished, *self.clients]

    def stop(self) -> None:
        for client in self.clients:
            if client.process.poll() is None:
                client.process.send_signal(signal.SIGCONT)
                client.process.kill()
                client.process.wait(timeout=10)


def test_attached_clients_killed_frozen_and_cut_off_never_send_twice_nor_lose_a_commit(
    tmp_path: Path, settings: Any
) -> None:
    settings.LOOPGUARD_ATTACHED_LEASE_SECONDS = LEASE_SECONDS
    settings.LOOPGUARD_MAX_RECOVERIES = 50  # every kill is a recovery; this run has many
    user = User.objects.create_user("chaos-agent")
    assign(user, [Role.AGENT])
    token = api_token_issue(user=user, name="chaos")[1]
    record = tmp_path / "notices.txt"
    record.touch()
    rng = random.Random(SEED)
    with serve(
        tmp_path,
        LOOPGUARD_ATTACHED_LEASE_SECONDS=str(LEASE_SECONDS),
        LOOPGUARD_MAX_RECOVERIES="50",
    ) as console:
        chaos = Chaos(console, token, record, rng)
        try:
            while time.monotonic() - chaos.started < RUN_SECONDS:
                time.sleep(rng.uniform(0.1, 0.6))
                chaos.fault()
                chaos.thaw()
                chaos.tend(more=True)
                runner.sweep(lambda task_id: None)  # the beat's job, here
            chaos.note("faults stop")
            end = time.monotonic() + SETTLE_SECONDS
            while not chaos.done() and time.monotonic() < end:
                time.sleep(0.3)
                chaos.thaw()
                chaos.tend(more=False)
                runner.sweep(lambda task_id: None)
        finally:
            chaos.stop()
        log = console.log()

    timeline = "\n".join(chaos.timeline)
    sent = Counter(line.split(" ", 1)[1] for line in record.read_text().splitlines())
    tasks = {client.incident: client.task for client in chaos.every}
    states = {t.id: (t.state, t.reason) for t in Task.objects.filter(id__in=tasks.values())}
    summary = f"seed {SEED}; sent {dict(sent)}; tasks {states}\n{timeline}"

    assert chaos.done(), f"not every client finished:\n{summary}"
    assert all(count == 1 for count in sent.values()), f"a notice went out twice:\n{summary}"
    for op in Operation.objects.all():
        assert op.state != OperationState.IN_FLIGHT, f"{op.key} left IN_FLIGHT:\n{summary}"
        if op.state == OperationState.COMMITTED:
            text = notice(int(op.key.split("-")[1])).args["text"]
            assert sent[text] == 1, f"{op.key} COMMITTED without its notice:\n{summary}"
    for task in Task.objects.filter(id__in=tasks.values()):
        waiting = task.state == TaskState.QUEUED and task.waiting_for_client_since is not None
        assert task.is_terminal or waiting, f"task {task.id} is {task.state}:\n{summary}"
        if task.is_terminal:
            assert StopReport.objects.filter(task=task).exists(), summary
    failure = log.find("Traceback")
    assert failure < 0, f"the console failed:\n{log[failure - 500 : failure + 4000]}\n{summary}"
    # What this run did, for the people reading the CI log.
    people = list(
        Task.objects.filter(id__in=tasks.values(), state=TaskState.NEEDS_HUMAN).values_list(
            "reason", "detail"
        )
    )
    faults = Counter(line.split()[1] for line in chaos.timeline if line.split()[1].isupper())
    restarts = sum("restarted" in line for line in chaos.timeline)
    print(f"attached chaos: {len(states)} tasks, faults {dict(faults)}, {restarts} restarts; "
          f"{len(people)} wait for a person: {people}")  # fmt: skip
