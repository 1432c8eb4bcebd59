"""Settings that lie: a variable that looks like ours but is not read stops start-up.

Only DJANGO_DEBUG turns debug mode off; DEBUG=0 or LOOPGUARD_DEBUG=false used to be ignored
in silence, leaving a console in debug mode that its operator believed in production mode.
"""

from __future__ import annotations

import os
import re
import secrets
import warnings
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
from django.core.exceptions import ImproperlyConfigured

from console.project import settings as console_settings
from console.project.environment import SettingsWarning, check_environment
from tests.processes import ROOT, run_settings

PRINT_DEBUG = "from django.conf import settings\nprint('DEBUG', settings.DEBUG)\n"
PRODUCTION = {"DJANGO_DEBUG": "0", "DJANGO_SECRET_KEY": secrets.token_urlsafe(50)}


def test_it_refuses_to_start_with_debug_0_instead_of_django_debug() -> None:
    started = run_settings(PRINT_DEBUG, DEBUG="0")

    assert started.returncode != 0
    assert "DEBUG='0' is not a LoopGuard setting" in started.stderr
    assert "debug mode is still on" in started.stderr
    assert "did you mean DJANGO_DEBUG?" in started.stderr
    assert "DEBUG True" not in started.stdout


def test_it_refuses_a_loopguard_prefix_on_a_django_setting_and_names_the_right_one() -> None:
    started = run_settings(PRINT_DEBUG, LOOPGUARD_DEBUG="false")

    assert started.returncode != 0
    assert "LOOPGUARD_DEBUG is not a LoopGuard setting" in started.stderr
    assert "did you mean DJANGO_DEBUG?" in started.stderr


def test_it_refuses_a_misspelt_setting_even_in_production_mode() -> None:
    started = run_settings(PRINT_DEBUG, **PRODUCTION, DJANGO_SECURE_SSL_REDIRCT="1")

    assert started.returncode != 0
    assert "DJANGO_SECURE_SSL_REDIRCT is not a LoopGuard setting" in started.stderr
    assert "did you mean DJANGO_SECURE_SSL_REDIRECT?" in started.stderr


def test_it_starts_with_every_variable_manage_py_up_ci_and_django_set() -> None:
    started = run_settings(
        PRINT_DEBUG,
        LOOPGUARD_PROCESS="web",
        LOOPGUARD_IN_VENV="1",
        LOOPGUARD_PORT="8123",
        LOOPGUARD_HOST="127.0.0.1",
        LOOPGUARD_STANDALONE="0",
        LOOPGUARD_TEST_FRESH_VENV="0",
        DJANGO_ALLOW_ASYNC_UNSAFE="true",
        DJANGO_SUPERUSER_PASSWORD="not-used-here",
        DJANGO_COLORS="nocolor",
        # Read, and ignored while DEBUG is on: still known, so not refused.
        DJANGO_SECURE_SSL_REDIRECT="1",
        DJANGO_SECURE_PROXY_SSL_HEADER="1",
        DJANGO_SECURE_HSTS_SECONDS="300",
    )

    assert started.returncode == 0, started.stderr
    assert "DEBUG True" in started.stdout


def test_a_bare_debug_that_only_disagrees_in_the_safe_direction_is_a_warning() -> None:
    started = run_settings(PRINT_DEBUG, **PRODUCTION, DEBUG="1")

    assert started.returncode == 0, started.stderr
    assert "DEBUG False" in started.stdout
    assert "DEBUG='1' is not a LoopGuard setting: DJANGO_DEBUG decides" in started.stderr


def test_a_variable_listed_as_someone_elses_is_left_alone() -> None:
    started = run_settings(
        PRINT_DEBUG,
        DJANGO_READ_DOT_ENV_FILE="1",
        LOOPGUARD_IGNORE_VARIABLES="DJANGO_READ_DOT_ENV_FILE",
    )

    assert started.returncode == 0, started.stderr


@pytest.mark.parametrize(
    ("name", "meant"),
    [
        ("LOOPGUARD_SECRET_KEY", "DJANGO_SECRET_KEY"),
        ("DJANGO_METRICS_TOKEN", "LOOPGUARD_METRICS_TOKEN"),
        ("LOOPGUARD_LEASE_SECOND", "LOOPGUARD_LEASE_SECONDS"),
        ("DJANGO_ALLOWED_HOST", "DJANGO_ALLOWED_HOSTS"),
    ],
)
def test_the_refusal_names_the_spelling_that_was_probably_meant(name: str, meant: str) -> None:
    read = {
        "DJANGO_SECRET_KEY",
        "LOOPGUARD_METRICS_TOKEN",
        "LOOPGUARD_LEASE_SECONDS",
        "DJANGO_ALLOWED_HOSTS",
    }

    with pytest.raises(ImproperlyConfigured, match=f"{name} is not a LoopGuard setting") as err:
        check_environment({name: "x"}, read=read, debug=False)

    assert f"did you mean {meant}?" in str(err.value)


def test_every_unknown_variable_is_named_at_once() -> None:
    with pytest.raises(ImproperlyConfigured) as err:
        check_environment(
            {"LOOPGUARD_A": "1", "DJANGO_B": "1", "DEBUG": "off"}, read=set(), debug=True
        )

    for name in ("LOOPGUARD_A", "DJANGO_B", "DEBUG='off'"):
        assert name in str(err.value)


def test_other_programs_variables_are_not_its_business() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", SettingsWarning)
        check_environment(
            {"CELERY_QUEUE": "q", "PATH": "/bin", "DEBUG": "express:*", "WEB_CONCURRENCY": "3"},
            read=set(),
            debug=True,
        )


def test_no_variable_the_reference_or_the_example_file_names_is_refused() -> None:
    # docker-compose passes all of .env to every container, so each name in it reaches the
    # settings; docs/settings.md promises each name it lists works.
    documented = re.findall(
        r"^\| `([A-Z][A-Z0-9_]*)`", (ROOT / "docs" / "settings.md").read_text(), re.MULTILINE
    )
    example = re.findall(
        r"^#? ?([A-Z][A-Z0-9_]*)=", (ROOT / ".env.example").read_text(), re.MULTILINE
    )
    names = {name for name in [*documented, *example] if name.startswith(("LOOPGUARD_", "DJANGO_"))}
    assert "LOOPGUARD_PORT" in names and "DJANGO_DEBUG" in names  # the patterns work

    check_environment(
        dict.fromkeys(names, "1"), read=console_settings._READ, debug=console_settings.DEBUG
    )


SHOW_JIT = (
    "from django.db import connection\n"
    "with connection.cursor() as cursor:\n"
    "    cursor.execute('SHOW jit')\n"
    "    print('JIT', cursor.fetchone()[0])\n"
)


def test_the_consoles_connections_run_without_jit_unless_told_to_keep_the_servers() -> None:
    # JIT compiled the dashboard's aggregates at a million tasks for longer than they ran.
    # The server's own database: the test database is made later, by pytest-django.
    given = urlsplit(os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/x"))
    url = urlunsplit(given._replace(path="/postgres"))
    with psycopg.connect(url) as plain:
        row = plain.execute("SHOW jit").fetchone()
    assert row is not None
    server = row[0]

    assert "JIT off" in run_settings(SHOW_JIT, DATABASE_URL=url).stdout
    kept = run_settings(SHOW_JIT, DATABASE_URL=url, LOOPGUARD_DATABASE_JIT="1")
    assert f"JIT {server}" in kept.stdout
