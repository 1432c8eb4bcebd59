"""Whole conversations under the guard, for both APIs, every call answered."""

from __future__ import annotations

import json
from typing import Any

from guard import Evidence, Kind, Limits, Reason, Result, State
from guard.adapters import (
    Turn,
    anthropic_tool_results,
    calls_from_anthropic,
    calls_from_openai,
    openai_tool_messages,
)

from ..support import Clock, make_guard
from .wire import (
    NOT_RUN,
    NOTICE,
    READ,
    TOOLS,
    Desk,
    assert_every_openai_call_is_answered,
    openai_call,
    openai_reply,
    text,
    tool_use,
    two_calls,
)

# -- whole conversations under the guard --------------------------------------------------


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
