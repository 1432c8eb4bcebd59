"""The store's fixed statements, run as prepared statements on PostgreSQL.

A guarded step sends a handful of statements whose text never changes (the claim, the
settling move, the step's save), and every API request one (the token check's). Django
binds parameters on the client and sends each statement as new text, so PostgreSQL parses
and plans it every time: for these CTEs that is more work than executing them. Here they
go through a server-side binding cursor that prepares them on the connection. It is made
once per database session and reused by every statement, with Django's error translation,
its health check and its broken-transaction check; when something watches the connection
(an ``execute_wrapper``, the query log of ``DEBUG``) the statement goes through Django's
cursor wrapper instead, so it is seen.

An attached step's first statement, a read (``fetch_read``), is the kept session's health
check: Django's ``SELECT 1`` before it would cost a round trip on every request to guard
against what happens only after a restart or a failover. A session the read finds dead is
replaced and the read sent again; nothing else of the request was on it.

Prepared statements live in the database session. Behind a transaction-pooling
PgBouncer, enable its ``max_prepared_statements`` (1.21+) or set
``LOOPGUARD_PREPARED_STATEMENTS=false``. Elsewhere (SQLite) statements run as usual.

The texts are written in ``console/store/``, and only the store imports this module
(``tests/test_architecture.py`` keeps that door): it runs SQL and writes none.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Self

import psycopg
import psycopg.abc
from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, InterfaceError, OperationalError, connections
from django.db.backends.utils import CursorDebugWrapper, CursorWrapper

Params = Sequence[Any] | Mapping[str, Any]
_NEVER_BY_COUNT = 2**31 - 1


def fetch_one(sql: str, params: Params) -> tuple[Any, ...] | None:
    """Execute ``sql``, one of the store's fixed texts, and return its first row (None when
    it returns none)."""
    db = connections[DEFAULT_DB_ALIAS]  # the thread's wrapper, looked up once
    # With DEBUG's query log on, statements go through Django's debug cursor, as made.
    prepared = settings.LOOPGUARD_PREPARED_STATEMENTS and not db.queries_logged
    if db.vendor == "postgresql" and prepared:
        return _fetch_prepared(db, sql, params)
    with _cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    return None if row is None else tuple(row)


def fetch_read(sql: str, params: Params) -> tuple[Any, ...] | None:
    """:func:`fetch_one` for a read that may be sent twice (it changes nothing), as a
    request's first statement outside a transaction: on a kept session it is the health
    check itself, in place of Django's ``SELECT 1`` before it (``CONN_HEALTH_CHECKS``). A
    session it finds dead (the database restarted, failed over, ended it while idle) had
    nothing of the request on it: it is replaced, and the read sent once more."""
    # Any: the health check's attributes (Django's own, set in connect()) are not in the stubs.
    db: Any = connections[DEFAULT_DB_ALIAS]
    unchecked = (
        db.connection is not None
        and db.health_check_enabled
        and not db.health_check_done
        and not db.in_atomic_block
        and getattr(db, "pool", None) is None  # a pool hands out checked sessions itself
    )
    if not unchecked:
        return fetch_one(sql, params)
    db.health_check_done = True  # this read is the check
    try:
        return fetch_one(sql, params)
    except (OperationalError, InterfaceError) as exc:
        if not _session_lost(exc):
            raise  # a statement cancelled or refused on a live session: not the check's
        db.close()  # outside a transaction: the wrapper opens a new session next
        return fetch_one(sql, params)


# The server ended the session (admin shutdown, crash shutdown, cannot connect now).
_ENDED = frozenset({"57P01", "57P02", "57P03"})


def _session_lost(error: Exception) -> bool:
    """Whether ``error`` says the session is gone (a connection failure: no SQLSTATE, or
    class 08, or the server ending it), not that a statement failed on a live one (a
    statement timeout, a cancel)."""
    state = getattr(error.__cause__, "sqlstate", None)
    return state is None or state.startswith("08") or state in _ENDED


def _fetch_prepared(db: Any, sql: str, params: Params) -> tuple[Any, ...] | None:
    """The hot path: one prepared cursor per session, reused for every statement, with
    Django's error translation and its broken-transaction check; through Django's cursor
    wrapper (kept with it) only when an ``execute_wrapper`` watches the connection."""
    db.close_if_health_check_failed()  # as Django's own cursors do (CONN_HEALTH_CHECKS)
    if db.connection is None:
        db.ensure_connection()
    session = db.connection
    cached = getattr(db, "_loopguard_cursor", None)
    if cached is None or cached[0] is not session:
        db.validate_thread_sharing()
        if session.prepare_threshold is None:
            session.prepare_threshold = _NEVER_BY_COUNT
        raw = _Prepared(session)
        cached = (session, raw, CursorWrapper(raw, db))
        db._loopguard_cursor = cached
    cursor = cached[1]
    if db.execute_wrappers:
        wrapped = cached[2]
        wrapped.execute(sql, params)
        return wrapped.fetchone()  # type: ignore[no-any-return]
    if db.needs_rollback:
        db.validate_no_broken_transaction()
    with db.wrap_database_errors:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    return row


def _cursor() -> CursorWrapper:
    db = connections[DEFAULT_DB_ALIAS]  # the thread's wrapper, looked up once
    if db.vendor != "postgresql" or not settings.LOOPGUARD_PREPARED_STATEMENTS:
        return db.cursor()
    # As Django's own cursors do (CONN_HEALTH_CHECKS): a kept connection the database
    # dropped while it was idle (a restart, pg_terminate_backend) is found dead here, once
    # per request, and replaced before anything is sent on it. Every API request's first
    # statement (the token's) comes this way with DEBUG's query log on.
    db.close_if_health_check_failed()
    if db.connection is None:
        db.ensure_connection()
    db.validate_thread_sharing()
    session = db.connection
    if session.prepare_threshold is None:
        # Django opens connections with preparing off (None), which psycopg honours even
        # for prepare=True. A threshold no statement reaches turns it back on for these
        # statements only: Django's own cursors bind on the client and never prepare.
        session.prepare_threshold = _NEVER_BY_COUNT
    raw = _Prepared(session)
    # Django's wrappers: its error translation, execute_wrappers and query logging.
    if db.queries_logged:
        return CursorDebugWrapper(raw, db)
    return CursorWrapper(raw, db)


class _Prepared(psycopg.Cursor[Any]):
    """Server-side binding, prepared on first use (Django turns auto-preparing off)."""

    def execute(
        self,
        query: Any,
        params: psycopg.abc.Params | None = None,
        *,
        prepare: bool | None = None,
        binary: bool | None = None,
    ) -> Self:
        if type(query) is str and query.isascii():  # the same bytes in every encoding
            query = _encoded(query)
        return super().execute(query, params, prepare=True, binary=binary)


_ENCODED: dict[str, bytes] = {}
_ENCODED_MAX = 256  # the fixed texts are a handful; a bound all the same


def _encoded(query: str) -> bytes:
    """``query`` as the bytes psycopg sends, encoded once per text: psycopg would encode
    the text, then hash the bytes to find its parsed form and its prepared statement, on
    every execution; bytes made once keep their hash."""
    encoded = _ENCODED.get(query)
    if encoded is None:
        encoded = query.encode()
        if len(_ENCODED) < _ENCODED_MAX:
            _ENCODED[query] = encoded
    return encoded
