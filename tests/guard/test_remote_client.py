"""The Python client of the step protocol (guard/remote/), where it needs no console: what
it sends, how it retries, and that it fails closed.

The console's side is not the subject here (the live end-to-end tests drive the real one).
A console that cannot be reached is a closed port; one that never answers is a real socket
that accepts and keeps quiet; the answers the protocol describes (``docs/protocol.md``) come
from a real ``http.server`` on a local port, with stop reports made by the real guard.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

import guard
from guard import Call, Evidence, Finish, Kind, Nudge, Reason, Report, Result, State
from guard.remote import ConsoleUnreachable, ProtocolError, RemoteGuard
from guard.steps import Action, StepGuard, Ticket, fingerprint
from tests.processes import clean_environment, run_python

from .support import Clock, Sleeps, make_guard, read, scripted

TOKEN = "lg_test_token"
TOOLS = {"lookup_order": "read", "refund": "write"}
REMAINING = {
    "model_calls": 8,
    "requests": 8,
    "executions": 6,
    "tokens": None,
    "spend": None,
    "explore": 20,
    "deadline_ms": 60_000,
}
LOOKUP = Call("lookup_order", {"order": 42})
REFUND = Call("refund", {"order": 42}, effect="write", operation_key="refund-42")

Reply = Callable[[dict[str, Any]], tuple[int, Any] | None]
"""One scripted answer to a request body: (status, JSON), or ``None`` to hang up."""


@dataclass(frozen=True)
class Seen:
    """One request as the console received it."""

    path: str
    headers: dict[str, str]
    raw: bytes
    peer: int = 0  # the client's port: one per connection

    @property
    def body(self) -> dict[str, Any]:
        parsed: dict[str, Any] = json.loads(self.raw)
        return parsed

    @property
    def step(self) -> str:
        return str(self.body.get("step", "start"))


def answer(body: dict[str, Any], **fields: Any) -> dict[str, Any]:
    """The common fields of every answer (``docs/protocol.md``, "Answers")."""
    return {
        "protocol": 1,
        "task": 41,
        "phase": 1,
        "state": "RUNNING",
        "request_id": body.get("request_id"),
        "remaining": REMAINING,
        "stop": None,
        **fields,
    }


def ok(**fields: Any) -> Reply:
    return lambda body: (200, answer(body, **fields))


def stopped(report: Report) -> Reply:
    return lambda body: (200, answer(body, state=str(report.state), stop=report.to_dict()))


def refused(status: int, code: str, error: str = "refused") -> Reply:
    return lambda body: (status, {"error": error, "code": code})


def hang_up(body: dict[str, Any]) -> None:
    return None


def started(body: dict[str, Any]) -> tuple[int, Any]:
    return 201, answer(body, lease_seconds=60, url="/tasks/41/")


def wire_ticket(index: int, call: Call, status: str = "admitted") -> dict[str, Any]:
    return {
        "ticket": index,
        "tool": call.tool,
        "args": dict(call.args),
        "effect": call.effect,
        "operation_key": call.operation_key,
        "fingerprint": fingerprint(call.tool, dict(call.args)),
        "poll": False,
        "status": status,
    }


class Console:
    """A real HTTP server on a local port that answers each step from its script (the
    replies of a step are played in order, the last one repeated) and keeps every request."""

    def __init__(self, *, keep_alive: bool = False, close_after: int = 0) -> None:
        """``keep_alive``: HTTP/1.1, connections kept open; ``close_after``: and closed
        after that many answers on one connection without saying so (an idle timeout)."""
        self.seen: list[Seen] = []
        self.script: dict[str, list[Reply]] = {
            "start": [started],
            "heartbeat": [ok(stop_requested=False)],
            "wait": [ok(wait_ms=0)],
            "model": [ok(allowed=True)],
        }
        self._played: dict[str, int] = {}
        self._lock = threading.Lock()
        console = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1" if keep_alive else "HTTP/1.0"
            answered = 0

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers["Content-Length"]))
                seen = Seen(self.path, dict(self.headers), raw, self.client_address[1])
                reply = console._reply(seen)
                if reply is None:
                    self.close_connection = True  # the answer is lost on the way
                    return
                status, payload = reply
                answer_json(self, status, json.dumps(payload).encode())
                self.answered += 1
                if close_after and self.answered >= close_after:
                    self.close_connection = True  # without a word: the client finds out

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, args=(0.02,), daemon=True)
        self._thread.start()

    def on(self, step: str, *replies: Reply) -> None:
        self.script[step] = list(replies)
        self._played[step] = 0

    def _reply(self, seen: Seen) -> tuple[int, Any] | None:
        with self._lock:
            self.seen.append(seen)
            step = seen.step
            replies = self.script.get(step) or [refused(409, "step_out_of_order")]
            played = self._played.get(step, 0)
            self._played[step] = played + 1
            reply = replies[min(played, len(replies) - 1)]
        return reply(seen.body)

    def steps(self, step: str) -> list[Seen]:
        with self._lock:
            return [seen for seen in self.seen if seen.step == step]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def console() -> Iterator[Console]:
    served = Console()
    yield served
    served.close()


def script_one_read(console: Console) -> None:
    """The console admits LOOKUP, lets it run and takes its result."""
    console.on("tools", ok(admitted=[wire_ticket(0, LOOKUP)]))
    console.on("call", ok(action="execute"))
    console.on("result", ok())


def answer_json(handler: BaseHTTPRequestHandler, status: int, data: bytes) -> None:
    """Send ``data`` as a JSON answer of ``status``."""
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)


def start(console: Console, **options: Any) -> RemoteGuard:
    options = {"heartbeat": False, "sleep": Sleeps(), **options}
    return RemoteGuard.start(
        console.url, token=TOKEN, agent="support-bot", tools=TOOLS, client="tests", **options
    )


def closed_port() -> int:
    """A local port nothing listens on (bound, then closed again)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


def real_stop(reason: Reason) -> Report:
    """A stop report made by the real guard."""
    if reason is Reason.SAME_CALL:
        looping = scripted([read("lookup_order", order=42)], [Result(Kind.RETRYABLE, wait_ms=10)])
        return looping.run(make_guard(Clock()))
    if reason is Reason.OPERATOR_STOP:
        local = make_guard(Clock())
        local.cancel()
        stop = local.before_model()
        assert stop is not None
        return stop
    raise AssertionError(reason)


# -- reaching the console -------------------------------------------------------------------


def test_a_console_that_cannot_be_reached_is_tried_again_then_raises() -> None:
    sleeps = Sleeps()
    url = f"http://127.0.0.1:{closed_port()}"

    with pytest.raises(ConsoleUnreachable) as raised:
        RemoteGuard.start(url, token=TOKEN, agent="a", tools=TOOLS, retries=3, sleep=sleeps)

    assert raised.value.attempts == 4
    assert sleeps.waits == [0.1, 0.3, 0.9]  # one backoff between attempts, bounded
    assert raised.value.url == f"{url}/api/attached"
    assert isinstance(raised.value.cause, OSError)
    assert isinstance(raised.value, RuntimeError)


def test_the_backoff_is_bounded_however_many_retries() -> None:
    sleeps = Sleeps()
    with pytest.raises(ConsoleUnreachable) as raised:
        RemoteGuard.start(
            f"http://127.0.0.1:{closed_port()}",
            token=TOKEN,
            agent="a",
            tools=TOOLS,
            retries=6,
            sleep=sleeps,
        )
    assert raised.value.attempts == 7
    assert max(sleeps.waits) == 2.0
    assert sleeps.waits == sorted(sleeps.waits)


def test_a_console_that_accepts_and_never_answers_times_out_on_every_attempt() -> None:
    accepted: list[socket.socket] = []
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    closing = threading.Event()

    def accept_and_keep_quiet() -> None:
        listener.settimeout(0.05)
        while not closing.is_set():
            try:
                connection, _ = listener.accept()
            except TimeoutError:
                continue
            accepted.append(connection)

    thread = threading.Thread(target=accept_and_keep_quiet, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    began = time.monotonic()
    try:
        with pytest.raises(ConsoleUnreachable) as raised:
            RemoteGuard.start(
                url, token=TOKEN, agent="a", tools=TOOLS, timeout=0.2, retries=2, sleep=Sleeps()
            )
        took = time.monotonic() - began
    finally:
        closing.set()
        thread.join()
        for connection in accepted:
            connection.close()
        listener.close()

    assert raised.value.attempts == 3
    assert len(accepted) == 3
    assert isinstance(raised.value.cause, TimeoutError)
    assert 0.6 <= took < 0.6 + 1.0  # timeout x (retries + 1), plus a little


def test_a_request_answered_500_is_sent_again_with_the_same_request_id_and_body(
    console: Console,
) -> None:
    console.on("start", refused(500, "server_error"), refused(500, "server_error"), started)
    sleeps = Sleeps()

    remote = start(console, sleep=sleeps)

    starts = console.steps("start")
    assert len(starts) == 3
    assert len({seen.raw for seen in starts}) == 1  # byte for byte the same request
    assert len({seen.body["request_id"] for seen in starts}) == 1
    assert sleeps.waits == [0.1, 0.3]
    assert (remote.task, remote.state, remote.report) == (41, "RUNNING", None)
    assert remote.page_url == f"{console.url}/tasks/41/"


def test_a_429_is_sent_again_too(console: Console) -> None:
    remote = start(console)
    console.on("model", refused(429, "throttled"), ok(allowed=True))

    assert remote.before_model() is None

    models = console.steps("model")
    assert [seen.body["request_id"] for seen in models] == [models[0].body["request_id"]] * 2


def test_an_answer_lost_on_the_way_is_asked_for_again(console: Console) -> None:
    remote = start(console)
    console.on("model", hang_up, ok(allowed=True))

    assert remote.before_model() is None

    assert len({seen.raw for seen in console.steps("model")}) == 1


def test_a_refusal_is_final_and_carries_its_code(console: Console) -> None:
    console.on("heartbeat", refused(404, "not_found", "there is no task 41"))

    with pytest.raises(ProtocolError) as raised:
        RemoteGuard.attach(console.url, token=TOKEN, task=41, sleep=Sleeps(), heartbeat=False)

    assert (raised.value.status, raised.value.code) == (404, "not_found")
    assert raised.value.message == "there is no task 41"
    assert len(console.steps("heartbeat")) == 1  # a 4xx other than 429 is not retried
    # (lease_held alone is waited out by attach: tests/guard/test_remote_coming_back.py)


def test_a_refusal_that_is_not_the_consoles_json_still_says_its_status(console: Console) -> None:
    console.on("start", lambda body: (403, "<html>Forbidden</html>"))
    with pytest.raises(ProtocolError) as raised:
        start(console)
    assert (raised.value.status, raised.value.code) == (403, "http_403")


def test_steps_go_over_one_kept_connection() -> None:
    console = Console(keep_alive=True)
    try:
        remote = start(console)
        script_one_read(console)
        assert remote.before_model() is None
        admitted = remote.before_tools(LOOKUP)
        assert isinstance(admitted, list)
        assert remote.before_tool(admitted[0]).action is Action.EXECUTE
        assert remote.after_tool(admitted[0], Result(Kind.SUCCESS, {"order": 42})) is None
        remote.close()
    finally:
        console.close()

    assert [seen.step for seen in console.seen] == ["start", "model", "tools", "call", "result"]
    assert len({seen.peer for seen in console.seen}) == 1


def test_a_kept_connection_the_console_closed_is_opened_again_without_a_retry() -> None:
    console = Console(keep_alive=True, close_after=1)  # every connection answers once
    sleeps = Sleeps()
    try:
        remote = start(console, sleep=sleeps, retries=0)
        assert remote.before_model() is None
        assert remote.before_wait() == 0
        remote.close()
    finally:
        console.close()

    # Each request found its connection closed, opened another and was answered once:
    # no backoff, no retry spent, nothing sent twice.
    assert [seen.step for seen in console.seen] == ["start", "model", "wait"]
    assert len({seen.peer for seen in console.seen}) == 3
    assert sleeps.waits == []


def test_a_proxy_named_by_the_environment_carries_the_requests(
    console: Console, monkeypatch: pytest.MonkeyPatch
) -> None:
    relayed: list[str] = []

    class Proxy(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            relayed.append(self.path)  # a proxy of plain http is sent the whole URL
            raw = self.rfile.read(int(self.headers["Content-Length"]))
            target = urllib.parse.urlsplit(self.path)
            upstream = http.client.HTTPConnection(target.hostname, target.port, timeout=5)
            forwarded = {k: v for k, v in self.headers.items() if k.lower() != "host"}
            upstream.request("POST", target.path, body=raw, headers=forwarded)
            response = upstream.getresponse()
            data = response.read()
            upstream.close()
            answer_json(self, response.status, data)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    proxy = ThreadingHTTPServer(("127.0.0.1", 0), Proxy)
    threading.Thread(target=proxy.serve_forever, args=(0.02,), daemon=True).start()
    for name in ("no_proxy", "NO_PROXY", "HTTP_PROXY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("http_proxy", f"http://127.0.0.1:{proxy.server_address[1]}")
    try:
        remote = start(console)
        assert remote.before_model() is None
    finally:
        proxy.shutdown()
        proxy.server_close()

    assert relayed == [f"{console.url}/api/attached", f"{console.url}/api/attached/41/steps"]
    assert [seen.step for seen in console.seen] == ["start", "model"]


# -- failing closed -------------------------------------------------------------------------


def test_a_tool_is_not_run_when_the_executors_entry_gets_no_answer(console: Console) -> None:
    remote = start(console, retries=2)
    console.on("tools", ok(admitted=[wire_ticket(0, LOOKUP)]))
    console.on("call", hang_up)
    runs: list[Call] = []

    assert remote.before_model() is None
    admitted = remote.before_tools(LOOKUP)
    assert isinstance(admitted, list)
    with pytest.raises(ConsoleUnreachable):
        decision = remote.before_tool(admitted[0])
        if decision.action is Action.EXECUTE:
            runs.append(admitted[0].call)

    assert runs == []
    assert len(console.steps("call")) == 3
    assert admitted[0].status == "admitted"  # never let in


def test_a_step_asked_again_after_no_answer_keeps_its_request_id(console: Console) -> None:
    remote = start(console, retries=1)
    console.on("model", hang_up, hang_up, ok(allowed=True))

    with pytest.raises(ConsoleUnreachable):
        remote.before_model()
    assert remote.before_model() is None

    models = console.steps("model")
    assert len(models) == 3
    assert len({seen.body["request_id"] for seen in models}) == 1


def test_a_langchain_agent_runs_no_tool_when_the_console_stops_answering(
    console: Console,
) -> None:
    pytest.importorskip("langchain")
    from langchain.agents import create_agent
    from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
    from langchain_core.messages import AIMessage
    from langchain_core.tools import tool

    from guard.adapters import ToolSpec
    from guard.contrib.langchain import LoopGuardMiddleware

    class Model(FakeMessagesListChatModel):
        def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> Model:
            return self

    entered: list[int] = []

    @tool
    def lookup_order(order: int) -> str:
        """Look up one order."""
        entered.append(order)
        return f"order {order}: shipped"

    specs = {"lookup_order": ToolSpec("read")}
    remote = start(console, retries=2)
    console.on("tools", ok(admitted=[wire_ticket(0, LOOKUP)]))
    console.on("call", hang_up)
    model = Model(
        responses=[
            AIMessage("", tool_calls=[{"name": "lookup_order", "args": {"order": 42}, "id": "1"}]),
            AIMessage("Order 42 has shipped."),
        ]
    )
    agent = create_agent(
        model, tools=[lookup_order], middleware=[LoopGuardMiddleware(remote, specs)]
    )

    with pytest.raises(ConsoleUnreachable):
        agent.invoke({"messages": [{"role": "user", "content": "Where is order 42?"}]})

    assert entered == []
    # No wait before the first model call: nothing has asked for one yet.
    assert [seen.step for seen in console.seen] == ["start", "model", "tools"] + ["call"] * 3
    assert console.steps("tools")[0].body["calls"] == [
        {"tool": "lookup_order", "args": {"order": 42}, "effect": "read"}
    ]


# -- what every request carries ---------------------------------------------------------------


def test_every_request_carries_the_protocol_its_lease_a_fresh_id_and_the_token(
    console: Console,
) -> None:
    remote = start(console)
    remote.before_model()
    remote.before_wait()

    assert [seen.path for seen in console.seen] == [
        "/api/attached",
        "/api/attached/41/steps",
        "/api/attached/41/steps",
    ]
    bodies = [seen.body for seen in console.seen]
    assert {body["protocol"] for body in bodies} == {1}
    assert {body["lease"] for body in bodies} == {remote.lease}
    assert re.fullmatch(rf"[ -~]+:{os.getpid()}:[0-9a-f]{{8}}", remote.lease)
    assert len({body["request_id"] for body in bodies}) == 3
    assert {seen.headers["Authorization"] for seen in console.seen} == {f"Bearer {TOKEN}"}
    assert {seen.headers["Content-Type"] for seen in console.seen} == {"application/json"}
    assert bodies[0]["tools"] == TOOLS
    assert (bodies[0]["agent"], bodies[0]["client"]) == ("support-bot", "tests")


def test_the_start_sends_the_goal_the_limits_and_the_reason(console: Console) -> None:
    start(
        console,
        input={"order": 42},
        limits={"model_calls": 4, "exempt": {"lookup_order"}},
        reason="ticket 7",
    )
    body = console.steps("start")[0].body
    assert body["input"] == {"order": 42}
    assert body["limits"] == {"model_calls": 4, "exempt": ["lookup_order"]}
    assert body["reason"] == "ticket 7"


def test_tool_specs_are_declared_by_their_effect(console: Console) -> None:
    from guard.adapters import ToolSpec

    specs = {
        "lookup_order": ToolSpec("read"),
        "refund": ToolSpec("write", lambda args: f"refund-{args['order']}"),
    }
    RemoteGuard.start(console.url, token=TOKEN, agent="a", tools=specs, heartbeat=False)
    assert console.steps("start")[0].body["tools"] == TOOLS


# -- usage ----------------------------------------------------------------------------------


def test_usage_is_sent_with_the_next_step_and_only_once(console: Console) -> None:
    remote = start(console)
    console.on("tools", ok(admitted=[wire_ticket(0, LOOKUP)]))
    console.on("call", ok(action="execute"))

    assert remote.before_model(reserve=0) is None
    remote.spend_tokens(100)
    remote.spend_tokens(20)
    remote.settle_spend(9)
    sent_before = len(console.seen)
    admitted = remote.before_tools(LOOKUP)
    assert isinstance(admitted, list)
    remote.before_tool(admitted[0])

    assert sent_before == 2
    model, tools, call = console.seen[1:]
    assert "usage" not in model.body
    assert tools.body["usage"] == {"tokens": 120, "cost": 9}
    assert "usage" not in call.body


def test_usage_waits_for_a_step_that_is_answered(console: Console) -> None:
    remote = start(console, retries=0)
    assert remote.before_model() is None
    remote.spend_tokens(50)
    console.on("wait", refused(409, "step_out_of_order"), ok(wait_ms=0))

    with pytest.raises(ProtocolError):
        remote.before_wait()
    assert remote.before_wait() == 0

    waits = console.steps("wait")
    assert [seen.body["usage"] for seen in waits] == [{"tokens": 50}, {"tokens": 50}]


@pytest.mark.parametrize("bad", [-1, 1.5, True, "12", None])
def test_usage_must_be_a_whole_number_of_at_least_zero(console: Console, bad: Any) -> None:
    remote = start(console)
    assert remote.before_model() is None
    with pytest.raises(ValueError, match="tokens must be a non-negative int"):
        remote.spend_tokens(bad)
    with pytest.raises(ValueError, match="cost must be a non-negative int"):
        remote.settle_spend(bad)
    assert len(console.seen) == 2


def test_a_cost_is_settled_once_per_model_call(console: Console) -> None:
    remote = start(console)
    with pytest.raises(ValueError, match="needs a model call"):
        remote.settle_spend(3)
    assert remote.before_model() is None
    remote.settle_spend(3)
    with pytest.raises(ValueError, match="needs a model call"):
        remote.settle_spend(4)


# -- the steps' answers -------------------------------------------------------------------


def test_admitted_calls_come_back_as_tickets_numbered_by_the_console(console: Console) -> None:
    remote = start(console)
    console.on("tools", ok(admitted=[wire_ticket(0, LOOKUP), wire_ticket(1, REFUND)]))

    assert remote.before_model() is None
    admitted = remote.before_tools([LOOKUP, REFUND])

    assert isinstance(admitted, list)
    assert [(t.index, t.call, t.status) for t in admitted] == [
        (0, LOOKUP, "admitted"),
        (1, REFUND, "admitted"),
    ]
    assert remote.tickets == tuple(admitted)
    assert console.steps("tools")[0].body["calls"] == [
        {"tool": "lookup_order", "args": {"order": 42}, "effect": "read"},
        {"tool": "refund", "args": {"order": 42}, "effect": "write", "operation_key": "refund-42"},
    ]


def test_a_call_entered_with_its_admission_asks_the_console_once(console: Console) -> None:
    remote = start(console)
    console.on("tools", ok(admitted=[wire_ticket(0, REFUND)], action="execute"))
    console.on("result", ok())

    assert remote.before_model() is None
    admitted = remote.before_tools(REFUND, enter=True)
    assert isinstance(admitted, list)
    decision = remote.before_tool(admitted[0])
    remote.after_tool(admitted[0], Result(Kind.SUCCESS, {"refund": "r-1"}))

    assert decision.action is Action.EXECUTE
    assert [seen.step for seen in console.seen] == ["start", "model", "tools", "result"]
    assert console.steps("tools")[0].body["enter"] is True


def test_a_reuse_decided_with_the_admission_hands_back_the_stored_result(
    console: Console,
) -> None:
    remote = start(console)
    stored = {"kind": "SUCCESS", "data": {"refund": "r-1"}}
    console.on("tools", ok(admitted=[wire_ticket(0, REFUND)], action="reuse", result=stored))

    assert remote.before_model() is None
    admitted = remote.before_tools(REFUND, enter=True)
    assert isinstance(admitted, list)
    decision = remote.before_tool(admitted[0])

    assert decision.action is Action.REUSE and decision.result == Result(
        Kind.SUCCESS, {"refund": "r-1"}
    )
    assert console.steps("call") == []


def test_several_calls_are_entered_one_by_one_whatever_enter_says(console: Console) -> None:
    remote = start(console)
    console.on("tools", ok(admitted=[wire_ticket(0, LOOKUP), wire_ticket(1, REFUND)]))
    console.on("call", ok(action="execute"))

    assert remote.before_model() is None
    admitted = remote.before_tools([LOOKUP, REFUND], enter=True)
    assert isinstance(admitted, list)
    remote.before_tool(admitted[0])

    assert "enter" not in console.steps("tools")[0].body
    assert [seen.body["ticket"] for seen in console.steps("call")] == [0]


def test_a_console_that_did_not_decide_the_entry_is_asked_at_the_entry(
    console: Console,
) -> None:
    remote = start(console)
    console.on("tools", ok(admitted=[wire_ticket(0, LOOKUP)]))  # no action: not decided
    console.on("call", ok(action="execute"))

    assert remote.before_model() is None
    admitted = remote.before_tools(LOOKUP, enter=True)
    assert isinstance(admitted, list)

    assert remote.before_tool(admitted[0]).action is Action.EXECUTE
    assert len(console.steps("call")) == 1


def test_a_nudge_comes_back_as_a_nudge_for_the_model(console: Console) -> None:
    remote = start(console)
    nudge = {
        "message": "You asked for this already; try something else.",
        "tool": "lookup_order",
        "fingerprint": "ab" * 32,
        "reason": "same_call",
    }
    console.on("tools", ok(nudge=nudge))

    assert remote.before_model() is None
    answered = remote.before_tools(LOOKUP)

    assert answered == Nudge(nudge["message"], "lookup_order", "ab" * 32, Reason.SAME_CALL)
    assert remote.report is None


def test_an_executed_call_is_reported_with_its_result_and_the_inspectors_word(
    console: Console,
) -> None:
    remote = start(console)
    script_one_read(console)
    seen: list[tuple[Result | None, Any]] = []

    def inspect(result: Result | None, subject: Call | Finish) -> Evidence:
        seen.append((result, subject))
        return Evidence(3, False)

    assert remote.before_model() is None
    admitted = remote.before_tools(LOOKUP)
    assert isinstance(admitted, list)
    ticket = admitted[0]
    assert remote.before_tool(ticket).action is Action.EXECUTE
    assert ticket.status == "executing"
    shipped = Result(Kind.SUCCESS, {"status": "shipped"})
    assert remote.after_tool(ticket, shipped, inspect=inspect) is None

    assert seen == [(shipped, LOOKUP)]
    body = console.steps("result")[0].body
    assert body["ticket"] == 0
    assert body["result"] == shipped.to_dict()
    assert body["evidence"] == {"revision": 3, "done": False, "committed": None}
    assert (ticket.status, ticket.result) == ("ran", shipped)


def test_a_reused_write_hands_back_the_stored_result_and_reports_no_result(
    console: Console,
) -> None:
    remote = start(console)
    stored = Result(Kind.SUCCESS, {"refund_id": "r-1"})
    console.on("tools", ok(admitted=[wire_ticket(0, REFUND)]))
    console.on("call", ok(action="reuse", result=stored.to_dict()))
    console.on("result", ok())

    assert remote.before_model() is None
    admitted = remote.before_tools(REFUND)
    assert isinstance(admitted, list)
    decision = remote.before_tool(admitted[0])
    assert (decision.action, decision.result) == (Action.REUSE, stored)
    assert remote.after_tool(admitted[0], decision.result, inspect=None) is None

    # No result (the stored one counts); as the model call's last, it asks for what follows.
    assert console.steps("result")[0].body.keys() == {
        "protocol",
        "request_id",
        "lease",
        "step",
        "ticket",
        "then",
    }
    assert console.steps("result")[0].body["then"] == "model"
    assert admitted[0].status == "reused"


@pytest.mark.parametrize(
    ("error", "transient"),
    [(ConnectionResetError("peer went away"), True), (ValueError("no such order"), False)],
)
def test_an_error_is_reported_with_its_type_and_whether_one_more_try_may_help(
    console: Console, error: Exception, transient: bool
) -> None:
    remote = start(console)
    script_one_read(console)

    assert remote.before_model() is None
    admitted = remote.before_tools(LOOKUP)
    assert isinstance(admitted, list)
    remote.before_tool(admitted[0])
    remote.after_tool(admitted[0], error=error, inspect=lambda r, s: Evidence(0, False))

    body = console.steps("result")[0].body
    assert body["error"] == {
        "type": type(error).__name__,
        "message": str(error),
        "transient": transient,
    }
    assert "result" not in body and "evidence" not in body


def test_a_return_value_that_is_not_a_result_is_sent_as_such(console: Console) -> None:
    remote = start(console)
    script_one_read(console)

    assert remote.before_model() is None
    admitted = remote.before_tools(LOOKUP)
    assert isinstance(admitted, list)
    remote.before_tool(admitted[0])
    remote.after_tool(admitted[0], "shipped", inspect=None)

    assert console.steps("result")[0].body["result"] == {
        "kind": "<not a result>",
        "data": "'shipped'",
    }


def test_an_inspector_that_raises_is_sent_as_the_evidence_error(console: Console) -> None:
    remote = start(console)
    script_one_read(console)

    def inspect(result: Result | None, subject: Call | Finish) -> Evidence:
        raise LookupError("the records are down")

    assert remote.before_model() is None
    admitted = remote.before_tools(LOOKUP)
    assert isinstance(admitted, list)
    remote.before_tool(admitted[0])
    remote.after_tool(admitted[0], Result(Kind.SUCCESS), inspect=inspect)

    body = console.steps("result")[0].body
    assert body["evidence"] == {"error": "LookupError: the records are down"}


def test_a_finish_sends_the_answer_and_the_inspectors_word(console: Console) -> None:
    report = Report.from_dict(
        {**real_stop(Reason.SAME_CALL).to_dict(), "state": "COMPLETED", "reason": "goal_met"}
    )
    remote = start(console)
    console.on("finish", stopped(report))

    assert remote.before_model() is None
    done = remote.finish(Finish({"order": 42, "at": object()}), lambda r, s: Evidence(5, True))

    assert done == report
    body = console.steps("finish")[0].body
    assert body["answer"]["order"] == 42  # made JSON-safe: what JSON cannot hold is its repr
    assert body["answer"]["at"].startswith("<object object")
    assert body["evidence"] == {"revision": 5, "done": True, "committed": None}


def test_a_proposal_that_is_not_calls_is_halted_without_sending_it(console: Console) -> None:
    report = Report.from_dict(
        {**real_stop(Reason.SAME_CALL).to_dict(), "state": "FAILED", "reason": "bad_call"}
    )
    remote = start(console)
    console.on("halt", stopped(report))

    assert remote.before_model() is None
    assert remote.before_tools(Finish("done")) == report

    assert console.steps("tools") == []
    halt = console.steps("halt")[0].body
    assert (halt["state"], halt["reason"]) == ("FAILED", "bad_call")
    assert "Finish" in halt["detail"]


# -- stops ------------------------------------------------------------------------------------


def test_a_stop_is_kept_and_every_later_step_answers_it_without_asking(console: Console) -> None:
    report = real_stop(Reason.SAME_CALL)
    remote = start(console)
    console.on("tools", ok(admitted=[wire_ticket(0, LOOKUP)]))
    console.on("call", stopped(report))

    assert remote.before_model() is None
    admitted = remote.before_tools(LOOKUP)
    assert isinstance(admitted, list)
    decision = remote.before_tool(admitted[0])
    asked = len(console.seen)

    assert decision.action is Action.STOP
    assert decision.report == report
    assert remote.report == report
    assert remote.state == "PARTIAL"
    assert remote.before_model() is remote.report
    assert remote.before_tools(LOOKUP) is remote.report
    assert remote.before_tool(admitted[0]).report is remote.report
    assert remote.after_tool(admitted[0], Result(Kind.SUCCESS), inspect=None) is remote.report
    assert remote.before_wait() is remote.report
    assert remote.finish(Finish(), None) is remote.report
    assert remote.planner_failed(RuntimeError("x")) is remote.report
    assert remote.halt(State.FAILED, Reason.BAD_CALL) is remote.report
    assert len(console.seen) == asked


def test_a_start_the_guard_stops_at_once_is_stopped_from_the_first_answer(
    console: Console,
) -> None:
    report = real_stop(Reason.OPERATOR_STOP)
    console.on("start", lambda body: (201, answer(body, state="CANCELLED", stop=report.to_dict())))

    remote = start(console, heartbeat=True)

    assert remote.report == report
    assert remote.before_model() is remote.report
    assert len(console.seen) == 1
    remote.close()


def test_a_goal_held_before_it_runs_is_refused_at_the_start(console: Console) -> None:
    held = {
        **real_stop(Reason.OPERATOR_STOP).to_dict(),
        "state": "NEEDS_HUMAN",
        "reason": "restart_loop",
        "detail": "started 5 times in 10 minutes",
    }
    console.on("start", lambda body: (201, answer(body, state="NEEDS_HUMAN", stop=held)))

    with pytest.raises(ProtocolError) as raised:
        start(console, heartbeat=True)

    assert (raised.value.code, raised.value.message) == (
        "restart_loop",
        "started 5 times in 10 minutes",
    )
    assert raised.value.answer is not None and raised.value.answer["task"] == 41
    time.sleep(0.05)
    assert len(console.seen) == 1


def test_remaining_is_the_latest_answers_with_the_deadline_counting_down(
    console: Console,
) -> None:
    remote = start(console)
    console.on("model", ok(allowed=True, remaining={**REMAINING, "model_calls": 7}))

    assert remote.before_model() is None
    time.sleep(0.05)
    left = remote.remaining()

    assert left["model_calls"] == 7
    assert left["tokens"] is None
    assert left["deadline_ms"] is not None and 59_000 < left["deadline_ms"] <= 60_000 - 50


def test_an_answer_that_is_not_the_protocols_is_a_protocol_error(console: Console) -> None:
    remote = start(console)
    console.on("model", ok())  # neither allowed nor a stop

    with pytest.raises(ProtocolError) as raised:
        remote.before_model()
    assert raised.value.code == "invalid_answer"


# -- heartbeat and attach ---------------------------------------------------------------------


def wait_for(condition: Callable[[], bool], seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting")
        time.sleep(0.01)


def test_heartbeats_keep_the_lease_and_say_a_stop_was_requested(console: Console) -> None:
    console.on("start", lambda body: (201, answer(body, lease_seconds=0.15)))
    console.on("heartbeat", ok(stop_requested=False), ok(stop_requested=True))

    with start(console, heartbeat=True) as remote:
        wait_for(lambda: remote.stop_requested)
        assert {seen.body["lease"] for seen in console.steps("heartbeat")} == {remote.lease}
    beats = len(console.steps("heartbeat"))
    time.sleep(0.2)

    assert beats >= 2
    assert len(console.steps("heartbeat")) == beats  # closed: no more heartbeats
    assert remote.report is None


def test_a_heartbeat_that_gets_no_answer_is_tried_at_the_next_beat(console: Console) -> None:
    console.on("start", lambda body: (201, answer(body, lease_seconds=0.15)))
    console.on("heartbeat", hang_up, ok(stop_requested=False))

    with start(console, heartbeat=True):
        wait_for(lambda: len(console.steps("heartbeat")) >= 3)


def test_heartbeats_end_once_the_task_has_stopped(console: Console) -> None:
    report = real_stop(Reason.OPERATOR_STOP)
    console.on("start", lambda body: (201, answer(body, lease_seconds=0.15)))
    console.on("heartbeat", ok(stop_requested=True, state="CANCELLED", stop=report.to_dict()))

    with start(console, heartbeat=True) as remote:
        wait_for(lambda: remote.report is not None)
        beats = len(console.steps("heartbeat"))
        time.sleep(0.2)
        assert len(console.steps("heartbeat")) == beats == 1
        assert remote.before_model() == report


def test_attach_takes_the_task_with_a_heartbeat_under_a_new_lease(console: Console) -> None:
    console.on("heartbeat", ok(stop_requested=False, state="QUEUED", phase=2))

    remote = RemoteGuard.attach(console.url, token=TOKEN, task=41, sleep=Sleeps(), heartbeat=False)

    first = console.seen[0]
    assert (first.path, first.step) == ("/api/attached/41/steps", "heartbeat")
    assert first.body["lease"] == remote.lease
    assert (remote.task, remote.phase, remote.state) == (41, 2, "QUEUED")
    assert remote.page_url == f"{console.url}/tasks/41/"
    assert remote.remaining() == {**REMAINING, "deadline_ms": remote.remaining()["deadline_ms"]}
    other = RemoteGuard.attach(console.url, token=TOKEN, task=41, sleep=Sleeps(), heartbeat=False)
    assert other.lease != remote.lease


# -- where it fits --------------------------------------------------------------------------


def test_a_remote_guard_offers_the_step_wise_interface(console: Console) -> None:
    remote: StepGuard = start(console)
    members = [name for name in dir(StepGuard) if not name.startswith("_")]
    assert all(hasattr(remote, name) for name in members)
    assert isinstance(remote, RemoteGuard)
    assert Ticket is guard.steps.Ticket


def test_the_integrations_take_a_remote_guard(console: Console) -> None:
    pytest.importorskip("agents")
    from guard.contrib.openai_agents import GuardedRun

    remote = start(console)
    assert GuardedRun(remote).guard is remote


def test_importing_guard_does_not_import_the_remote_client() -> None:
    probe = "import json, sys, guard, guard.steps\nprint(json.dumps(sorted(sys.modules)))\n"
    root = Path(guard.__file__).resolve().parent.parent
    env = clean_environment(PYTHONPATH=str(root))  # no DJANGO_SETTINGS_MODULE
    done = run_python(probe, env=env, cwd=root, timeout=60)
    assert done.returncode == 0, done.stderr
    loaded = set(json.loads(done.stdout))
    assert "guard.remote" not in loaded
    assert "urllib.request" not in loaded


def test_the_remote_clients_public_names_are_documented() -> None:
    import inspect

    import guard.remote

    assert sorted(guard.remote.__all__) == ["ConsoleUnreachable", "ProtocolError", "RemoteGuard"]
    for name in guard.remote.__all__:
        obj = getattr(guard.remote, name)
        assert obj.__module__ == "guard.remote", name  # its home for users, whatever the file
        assert (inspect.getdoc(obj) or "").strip(), name
        # RemoteGuard is made of parts (guard/remote/): what it inherits from them counts.
        for part in (c for c in obj.__mro__ if c.__module__.startswith("guard.remote")):
            for attribute, member in vars(part).items():
                if not attribute.startswith("_") and callable(getattr(member, "__func__", member)):
                    assert (inspect.getdoc(member) or "").strip(), f"{name}.{attribute}"


def test_a_console_url_that_is_not_http_is_refused_before_anything_is_sent() -> None:
    with pytest.raises(ValueError, match="http"):
        RemoteGuard.start("file:///etc/passwd", token=TOKEN, agent="a", tools=TOOLS)
