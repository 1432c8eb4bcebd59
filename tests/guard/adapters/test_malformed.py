"""Malformed model output ends in the right stop, before anything runs."""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from guard import Finish, Reason, State
from guard.adapters import (
    MalformedModelOutput,
    ToolSpec,
    calls_from_anthropic,
    calls_from_openai,
    tool_effects,
)

from ..support import Clock, Notices, make_guard
from .wire import NOTICE, READ, TOOLS, executed, openai_call, openai_reply, text, tool_use

# -- malformed output ends in the right stop, before anything runs ----------------------


def raising_key(args: Mapping[str, Any]) -> str:
    raise KeyError("incident")


MALFORMED_OPENAI: list[tuple[str, Any, Reason, str, str]] = [
    # (case, reply, reason, in turn.problem, the stop report's detail)
    (
        "arguments not JSON",
        openai_reply(openai_call("call_1", "read_incident", '{"incident": 42')),
        Reason.BAD_CALL,
        "arguments of read_incident are not valid JSON",
        "args of read_incident is str, not an object",
    ),
    (
        "arguments a JSON list",
        openai_reply(openai_call("call_1", "read_incident", "[42]")),
        Reason.BAD_CALL,
        "arguments of read_incident are a list, not an object",
        "args of read_incident is list, not an object",
    ),
    (
        "arguments missing",
        openai_reply({"id": "call_1", "type": "function", "function": {"name": "read_incident"}}),
        Reason.BAD_CALL,
        "arguments of read_incident are null, not JSON text",
        "args of read_incident is NoneType, not an object",
    ),
    (
        "arguments empty",
        openai_reply(openai_call("call_1", "read_incident", "")),
        Reason.BAD_CALL,
        "arguments of read_incident are not valid JSON",
        "args of read_incident is str, not an object",
    ),
    (
        "no name",
        openai_reply({"id": "call_1", "type": "function", "function": {"arguments": "{}"}}),
        Reason.BAD_CALL,
        "tool call 1 has no tool name",
        "tool None is not a non-empty string",
    ),
    (
        "empty name",
        openai_reply(openai_call("call_1", "", "{}")),
        Reason.BAD_CALL,
        "tool call 1 has no tool name",
        "tool '' is not a non-empty string",
    ),
    (
        "a name that is not text",
        openai_reply(openai_call("call_1", ["read_incident"], "{}")),
        Reason.BAD_CALL,
        "tool call 1 names its tool with a list, not text",
        "tool None is not a non-empty string",
    ),
    (
        "no function",
        openai_reply({"id": "call_1", "type": "function"}),
        Reason.BAD_CALL,
        "tool call 1 has no function",
        "tool None is not a non-empty string",
    ),
    (
        "unknown tool",
        openai_reply(openai_call("call_1", "drop_table", {"table": "incidents"})),
        Reason.BAD_CALL,
        "there is no tool named 'drop_table'",
        "effect None of drop_table is neither 'read' nor 'write'",
    ),
    (
        "tool_calls an object",
        {"role": "assistant", "tool_calls": openai_call("call_1", "read_incident", READ)},
        Reason.BAD_CALL,
        "tool_calls is an object, not a list",
        "MalformedModelOutput is not a Call",
    ),
    (
        "tool_calls text",
        {"role": "assistant", "tool_calls": "read_incident(42)"},
        Reason.BAD_CALL,
        "tool_calls is text, not a list",
        "MalformedModelOutput is not a Call",
    ),
    (
        "a call that is not an object",
        openai_reply(openai_call("call_1", "read_incident", READ), "read_incident"),
        Reason.BAD_CALL,
        "tool call 2 is text, not an object",
        "MalformedModelOutput is not a Call",
    ),
    (
        "a call without an id",
        openai_reply(
            {"type": "function", "function": {"name": "read_incident", "arguments": "{}"}}
        ),
        Reason.BAD_CALL,
        "tool call 1 has no id",
        "MalformedModelOutput is not a Call",
    ),
    (
        "two calls with one id",
        openai_reply(
            openai_call("call_1", "read_incident", {"incident": 1}),
            openai_call("call_1", "read_incident", {"incident": 2}),
        ),
        Reason.BAD_CALL,
        "two tool calls share the id 'call_1'",
        "MalformedModelOutput is not a Call",
    ),
    (
        "a call of another type",
        openai_reply({"id": "call_1", "type": "custom", "custom": {"name": "x", "input": "y"}}),
        Reason.BAD_CALL,
        "tool call 1 is of type 'custom', not 'function'",
        "MalformedModelOutput is not a Call",
    ),
    (
        "the deprecated function_call",
        {"role": "assistant", "function_call": {"name": "read_incident", "arguments": "{}"}},
        Reason.BAD_CALL,
        "function_call (the deprecated single-function form) is not supported",
        "MalformedModelOutput is not a Call",
    ),
    (
        "a message that is not an object",
        ["read_incident", {"incident": 42}],
        Reason.BAD_CALL,
        "the message is a list, not an object",
        "MalformedModelOutput is not a Call",
    ),
    (
        "NaN in the arguments",
        openai_reply(openai_call("call_1", "read_incident", '{"incident": NaN}')),
        Reason.BAD_ARGS,
        "arguments of read_incident: nan has no JSON form",
        "BadArguments: nan has no JSON form",
    ),
    (
        "a number too large for a float",
        openai_reply(openai_call("call_1", "read_incident", '{"incident": 1e999}')),
        Reason.BAD_ARGS,
        "arguments of read_incident: inf has no JSON form",
        "BadArguments: inf has no JSON form",
    ),
    (
        "arguments nested too deep",
        openai_reply(openai_call("call_1", "read_incident", '{"a": ' * 300 + "1" + "}" * 300)),
        Reason.BAD_ARGS,
        "nest deeper than 200 levels",
        "BadArguments: arguments nest deeper than 200 levels",
    ),
    (
        "a write whose key cannot be named",
        openai_reply(openai_call("call_1", "send_notice", {"text": "no incident"})),
        Reason.MISSING_OPERATION_KEY,
        "the operation key of send_notice could not be derived: KeyError: 'incident'",
        "",
    ),
]


@pytest.mark.parametrize(
    ("reply", "reason", "problem", "detail"),
    [case[1:] for case in MALFORMED_OPENAI],
    ids=[case[0] for case in MALFORMED_OPENAI],
)
def test_malformed_openai_output_stops_the_task_before_anything_runs(
    reply: Any, reason: Reason, problem: str, detail: str
) -> None:
    turn = calls_from_openai(reply, TOOLS)
    report, executor = executed(turn)

    assert turn.problem is not None
    assert problem in turn.problem
    assert report.reason is reason
    assert report.detail == detail
    assert executor.entries == 0


MALFORMED_ANTHROPIC: list[tuple[str, Any, Reason, str, str]] = [
    (
        "input that is not an object",
        [tool_use("toolu_1", "read_incident", [42])],
        Reason.BAD_CALL,
        "input of read_incident is a list, not an object",
        "args of read_incident is list, not an object",
    ),
    (
        "input missing",
        [{"type": "tool_use", "id": "toolu_1", "name": "read_incident"}],
        Reason.BAD_CALL,
        "input of read_incident is null, not an object",
        "args of read_incident is NoneType, not an object",
    ),
    (
        "no name",
        [{"type": "tool_use", "id": "toolu_1", "input": READ}],
        Reason.BAD_CALL,
        "tool call 1 has no tool name",
        "tool None is not a non-empty string",
    ),
    (
        "unknown tool",
        [text("Cleaning up."), tool_use("toolu_1", "drop_table", {"table": "incidents"})],
        Reason.BAD_CALL,
        "there is no tool named 'drop_table'",
        "effect None of drop_table is neither 'read' nor 'write'",
    ),
    (
        "content that is not a list",
        {"type": "tool_use", "id": "toolu_1", "name": "read_incident", "input": READ},
        Reason.BAD_CALL,
        "the content is an object, not a list of blocks",
        "MalformedModelOutput is not a Call",
    ),
    (
        "a block that is not an object",
        [tool_use("toolu_1", "read_incident", READ), None],
        Reason.BAD_CALL,
        "content block 2 is null, not an object",
        "MalformedModelOutput is not a Call",
    ),
    (
        "a tool_use without an id",
        [{"type": "tool_use", "name": "read_incident", "input": READ}],
        Reason.BAD_CALL,
        "tool call 1 has no id",
        "MalformedModelOutput is not a Call",
    ),
    (
        "NaN in the input",
        [tool_use("toolu_1", "read_incident", {"incident": math.nan})],
        Reason.BAD_ARGS,
        "arguments of read_incident: nan has no JSON form",
        "BadArguments: nan has no JSON form",
    ),
    (
        "a key that is not text",
        [tool_use("toolu_1", "read_incident", {42: "incident"})],
        Reason.BAD_ARGS,
        "arguments of read_incident:",
        "BadArguments: object key 42 is not a string",
    ),
    (
        "a write whose key function returns nothing",
        [tool_use("toolu_1", "send_later", NOTICE)],
        Reason.MISSING_OPERATION_KEY,
        "the operation key of send_later came out as None, not text",
        "",
    ),
    (
        "a write whose key function raises",
        [tool_use("toolu_1", "send_broken", NOTICE)],
        Reason.MISSING_OPERATION_KEY,
        "the operation key of send_broken could not be derived: KeyError: 'incident'",
        "",
    ),
]

ODD_TOOLS = {
    **TOOLS,
    "send_later": ToolSpec("write", lambda args: None),
    "send_broken": ToolSpec("write", raising_key),
}


@pytest.mark.parametrize(
    ("content", "reason", "problem", "detail"),
    [case[1:] for case in MALFORMED_ANTHROPIC],
    ids=[case[0] for case in MALFORMED_ANTHROPIC],
)
def test_malformed_anthropic_output_stops_the_task_before_anything_runs(
    content: Any, reason: Reason, problem: str, detail: str
) -> None:
    turn = calls_from_anthropic(content, ODD_TOOLS)
    report, executor = executed(turn)

    assert turn.problem is not None
    assert problem in turn.problem
    assert report.reason is reason
    assert report.detail.startswith(detail)
    assert executor.entries == 0


def test_stops_for_malformed_output_are_in_the_states_their_reasons_call_for() -> None:
    bad_call = calls_from_openai(openai_reply(openai_call("c", "drop_table", "{}")), TOOLS)
    bad_args = calls_from_openai(openai_reply(openai_call("c", "read_incident", "[NaN]")), TOOLS)
    keyless = calls_from_anthropic([tool_use("t", "send_later", NOTICE)], ODD_TOOLS)

    assert executed(bad_call)[0].state is State.FAILED
    assert executed(bad_args)[0].state is State.FAILED
    assert executed(keyless)[0].state is State.NEEDS_HUMAN


def test_one_malformed_call_stops_the_whole_model_call_before_any_of_it_runs() -> None:
    reply = openai_reply(
        openai_call("call_1", "read_incident", READ),
        openai_call("call_2", "send_notice", NOTICE),
        openai_call("call_3", "read_incident", "{oops"),
    )
    turn = calls_from_openai(reply, TOOLS)
    report, executor = executed(turn)

    assert (report.reason, executor.entries) == (Reason.BAD_CALL, 0)
    assert turn.call_ids == ("call_1", "call_2", "call_3")  # all three can still be answered


def test_the_problem_named_is_the_one_the_guard_stops_for() -> None:
    # The guard checks the shape of every call first: the unknown tool in third place is
    # its reason, not the bad arguments in first place.
    reply = openai_reply(
        openai_call("call_1", "read_incident", '{"incident": Infinity}'),
        openai_call("call_2", "send_notice", {"text": "no incident"}),
        openai_call("call_3", "drop_table", "{}"),
    )
    turn = calls_from_openai(reply, TOOLS)

    assert turn.problem == "there is no tool named 'drop_table'"
    assert executed(turn)[0].reason is Reason.BAD_CALL

    without_it = calls_from_openai(openai_reply(*reply["tool_calls"][:2]), TOOLS)
    assert without_it.problem == "arguments of read_incident: inf has no JSON form"
    assert executed(without_it)[0].reason is Reason.BAD_ARGS


def test_a_guard_told_the_tools_effects_agrees_with_the_adapter() -> None:
    notices = Notices()
    good = calls_from_openai(openai_reply(openai_call("c", "send_notice", NOTICE)), TOOLS)
    script = notices.script(good.proposal, Finish())

    script.run(make_guard(Clock(), tools=tool_effects(TOOLS)))
    unknown = calls_from_openai(openai_reply(openai_call("c", "drop_table", "{}")), TOOLS)
    report, executor = executed(unknown, tools=tool_effects(TOOLS))

    assert list(notices.sent) == ["incident-42-first-notice"]
    assert (report.reason, executor.entries) == (Reason.BAD_CALL, 0)


class Unreadable(Mapping[str, Any]):
    """A message of someone else's making that raises when it is read."""

    def __getitem__(self, key: str) -> Any:
        raise RuntimeError("the connection dropped")

    def __iter__(self) -> Iterator[str]:
        return iter(["tool_calls"])

    def __len__(self) -> int:
        return 1


def test_a_reply_that_raises_when_read_is_a_problem_not_an_exception() -> None:
    for turn in (
        calls_from_openai(Unreadable(), TOOLS),
        calls_from_anthropic([Unreadable()], TOOLS),
    ):
        assert turn.problem == "the reply could not be read: RuntimeError: the connection dropped"
        assert turn.proposal == [MalformedModelOutput(turn.problem)]
        assert executed(turn)[0].reason is Reason.BAD_CALL


def test_a_long_unknown_tool_name_is_shortened_in_the_problem_and_the_report() -> None:
    turn = calls_from_openai(openai_reply(openai_call("c", "x" * 5000, "{}")), TOOLS)

    assert turn.problem is not None and len(turn.problem) < 150
    assert len(executed(turn)[0].detail) < 200
