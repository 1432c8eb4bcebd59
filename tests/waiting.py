"""Helpers for tests that wait on other processes (no Django, no Redis: any test may use them)."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable, Sequence
from typing import Any


def wait_for[T](
    probe: Callable[[], T | None], *, timeout: float, what: str, every: float = 0.02
) -> T:
    """Poll ``probe`` until it returns something truthy; fail naming ``what`` otherwise."""
    end = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > end:
            raise AssertionError(f"gave up after {timeout:.1f} s waiting for {what}")
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
