"""What the MCP gateway adds to a tool call: the same calls to the same MCP server, with the
SDK's own client, straight to the server and through ``guard.contrib.mcp`` with the console
deciding each one over loopback.

Run: ``.venv/bin/python benchmarks/mcp_gateway.py [--calls N] [--quick]``.

The server is the SDK's ``MCPServer`` over stdio (written to a scratch folder): a read
(``read_page``, a new page each call, so that no repeat rule stops the run) and a write
(``send_notice``, a new operation key each call), alternating, each appending a line to a
file (its business records). The console is served by gunicorn on 127.0.0.1 as ``manage.py
up`` serves it (two workers of four threads, DEBUG off), on a database of its own beside the
one ``DATABASE_URL`` names (``<name>_mcp``, created and migrated at the start, dropped at
the end; the one ``DATABASE_URL`` names is never touched).

Columns: p50, p95 and mean of one ``call_tool`` as the client sees it, in milliseconds, for
**direct** (client → server) and **gateway** (client → gateway → the console's guard →
server); **added** is gateway minus direct at each quantile: the gateway's cost per call
(two console requests, ``tools`` with ``enter`` and ``result`` with ``then``, plus the hop
through the gateway's process). Each side gets a few unmeasured calls first (imports,
connections). After the run the script checks what a user would: every call answered
without an error, each write's line in the records once, and the console's task with one
execution per call; it stops with a message otherwise. Nothing fails on a number.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import anyio
import runner_throughput as rt
from attached_steps import Scratch, Web
from mcp import Client, StdioServerParameters

AGENT = "bench-mcp"
WARM = 4

SERVER = '''
import sys
from mcp.server.mcpserver import MCPServer
from mcp_types import ToolAnnotations

server = MCPServer("bench")
RECORDS = sys.argv[1]


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def read_page(page: int) -> str:
    """A page of the knowledge base."""
    return f"page {page}: nothing new"


@server.tool()
def send_notice(n: int) -> str:
    """Send one notice."""
    with open(RECORDS, "a") as records:
        records.write(f"{n}\\n")
    return f"notice {n} sent"


server.run("stdio")
'''


def calls_of(count: int, start: int) -> list[tuple[str, dict[str, Any]]]:
    """``count`` calls, a read and a write in turn, each with arguments of its own."""
    return [
        ("read_page", {"page": start + n}) if n % 2 == 0 else ("send_notice", {"n": start + n})
        for n in range(count)
    ]


Calls = Sequence[tuple[str, dict[str, Any]]]


async def timed(params: StdioServerParameters, calls: Calls) -> list[float]:
    """Milliseconds of each measured call (the first ``WARM`` are not measured)."""
    seconds: list[float] = []
    async with Client(params, cache=None) as client:
        for index, (tool, args) in enumerate(calls):
            began = time.perf_counter()
            answer = await client.call_tool(tool, args)
            took = time.perf_counter() - began
            if answer.is_error:
                raise SystemExit(f"{tool} {args} answered an error: {answer.content}")
            if index >= WARM:
                seconds.append(took * 1000.0)
    return seconds


def quantile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def row(label: str, values: Sequence[float]) -> str:
    p50, p95 = quantile(values, 0.5), quantile(values, 0.95)
    return f"{label:<10}{p50:>10.2f}{p95:>10.2f}{statistics.fmean(values):>10.2f}"


def scratch_of(database_url: str) -> Scratch:
    """``<name>_mcp`` beside ``database_url``'s database (never that one), so that this
    benchmark and attached_steps.py (``<name>_attached``) may run at once."""
    beside = Scratch.from_url(database_url)
    name = beside.name.removesuffix("_attached") + "_mcp"
    return Scratch(beside.server, beside.url.replace(f"/{beside.name}", f"/{name}", 1), name)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        description="What the MCP gateway adds to a tool call (p50/p95 of call_tool, in ms).",
        epilog=__doc__.split("\n\n", 1)[1] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--calls", type=int, default=None, help="measured calls (default 200)")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 20 calls")
    options = parser.parse_args(argv)
    calls = options.calls if options.calls is not None else (20 if options.quick else 200)
    if calls < 2:
        parser.error("--calls must be at least 2")
    url = os.environ.get("DATABASE_URL") or rt.DEFAULT_DATABASE_URL
    scratch = scratch_of(url)
    rt.recreate(scratch.server, scratch.name)
    try:
        with tempfile.TemporaryDirectory(prefix="loopguard-mcp-") as folder:
            return _measure(scratch, calls, Path(folder))
    finally:
        rt.drop(scratch.server, scratch.name)


def _measure(scratch: Scratch, calls: int, folder: Path) -> int:
    rt.setup_django(scratch.url)
    from django.contrib.auth.models import User
    from django.core.management import call_command
    from django.db import connections

    from console.api.tokens import api_token_issue
    from console.models import Task
    from console.records.roles import Role, assign

    call_command("migrate", verbosity=0)
    user = User.objects.create_user(f"bench-mcp-{uuid.uuid4().hex[:8]}")
    assign(user, [Role.AGENT])
    _, token = api_token_issue(user=user, name="mcp benchmark")
    connections.close_all()

    server_file, records = folder / "server.py", folder / "records.txt"
    server_file.write_text(SERVER)
    upstream = StdioServerParameters(command=sys.executable, args=[str(server_file), str(records)])
    total = calls + WARM
    config = {
        "agent": AGENT,
        "servers": {"bench": {"command": sys.executable, "args": upstream.args}},
        "tools": {"send_notice": {"key": f"bench-{uuid.uuid4().hex[:8]}-notice-{{n}}"}},
        "limits": {
            "deadline_ms": 3_600_000,
            "model_calls": total + 2,
            "requests": total + 2,
            "executions": total + 2,
            "stagnant": total + 2,
            "explore": None,
        },
    }
    (folder / "gateway.json").write_text(json.dumps(config))

    web = Web(scratch.url, 2, 4, folder / "gunicorn.log")
    try:
        web.wait_ready()
        gateway = StdioServerParameters(
            command=sys.executable,
            args=["-m", "guard.contrib.mcp", "--config", str(folder / "gateway.json")],
            env={"LOOPGUARD_URL": web.url, "LOOPGUARD_TOKEN": token, "NO_PROXY": "*",
                 "PYTHONPATH": str(Path(__file__).resolve().parent.parent)},
            cwd=str(Path(__file__).resolve().parent.parent),
        )  # fmt: skip
        direct = anyio.run(timed, upstream, calls_of(total, 0))
        guarded = anyio.run(timed, gateway, calls_of(total, 100_000))
    except BaseException:
        print(web.log_tail(), file=sys.stderr)
        raise
    finally:
        web.stop()

    writes = sum(1 for tool, _ in calls_of(total, 0) if tool == "send_notice")
    lines = records.read_text().split()
    if len(lines) != 2 * writes or len(set(lines)) != len(lines):
        raise SystemExit(f"{len(lines)} notices for {2 * writes} writes, or one sent twice")
    task = Task.objects.get(agent=AGENT)
    if task.executions != total:
        raise SystemExit(f"the gateway's task counts {task.executions} executions, not {total}")

    print(f"{calls} measured calls each (after {WARM} unmeasured), reads and writes in turn")
    print(f"{'':<10}{'p50 ms':>10}{'p95 ms':>10}{'mean ms':>10}")
    print(row("direct", direct))
    print(row("gateway", guarded))
    added50 = quantile(guarded, 0.5) - quantile(direct, 0.5)
    added95 = quantile(guarded, 0.95) - quantile(direct, 0.95)
    print(f"{'added':<10}{added50:>10.2f}{added95:>10.2f}"
          f"{statistics.fmean(guarded) - statistics.fmean(direct):>10.2f}")  # fmt: skip
    outcome = f"{task.state}/{task.reason}"
    print(f"checked: every call answered, {2 * writes} notices each once, "
          f"task {task.id} {outcome} with {task.executions} executions")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
