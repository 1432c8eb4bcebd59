"""What the API tests share: a client whose every answer is checked against the OpenAPI
document, a caller holding a token, and a write left uncertain."""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import Any

from django.contrib.auth.models import User
from django.test import Client
from jsonschema import Draft202012Validator
from referencing import Registry
from referencing.jsonschema import DRAFT202012

from console.api import openapi
from console.models import ApiToken, Operation, Task
from tests.console import doubt

JSON = "application/json"
DOCUMENT = "urn:loopguard:openapi"


@functools.cache
def document() -> dict[str, Any]:
    """The OpenAPI document as a client reads it (through JSON, enums as plain strings)."""
    return json.loads(json.dumps(openapi.document()))


@functools.cache
def _registry() -> Registry[Any]:
    return Registry().with_resource(DOCUMENT, DRAFT202012.create_resource(document()))


def _pointer(*parts: str) -> str:
    return "".join("/" + p.replace("~", "~0").replace("/", "~1") for p in parts)


def described_answer(method: str, response: Any) -> str | None:
    """The JSON pointer of what the document says ``response`` to ``method`` must be; None
    for an answer from outside the API."""
    match = response.resolver_match
    if match is None or "api" not in match.namespaces:
        return None
    status = response.status_code
    if match.url_name is None:  # the catch-all JSON 404
        assert status == 404, f"{match.route!r} is not routed, yet answered {status}"
        return _pointer("components", "responses", "UnknownEndpoint")
    template = "/" + openapi.path_template(match.route)
    item = document()["paths"].get(template)
    assert item is not None, f"{template} is routed but not in the document"
    if method.lower() not in item:
        assert status == 405, f"{method} {template} is not described, yet answered {status}"
        return _pointer("components", "responses", "MethodNotAllowed")
    responses = item[method.lower()]["responses"]
    assert str(status) in responses, (
        f"{method} {template} answered {status}, which the document does not describe: "
        f"{sorted(responses)}; {response.content[:500]!r}"
    )
    return _pointer("paths", template, method.lower(), "responses", str(status))


def conform(method: str, response: Any) -> None:
    """Fail unless ``response`` is what the OpenAPI document describes for its operation
    and status: its headers, its content type and its body, field by field."""
    pointer = described_answer(method, response)
    if pointer is None:
        return
    answer: Any = document()
    for part in pointer.strip("/").split("/"):
        answer = answer[part.replace("~1", "/").replace("~0", "~")]
    assert response["Content-Type"] == JSON, response["Content-Type"]
    for name, header in answer.get("headers", {}).items():
        if header.get("required"):
            assert response.has_header(name), f"the answer lacks its {name} header"
    schema = {"$ref": f"{DOCUMENT}#{pointer}/content/application~1json/schema"}
    validator = Draft202012Validator(
        schema, registry=_registry(), format_checker=Draft202012Validator.FORMAT_CHECKER
    )
    body = json.loads(response.content)
    problems = sorted(validator.iter_errors(body), key=lambda e: list(e.absolute_path))
    assert not problems, (
        f"{method} {response.resolver_match.route} {response.status_code} does not match "
        f"the document:\n" + "\n".join(
            f"- at {'/'.join(map(str, p.absolute_path)) or 'the top'}: {p.message[:300]}"
            for p in problems
        )
    )


class ApiClient(Client):
    """A test client that checks every API answer against the OpenAPI document."""

    def request(self, **request: Any) -> Any:
        response = super().request(**request)
        conform(request["REQUEST_METHOD"], response)
        return response


@dataclass
class Caller:
    """Someone calling the API: a user with roles, one token, a client that sends it."""

    user: User
    token: ApiToken
    secret: str
    client: ApiClient

    def get(self, url: str, **query: Any) -> Any:
        return self.client.get(url, query)

    def post(self, url: str, body: Any = None) -> Any:
        data = body if isinstance(body, str | bytes) else json.dumps(body or {})
        return self.client.post(url, data=data, content_type=JSON)


def bearer(secret: str, **options: Any) -> ApiClient:
    """A client sending ``secret`` as its bearer token."""
    return ApiClient(headers={"authorization": f"Bearer {secret}"}, **options)


def error(response: Any, status: int) -> str:
    """The response's error message, after checking it is a JSON error with ``status``."""
    assert response.status_code == status, response.content
    assert response["Content-Type"] == JSON
    return str(response.json()["error"])


def nested(levels: int, leaf: Any = "deep") -> Any:
    """A value nesting ``levels`` lists around ``leaf``."""
    value = leaf
    for _ in range(levels):
        value = [value]
    return value


def unknown_operation(task: Task, key: str = "order/42/refund") -> Operation:
    """:func:`tests.console.doubt.unknown_operation`, under the API tests' usual key."""
    return doubt.unknown_operation(task, key)
