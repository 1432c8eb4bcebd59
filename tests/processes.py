"""The environment a test hands to a process it starts, and running the settings in one.

One home for every test that starts ``manage.py``, gunicorn, a Celery worker or a bare
interpreter: what of this process's environment such a child inherits, and what it is told.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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


def run_settings(script: str, **variables: str) -> subprocess.CompletedProcess[str]:
    """Run ``script`` after ``django.setup()`` with the console's settings and only the
    ``variables`` of ours that the test names."""
    env = clean_environment(
        only_named=True, DJANGO_SETTINGS_MODULE="console.project.settings", **variables
    )
    code = "import django\ndjango.setup()\n" + script
    return subprocess.run(  # noqa: S603 - this interpreter, a fixed script
        [sys.executable, "-W", "always", "-c", code],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
