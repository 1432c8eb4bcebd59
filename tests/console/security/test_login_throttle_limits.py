"""Sign-in throttling that cannot lock everyone out (issue 21).

Three counters, each with its own limit within the cool-off: one account from one address
(a person's typos, one attacker guessing one password) locks that pair after a few failures;
an address on its own (password spraying: one guess at many accounts) and an account on its
own (one password guessed from many addresses) only after many. Before, five wrong passwords
for any account from an address locked every account from it: behind a proxy, everyone.
"""

from __future__ import annotations

import pytest
from axes.models import AccessAttempt
from django.conf import settings as conf
from django.contrib.auth.models import User
from django.test import Client
from pytest_django.fixtures import Settings

from tests.processes import run_settings

PASSWORD = "the-right-password"
PAIR_LIMIT = 5  # the default of LOOPGUARD_LOGIN_FAILURE_LIMIT
ADDRESS_LIMIT = 50  # the default of LOOPGUARD_LOGIN_ADDRESS_FAILURE_LIMIT
ACCOUNT_LIMIT = 20  # the default of LOOPGUARD_LOGIN_ACCOUNT_FAILURE_LIMIT
THROTTLED = "Too many failed sign-ins for this account or from this address"
OFFICE = "203.0.113.9"
ELSEWHERE = "198.51.100.7"
PRINT_LIMITS = (
    "from django.conf import settings as s\n"
    "print(s.LOOPGUARD_LOGIN_FAILURE_LIMIT, s.LOOPGUARD_LOGIN_ADDRESS_FAILURE_LIMIT,"
    " s.LOOPGUARD_LOGIN_ACCOUNT_FAILURE_LIMIT)\n"
)


@pytest.fixture
def viewer(django_user_model: type[User]) -> User:
    return django_user_model.objects.create_user("vera", password=PASSWORD)


def sign_in(
    username: str, password: str, *, address: str = OFFICE, forwarded: str | None = None
) -> tuple[int, Client]:
    """Post the sign-in form as a browser would; (status, the browser)."""
    client = Client()
    extra = {"REMOTE_ADDR": address}
    if forwarded is not None:
        extra["HTTP_X_FORWARDED_FOR"] = forwarded
    response = client.post("/login", {"username": username, "password": password}, **extra)
    if response.status_code == 429:
        assert THROTTLED in response.content.decode()
    return response.status_code, client


def signed_in(client: Client) -> bool:
    """Whether the dashboard lets this browser in (a role-less user gets 403, not the login)."""
    response = client.get("/")
    return not (response.status_code == 302 and response["Location"].startswith("/login"))


def spray(count: int, *, address: str = OFFICE, forwarded: str | None = None) -> list[int]:
    """One wrong guess at each of ``count`` accounts from one address; the statuses."""
    return [
        sign_in(f"someone-{i}", "Summer2026!", address=address, forwarded=forwarded)[0]
        for i in range(count)
    ]


def test_the_limits_are_what_the_documentation_says() -> None:
    assert conf.AXES_FAILURE_LIMIT == conf.LOOPGUARD_LOGIN_FAILURE_LIMIT == PAIR_LIMIT
    assert conf.LOOPGUARD_LOGIN_ADDRESS_FAILURE_LIMIT == ADDRESS_LIMIT
    assert conf.LOOPGUARD_LOGIN_ACCOUNT_FAILURE_LIMIT == ACCOUNT_LIMIT


def test_the_viewers_right_password_works_after_five_wrong_ones_for_another_account(
    viewer: User, django_user_model: type[User]
) -> None:
    django_user_model.objects.create_user("admin", password="only-the-admin-knows")
    said = [sign_in("admin", f"guess-{i}")[0] for i in range(PAIR_LIMIT)]

    status, client = sign_in("vera", PASSWORD)

    assert said[-1] == 429  # the admin account, from this address, is blocked
    assert status == 302
    assert signed_in(client)


def test_five_wrong_passwords_for_one_account_from_one_address_lock_that_pair(
    viewer: User,
) -> None:
    for i in range(PAIR_LIMIT):
        sign_in("vera", f"wrong-{i}")

    here = sign_in("vera", PASSWORD)
    elsewhere = sign_in("vera", PASSWORD, address=ELSEWHERE)

    assert here[0] == 429 and not signed_in(here[1])
    # Someone typing wrong passwords for vera does not lock vera out everywhere.
    assert elsewhere[0] == 302 and signed_in(elsewhere[1])


def test_many_failures_across_accounts_from_one_address_lock_the_address(viewer: User) -> None:
    below = spray(ADDRESS_LIMIT - 1)
    still_in = sign_in("vera", PASSWORD)
    reached = spray(1)
    refused = sign_in("vera", PASSWORD)
    elsewhere = sign_in("vera", PASSWORD, address=ELSEWHERE)

    assert below == [200] * (ADDRESS_LIMIT - 1)
    assert still_in[0] == 302  # vera's right password is no failure: it does not count
    assert reached == [429]
    assert refused[0] == 429 and not signed_in(refused[1])
    assert elsewhere[0] == 302 and signed_in(elsewhere[1])


def test_an_account_is_locked_everywhere_only_after_the_account_limit(viewer: User) -> None:
    # Addresses each stopped by the pair limit, and a last one short of it: one failure short
    # of the account's own limit in all. (Signing in now would forgive them.)
    full, rest = divmod(ACCOUNT_LIMIT - 1, PAIR_LIMIT)
    said = [
        sign_in("vera", f"guess-{i}", address=f"192.0.2.{n}")[0]
        for n in range(full)
        for i in range(PAIR_LIMIT)
    ]
    said += [sign_in("vera", f"guess-{i}", address="192.0.2.200")[0] for i in range(rest)]
    reached = sign_in("vera", "one-more", address=ELSEWHERE)
    status, client = sign_in("vera", PASSWORD, address="198.51.100.99")

    assert said == ([200] * (PAIR_LIMIT - 1) + [429]) * full + [200] * rest
    assert reached[0] == 429  # the account's last failure allowed, from an address of its own
    assert status == 429 and not signed_in(client)


def test_a_blocked_pair_does_not_keep_counting_towards_the_address(viewer: User) -> None:
    # Refused attempts are not failures: hammering one account cannot lock the address.
    statuses = [sign_in("admin", f"guess-{i}")[0] for i in range(ADDRESS_LIMIT)]

    assert statuses.count(200) == PAIR_LIMIT - 1
    assert sign_in("vera", PASSWORD)[0] == 302


def test_a_client_rotating_x_forwarded_for_reaches_the_address_limit_all_the_same(
    viewer: User,
) -> None:
    for i in range(ADDRESS_LIMIT):
        sign_in(f"someone-{i}", "guess", address="10.9.9.9", forwarded=f"192.0.2.{i}")

    assert sign_in("vera", PASSWORD, address="10.9.9.9", forwarded="198.51.100.1")[0] == 429


def test_behind_a_trusted_proxy_the_address_limit_is_the_clients_not_the_proxys(
    viewer: User, settings: Settings
) -> None:
    settings.LOOPGUARD_TRUSTED_PROXIES = 1
    proxy = "10.0.0.2"
    spray(ADDRESS_LIMIT, address=proxy, forwarded=f"1.1.1.1, {OFFICE}")

    assert sign_in("vera", PASSWORD, address=proxy, forwarded=OFFICE)[0] == 429
    assert sign_in("vera", PASSWORD, address=proxy, forwarded=ELSEWHERE)[0] == 302
    assert AccessAttempt.objects.filter(ip_address=OFFICE).count() == ADDRESS_LIMIT


def test_the_wider_limits_follow_a_raised_pair_limit_unless_set() -> None:
    started = run_settings(PRINT_LIMITS, LOOPGUARD_LOGIN_FAILURE_LIMIT="8")
    chosen = run_settings(
        PRINT_LIMITS,
        LOOPGUARD_LOGIN_ADDRESS_FAILURE_LIMIT="200",
        LOOPGUARD_LOGIN_ACCOUNT_FAILURE_LIMIT="5",
    )

    assert started.returncode == 0, started.stderr[-2000:]
    assert started.stdout.split() == ["8", "80", "32"]
    assert chosen.returncode == 0, chosen.stderr[-2000:]
    assert chosen.stdout.split() == ["5", "200", "5"]


@pytest.mark.parametrize(
    ("name", "value", "said"),
    [
        ("LOOPGUARD_LOGIN_ADDRESS_FAILURE_LIMIT", "4", "at least LOOPGUARD_LOGIN_FAILURE_LIMIT"),
        ("LOOPGUARD_LOGIN_ACCOUNT_FAILURE_LIMIT", "4", "at least LOOPGUARD_LOGIN_FAILURE_LIMIT"),
        ("LOOPGUARD_LOGIN_ADDRESS_FAILURE_LIMIT", "fifty", "is not a whole number"),
    ],
)
def test_a_bad_wider_limit_stops_start_up_naming_it(name: str, value: str, said: str) -> None:
    started = run_settings(PRINT_LIMITS, **{name: value})

    assert started.returncode != 0
    assert name in started.stderr and said in started.stderr
