"""API tokens: stored as a hash, noted when used, issued and revoked by commands."""

from __future__ import annotations

import hashlib
from datetime import timedelta
from io import StringIO

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.utils import timezone

from console.api.tokens import api_token_forget_checks
from console.models import ApiToken
from console.records.roles import Role, assign

from .helpers import Caller, bearer

pytestmark = pytest.mark.django_db


def _create_api_token(username: str, name: str) -> str:
    """Run the command; returns the secret it printed alone on its last line."""
    out = StringIO()
    call_command("create_api_token", username, "--name", name, stdout=out)
    return out.getvalue().strip().splitlines()[-1]

def test_only_a_hash_of_the_secret_is_stored(admin: Caller) -> None:
    row = ApiToken.objects.filter(id=admin.token.id).values().get()

    assert row["key_hash"] == hashlib.sha256(admin.secret.encode()).hexdigest()
    assert row["prefix"] == admin.secret[:8]
    assert all(admin.secret not in str(value) for value in row.values())


def test_using_a_token_records_when_it_was_last_used(admin: Caller) -> None:
    assert admin.token.last_used_at is None

    admin.get("/api/tasks")

    admin.token.refresh_from_db()
    first = admin.token.last_used_at
    assert first is not None
    # Written at most once a minute, so a busy client does not write on every read...
    admin.get("/api/tasks")
    admin.token.refresh_from_db()
    assert admin.token.last_used_at == first
    # ...but an hour later it moves.
    ApiToken.objects.filter(id=admin.token.id).update(last_used_at=first - timedelta(hours=1))
    api_token_forget_checks()  # an hour later, the process's kept check has long run out
    admin.get("/api/tasks")
    admin.token.refresh_from_db()
    assert admin.token.last_used_at is not None and admin.token.last_used_at > first


def test_the_command_prints_a_working_token_once_and_stores_only_its_hash(
    django_user_model: type[User],
) -> None:
    ana = django_user_model.objects.create_user("ana")
    assign(ana, [Role.VIEWER])

    secret = _create_api_token("ana", "ci")

    assert secret.startswith("lg_")
    token = ApiToken.objects.get(user=ana)
    assert (token.name, token.prefix) == ("ci", secret[:8])
    assert token.key_hash == hashlib.sha256(secret.encode()).hexdigest()
    client = bearer(secret)
    assert client.get("/api/tasks").status_code == 200


def test_the_command_refuses_an_unknown_user_and_a_second_live_token_of_the_same_name(
    django_user_model: type[User],
) -> None:
    django_user_model.objects.create_user("ana")
    call_command("create_api_token", "ana", "--name", "ci", stdout=StringIO())

    with pytest.raises(CommandError, match="no user"):
        call_command("create_api_token", "bob", "--name", "ci", stdout=StringIO())
    with pytest.raises(CommandError, match="already has a live token"):
        call_command("create_api_token", "ana", "--name", "ci", stdout=StringIO())
    ApiToken.objects.update(revoked_at=timezone.now())
    call_command("create_api_token", "ana", "--name", "ci", stdout=StringIO())  # a replacement
    assert ApiToken.objects.filter(user__username="ana").count() == 2


def test_a_revoked_token_is_refused_from_then_on_and_its_name_can_be_reused(
    django_user_model: type[User],
) -> None:
    ana = django_user_model.objects.create_user("ana")
    assign(ana, [Role.VIEWER])
    secret = _create_api_token("ana", "ci")
    client = bearer(secret)
    assert client.get("/api/tasks").status_code == 200

    said = StringIO()
    call_command("revoke_api_token", "ana", "--name", "ci", stdout=said)

    assert "revoked API token 'ci' of ana" in said.getvalue()
    refused = client.get("/api/tasks")
    assert refused.status_code == 401
    assert "revoked" in refused.json()["error"]
    assert ApiToken.objects.get(user=ana).revoked_at is not None  # kept, not deleted
    call_command("create_api_token", "ana", "--name", "ci", stdout=StringIO())
    assert ApiToken.objects.filter(user=ana, revoked_at__isnull=True).count() == 1


def test_revoking_a_token_that_is_not_live_says_which_ones_are(
    django_user_model: type[User],
) -> None:
    django_user_model.objects.create_user("ana")
    call_command("create_api_token", "ana", "--name", "ci", stdout=StringIO())
    call_command("create_api_token", "ana", "--name", "laptop", stdout=StringIO())
    call_command("revoke_api_token", "ana", "--name", "laptop", stdout=StringIO())

    with pytest.raises(CommandError, match=r"no live token named 'laptop' \(live tokens: 'ci'\)"):
        call_command("revoke_api_token", "ana", "--name", "laptop", stdout=StringIO())
    nobody = r"bob has no live token named 'ci' \(live tokens: none\)"
    with pytest.raises(CommandError, match=nobody):
        call_command("revoke_api_token", "bob", "--name", "ci", stdout=StringIO())
    assert ApiToken.objects.filter(revoked_at__isnull=True).count() == 1
