"""Answering every call: each tool call of a reply gets its answer, in the API's form."""

from __future__ import annotations

import json
import math

import pytest

from guard import Kind, Result
from guard.adapters import (
    anthropic_tool_results,
    calls_from_anthropic,
    calls_from_openai,
    openai_tool_messages,
)

from .wire import NOT_RUN, READ, TOOLS, openai_call, openai_reply, tool_use, two_calls

# -- answering every call -----------------------------------------------------------------


def test_results_become_one_tool_message_per_call_with_its_id_and_json_data() -> None:
    turn = two_calls()
    results = [
        Result(Kind.SUCCESS, {"incident": 42, "title": "Disk full", "tags": ["db", "ünï"]}),
        Result(Kind.SUCCESS, {"notice_id": "n-1"}),
    ]

    messages = openai_tool_messages(turn, results)

    assert messages == [
        {
            "role": "tool",
            "tool_call_id": "call_read",
            "content": '{"incident": 42, "title": "Disk full", "tags": ["db", "ünï"]}',
        },
        {"role": "tool", "tool_call_id": "call_send", "content": '{"notice_id": "n-1"}'},
    ]


def test_failures_are_marked_for_both_apis() -> None:
    turn = calls_from_anthropic(
        [
            tool_use("t_ok", "read_incident", {"incident": 1}),
            tool_use("t_busy", "read_incident", {"incident": 2}),
            tool_use("t_wait", "read_incident", {"incident": 3}),
            tool_use("t_pre", "read_incident", {"incident": 4}),
            tool_use("t_fatal", "read_incident", {"incident": 5}),
        ],
        TOOLS,
    )
    results = [
        Result(Kind.SUCCESS, "fine"),
        Result(Kind.RETRYABLE, "busy", wait_ms=10),
        Result(Kind.PENDING, {"job": 9}, wait_ms=10),
        Result(Kind.PRECONDITION, "locked"),
        Result(Kind.FATAL, "gone"),
    ]

    blocks = anthropic_tool_results(turn, results)
    messages = openai_tool_messages(turn, results)

    assert [b["tool_use_id"] for b in blocks] == [m["tool_call_id"] for m in messages]
    assert [b["tool_use_id"] for b in blocks] == list(turn.call_ids)
    assert all(b["type"] == "tool_result" for b in blocks)
    assert [b["is_error"] for b in blocks] == [False, True, False, True, True]
    assert [json.loads(m["content"]) for m in messages] == [
        "fine",
        {"kind": "RETRYABLE", "data": "busy"},
        {"kind": "PENDING", "data": {"job": 9}},
        {"kind": "PRECONDITION", "data": "locked"},
        {"kind": "FATAL", "data": "gone"},
    ]
    assert [b["content"] for b in blocks] == [m["content"] for m in messages]


def test_calls_that_did_not_run_are_answered_as_not_run() -> None:
    turn = two_calls()

    partly = openai_tool_messages(turn, [Result(Kind.FATAL, "gone")])
    with_none = anthropic_tool_results(turn, [Result(Kind.SUCCESS), None])
    nothing = anthropic_tool_results(turn, None)

    assert [m["content"] for m in partly][1] == NOT_RUN
    assert (with_none[1]["content"], with_none[1]["is_error"]) == (NOT_RUN, True)
    assert [(b["content"], b["is_error"]) for b in nothing] == [(NOT_RUN, True)] * 2


def test_a_single_result_answers_a_one_call_turn() -> None:
    turn = calls_from_openai(openai_reply(openai_call("c1", "read_incident", READ)), TOOLS)

    assert openai_tool_messages(turn, Result(Kind.SUCCESS, [1, 2])) == [
        {"role": "tool", "tool_call_id": "c1", "content": "[1, 2]"}
    ]


def test_an_exception_is_answered_as_an_error_and_an_uncertain_write_as_unknown() -> None:
    turn = two_calls()

    blocks = anthropic_tool_results(turn, [TimeoutError("read timed out"), ConnectionError()])

    assert blocks[0]["content"] == "error: TimeoutError: read timed out"
    assert blocks[1]["content"].startswith("error: ConnectionError; whether it took effect")
    assert all(block["is_error"] for block in blocks)


def test_data_json_cannot_hold_is_still_answered() -> None:
    turn = calls_from_openai(openai_reply(openai_call("c1", "read_incident", READ)), TOOLS)

    class Opaque:
        def __repr__(self) -> str:
            raise RuntimeError("no repr")

    odd = {"ratio": math.inf, "tags": {"a"}, (1, 2): "pair"}
    content = openai_tool_messages(turn, [Result(Kind.SUCCESS, odd)])[0]["content"]
    opaque = openai_tool_messages(turn, [Result(Kind.SUCCESS, Opaque())])[0]["content"]

    assert json.loads(content) == {"ratio": "inf", "tags": "{'a'}", "(1, 2)": "pair"}
    assert json.loads(opaque) == "<Opaque that cannot be shown>"


def test_more_results_than_calls_is_the_applications_mistake() -> None:
    turn = calls_from_openai(openai_reply(openai_call("c1", "read_incident", READ)), TOOLS)

    with pytest.raises(ValueError, match="2 results for 1 calls"):
        openai_tool_messages(turn, [Result(Kind.SUCCESS), Result(Kind.SUCCESS)])
    with pytest.raises(TypeError):
        anthropic_tool_results(turn, "SUCCESS")


def test_a_malformed_turn_still_answers_every_id_it_found() -> None:
    reply = openai_reply(
        openai_call("call_1", "read_incident", READ),
        {"type": "function", "function": {"name": "read_incident", "arguments": "{}"}},
        openai_call("call_3", "drop_table", "{}"),
    )
    turn = calls_from_openai(reply, TOOLS)

    assert turn.problem == "tool call 2 has no id"
    assert [m["tool_call_id"] for m in openai_tool_messages(turn, None)] == ["call_1", "call_3"]
