"""Where a webhook may go: an admin's URL is a request from inside the console's network, so
it must not reach the metadata service, Redis, PostgreSQL or anything else internal.

Only https (http when LOOPGUARD_NOTIFY_ALLOW_HTTP says so), no credentials in the URL, and
only public addresses unless LOOPGUARD_NOTIFY_ALLOWED_NETWORKS names the network: checked
when a channel is saved and again, after resolution, at every delivery, connecting to the
address checked. A refusal at delivery is a failed try that says why, never a lost notice.

The suite's own receivers listen on http://127.0.0.1, which tests/settings.py allows; these
tests put the defaults back first. Names are looked up by a resolver handed to the service
(the way a clock is), so that DNS changing between save and delivery is a test, not luck.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import re
import socket
import ssl
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from django.contrib.auth.models import User

from console.drivers import notifications
from console.models import AuditEntry, Notice, NoticeState, NotificationChannel
from tests.processes import run_settings

from .test_notifications import SECRET, Receiver, receiving

pytestmark = pytest.mark.django_db

Address = ipaddress.IPv4Address | ipaddress.IPv6Address

# Each class of address a webhook must not reach, as an admin would type it, and the words
# that say which class it is.
REFUSED_URLS = [
    ("https://169.254.169.254/latest/meta-data/", "169.254.169.254 is a link-local address"),
    ("https://127.0.0.1:6379/", "127.0.0.1 is a loopback address"),
    ("https://localhost:5432/", "localhost resolves to"),
    ("https://[::1]/hook", "::1 is a loopback address"),
    ("https://0.0.0.0/hook", "0.0.0.0 is an unspecified address"),
    ("https://[::]/hook", ":: is an unspecified address"),
    ("https://10.0.0.1/hook", "10.0.0.1 is a private address"),
    ("https://192.168.1.1/hook", "192.168.1.1 is a private address"),
    ("https://[fc00::1]/hook", "fc00::1 is a private address"),
    ("https://[fe80::1]/hook", "fe80::1 is a link-local address"),
    ("https://224.0.0.1/hook", "224.0.0.1 is a multicast address"),
    ("https://[ff02::1]/hook", "ff02::1 is a multicast address"),
    ("https://240.0.0.1/hook", "240.0.0.1 is a reserved address"),
    ("https://100.64.0.1/hook", "100.64.0.1 is a non-public address"),
    ("https://[fec0::1]/hook", "fec0::1 is a site-local address"),
    ("https://[::127.0.0.1]/hook", "::127.0.0.1 is a reserved address"),  # IPv4-compatible
    ("https://[::ffff:127.0.0.1]/hook", "::ffff:127.0.0.1 is a loopback address"),
    ("https://[::ffff:169.254.169.254]/", "::ffff:169.254.169.254 is a link-local address"),
    ("https://[::ffff:10.0.0.1]/hook", "::ffff:10.0.0.1 is a private address"),
    ("https://[64:ff9b::a9fe:a9fe]/hook", "64:ff9b::a9fe:a9fe is a link-local address"),
    ("https://[2002:a9fe:a9fe::1]/hook", "2002:a9fe:a9fe::1 is a link-local address"),
]
# URLs refused for their form, whatever they point at.
REFUSED_FORMS = [
    ("https://user:pw@hooks.example.com/x", "may not hold a user name or password"),
    ("https://token@hooks.example.com/x", "may not hold a user name or password"),
    ("ftp://hooks.example.com/x", "ftp:// is not a webhook: use https://"),
    ("http://hooks.example.com/x", "http:// is refused: use https://"),
]
PUBLIC = "93.184.215.14"  # an address on the internet (example.com's, once)


def resolving(*addresses: str) -> notifications.Resolver:
    """A resolver that answers ``addresses`` for every name, as DNS would at that moment."""

    def resolve(host: str, port: int) -> list[Address]:
        return [ipaddress.ip_address(a) for a in addresses]

    return resolve


def unresolvable(host: str, port: int) -> Sequence[Address]:
    raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")


@pytest.fixture(autouse=True)
def deployment_defaults(settings: Any) -> None:
    """What a deployment has unless its operator says otherwise: https, public only."""
    settings.LOOPGUARD_NOTIFY_ALLOW_HTTP = False
    settings.LOOPGUARD_NOTIFY_ALLOWED_NETWORKS = []
    settings.LOOPGUARD_NOTIFY_TIMEOUT_SECONDS = 5.0
    settings.LOOPGUARD_NOTIFY_ATTEMPTS = 4


@pytest.fixture
def admin(db: None) -> User:
    return User.objects.create_user("admin-person")


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    """A live receiver on 127.0.0.1: what a refused URL would have reached."""
    with receiving() as found:
        yield found


def add(admin: User, url: str, **options: Any) -> NotificationChannel:
    channel, _ = notifications.channel_add(
        actor=admin,
        reason="the on-call chat",
        name="chat",
        transport="webhook",
        kinds=["needs_human"],
        url=url,
        secret=SECRET,
        **options,
    )
    return channel


def stored(url: str) -> NotificationChannel:
    """A channel written straight to the table, as one saved before these checks was."""
    return NotificationChannel.objects.create(
        name="old", transport="webhook", url=url, secret=SECRET, kinds=["needs_human"]
    )


def first_try(admin: User, channel: NotificationChannel, **options: Any) -> Notice:
    """Queue a test notice to ``channel`` and make its first try."""
    notice = notifications.channel_send_test(actor=admin, reason="check", channel_id=channel.id)
    notifications.deliver(notice.id, **options)
    notice.refresh_from_db()
    return notice


# -- when a channel is saved ------------------------------------------------------------------


@pytest.mark.parametrize(("url", "why"), REFUSED_URLS + REFUSED_FORMS)
def test_a_channel_to_an_address_notices_may_not_reach_is_refused_when_saved(
    admin: User, url: str, why: str
) -> None:
    with pytest.raises(notifications.WebhookRefused, match=re.escape(why)):
        add(admin, url)

    assert NotificationChannel.objects.count() == 0 and AuditEntry.objects.count() == 0


def test_a_name_that_resolves_to_a_private_address_is_refused_when_saved(admin: User) -> None:
    with pytest.raises(
        notifications.WebhookRefused,
        match=re.escape("hooks.corp.test resolves to 10.20.0.5, a private address"),
    ):
        add(admin, "https://hooks.corp.test/x", resolve=resolving("10.20.0.5"))


def test_a_name_with_one_public_and_one_private_address_is_refused(admin: User) -> None:
    with pytest.raises(notifications.WebhookRefused, match=re.escape("resolves to 127.0.0.1")):
        add(admin, "https://hooks.split.test/x", resolve=resolving(PUBLIC, "127.0.0.1"))


def test_a_public_https_url_is_saved(admin: User) -> None:
    channel = add(admin, "https://hooks.example.com/x", resolve=resolving(PUBLIC))

    assert channel.url == "https://hooks.example.com/x" and channel.active


def test_a_name_that_does_not_resolve_yet_is_saved_and_checked_at_delivery(admin: User) -> None:
    channel = add(admin, "https://hooks.not-yet.test/x", resolve=unresolvable)

    notice = first_try(admin, channel, resolve=unresolvable)

    attempt = notice.tries.get()
    assert not attempt.ok and attempt.status_code is None
    assert attempt.error.startswith("cannot resolve hooks.not-yet.test: ")
    assert notice.state == NoticeState.PENDING  # tried again later: DNS may be set up by then


def test_http_is_saved_only_when_the_setting_allows_it(admin: User, settings: Any) -> None:
    with pytest.raises(notifications.WebhookRefused, match="LOOPGUARD_NOTIFY_ALLOW_HTTP"):
        add(admin, "http://hooks.example.com/x", resolve=resolving(PUBLIC))

    settings.LOOPGUARD_NOTIFY_ALLOW_HTTP = True
    assert add(admin, "http://hooks.example.com/x", resolve=resolving(PUBLIC)).active


def test_a_network_the_setting_names_may_be_saved_and_no_other(admin: User, settings: Any) -> None:
    settings.LOOPGUARD_NOTIFY_ALLOWED_NETWORKS = ["10.20.0.0/16", "fd00::/8"]

    assert add(admin, "https://10.20.3.4/hook").active
    assert add(admin, "https://[fd00::7]/hook").active
    assert add(admin, "https://[::ffff:10.20.3.4]/hook").active  # the same address, in IPv6
    with pytest.raises(notifications.WebhookRefused, match=re.escape("10.21.0.1 is a private")):
        add(admin, "https://10.21.0.1/hook")
    with pytest.raises(notifications.WebhookRefused, match=re.escape("169.254.169.254 is")):
        add(admin, "https://169.254.169.254/")


# -- at every delivery ------------------------------------------------------------------------


@pytest.mark.parametrize(("url", "why"), REFUSED_URLS + REFUSED_FORMS)
def test_a_channel_saved_before_the_checks_is_refused_at_delivery_and_the_try_says_why(
    admin: User, url: str, why: str
) -> None:
    notice = first_try(admin, stored(url))

    attempt = notice.tries.get()
    assert (attempt.ok, attempt.status_code) == (False, None)
    assert attempt.error.startswith("refused: ") and why in attempt.error
    # Nothing lost: the notice waits for its next try, as after any failed one.
    assert notice.state == NoticeState.PENDING and notice.attempts == 1


@pytest.mark.parametrize("private", ["127.0.0.1", "10.0.0.7", "169.254.169.254", "::1"])
def test_a_name_public_when_saved_and_private_at_delivery_is_refused_at_delivery(
    admin: User, receiver: Receiver, settings: Any, private: str
) -> None:
    settings.LOOPGUARD_NOTIFY_ALLOW_HTTP = True  # so that only the address decides
    url = f"http://hooks.rebinding.test:{receiver.port}/x"
    channel = add(admin, url, resolve=resolving(PUBLIC))

    # The name's owner changes its DNS after the save, to where the receiver listens.
    notice = first_try(admin, channel, resolve=resolving(private))

    attempt = notice.tries.get()
    assert not attempt.ok
    assert f"refused: hooks.rebinding.test resolves to {private}, a " in attempt.error
    assert receiver.requests == []  # never connected


def test_a_loopback_receiver_is_not_reached_while_the_default_holds(
    admin: User, receiver: Receiver, settings: Any
) -> None:
    settings.LOOPGUARD_NOTIFY_ALLOW_HTTP = True

    notice = first_try(admin, stored(receiver.url))

    assert "127.0.0.1 is a loopback address" in notice.tries.get().error
    assert receiver.requests == []


def test_http_is_sent_only_when_the_setting_allows_it(
    admin: User, receiver: Receiver, settings: Any
) -> None:
    settings.LOOPGUARD_NOTIFY_ALLOWED_NETWORKS = ["127.0.0.1/32"]
    channel = stored(receiver.url)

    refused = first_try(admin, channel)
    settings.LOOPGUARD_NOTIFY_ALLOW_HTTP = True
    sent = first_try(admin, channel)

    assert refused.tries.get().error.startswith("refused: http:// is refused")
    assert sent.state == NoticeState.SENT
    assert len(receiver.requests) == 1


def test_the_connection_goes_to_the_address_checked_with_the_name_as_host(
    admin: User, receiver: Receiver, settings: Any
) -> None:
    settings.LOOPGUARD_NOTIFY_ALLOW_HTTP = True
    settings.LOOPGUARD_NOTIFY_ALLOWED_NETWORKS = ["127.0.0.1/32"]
    looked_up: list[str] = []

    def resolve(host: str, port: int) -> list[Address]:
        looked_up.append(host)
        return [ipaddress.ip_address("127.0.0.1")]

    # A .test name resolves nowhere: were the name looked up again to connect, the try
    # would fail; it reaches the receiver only through the address that was checked.
    channel = stored(f"http://hooks.pinned.test:{receiver.port}/hooks/loopguard?team=ops")
    notice = first_try(admin, channel, resolve=resolve)

    assert notice.state == NoticeState.SENT
    assert looked_up == ["hooks.pinned.test"]  # once, by the check
    got = receiver.requests[0]
    assert got.headers["Host"] == f"hooks.pinned.test:{receiver.port}"
    assert got.path == "/hooks/loopguard?team=ops"
    assert notifications.verify(SECRET, got.body, got.headers["X-LoopGuard-Signature"])


def test_a_redirect_is_not_followed_and_is_a_failed_try(
    admin: User, receiver: Receiver, settings: Any
) -> None:
    settings.LOOPGUARD_NOTIFY_ALLOW_HTTP = True
    settings.LOOPGUARD_NOTIFY_ALLOWED_NETWORKS = ["127.0.0.1/32"]
    with receiving() as elsewhere:
        receiver.answers = [302]
        receiver.location = elsewhere.url

        notice = first_try(admin, stored(receiver.url))

        assert elsewhere.requests == []
    attempt = notice.tries.get()
    assert (attempt.ok, attempt.status_code) == (False, 302)
    assert attempt.error == "answered 302 (a redirect: not followed)"
    assert len(receiver.requests) == 1


def test_the_answers_body_is_never_kept(admin: User, receiver: Receiver, settings: Any) -> None:
    settings.LOOPGUARD_NOTIFY_ALLOW_HTTP = True
    settings.LOOPGUARD_NOTIFY_ALLOWED_NETWORKS = ["127.0.0.1/32"]
    receiver.answers = [500]
    receiver.body = b"redis_version:7.2.4 requirepass internal-secret-4711"

    notice = first_try(admin, stored(receiver.url))

    attempt = notice.tries.get()
    assert (attempt.status_code, attempt.error, attempt.response) == (500, "answered 500", "")
    assert "internal-secret-4711" not in str(
        list(NotificationChannel.objects.values()) + list(notice.tries.values())
    )


def test_an_answer_that_is_not_http_is_told_without_quoting_it(admin: User, settings: Any) -> None:
    settings.LOOPGUARD_NOTIFY_ALLOW_HTTP = True
    settings.LOOPGUARD_NOTIFY_ALLOWED_NETWORKS = ["127.0.0.1/32"]
    with socket.create_server(("127.0.0.1", 0)) as server:
        # What Redis says to a request it does not understand, then it hangs up.
        port = server.getsockname()[1]
        channel = stored(f"http://127.0.0.1:{port}/")
        notice = notifications.channel_send_test(actor=admin, reason="x", channel_id=channel.id)
        server.settimeout(5)

        def banner() -> None:
            conn, _ = server.accept()
            with conn:
                conn.recv(65536)
                conn.sendall(b"-ERR unknown command 'POST', internal-secret-4711\r\n")

        thread = threading.Thread(target=banner)
        thread.start()
        notifications.deliver(notice.id)
        thread.join(timeout=5)

    error = notice.tries.get().error
    assert error == "BadStatusLine: no HTTP answer"
    assert "internal-secret-4711" not in error


# -- https to the address checked ---------------------------------------------------------------


class Authority:
    """A certificate authority of the test's own, trusted by the console for the test
    (``SSL_CERT_FILE``, as an operator trusts a private CA), and certificates it signs."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.key = ec.generate_private_key(ec.SECP256R1())
        self.name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "LoopGuard test CA")])
        ca = (
            _certificate(self.name, self.name, self.key.public_key())
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=False,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(
                x509.SubjectKeyIdentifier.from_public_key(self.key.public_key()), critical=False
            )
            .sign(self.key, hashes.SHA256())
        )
        self.bundle = folder / "ca.pem"
        self.bundle.write_bytes(ca.public_bytes(serialization.Encoding.PEM))

    def server_context(self, host: str, seen: list[str | None]) -> ssl.SSLContext:
        """A server context with a certificate for ``host``, noting each client's SNI."""
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)])
        cert = (
            _certificate(subject, self.name, key.public_key())
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(host)]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()),
                critical=False,
            )
            .sign(self.key, hashes.SHA256())
        )
        pem = self.folder / f"{host}.pem"
        pem.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
            + cert.public_bytes(serialization.Encoding.PEM)
        )
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(pem)

        def note(sock: ssl.SSLObject, name: str | None, context: ssl.SSLContext) -> None:
            seen.append(name)

        context.sni_callback = note  # type: ignore[assignment]
        return context


def _certificate(
    subject: x509.Name, issuer: x509.Name, key: ec.EllipticCurvePublicKey
) -> x509.CertificateBuilder:
    now = dt.datetime.now(dt.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(hours=1))
    )


@pytest.fixture
def authority(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Authority:
    made = Authority(tmp_path)
    monkeypatch.setenv("SSL_CERT_FILE", str(made.bundle))
    return made


def test_https_to_the_address_checked_sends_the_name_for_sni_and_the_certificate(
    admin: User, authority: Authority, settings: Any
) -> None:
    settings.LOOPGUARD_NOTIFY_ALLOWED_NETWORKS = ["127.0.0.1/32"]
    seen: list[str | None] = []
    with receiving(authority.server_context("hooks.pinned.test", seen)) as secure:
        channel = stored(f"https://hooks.pinned.test:{secure.port}/hooks/loopguard")
        notice = first_try(admin, channel, resolve=resolving("127.0.0.1"))

    assert notice.state == NoticeState.SENT, notice.tries.get().error
    assert seen == ["hooks.pinned.test"]
    assert secure.requests[0].headers["Host"] == f"hooks.pinned.test:{secure.port}"


def test_https_to_a_receiver_whose_certificate_names_another_host_fails_its_try(
    admin: User, authority: Authority, settings: Any
) -> None:
    settings.LOOPGUARD_NOTIFY_ALLOWED_NETWORKS = ["127.0.0.1/32"]
    with receiving(authority.server_context("someone-else.test", [])) as secure:
        channel = stored(f"https://hooks.pinned.test:{secure.port}/hooks/loopguard")
        notice = first_try(admin, channel, resolve=resolving("127.0.0.1"))

        assert secure.requests == []
    error = notice.tries.get().error
    assert error.startswith("SSLCertVerificationError: ") and "hostname" in error.lower()


# -- settings ---------------------------------------------------------------------------------

PRINT_TARGETS = (
    "from django.conf import settings\n"
    "print(settings.LOOPGUARD_NOTIFY_ALLOW_HTTP, settings.LOOPGUARD_NOTIFY_ALLOWED_NETWORKS)\n"
)


def test_by_default_webhooks_are_https_to_public_addresses_only() -> None:
    started = run_settings(PRINT_TARGETS)

    assert started.returncode == 0, started.stderr
    assert started.stdout.strip() == "False []"


def test_the_allowed_networks_are_read_from_the_environment() -> None:
    started = run_settings(
        PRINT_TARGETS,
        LOOPGUARD_NOTIFY_ALLOW_HTTP="1",
        LOOPGUARD_NOTIFY_ALLOWED_NETWORKS="10.20.0.0/16, fd00::/8",
    )

    assert started.returncode == 0, started.stderr
    assert started.stdout.strip() == "True ['10.20.0.0/16', 'fd00::/8']"


@pytest.mark.parametrize("network", ["10.20.3.4/16", "internal", "10.0.0.0/33"])
def test_an_allowed_network_that_is_not_one_stops_start_up(network: str) -> None:
    started = run_settings(PRINT_TARGETS, LOOPGUARD_NOTIFY_ALLOWED_NETWORKS=network)

    assert started.returncode != 0
    assert f"LOOPGUARD_NOTIFY_ALLOWED_NETWORKS: {network!r} is not a network" in started.stderr
