"""Sign-in throttling: too many failed sign-ins for an account, or from an address, and the
sign-in page refuses even the right password until the cool-off has passed.

Before it, 30 wrong passwords in 11 seconds, then the right one, signed in.
"""

from __future__ import annotations

import logging
import textwrap
from datetime import timedelta
from pathlib import Path

import pytest
from axes.models import AccessAttempt, AccessFailureLog
from django.conf import settings as conf
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone
from pytest_django.fixtures import Settings

from tests.processes import run_python, standalone_environment

PASSWORD = "the-right-password"
LIMIT = 5  # the default of LOOPGUARD_LOGIN_FAILURE_LIMIT
THROTTLED = "Too many failed sign-ins for this account or from this address"
WRONG = "Please enter a correct"  # Django's own "wrong user name or password"


@pytest.fixture
def ana(django_user_model: type[User]) -> User:
    return django_user_model.objects.create_user("ana", password=PASSWORD)


def sign_in(
    username: str, password: str, *, address: str = "10.0.0.1", forwarded: str | None = None
) -> tuple[int, str, Client]:
    """Post the sign-in form as a browser would; (status, page, the browser)."""
    client = Client()
    extra = {"REMOTE_ADDR": address}
    if forwarded is not None:
        extra["HTTP_X_FORWARDED_FOR"] = forwarded
    response = client.post("/login", {"username": username, "password": password}, **extra)
    return response.status_code, response.content.decode(), client


def signed_in(client: Client) -> bool:
    """Whether the dashboard lets this browser in (a role-less user gets 403, not the login)."""
    response = client.get("/")
    return not (response.status_code == 302 and response["Location"].startswith("/login"))


def test_the_limit_is_what_the_documentation_says() -> None:
    assert conf.AXES_FAILURE_LIMIT == LIMIT
    cool_off: timedelta = conf.AXES_COOLOFF_TIME
    assert cool_off.total_seconds() == 15 * 60


def test_after_too_many_wrong_passwords_even_the_right_one_is_refused(ana: User) -> None:
    said = [sign_in("ana", f"wrong-{i}")[:2] for i in range(LIMIT)]
    status, page, client = sign_in("ana", PASSWORD)

    # Below the limit: the usual "wrong user name or password".
    assert all(code == 200 and WRONG in text for code, text in said[: LIMIT - 1])
    # At it, and from then on: the sign-in page saying why, as 429.
    assert said[-1][0] == 429 and THROTTLED in said[-1][1]
    assert status == 429
    assert THROTTLED in page
    assert "Try again in 15 minutes" in page
    assert 'name="password"' in page  # still the sign-in page, not a bare error
    assert not signed_in(client)


def test_fewer_wrong_passwords_than_the_limit_still_let_the_right_one_in(ana: User) -> None:
    for i in range(LIMIT - 1):
        sign_in("ana", f"wrong-{i}")

    status, _, client = sign_in("ana", PASSWORD)

    assert status == 302
    assert signed_in(client)


def test_the_block_lifts_once_the_cool_off_has_passed(ana: User) -> None:
    for i in range(LIMIT):
        sign_in("ana", f"wrong-{i}")
    assert sign_in("ana", PASSWORD)[0] == 429

    # Sixteen minutes later, as far as the attempts on record are concerned.
    AccessAttempt.objects.update(attempt_time=timezone.now() - timedelta(minutes=16))
    status, _, client = sign_in("ana", PASSWORD)

    assert status == 302
    assert signed_in(client)


def test_refused_attempts_during_the_block_do_not_extend_it(ana: User) -> None:
    for i in range(LIMIT):
        sign_in("ana", f"wrong-{i}")
    AccessAttempt.objects.update(attempt_time=timezone.now() - timedelta(minutes=14))
    for _ in range(3):  # still blocked: refused, and not counted
        assert sign_in("ana", "another-guess")[0] == 429

    AccessAttempt.objects.update(attempt_time=timezone.now() - timedelta(minutes=16))

    assert sign_in("ana", PASSWORD)[0] == 302


def test_signing_in_forgives_the_accounts_own_earlier_typos(ana: User) -> None:
    for i in range(LIMIT - 1):
        sign_in("ana", f"typo-{i}")
    assert sign_in("ana", PASSWORD)[0] == 302

    for i in range(LIMIT - 1):  # another bad morning: counted from zero again
        assert sign_in("ana", f"typo-again-{i}")[0] == 200

    assert sign_in("ana", PASSWORD)[0] == 302


def test_signing_in_to_ones_own_account_does_not_forgive_guesses_at_another(
    ana: User, django_user_model: type[User]
) -> None:
    django_user_model.objects.create_user("mallory", password="mallory-knows-this")
    for i in range(LIMIT - 1):
        sign_in("ana", f"guess-{i}", address="203.0.113.66")

    assert sign_in("mallory", "mallory-knows-this", address="203.0.113.66")[0] == 302
    status, page, _ = sign_in("ana", "guess-last", address="203.0.113.66")

    assert status == 429 and THROTTLED in page
    assert sign_in("ana", PASSWORD, address="203.0.113.66")[0] == 429


def test_a_block_is_logged_and_every_failure_kept_on_record(
    ana: User, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        for i in range(LIMIT + 1):
            sign_in("ana", f"wrong-{i}", address="192.0.2.44")

    lines = [record.getMessage() for record in caplog.records]
    assert any(
        "Locking out" in line and "user='ana' address='192.0.2.44'" in line for line in lines
    ), lines
    assert any("sign-in refused: too many failed attempts" in line for line in lines), lines
    failures = AccessFailureLog.objects.filter(username="ana", ip_address="192.0.2.44")
    assert failures.count() == LIMIT  # the refused one is not a new failure
    assert failures.filter(locked_out=True).count() == 1


def test_a_user_name_cannot_forge_a_log_line(db: None, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        sign_in("ana\nINFO forged line", "wrong")

    assert all("\n" not in record.getMessage() for record in caplog.records)


def test_a_forwarded_header_that_is_not_an_address_falls_back_to_the_connection(
    ana: User, settings: Settings
) -> None:
    settings.LOOPGUARD_TRUSTED_PROXIES = 1

    status, page, _ = sign_in("ana", "wrong", address="10.0.0.3", forwarded="not-an-address")

    assert status == 200 and WRONG in page
    assert AccessAttempt.objects.get().ip_address == "10.0.0.3"


STANDALONE = textwrap.dedent(
    """
    import django
    django.setup()
    from django.core.management import call_command
    call_command("migrate", verbosity=0)
    from django.conf import settings
    from django.contrib.auth.models import User
    from django.test import Client
    assert settings.DATABASES["default"]["ENGINE"].endswith("sqlite3")
    User.objects.create_user("ana", password="right")
    codes = [
        Client(HTTP_HOST="localhost").post("/login", {"username": "ana", "password": p}).status_code
        for p in ["w1", "w2", "w3", "w4", "w5", "right"]
    ]
    print(codes)
    """
)


@pytest.mark.slow
def test_standalone_mode_throttles_sign_ins_on_sqlite_without_redis(tmp_path: Path) -> None:
    env = standalone_environment(tmp_path, only_named=True, DJANGO_SETTINGS_MODULE="tests.settings")
    done = run_python(STANDALONE, env=env, timeout=300)

    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split("\n")[-2] == "[200, 200, 200, 200, 429, 429]"


def test_a_nul_in_the_browsers_headers_still_gets_the_sign_in_page(ana: User) -> None:
    headers = {"HTTP_USER_AGENT": "probe\x00", "HTTP_ACCEPT": "text/html\x00"}

    wrong = Client().post("/login", {"username": "ana", "password": "wrong"}, **headers)

    assert wrong.status_code == 200 and WRONG in wrong.content.decode()
    assert AccessAttempt.objects.get().user_agent == "probe\ufffd"
    right = Client().post("/login", {"username": "ana", "password": PASSWORD}, **headers)
    assert right.status_code == 302


def test_an_absurdly_long_user_name_is_refused_like_any_wrong_one_and_counted(db: None) -> None:
    name = "a" * (1 << 20)  # a megabyte: the form itself does not bound it

    said = [sign_in(name, f"guess-{i}", address="192.0.2.77")[:2] for i in range(LIMIT)]

    assert [code for code, _ in said] == [200] * (LIMIT - 1) + [429]
    assert WRONG in said[0][1]
    assert AccessAttempt.objects.get().username == "a" * 255
