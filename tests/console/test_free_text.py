"""What people type (reasons, evidence) and what they commit as a result is stored as it will
be read: text PostgreSQL can hold, JSON the agent is handed unaltered, secrets masked.

The services refuse a NUL or a lone surrogate (``InvalidInput``: a 400 in the API and the
form, and nothing changes), refuse a committed result that could only be stored altered, and
mask secret-looking spans in every reason and every piece of evidence before they are stored,
so neither the audit log, its exports, the stop report nor the task page ever shows them.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from console import services
from console.agents import Agent, Tool
from console.api.tokens import api_token_issue
from console.drivers import runner
from console.models import (
    AuditEntry,
    Operation,
    OperationEvent,
    OperationState,
    Phase,
    StopReport,
    Task,
    TaskState,
)
from console.records.redaction import MAX_DEPTH, REDACTED, redact_text
from console.records.roles import Role, assign
from guard import Call, Evidence, Finish, Kind, Result
from tests.console.api.helpers import bearer, nested, unknown_operation
from tests.console.views.support import streamed

pytestmark = pytest.mark.django_db

Start = Callable[..., Task]

NUL = "before\x00after"
SURROGATE = "before\ud800after"
SECRET_REASON = (
    "customer asked; password=hunter2, Authorization: Bearer sk-live-abcdefghijklmnop "
    "and ghp_abcdefghijklmnopqrstuvwxyz"
)
SECRETS = ("hunter2", "sk-live-abcdefghijklmnop", "ghp_abcdefghijklmnopqrstuvwxyz")


def person(username: str, *roles: Role) -> User:
    user = User.objects.create_user(username)
    assign(user, roles)
    return user


def api(user: User) -> Client:
    _, secret = api_token_issue(user=user, name="tests")
    return bearer(secret)


def post_json(client: Client, url: str, body: Mapping[str, Any]) -> Any:
    # json.dumps writes a lone surrogate as the escape "\ud800", as any JSON client may.
    return client.post(url, data=json.dumps(body), content_type="application/json")


def shows_a_secret(text: str) -> bool:
    return any(secret in text for secret in SECRETS)


def stopped_task(start: Start, by: User) -> Task:
    task = start("test_reader", {"pages": 1})
    return services.task_stop(task_id=task.id, actor=by, reason="paused for the test")


# -- text that cannot be stored ----------------------------------------------------------------


@pytest.mark.parametrize("text", [NUL, SURROGATE], ids=["nul", "lone-surrogate"])
@pytest.mark.parametrize("action", ["stop", "resume", "committed", "not_committed", "start"])
def test_a_reason_or_evidence_that_cannot_be_stored_is_refused_and_nothing_changes(
    start: Start, text: str, action: str
) -> None:
    admin = person("ada", Role.ADMIN)
    queued = start("test_reader", {"pages": 1})
    stopped = stopped_task(start, admin)
    op = unknown_operation(start("test_notices", {}))
    audited = AuditEntry.objects.count()
    calls: dict[str, Callable[[], object]] = {
        "stop": lambda: services.task_stop(task_id=queued.id, actor=admin, reason=text),
        "resume": lambda: services.task_approve_resumption(
            task_id=stopped.id, actor=admin, reason=text, enqueue=lambda task_id: None
        ),
        "committed": lambda: services.operation_mark_committed(
            key=op.key, actor=admin, evidence=text, result={"notice": 1}
        ),
        "not_committed": lambda: services.operation_mark_not_committed(
            key=op.key, actor=admin, evidence=text
        ),
        "start": lambda: services.task_start(
            agent="test_reader",
            input={"pages": 9},
            actor=admin,
            reason=text,
            enqueue=lambda task_id: None,
        ),
    }

    with pytest.raises(services.InvalidInput, match="cannot be stored"):
        calls[action]()

    assert Task.objects.get(id=queued.id).state == TaskState.QUEUED
    assert Task.objects.get(id=stopped.id).state == TaskState.CANCELLED
    assert Operation.objects.get(id=op.id).state == OperationState.UNKNOWN
    assert not Task.objects.filter(input={"pages": 9}).exists()
    assert AuditEntry.objects.count() == audited


@pytest.mark.parametrize("text", [NUL, SURROGATE], ids=["nul", "lone-surrogate"])
def test_the_api_answers_such_a_reason_with_a_400_and_leaves_the_task_alone(
    start: Start, text: str
) -> None:
    task = start("test_reader", {"pages": 1})

    response = post_json(
        api(person("olga", Role.OPERATOR)), f"/api/tasks/{task.id}/stop", {"reason": text}
    )

    assert response.status_code == 400, response.content
    assert response.json()["code"].startswith("invalid")
    task.refresh_from_db()
    assert (task.state, task.stop_requested_at) == (TaskState.QUEUED, None)
    assert not AuditEntry.objects.filter(action="stop").exists()


def test_the_api_answers_such_evidence_with_a_400_and_leaves_the_operation_alone(
    start: Start,
) -> None:
    op = unknown_operation(start("test_notices", {}))

    response = post_json(
        api(person("rita", Role.RECONCILER)),
        f"/api/operations/{op.key}/resolve",
        {"committed": False, "evidence": SURROGATE},
    )

    assert response.status_code == 400, response.content
    assert Operation.objects.get(id=op.id).state == OperationState.UNKNOWN
    assert not OperationEvent.objects.filter(operation=op, actor__isnull=False).exists()


def test_an_operation_key_holding_a_nul_is_unknown_rather_than_an_error(start: Start) -> None:
    rita = person("rita", Role.RECONCILER)

    with pytest.raises(services.NotFound):
        services.operation_mark_not_committed(key="a\x00b", actor=rita, evidence="checked")
    with pytest.raises(services.NotFound):
        services.operation_look_up(key="a\x00b", actor=rita)


# -- committed results -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("result", "message"),
    [
        ({"amount": float("nan")}, "not a JSON number"),
        ({"amount": float("inf")}, "not a JSON number"),
        ([float("-inf")], "not a JSON number"),
        ({"note": NUL}, "NUL"),
        ({"no\x00te": 1}, "NUL"),
        ({"note": SURROGATE}, "lone surrogate"),
        ({"no\udfffte": 1}, "lone surrogate"),
        (nested(MAX_DEPTH + 1), f"deeper than {MAX_DEPTH}"),
        (nested(10_000), f"deeper than {MAX_DEPTH}"),
        ({"when": object()}, "not JSON"),
    ],
    ids=[
        "nan",
        "infinity",
        "minus-infinity",
        "nul-in-text",
        "nul-in-key",
        "surrogate-in-text",
        "surrogate-in-key",
        "one-level-too-deep",
        "ten-thousand-deep",
        "not-json",
    ],
)
def test_a_committed_result_that_cannot_be_stored_as_given_is_refused(
    start: Start, result: Any, message: str
) -> None:
    op = unknown_operation(start("test_notices", {}))

    with pytest.raises(services.InvalidInput, match=message):
        services.operation_mark_committed(
            key=op.key, actor=person("rita", Role.RECONCILER), evidence="seen", result=result
        )

    op.refresh_from_db()
    assert (op.state, op.result) == (OperationState.UNKNOWN, None)
    assert not AuditEntry.objects.filter(action="mark_committed").exists()


def test_a_committed_result_as_deep_as_redaction_walks_is_stored_whole(start: Start) -> None:
    op = unknown_operation(start("test_notices", {}))
    result = {"receipt": nested(MAX_DEPTH - 1)}

    services.operation_mark_committed(
        key=op.key, actor=person("rita", Role.RECONCILER), evidence="seen", result=result
    )

    op.refresh_from_db()
    assert op.state == OperationState.COMMITTED
    assert op.result is not None
    assert op.result["data"] == result  # not cut: the agent is handed exactly this


def test_the_api_refuses_a_result_nested_too_deep_with_a_400(start: Start) -> None:
    op = unknown_operation(start("test_notices", {}))

    response = post_json(
        api(person("rita", Role.RECONCILER)),
        f"/api/operations/{op.key}/resolve",
        {"committed": True, "evidence": "seen", "result": nested(MAX_DEPTH + 1)},
    )

    assert response.status_code == 400, response.content
    assert str(MAX_DEPTH) in response.json()["error"]
    assert Operation.objects.get(id=op.id).state == OperationState.UNKNOWN


def test_a_task_input_nested_ten_thousand_deep_is_refused_not_a_recursion_error() -> None:
    with pytest.raises(services.InvalidInput, match=f"deeper than {MAX_DEPTH}"):
        services.task_start(
            agent="test_reader", input={"pages": nested(10_000)}, enqueue=lambda task_id: None
        )
    assert not Task.objects.exists()


# -- secrets in what people type ---------------------------------------------------------------


def test_a_secret_typed_into_a_stop_reason_through_the_api_is_never_stored_or_shown(
    start: Start,
) -> None:
    task = start("test_reader", {"pages": 1})
    operator = person("olga", Role.OPERATOR)

    response = post_json(api(operator), f"/api/tasks/{task.id}/stop", {"reason": SECRET_REASON})

    assert response.status_code == 200, response.content
    task.refresh_from_db()
    entry = AuditEntry.objects.get(task=task, action="stop")
    report = json.dumps(StopReport.objects.filter(task=task).latest("id").report)
    for stored in (entry.reason, task.stop_note, report):
        assert not shows_a_secret(stored), stored
        assert REDACTED in stored
    assert entry.reason.startswith("customer asked; password=[redacted], Authorization: ")
    viewer = Client()
    viewer.force_login(person("vera", Role.VIEWER))
    page = viewer.get(f"/tasks/{task.id}/").content.decode()
    export = streamed(viewer.get("/audit.csv"))
    for shown in (page, export):
        assert not shows_a_secret(shown)
        assert REDACTED in shown


def test_a_secret_typed_into_the_stop_form_is_never_stored_or_shown(start: Start) -> None:
    task = start("test_reader", {"pages": 1})
    operator = Client()
    operator.force_login(person("olga", Role.OPERATOR))

    operator.post(f"/tasks/{task.id}/stop", {"reason": SECRET_REASON})

    task.refresh_from_db()
    assert task.state == TaskState.CANCELLED
    assert not shows_a_secret(AuditEntry.objects.get(task=task, action="stop").reason)
    assert not shows_a_secret(task.stop_note)
    assert not shows_a_secret(operator.get(f"/tasks/{task.id}/").content.decode())


def test_secrets_in_evidence_are_masked_on_the_operation_its_history_and_the_audit_log(
    start: Start,
) -> None:
    op = unknown_operation(start("test_notices", {}))
    evidence = "desk says sent; api_key=hunter2 token: 'sk-live-abcdefghijklmnop'"

    response = post_json(
        api(person("rita", Role.RECONCILER)),
        f"/api/operations/{op.key}/resolve",
        {"committed": True, "evidence": evidence, "result": {"notice": 7}},
    )

    assert response.status_code == 200, response.content
    op.refresh_from_db()
    event = OperationEvent.objects.filter(operation=op, actor__isnull=False).get()
    entry = AuditEntry.objects.get(operation=op, action="mark_committed")
    for stored in (op.evidence, event.evidence, entry.reason, response.content.decode()):
        assert not shows_a_secret(stored), stored
    assert op.evidence == "desk says sent; api_key=[redacted] token: '[redacted]'"


def test_a_secret_in_a_resumption_reason_and_a_start_reason_is_masked(start: Start) -> None:
    admin = person("ada", Role.ADMIN)
    stopped = stopped_task(start, admin)

    resumed = services.task_approve_resumption(
        task_id=stopped.id, actor=admin, reason=SECRET_REASON, enqueue=lambda task_id: None
    )
    started = services.task_start(
        agent="test_reader",
        input={"pages": 2},
        actor=admin,
        reason=SECRET_REASON,
        enqueue=lambda task_id: None,
    )

    phase = Phase.objects.get(task=resumed, number=2)
    assert not shows_a_secret(phase.approval_note)
    for action, task in (("approve_resumption", resumed), ("start", started)):
        reason = AuditEntry.objects.get(task=task, action=action).reason
        assert not shows_a_secret(reason)
        assert reason.startswith("customer asked; password=[redacted]")


def test_a_configured_customer_field_typed_into_a_reason_is_masked(
    start: Start, settings: Any
) -> None:
    settings.LOOPGUARD_REDACT_FIELDS = ["iban"]
    task = start("test_reader", {"pages": 1})

    services.task_stop(
        task_id=task.id,
        actor=person("olga", Role.OPERATOR),
        reason="refund goes to IBAN: DE89370400440532013000 instead",
    )

    entry = AuditEntry.objects.get(task=task, action="stop")
    assert entry.reason == f"refund goes to IBAN: {REDACTED} instead"


@pytest.mark.parametrize(
    ("typed", "stored"),
    [
        ("password=hunter2 then more", f"password={REDACTED} then more"),
        ("passwd: hunter2, ok", f"passwd: {REDACTED}, ok"),
        ("the token=abc123; done", f"the token={REDACTED}; done"),
        ("api_key=abc&x=1", f"api_key={REDACTED}&x=1"),
        ("client_secret=s3cr3t", f"client_secret={REDACTED}"),
        ("db_password: 'with a space' ok", f"db_password: '{REDACTED}' ok"),
        ('{"secret": "xyz", "n": 1}', f'{{"secret": "{REDACTED}", "n": 1}}'),
        ("Authorization: Bearer abc", f"Authorization: {REDACTED}"),
        ("Authorization: Bearer abcdefghijkl", f"Authorization: {REDACTED}"),
        ("Authorization: Token abc", f"Authorization: {REDACTED}"),
        ("sent with Bearer abcdefghijkl today", f"sent with {REDACTED} today"),
        ("key sk-live-abcdefghijklmnop leaked", f"key {REDACTED} leaked"),
        ("ghp_abcdefghijklmnopqrstuv", REDACTED),
        ("xoxb-1234567890-abcdefghij", REDACTED),
        # What is not a secret stays as typed.
        ("ran out of tokens: 5 more needed", "ran out of tokens: 5 more needed"),
        ("ask the task to work on the desk", "ask the task to work on the desk"),
        ("the passport was checked", "the passport was checked"),
    ],
)
def test_free_text_keeps_what_it_says_and_loses_its_secrets(typed: str, stored: str) -> None:
    assert redact_text(typed) == stored


# -- checkpoints -------------------------------------------------------------------------------


class ProfileReader(Agent):
    """Reads a profile whose answer carries credentials, and remembers the answer."""

    name = "test_profiles"
    title = "Profile reader (free-text tests)"

    def tools(self) -> Sequence[Tool]:
        return [Tool("read_profile", "read", self._read)]

    def _read(self, call: Call) -> Result:
        return Result(
            Kind.SUCCESS,
            {"name": "Ada", "api_token": "hunter2", "note": "Bearer sk-live-abcdefghijklmnop"},
        )

    def plan(self, observation: Any) -> Call | Finish:
        if "profile" in self.memory:
            return Finish(self.memory["profile"]["name"])
        return Call("read_profile", {"who": "ada"})

    def inspect(self, result: Result | None, step: Call | Finish) -> Evidence:
        if result is not None and result.kind == Kind.SUCCESS:
            self.memory["profile"] = result.data  # as a model's conversation quotes results
        seen = self.memory.get("profile", {}).get("name") == "Ada"
        return Evidence(int(seen), seen and isinstance(step, Finish))


@pytest.mark.django_db(transaction=True)
def test_a_checkpoint_keeps_no_secret_and_a_resumption_goes_on_from_it(
    start: Start, settings: Any
) -> None:
    settings.LOOPGUARD_AGENTS = {
        **settings.LOOPGUARD_AGENTS,
        "test_profiles": f"{__name__}.ProfileReader",
    }
    task = start("test_profiles", {}, model_calls=1)

    runner.drive(task.id)

    task.refresh_from_db()
    assert (task.state, task.reason) == (TaskState.PARTIAL, "model_budget")
    assert task.checkpoint is not None
    saved = json.dumps(task.checkpoint)
    assert not shows_a_secret(saved), saved
    assert task.checkpoint["agent"]["profile"] == {
        "name": "Ada",
        "api_token": REDACTED,
        "note": REDACTED,
    }
    assert task.checkpoint["observation"]["result"]["data"]["api_token"] == REDACTED
    # What the agent needs to go on is kept: the resumed phase finishes from the checkpoint.
    services.task_approve_resumption(
        task_id=task.id,
        actor=person("ada", Role.APPROVER),
        reason="one more call",
        grant={"model_calls": 1},
        enqueue=lambda task_id: None,
    )
    runner.drive(task.id)
    task.refresh_from_db()
    assert (task.state, task.reason, task.executions) == (TaskState.COMPLETED, "goal_met", 1)
    assert not shows_a_secret(json.dumps(task.checkpoint))


def test_an_override_of_the_lookup_is_stored_with_its_secrets_masked(start: Start) -> None:
    from console.demo import desk

    op = unknown_operation(start("test_notices", {"count": 1}))
    desk.notice_send(
        order_number=None, recipient="ops@example.com", text="sent", idempotency_key=op.key
    )

    services.operation_mark_not_committed(
        key=op.key,
        actor=person("rita", Role.RECONCILER),
        evidence="nothing in the outbox",
        override="the desk row is stale; checked with password=hunter2 on the admin page",
    )

    entry = AuditEntry.objects.get(operation=op, action="mark_not_committed")
    assert "hunter2" not in entry.reason
    assert "hunter2" not in json.dumps(entry.after)
    assert REDACTED in entry.after["override"]
