"""The smallest guarded agent: a hand-written loop over the official ``openai`` client.

The loop (:func:`guarded_chat_loop`) is the example: Chat Completions tool calls read with
``guard.adapters``, each model call and each tool call asked of the guard first. It runs
against a scripted OpenAI-compatible server on localhost (``http.server`` in a thread
answering ``/v1/chat/completions``), so the real client sends real HTTP requests; only the
model's replies are scripted.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

openai = pytest.importorskip("openai")

from guard import Guard, Kind, Limits, Nudge, Report, Result  # noqa: E402
from guard.adapters import ToolSpec, calls_from_openai, openai_tool_messages  # noqa: E402
from guard.steps import Action  # noqa: E402

from ..support import Shop  # noqa: E402

LIMITS = Limits(deadline_ms=60_000, model_calls=8, requests=8, executions=6, same=2, stagnant=3)


# -- the example ------------------------------------------------------------------------


def guarded_chat_loop(
    client: Any,
    guard: Guard,
    functions: Mapping[str, Callable[..., Any]],
    specs: Mapping[str, ToolSpec],
    messages: list[dict[str, Any]],
    schemas: list[dict[str, Any]],
) -> Report:
    """Run the model with ``functions`` as its tools until the guard stops; the report."""
    while True:
        if (stop := guard.before_model()) is not None:
            return stop
        completion = client.chat.completions.create(
            model="scripted", messages=messages, tools=schemas
        )
        if completion.usage is not None:
            guard.spend_tokens(completion.usage.total_tokens)
        message = completion.choices[0].message.model_dump(exclude_none=True)
        turn = calls_from_openai(message, specs)
        if turn.finish is not None:
            return guard.finish(turn.finish, inspect=None)  # no inspector: goal_unverified
        messages.append(message)
        # enter=True: each call runs as soon as it is admitted (nothing in between), so a
        # remote guard decides its entry in the same request.
        admitted = guard.before_tools(turn.proposal, enter=True)
        if isinstance(admitted, Report):
            return admitted
        if isinstance(admitted, Nudge):
            messages += openai_tool_messages(turn, admitted)
            continue
        outcomes: list[Result | BaseException] = []
        for ticket in admitted:
            decision = guard.before_tool(ticket)
            if decision.action is Action.STOP:
                break  # the calls left are answered "not run: the task stopped"
            if decision.action is Action.REUSE:
                outcome: Result | BaseException = decision.result or Result(Kind.SUCCESS)
                guard.after_tool(ticket, outcome, inspect=None)
            else:
                try:
                    outcome = Result(Kind.SUCCESS, functions[ticket.call.tool](**ticket.call.args))
                    guard.after_tool(ticket, outcome, inspect=None)
                except Exception as exc:
                    outcome = exc
                    guard.after_tool(ticket, error=exc, inspect=None)
            outcomes.append(outcome)
        messages += openai_tool_messages(turn, outcomes)
        if guard.report is not None:
            return guard.report


# -- a scripted model server ------------------------------------------------------------


class ScriptedServer:
    """An OpenAI-compatible Chat Completions endpoint answering with scripted messages."""

    def __init__(self, replies: list[dict[str, Any]]) -> None:
        self.replies = list(replies)
        self.requests: list[dict[str, Any]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(length))
                if self.path != "/v1/chat/completions" or not server.replies:
                    self.send_error(404 if server.replies else 500, "no scripted reply")
                    return
                server.requests.append(body)
                message = server.replies.pop(0)
                reply = {
                    "id": f"chatcmpl-{len(server.requests)}",
                    "object": "chat.completion",
                    "created": 0,
                    "model": "scripted",
                    "choices": [
                        {
                            "index": 0,
                            "finish_reason": "tool_calls" if "tool_calls" in message else "stop",
                            "message": {"role": "assistant", "content": None, **message},
                        }
                    ],
                    "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
                }
                data = json.dumps(reply).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass  # keep the test output clean

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}/v1"

    def __enter__(self) -> ScriptedServer:
        threading.Thread(target=self.http.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.http.shutdown()
        self.http.server_close()


def tool_calls(*calls: tuple[str, str, dict[str, Any]]) -> dict[str, Any]:
    return {
        "tool_calls": [
            {
                "id": call_id,
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(args)},
            }
            for call_id, name, args in calls
        ]
    }


SPECS = {
    "find_order": ToolSpec("read"),
    "send_refund": ToolSpec("write", lambda args: f"refund-order-{args['order']}"),
}
SCHEMAS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "parameters": {"type": "object", "properties": {"order": {"type": "integer"}}},
        },
    }
    for name in SPECS
]


@pytest.fixture
def shop() -> Shop:
    return Shop()


def run(
    shop: Shop, replies: list[dict[str, Any]], limits: Limits = LIMITS
) -> tuple[Report, ScriptedServer]:
    functions = {"find_order": shop.find_order, "send_refund": shop.send_refund}
    with ScriptedServer(replies) as server:
        client = openai.OpenAI(base_url=server.url, api_key="test-key", max_retries=0)
        messages = [{"role": "user", "content": "Refund order 42"}]
        report = guarded_chat_loop(client, Guard(limits), functions, SPECS, messages, SCHEMAS)
    return report, server


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    # The scripted server is on loopback: a proxy from the environment must not intercept.
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")


def test_a_plain_loop_reads_writes_once_and_ends_with_the_report(shop: Shop):
    replies = [
        tool_calls(("c1", "find_order", {"order": 42})),
        tool_calls(("c2", "send_refund", {"order": 42})),
        tool_calls(("c3", "send_refund", {"order": 42})),
        {"content": "Order 42 is refunded."},
    ]

    report, server = run(shop, replies)

    assert (report.state, report.reason) == ("PARTIAL", "goal_unverified")
    assert shop.refunds == [42]  # the second request for the same refund reused its result
    assert (report.model_calls, report.requests, report.executions) == (4, 3, 2)
    assert report.tokens == 60
    last = server.requests[-1]["messages"]
    answers = [m["content"] for m in last if m["role"] == "tool"]
    # The second refund is handed the first one's stored answer: refund 1, not a refund 2.
    assert answers == ['"order 42: delivered, 30 EUR"', *['"refund 1 sent for order 42"'] * 2]


def test_a_plain_loop_repeating_one_call_is_stopped_same_call_before_it_runs_again(shop: Shop):
    replies = [tool_calls((f"c{n}", "find_order", {"order": 42})) for n in range(5)]

    report, server = run(shop, replies)

    assert (report.state, report.reason) == ("PARTIAL", "same_call")
    assert shop.lookups == [42, 42]
    assert len(server.requests) == 3 and len(server.replies) == 2


def test_a_plain_loop_stops_at_the_model_budget_before_another_request(shop: Shop):
    replies = [tool_calls((f"c{n}", "find_order", {"order": n})) for n in range(4)]

    report, server = run(shop, replies, Limits(model_calls=2))

    assert (report.state, report.reason) == ("PARTIAL", "model_budget")
    assert len(server.requests) == 2
