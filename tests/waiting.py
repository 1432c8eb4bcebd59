"""Helpers for tests that wait on other processes (no Django, no Redis: any test may use them)."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tests.processes import standalone_environment


def wait_for[T](
    probe: Callable[[], T | None],
    *,
    timeout: float,
    what: str,
    every: float = 0.02,
    explain: Callable[[], str] | None = None,
) -> T:
    """Poll ``probe`` until it returns something truthy; fail naming ``what`` otherwise,
    with what ``explain`` says about the state things were left in (logs, rows)."""
    end = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > end:
            said = f"\n{explain()}" if explain is not None else ""
            raise AssertionError(f"gave up after {timeout:.1f} s waiting for {what}{said}")
        time.sleep(every)


def release_together(
    processes: Sequence[subprocess.Popen[str]], *, delay: float, timeout: float
) -> list[Any]:
    """Start racing processes at one moment and return each one's last JSON line.

    Each process prints ``ready`` once connected, then reads a start time (epoch seconds)
    from its standard input and begins then, so that every racer is already connected
    when the race starts. Processes still running at the end are killed.
    """
    try:
        for process in processes:
            assert process.stdout is not None
            line = process.stdout.readline().strip()
            assert line == "ready", process.stderr.read() if process.stderr else line
        start = f"{time.time() + delay}\n"
        for process in processes:
            assert process.stdin is not None
            process.stdin.write(start)
            process.stdin.flush()
        outputs = [process.communicate(timeout=timeout) for process in processes]
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
    for process, (_, stderr) in zip(processes, outputs, strict=True):
        assert process.returncode == 0, stderr
    return [json.loads(stdout.strip().splitlines()[-1]) for stdout, _ in outputs]


# A racing ledger client, run by each racing process as `python -c CLAIMER task_id owner
# fingerprint slot keys-json` (with DJANGO_SETTINGS_MODULE and DATABASE_URL set). It
# connects first and says "ready", then claims every key at the start time the parent sends
# (see release_together) plus ``n`` slots, so that all processes hit each key together.
CLAIMER = """
import json, sys, time
import django
django.setup()
from console.drivers.ledger import DatabaseLedger
task_id, owner, fingerprint, slot = int(sys.argv[1]), sys.argv[2], sys.argv[3], float(sys.argv[4])
keys = json.loads(sys.argv[5])
ledger = DatabaseLedger(task_id=task_id, owner=owner)
ledger.get("warm-up")
print("ready", flush=True)
start = float(sys.stdin.readline())
answers = {}
for n, key in enumerate(keys):
    at = start + n * slot
    while (left := at - time.time()) > 0:
        time.sleep(min(left, 0.0005))
    answers[key] = str(ledger.claim(key, fingerprint).status)
print(json.dumps(answers), flush=True)
"""


def standalone_env(data: Path) -> dict[str, str]:
    """The environment of a console process in standalone mode (SQLite under ``data``),
    with the test settings (:func:`tests.processes.standalone_environment`)."""
    return standalone_environment(data, DJANGO_SETTINGS_MODULE="tests.settings")
