"""The statements the services run that are no guard step's: the API token check, the lock
that serialises the starts of one goal, the probe of the health check, and the snapshot
``/metrics`` reads its rolled and live rows in.

Like the step store's, each function takes values and returns values, and its SQL stays
here, one variant per database where they differ (PostgreSQL; SQLite in standalone mode).
Only the modules that run them import this one (``tests/test_architecture.py`` keeps the
door): :mod:`console.api.tokens`, :mod:`console.services`, :mod:`console.web.health` and
:mod:`console.web.metrics`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from django.contrib.auth.models import User
from django.db import connection, transaction

from console.models import ApiToken
from console.records.roles import Role, remember_roles
from console.store.statements import fetch_one

__all__ = ["api_token_of", "database_answers", "lock_goal", "snapshot"]


# Every API request starts here: the token, its user and the user's role names in one
# prepared statement (the ORM's two queries cost a millisecond of CPU to build, more than
# the step they guard). Column lists come from the models, so a new field is read too.
_TOKEN_FIELDS = tuple(field.attname for field in ApiToken._meta.concrete_fields)
_USER_FIELDS = tuple(field.attname for field in User._meta.concrete_fields)
_TOKEN_COLUMNS = ", ".join(
    [f"t.{field.column}" for field in ApiToken._meta.concrete_fields]
    + [f"u.{field.column}" for field in User._meta.concrete_fields]
)
_TOKEN_SQL = f"""
SELECT {_TOKEN_COLUMNS},
       ARRAY(SELECT g.name FROM auth_group g JOIN auth_user_groups ug ON ug.group_id = g.id
             WHERE ug.user_id = u.id)
FROM console_apitoken t JOIN auth_user u ON u.id = t.user_id
WHERE t.key_hash = %s
"""  # noqa: S608 - column names from the models


def api_token_of(digest: str) -> ApiToken | None:
    """The token stored under ``digest`` (revoked or not) with its user, or None.

    PostgreSQL: one prepared statement, the user's roles remembered on the user
    (:func:`console.records.roles.remember_roles`). SQLite: the ORM's join; the roles are read when
    first asked for.
    """
    if connection.vendor != "postgresql":
        return ApiToken.objects.select_related("user").filter(key_hash=digest).first()
    # Through the store's prepared statements, and so through their health check: a kept
    # connection that died while idle is replaced before this, every API request's first
    # statement, is sent (console.store.statements).
    row = fetch_one(_TOKEN_SQL, [digest])
    if row is None:
        return None
    split = len(_TOKEN_FIELDS)
    token = ApiToken.from_db(connection.alias, _TOKEN_FIELDS, row[:split])
    user = User.from_db(connection.alias, _USER_FIELDS, row[split : split + len(_USER_FIELDS)])
    token.user = user
    remember_roles(user, (Role(name) for name in row[-1] if name in Role))
    return token


def lock_goal(fingerprint: str) -> None:
    """Serialise, until this transaction ends, the starts of one goal (agent and input), or
    of whatever else ``fingerprint`` (a SHA-256 in hex) names (a retried attached start).

    PostgreSQL: a transaction-scoped advisory lock on the fingerprint's first 64 bits (two
    goals sharing them only wait for each other). Under READ COMMITTED the count that follows
    is a new snapshot, so it sees every start that held the lock before. SQLite needs none:
    its transactions are IMMEDIATE (settings), so every writer already holds the database's
    one write lock from BEGIN.
    """
    if connection.vendor != "postgresql":
        return
    key = int.from_bytes(bytes.fromhex(fingerprint[:16]), "big", signed=True)
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s)", [key])


def database_answers() -> bool:
    """Whether the database (PostgreSQL, or SQLite standalone) answers ``SELECT 1`` now;
    ``DatabaseError`` when it cannot be reached."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        return bool(cursor.fetchone() == (1,))


@contextmanager
def snapshot() -> Iterator[None]:
    """Reads that all see one moment of the database: totals that beat rolls up and the
    live rows beside them (``console.rollups``) never count a row twice or not at all
    when a roll commits between two of them.

    PostgreSQL: a read-only ``REPEATABLE READ`` transaction. SQLite: a transaction (its
    reads see one snapshot from the first). Inside a transaction already, that one's.
    """
    if connection.in_atomic_block:
        yield
        return
    with transaction.atomic():
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        yield
