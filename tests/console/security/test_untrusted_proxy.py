"""A proxy the console does not trust is named in the log, once per process.

Behind a reverse proxy with LOOPGUARD_TRUSTED_PROXIES unset, every sign-in seems to come
from the proxy's address, so every person shares one address's limit. The settings cannot
see a proxy at start-up; the first sign-in through one can: a private or loopback
connecting address that sends X-Forwarded-For.
"""

from __future__ import annotations

import logging
import threading

import pytest
from django.test import Client
from pytest_django.fixtures import Settings

from console.project import security

NAMED = "LOOPGUARD_TRUSTED_PROXIES"


@pytest.fixture
def fresh_process(monkeypatch: pytest.MonkeyPatch, db: None) -> None:
    """The warning not yet given, as in a process that has just started."""
    monkeypatch.setattr(security, "_UNTRUSTED_PROXY_NOTED", threading.Lock(), raising=False)


def sign_in_from(address: str, forwarded: str | None, caplog: pytest.LogCaptureFixture) -> int:
    """A failed sign-in from ``address``; how many warnings named the setting."""
    extra = {"REMOTE_ADDR": address}
    if forwarded is not None:
        extra["HTTP_X_FORWARDED_FOR"] = forwarded
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        Client().post("/login", {"username": "ana", "password": "wrong"}, **extra)
    return sum(NAMED in record.getMessage() for record in caplog.records)


@pytest.mark.parametrize("proxy", ["10.0.0.2", "172.18.0.1", "127.0.0.1", "::1"])
def test_the_first_sign_in_through_an_untrusted_proxy_names_the_setting_once(
    fresh_process: None, caplog: pytest.LogCaptureFixture, proxy: str
) -> None:
    first = sign_in_from(proxy, "198.51.100.7", caplog)
    line = next(r.getMessage() for r in caplog.records if NAMED in r.getMessage())
    again = sign_in_from(proxy, "198.51.100.8", caplog)

    assert first == 1
    assert f"{NAMED}=1" in line and f"'{proxy}'" in line
    assert again == 0


def test_no_warning_when_the_proxy_is_trusted(
    fresh_process: None, caplog: pytest.LogCaptureFixture, settings: Settings
) -> None:
    settings.LOOPGUARD_TRUSTED_PROXIES = 1

    assert sign_in_from("10.0.0.2", "198.51.100.7", caplog) == 0


def test_no_warning_for_a_client_that_writes_the_header_itself(
    fresh_process: None, caplog: pytest.LogCaptureFixture
) -> None:
    # A public connecting address is the client: its header is its own, and ignored. (Not a
    # documentation address: Python counts those as private.)
    assert sign_in_from("9.9.9.9", "10.1.2.3", caplog) == 0


def test_no_warning_for_a_private_client_without_the_header(
    fresh_process: None, caplog: pytest.LogCaptureFixture
) -> None:
    assert sign_in_from("10.0.0.2", None, caplog) == 0
    # ... and the warning is still there to give when a proxy does turn up.
    assert sign_in_from("10.0.0.2", "198.51.100.7", caplog) == 1
