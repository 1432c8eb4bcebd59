"""The environment a test hands to a process it starts, and starting it.

One home for every test that starts ``manage.py``, gunicorn, a Celery worker or a bare
interpreter: what of this process's environment such a child inherits, what it is told, and
how it is run (:func:`run` to its end, :func:`start_python` to talk to while it runs).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

# What pytest, pytest-xdist, Celery or a parent ``manage.py`` (its re-exec into .venv, its
# standalone mode) put into this process's environment: never inherited.
_SET_BY_THE_RUN = {"DJANGO_SETTINGS_MODULE", "LOOPGUARD_IN_VENV", "LOOPGUARD_STANDALONE"}
_SET_BY_THE_RUN_PREFIXES = ("PYTEST_", "CELERY_")
# Ours, Django's and bare DEBUG: with ``only_named``, taken out too, so that a test says
# exactly which of them it sets.
_OURS = ("LOOPGUARD_", "DJANGO_")

# Closed ports: a standalone console that used PostgreSQL or Redis would fail at once.
NOWHERE = {
    "DATABASE_URL": "postgres://postgres@127.0.0.1:1/loopguard",
    "REDIS_URL": "redis://127.0.0.1:1/0",
}


def clean_environment(*, only_named: bool = False, **overrides: str) -> dict[str, str]:
    """This process's environment without what the test run put there, with unbuffered
    output, plus ``overrides``; ``only_named``: also without any ``LOOPGUARD_``/``DJANGO_``
    variable or ``DEBUG`` (the test database and Redis, ``DATABASE_URL`` and ``REDIS_URL``,
    stay)."""
    env = {
        name: value
        for name, value in os.environ.items()
        if name not in _SET_BY_THE_RUN
        and not name.startswith(_SET_BY_THE_RUN_PREFIXES)
        and not (only_named and (name.startswith(_OURS) or name == "DEBUG"))
    }
    env.update(overrides)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def standalone_environment(
    data: Path, *, only_named: bool = False, **overrides: str
) -> dict[str, str]:
    """The environment of a console in standalone mode (SQLite under ``data``), PostgreSQL
    and Redis on closed ports, plus ``overrides`` (``only_named``: as in
    :func:`clean_environment`)."""
    return clean_environment(
        only_named=only_named,
        LOOPGUARD_STANDALONE="1",
        LOOPGUARD_DATA_DIR=str(data),
        **{**NOWHERE, **overrides},
    )


def run(
    command: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path = ROOT,
    timeout: float = 120,
    **options: Any,
) -> subprocess.CompletedProcess[str]:
    """Run ``command`` to its end in ``cwd`` (the checkout) with ``env`` (this process's
    when None): what it printed, as text, and its exit status for the test to judge (a
    failure is never raised here). ``options`` go to :func:`subprocess.run` (``stdin``)."""
    return subprocess.run(  # noqa: S603 - the tests' own commands, never a shell
        list(command),
        cwd=cwd,
        env=None if env is None else dict(env),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        **options,
    )


def run_python(
    code: str,
    *args: str,
    env: Mapping[str, str] | None = None,
    cwd: Path = ROOT,
    timeout: float = 120,
) -> subprocess.CompletedProcess[str]:
    """Run ``code`` with ``args`` in a fresh interpreter (this one's): as :func:`run`."""
    return run([sys.executable, "-c", code, *args], env=env, cwd=cwd, timeout=timeout)


def start_python(code: str, *args: str, env: Mapping[str, str]) -> subprocess.Popen[str]:
    """Start ``code`` with ``args`` in a fresh interpreter (this one's) in the checkout, its
    standard input and output piped as text: for a test that talks to it while it runs (a
    racer of :func:`tests.waiting.release_together`)."""
    return subprocess.Popen(  # noqa: S603 - this interpreter, the test's own script
        [sys.executable, "-c", code, *args],
        cwd=ROOT,
        env=dict(env),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def run_settings(script: str, **variables: str) -> subprocess.CompletedProcess[str]:
    """Run ``script`` after ``django.setup()`` with the console's settings and only the
    ``variables`` of ours that the test names."""
    env = clean_environment(
        only_named=True, DJANGO_SETTINGS_MODULE="console.project.settings", **variables
    )
    code = "import django\ndjango.setup()\n" + script
    return run([sys.executable, "-W", "always", "-c", code], env=env)
