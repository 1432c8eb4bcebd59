"""API tokens: issue one, recognise one, note that it was used, revoke one.

A token acts as its user with that user's roles. Only the SHA-256 of its secret is stored
(the secret is shown once, when it is issued); a revoked token keeps its row, so that who
held which token stays on record. The HTTP side of a token (the ``Authorization`` header,
the 401 answer) is :mod:`console.api.views`' business; the management commands
``create_api_token`` and ``revoke_api_token`` call this module too. A password change
revokes every token of its user (:func:`api_token_revoke_all`, called from
:mod:`console.project.security`).

A process keeps a token's successful check for :data:`TOKEN_CHECK_SECONDS`: an attached
agent asks before every model call and tool call, and reading the token, its user and their
roles on each request was a statement and a sixth of the request's CPU. So a revocation, a
deactivation or a change of roles made in another process (a management command, another
web worker) reaches this one within that bound; made in this process (the services here,
a user saved through the ORM) it clears the kept checks at once. A refusal is never kept.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.contrib.auth.models import User
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.db.models.signals import m2m_changed, post_save
from django.utils import timezone

from console.models import ApiToken
from console.services import InvalidInput, NotFound, Refused, ServiceError
from console.store.queries import api_token_of

__all__ = [
    "LAST_USED_RESOLUTION",
    "MAX_TOKEN_LENGTH",
    "PREFIX_LENGTH",
    "TOKEN_CHECK_SECONDS",
    "TOKEN_PREFIX",
    "TokenRefused",
    "api_token_authenticate",
    "api_token_digest",
    "api_token_for",
    "api_token_forget_checks",
    "api_token_issue",
    "api_token_mark_used",
    "api_token_revoke",
    "api_token_revoke_all",
]

# Makes a leaked token recognisable to secret scanners and people; not a secret itself.
TOKEN_PREFIX = "lg_"  # noqa: S105
PREFIX_LENGTH = 8
MAX_TOKEN_LENGTH = 200  # longer than any token we issue: not worth hashing
# ``last_used_at`` is written at most this often per token, so that a busy client does not
# turn every read into a write.
LAST_USED_RESOLUTION = timedelta(minutes=1)
TOKEN_CHECK_SECONDS = 5.0
"""How long a process keeps a token's successful check (see the module): the bound within
which a token revoked elsewhere stops working here (docs/protocol.md, "Tokens")."""
_CHECKS_KEPT = 1024  # tokens in use at once in one process are far fewer; a bound all the same


@dataclass(frozen=True, slots=True)
class _Checked:
    token: ApiToken
    until: float  # on _clock


# By the secret's digest. The token and its user are shared by the requests (and threads)
# that use them in the meantime: read, never changed, but for last_used_at (a time noted).
_checked: dict[str, _Checked] = {}
_clock = time.monotonic  # the bound's clock; a test moves it on


class TokenRefused(ServiceError):
    """The secret names no usable token (unknown, revoked, or its user is deactivated)."""


def api_token_digest(secret: str) -> str:
    """What is stored for ``secret``: its SHA-256, in hex."""
    return hashlib.sha256(secret.encode()).hexdigest()


def api_token_issue(*, user: User, name: str) -> tuple[ApiToken, str]:
    """Create a token for ``user``; returns it with its secret, which is never stored.

    The caller must show the secret now: afterwards only its hash and prefix exist. A user
    cannot hold two live tokens of one name (:class:`~console.services.Refused`).
    """
    name = name.strip()[:100]
    if not name:
        raise InvalidInput("a token needs a name")
    secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
    try:
        # Its own savepoint: the unique constraint decides, and a caller's transaction
        # survives the refusal.
        with transaction.atomic():
            token = ApiToken.objects.create(
                user=user,
                name=name,
                key_hash=api_token_digest(secret),
                prefix=secret[:PREFIX_LENGTH],
            )
    except IntegrityError:
        raise Refused(f"{user.get_username()} already has a live token named {name!r}") from None
    return token, secret


def api_token_for(secret: str) -> ApiToken | None:
    """The token whose secret this is (revoked or not), or None."""
    if not secret or len(secret) > MAX_TOKEN_LENGTH:
        return None
    digest = api_token_digest(secret)
    token = api_token_of(digest)  # every API request's first statement
    # The lookup compares hashes in the database, not in constant time; checking again with
    # compare_digest keeps the final decision free of timing differences all the same.
    if token is None or not hmac.compare_digest(token.key_hash, digest):
        return None
    return token


def api_token_authenticate(secret: str, *, now: datetime | None = None) -> ApiToken:
    """The live token of a usable user whose secret this is, its use noted; otherwise
    :class:`TokenRefused` saying why. A check that passed is kept for
    :data:`TOKEN_CHECK_SECONDS` (see the module)."""
    digest = api_token_digest(secret) if secret and len(secret) <= MAX_TOKEN_LENGTH else ""
    at = _clock()
    kept = _checked.get(digest)
    if kept is not None and at < kept.until:
        token = kept.token
    else:
        token = _check(secret)
        if len(_checked) >= _CHECKS_KEPT:
            _checked.clear()  # rare: the checks are made again as they come
        _checked[digest] = _Checked(token, at + TOKEN_CHECK_SECONDS)
    api_token_mark_used(token, now=now)
    return token


def _check(secret: str) -> ApiToken:
    token = api_token_for(secret)
    if token is None:
        raise TokenRefused("the token is not valid")
    if token.is_revoked:
        raise TokenRefused("the token has been revoked")
    if not token.user.is_active:
        raise TokenRefused("the token's user is deactivated")
    return token


def api_token_forget_checks(**_: Any) -> None:
    """Drop every kept check (a token, a user or their roles changed in this process): the
    next request of each token is checked against the database again."""
    _checked.clear()


# Saved through the ORM in this process: the kept checks are stale at once. (``update()``
# sends no signal: the services that revoke call api_token_forget_checks themselves.)
post_save.connect(api_token_forget_checks, sender=ApiToken, dispatch_uid="token-checks-token")
post_save.connect(api_token_forget_checks, sender=User, dispatch_uid="token-checks-user")
m2m_changed.connect(
    api_token_forget_checks, sender=User.groups.through, dispatch_uid="token-checks-roles"
)


def api_token_mark_used(token: ApiToken, *, now: datetime | None = None) -> None:
    """Record that ``token`` was used now, at most once per :data:`LAST_USED_RESOLUTION`."""
    now = now or timezone.now()
    due = now - LAST_USED_RESOLUTION
    if token.last_used_at is not None and token.last_used_at >= due:
        return
    # Conditional, so that concurrent requests write once and never move the time back.
    ApiToken.objects.filter(id=token.id).filter(
        Q(last_used_at__isnull=True) | Q(last_used_at__lt=due)
    ).update(last_used_at=now)
    token.last_used_at = now


def api_token_revoke(*, username: str, name: str, now: datetime | None = None) -> None:
    """Revoke ``username``'s live token named ``name``: every request with it is refused
    from now on. The row stays (``revoked_at`` set), and a new token may take the name.

    Raises :class:`~console.services.NotFound` naming the user's live tokens when there is
    no such live token.
    """
    username, name = username.strip(), name.strip()
    live = ApiToken.objects.filter(user__username=username, revoked_at__isnull=True)
    if live.filter(name=name).update(revoked_at=now or timezone.now()):
        api_token_forget_checks()  # this process at once; the others within the bound
        return
    names = sorted(live.values_list("name", flat=True))
    having = ", ".join(repr(n) for n in names) if names else "none"
    raise NotFound(f"{username} has no live token named {name!r} (live tokens: {having})")


def api_token_revoke_all(*, user: User, now: datetime | None = None) -> int:
    """Revoke every live token of ``user`` (their password changed); returns how many.

    The rows stay, ``revoked_at`` set, like any revocation; the user issues new tokens.
    """
    live = ApiToken.objects.filter(user=user, revoked_at__isnull=True)
    revoked = live.update(revoked_at=now or timezone.now())
    api_token_forget_checks()  # this process at once; the others within the bound
    return revoked
