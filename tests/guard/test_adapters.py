"""The adapters between model APIs and the guard (``guard.adapters``).

A model's reply, as the OpenAI Chat Completions or Anthropic Messages JSON, becomes the
guard's calls; whatever is malformed in it is refused by the guard for the right reason
before anything runs; and every call is answered afterwards in the form the API requires.
Nothing here needs Django or the database.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from guard import (
    Call,
    Evidence,
    Finish,
    Guard,
    Kind,
    Limits,
    MalformedModelOutput,
    Nudge,
    Reason,
    Report,
    Result,
    State,
    ToolSpec,
    Turn,
    anthropic_tool_results,
    calls_from_anthropic,
    calls_from_openai,
    openai_tool_messages,
    tool_effects,
)

from .support import Clock, Executor, Inspector, Notices, Planner, Script, make_guard

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guard.md"
NOT_RUN = "not run: the task stopped"


def notice_key(args: Mapping[str, Any]) -> str:
    """The application's name for the business action: one first notice per incident."""
    return f"incident-{args['incident']}-first-notice"


TOOLS = {
    "read_incident": ToolSpec("read"),
    "send_notice": ToolSpec("write", notice_key),
}


# -- the two wire formats -----------------------------------------------------------------


def openai_call(call_id: str, name: str, arguments: Any) -> dict[str, Any]:
    """One entry of ``tool_calls``; a mapping as arguments is sent as JSON text."""
    text = json.dumps(arguments) if isinstance(arguments, Mapping) else arguments
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": text}}


def openai_reply(*calls: dict[str, Any], content: Any = None) -> dict[str, Any]:
    """An assistant message as the Chat Completions API returns it."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = list(calls)
    return message


def tool_use(call_id: str, name: str, args: Any) -> dict[str, Any]:
    """An Anthropic ``tool_use`` block."""
    return {"type": "tool_use", "id": call_id, "name": name, "input": args}


def text(words: str) -> dict[str, Any]:
    """An Anthropic ``text`` block."""
    return {"type": "text", "text": words}


READ = {"incident": 42}
NOTICE = {"incident": 42, "text": "We are on it."}


def executed(turn: Turn, **options: Any) -> tuple[Report, Executor]:
    """Drive a guard whose planner returns ``turn.proposal``; nothing is expected to run."""
    script = Script(
        Planner(lambda observation: turn.proposal),
        Executor(Result(Kind.SUCCESS)),
        Inspector(Evidence(0, False)),
    )
    report = script.run(make_guard(Clock(), **options))
    return report, script.execute


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
    script = Script(
        Planner(good.proposal, Finish()), Executor(notices.send), Inspector(notices.inspect)
    )

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


# -- answering every call -----------------------------------------------------------------


def two_calls() -> Turn:
    return calls_from_openai(
        openai_reply(
            openai_call("call_read", "read_incident", READ),
            openai_call("call_send", "send_notice", NOTICE),
        ),
        TOOLS,
    )


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


# -- whole conversations under the guard --------------------------------------------------


class Desk:
    """The business system: incidents to read, and notices recorded by operation key."""

    def __init__(self) -> None:
        self.notices = Notices()
        self.reads = 0

    def execute(self, call: Call) -> Result:
        if call.tool == "read_incident":
            self.reads += 1
            return Result(Kind.SUCCESS, {"incident": call.args["incident"], "title": "Disk full"})
        return self.notices.send(call)

    def inspect(self, result: Result | None, subject: Call | Finish) -> Evidence:
        """Progress is the notice on record; the goal is met when the model then finishes."""
        sent = "incident-42-first-notice" in self.notices.sent
        if isinstance(subject, Finish):
            return Evidence(int(sent), sent)
        committed = None
        if subject.effect == "write":
            committed = subject.operation_key in self.notices.sent
        return Evidence(int(sent), False, committed=committed)


class OpenAIAgent:
    """A planner over a scripted chat model, keeping the conversation the API would see."""

    def __init__(self, *replies: dict[str, Any]) -> None:
        self.replies = list(replies)
        self.messages: list[dict[str, Any]] = [{"role": "user", "content": "Notify incident 42."}]
        self.turn: Turn | None = None

    def __call__(self, observation: Any) -> Any:
        if self.turn is not None:
            self.messages += openai_tool_messages(self.turn, observation)
        reply = self.replies.pop(0)
        self.messages.append(reply)
        self.turn = calls_from_openai(reply, TOOLS)
        return self.turn.proposal


class AnthropicAgent:
    """The same over a scripted Messages model."""

    def __init__(self, *replies: list[dict[str, Any]]) -> None:
        self.replies = list(replies)
        self.messages: list[dict[str, Any]] = [{"role": "user", "content": "Notify incident 42."}]
        self.turn: Turn | None = None

    def __call__(self, observation: Any) -> Any:
        if self.turn is not None:
            self.messages.append(
                {"role": "user", "content": anthropic_tool_results(self.turn, observation)}
            )
        content = self.replies.pop(0)
        self.messages.append({"role": "assistant", "content": content})
        self.turn = calls_from_anthropic(content, TOOLS)
        return self.turn.proposal


def assert_every_openai_call_is_answered(messages: list[dict[str, Any]]) -> None:
    """The API's rule: the tool messages after an assistant message answer its calls in order."""
    for index, message in enumerate(messages):
        if message["role"] == "assistant" and message.get("tool_calls"):
            ids = [call["id"] for call in message["tool_calls"]]
            answers = messages[index + 1 : index + 1 + len(ids)]
            assert [(m["role"], m["tool_call_id"]) for m in answers] == [("tool", i) for i in ids]


def assert_every_anthropic_call_is_answered(messages: list[dict[str, Any]]) -> None:
    """The API's rule: the next user message starts with a tool_result for each tool_use."""
    for index, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        ids = [b["id"] for b in message["content"] if b.get("type") == "tool_use"]
        if ids:
            answer = messages[index + 1]
            assert answer["role"] == "user"
            assert [b["tool_use_id"] for b in answer["content"]] == ids


def test_an_openai_agent_completes_under_the_guard_with_every_call_answered() -> None:
    desk = Desk()
    agent = OpenAIAgent(
        openai_reply(openai_call("call_r", "read_incident", READ)),
        openai_reply(openai_call("call_s", "send_notice", NOTICE)),
        openai_reply(content="Incident 42 is notified."),
    )

    report = make_guard(Clock()).run(agent, desk.execute, desk.inspect)

    assert (report.state, report.reason) == (State.COMPLETED, Reason.GOAL_MET)
    assert list(desk.notices.sent) == ["incident-42-first-notice"]
    assert_every_openai_call_is_answered(agent.messages)
    assert json.loads(agent.messages[-2]["content"]) == {"notice_id": "n-1"}


def test_an_anthropic_agent_completes_under_the_guard_with_every_call_answered() -> None:
    desk = Desk()
    agent = AnthropicAgent(
        [text("Looking."), tool_use("toolu_r", "read_incident", READ)],
        [tool_use("toolu_s", "send_notice", NOTICE), tool_use("toolu_r2", "read_incident", READ)],
        [text("Incident 42 is notified.")],
    )

    report = make_guard(Clock()).run(agent, desk.execute, desk.inspect)

    assert (report.state, report.reason) == (State.COMPLETED, Reason.GOAL_MET)
    assert list(desk.notices.sent) == ["incident-42-first-notice"]
    assert_every_anthropic_call_is_answered(agent.messages)


def test_a_nudge_answers_every_call_of_the_repeated_turn() -> None:
    desk = Desk()
    repeat = openai_reply(
        openai_call("call_a", "read_incident", READ),
        openai_call("call_b", "read_incident", {"incident": 7}),
    )
    agent = OpenAIAgent(
        repeat,
        {**repeat, "tool_calls": [{**c, "id": c["id"] + "2"} for c in repeat["tool_calls"]]},
        {**repeat, "tool_calls": [{**c, "id": c["id"] + "3"} for c in repeat["tool_calls"]]},
        openai_reply(openai_call("call_s", "send_notice", NOTICE)),
        openai_reply(content="Notified."),
    )

    limits = Limits(stagnant=10, max_period=1)  # repeats only: no cycle detection
    report = make_guard(Clock(), limits, nudge=True).run(agent, desk.execute, desk.inspect)

    assert (report.state, report.reason) == (State.COMPLETED, Reason.GOAL_MET)
    nudged = [
        m
        for m in agent.messages
        if m["role"] == "tool" and m["tool_call_id"] in ("call_a3", "call_b3")
    ]
    assert len(nudged) == 2
    assert all("Do not repeat it" in m["content"] for m in nudged)
    assert_every_openai_call_is_answered(agent.messages)


def test_after_a_stop_the_last_turn_is_answered_with_what_ran() -> None:
    # Step by step, the way another framework drives the guard: the first call fails for
    # good, the guard stops, the second call never runs — and both are answered.
    guard = make_guard(Clock())
    turn = two_calls()
    assert guard.before_model() is None
    tickets = guard.before_tools(turn.proposal)
    assert isinstance(tickets, list)
    results: list[Result | None] = [None] * len(tickets)
    for ticket in tickets:
        decision = guard.before_tool(ticket)
        if decision.report is not None:
            break
        results[ticket.index] = result = Result(Kind.FATAL, "incident archived")
        if guard.after_tool(ticket, result, inspect=lambda r, s: Evidence(0, False)):
            break

    messages = openai_tool_messages(turn, results)

    assert guard.report is not None and guard.report.reason is Reason.FATAL
    assert [m["tool_call_id"] for m in messages] == ["call_read", "call_send"]
    assert json.loads(messages[0]["content"]) == {"kind": "FATAL", "data": "incident archived"}
    assert messages[1]["content"] == NOT_RUN


# -- the documented example ---------------------------------------------------------------


def documented_planner() -> type:
    """The OpenAI planner printed in docs/guard.md, executed as printed."""
    blocks = re.findall(r"^```python\n(.*?)^```", GUIDE.read_text(encoding="utf-8"), re.S | re.M)
    found = [block for block in blocks if "class OpenAIPlanner" in block]
    assert len(found) == 1, "docs/guard.md must hold exactly one OpenAIPlanner block"
    namespace: dict[str, Any] = {}
    exec(compile(found[0], str(GUIDE), "exec"), namespace)  # noqa: S102 - our own docs
    planner: type = namespace["OpenAIPlanner"]
    return planner


class ScriptedClient:
    """Stands for the OpenAI SDK: ``chat.completions.create`` returns the next reply."""

    def __init__(self, *replies: dict[str, Any]) -> None:
        self.replies = list(replies)
        self.requests: list[dict[str, Any]] = []
        self.chat = SimpleNamespace(completions=SimpleNamespace(create=self.create))

    def create(self, **request: Any) -> Any:
        self.requests.append(json.loads(json.dumps(request)))  # what went over the wire
        reply = self.replies.pop(0)
        message = SimpleNamespace(model_dump=lambda exclude_none=False: reply)
        return SimpleNamespace(choices=[SimpleNamespace(message=message)])


def test_the_documented_openai_planner_runs_under_the_guard() -> None:
    desk = Desk()
    client = ScriptedClient(
        openai_reply(
            openai_call("call_r", "read_incident", READ),
            openai_call("call_s", "send_notice", NOTICE),
        ),
        openai_reply(content="Done."),
    )
    plan: Callable[[Any], Any] = documented_planner()(client, "a-model", [], "Notify 42.")

    report = make_guard(Clock()).run(plan, desk.execute, desk.inspect)

    assert (report.state, report.reason) == (State.COMPLETED, Reason.GOAL_MET)
    assert list(desk.notices.sent) == ["incident-42-first-notice"]
    last_request = client.requests[-1]["messages"]
    assert_every_openai_call_is_answered(last_request)
    assert [m["tool_call_id"] for m in last_request if m["role"] == "tool"] == ["call_r", "call_s"]


# -- garbage never raises -----------------------------------------------------------------

PROPERTY = settings(
    max_examples=300,
    deadline=None,
    derandomize=True,  # the same examples on every run: CI never turns red by chance
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()  # NaN and infinities included
    | st.text(max_size=12)
)
WORDS = st.sampled_from(
    ["id", "type", "function", "name", "arguments", "input", "text", "tool_use", "incident"]
)
JSONISH = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(WORDS | st.text(max_size=6), inner, max_size=5)
    ),
    max_leaves=25,
)
TOOL_NAMES = st.sampled_from([*TOOLS, "drop_table"])
CALL_IDS = st.sampled_from([f"call_{n}" for n in range(30)])  # now and then two share one
OBJECTS = st.fixed_dictionaries(
    {"incident": SCALARS}, optional={"text": SCALARS}
) | st.dictionaries(WORDS, JSONISH, max_size=3)
DELETE = object()


def spoiled(draw: st.DrawFn, value: Any) -> Any:
    """``value`` with up to three of its parts replaced by garbage or deleted."""
    for _ in range(draw(st.integers(0, 3))):
        paths = list(_paths(value))[1:]  # the whole of it is spoiled by plain garbage
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        garbage = draw(JSONISH | st.just(DELETE) | st.sampled_from(["", "{", "[]", "NaN"]))
        value = _replace(value, path, garbage)
    return value


def _paths(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield path
    if isinstance(value, dict | list):
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for key, item in items:
            yield from _paths(item, (*path, key))


def _replace(value: Any, path: tuple[Any, ...], garbage: Any) -> Any:
    if not path:
        return None if garbage is DELETE else garbage
    head, rest = path[0], path[1:]
    copy = dict(value) if isinstance(value, dict) else list(value)
    if not rest and garbage is DELETE:
        del copy[head]
    else:
        copy[head] = _replace(value[head], rest, garbage)
    return copy


@st.composite
def openai_replies(draw: st.DrawFn) -> Any:
    """Replies as the API sends them, then spoiled in a few places; or plain garbage."""
    if draw(st.integers(0, 9)) == 0:
        return draw(JSONISH)
    calls = [
        openai_call(draw(CALL_IDS), draw(TOOL_NAMES), json.dumps(draw(OBJECTS)))
        for _ in range(draw(st.integers(0, 4)))
    ]
    return spoiled(draw, openai_reply(*calls, content=draw(st.none() | st.text(max_size=10))))


@st.composite
def anthropic_contents(draw: st.DrawFn) -> Any:
    """Content as the API sends it, then spoiled in a few places; or plain garbage."""
    if draw(st.integers(0, 9)) == 0:
        return draw(JSONISH)
    blocks = [
        tool_use(draw(CALL_IDS), draw(TOOL_NAMES), draw(OBJECTS))
        if draw(st.booleans())
        else text(draw(st.text(max_size=10)))
        for _ in range(draw(st.integers(0, 4)))
    ]
    return spoiled(draw, blocks)


REFUSALS = {Reason.BAD_CALL, Reason.BAD_ARGS, Reason.MISSING_OPERATION_KEY}


def assert_safe(turn: Turn) -> None:
    """A turn the guard may only run if it is well formed; every id found is answerable."""
    assert isinstance(turn, Turn)
    assert len(set(turn.call_ids)) == len(turn.call_ids)
    assert all(isinstance(i, str) and i for i in turn.call_ids)
    guard = Guard(Limits(requests=100, executions=100, same=100, max_period=1), now=lambda: 0)
    assert guard.before_model() is None
    proposal = turn.proposal
    if isinstance(proposal, Finish):
        assert turn.problem is None and not turn.calls
    else:
        admitted = guard.before_tools(proposal)
        if turn.problem is not None:
            # Refused whole. The guard checks the calls in order, so two writes of one
            # incident with other input, before the malformed call, are found first.
            assert isinstance(admitted, Report)
            assert admitted.reason in REFUSALS | {Reason.OPERATION_CONFLICT}
            assert admitted.executions == 0
        elif isinstance(admitted, Report):  # two writes of one incident with other input
            assert admitted.reason is Reason.OPERATION_CONFLICT
        else:
            assert isinstance(admitted, list) and len(admitted) == len(turn.call_ids)
            for ticket in admitted:
                assert isinstance(ticket.call.tool, str)
                assert ticket.call.effect == TOOLS[ticket.call.tool].effect
                if ticket.call.effect == "write":
                    assert ticket.call.operation_key == notice_key(ticket.call.args)
    results = [Result(Kind.SUCCESS, {"n": n}) for n in range(len(turn.call_ids))]
    for answer in (openai_tool_messages(turn, results), anthropic_tool_results(turn, None)):
        assert len(answer) == len(turn.call_ids)
    assert openai_tool_messages(turn, Nudge("stop", "t", "fp", Reason.SAME_CALL)) is not None


def _call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


@PROPERTY
@given(openai_replies())
@example(  # found by a random run: a conflict between two writes before a malformed call
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            _call("call_0", "send_notice", '{"incident": false}'),
            _call("call_1", "send_notice", '{"incident": false, "text": null}'),
            _call("call_2", "read_incident", '{"incident": Infinity}'),
        ],
    }
)
def test_no_openai_reply_makes_the_adapter_raise_or_run_what_it_should_not(reply: Any) -> None:
    assert_safe(calls_from_openai(reply, TOOLS))


@PROPERTY
@given(anthropic_contents())
def test_no_anthropic_reply_makes_the_adapter_raise_or_run_what_it_should_not(
    content: Any,
) -> None:
    assert_safe(calls_from_anthropic(content, TOOLS))
