"""What the benchmark tests share: loading a script under benchmarks/ as a module, and
running it as a user would."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

from tests import processes

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
# Where a benchmark works when DATABASE_URL is not set (its own database beside this one).
DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/loopguard"


def load(name: str) -> ModuleType:
    """``benchmarks/<name>.py`` as a module, without running its ``main``."""
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def database_url() -> str:
    """The DATABASE_URL a benchmark run by :func:`run` is given."""
    return os.environ.get("DATABASE_URL", DEFAULT_DATABASE_URL)


def run(
    name: str, *args: str, timeout: float = 600, **env: str
) -> subprocess.CompletedProcess[str]:
    """``python benchmarks/<name>.py args`` with this environment (DATABASE_URL defaulted),
    plus ``env``; its output as text."""
    return processes.run(
        [sys.executable, str(BENCHMARKS / f"{name}.py"), *args],
        env={**os.environ, "DATABASE_URL": database_url(), **env},
        timeout=timeout,
    )
