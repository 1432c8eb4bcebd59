"""Bad input in forms, filters and cursors is shown to the person, never a server error."""

from __future__ import annotations

import pytest

from console.models import OperationState, Task

from .support import (
    KEY,
    START_FORM,
    STOP_POLLING,
    SignIn,
    World,
    audit_count,
    body,
    resolve_form,
    streamed,
)

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("input", "{not json", "not valid JSON"),
        ("input", "[1, 2]", "must be a JSON object"),
        ("input", "NaN", "not valid JSON: NaN is not a JSON number"),
        ("input", '{"x": NaN}', "not valid JSON: NaN is not a JSON number"),
        ("limits", '{"model_calls": ', "not valid JSON"),
        ("limits", '"ten"', "must be a JSON object"),
        ("limits", '{"laps": 3}', "unknown limit(s): laps"),
        ("limits", '{"model_calls": -1}', "invalid limits"),
        ("limits", '{"model_calls": "ten"}', "invalid limits"),
        ("agent", "no_such_agent", "Select a valid choice"),
    ],
)
def test_a_start_form_with_bad_input_shows_the_error_and_creates_nothing(
    signed_in: SignIn, field: str, value: str, message: str
) -> None:
    response = signed_in("operator").post("/tasks/new", {**START_FORM, field: value})

    assert response.status_code == 200
    assert message in body(response)
    assert not Task.objects.exists()
    assert audit_count() == 0


def test_a_start_form_with_a_null_character_escaped_in_its_json_is_a_form_error(
    signed_in: SignIn,
) -> None:
    # PostgreSQL's jsonb cannot hold U+0000: the person must be told, not shown a 500.
    response = signed_in("operator").post(
        "/tasks/new", {**START_FORM, "input": '{"note": "a\\u0000b"}'}
    )

    assert response.status_code == 200
    assert "errorlist" in body(response)
    assert not Task.objects.exists()


def test_the_start_form_keeps_what_was_typed_when_it_shows_an_error(signed_in: SignIn) -> None:
    response = signed_in("operator").post(
        "/tasks/new", {**START_FORM, "limits": '{"model_calls": '}
    )

    assert "{&quot;pages&quot;: 2}" in body(response)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"result": "{oops"}, "result: not valid JSON"),
        ({"evidence": ""}, "evidence: This field is required."),
        ({"decision": "maybe"}, "decision: Select a valid choice."),
    ],
)
def test_a_resolve_form_with_bad_input_leaves_the_write_uncertain(
    signed_in: SignIn, world: World, fields: dict[str, str], message: str
) -> None:
    prefix = f"op{world.op.id}"
    form = {**resolve_form(world.op, "committed")}
    form.update({f"{prefix}-{name}": value for name, value in fields.items()})

    response = signed_in("reconciler").post(f"/operations/{KEY}/resolve", form, follow=True)

    assert response.status_code == 200
    html = body(response)
    assert f"{KEY} was not changed: {message}" in html
    world.reload()
    assert world.op.state == OperationState.UNKNOWN
    assert audit_count() == 0


def test_a_resolve_form_whose_result_holds_a_null_character_is_refused_not_a_500(
    signed_in: SignIn, world: World
) -> None:
    form = resolve_form(world.op, "committed", result='{"note": "a\\u0000b"}')

    response = signed_in("reconciler").post(f"/operations/{KEY}/resolve", form, follow=True)

    assert response.status_code == 200
    assert f"{KEY} was not changed" in body(response)
    world.reload()
    assert world.op.state == OperationState.UNKNOWN


@pytest.mark.parametrize(
    "target", ["//evil.example/phish", "/\\evil.example/phish", "https://evil.example/"]
)
def test_the_resolve_form_sends_people_back_only_within_the_console(
    signed_in: SignIn, world: World, target: str
) -> None:
    form = {**resolve_form(world.op), "next": target}

    response = signed_in("reconciler").post(f"/operations/{KEY}/resolve", form)

    assert response.status_code == 302
    assert "evil.example" not in response.url


def test_the_resolve_form_sends_people_back_to_the_page_they_came_from(
    signed_in: SignIn, world: World
) -> None:
    form = {**resolve_form(world.op), "next": f"/tasks/{world.uncertain.id}/"}

    response = signed_in("reconciler").post(f"/operations/{KEY}/resolve", form)

    assert response.url == f"/tasks/{world.uncertain.id}/"


def test_garbage_task_filters_show_what_is_wrong_and_still_list_the_tasks(
    signed_in: SignIn, world: World
) -> None:
    response = signed_in("viewer").get("/tasks/?state=BOGUS&since=notadate&after=zzz")

    assert response.status_code == 200
    html = body(response)
    assert "state: unknown state &#x27;BOGUS&#x27;" in html
    assert "since: &#x27;notadate&#x27; is not a date and time" in html
    assert "page: &#x27;zzz&#x27; is not a place in this list; the newest are shown" in html
    assert "3 tasks" in html  # the bad filters are dropped, not applied
    assert "the newest tasks" in html and 'rel="next"' not in html


def test_garbage_audit_filters_show_what_is_wrong(signed_in: SignIn, world: World) -> None:
    signed_in("operator").post(f"/tasks/{world.queued.id}/stop", {"reason": "r"})

    response = signed_in("viewer").get(
        "/audit/?task=abc&until=2024-99-99&before=20241399T000000.000000Z_1"
    )

    assert response.status_code == 200
    html = body(response)
    assert "task: &#x27;abc&#x27; is not a task id" in html
    assert "until: &#x27;2024-99-99&#x27; is not a date and time" in html
    # Digits in the shape of a place, but month 13 of no year: named, not a server error.
    assert "page: &#x27;20241399T000000.000000Z_1&#x27; is not a place in this list" in html
    assert "1 entry" in html


@pytest.mark.parametrize(
    "url",
    [
        "/tasks/?q=%00",
        "/tasks/?reason=%00",
        "/tasks/?agent=%00",
        "/audit/?actor=%00",
        "/audit/?action=%00",
        "/audit.csv?actor=%00",
        "/audit.json?action=%00",
    ],
)
def test_a_null_character_in_a_filter_is_not_a_server_error(
    signed_in: SignIn, world: World, url: str
) -> None:
    response = signed_in("viewer").get(url)

    assert response.status_code in (200, 400)
    if response.streaming:  # an export fails while it streams: read it to the end
        streamed(response)


def test_an_out_of_range_trace_cursor_is_not_a_server_error(
    signed_in: SignIn, world: World
) -> None:
    client = signed_in("viewer")
    huge = "99999999999999999999"

    assert client.get(f"/tasks/{world.stopped.id}/?before={huge}").status_code == 200
    assert client.get(f"/tasks/{world.stopped.id}/live?after={huge}").status_code in (
        200,
        STOP_POLLING,
    )
