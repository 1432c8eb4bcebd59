"""``manage.py up`` tells the processes it starts the address it serves, so that notices link
to whole URLs: ``LOOPGUARD_PUBLIC_URL`` in the environment of web, worker and beat."""

from __future__ import annotations

import pytest

from console.project.launcher import child_environment, served_url
from tests.processes import run_python

# What a worker or beat does with the variable: the link a notice carries.
PRINT_LINK = (
    "import django\n"
    "django.setup()\n"
    "from console.drivers.notifications import link\n"
    "print(link('/tasks/42/'))\n"
)


@pytest.mark.parametrize(
    ("host", "url"),
    [
        ("127.0.0.1", "http://127.0.0.1:8123/"),
        ("0.0.0.0", "http://127.0.0.1:8123/"),  # noqa: S104 - every address: this machine's
        ("192.0.2.7", "http://192.0.2.7:8123/"),
        ("::", "http://[::1]:8123/"),
        ("console.internal", "http://console.internal:8123/"),
    ],
)
def test_up_serves_at_the_host_it_binds_or_this_machines_own_address(host: str, url: str) -> None:
    assert served_url(host, 8123) == url


def test_without_a_public_url_the_children_get_the_address_up_serves(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("LOOPGUARD_PUBLIC_URL", raising=False)

    env = child_environment("http://127.0.0.1:8123/")

    assert env["LOOPGUARD_PUBLIC_URL"] == "http://127.0.0.1:8123"


@pytest.mark.parametrize("unset", ["", "  "])
def test_an_empty_public_url_counts_as_unset(monkeypatch: pytest.MonkeyPatch, unset: str) -> None:
    monkeypatch.setenv("LOOPGUARD_PUBLIC_URL", unset)

    assert child_environment("http://[::1]:8000/")["LOOPGUARD_PUBLIC_URL"] == "http://[::1]:8000"


def test_an_operators_public_url_is_passed_on_unchanged(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOOPGUARD_PUBLIC_URL", "https://console.example.com")

    env = child_environment("http://127.0.0.1:8123/")

    assert env["LOOPGUARD_PUBLIC_URL"] == "https://console.example.com"


def test_a_worker_started_with_that_environment_sends_whole_links(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("LOOPGUARD_PUBLIC_URL", raising=False)
    monkeypatch.setenv("DJANGO_SETTINGS_MODULE", "console.project.settings")
    env = child_environment(served_url("127.0.0.1", 8123))

    started = run_python(PRINT_LINK, env={**env, "LOOPGUARD_PROCESS": "worker"}, timeout=60)

    assert started.returncode == 0, started.stderr
    assert started.stdout.strip().splitlines()[-1] == "http://127.0.0.1:8123/tasks/42/"
