"""A password change revokes the user's API tokens: a token acts as its user, and changing
the password is how a person takes their account back."""

from __future__ import annotations

from io import StringIO

import pytest
from django.contrib.auth.hashers import PBKDF2PasswordHasher
from django.contrib.auth.models import User
from django.core.management import call_command
from django.test import Client
from pytest_django.fixtures import Settings

from console.api.tokens import api_token_issue
from console.models import ApiToken
from console.records.roles import Role, assign

PASSWORD = "the-old-password"


class QuickPBKDF2(PBKDF2PasswordHasher):
    """A newer hasher to upgrade to at sign-in, cheap enough for a test."""

    iterations = 1000


def api(secret: str) -> Client:
    return Client(headers={"authorization": f"Bearer {secret}"})


@pytest.fixture
def ana(django_user_model: type[User]) -> User:
    user = django_user_model.objects.create_user("ana", password=PASSWORD)
    assign(user, [Role.VIEWER])
    return user


def test_changing_the_password_revokes_every_token_of_that_user(
    ana: User, django_user_model: type[User]
) -> None:
    _, ci = api_token_issue(user=ana, name="ci")
    _, laptop = api_token_issue(user=ana, name="laptop")
    bob = django_user_model.objects.create_user("bob")
    assign(bob, [Role.VIEWER])
    _, bobs = api_token_issue(user=bob, name="ci")
    assert api(ci).get("/api/tasks").status_code == 200

    ana.set_password("a-new-password")
    ana.save()

    for secret in (ci, laptop):
        refused = api(secret).get("/api/tasks")
        assert refused.status_code == 401
        assert "revoked" in refused.json()["error"]
    assert api(bobs).get("/api/tasks").status_code == 200  # someone else's: untouched
    assert ApiToken.objects.filter(user=ana).count() == 2  # kept on record, not deleted


def test_resetting_a_password_with_create_user_revokes_the_tokens(ana: User) -> None:
    _, secret = api_token_issue(user=ana, name="ci")

    call_command("create_user", "ana", "--role", "viewer", stdout=StringIO())

    assert api(secret).get("/api/tasks").status_code == 401


def test_a_token_issued_after_the_change_works(ana: User) -> None:
    api_token_issue(user=ana, name="ci")
    ana.set_password("a-new-password")
    ana.save()

    _, fresh = api_token_issue(user=ana, name="ci")

    assert api(fresh).get("/api/tasks").status_code == 200


def test_editing_a_user_without_touching_the_password_keeps_the_tokens(ana: User) -> None:
    _, secret = api_token_issue(user=ana, name="ci")

    ana.email = "ana@example.com"
    ana.save()

    assert api(secret).get("/api/tasks").status_code == 200


def test_a_sign_in_that_only_rehashes_the_same_password_keeps_the_tokens(
    ana: User, settings: Settings
) -> None:
    _, secret = api_token_issue(user=ana, name="ci")
    # A release makes a stronger hasher the preferred one: the next sign-in re-hashes.
    settings.PASSWORD_HASHERS = [
        f"{__name__}.QuickPBKDF2",
        "django.contrib.auth.hashers.MD5PasswordHasher",
    ]

    signed_in = Client().post("/login", {"username": "ana", "password": PASSWORD})

    assert signed_in.status_code == 302
    ana.refresh_from_db()
    assert ana.password.startswith("pbkdf2_sha256$1000$")
    assert api(secret).get("/api/tasks").status_code == 200
