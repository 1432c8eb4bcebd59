"""The OpenAPI 3.1 description at /api/openapi.json: valid, complete, routed, guarded.

That every answer the API tests receive matches it is checked by their client
(:class:`tests.console.api.helpers.ApiClient`), not here.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import cast

import pytest
from django.test import Client
from django.urls import URLPattern, resolve
from jsonschema import Draft202012Validator
from openapi_spec_validator import OpenAPIV31SpecValidator, validate

from console.api import openapi
from console.api import urls as api
from console.api.serializers import ErrorCode
from console.records.roles import Role

from .helpers import JSON, ApiClient, Caller, conform, document, error

pytestmark = pytest.mark.django_db

METHODS = {"get", "put", "post", "delete", "patch", "head", "options", "trace"}
# A value each path parameter's converter accepts, to route the document's paths.
EXAMPLES = {"task_id": "17", "key": "order/42/refund", "approval_id": "7"}


def _routes() -> dict[str, URLPattern]:
    """The API's named URL patterns, by OpenAPI path template."""
    return {
        "/api/" + openapi.path_template(str(p.pattern)): p
        for p in api.urlpatterns
        if isinstance(p, URLPattern) and p.name is not None
    }


def test_the_served_document_is_valid_openapi_3_1(caller: Callable[..., Caller]) -> None:
    viewer = caller(Role.VIEWER)

    response = viewer.get("/api/openapi.json")

    assert response.status_code == 200
    served = response.json()
    assert served["openapi"] == "3.1.0"
    validate(served, cls=OpenAPIV31SpecValidator)
    assert served == document()


def test_every_route_of_the_api_is_in_the_document_with_the_methods_it_answers() -> None:
    paths = document()["paths"]
    unnamed = [p for p in api.urlpatterns if p.name is None]

    for template, pattern in _routes().items():
        assert template in paths, f"{template} is routed but not described"
        view = cast(openapi.Endpoint, pattern.callback)
        answered = {method.lower() for method in view.permissions}
        assert set(paths[template]) & METHODS == answered, template
    # The one pattern left out is the catch-all JSON 404, described as a shared answer.
    assert [str(p.pattern) for p in unnamed] == [""]
    assert "UnknownEndpoint" in document()["components"]["responses"]


def test_every_path_of_the_document_is_routed_to_the_view_it_describes() -> None:
    routes = _routes()

    for template, item in document()["paths"].items():
        concrete = template.format(**EXAMPLES)
        match = resolve(concrete)
        assert match.url_name is not None, f"{template} ({concrete}) reaches no endpoint"
        assert match.func is routes[template].callback
        names = {p["name"] for p in item.get("parameters", [])}
        assert names == set(match.kwargs), template


def test_a_routed_method_without_an_entry_or_an_entry_without_a_route_fails_the_document(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    build = openapi.document.__wrapped__  # past the per-process cache
    entries = dict(openapi.ENTRIES)
    missing = {k: v for k, v in entries.items() if k != ("task-stop", "POST")}
    extra = {**entries, ("task-cancel", "POST"): entries[("task-stop", "POST")]}

    monkeypatch.setattr(openapi, "ENTRIES", missing)
    with pytest.raises(LookupError, match="POST 'task-stop' is routed but has no Entry"):
        build()
    monkeypatch.setattr(openapi, "ENTRIES", extra)
    with pytest.raises(LookupError, match=r"described but not routed: .*task-cancel"):
        build()


def test_every_operation_says_what_it_answers_and_how_it_fails_with_a_code() -> None:
    operations = [
        (template, method, operation)
        for template, item in document()["paths"].items()
        for method, operation in item.items()
        if method in METHODS
    ]

    assert len({op["operationId"] for _, _, op in operations}) == len(operations)
    for template, method, operation in operations:
        statuses = set(operation["responses"])
        assert {"401", "403", "500"} <= statuses, (method, template)
        assert any(s.startswith("2") for s in statuses), (method, template)
        if method == "post":
            assert {"400", "413"} <= statuses and "requestBody" in operation, template
        for status, answer in operation["responses"].items():
            if status.startswith(("4", "5")):
                codes = answer["content"][JSON]["schema"]["allOf"][1]["properties"]["code"]
                assert {ErrorCode(c).status for c in codes["enum"]} == {int(status)}


def test_the_document_is_refused_without_authentication(db: None) -> None:
    anonymous = ApiClient().get("/api/openapi.json")
    forged = ApiClient(headers={"authorization": "Bearer lg_forged"}).get("/api/openapi.json")

    assert "token is required" in error(anonymous, 401)
    assert anonymous.json()["code"] == "token_required"
    assert anonymous["WWW-Authenticate"] == 'Bearer realm="loopguard"'
    assert forged.json()["code"] == "invalid_token"
    assert "paths" not in anonymous.json()


def test_a_signed_in_person_may_read_the_document_but_still_not_the_data(
    caller: Callable[..., Caller],
) -> None:
    viewer = caller(Role.VIEWER)
    browser = ApiClient(enforce_csrf_checks=True)
    browser.force_login(viewer.user)

    described = browser.get("/api/openapi.json")
    data = browser.get("/api/tasks")

    assert described.status_code == 200
    assert described.json()["paths"]
    error(data, 401)


def test_a_person_without_any_role_may_not_read_the_document(
    caller: Callable[..., Caller],
) -> None:
    nobody = caller()
    browser = ApiClient()
    browser.force_login(nobody.user)

    assert "read permission" in error(nobody.get("/api/openapi.json"), 403)
    assert "read permission" in error(browser.get("/api/openapi.json"), 403)


def test_every_error_answer_names_its_code_beside_its_message(
    caller: Callable[..., Caller],
) -> None:
    viewer = caller(Role.VIEWER)

    answers = {
        "token_required": ApiClient().get("/api/tasks"),
        "invalid_request": ApiClient(headers={"authorization": "Basic eDp5"}).get("/api/tasks"),
        "permission_denied": viewer.post("/api/tasks", {"agent": "test_reader"}),
        "invalid_query": viewer.get("/api/tasks", page="two"),
        "not_found": viewer.get("/api/tasks/987654"),
        "unknown_endpoint": viewer.get("/api/nothing/here"),
        "method_not_allowed": viewer.client.delete("/api/tasks"),
    }

    for code, response in answers.items():
        body = response.json()
        assert (body["code"], response.status_code) == (code, ErrorCode(code).status)
        assert body["error"]


def test_an_id_that_is_not_a_whole_number_gets_a_404_its_operation_describes(
    admin: Caller,
) -> None:
    # A client checks an answer against the operation it called, not against the catch-all
    # (as conform does for a path no route takes): the probe found -1 answered with a code
    # the operation's 404 did not list.
    for template, item in document()["paths"].items():
        if "{task_id}" not in template and "{approval_id}" not in template:
            continue
        for method in set(item) & METHODS:
            listed = item[method]["responses"]["404"]["content"][JSON]["schema"]
            codes = listed["allOf"][1]["properties"]["code"]["enum"]
            for bad in ("-1", "abc"):
                url = template.format(task_id=bad, approval_id=bad)
                sent = admin.get(url) if method == "get" else admin.post(url, {"reason": "x"})

                assert sent.json()["code"] in codes, (method, url, sent.json(), codes)
                assert sent.status_code == 404


ATTACH = {
    "protocol": 1, "request_id": "r-1", "lease": "l-1", "agent": "desk-bot", "client": "t/1",
    "tools": {"lookup": "read"},
}
STEP = {"protocol": 1, "request_id": "r-2", "lease": "l-1", "step": "wait"}
# (where, the body's schema, a body the API refuses with 400 for the field the probe sent)
REFUSED_BODIES = [
    ("/api/tasks/987654/stop", "StopTask", {"reason": ""}),
    ("/api/tasks/987654/stop", "StopTask", {"reason": " \n "}),
    ("/api/tasks/987654/stop", "StopTask", {"reason": None}),
    ("/api/tasks/987654/stop", "StopTask", {"reason": "\x1c\x85"}),
    ("/api/tasks/987654/stop", "StopTask", {"reason": "nul \x00 inside"}),
    ("/api/tasks/987654/resume", "ResumeTask", {"reason": ""}),
    ("/api/approvals/987654/approve", "ApproveCall", {"reason": ""}),
    ("/api/approvals/987654/reject", "RejectCall", {"reason": "", "on_reject": "end"}),
    ("/api/operations/order/42/refund/resolve", "ResolveOperation",
     {"committed": False, "evidence": None}),
    ("/api/tasks", "StartTask", {"agent": None}),
    ("/api/tasks", "StartTask", {"agent": "no_such_agent"}),
    ("/api/tasks", "StartTask", {"agent": "test_reader", "reason": "nul \x00 inside"}),
    ("/api/attached", "AttachTask", {**ATTACH, "agent": None}),
    ("/api/attached", "AttachTask", {**ATTACH, "agent": "desk bot!"}),
    ("/api/attached", "AttachTask", {**ATTACH, "request_id": "r-\u00e9"}),
    ("/api/attached", "AttachTask", {**ATTACH, "tools": None}),
    ("/api/attached", "AttachTask", {**ATTACH, "tools": {}}),
    ("/api/attached", "AttachTask", {**ATTACH, "tools": {"lookup": "delete"}}),
    ("/api/attached/987654/steps", "Step", {**STEP, "lease": "l-\u00df"}),
]


@pytest.mark.parametrize(("url", "schema", "body"), REFUSED_BODIES)
def test_a_body_the_api_refuses_as_malformed_is_one_its_document_refuses_too(
    admin: Caller, url: str, schema: str, body: dict[str, object]
) -> None:
    # The probe sent bodies the document allowed (an empty reason, a null agent, a lease
    # that is not ASCII) and got 400s: a client building its body from the document must
    # be able to tell what the console will take.
    refused = admin.post(url, body)
    described = Draft202012Validator(document()["components"]["schemas"][schema])

    assert refused.status_code == 400, refused.content
    assert not described.is_valid(body), f"the document allows {body}, which the API refuses"


@pytest.mark.usefixtures("enqueued")
def test_the_bodies_the_api_takes_are_still_ones_its_document_allows(admin: Caller) -> None:
    schemas = document()["components"]["schemas"]

    for schema, body in [
        ("StopTask", {"reason": "the customer asked"}),
        ("StartTask", {"agent": "test_reader", "reason": None}),
        ("AttachTask", {**ATTACH, "agent": " desk-bot.v2 ", "reason": "tried \u00e9"}),
        ("Step", {**STEP, "request_id": "r ~!"}),
        ("ResolveOperation", {"committed": True, "evidence": "ticket #9 shows it"}),
    ]:
        Draft202012Validator(schemas[schema]).validate(body)
    started = admin.post("/api/tasks", {"agent": "test_reader", "reason": None})
    attached = admin.post("/api/attached", {**ATTACH, "agent": " desk-bot.v2 "})
    assert (started.status_code, attached.status_code) == (201, 201)


def test_the_check_catches_an_answer_the_document_does_not_describe(admin: Caller) -> None:
    answer = Client(headers={"authorization": f"Bearer {admin.secret}"}).get("/api/tasks")
    conform("GET", answer)  # as the API gave it
    shown = answer.json()
    shown["tasks"] = [{"id": "seventeen"}]
    answer.content = json.dumps(shown).encode()

    with pytest.raises(AssertionError, match="does not match the document"):
        conform("GET", answer)
