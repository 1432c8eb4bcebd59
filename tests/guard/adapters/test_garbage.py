"""Garbage never raises: whatever a model returns, the adapters describe it and the guard
refuses it for the right reason."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from hypothesis import example, given
from hypothesis import strategies as st

from guard import Finish, Guard, Kind, Limits, Nudge, Reason, Report, Result
from guard.adapters import (
    Turn,
    anthropic_tool_results,
    calls_from_anthropic,
    calls_from_openai,
    openai_tool_messages,
)

from ..support import property_settings
from .wire import TOOLS, notice_key, openai_call, openai_reply, text, tool_use

# -- garbage never raises -----------------------------------------------------------------

PROPERTY = property_settings(300)

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
