"""PostgreSQL as Django has it, but a kept connection is checked without a round trip.

With ``CONN_HEALTH_CHECKS`` Django sends ``SELECT 1`` on a kept connection before the first
statement of every request: for an attached step, a round trip and a statement on the
server per request, to guard against what happens only after a restart or a failover. Here
the check asks the session's socket instead: a kept session is idle between requests, so
nothing may be waiting on it; when PostgreSQL ends a session (``pg_terminate_backend``, a
shutdown) it says so and closes the socket, which then reads ready, and the connection is
replaced before anything is sent on it. A death the socket does not show yet (the server
killed the session a moment ago) is met by the request's first statement:
:func:`console.store.statements.fetch_one` then opens a new session and sends that
statement again, which is safe only because nothing else was sent on the old session in
this request (:attr:`DatabaseWrapper.kept_unproven`).
"""

from __future__ import annotations

import contextlib
import select
from typing import Any

import psycopg
from django.db.backends.postgresql import base as postgresql
from django.db.backends.signals import connection_created
from psycopg.pq import ConnStatus, TransactionStatus


def session_looks_alive(session: psycopg.Connection[Any]) -> bool:
    """Whether a kept, idle ``session`` may be used, asked of the client side only: not
    closed or broken, idle, and its socket not closed by the server (no round trip)."""
    if session.closed or session.broken:
        return False
    pgconn = session.pgconn
    if pgconn.status != ConnStatus.OK or pgconn.transaction_status != TransactionStatus.IDLE:
        return False
    poll = select.poll()
    poll.register(pgconn.socket, select.POLLIN | select.POLLPRI)
    # Django neither LISTENs nor leaves a result unread, so an idle session has little to
    # say: what is there is read (a notice, a TLS ticket, or the server's word that the
    # session ended); a socket the server closed then fails to read, and the session is
    # dead. Still saying something after a few reads: not worth the doubt, dead too.
    for _ in range(3):
        if not poll.poll(0):
            return True
        try:
            pgconn.consume_input()
        except psycopg.OperationalError:
            return False
        if pgconn.status != ConnStatus.OK:
            return False
    return False


class DatabaseWrapper(postgresql.DatabaseWrapper):
    """Django's PostgreSQL wrapper with the cheap health check (see the module)."""

    # Django's own (set in connect()), which the stubs leave out: annotations only.
    health_check_enabled: bool
    health_check_done: bool

    kept_unproven = False
    """True from a kept session's health check (passed) until something is sent on it:
    a failure in between is the death of a session that nothing of this request used."""

    def close_if_health_check_failed(self) -> None:
        if self.pool:  # the pool only hands out healthy connections (Django's own rule)
            super().close_if_health_check_failed()
            return
        if self.connection is None or not self.health_check_enabled or self.health_check_done:
            return
        if session_looks_alive(self.connection):
            self.kept_unproven = True
        else:
            self.close()
        self.health_check_done = True

    def _cursor(self, name: str | None = None) -> Any:
        cursor = super()._cursor(name)  # type: ignore[misc]  # Django's, not in the stubs
        # Whatever this cursor sends is the request's: a later failure is not the death
        # of an unused session, and no statement may be sent again on a new one.
        self.kept_unproven = False
        return cursor

    def close_if_unusable_or_obsolete(self) -> None:
        self.kept_unproven = False  # a request begins or ends
        super().close_if_unusable_or_obsolete()

    def close(self) -> None:
        self.kept_unproven = False
        super().close()

    def replace_dead_session(self) -> None:
        """Open a new session in place of a kept one that its first statement found dead,
        keeping the wrapper's transaction state: an atomic block that has sent nothing yet
        goes on on the new session (its BEGIN goes with its first statement). Only while
        :attr:`kept_unproven`: then nothing of the request was on the old session."""
        if not self.kept_unproven:  # pragma: no cover - the caller checks
            raise RuntimeError("only a session nothing was sent on is replaced")
        self.kept_unproven = False
        dead, self.connection = self.connection, None
        if dead is not None:
            with contextlib.suppress(psycopg.Error):
                dead.close()
        session = self.get_new_connection(self.get_connection_params())
        session.autocommit = True  # as connect() configures a new session
        self.connection = session
        self.init_connection_state()
        session.autocommit = self.autocommit  # False inside an atomic block
        self.errors_occurred = False  # the failure was the old session's
        self.health_check_done = True  # new connections are healthy
        connection_created.send(sender=self.__class__, connection=self)
