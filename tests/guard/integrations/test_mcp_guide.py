"""docs/agent-guide.md's "Put an MCP client behind LoopGuard" runs as printed, against a live
console: its gateway configuration (the shop over stdio, the crm over Streamable HTTP) with
only the placeholder paths, the crm's port, the console's URL and the token filled in (and
the wait for an approval nobody gives shortened to a second); the
desktop client's ``mcpServers`` entry started as a desktop client starts it, with the SDK's
own client; and the Agents SDK example executed as a module, printing what it promises.
The shop and the crm count their effects: each refund asked for twice happens once."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mcp")

import anyio
import mcp_types as types
from django.contrib.auth.models import User
from mcp import Client, StdioServerParameters

from console.api.tokens import api_token_issue
from console.models import Operation, OperationState, Task
from console.records.roles import Role, assign
from tests.docs.test_integration_examples import (
    GUIDE,
    example_source,
    promised_output,
    run_example,
)
from tests.up_process import free_port
from tests.waiting import wait_for

from .test_mcp_gateway import SHOP, effects, listening, text

TITLE = "## Put an MCP client behind LoopGuard"
CRM = Path(__file__).with_name("mcp_crm.py")

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def json_blocks() -> list[Any]:
    """The section's JSON blocks, read: the gateway's configuration, the desktop entry."""
    text = GUIDE.read_text(encoding="utf-8").split(TITLE, 1)[1]
    return [json.loads(b) for b in re.findall(r"^```json\n(.*?)^```", text, flags=re.S | re.M)]


@pytest.fixture
def crm(tmp_path: Path) -> Iterator[tuple[int, Path]]:
    db, port = tmp_path / "crm.sqlite", free_port()
    server = subprocess.Popen(  # noqa: S603 - our own script
        [sys.executable, str(CRM), str(port)],
        env={**os.environ, "CRM_DB": str(db)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(lambda: listening(port), timeout=20, what="the crm listening")
        yield port, db
    finally:
        server.kill()
        server.wait(timeout=10)


@pytest.fixture
def setup(
    tmp_path: Path, live_server: Any, crm: tuple[int, Path], monkeypatch: pytest.MonkeyPatch
) -> dict[str, Any]:
    """The guide's gateway.json written with this machine's paths; the environment the
    examples read."""
    user = User.objects.create_user("desk-assistant")
    assign(user, [Role.AGENT])
    token = api_token_issue(user=user, name="mcp guide")[1]
    port, crm_db = crm
    shop_db = tmp_path / "shop.sqlite"
    filled = {
        "/path/to/venv/bin/python": sys.executable,
        "/path/to/shop_server.py": str(SHOP),
        "/path/to/shop.sqlite": str(shop_db),
        "http://127.0.0.1:8001/mcp": f"http://127.0.0.1:{port}/mcp",
    }
    raw = json.dumps(json_blocks()[0])
    for placeholder, value in filled.items():
        assert placeholder in raw, placeholder
        raw = raw.replace(json.dumps(placeholder)[1:-1], json.dumps(value)[1:-1])
    shortened = json.loads(raw) | {"approval_wait_seconds": 1}  # nobody approves here
    config = tmp_path / "gateway.json"
    config.write_text(json.dumps(shortened))
    for name, value in {
        "LOOPGUARD_URL": str(live_server.url),
        "LOOPGUARD_TOKEN": token,
        "GATEWAY_CONFIG": str(config),
        "NO_PROXY": "*",
    }.items():
        monkeypatch.setenv(name, value)
    return {"config": config, "shop_db": shop_db, "crm_db": crm_db, "token": token}


def test_the_desktop_clients_entry_runs_the_guides_gateway(setup: dict[str, Any]) -> None:
    entry = json_blocks()[1]["mcpServers"]["tools-behind-loopguard"]
    args = [str(setup["config"]) if a == "/path/to/gateway.json" else a for a in entry["args"]]
    env = {"LOOPGUARD_URL": os.environ["LOOPGUARD_URL"], "LOOPGUARD_TOKEN": setup["token"]}
    assert set(entry["env"]) == set(env)
    # The guard distribution's command, as pip installed it beside this interpreter.
    assert entry["command"] == "/path/to/venv/bin/loopguard-mcp-gateway"
    command = Path(sys.executable).with_name("loopguard-mcp-gateway")
    params = StdioServerParameters(command=str(command), args=args, env=env)

    async def session() -> list[types.CallToolResult | list[str]]:
        async with Client(params, cache=None) as client:
            names = sorted(tool.name for tool in (await client.list_tools()).tools)
            return [
                names,
                await client.call_tool("send_refund", {"order": 42}),
                await client.call_tool("send_refund", {"order": 42}),
                await client.call_tool("find_customer", {"account": "a-7"}),
                await client.call_tool("close_account", {"account": "a-7"}),
            ]

    names, first, again, found, held = anyio.run(session)
    assert names == ["close_account", "delete_order", "find_customer", "find_order", "send_refund"]
    assert text(first) == text(again) == "refund of 10 sent for order 42"
    assert effects(setup["shop_db"], "refund") == [42]
    assert text(found) == "customer a-7: active"
    assert held.is_error and "waits for a person's approval" in text(held)
    assert _closed(setup["crm_db"]) == 0
    assert Task.objects.get().agent == "desk-assistant"


def test_the_agents_sdk_example_refunds_once_through_the_gateway(
    setup: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("agents")
    source = example_source("mcp-openai-agents", TITLE)
    namespace, printed = run_example("mcp-openai-agents", monkeypatch, TITLE)
    assert printed == promised_output(source)
    assert namespace["model"].remaining_steps == 0  # the whole script was played
    assert effects(setup["shop_db"], "refund") == [42]  # asked for twice, refunded once
    assert Operation.objects.get(key="refund-42").state == OperationState.COMMITTED
    task = Task.objects.get()
    assert (task.agent, task.requests, task.executions) == ("desk-assistant", 2, 1)
    assert task.client.endswith(" via loopguard-mcp-gateway/1")


def _closed(db: Path) -> int:
    import sqlite3

    if not db.exists():
        return 0
    with sqlite3.connect(db) as conn:
        return int(conn.execute("SELECT count(*) FROM effects WHERE kind = 'close'").fetchone()[0])
