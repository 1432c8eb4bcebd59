"""Reading replies: a model's reply becomes the guard's calls, with the model's ids."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pytest

from guard import Call, Evidence, Finish, Kind, Limits, Reason, Result
from guard.adapters import (
    ToolSpec,
    Turn,
    calls_from_anthropic,
    calls_from_openai,
    openai_tool_messages,
    tool_effects,
)

from ..support import Clock, Executor, Inspector, Planner, Script, make_guard
from .wire import (
    NOTICE,
    READ,
    TOOLS,
    executed,
    notice_key,
    openai_call,
    openai_reply,
    text,
    tool_use,
)

# -- reading replies ----------------------------------------------------------------------


def test_an_openai_reply_becomes_the_guards_calls_with_the_models_ids() -> None:
    reply = openai_reply(
        openai_call("call_read", "read_incident", READ),
        openai_call("call_send", "send_notice", NOTICE),
        content="Reading, then notifying.",
    )

    turn = calls_from_openai(reply, TOOLS)

    assert turn.problem is None
    assert turn.finish is None
    assert turn.call_ids == ("call_read", "call_send")
    assert turn.calls == (
        Call("read_incident", READ),
        Call("send_notice", NOTICE, effect="write", operation_key="incident-42-first-notice"),
    )
    assert turn.proposal == list(turn.calls)


def test_an_anthropic_reply_becomes_the_guards_calls_with_the_models_ids() -> None:
    content = [
        {"type": "thinking", "thinking": "First the incident.", "signature": "sig"},
        text("Let me look."),
        tool_use("toolu_read", "read_incident", READ),
        tool_use("toolu_send", "send_notice", NOTICE),
    ]

    turn = calls_from_anthropic(content, TOOLS)

    assert turn.problem is None
    assert turn.call_ids == ("toolu_read", "toolu_send")
    assert [call.tool for call in turn.calls] == ["read_incident", "send_notice"]
    assert turn.calls[1].operation_key == "incident-42-first-notice"


def test_a_writes_operation_key_comes_from_the_application_not_the_call_id() -> None:
    seen: list[Mapping[str, Any]] = []

    def key(args: Mapping[str, Any]) -> str:
        seen.append(args)
        return f"refund-{args['order']}"

    tools = {"refund": ToolSpec("write", key)}
    first = calls_from_openai(openai_reply(openai_call("call_1", "refund", {"order": 7})), tools)
    again = calls_from_anthropic([tool_use("toolu_9", "refund", {"order": 7})], tools)

    assert seen == [{"order": 7}, {"order": 7}]
    assert first.calls[0].operation_key == again.calls[0].operation_key == "refund-7"
    assert "call_1" not in first.calls[0].operation_key
    assert "toolu_9" not in again.calls[0].operation_key


def test_a_key_function_cannot_change_the_arguments_it_names() -> None:
    def meddling(args: Mapping[str, Any]) -> str:
        args["incident"] = 0  # type: ignore[index]
        return "incident-0-first-notice"

    tools = {"send_notice": ToolSpec("write", meddling)}
    turn = calls_from_anthropic([tool_use("toolu_1", "send_notice", NOTICE)], tools)

    assert turn.calls[0].args == NOTICE
    assert turn.problem is not None and "TypeError" in turn.problem
    assert executed(turn)[0].reason is Reason.MISSING_OPERATION_KEY


@pytest.mark.parametrize(
    "reply",
    [
        openai_reply(content="All done."),
        {"role": "assistant", "content": "All done.", "tool_calls": None},
        {"role": "assistant", "content": "All done.", "tool_calls": []},
        {"role": "assistant", "content": "All done.", "function_call": None},
    ],
    ids=["no tool_calls", "null tool_calls", "empty tool_calls", "null function_call"],
)
def test_an_openai_reply_without_tool_calls_finishes_with_its_content(reply: Any) -> None:
    turn = calls_from_openai(reply, TOOLS)

    assert turn == Turn(finish=Finish("All done."))
    assert turn.proposal == Finish("All done.")


def test_an_anthropic_reply_without_tool_use_finishes_with_its_text() -> None:
    content = [text("The notice "), {"type": "thinking", "thinking": "..."}, text("is sent.")]

    assert calls_from_anthropic(content, TOOLS).proposal == Finish("The notice is sent.")
    assert calls_from_anthropic([], TOOLS).proposal == Finish(None)


def test_parallel_calls_keep_their_order_and_ids_through_the_guard() -> None:
    asked = [("call_c", 3), ("call_a", 1), ("call_b", 2)]
    reply = openai_reply(*(openai_call(i, "read_incident", {"incident": n}) for i, n in asked))
    turn = calls_from_openai(reply, TOOLS)
    script = Script(
        Planner(turn.proposal, Finish()),
        Executor(lambda call: Result(Kind.SUCCESS, {"incident": call.args["incident"]})),
        Inspector(Evidence(0, False)),
    )

    script.run(make_guard(Clock(), Limits(stagnant=10)))
    observation = script.plan.observations[1]
    messages = openai_tool_messages(turn, observation)

    assert [call.args["incident"] for call in script.execute.calls] == [3, 1, 2]
    assert turn.call_ids == ("call_c", "call_a", "call_b")
    assert [m["tool_call_id"] for m in messages] == list(turn.call_ids)
    assert [json.loads(m["content"]) for m in messages] == [{"incident": n} for n in (3, 1, 2)]


def test_reading_a_stored_reply_again_gives_the_same_turn() -> None:
    reply = openai_reply(
        openai_call("call_1", "read_incident", READ),
        openai_call("call_2", "send_notice", NOTICE),
    )
    stored = json.loads(json.dumps(reply))

    assert calls_from_openai(stored, TOOLS) == calls_from_openai(reply, TOOLS)


def test_tool_specs_are_checked_when_the_application_defines_them() -> None:
    with pytest.raises(ValueError, match="needs an operation_key"):
        ToolSpec("write")
    with pytest.raises(ValueError, match="only a write"):
        ToolSpec("read", notice_key)
    with pytest.raises(ValueError, match="'read' or 'write'"):
        ToolSpec("delete")
    assert tool_effects(TOOLS) == {"read_incident": "read", "send_notice": "write"}
