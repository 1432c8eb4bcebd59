"""Every endpoint, every role, every kind of bad input: never a server error, nothing changed.

The endpoints come from the URL conf itself (``get_resolver()``, walked through every
``include``), so a new page or API endpoint is covered the day it is routed, without anyone
adding it here. For each route the test fills its path parameters with a real object's id or
key, an unknown one and malformed ones; sends GET and POST (a view that does not answer a
method says so with a 405); as every persona, anonymously and with a bad token; and with the
classes of input an outside probe sends: JSON nested 600 and 50,000 levels deep, NaN and
Infinity, NUL characters, lone surrogates, megabyte strings, values of the wrong type, empty
and broken bodies, dates at the edges of the calendar and odd query strings. The attached
API's bodies are also sent field by field, nested fields included, from the driver of an
attached task at the point of its conversation where each step fits (the last section).

Nothing sent here is valid for an action (a required field is always missing or wrong;
forms and bodies are also sent filled validly but for one field, so that the bad value is
read where valid input would go on to act), so every row the console keeps must be exactly
as it was: the product's tables, the desk's tables and the people's accounts are counted and
the tasks' and operations' states read after every request that could write. The one action
that takes no input, a lookup, may add its own audit entry (``EXPECTED_AUDIT``).

One world of tasks and people is made for the whole module and each route's requests are
rolled back with its test, so the ~2,500 requests take some 25 seconds, not minutes.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from django import forms
from django.apps import apps
from django.conf import settings
from django.contrib.auth.forms import AuthenticationForm
from django.contrib.auth.models import User
from django.core.management import call_command
from django.db import connection, transaction
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver
from django.urls.resolvers import RegexPattern

from console import services
from console.api import openapi
from console.api.tokens import api_token_issue
from console.demo.desk import seed_demo_data
from console.drivers import attached, runner
from console.models import (
    Approval,
    AuditAction,
    AuditEntry,
    NotificationChannel,
    Operation,
    Task,
)
from console.records import inputs
from console.records.roles import Role, assign
from console.web.forms import ApprovalForm, BulkForm, ResolveForm, ResumeForm, StartForm, StopForm
from console.web.notification_views import ChannelForm, ReasonForm

from .views.support import PERSONAS, finish, unknown_operation

pytestmark = pytest.mark.django_db

KEY = "order/42/refund"  # a slash, as real keys have
ATTACHED_TOOLS = {"lookup": "read", "refund": "write"}
# The live lease of an attached task: its driver's credential, which no answer to anyone
# else may show (not in an error, a page, an API field).
LEASE = "walker-host:1:lease-nobody-else-may-see"
ANONYMOUS = "anonymous"
BAD_TOKEN = "bad-token"
MIB = 1024 * 1024


# -- the routes --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Route:
    """One routed URL pattern: its path with ``<converter:name>`` holes, and its name."""

    template: str
    name: str
    api: bool

    def fill(self, values: dict[str, str]) -> str:
        return "/" + re.sub(r"<(?:[^>:]+:)?([^>]+)>", lambda m: values[m.group(1)], self.template)

    @property
    def parameters(self) -> list[str]:
        return re.findall(r"<(?:[^>:]+:)?([^>]+)>", self.template)


def routes() -> list[Route]:
    """Every URL pattern of the console, with the prefixes of the includes above it."""
    found: list[Route] = []

    def walk(patterns: Any, prefix: str, namespace: str) -> None:
        for entry in patterns:
            pattern = str(entry.pattern)
            if isinstance(entry, URLResolver):
                inner = f"{namespace}:{entry.namespace}" if entry.namespace else namespace
                walk(entry.url_patterns, prefix + pattern, inner.strip(":"))
            elif isinstance(entry, URLPattern):
                # A regular expression route (the API's catch-all) is reached through
                # paths that no other route takes.
                template = pattern if not _is_regex(entry) else "<rest>"
                name = entry.name or f"{prefix}<catch-all>"
                found.append(
                    Route(
                        prefix + template,
                        f"{namespace}:{name}".strip(":"),
                        namespace.startswith("api"),
                    )
                )

    walk(get_resolver().url_patterns, "", "")
    return found


def _is_regex(entry: URLPattern) -> bool:
    return isinstance(entry.pattern, RegexPattern)


ROUTES = routes()


# -- the world ---------------------------------------------------------------------------------


@dataclass
class World:
    queued: Task  # may be stopped
    stopped: Task  # may be resumed
    uncertain: Task  # held by an UNKNOWN write
    op: Operation  # the UNKNOWN write
    users: dict[str, User]  # by persona
    secrets: dict[str, str]  # by persona: an API token of theirs
    channel_id: int = 0  # a notification channel (a webhook nobody listens to)
    approval_id: int = 0  # a refund held for a person's approval
    attached_id: int = 0  # an attached task driven by someone who is no persona, by LEASE
    driver_secret: str = ""  # an API token of the person driving it


@pytest.fixture(scope="module")
def world(django_db_setup: None, django_db_blocker: Any) -> Iterator[World]:
    """Tasks in each state an action is meant for, an UNKNOWN write, the desk's records and
    a person per role, made once for the module (and emptied after it, as transactional
    tests empty the database)."""
    with django_db_blocker.unblock(), pytest.MonkeyPatch.context() as patch:
        from console.tasks import run_task

        patch.setattr(run_task, "delay", lambda task_id: None)
        seed_demo_data()
        queued = services.task_start(agent="test_reader", input={"pages": 2})
        stopped = finish(
            services.task_start(agent="test_reader", input={"pages": 3}),
            "CANCELLED",
            "operator_stop",
        )
        uncertain = services.task_start(agent="test_notices", input={"count": 1})
        op = unknown_operation(uncertain, KEY)
        uncertain.refresh_from_db()
        refund = services.task_start(
            agent="support_desk",
            input={"order": 42, "amount_cents": 1500, "reason": "x", "approve_above_cents": 1000},
        )
        assert runner.drive(refund.id) == "NEEDS_HUMAN/approval_required"
        held = Approval.objects.get(task=refund)
        users, secrets = {}, {}
        for name, roles in PERSONAS.items():
            users[name] = user = User.objects.create_user(name, password=f"pw-{name}")
            assign(user, roles)
            secrets[name] = api_token_issue(user=user, name="every-endpoint")[1]
        secrets[BAD_TOKEN] = "lg_not-a-token"
        channel = NotificationChannel.objects.create(
            name="sweep",
            transport="webhook",
            url="http://127.0.0.1:9/hook",
            secret="a-secret-for-the-sweep",
            kinds=["needs_human"],
        )
        driver = User.objects.create_user("driver-elsewhere")
        assign(driver, (Role.AGENT,))
        drove, _ = attached.attached_start(
            actor=driver, request_id="walker", lease=LEASE, agent="walker-bot",
            client="walker/1", tools=ATTACHED_TOOLS, fingerprint="walker",
        )  # fmt: skip
        driver_secret = api_token_issue(user=driver, name="every-endpoint")[1]
        try:
            yield World(
                queued, stopped, uncertain, op, users, secrets, channel.id, held.id,
                attached_id=drove["task"], driver_secret=driver_secret,
            )  # fmt: skip
        finally:
            call_command("flush", interactive=False, verbosity=0)


@dataclass
class Callers:
    """One route's callers: a signed-in browser and an API client per persona."""

    browsers: dict[str, Client]
    tokens: dict[str, Client]


@pytest.fixture
def callers(world: World) -> Callers:
    # Made inside each test's transaction: a session a request ends (signing out) comes
    # back with the rollback, instead of leaving a dead cookie to the routes after it.
    browsers = {ANONYMOUS: Client(raise_request_exception=False)}
    for name, user in world.users.items():
        browsers[name] = Client(raise_request_exception=False)
        browsers[name].force_login(user)
    tokens = {
        name: Client(raise_request_exception=False, headers={"authorization": f"Bearer {secret}"})
        for name, secret in world.secrets.items()
    }
    tokens[ANONYMOUS] = Client(raise_request_exception=False)
    return Callers(browsers, tokens)


@pytest.fixture(autouse=True)
def quiet_request_log() -> Iterator[None]:
    """Thousands of refusals would each log a warning; a server error still logs."""
    logger = logging.getLogger("django.request")
    level = logger.level
    logger.setLevel(logging.ERROR)
    yield
    logger.setLevel(level)


# -- what is sent ------------------------------------------------------------------------------


def brackets(levels: int) -> str:
    return "[" * levels + "]" * levels


def nested_object(levels: int) -> str:
    return '{"a": ' * levels + "1" + "}" * levels


MALFORMED = {
    "nul": "%00",
    "nul-inside": "a%00b",
    "lone-surrogate": "%ED%A0%80",
    "10-KiB": "k" * 10 * 1024,
    "minus-one": "-1",
    "zero": "0",
    "huge-number": "9999999999999999999999",
    "encoded-slash": "a%2F..%2F..%2Fb",
}


def path_values(route: Route, w: World) -> dict[str, dict[str, str]]:
    """Values for each path parameter, by label: real objects, an unknown one, malformed."""
    real = {
        "task_id": {
            "queued": str(w.queued.id),
            "stopped": str(w.stopped.id),
            "uncertain": str(w.uncertain.id),
            "attached": str(w.attached_id),
        },
        "key": {"real": w.op.key},
        "channel_id": {"real": str(w.channel_id)},
        "approval_id": {"pending": str(w.approval_id)},
        "fmt": {"csv": "csv", "json": "json"},
        "rest": {"nothing": "", "unknown-path": "no/such/endpoint"},
    }
    unknown = {
        "task_id": "987654321",
        "key": "no/such/key",
        "channel_id": "987654321",
        "approval_id": "987654321",
        "fmt": "xml",
        "rest": "tasks/x",
    }
    out: dict[str, dict[str, str]] = {}
    for name in route.parameters:
        values = dict(real.get(name, {"any": "x"}))
        values["unknown"] = unknown.get(name, "unknown")
        values.update(MALFORMED)
        out[name] = values
    return out


def primary(route: Route, w: World) -> dict[str, str]:
    """The real object each action is meant for: the one valid input would act on."""
    by_name = {
        "task_id": str(w.stopped.id if "resume" in route.name else w.queued.id),
        "key": w.op.key,
        "channel_id": str(w.channel_id),
        "approval_id": str(w.approval_id),
        "fmt": "csv",
        "rest": "no/such/endpoint",
    }
    return {name: by_name.get(name, "x") for name in route.parameters}


# Query strings, each setting every filter, cursor or page parameter of one kind at once:
# a list reads all its filters and reports each bad one, so one request tries them all.
TEXT_FILTERS = ("q", "agent", "reason", "state", "actor", "action", "task", "since", "until")
NUMBERS = ("page", "after", "before", "task")


def _every(names: tuple[str, ...], value: str) -> str:
    return "&".join(f"{name}={value}" for name in names)


QUERIES = [
    "since=9999-12-31T23:59-14:00&until=0001-01-01T00:00%2B14:00",
    "since=0001-01-01T00:00%2B14:00",
    "until=9999-12-31T23:59-14:00",
    "since=0001-01-01T00:00&until=9999-12-31T23:59",
    "since=2024-02-30T00:00&until=24:00",
    _every(TEXT_FILTERS, "%00"),
    _every(TEXT_FILTERS, "%ED%A0%80"),
    _every(TEXT_FILTERS, "x" * 10 * 1024),
    _every(TEXT_FILTERS, "%5B" * 600),
    "state=%00&state=RUNNING&q=1&q=%00",
    *(
        f"{name}={value}"
        for name in NUMBERS
        for value in ("-1", "9999999999999999999999", "%00", "1e400")
    ),
    "page=0",
    "after=1&before=1",
    "%00=%00&=&&=&",
]
FORM_FIELDS = sorted(
    {
        name
        for form in (StopForm, ResolveForm, ResumeForm, StartForm, ApprovalForm)
        for name in form().fields
    }
    | {"username", "password", "next", "prefix"}
)
JSON_FIELDS = {"input", "limits", "result"}

# What goes into text fields (every field gets it), and what goes into the JSON fields while
# the text fields are left empty (so no form is ever valid: each has a required text field).
TEXT_CLASSES = {
    "nul": "a\x00b",
    "empty": "",
    "spaces": "   ",
}
JSON_CLASSES = {
    "deep-600": brackets(600),
    "deep-600-object": nested_object(600),
    # Deeper than Python's recursion limit: anything that walks it before the bracket scan
    # (json.loads included) fails with a RecursionError.
    "deep-50000": brackets(50_000),
    "deeper-than-kept": '{"a": ' + brackets(21) + "}",
    "nan": '{"x": NaN}',
    "bare-nan": "NaN",
    "infinity": "[Infinity, -Infinity]",
    "beyond-float": "[1e400]",
    "long-integer": "1" * 5000,
    "nul-escape": '{"x": "a\\u0000b"}',
    "lone-surrogate": '{"x": "\\ud800"}',
    "lone-surrogate-key": '{"\\udfff": 1}',
    "list": "[1, 2]",
    "number": "7",
    "string": '"text"',
    "huge": '{"x": "' + "x" * MIB + '"}',
    "broken": '{"a": ',
}


def form_bodies() -> Iterator[tuple[str, dict[str, Any] | str]]:
    """Bodies for the console's forms, by class."""
    for label, text in TEXT_CLASSES.items():
        yield f"text-{label}", {name: text for name in FORM_FIELDS if name != "prefix"}
    huge = "x" * MIB  # one field at a time: a form of sixteen of them is only slower
    for name in ("reason", "evidence", "agent", "username"):
        yield f"huge-{name}", {name: huge, "decision": "maybe"}
    for label, payload in JSON_CLASSES.items():
        fields = {name: "" for name in FORM_FIELDS if name != "prefix"}
        fields.update({name: payload for name in JSON_FIELDS}, decision="maybe")
        yield f"json-{label}", fields
    # Bytes no browser sends: an undecodable sequence where JSON goes; repeated fields.
    raw = "&".join(f"{name}=%ED%A0%80%FF" for name in sorted(JSON_FIELDS))
    yield "raw-undecodable-bytes", raw + "&decision=maybe"
    yield "repeated", "decision=committed&decision=maybe&evidence=&result=%5B" + "%5B" * 600
    yield "wrong-prefix", {"prefix": "a\x00b", "decision": "committed", "evidence": "x"}
    yield "empty", {}


# The form behind each console route that takes a POST (None: it takes no input, so any
# POST is a valid one; see EXPECTED_AUDIT). A POST route missing here fails the sweep.
FORMS: dict[str, type[forms.Form] | None] = {
    "task-new": StartForm,
    "task-stop": StopForm,
    "task-resume": ResumeForm,
    "task-bulk": BulkForm,
    "operation-resolve": ResolveForm,
    "approval-answer": ApprovalForm,
    "login": AuthenticationForm,
    "operation-lookup": None,
    "logout": None,
    "notification-add": ChannelForm,
    "notification-test": ReasonForm,
    "notification-remove": ReasonForm,
}
TEXT_BAD = {"nul": "a\x00b", "huge": "x" * MIB, "empty": ""}
JSON_BAD = {  # bad whatever the field: not a value, too deep, or not storable
    label: JSON_CLASSES[label]
    for label in (
        "deep-600",
        "deep-600-object",
        "deep-50000",
        "deeper-than-kept",
        "nan",
        "bare-nan",
        "infinity",
        "beyond-float",
        "long-integer",
        "nul-escape",
        "lone-surrogate",
        "lone-surrogate-key",
        "broken",
    )
}
NUMBER_BAD = {
    "nan": "NaN",
    "beyond-float": "1e400",
    "negative": "-1",
    "fraction": "1.5",
    "nul": "1\x00",
}
CHOICE_BAD = {"unknown": "maybe", "nul": "committed\x00"}


def one_bad_field(form_class: type[forms.Form], agent: str) -> Iterator[tuple[str, dict[str, str]]]:
    """The form filled validly but for one field, in turn each field with each value bad
    for its kind: the bad value is read in the very place valid input would go on to act."""
    form = form_class() if form_class is not AuthenticationForm else form_class(None)
    valid: dict[str, str] = {}
    kinds: dict[str, dict[str, str]] = {}
    for name, field in form.fields.items():
        if isinstance(field, forms.ChoiceField):
            choices = [str(value) for value, _ in field.choices if value]
            valid[name] = agent if agent in choices else choices[0]
            kinds[name] = CHOICE_BAD
        elif isinstance(field, forms.IntegerField):
            valid[name] = ""
            kinds[name] = NUMBER_BAD
        elif hasattr(form, f"clean_{name}"):  # JSON text, read by the form's own cleaner
            valid[name] = "{}" if field.required else ""
            kinds[name] = {**JSON_BAD, "huge": '{"x": "' + "x" * MIB + '"}'}
        else:
            valid[name] = "sweep"
            # Left empty, an optional text field is valid input, not a bad value.
            kinds[name] = (
                TEXT_BAD
                if field.required
                else {label: value for label, value in TEXT_BAD.items() if value}
            )
    for name, bad in kinds.items():
        for label, value in bad.items():
            yield f"{name}={label}", {**valid, name: value}


# Values for one API body field at a time, as JSON text (NaN and 600 brackets are not values
# json.dumps would write).
API_VALUES = {
    "deep-600": brackets(600),
    "deep-600-object": nested_object(600),
    "deep-50000": brackets(50_000),
    "deeper-than-kept": '{"a": ' + brackets(21) + "}",
    "nan": "NaN",
    "infinity": "Infinity",
    "minus-infinity": "-Infinity",
    "beyond-float": "1e400",
    "long-integer": "1" * 5000,
    "nul": '"a\\u0000b"',
    "nul-in-object": '{"x": "a\\u0000b"}',
    "lone-surrogate": '"\\ud800"',
    "lone-surrogate-key": '{"\\udfff": 1}',
    "huge": '"' + "x" * MIB + '"',
    "list": "[1, 2]",
    "number": "7",
    "object": '{"a": 1}',
    "empty-string": '""',
    "null": "null",
    "true": "true",
}
# Bad in any field whatever its type (the others are wrong for some fields, right for some).
UNIVERSALLY_BAD = (
    "deep-600",
    "deep-600-object",
    "deep-50000",
    "deeper-than-kept",
    "nan",
    "infinity",
    "minus-infinity",
    "beyond-float",
    "long-integer",
    "nul",
    "nul-in-object",
    "lone-surrogate",
    "lone-surrogate-key",
    "huge",
)
VALID_API_VALUES: dict[str, Any] = {"agent": "test_reader", "input": {"pages": 1}}


def _valid_for(schema: dict[str, Any]) -> Any:
    kinds = schema.get("type")
    kind = kinds[0] if isinstance(kinds, list) else kinds
    return {"string": "sweep", "object": {}, "boolean": True}.get(kind)


WHOLE_BODIES: dict[str, bytes] = {
    "empty": b"",
    "whitespace": b"  \n ",
    "list": b"[]",
    "number": b"7",
    "string": b'"reason"',
    "null": b"null",
    "deep-600": brackets(600).encode(),
    "nan": b'{"reason": NaN}',
    "undecodable": b'{"reason": "\xff\xfe"}',
    "utf-16": '{"reason": "x"}'.encode("utf-16"),
    "bom": b'\xef\xbb\xbf{"reason": "x"}',
    "broken": b'{"reason": ',
    "unknown-field": b'{"reasn": "x"}',
    "over-1-MiB": b'{"reason": "' + b"x" * MIB + b'"}',
}


def api_bodies(route: Route, method: str) -> Iterator[tuple[str, bytes, dict[str, str]]]:
    """Bodies for an API endpoint, by class: each declared field in turn holding each bad
    value (the endpoint's flags set, so that the fields after them are read too), then
    bodies that are bad as a whole; with extra request headers."""
    entry = openapi.ENTRIES.get((route.name.removeprefix("api:"), method))
    fields = entry.body.fields if entry is not None and entry.body is not None else ()
    flags = {f.name: "true" for f in fields if f.schema.get("type") == "boolean"}
    for field in fields:
        for label, value in API_VALUES.items():
            members = {**flags, field.name: value}
            text = "{" + ", ".join(f"{json.dumps(k)}: {v}" for k, v in members.items()) + "}"
            yield f"{field.name}={label}", text.encode(), {}
    # The body valid but for one field, which holds a value bad for any field.
    valid = {f.name: VALID_API_VALUES.get(f.name, _valid_for(f.schema)) for f in fields}
    for field in fields:
        for label in UNIVERSALLY_BAD:
            members = {k: json.dumps(v) for k, v in valid.items()}
            members[field.name] = API_VALUES[label]
            text = "{" + ", ".join(f"{json.dumps(k)}: {v}" for k, v in members.items()) + "}"
            yield f"valid-but-{field.name}={label}", text.encode(), {}
    for label, raw in WHOLE_BODIES.items():
        yield f"body-{label}", raw, {}
    yield "content-length-not-a-number", b"{}", {"CONTENT_LENGTH": "many"}
    yield "content-length-negative", b"{}", {"CONTENT_LENGTH": "-5"}
    yield "content-length-over-1-MiB", b"{}", {"CONTENT_LENGTH": str(2 * MIB)}


# -- what must hold ----------------------------------------------------------------------------

COUNTED = [
    model
    for label in ("console", "desk", "auth")
    for model in apps.get_app_config(label).get_models()
]


# Actions that take no input at all, so that any request is a valid one, and what each is
# meant to change: a lookup asks the business system and audits that it did (the operation
# stays as it is); signing out ends a session, which is not counted.
EXPECTED_AUDIT = {"operation-lookup": AuditAction.LOOKUP}


# Where each task and operation stands, in one row each: what an action would move.
STANDING = {
    Task: "id, state, reason, phase, stop_requested_at, limits",
    Operation: "key, state, evidence, result",
    Approval: "id, state, decided_at, reason, on_reject",
}


def snapshot(route: Route | None = None) -> dict[str, Any]:
    """Every row count of the product, the desk and the accounts, and where each task and
    operation stands: what any action would change (but what ``route`` is meant to). One
    query, as it runs after every request that could write."""
    expected = EXPECTED_AUDIT.get(route.name) if route is not None else None
    # Table and column names come from the models, the action from AuditAction.
    parts = []
    for model in COUNTED:
        where = f" WHERE action <> '{expected}'" if model is AuditEntry and expected else ""
        parts.append(f'(SELECT count(*) FROM "{model._meta.db_table}"{where})')  # noqa: S608
    for model, columns in STANDING.items():
        parts.append(
            f"(SELECT string_agg(md5(ROW({columns})::text), ',' ORDER BY id) "  # noqa: S608
            f'FROM "{model._meta.db_table}")'
        )
    with connection.cursor() as cursor:
        cursor.execute("SELECT " + ", ".join(parts))
        row = cursor.fetchone()
    names = [m.__name__ for m in COUNTED] + [f"{m.__name__} states" for m in STANDING]
    return dict(zip(names, row, strict=True))


@dataclass
class Sender:
    """Sends requests for one route and keeps what went wrong."""

    world: World
    callers: Callers
    route: Route
    failures: list[str]
    sent: int = 0

    def client(self, who: str) -> Client:
        return (self.callers.tokens if self.route.api else self.callers.browsers)[who]

    def send(
        self,
        who: str,
        method: str,
        path: str,
        *,
        label: str,
        query: str = "",
        body: bytes | str | dict[str, Any] | None = None,
        content_type: str = "",
        extra: dict[str, str] | None = None,
        check_state: bool = False,
    ) -> None:
        client = self.client(who)
        url = f"{path}?{query}" if query else path
        before = snapshot(self.route) if check_state else None
        content = b""
        try:
            if method == "GET":
                response = client.get(url)
            elif isinstance(body, dict):
                response = client.post(url, body, **(extra or {}))
            else:
                response = client.generic(
                    "POST",
                    url,
                    body or b"",
                    content_type=content_type or "application/x-www-form-urlencoded",
                    **(extra or {}),
                )
            if getattr(response, "streaming", False):
                content = b"".join(response.streaming_content)  # an export fails while it streams
            else:
                content = response.content
            status = response.status_code
        except Exception as exc:  # a failure while streaming is a server error too
            status = 599
            label = f"{label} ({type(exc).__name__}: {str(exc)[:200]})"
        self.sent += 1
        shown = f"{method} {url[:160]} as {who} [{label}]"
        if status >= 500:
            self.failures.append(f"{status} {shown}")
        if LEASE.encode() in content or (status != 599 and LEASE in str(response.headers)):
            self.failures.append(f"the attached task's lease shown: {shown}")
        if before is not None and snapshot(self.route) != before:
            self.failures.append(f"state changed: {shown}")
        cookie = client.cookies.get(settings.SESSION_COOKIE_NAME)
        if not self.route.api and who in self.world.users and not (cookie and cookie.value):
            client.force_login(self.world.users[who])  # signed out: sign in again


# -- the test ----------------------------------------------------------------------------------

PEOPLE = [*PERSONAS, ANONYMOUS]


# Server errors found by this sweep in files its author does not own, each to be mended by
# their owner (then the strict xfail fails, and its line goes).
KNOWN: dict[str, str] = {}


def _swept(route: Route) -> Any:
    reason = KNOWN.get(route.name)
    marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
    return pytest.param(route, marks=marks, id=f"{route.name}:/{route.template}")


@pytest.mark.parametrize("route", [_swept(route) for route in ROUTES])
def test_no_input_to_any_endpoint_is_a_server_error_or_changes_anything(
    world: World, callers: Callers, route: Route
) -> None:
    sender = Sender(world, callers, route, [])
    start = snapshot(route)
    fill = primary(route, world)
    target = route.fill(fill)

    # Every path value, both methods, as someone holding every role (the roles in turn
    # come below, at the real object).
    params = path_values(route, world)
    combos: list[dict[str, str]] = (
        [{}]
        if not params
        else [{**fill, name: value} for name, values in params.items() for value in values.values()]
    )
    for values in combos:
        path = route.fill(values)
        sender.send("admin", "GET", path, label="path")
        sender.send("admin", "POST", path, label="path, empty body", check_state=True)

    # Every input class at the real object, as someone holding every role.
    for query in QUERIES:
        sender.send("admin", "GET", target, query=query, label="query")
    if route.api:
        for label, raw, extra in api_bodies(route, "POST"):
            sender.send(
                "admin",
                "POST",
                target,
                label=label,
                body=raw,
                content_type="application/json",
                extra=extra,
                check_state=True,
            )
        sender.send(
            "admin",
            "POST",
            target,
            label="form-encoded to the API",
            body={"reason": "x"},
            check_state=True,
        )
    else:
        for label, form in form_bodies():
            sender.send("admin", "POST", target, label=label, body=form, check_state=True)
        form_class = FORMS.get(route.name)
        if form_class is not None:
            for label, form in one_bad_field(form_class, "test_reader"):
                sender.send("admin", "POST", target, label=label, body=form, check_state=True)
        elif route.name not in FORMS and _takes_posts(callers, target):
            sender.failures.append(
                f"POST {route.name} takes a form this test does not know: add it to FORMS"
            )
        sender.send(
            "admin",
            "POST",
            target,
            label="json to a form",
            body=b'{"reason": "x"}',
            content_type="application/json",
            check_state=True,
        )

    # Every role (and for the API a bad token, and a session where a token belongs).
    nasty_body = f'{{"reason": "a\\u0000b", "input": {brackets(600)}}}'
    for who in [*PEOPLE, *([BAD_TOKEN] if route.api else [])]:
        sender.send(who, "GET", target, query=QUERIES[0], label="role")
        if route.api:
            sender.send(
                who,
                "POST",
                target,
                label="role",
                body=nasty_body.encode(),
                content_type="application/json",
                check_state=True,
            )
        else:
            form = {name: "a\x00b" for name in FORM_FIELDS if name != "prefix"}
            sender.send(who, "POST", target, label="role", body=form, check_state=True)
    if route.api:
        browser = callers.browsers["admin"]
        for method in ("GET", "POST"):
            response = browser.generic(method, target, b"{}", content_type="application/json")
            if response.status_code >= 500:
                sender.failures.append(f"{response.status_code} {method} {target} by session")

    assert sender.failures == []
    assert snapshot(route) == start
    assert sender.sent > 50  # the sweep ran: a route with no requests would prove nothing


def _takes_posts(callers: Callers, path: str) -> bool:
    return callers.browsers["admin"].post(path).status_code != 405


def test_every_routed_endpoint_is_swept() -> None:
    # The walk must find the API's routes under their include, and the console's own.
    names = {route.name for route in ROUTES}

    assert {"tasks", "task-stop", "operation-lookup", "audit-export", "login"} <= names
    assert {"api:tasks", "api:task-resume", "api:operation-resolve", "api:openapi"} <= names
    assert any(route.api and "<rest>" in route.template for route in ROUTES)


# -- the attached API, field by field ----------------------------------------------------------
#
# The sweep above sends each top-level field of a body a bad value, but an attached step
# reaches its driver only from the task's own person, at a point of the conversation where
# the step fits, and most of what it carries is nested (a call's tool, its arguments, a
# result's data). So here each body is valid and would act, from the task's driver at the
# point it fits, but for exactly one field, at any depth, holding one bad value of its
# kind; and the valid body is then sent to prove it would have acted.

DRIVER = "walker-host:1:lease-nobody-else-may-see"
assert DRIVER == LEASE  # the world's attached task is driven by this lease
WRITE = {
    "tool": "refund",
    "args": {"order": 42, "note": "x"},
    "effect": "write",
    "operation_key": "walker/42/refund",
}
SETUP_STEPS: dict[str, dict[str, Any]] = {
    "model": {"step": "model"},
    "tools": {"step": "tools", "calls": [WRITE]},
    "call": {"step": "call", "ticket": 0},
}
# Each case: the steps that bring the world's attached task to where the step fits, and
# the step's own fields (the common ones are added).
STEP_CASES: dict[str, tuple[tuple[str, ...], dict[str, Any]]] = {
    "model": ((), {"step": "model", "reserve": 0, "usage": {"tokens": 1}}),
    "tools": (
        ("model",),
        {"step": "tools", "calls": [WRITE], "enter": False, "usage": {"tokens": 1}},
    ),
    "tools-entered": (("model",), {"step": "tools", "calls": [WRITE], "enter": True}),
    "call": (("model", "tools"), {"step": "call", "ticket": 0}),
    "result": (
        ("model", "tools", "call"),
        {
            "step": "result",
            "ticket": 0,
            "result": {"kind": "SUCCESS", "data": {"refund": "R-1"}, "attempts": 1},
            "evidence": {"revision": 1, "done": False, "committed": True},
            "then": "model",
            "reserve": 0,
        },
    ),
    "result-pending": (
        ("model", "tools", "call"),
        {"step": "result", "ticket": 0, "result": {"kind": "PENDING", "wait_ms": 1000}},
    ),
    "result-error": (
        ("model", "tools", "call"),
        {
            "step": "result",
            "ticket": 0,
            "error": {"type": "TimeoutError", "message": "timed out", "transient": True},
        },
    ),
    "finish": (
        ("model",),
        {
            "step": "finish",
            "answer": {"text": "refunded", "refund": "R-1"},
            "evidence": {"revision": 1, "done": True, "committed": None},
        },
    ),
    "finish-inspector-failed": (
        ("model",),
        {"step": "finish", "answer": "done", "evidence": {"error": "the inspector timed out"}},
    ),
    "failed": (("model",), {"step": "failed", "error": "the model answered 503"}),
    "halt": (
        (),
        {"step": "halt", "state": "FAILED", "reason": "executor_error", "detail": "shut down"},
    ),
}
ATTACH = {
    "protocol": 1,
    "request_id": "walker-start-again",
    "lease": "walker-host:2:another",
    "agent": "walker-bot",
    "client": "walker/1",
    "tools": ATTACHED_TOOLS,
    "input": {"order": 42, "note": "x"},
    "limits": {"model_calls": 8},
    "reason": "a sweep",
}

# Where any JSON value is taken (within the bounds of the whole), at any depth below: a
# member there has no type of its own to get wrong; and the objects of any members.
Path = tuple[str | int, ...]
FREE: set[Path] = {("answer",), ("result", "data")}
FREE_OBJECTS: set[Path] = {("input",), ("calls", 0, "args")}
# A result that is not one (its kind unknown, say) is the guard's to stop (bad_result): a
# verdict the protocol documents, not a malformed request. Only its bounds are the door's.
VERDICTS: set[Path] = {("result",), ("result", "kind")}
MILLISECONDS = {"wait_ms"}  # a number, whole or not
CHOICES = {"step", "effect", "then", "state", "kind"}
# The longest each text field may be (docs/protocol.md): one character more is refused.
LONGEST = {
    "request_id": inputs.MAX_REQUEST_ID_CHARS,
    "lease": inputs.MAX_LEASE_CHARS,
    "agent": inputs.MAX_AGENT_CHARS,
    "client": inputs.MAX_NAME_CHARS,
    "tool": inputs.MAX_NAME_CHARS,
    "type": inputs.MAX_NAME_CHARS,
    "operation_key": inputs.MAX_KEY_CHARS,
    "reason": inputs.MAX_TEXT_CHARS,
    "detail": inputs.MAX_TEXT_CHARS,
    "message": inputs.MAX_TEXT_CHARS,
    "error": inputs.MAX_TEXT_CHARS,
}
LARGEST = max(inputs.MAX_RESULT_BYTES, inputs.MAX_ANSWER_BYTES, inputs.MAX_INPUT_BYTES)
TWO_TO_THE_64 = str(2**64)
# Bad in any field: beyond every bound (longer than any text, larger than any value, deeper
# than any kept value, than a body, than Python's recursion), or not storable at all.
ANY_FIELD_BAD = {
    "longer-than-any-bound": json.dumps("x" * (LARGEST + 1)),
    "nested-deeper-than-kept": nested_object(inputs.KEPT_DEPTH + 5),
    "nested-50000-deep": brackets(50_000),
    "array-larger-than-any-bound": "[" + ", ".join(["0"] * (LARGEST // 2)) + "]",
    "nul": '"a\\u0000b"',
    "lone-surrogate": '"\\ud800"',
    "lone-surrogate-key": '{"\\udfff": 1}',
    "nan": "NaN",
}
BAD_BY_KIND = {
    "text": {"number": "7", "true": "true", "list": "[]", "object": "{}"},
    "int": {
        "string": '"1"',
        "float": "1.0",
        "fraction": "1.5",
        "true": "true",
        "2**64": TWO_TO_THE_64,
        "list": "[1]",
    },
    "number": {"string": '"1"', "true": "true", "2**64": TWO_TO_THE_64, "negative": "-1"},
    "bool": {"string": '"true"', "number": "1", "list": "[]"},
    "object": {"string": '"x"', "number": "7", "list": "[]"},
    "list": {
        "string": '"x"',
        "object": "{}",
        "empty": "[]",
        "too-many": json.dumps([WRITE] * (attached.MAX_CALLS + 1)),
    },
}


def _kind(path: tuple[str | int, ...], value: Any) -> str:
    below = FREE | FREE_OBJECTS
    if (
        path in FREE
        or path in VERDICTS
        or any(path[: len(free)] == free and len(path) > len(free) for free in below)
    ):
        return "free"
    if path in FREE_OBJECTS:
        return "free-object"
    if path[-1] in CHOICES:
        return "choice"
    if path[-1] in MILLISECONDS:
        return "number"
    if isinstance(value, bool) or value is None:
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, str):
        return "text"
    return "list" if isinstance(value, list) else "object"


def bad_values(path: tuple[str | int, ...], value: Any) -> dict[str, str]:
    """The values bad for the field at ``path``, whose valid value is ``value``."""
    kind = _kind(path, value)
    bad = dict(ANY_FIELD_BAD)
    if kind == "free-object":
        bad.update(BAD_BY_KIND["object"])
    elif kind == "choice":
        bad.update(BAD_BY_KIND["text"], unknown='"maybe"')
    elif kind == "text":
        bad.update(BAD_BY_KIND["text"])
        longest = LONGEST.get(str(path[-1]))
        if longest is not None:
            bad["one-character-too-long"] = json.dumps("x" * (longest + 1))
    elif kind != "free":
        bad.update(BAD_BY_KIND[kind])
    if path[0] == "limits":
        # A budget has no bound beyond Limits' own: 2**64 model calls is merely unlimited.
        bad.pop("2**64", None)
    if path == ("protocol",):
        bad["float"] = "1.0"  # 1.0 == 1 in Python, yet not the integer the protocol names
    if path == ("tools",):
        bad["name-too-long"] = json.dumps({"t" * (inputs.MAX_NAME_CHARS + 1): "read"})
        bad["wrong-effect"] = '{"lookup": "delete"}'
    return bad


def _paths(value: Any, path: tuple[str | int, ...] = ()) -> Iterator[tuple[tuple[Any, ...], Any]]:
    if path:
        yield path, value
    if isinstance(value, dict):
        for key, child in value.items():
            yield from _paths(child, (*path, key))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            yield from _paths(child, (*path, index))


def _with(value: Any, path: tuple[Any, ...], text: str) -> Any:
    """``value`` as JSON text with the member at ``path`` replaced by the JSON ``text``."""
    if not path:
        return text
    head, rest = path[0], path[1:]
    if isinstance(value, dict):
        members = [
            f"{json.dumps(k)}: {_with(v, rest, text) if k == head else json.dumps(v)}"
            for k, v in value.items()
        ]
        return "{" + ", ".join(members) + "}"
    items = [_with(v, rest, text) if i == head else json.dumps(v) for i, v in enumerate(value)]
    return "[" + ", ".join(items) + "]"


def one_field_bad(valid: dict[str, Any]) -> Iterator[tuple[str, bytes]]:
    """``valid`` with exactly one of its members, at any depth, holding one bad value."""
    for path, value in _paths(valid):
        where = ".".join(str(part) for part in path)
        for label, text in bad_values(path, value).items():
            yield f"{where}={label}", _with(valid, path, text).encode()


def _standing(task_id: int) -> str:
    """The attached task's whole row: a step that acted moves its lease, checkpoint or
    counters even where the sweep's snapshot would not see it."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT md5(t::text) FROM console_task t WHERE id = %s", [task_id])
        row = cursor.fetchone()
    return str(row[0])


ATTACHED_CASES = ["start", *STEP_CASES]


@pytest.mark.parametrize("case", ATTACHED_CASES)
def test_no_field_of_an_attached_body_is_a_server_error_or_changes_anything(
    world: World, callers: Callers, case: str
) -> None:
    task_id = world.attached_id
    driver = Client(
        raise_request_exception=False, headers={"authorization": f"Bearer {world.driver_secret}"}
    )
    if case == "start":
        path, valid = "/api/attached", dict(ATTACH)
    else:
        path = f"/api/attached/{task_id}/steps"
        before, fields = STEP_CASES[case]
        for number, step in enumerate(before):
            body = {"protocol": 1, "request_id": f"setup-{number}", "lease": DRIVER}
            response = driver.post(path, body | SETUP_STEPS[step], content_type="application/json")
            assert response.status_code == 200 and response.json()["stop"] is None, response.content
        valid = {"protocol": 1, "request_id": f"walker-{case}", "lease": DRIVER, **fields}
    route = next(
        route
        for route in ROUTES
        if set(route.parameters) <= {"task_id"} and route.fill({"task_id": str(task_id)}) == path
    )
    sender = Sender(world, callers, route, [])
    sender.callers.tokens["driver"] = driver
    start, standing = snapshot(route), _standing(task_id)
    for label, raw in one_field_bad(valid):
        # Each in a savepoint rolled back after it: a body that acted (a failure) would
        # otherwise hide every later one (the same request id, answered as reused).
        with transaction.atomic():
            sender.send(
                "driver", "POST", path, label=label, body=raw, content_type="application/json",
                check_state=True,
            )  # fmt: skip
            if _standing(task_id) != standing:
                sender.failures.append(f"the attached task moved: POST {path} [{label}]")
            transaction.set_rollback(True)

    assert sender.failures == [], "\n".join(sender.failures)
    assert snapshot(route) == start
    # The body the bad ones were made from acts: each of them was refused for its one field.
    response = driver.post(path, valid, content_type="application/json")
    assert response.status_code in (200, 201), response.content
    assert snapshot(route) != start or _standing(task_id) != standing
