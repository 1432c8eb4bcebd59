"""The runner's and the ledger's fixed statements, run as prepared statements on PostgreSQL.

A guarded step sends a handful of statements whose text never changes (the claim, the
settling move, the step's save). Django binds parameters on the client and sends each
statement as new text, so PostgreSQL parses and plans it every time: for these CTEs that
is more work than executing them. Here they go through a server-side binding cursor that
prepares them on the connection; the Django cursor wrapper around it keeps its error
translation and ``execute_wrapper`` hooks.

Prepared statements live in the database session. Behind a transaction-pooling
PgBouncer, enable its ``max_prepared_statements`` (1.21+) or set
``LOOPGUARD_PREPARED_STATEMENTS=false``. Elsewhere (SQLite) statements run as usual.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Self

import psycopg
import psycopg.abc
from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connections
from django.db.backends.utils import CursorDebugWrapper, CursorWrapper

Params = Sequence[Any] | Mapping[str, Any]
_NEVER_BY_COUNT = 2**31 - 1


def fetch_one(sql: str, params: Params) -> tuple[Any, ...] | None:
    """Execute ``sql`` and return its first row (None when it returns none)."""
    with _cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    return None if row is None else tuple(row)


def _cursor() -> CursorWrapper:
    db = connections[DEFAULT_DB_ALIAS]  # the thread's wrapper, looked up once
    if db.vendor != "postgresql" or not settings.LOOPGUARD_PREPARED_STATEMENTS:
        return db.cursor()
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
        return super().execute(query, params, prepare=True, binary=binary)
