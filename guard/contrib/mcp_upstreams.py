"""The MCP gateway's upstream servers: a connection to each, the tools they offer under the
names the client calls them by (``server__tool`` only where two servers offer the same
name), each tool's effect and rule, and what is refused before the guard is asked (a tool
that is not there, a write without its operation key, a read of a server that has gone).

:mod:`guard.contrib.mcp` asks the guard and sends; this module knows the servers.
"""

from __future__ import annotations

from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any

import mcp_types as types
from mcp import Client, StdioServerParameters

from ..steps import Effect
from .mcp_config import SEPARATOR, ConfigError, GatewayConfig, ToolRule, Upstream

__all__ = ["Route", "Upstreams", "describe"]

_MAX_PAGES = 100  # a server whose tools/list never ends cannot hang the start-up


@dataclass(frozen=True, slots=True)
class Route:
    """A tool as the client sees it (``name``) and where it goes."""

    name: str
    server: str
    tool: types.Tool
    effect: Effect
    rule: ToolRule


class Upstreams:
    """The configured servers, once :meth:`connect` has reached them: a client each and
    the routes of their tools."""

    def __init__(self, config: GatewayConfig) -> None:
        self.config = config
        self.clients: dict[str, Client] = {}
        self.routes: dict[str, Route] = {}
        # Servers whose connection closed (JSON-RPC -32000): what happened, by server.
        # Nothing more can be sent to one: a read is refused before the guard; a write
        # still asks it (the ledger may answer it without the server), and one it lets run
        # is reported as not sent.
        self.gone: dict[str, str] = {}

    async def connect(self, stack: AsyncExitStack) -> None:
        """Connect to every upstream server (kept open on ``stack``) and list its tools."""
        offered: list[tuple[str, types.Tool]] = []
        for upstream in self.config.servers:
            client = Client(_target(upstream), read_timeout_seconds=self.config.timeout_seconds)
            try:
                await stack.enter_async_context(client)
                tools = await _all_tools(client)
            except Exception as exc:
                why = describe(exc)
                raise ConfigError(f"server {upstream.name!r} could not be reached: {why}") from exc
            self.clients[upstream.name] = client
            offered += [(upstream.name, tool) for tool in tools]
        counts: dict[str, int] = {}
        for _, tool in offered:
            counts[tool.name] = counts.get(tool.name, 0) + 1
        for server, tool in offered:
            name = tool.name if counts[tool.name] == 1 else f"{server}{SEPARATOR}{tool.name}"
            rule = self.config.tools.get(name, ToolRule())
            hints = tool.annotations
            effect: Effect = rule.effect or (
                "read" if hints is not None and hints.read_only_hint is True else "write"
            )
            self.routes[name] = Route(name, server, tool, effect, rule)

    def problems(self) -> list[str]:
        """What start-up says: each write without an operation key, each rule naming no
        tool."""
        said = []
        for route in self.routes.values():
            if route.effect == "write" and route.rule.key is None:
                said.append(
                    f"{route.name} ({route.server}) is a write without an operation key: its "
                    f'calls will be refused; configure "tools": {{"{route.name}": {{"key": '
                    '"...{argument}..."}}, or "effect": "read" if it changes nothing'
                )
        for name in sorted(set(self.config.tools) - set(self.routes)):
            said.append(f"tools.{name} names no tool of any server (known: {sorted(self.routes)})")
        return said

    def needing_approval(self) -> list[str]:
        """The tools whose calls wait for a person's approval, as the console's start takes
        them."""
        return [name for name, route in self.routes.items() if route.rule.approval]

    def effects(self) -> dict[str, Effect]:
        """Every tool the task may call, name -> effect, as the console's start takes it."""
        return {name: route.effect for name, route in self.routes.items()}

    def listed(self) -> list[types.Tool]:
        """Every upstream tool, under the name the client calls it by.

        Without its output schema: a write answered from the ledger may carry what a
        reconciler found rather than the server's own structured answer, and a client that
        holds results to the schema would refuse that answer."""
        return [
            route.tool.model_copy(update={"name": name, "output_schema": None})
            for name, route in self.routes.items()
        ]

    def route(self, name: str, args: dict[str, Any]) -> tuple[Route, str | None] | str:
        """The route of a call of ``name`` with ``args`` and its operation key (a write's),
        or why it is refused before the guard is asked."""
        route = self.routes.get(name)
        if route is None:
            known = ", ".join(sorted(self.routes))
            return f"there is no tool named {name!r} here; the tools are: {known}"
        key: str | None = None
        if route.effect == "write":
            key, why = route.rule.operation_key(name, args)
            if key is None:
                return (
                    f"not run: {why}, and a call that changes things runs only under a key "
                    "that names its business action (so that it never happens twice). "
                    + ("Give that argument." if route.rule.key else "A person must configure one.")
                )
        if route.effect == "read" and (gone := self.gone.get(route.server)) is not None:
            return (
                f"not run: the server {route.server!r} closed its connection earlier ({gone}); "
                "nothing was sent to it. Restart the MCP client to connect to it again."
            )
        return route, key


def describe(exc: BaseException) -> str:
    """An exception in a line, the first of a group's."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    text = str(exc)
    return f"{type(exc).__name__}: {text[:200]}" if text else type(exc).__name__


def _target(upstream: Upstream) -> StdioServerParameters | str:
    """What :class:`mcp.Client` connects to for ``upstream``."""
    if upstream.url is not None:
        return upstream.url
    if upstream.command is None:  # the configuration allows nothing else
        raise ConfigError(f"server {upstream.name!r} has neither a command nor a url")
    return StdioServerParameters(
        command=upstream.command,
        args=list(upstream.args),
        env=dict(upstream.env) or None,
        cwd=upstream.cwd,
    )


async def _all_tools(client: Client) -> list[types.Tool]:
    tools: list[types.Tool] = []
    cursor: str | None = None
    for _ in range(_MAX_PAGES):
        page = await client.list_tools(cursor=cursor)
        tools += page.tools
        cursor = page.next_cursor
        if not cursor:
            break
    return tools
