"""What the security tests share: running the settings in a fresh interpreter."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

# Ours, Django's and bare DEBUG: taken out of the inherited environment so that each test
# says exactly which of them it sets.
_OURS = ("LOOPGUARD_", "DJANGO_")


def clean_environment(**variables: str) -> dict[str, str]:
    """This process's environment without our variables or DEBUG, plus ``variables``."""
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(_OURS) and name != "DEBUG"
    }
    # The test database and Redis of whoever runs the tests, never the defaults.
    for name in ("DATABASE_URL", "REDIS_URL"):
        if name in os.environ:
            env[name] = os.environ[name]
    return {**env, **variables}


def run_settings(script: str, **variables: str) -> subprocess.CompletedProcess[str]:
    """Run ``script`` after ``django.setup()`` with the console's settings and ``variables``."""
    env = clean_environment(DJANGO_SETTINGS_MODULE="console.project.settings", **variables)
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
