"""What the adapter tests share: the application's tools and both APIs' wire formats."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from guard import Call, Evidence, Finish, Kind, Report, Result
from guard.adapters import ToolSpec, Turn, calls_from_openai

from ..support import Clock, Executor, Inspector, Notices, Planner, Script, make_guard

__all__ = [
    "GUIDE",
    "NOTICE",
    "NOT_RUN",
    "READ",
    "TOOLS",
    "Desk",
    "assert_every_openai_call_is_answered",
    "executed",
    "notice_key",
    "openai_call",
    "openai_reply",
    "text",
    "tool_use",
    "two_calls",
]

GUIDE = Path(__file__).resolve().parents[3] / "docs" / "guard.md"
NOT_RUN = "not run: the task stopped"


def notice_key(args: Mapping[str, Any]) -> str:
    """The application's name for the business action: one first notice per incident."""
    return f"incident-{args['incident']}-first-notice"


TOOLS = {
    "read_incident": ToolSpec("read"),
    "send_notice": ToolSpec("write", notice_key),
}


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


def two_calls() -> Turn:
    return calls_from_openai(
        openai_reply(
            openai_call("call_read", "read_incident", READ),
            openai_call("call_send", "send_notice", NOTICE),
        ),
        TOOLS,
    )


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


def assert_every_openai_call_is_answered(messages: list[dict[str, Any]]) -> None:
    """The API's rule: the tool messages after an assistant message answer its calls in order."""
    for index, message in enumerate(messages):
        if message["role"] == "assistant" and message.get("tool_calls"):
            ids = [call["id"] for call in message["tool_calls"]]
            answers = messages[index + 1 : index + 1 + len(ids)]
            assert [(m["role"], m["tool_call_id"]) for m in answers] == [("tool", i) for i in ids]
