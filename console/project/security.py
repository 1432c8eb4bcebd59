"""The console's HTTP hardening, wired in by the settings: private answers, sign-in
throttling (django-axes, told how to find the client and what to say), and API tokens that
end with a password change.

Configuration, not product logic: each piece here is named by a setting
(``MIDDLEWARE``, ``AXES_*``, ``AUTH_PASSWORD_VALIDATORS``) and calls down into the console
for anything it does.
"""

from __future__ import annotations

import ipaddress
import logging
import threading
from collections.abc import Callable
from typing import Any

from axes.handlers.database import AxesDatabaseHandler
from axes.helpers import get_lockout_parameters
from axes.models import AccessAttempt
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.base_user import AbstractBaseUser
from django.contrib.auth.forms import AuthenticationForm
from django.contrib.auth.models import User
from django.db.models import Sum
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils.cache import patch_cache_control

from console.api.tokens import api_token_revoke_all

__all__ = [
    "USERNAME_STORED",
    "LoginThrottle",
    "NoStoreMiddleware",
    "RevokeApiTokensOnPasswordChange",
    "attempted_username",
    "client_address",
    "client_description",
    "lockout_response",
]

logger = logging.getLogger(__name__)

# The length of axes' username columns (AccessAttempt, AccessFailureLog).
USERNAME_STORED = 255

# Taken by the first request through a proxy we do not trust and never given back: the
# warning is said once per process, by one thread, however many requests race to say it.
_UNTRUSTED_PROXY_NOTED = threading.Lock()


class NoStoreMiddleware:
    """Marks every answer ``Cache-Control: private, no-store``.

    Pages, exports and API answers show one person's view of tasks, operations and the audit
    log: no shared proxy may keep them, and the browser may not either (the back button on
    a shared machine after signing out, a disk cache). Static files never get here: WhiteNoise
    answers them earlier in the chain with their own long lifetime.
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        # Merged with what a view said (never_cache's max-age=0, ...), never loosened by it.
        if "public" in response.get("Cache-Control", ""):
            del response["Cache-Control"]
        patch_cache_control(response, private=True, no_store=True)
        return response


def client_address(request: HttpRequest) -> str | None:
    """The address a sign-in came from, for counting failures per address.

    The connecting address, unless ``LOOPGUARD_TRUSTED_PROXIES`` says that many proxies in
    front of the console each append the address they received a request from to
    ``X-Forwarded-For``: then the entry that many places from the right, which the client
    cannot forge (whatever it sent itself stays to the left). A header too short for that, or
    an entry that is not an address, means the request did not come through them: the
    connecting address it is. With none trusted, the header arriving from a private or
    loopback address is noted in the log, once (:func:`_note_untrusted_proxy`).
    """
    remote = str(request.META.get("REMOTE_ADDR") or "")
    forwarded = str(request.META.get("HTTP_X_FORWARDED_FOR") or "")
    proxies: int = settings.LOOPGUARD_TRUSTED_PROXIES
    if proxies > 0:
        hops = [hop.strip() for hop in forwarded.split(",")]
        if len(hops) >= proxies and _is_address(hops[-proxies]):
            return hops[-proxies]
    elif forwarded:
        _note_untrusted_proxy(remote)
    return remote if _is_address(remote) else None


def _note_untrusted_proxy(remote: str) -> None:
    """Warn, once per process, that sign-ins seem to arrive through a proxy we do not trust.

    The settings cannot see a proxy at start-up; a request can: a private or loopback
    connecting address that sends X-Forwarded-For is almost always a reverse proxy (a public
    one sending it is a client writing its own). Behind it, every person signs in from the
    proxy's address and shares that address's limit.
    """
    try:
        connecting = ipaddress.ip_address(remote)
    except ValueError:
        return
    if not (connecting.is_private or connecting.is_loopback):
        return
    if _UNTRUSTED_PROXY_NOTED.acquire(blocking=False):
        logger.warning(
            "sign-ins arrive through a proxy at %a (X-Forwarded-For is set) that the console "
            "does not trust, so every client counts as that one address for sign-in "
            "throttling: set LOOPGUARD_TRUSTED_PROXIES=1 (the number of proxies that append "
            "to X-Forwarded-For) if the proxy appends the client's address, as nginx's "
            "$proxy_add_x_forwarded_for does; said once per process",
            remote,
        )


def _is_address(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def attempted_username(request: HttpRequest, credentials: dict[str, Any] | None) -> str | None:
    """The user name a sign-in tried, as axes counts and stores it.

    Django's sign-in form does not bound what is typed as the user name (it has no length
    check), and axes keeps it in a column of 255 characters: a longer one would make the
    database refuse the row and the sign-in page answer 500. No account has a name that long
    (150 at most), so cutting it changes whom nobody can sign in as.
    """
    field = get_user_model().USERNAME_FIELD
    raw = credentials.get(field) if credentials else request.POST.get(field)
    if raw is None:
        return None
    return str(raw).replace("\x00", "\ufffd")[:USERNAME_STORED]


def client_description(
    username: str | None, ip_address: str | None, user_agent: str, path_info: Any, request: Any
) -> str:
    """How django-axes' log lines name a sign-in: the account and the address, escaped.

    The user name is whatever was typed; ``ascii()`` keeps a line break or an escape
    sequence in it from forging or garbling a log line.
    """
    return f"user={username or ''!a} address={ip_address or '-'!a}"


class LoginThrottle(AxesDatabaseHandler):  # type: ignore[misc]
    """django-axes' database handler (PostgreSQL, or SQLite in standalone mode), with a limit
    for each counter, forgiving an account's own failures once it signs in.

    axes holds every counter (``AXES_LOCKOUT_PARAMETERS``) to one limit; here the pair
    (account, address) keeps it and the address and the account alone each get their own,
    higher one (:meth:`get_failures`), so that no one address can lock out everyone behind
    it, nor one account everywhere.

    axes' reset-on-success forgets every failure from the signing-in address too, so an
    attacker could sign in to an account of their own between guesses at someone else's and
    never be throttled. Here a successful sign-in removes only the attempts made under that
    account's name: its typos stop counting, against the account and against the address,
    while failures against other accounts from that address keep counting. It also makes
    what axes stores of a request's headers storable (:func:`_storable`).
    """

    def get_failures(self, request: Any, credentials: dict[str, Any] | None = None) -> int:
        """The failures that count against this sign-in, on the scale of ``AXES_FAILURE_LIMIT``.

        axes compares this one number with that one limit (to refuse a sign-in, and to lock
        out at a failure), so each counter's failures are given as their share of its own
        limit, times that one: ``floor(failures * base / limit)`` reaches ``base`` exactly
        when ``failures`` reaches ``limit``. The pair's limit is ``base``, so its share is its
        count.
        """
        base: int = settings.AXES_FAILURE_LIMIT
        limits = _counter_limits()
        parameters = get_lockout_parameters(request, credentials)
        # One query set per parameter, in the same order, already within the cool-off.
        counted = self.get_user_attempts(request, credentials)
        shares = [0]
        for parameter, attempts in zip(parameters, counted, strict=True):
            fields = frozenset([parameter] if isinstance(parameter, str) else parameter)
            failures: int = attempts.aggregate(total=Sum("failures_since_start"))["total"] or 0
            shares.append(failures * base // limits[fields])
        return max(shares)

    def user_login_failed(
        self, sender: Any, credentials: dict[str, Any], request: Any = None, **kwargs: Any
    ) -> None:
        _storable(request)
        super().user_login_failed(sender, credentials, request, **kwargs)

    def user_logged_in(self, sender: Any, request: Any, user: Any, **kwargs: Any) -> None:
        _storable(request)
        super().user_logged_in(sender, request, user, **kwargs)
        AccessAttempt.objects.filter(username=user.get_username()).delete()

    def user_logged_out(self, sender: Any, request: Any, user: Any, **kwargs: Any) -> None:
        _storable(request)
        super().user_logged_out(sender, request, user, **kwargs)


def _counter_limits() -> dict[frozenset[str], int]:
    """Each counter in ``AXES_LOCKOUT_PARAMETERS``, by the fields it counts, and its limit.

    Read at each sign-in rather than once, so that a test's settings apply.
    """
    return {
        frozenset({"username", "ip_address"}): settings.AXES_FAILURE_LIMIT,
        frozenset({"ip_address"}): settings.LOOPGUARD_LOGIN_ADDRESS_FAILURE_LIMIT,
        frozenset({"username"}): settings.LOOPGUARD_LOGIN_ACCOUNT_FAILURE_LIMIT,
    }


def _storable(request: Any) -> None:
    """Make the request's headers, as axes is about to store them, storable in PostgreSQL.

    axes copies the User-Agent and Accept headers into its tables as sent; a NUL in one
    (which some servers let through) would make the database refuse the row and the sign-in
    page answer 500.
    """
    for name in ("axes_user_agent", "axes_http_accept", "axes_path_info"):
        value = getattr(request, name, None)
        if isinstance(value, str) and "\x00" in value:
            setattr(request, name, value.replace("\x00", "\ufffd"))


def lockout_response(
    request: HttpRequest, original_response: HttpResponse | None, credentials: Any
) -> HttpResponse:
    """The sign-in page again, saying why, as 429 Too Many Requests.

    The same words whether the account exists or not, and whether the account or the
    address reached the limit: the page must not help someone find out which accounts exist.
    """
    minutes = max(1, round(settings.AXES_COOLOFF_TIME.total_seconds() / 60))
    username = credentials.get("username") if isinstance(credentials, dict) else None
    logger.warning(
        "sign-in refused: too many failed attempts (%s); the cool-off is %d minutes",
        client_description(username, getattr(request, "axes_ip_address", None), "", "", request),
        minutes,
    )
    message = (
        f"Too many failed sign-ins for this account or from this address. Try again in "
        f"{minutes} minutes, or ask an administrator to lift the block."
    )
    return render(
        request,
        "registration/login.html",
        {
            "form": AuthenticationForm(request),
            "throttled": message,
            "next": request.POST.get("next", ""),
        },
        status=429,
    )


class RevokeApiTokensOnPasswordChange:
    """Revokes a user's API tokens when their password changes.

    A token acts as its user; a password change is how a person takes their account back
    after a leak, so tokens issued before it end with it, as sessions do. Listed in
    ``AUTH_PASSWORD_VALIDATORS`` because that is where Django announces a change:
    ``password_changed`` runs after ``set_password()`` and ``save()`` (the ``create_user``
    command, ``changepassword``, Django's password forms), and not when a sign-in merely
    re-hashes the same password with a newer hasher. It checks no password's strength.
    """

    def validate(self, password: str, user: AbstractBaseUser | None = None) -> None:
        """Accept every password: this validator only listens for changes."""

    def password_changed(self, password: str, user: AbstractBaseUser | None = None) -> None:
        """Revoke every live token of ``user``, noting how many in the log."""
        if not isinstance(user, User) or user.pk is None:
            return
        revoked = api_token_revoke_all(user=user)
        if revoked:
            logger.warning(
                "revoked %d API token(s) of %s: the password changed",
                revoked,
                ascii(user.get_username()),
            )

    def get_help_text(self) -> str:
        """Nothing to tell a person choosing a password."""
        return ""
