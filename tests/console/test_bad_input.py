"""Bad input gets a 4xx and changes nothing: one test per finding of the outside probe
(issue 13), at every door the finding came through: the API, the console's forms and
filters, ``manage.py start_task`` and a model server's reply."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.test import Client

from console import services
from console.drivers import runner
from console.models import AuditEntry, Operation, OperationState, Task, TaskState
from console.records import inputs
from console.records.inputs import KEPT_DEPTH, MAX_DEPTH, InputRefused
from console.records.redaction import redact
from console.records.roles import Role

from . import test_model_agent as chat
from .api.helpers import ApiClient, nested, unknown_operation

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("enqueued")]

KEY = "order/42/refund"
START_FORM = {"agent": "test_reader", "input": "{}", "limits": "", "reason": "nightly"}


def brackets(levels: int) -> str:
    """JSON text nesting ``levels`` lists."""
    return "[" * levels + "]" * levels



@pytest.fixture
def browser(person: Callable[[Role], User]) -> Callable[[Role], Client]:
    def make(role: Role) -> Client:
        client = Client()
        client.force_login(person(role))
        return client

    return make


@pytest.fixture
def uncertain(db: None) -> Operation:
    """An UNKNOWN write, its task NEEDS_HUMAN."""
    task = services.task_start(agent="test_notices", input={"count": 1}, enqueue=lambda i: None)
    return unknown_operation(task, KEY)


def post_json(client: Client, url: str, body: str | bytes) -> Any:
    return client.post(url, data=body, content_type="application/json")


def error_of(response: Any, status: int = 400) -> tuple[str, str]:
    assert response.status_code == status, response.content[:300]
    answer = response.json()
    return answer["code"], answer["error"]


def html(response: Any) -> str:
    return response.content.decode()


# -- deeply nested JSON ------------------------------------------------------------------------


def test_the_api_refuses_task_input_nested_600_levels_deep_with_one_clear_answer(
    api: Callable[[Role], ApiClient], caplog: pytest.LogCaptureFixture
) -> None:
    body = f'{{"agent": "test_reader", "input": {{"a": {brackets(600)}}}}}'

    with caplog.at_level(logging.INFO):
        response = post_json(api(Role.OPERATOR), "/api/tasks", body)

    code, message = error_of(response)
    assert code == "invalid_body"
    assert f"nested more than {MAX_DEPTH} levels deep" in message
    assert not Task.objects.exists()
    # The probe's 1.2 KB request wrote 2,423 lines of traceback.
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


@pytest.mark.parametrize("field", ["input", "limits"])
def test_the_start_form_refuses_json_nested_600_levels_deep_beside_its_field(
    browser: Callable[[Role], Client], field: str
) -> None:
    form = {**START_FORM, field: f'{{"a": {brackets(600)}}}'}

    response = browser(Role.OPERATOR).post("/tasks/new", form)

    assert response.status_code == 200
    assert f"nested more than {MAX_DEPTH} levels deep" in response.context["form"].errors[field][0]
    assert not Task.objects.exists()


def test_start_task_from_the_shell_refuses_input_nested_600_levels_deep() -> None:
    with pytest.raises(CommandError, match=f"the input is nested more than {MAX_DEPTH} levels"):
        call_command("start_task", "test_reader", f'{{"a": {brackets(600)}}}')

    assert not Task.objects.exists()


def test_task_input_deeper_than_the_redaction_keeps_is_refused_rather_than_cut(
    api: Callable[[Role], ApiClient], browser: Callable[[Role], Client]
) -> None:
    # The agent is handed the input as stored, and the redaction cuts below KEPT_DEPTH.
    too_deep = json.dumps({"agent": "test_reader", "input": {"a": nested(KEPT_DEPTH)}})

    code, message = error_of(post_json(api(Role.OPERATOR), "/api/tasks", too_deep))
    form = {**START_FORM, "input": json.dumps({"a": nested(KEPT_DEPTH)})}
    page = browser(Role.OPERATOR).post("/tasks/new", form)

    assert code == "invalid_input"
    assert f"input is nested more than {KEPT_DEPTH} levels deep" in message
    assert "would be cut" in page.context["form"].errors["input"][0]
    assert not Task.objects.exists()


def test_task_input_exactly_as_deep_as_the_redaction_keeps_is_stored_whole(
    api: Callable[[Role], ApiClient],
) -> None:
    deepest = {"a": nested(KEPT_DEPTH - 1)}
    body = json.dumps({"agent": "test_reader", "input": deepest})

    response = post_json(api(Role.OPERATOR), "/api/tasks", body)

    assert response.status_code == 201
    assert Task.objects.get().input == deepest


def _surrogate_in_content() -> chat.Reply:
    status, body = chat.calls(("call_1", "order_lookup", {"order": 42}))
    body["choices"][0]["message"]["content"] = "looking it up \ud800"
    return status, body


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("reply", "said"),
    [
        # Deep enough that json.loads itself used to raise RecursionError.
        (
            (chat.RAW, f'{{"choices": [], "padding": {brackets(5000)}}}'.encode()),
            f"the model's reply is nested more than {MAX_DEPTH} levels deep",
        ),
        (
            chat.calls(("call_1", "order_lookup", f'{{"order": {brackets(600)}}}')),
            f"tool call 1 are nested more than {MAX_DEPTH} levels deep",
        ),
        # A conversation holding one could not be saved: the worker failed at its step.
        (_surrogate_in_content(), "content holds a lone surrogate (\\ud800)"),
        (
            chat.calls(("call_1", "order_lookup", '{"order": 42, "note": "\\ud800"}')),
            "tool call 1.note holds a lone surrogate (\\ud800)",
        ),
    ],
    ids=["the-reply-too-deep", "arguments-too-deep", "surrogate-in-text", "surrogate-in-arguments"],
)
def test_a_model_reply_the_task_cannot_keep_fails_it_saying_so_before_anything_runs(
    settings: Any, reply: chat.Reply, said: str
) -> None:
    stub = chat.StubModel()
    stub.thread.start()
    settings.LOOPGUARD_MODEL_URL = stub.url
    settings.LOOPGUARD_MODEL_API_KEY = chat.API_KEY
    settings.LOOPGUARD_MODEL_RETRIES = 0
    stub.replies = [reply]
    try:
        task = chat.start()
        runner.drive(task.id)
    finally:
        stub.server.shutdown()
        stub.server.server_close()

    task.refresh_from_db()
    assert (task.state, task.reason) == (TaskState.FAILED, "planner_error")
    assert said in task.detail
    assert task.executions == 0


def test_the_depth_of_json_text_does_not_count_brackets_inside_strings() -> None:
    text = json.dumps({"a": "[[[[{{{{", "b": ['x"]]]]'], "c": {"d": []}})

    assert inputs.text_depth(text) == 3
    assert inputs.load_json(text)["b"] == ['x"]]]]']


def test_a_value_100000_levels_deep_is_measured_without_recursion() -> None:
    value = nested(100_000)

    assert inputs.depth(value) == 100_000
    assert inputs.depth(value, limit=MAX_DEPTH) == MAX_DEPTH + 1
    assert inputs.unstorable(value, what="input") is None


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("NaN", "NaN is not a JSON number"),
        ('{"x": Infinity}', "Infinity is not a JSON number"),
        ("[-Infinity]", "-Infinity is not a JSON number"),
        ("[1e400]", "1e400 is beyond the range"),
        ("1" * 5000, "a number of 5000 digits"),
        (b'{"x": "\xff"}', "not UTF-8 text"),
    ],
)
def test_what_postgresql_cannot_hold_as_a_number_is_refused_as_not_json(
    text: str | bytes, said: str
) -> None:
    with pytest.raises(InputRefused, match="the input is not valid JSON") as refused:
        inputs.load_json(text, what="the input")

    assert said in str(refused.value)


def test_the_kept_depth_is_exactly_what_the_redaction_keeps_whole() -> None:
    # If the redaction's cut moves, KEPT_DEPTH must move with it, or values are cut again.
    assert redact(nested(KEPT_DEPTH)) == nested(KEPT_DEPTH)
    assert redact(nested(KEPT_DEPTH + 1)) != nested(KEPT_DEPTH + 1)
    assert KEPT_DEPTH <= MAX_DEPTH


# -- NUL and lone surrogates -------------------------------------------------------------------


def test_an_operation_key_with_a_nul_is_a_400_in_the_api_and_an_unknown_key_a_404(
    api: Callable[[Role], ApiClient], uncertain: Operation
) -> None:
    client = api(Role.RECONCILER)
    body = '{"committed": false, "evidence": "checked the desk"}'

    malformed = error_of(post_json(client, "/api/operations/a%00b/resolve", body))
    unknown = error_of(post_json(client, "/api/operations/a-b/resolve", body), 404)

    assert malformed == (
        "invalid_input",
        "the operation key holds a NUL character (\\u0000), which cannot be stored",
    )
    assert unknown[0] == "not_found"
    uncertain.refresh_from_db()
    assert uncertain.state == OperationState.UNKNOWN
    assert not AuditEntry.objects.exists()


@pytest.mark.parametrize("action", ["resolve", "lookup"])
def test_an_operation_key_with_a_nul_is_a_400_in_the_console_and_an_unknown_key_a_404(
    browser: Callable[[Role], Client], uncertain: Operation, action: str
) -> None:
    client = browser(Role.RECONCILER)
    form = {"decision": "not_committed", "evidence": "checked the desk"}

    assert client.post(f"/operations/a%00b/{action}", form).status_code == 400
    assert client.post(f"/operations/a-b/{action}", form).status_code == 404
    uncertain.refresh_from_db()
    assert uncertain.state == OperationState.UNKNOWN
    assert not AuditEntry.objects.exists()


@pytest.mark.parametrize("text", ["a\\u0000b", "a\\ud800b"], ids=["nul", "lone-surrogate"])
@pytest.mark.parametrize(
    ("role", "url", "body"),
    [
        (Role.OPERATOR, "/api/tasks", '{"agent": "test_reader", "reason": "%s"}'),
        (Role.OPERATOR, "/api/tasks", '{"agent": "test_reader", "input": {"note": "%s"}}'),
        (Role.OPERATOR, "/api/tasks/{task}/stop", '{"reason": "%s"}'),
        (
            Role.RECONCILER,
            "/api/operations/{key}/resolve",
            '{"committed": false, "evidence": "%s"}',
        ),
        (
            Role.RECONCILER,
            "/api/operations/{key}/resolve",
            '{"committed": true, "evidence": "seen", "result": {"id": "%s"}}',
        ),
    ],
    ids=["start-reason", "start-input", "stop-reason", "evidence", "result"],
)
def test_text_the_database_cannot_hold_is_a_400_from_the_api_and_changes_nothing(
    api: Callable[[Role], ApiClient],
    uncertain: Operation,
    role: Role,
    url: str,
    body: str,
    text: str,
) -> None:
    target = url.format(task=uncertain.task_id, key=KEY)
    tasks = Task.objects.count()

    code, message = error_of(post_json(api(role), target, body % text))

    assert code == "invalid_input"
    assert "NUL character" in message or "lone surrogate" in message
    assert Task.objects.count() == tasks
    uncertain.refresh_from_db()
    assert uncertain.state == OperationState.UNKNOWN
    assert not AuditEntry.objects.exists()


# -- NaN and deep committed results ------------------------------------------------------------


def test_a_nan_result_in_the_resolve_form_is_a_field_error_that_keeps_what_was_typed(
    browser: Callable[[Role], Client], uncertain: Operation
) -> None:
    form = {"decision": "committed", "evidence": "refund R-17 in the ledger", "result": "NaN"}

    response = browser(Role.RECONCILER).post(f"/operations/{KEY}/resolve", form)

    assert response.status_code == 200
    assert f"{KEY} was not changed: result: not valid JSON: NaN is not a JSON number" in html(
        response
    )
    (row,) = response.context["queue"].rows
    assert row.typed == {**form, "override": ""}  # every field of the form, as typed
    uncertain.refresh_from_db()
    assert uncertain.state == OperationState.UNKNOWN
    assert not AuditEntry.objects.exists()


def test_a_committed_result_deeper_than_the_redaction_keeps_is_refused_rather_than_cut(
    api: Callable[[Role], ApiClient], browser: Callable[[Role], Client], uncertain: Operation
) -> None:
    result = {"refund": nested(KEPT_DEPTH)}
    body = json.dumps({"committed": True, "evidence": "seen", "result": result})
    form = {"decision": "committed", "evidence": "seen", "result": json.dumps(result)}

    url = f"/api/operations/{KEY}/resolve"
    code, message = error_of(post_json(api(Role.RECONCILER), url, body))
    page = browser(Role.RECONCILER).post(f"/operations/{KEY}/resolve", form)

    assert code == "invalid_input"
    assert f"result is nested more than {KEPT_DEPTH} levels deep" in message
    assert "would be cut before it is stored and handed to the agent" in html(page)
    uncertain.refresh_from_db()
    assert uncertain.state == OperationState.UNKNOWN
    assert uncertain.result is None
    assert not AuditEntry.objects.exists()


def test_a_committed_result_as_deep_as_the_redaction_keeps_is_stored_whole(
    api: Callable[[Role], ApiClient], uncertain: Operation
) -> None:
    result = {"refund": nested(KEPT_DEPTH - 1)}
    body = json.dumps({"committed": True, "evidence": "seen", "result": result})

    response = post_json(api(Role.RECONCILER), f"/api/operations/{KEY}/resolve", body)

    assert response.status_code == 200
    uncertain.refresh_from_db()
    assert uncertain.result["data"] == result


# -- extreme dates -----------------------------------------------------------------------------

EDGES = ["since=9999-12-31T23:59-14:00", "until=0001-01-01T00:00%2B14:00"]


@pytest.mark.parametrize("edge", EDGES)
@pytest.mark.parametrize("page", ["/tasks/", "/audit/"])
def test_a_date_at_the_edge_of_the_calendar_is_a_filter_error_for_a_viewer(
    browser: Callable[[Role], Client], uncertain: Operation, page: str, edge: str
) -> None:
    response = browser(Role.VIEWER).get(f"{page}?{edge}")

    assert response.status_code == 200
    assert "is out of range (pick a time between the years 1 and 9999" in html(response)


@pytest.mark.parametrize("edge", EDGES)
def test_a_date_at_the_edge_of_the_calendar_is_a_400_in_the_api(
    api: Callable[[Role], ApiClient], uncertain: Operation, edge: str
) -> None:
    response = api(Role.VIEWER).get(f"/api/tasks?{edge}")

    code, message = error_of(response)
    name = edge.partition("=")[0]
    assert code == "invalid_query"
    assert "is out of range" in response.json()["fields"][name]
    assert message.startswith(f"{name}: ")


def test_the_doors_and_the_service_draw_the_kept_depth_at_the_same_level() -> None:
    # An empty object as the innermost of 21 levels: the redaction keeps it whole and the
    # service stores it, so the form and the API must not refuse it either.
    value: Any = {}
    for _ in range(KEPT_DEPTH):
        value = {"a": value}

    assert redact(value) == value
    inputs.check_kept(value, what="result")  # no refusal
    assert inputs.unstorable(value, what="result", max_depth=KEPT_DEPTH) is None
    # One level more, and both refuse it.
    with pytest.raises(InputRefused):
        inputs.check_kept({"a": value}, what="result")
    assert inputs.unstorable({"a": value}, what="result", max_depth=KEPT_DEPTH) is not None
