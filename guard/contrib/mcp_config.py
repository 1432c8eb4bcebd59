"""The MCP gateway's configuration (:mod:`guard.contrib.mcp`), read and checked: standard
library only, so that a file can be checked where the SDK is not installed. Every problem
is a :exc:`ConfigError` whose message says what to change."""

from __future__ import annotations

import json
import math
import string
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..steps import Effect

__all__ = ["SEPARATOR", "ConfigError", "GatewayConfig", "ToolRule", "Upstream"]

SEPARATOR = "__"
"""Between a server's name and its tool's, for a name two servers share."""

_FIELD = string.Formatter()


class ConfigError(ValueError):
    """The configuration cannot be used; the message says what to change."""


# -- the configuration -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Upstream:
    """One tool server: a ``command`` (with ``args``, ``env``, ``cwd``) run over stdio, or a
    Streamable HTTP ``url``."""

    name: str
    command: str | None = None
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None
    url: str | None = None


@dataclass(frozen=True, slots=True)
class ToolRule:
    """What the configuration says of one tool: its operation ``key`` (a template naming
    the arguments of the business action, ``"refund-{order}"``), an ``effect`` that
    overrides its annotations, and whether it needs a person's ``approval``."""

    key: str | None = None
    effect: Effect | None = None
    approval: bool = False

    def operation_key(self, tool: str, args: Mapping[str, Any]) -> tuple[str | None, str]:
        """The key of this call's business action, or ``None`` and why there is none."""
        if self.key is None:
            return None, f"no operation key is configured for {tool}"
        parts: list[str] = []
        for literal, name, _, _ in _FIELD.parse(self.key):
            parts.append(literal)
            if name is None:
                continue
            if name not in args:
                return None, f"{tool} needs the argument {name!r} to name its operation"
            value = args[name]
            if isinstance(value, bool) or not isinstance(value, str | int | float):
                return None, f"the argument {name!r} of {tool} is not text or a number"
            if isinstance(value, str) and not value.strip():
                return None, f"the argument {name!r} of {tool} is empty"
            parts.append(str(value))
        return "".join(parts), ""


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    """The gateway's configuration: the task's ``agent`` name, the upstream ``servers``,
    the per-tool ``tools`` rules (by the name the client sees, ``server__tool`` where
    namespaced), the guard's ``limits`` (the console's defaults fill the rest), the
    seconds an upstream call may take before its answer counts as lost, (over HTTP) the
    seconds a session may go without a call before its task is ended, and the seconds a
    call held for a person's approval is waited on before it is answered that it waits."""

    servers: tuple[Upstream, ...]
    agent: str = "mcp-gateway"
    tools: Mapping[str, ToolRule] = field(default_factory=dict)
    limits: Mapping[str, Any] = field(default_factory=dict)
    timeout_seconds: float = 60.0
    session_idle_seconds: float = 1800.0
    approval_wait_seconds: float = 120.0

    @classmethod
    def load(cls, path: Path) -> GatewayConfig:
        """Read and check a configuration file (TOML by its ``.toml`` suffix, else JSON)."""
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"{path}: cannot be read ({exc.strerror or exc})") from exc
        try:
            raw = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
        except ValueError as exc:
            kind = path.suffix.lstrip(".") or "JSON"
            raise ConfigError(f"{path}: not valid {kind}: {exc}") from exc
        return cls.parse(raw, where=str(path))

    @classmethod
    def parse(cls, raw: Any, *, where: str = "the configuration") -> GatewayConfig:
        """Check a configuration already read; every problem is a :exc:`ConfigError`."""
        known = {
            "agent",
            "servers",
            "tools",
            "limits",
            "timeout_seconds",
            "session_idle_seconds",
            "approval_wait_seconds",
        }
        top = _object(raw, where, known)
        servers_raw = _object(top.get("servers"), f"{where}: servers", None)
        if not servers_raw:
            raise ConfigError(f"{where}: servers names no upstream server")
        servers = tuple(_upstream(name, value, where) for name, value in servers_raw.items())
        tools_raw = _object(top.get("tools", {}), f"{where}: tools", None)
        tools = {name: _rule(name, value, where) for name, value in tools_raw.items()}
        agent = top.get("agent", "mcp-gateway")
        if not isinstance(agent, str) or not agent:
            raise ConfigError(f"{where}: agent must be a name (text)")
        limits = _object(top.get("limits", {}), f"{where}: limits", None)
        timeout = _seconds(top, "timeout_seconds", 60.0, where)
        idle = _seconds(top, "session_idle_seconds", 1800.0, where)
        approval_wait = _seconds(top, "approval_wait_seconds", 120.0, where)
        return cls(servers, agent, tools, dict(limits), timeout, idle, approval_wait)


def _seconds(top: Mapping[str, Any], name: str, default: float, where: str) -> float:
    value = top.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ConfigError(f"{where}: {name} must be a positive number")
    if value <= 0:
        raise ConfigError(f"{where}: {name} must be a positive number")
    return float(value)


def _object(value: Any, where: str, allowed: set[str] | None) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ConfigError(f"{where} must be an object")
    if allowed is not None and (unknown := sorted(set(value) - allowed)):
        raise ConfigError(f"{where}: unknown field {unknown[0]!r} (known: {sorted(allowed)})")
    return value


def _upstream(name: str, value: Any, where: str) -> Upstream:
    here = f"{where}: servers.{name}"
    if not name or SEPARATOR in name:
        raise ConfigError(f"{here}: a server's name is not empty and has no {SEPARATOR!r}")
    entry = _object(value, here, {"command", "args", "env", "cwd", "url"})
    if ("command" in entry) == ("url" in entry):
        raise ConfigError(f"{here}: give either command (stdio) or url (Streamable HTTP)")
    if "url" in entry:
        url = entry["url"]
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ConfigError(f"{here}: url must be an http:// or https:// address")
        if set(entry) != {"url"}:
            raise ConfigError(f"{here}: args, env and cwd are for a command, not a url")
        return Upstream(name, url=url)
    command, args, env = entry["command"], entry.get("args", []), entry.get("env", {})
    if not isinstance(command, str) or not command:
        raise ConfigError(f"{here}: command must be text")
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise ConfigError(f"{here}: args must be a list of text")
    if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
        raise ConfigError(f"{here}: env must map names to text")
    cwd = entry.get("cwd")
    if cwd is not None and not isinstance(cwd, str):
        raise ConfigError(f"{here}: cwd must be a folder's path")
    return Upstream(name, command=command, args=tuple(args), env=dict(env), cwd=cwd)


def _rule(name: str, value: Any, where: str) -> ToolRule:
    here = f"{where}: tools.{name}"
    entry = _object(value, here, {"key", "effect", "approval"})
    key, effect, approval = entry.get("key"), entry.get("effect"), entry.get("approval", False)
    if key is not None:
        if not isinstance(key, str) or not key:
            raise ConfigError(f"{here}: key must be a template such as \"refund-{{order}}\"")
        try:
            fields = [(n, spec, conv) for _, n, spec, conv in _FIELD.parse(key) if n is not None]
        except ValueError as exc:
            raise ConfigError(f"{here}: key {key!r} is not a template: {exc}") from exc
        if not fields:
            raise ConfigError(
                f"{here}: key {key!r} names no argument; a key without one would name every "
                "call of the tool as the same business action"
            )
        for arg, spec, conversion in fields:
            if not arg.isidentifier() or spec or conversion:
                raise ConfigError(f"{here}: key {key!r}: {{{arg}}} must name an argument only")
    if effect not in (None, "read", "write"):
        raise ConfigError(f"{here}: effect must be \"read\" or \"write\"")
    if effect == "read" and key is not None:
        raise ConfigError(f"{here}: only a write has an operation key")
    if not isinstance(approval, bool):
        raise ConfigError(f"{here}: approval must be true or false")
    return ToolRule(key, effect, approval)
