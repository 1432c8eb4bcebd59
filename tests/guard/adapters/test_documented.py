"""The documented example of docs/guard.md runs as written."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from guard import Reason, State

from ..support import Clock, make_guard
from .wire import (
    GUIDE,
    NOTICE,
    READ,
    Desk,
    assert_every_openai_call_is_answered,
    openai_call,
    openai_reply,
)

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
