"""Each kind of channel is one transport in ``notifications.TRANSPORTS``, and everything that
knows a kind takes it from there: the database's own checks are held to the table here, and
the form and the service ask each kind for what its transport says it needs."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Sequence

import pytest
from django.contrib.auth.models import User
from django.db import IntegrityError, transaction

from console.drivers import notifications
from console.models import ChannelTransport, NotificationChannel
from console.web.notification_views import ChannelForm

TRANSPORTS = notifications.TRANSPORTS
KINDS = sorted(TRANSPORTS)
KEPT = [(kind, field) for kind in KINDS for field in TRANSPORTS[kind].keeps]
ASKED = [(kind, field, said) for kind in KINDS for field, said in TRANSPORTS[kind].asks.items()]
# A value for every target field that each transport's checks take.
FILLED = {
    "url": "https://hooks.example.com/services/T0/B0/xyz",
    "address": "ops@example.com",
    "secret": "a-secret-of-the-receiver-0123456789",
}


def public(host: str, port: int) -> Sequence[notifications.Address]:
    return [ipaddress.ip_address("93.184.215.14")]


def _channel(kind: str, **target: str) -> NotificationChannel:
    return NotificationChannel.objects.create(
        name="on-call", transport=kind, kinds=["needs_human"], **target
    )


def test_every_kind_the_database_takes_has_a_transport_and_every_transport_a_kind() -> None:
    assert set(TRANSPORTS) == set(ChannelTransport.values)


def test_a_transport_keeps_and_asks_for_target_fields_of_the_channel_only() -> None:
    columns = {field.name for field in NotificationChannel._meta.get_fields()}
    assert set(notifications.TARGET_FIELDS) <= columns
    for kind in KINDS:
        transport = TRANSPORTS[kind]
        assert transport.keeps, kind
        assert set(transport.keeps) <= set(notifications.TARGET_FIELDS), kind
        assert set(transport.asks) <= set(transport.keeps), kind


# -- the database's constraint says what the table says ------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("kind", KINDS)
def test_the_database_takes_a_channel_with_only_the_fields_its_transport_keeps(kind: str) -> None:
    channel = _channel(kind, **{field: FILLED[field] for field in TRANSPORTS[kind].keeps})

    assert NotificationChannel.objects.filter(id=channel.id, transport=kind).exists()


@pytest.mark.django_db
@pytest.mark.parametrize(("kind", "field"), KEPT)
def test_the_database_refuses_a_channel_without_a_field_its_transport_keeps(
    kind: str, field: str
) -> None:
    # Every other target field filled: another transport's fields do not stand in for it.
    target = {**FILLED, field: ""}

    with pytest.raises(IntegrityError, match="notification_channel_target"), transaction.atomic():
        _channel(kind, **target)


@pytest.mark.django_db
def test_the_database_refuses_a_kind_that_has_no_transport() -> None:
    with pytest.raises(IntegrityError), transaction.atomic():
        _channel("pigeon", **FILLED)


# -- the form and the service ask what the transport asks ----------------------------------


def _form(kind: str, **change: str) -> ChannelForm:
    return ChannelForm(
        {
            "name": "on-call",
            "transport": kind,
            "kinds": ["needs_human"],
            "reason": "the on-call rota",
            **FILLED,
            **change,
        }
    )


@pytest.mark.parametrize("kind", KINDS)
def test_the_form_takes_each_kind_with_its_fields_given(kind: str) -> None:
    form = _form(kind)

    assert form.is_valid(), form.errors


@pytest.mark.parametrize(("kind", "field", "said"), ASKED)
def test_the_form_asks_for_each_field_the_transport_needs(kind: str, field: str, said: str) -> None:
    form = _form(kind, **{field: ""})

    assert not form.is_valid()
    assert form.errors[field] == [said]


@pytest.fixture
def admin(db: None) -> User:
    return User.objects.create_user("admin")


@pytest.mark.parametrize(("kind", "field", "said"), ASKED)
def test_the_service_refuses_a_channel_without_a_field_the_transport_needs(
    admin: User, kind: str, field: str, said: str
) -> None:
    with pytest.raises(notifications.NotificationError, match=re.escape(said)):
        notifications.channel_add(
            actor=admin,
            reason="the on-call rota",
            name="on-call",
            transport=kind,
            kinds=["needs_human"],
            resolve=public,
            **{**FILLED, field: ""},
        )
    assert NotificationChannel.objects.count() == 0


@pytest.mark.parametrize("kind", KINDS)
def test_a_channel_stores_the_fields_its_transport_keeps_and_leaves_the_others_empty(
    admin: User, kind: str
) -> None:
    channel, made = notifications.channel_add(
        actor=admin,
        reason="the on-call rota",
        name="on-call",
        transport=kind,
        kinds=["needs_human"],
        resolve=public,
        **FILLED,
    )

    channel.refresh_from_db()
    kept = TRANSPORTS[kind].keeps
    assert {field: getattr(channel, field) for field in notifications.TARGET_FIELDS} == {
        field: FILLED[field] if field in kept else "" for field in notifications.TARGET_FIELDS
    }
    assert made == ""  # a secret was given: none is made


def test_an_unknown_kind_is_refused_by_the_service(admin: User) -> None:
    with pytest.raises(notifications.NotificationError, match="unknown transport 'pigeon'"):
        notifications.channel_add(
            actor=admin,
            reason="r",
            name="c",
            transport="pigeon",
            kinds=["needs_human"],
            resolve=public,
            **FILLED,
        )
    assert NotificationChannel.objects.count() == 0
