"""`manage.py` explains itself, `up` and `test` without installing anything first."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.processes import run

ROOT = Path(__file__).resolve().parents[1]


def _alone(tmp_path: Path, argv: list[str]) -> subprocess.CompletedProcess[str]:
    """Run manage.py with ``argv`` from a folder of its own: no .venv, no project to
    install, so anything it tried to install would fail or leave a .venv behind."""
    shutil.copy(ROOT / "manage.py", tmp_path / "manage.py")
    return run([sys.executable, "manage.py", *argv], cwd=tmp_path, timeout=60)


@pytest.mark.parametrize("argv", [[], ["--help"], ["-h"], ["help"]])
def test_the_overview_describes_up_and_test_and_installs_nothing(
    tmp_path: Path, argv: list[str]
) -> None:
    done = _alone(tmp_path, argv)

    assert done.returncode == 0, done.stderr
    assert "up       start the console" in done.stdout
    assert "test     the whole test suite" in done.stdout
    assert not (tmp_path / ".venv").exists()


@pytest.mark.parametrize("argv", [["test", "--help"], ["test", "-h"], ["help", "test"]])
def test_the_help_of_test_says_what_it_runs_and_installs_nothing(
    tmp_path: Path, argv: list[str]
) -> None:
    done = _alone(tmp_path, argv)

    assert done.returncode == 0, done.stderr
    assert "ruff check ." in done.stdout and "mypy" in done.stdout and "pytest" in done.stdout
    assert not (tmp_path / ".venv").exists()


def test_help_up_lists_the_options_of_up() -> None:
    done = run([sys.executable, str(ROOT / "manage.py"), "help", "up"], timeout=300)

    assert done.returncode == 0, done.stderr
    assert "--standalone" in done.stdout and "--port" in done.stdout
