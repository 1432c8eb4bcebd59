"""console/store/queries.py: the services' own statements, on PostgreSQL.

The token check runs on every API request, so what it reads in its one statement (the token,
its user, the user's roles) is what a request then needs; the goal lock holds another
session off the same goal until the transaction ends. Standalone mode's variants (the ORM's
join; no lock, SQLite's one writer) run in tests/test_standalone.py through a live console.
"""

from __future__ import annotations

import hashlib

import pytest
from django.contrib.auth.models import User
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from console.api.tokens import api_token_digest, api_token_issue, api_token_revoke
from console.records.roles import Role, assign, roles_of
from console.store.queries import api_token_of, database_answers, lock_goal
from tests.databases import other_session


def _goal_key(fingerprint: str) -> int:
    return int.from_bytes(bytes.fromhex(fingerprint[:16]), "big", signed=True)


@pytest.mark.django_db
def test_the_token_check_reads_the_token_its_user_and_their_roles_in_one_statement() -> None:
    user = User.objects.create_user("reconciling-agent")
    assign(user, [Role.AGENT, Role.RECONCILER])
    issued, secret = api_token_issue(user=user, name="ci")

    with CaptureQueriesContext(connection) as queries:
        token = api_token_of(api_token_digest(secret))
        assert token is not None
        roles = roles_of(token.user)

    assert len(queries) == 1, [q["sql"] for q in queries.captured_queries]
    assert (token.id, token.name, token.user.username) == (issued.id, "ci", "reconciling-agent")
    assert roles == {Role.AGENT, Role.RECONCILER}


@pytest.mark.django_db
def test_the_token_check_finds_a_revoked_token_as_revoked_and_an_unknown_one_not_at_all() -> None:
    user = User.objects.create_user("leaver")
    _, secret = api_token_issue(user=user, name="old")
    api_token_revoke(username="leaver", name="old")

    revoked = api_token_of(api_token_digest(secret))

    assert revoked is not None and revoked.is_revoked
    assert api_token_of(api_token_digest(secret + "x")) is None


@pytest.mark.django_db(transaction=True)
def test_the_goal_lock_holds_another_session_off_that_goal_until_the_transaction_ends() -> None:
    goal = hashlib.sha256(b"support_desk\x00{}").hexdigest()
    other_goal = hashlib.sha256(b"support_desk\x00{'order': 7}").hexdigest()
    with other_session() as other:

        def other_may_take(fingerprint: str) -> bool:
            # Taken and, at once, let go again by the end of its own one-statement transaction.
            found = other.execute("SELECT pg_try_advisory_xact_lock(%s)", [_goal_key(fingerprint)])
            row = found.fetchone()
            return bool(row and row[0])

        with transaction.atomic():
            lock_goal(goal)
            assert not other_may_take(goal)
            assert other_may_take(other_goal)
        assert other_may_take(goal)


@pytest.mark.django_db
def test_the_database_answers_the_health_probe() -> None:
    assert database_answers() is True
