"""The MCP gateway (``guard.contrib.mcp``) with real MCP on both sides: the SDK's own client
(``mcp.Client`` over stdio to the gateway's process, ``python -m guard.contrib.mcp``), the
SDK's own ``MCPServer`` upstream (``mcp_shop.py``, over stdio and over Streamable HTTP),
and a live console (pytest-django's live server on the real PostgreSQL) deciding every call.

The shop counts its effects in an SQLite file: "reached the server once" is read from the
business records, not from what the gateway or the console said.
"""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mcp")

import anyio
import mcp_types as types
from django.contrib.auth.models import User
from django.db import connections
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client

from console import services
from console.api.tokens import api_token_issue
from console.models import Operation, OperationState, Task, TaskState
from console.records.roles import Role, assign
from guard.contrib.mcp import ConfigError, GatewayConfig, ToolRule
from tests.processes import run
from tests.up_process import free_port
from tests.waiting import wait_for

ROOT = Path(__file__).resolve().parents[3]
SHOP = Path(__file__).with_name("mcp_shop.py")
KEYS = {"send_refund": {"key": "refund-{order}"}}

live = pytest.mark.django_db(transaction=True)  # the live server reads what the test writes


# -- the pieces ------------------------------------------------------------------------------


def effects(db: Path, kind: str) -> list[int]:
    """The orders the shop really acted on, ``kind`` being lookup, refund or delete."""
    if not db.exists():
        return []
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT order_id FROM effects WHERE kind = ?", (kind,)).fetchall()
    return [row[0] for row in rows]


def text(result: types.CallToolResult) -> str:
    return " ".join(part.text for part in result.content if isinstance(part, types.TextContent))


async def in_thread[T](work: Callable[[], T]) -> T:
    """Django's database work from inside an MCP session (the event loop must go on
    serving the client meanwhile); the thread's connection closed after it, so that the
    test database can be dropped at the end."""

    def run() -> T:
        try:
            return work()
        finally:
            connections.close_all()

    return await anyio.to_thread.run_sync(run)


def stdio_shop(db: Path) -> dict[str, Any]:
    return {"command": sys.executable, "args": [str(SHOP), "stdio"], "env": {"SHOP_DB": str(db)}}


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NO_PROXY", "*")  # the console is on this machine


@pytest.fixture
def token(transactional_db: None) -> str:
    user = User.objects.create_user("mcp-agent")
    assign(user, [Role.AGENT])
    return api_token_issue(user=user, name="mcp gateway")[1]


@pytest.fixture
def person(transactional_db: None) -> User:
    """An operator who is also a reconciler."""
    user = User.objects.create_user("anna")
    assign(user, [Role.OPERATOR, Role.RECONCILER, Role.APPROVER])
    return user


Session = Callable[[Client], Awaitable[Any]]


class Gateway:
    """Runs the gateway's process for one MCP client session and keeps what it printed."""

    def __init__(self, tmp_path: Path, url: str, token: str) -> None:
        self.tmp_path, self.url, self.token = tmp_path, url, token
        self.stderr = tmp_path / "gateway.stderr"

    def session(self, config: dict[str, Any], scenario: Session) -> Any:
        path = self.tmp_path / "gateway.json"
        path.write_text(json.dumps(config))
        params = StdioServerParameters(
            command=sys.executable,
            args=["-m", "guard.contrib.mcp", "--config", str(path)],
            env={
                "LOOPGUARD_URL": self.url,
                "LOOPGUARD_TOKEN": self.token,
                "NO_PROXY": "*",
                "PYTHONPATH": str(ROOT),
            },
            cwd=str(ROOT),
        )

        async def run() -> Any:
            with self.stderr.open("a") as errlog:
                client = Client(
                    stdio_client(params, errlog=errlog),
                    client_info=types.Implementation(name="test-desktop", version="9.1"),
                    cache=None,
                )
                async with client:
                    return await scenario(client)

        return anyio.run(run)

    def said(self) -> str:
        return self.stderr.read_text() if self.stderr.exists() else ""


@pytest.fixture
def gateway(tmp_path: Path, live_server: Any, token: str) -> Gateway:
    return Gateway(tmp_path, str(live_server.url), token)


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "shop.sqlite"


# -- the tests against a live console --------------------------------------------------------


@live
@pytest.mark.slow
def test_a_repeated_write_reaches_the_server_once(gateway: Gateway, db: Path) -> None:
    config = {"agent": "desk-assistant", "servers": {"shop": stdio_shop(db)}, "tools": KEYS}

    async def scenario(client: Client) -> tuple[list[str], str, str]:
        listed = await client.list_tools()
        first = await client.call_tool("send_refund", {"order": 42})
        second = await client.call_tool("send_refund", {"order": 42})
        assert not first.is_error and not second.is_error
        return [tool.name for tool in listed.tools], text(first), text(second)

    names, first, second = gateway.session(config, scenario)
    assert sorted(names) == ["delete_order", "find_order", "send_refund"]  # no namespace
    assert first == second == "refund of 10 sent for order 42"
    assert effects(db, "refund") == [42]  # the second was answered from the ledger
    operation = Operation.objects.get(key="refund-42")
    assert operation.state == OperationState.COMMITTED
    task = Task.objects.get()
    assert task.agent == "desk-assistant"
    assert task.client == "test-desktop/9.1 via loopguard-mcp-gateway/1"
    # The client went away: MCP carries no final answer, so nothing verifies the goal.
    assert (task.state, task.reason) == (TaskState.PARTIAL, "goal_unverified")


@live
@pytest.mark.slow
def test_a_read_repeated_stops_on_the_repeat_rule(gateway: Gateway, db: Path) -> None:
    config = {"servers": {"shop": stdio_shop(db)}, "tools": KEYS, "limits": {"same": 2}}

    async def scenario(client: Client) -> list[types.CallToolResult]:
        return [await client.call_tool("find_order", {"order": 7}) for _ in range(3)] + [
            await client.call_tool("find_order", {"order": 8})
        ]

    *ran, third, other = gateway.session(config, scenario)
    assert [text(r) for r in ran] == ["order 7: delivered"] * 2
    assert third.is_error and "same_call" in text(third)
    assert "do not ask for this or any other call again" in text(third)
    assert other.is_error and "same_call" in text(other)  # a stop is sticky
    assert effects(db, "lookup") == [7, 7]
    assert Task.objects.get().reason == "same_call"


@live
@pytest.mark.slow
def test_a_write_without_a_key_is_refused_before_the_server(
    gateway: Gateway, db: Path
) -> None:
    config = {"servers": {"shop": stdio_shop(db)}, "tools": KEYS}

    async def scenario(client: Client) -> tuple[types.CallToolResult, types.CallToolResult]:
        refused = await client.call_tool("delete_order", {"order": 3})
        after = await client.call_tool("find_order", {"order": 3})
        return refused, after

    refused, after = gateway.session(config, scenario)
    assert refused.is_error
    assert "no operation key is configured for delete_order" in text(refused)
    assert effects(db, "delete") == []
    assert text(after) == "order 3: delivered"  # the task goes on: the refusal was local
    assert "delete_order (shop) is a write without an operation key" in gateway.said()


@live
@pytest.mark.slow
def test_a_server_killed_mid_write_leaves_it_unknown_and_it_is_never_sent_again(
    gateway: Gateway, db: Path, person: User
) -> None:
    config = {"servers": {"shop": stdio_shop(db)}, "tools": KEYS}
    Path(f"{db}.crash").touch()  # the refund commits, then the server dies before answering

    async def lost(client: Client) -> list[types.CallToolResult]:
        return [
            await client.call_tool("send_refund", {"order": 5}),
            await client.call_tool("send_refund", {"order": 5}),
        ]

    lost_answer, again = gateway.session(config, lost)
    assert lost_answer.is_error and "unknown" in text(lost_answer)
    assert "will not be run again" in text(lost_answer)
    assert again.is_error and "NEEDS_HUMAN" in text(again)
    assert effects(db, "refund") == [5]
    assert Operation.objects.get(key="refund-5").state == OperationState.UNKNOWN
    task = Task.objects.get()
    assert task.state == TaskState.NEEDS_HUMAN

    # A reconciler finds the refund in the shop and marks it committed; a new session of
    # the client (the server restarted, no crash now) asks for it again: the ledger answers.
    Path(f"{db}.crash").unlink()
    services.operation_mark_committed(
        key="refund-5", actor=person, evidence="refund row 1 in the shop", result="refunded"
    )

    async def later(client: Client) -> types.CallToolResult:
        return await client.call_tool("send_refund", {"order": 5})

    reused = gateway.session(config, later)
    assert not reused.is_error and "refunded" in text(reused)
    assert effects(db, "refund") == [5]  # still one refund


@live
@pytest.mark.slow
def test_a_resumed_task_goes_on_in_the_same_session_and_the_settled_write_is_not_resent(
    gateway: Gateway, db: Path, person: User
) -> None:
    config = {"servers": {"shop": stdio_shop(db)}, "tools": KEYS}
    Path(f"{db}.crash").touch()

    async def scenario(client: Client) -> list[types.CallToolResult]:
        lost = await client.call_tool("send_refund", {"order": 6})  # the shop dies here

        def settle_and_resume() -> None:
            services.operation_mark_committed(
                key="refund-6", actor=person, evidence="found in the shop", result="refunded"
            )
            task = Task.objects.get()
            services.task_approve_resumption(
                task_id=task.id, actor=person, reason="refund checked", enqueue=lambda _: None
            )

        await in_thread(settle_and_resume)
        return [
            lost,
            await client.call_tool("send_refund", {"order": 6}),
            await client.call_tool("send_refund", {"order": 7}),
        ]

    lost, reused, gone = gateway.session(config, scenario)
    assert lost.is_error and "unknown" in text(lost)
    assert not reused.is_error and "refunded" in text(reused)  # from the ledger
    assert effects(db, "refund") == [6]  # the shop (dead meanwhile) was not asked again
    # A new refund cannot reach the dead shop: not sent, and said so; the protocol has no
    # word for "verified not sent", so a reconciler confirms it before it may run again.
    assert gone.is_error and "closed its connection earlier" in text(gone)
    assert "was not sent" in text(gone)
    assert effects(db, "refund") == [6]
    assert Operation.objects.get(key="refund-7").state == OperationState.UNKNOWN
    task = Task.objects.get()
    assert (task.phase, task.state) == (2, TaskState.NEEDS_HUMAN)


@live
@pytest.mark.slow
def test_stop_from_the_console_refuses_the_next_call(
    gateway: Gateway, db: Path, person: User
) -> None:
    config = {"servers": {"shop": stdio_shop(db)}, "tools": KEYS}

    async def scenario(client: Client) -> tuple[types.CallToolResult, types.CallToolResult]:
        first = await client.call_tool("find_order", {"order": 1})
        task = await in_thread(Task.objects.get)
        await in_thread(
            lambda: services.task_stop(task_id=task.id, actor=person, reason="the desk is closing")
        )
        return first, await client.call_tool("send_refund", {"order": 1})

    first, refused = gateway.session(config, scenario)
    assert text(first) == "order 1: delivered"
    assert refused.is_error
    assert "CANCELLED/operator_stop" in text(refused)
    assert "stopped by anna: the desk is closing" in text(refused)
    assert effects(db, "refund") == []
    assert Task.objects.get().state == TaskState.CANCELLED


@live
@pytest.mark.slow
def test_a_servers_own_tool_error_lets_a_read_be_corrected_and_stops_at_a_write(
    gateway: Gateway, db: Path
) -> None:
    config = {"servers": {"shop": stdio_shop(db)}, "tools": KEYS}

    async def scenario(client: Client) -> list[types.CallToolResult]:
        return [
            await client.call_tool("find_order", {"order": -1}),
            await client.call_tool("find_order", {"order": 1}),
            await client.call_tool("send_refund", {"order": 1, "amount": 5000}),
            await client.call_tool("find_order", {"order": 2}),
        ]

    wrong, corrected, refused, after = gateway.session(config, scenario)
    assert wrong.is_error and "there is no order -1" in text(wrong)  # the server's own words
    assert text(corrected) == "order 1: delivered"  # a read's error: the model may correct it
    assert refused.is_error and "over the limit" in text(refused)
    # A write's error stops the task: the server's word does not prove that nothing
    # happened, so the refund waits for a reconciler.
    assert after.is_error and "NEEDS_HUMAN/unknown_commit" in text(after)
    assert effects(db, "lookup") == [1] and effects(db, "refund") == []
    assert Operation.objects.get(key="refund-1").state == OperationState.UNKNOWN
    task = Task.objects.get()
    assert (task.state, task.reason) == (TaskState.NEEDS_HUMAN, "unknown_commit")


@live
@pytest.mark.slow
def test_a_streamable_http_server_beside_a_stdio_one_namespaces_shared_names(
    gateway: Gateway, db: Path, tmp_path: Path
) -> None:
    remote_db = tmp_path / "remote.sqlite"
    port = free_port()
    server = subprocess.Popen(  # noqa: S603 - our own script
        [sys.executable, str(SHOP), "http", str(port)],
        env={**os.environ, "SHOP_DB": str(remote_db)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(lambda: listening(port), timeout=20, what="the HTTP shop listening")
        config = {
            "servers": {"shop": stdio_shop(db), "remote": {"url": f"http://127.0.0.1:{port}/mcp"}},
            "tools": {"remote__send_refund": {"key": "remote-refund-{order}"}},
        }

        async def scenario(client: Client) -> tuple[list[str], str, str]:
            names = [tool.name for tool in (await client.list_tools()).tools]
            first = await client.call_tool("remote__send_refund", {"order": 9, "amount": 3})
            second = await client.call_tool("remote__send_refund", {"order": 9, "amount": 3})
            return names, text(first), text(second)

        names, first, second = gateway.session(config, scenario)
    finally:
        server.kill()
        server.wait(timeout=10)
    assert "shop__find_order" in names and "remote__find_order" in names
    assert "find_order" not in names
    assert first == second == "refund of 3 sent for order 9"
    assert effects(remote_db, "refund") == [9] and effects(db, "refund") == []


def serve_http(gateway: Gateway, config: dict[str, Any]) -> tuple[subprocess.Popen[str], str]:
    """The gateway serving Streamable HTTP on a port of its own; the process and its URL."""
    path = gateway.tmp_path / "gateway.json"
    path.write_text(json.dumps(config))
    port = free_port()
    served = subprocess.Popen(  # noqa: S603 - our own module
        [sys.executable, "-m", "guard.contrib.mcp", "--config", str(path),
         "--http", f"127.0.0.1:{port}"],
        cwd=ROOT,
        env={**os.environ, "LOOPGUARD_URL": gateway.url, "LOOPGUARD_TOKEN": gateway.token},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    return served, f"http://127.0.0.1:{port}/mcp"


def session_client(url: str, name: str) -> Client:
    """A client of the initialize handshake: a session, and its Mcp-Session-Id."""
    info = types.Implementation(name=name, version="1")
    return Client(url, mode="legacy", client_info=info, cache=None)


@live
@pytest.mark.slow
def test_over_streamable_http_each_mcp_session_is_a_task_of_its_own(
    gateway: Gateway, db: Path, person: User, tmp_path: Path
) -> None:
    served, url = serve_http(gateway, {"servers": {"shop": stdio_shop(db)}, "tools": KEYS})
    port = int(url.rsplit(":", 1)[1].split("/")[0])

    async def sessions() -> list[types.CallToolResult]:
        async with session_client(url, "desk-a") as a, session_client(url, "desk-b") as b:
            first = await a.call_tool("send_refund", {"order": 11})
            again = await a.call_tool("send_refund", {"order": 11})
            other = await b.call_tool("find_order", {"order": 1})

            def stop_a() -> None:
                task = Task.objects.get(client__startswith="desk-a")
                services.task_stop(task_id=task.id, actor=person, reason="a is done")

            await in_thread(stop_a)
            return [
                first,
                again,
                other,
                await a.call_tool("find_order", {"order": 3}),
                await b.call_tool("find_order", {"order": 2}),
            ]

    try:
        wait_for(lambda: listening(port), timeout=30, what="the gateway serving HTTP")
        first, again, other, stopped, goes_on = anyio.run(sessions)
    finally:
        served.terminate()
        _, said = served.communicate(timeout=30)
    assert text(first) == text(again) == "refund of 10 sent for order 11"
    assert text(other) == "order 1: delivered"
    assert stopped.is_error and "stopped by anna: a is done" in text(stopped)
    assert text(goes_on) == "order 2: delivered"  # the other session's task runs on
    assert effects(db, "refund") == [11] and effects(db, "lookup") == [1, 2]
    tasks = {t.client: (t.state, t.reason) for t in Task.objects.all()}
    assert tasks == {
        "desk-a/1 via loopguard-mcp-gateway/1": (TaskState.CANCELLED, "operator_stop"),
        # Ended when the gateway stopped: no final answer crossed MCP.
        "desk-b/1 via loopguard-mcp-gateway/1": (TaskState.PARTIAL, "goal_unverified"),
    }, said


@live
@pytest.mark.slow
def test_over_streamable_http_a_session_gone_quiet_has_its_task_ended(
    gateway: Gateway, db: Path
) -> None:
    config = {"servers": {"shop": stdio_shop(db)}, "tools": KEYS, "session_idle_seconds": 1}
    served, url = serve_http(gateway, config)
    port = int(url.rsplit(":", 1)[1].split("/")[0])

    async def quiet() -> types.CallToolResult:
        async with session_client(url, "desk-c") as client:
            answer = await client.call_tool("find_order", {"order": 4})

            def ended() -> bool:
                return Task.objects.get().state == TaskState.PARTIAL

            # No message ends an HTTP session: the gateway ends its task once it is quiet,
            # while the client (and the gateway) are still there.
            await in_thread(
                lambda: wait_for(ended, timeout=20, what="the quiet session's task ended")
            )
            return answer

    try:
        wait_for(lambda: listening(port), timeout=30, what="the gateway serving HTTP")
        answer = anyio.run(quiet)
        assert served.poll() is None
    finally:
        served.terminate()
        served.communicate(timeout=30)
    assert text(answer) == "order 4: delivered"
    assert Task.objects.get().reason == "goal_unverified"


def listening(port: int) -> bool:
    """Whether something accepts connections on ``port`` of this machine."""
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


# -- the configuration, without a console ----------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        ({}, "servers must be an object"),
        ({"servers": {}}, "names no upstream server"),
        ({"servers": {"a": {"command": "x", "url": "http://h/mcp"}}}, "either command"),
        ({"servers": {"a": {"url": "ftp://h"}}}, "http:// or https://"),
        ({"servers": {"a__b": {"command": "x"}}}, "has no '__'"),
        ({"servers": {"a": {"command": "x"}}, "tool": {}}, "unknown field 'tool'"),
        ({"servers": {"a": {"command": "x"}}, "tools": {"t": {"key": "refund"}}}, "names no arg"),
        ({"servers": {"a": {"command": "x"}}, "tools": {"t": {"key": "r-{o.x}"}}}, "an argument"),
        ({"servers": {"a": {"command": "x"}}, "tools": {"t": {"key": "r-{o!r}"}}}, "an argument"),
        ({"servers": {"a": {"command": "x"}}, "tools": {"t": {"effect": "rw"}}}, "effect must"),
        ({"servers": {"a": {"command": "x"}}, "timeout_seconds": 0}, "positive number"),
    ],
)
def test_a_bad_configuration_is_refused_saying_what_to_change(raw: Any, says: str) -> None:
    with pytest.raises(ConfigError, match=None) as refused:
        GatewayConfig.parse(raw)
    assert says in str(refused.value)


def test_a_configuration_file_is_read_as_toml_or_json(tmp_path: Path) -> None:
    path = tmp_path / "gateway.toml"
    path.write_text('agent = "a"\n[servers.shop]\nurl = "http://127.0.0.1:1/mcp"\n'
                    '[tools.send_refund]\nkey = "refund-{order}"\n')  # fmt: skip
    config = GatewayConfig.load(path)
    assert config.servers[0].url == "http://127.0.0.1:1/mcp"
    assert config.tools["send_refund"] == ToolRule(key="refund-{order}")
    broken = tmp_path / "gateway.json"
    broken.write_text("{")
    with pytest.raises(ConfigError, match="not valid json"):
        GatewayConfig.load(broken)


def test_an_operation_key_names_the_arguments_or_says_which_is_missing() -> None:
    rule = ToolRule(key="refund-{order}-{line}")
    assert rule.operation_key("send_refund", {"order": 42, "line": "a"}) == ("refund-42-a", "")
    assert rule.operation_key("send_refund", {"order": 42}) == (
        None,
        "send_refund needs the argument 'line' to name its operation",
    )
    key, why = rule.operation_key("send_refund", {"order": {"id": 1}, "line": 1})
    assert key is None and "not text or a number" in why


def test_the_gateway_without_a_console_to_ask_says_what_to_set(tmp_path: Path) -> None:
    done = run(
        [sys.executable, "-m", "guard.contrib.mcp", "--config", str(tmp_path / "none.json")],
        env={k: v for k, v in os.environ.items() if not k.startswith("LOOPGUARD_")},
        timeout=60,
    )
    assert done.returncode == 2
    assert "set LOOPGUARD_URL" in done.stderr
    assert done.stdout == ""  # stdout is the MCP wire: nothing else is ever written there


def test_a_server_that_cannot_be_reached_stops_the_start_saying_which(tmp_path: Path) -> None:
    path = tmp_path / "gateway.json"
    path.write_text(json.dumps({"servers": {"crm": {"url": f"http://127.0.0.1:{free_port()}/mcp"}}}))
    done = run(
        [sys.executable, "-m", "guard.contrib.mcp", "--config", str(path)],
        env={**os.environ, "LOOPGUARD_URL": "http://127.0.0.1:9", "LOOPGUARD_TOKEN": "t"},
        stdin=subprocess.DEVNULL,
        timeout=60,
    )
    assert done.returncode == 2
    assert "server 'crm' could not be reached: ConnectError" in done.stderr
    assert done.stdout == ""


def test_the_gateway_serves_http_on_a_loopback_address_only(tmp_path: Path) -> None:
    done = run(
        [sys.executable, "-m", "guard.contrib.mcp", "--config", str(tmp_path / "g.json"),
         "--http", "0.0.0.0:8765"],
        timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    assert "0.0.0.0 is not a loopback address" in done.stderr
    assert "checks no credentials" in done.stderr
