"""An MCP gateway: the guard between any MCP client and its tool servers
(``pip install "loopguard-guard[mcp]"``; ``loopguard-mcp-gateway --config FILE``, or
``python -m guard.contrib.mcp --config FILE``).

The agent's MCP client (a desktop assistant, a coding agent, the OpenAI Agents SDK's MCP
tools) runs this process instead of its servers. It speaks MCP to the client over stdio
(or Streamable HTTP, ``--http HOST:PORT``) and connects to each configured upstream server
(a command over stdio, or a Streamable HTTP URL); it lists their tools as its own —
``server__tool`` only where two servers offer the same name — and passes every
``tools/call`` through the console's guard with :mod:`guard.remote`. Each client session
is an attached task on the console, owned by the token it runs with (``LOOPGUARD_URL``,
``LOOPGUARD_TOKEN``), named after the client that drives it: over stdio the process's one
client; over HTTP each MCP session id (clients of the stateless protocol, which have no
session, share one task). The tasks are kept by the gateway, never on the SDK's session
object, which the SDK makes anew for each request.

What a call comes to:

- **Effects from the tools' own annotations.** ``readOnlyHint: true`` is a read; anything
  else is a write (a tool that says nothing may change things). The configuration may say
  otherwise for a tool (``"effect"``).
- **A write needs an operation key**, named from its arguments by the configuration
  (``"key": "refund-{order}"``: which arguments name the business action, never the
  client's request id). A write without one is answered with a tool error before it
  reaches the server, and start-up prints which tools lack one.
- **Every call asks the guard first** (one model call and one tool call of the task each:
  MCP shows no model calls): repeats, short cycles and no progress (a never-seen result
  counts as exploration), the request and execution budgets and the deadline. A
  ``COMMITTED`` write asked again is answered from the ledger without reaching the server.
- **A lost answer** (the server timed out, exited mid-call — JSON-RPC -32000 —, or the
  connection dropped) leaves a write ``UNKNOWN`` for the reconciliation queue, and the task
  ``NEEDS_HUMAN``; it is never sent again.
- **A stop** (an operator's Stop, a budget, a repeat) answers that call and every later
  one with a tool error (``isError: true``) that says the task is stopped and why, in words
  that do not invite a retry.
- **Approval** (``"approval": true``): the tool is named in the task's ``approval`` at
  start, so its calls never run before a person approves that exact call on the console.
  The gateway holds the MCP call meanwhile, asking the console every second, up to
  ``approval_wait_seconds`` (120 by default): approved, it takes the resumed task, sends
  the same call again, runs it and answers it; rejected, it answers a tool error saying a
  person rejected it and why, not to be asked again; still undecided, a tool error saying
  it waits for a person (the task stays held; the call asked again after a yes runs).
- A tool error the server itself returns (``isError: true``) is a ``RETRYABLE`` result for
  a read (the model may correct itself, within the repeat limit) and a ``FATAL`` one for a
  write: nothing verifies that it did not take effect, so the write is ``UNKNOWN`` for a
  reconciler and the task stops ``NEEDS_HUMAN``/``unknown_commit``.

What it cannot see: the client's model calls, tokens and spend never cross MCP, so only
the request, execution, repeat, cycle, no-progress and deadline budgets apply; the model
call budget counts one per tool call.

The configuration (JSON, or TOML by its ``.toml`` suffix)::

    {
      "agent": "desktop-assistant",
      "servers": {
        "shop": {"command": "python", "args": ["shop_server.py"], "env": {"SHOP_DB": "shop.db"}},
        "crm": {"url": "http://127.0.0.1:8001/mcp"}
      },
      "tools": {
        "send_refund": {"key": "refund-{order}"},
        "close_account": {"key": "close-{account}", "approval": true}
      },
      "limits": {"model_calls": 200, "requests": 200, "executions": 150},
      "timeout_seconds": 30,
      "session_idle_seconds": 1800,
      "approval_wait_seconds": 120
    }

It is read and checked by :mod:`guard.contrib.mcp_config` (standard library only); the
servers and their tools are :mod:`guard.contrib.mcp_upstreams`'.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AsyncExitStack, contextmanager
from functools import partial
from pathlib import Path
from typing import Any, TextIO

import anyio
import anyio.to_thread
import mcp_types as types
import uvicorn
from mcp import MCPError
from mcp.server import Server
from mcp.server.stdio import stdio_server

from .. import Call, Kind, Nudge, Reason, Report, Result, State
from ..remote import ConsoleUnreachable, ProtocolError, RemoteGuard
from ..steps import Action, Effect, Next, Sequencer, Ticket, fingerprint
from .mcp_config import ConfigError, GatewayConfig, ToolRule, Upstream
from .mcp_upstreams import Route, Upstreams, describe

__all__ = ["ConfigError", "Gateway", "GatewayConfig", "ToolRule", "Upstream", "main"]

log = logging.getLogger(__name__)

GATEWAY = "loopguard-mcp-gateway/1"
"""What the gateway calls itself: to its clients, and in the task's ``client`` field."""
APPROVAL_POLL_SECONDS = 1.0
"""How often a call held for a person's approval asks the console whether one decided."""

# -- the gateway -----------------------------------------------------------------------------


class _Task:
    """One attached task of the gateway: its guard, its order of steps, and the lock that
    answers its calls one at a time (one task's steps have one order). Kept here, by
    session, never on the SDK's session object, which is made anew for each request."""

    def __init__(self) -> None:
        self.guard: RemoteGuard | None = None
        self.seq: Sequencer | None = None
        self.lock = anyio.Lock()
        self.used = time.monotonic()


class Gateway:
    """One gateway process: its upstream clients, its tools and its attached tasks — one
    over stdio, one per MCP session over Streamable HTTP (clients without a session, of
    the stateless protocol, share one).

    ``start_guard`` makes a task's guard (by default :meth:`RemoteGuard.start` on ``url``
    with ``token``; ``attach_guard``, :meth:`RemoteGuard.attach`, takes it again after an
    approved resumption); a task starts at its session's first ``tools/call``, when the
    client's name is known."""

    def __init__(
        self,
        config: GatewayConfig,
        *,
        url: str,
        token: str,
        start_guard: Callable[..., RemoteGuard] | None = None,
        attach_guard: Callable[..., RemoteGuard] | None = None,
    ) -> None:
        self.config = config
        self._url, self._token = url, token
        self._start_guard = start_guard or RemoteGuard.start
        self._attach_guard = attach_guard or RemoteGuard.attach
        self.upstreams = Upstreams(config)
        self.tasks: dict[str | None, _Task] = {}  # by MCP session id (None: no session)

    # -- the MCP handlers ----------------------------------------------------------------------

    async def list_tools(
        self, ctx: Any, params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        """``tools/list``: every upstream tool, under the name the client calls it by
        (:meth:`Upstreams.listed`)."""
        return types.ListToolsResult(tools=self.upstreams.listed())

    async def call_tool(
        self, ctx: Any, params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        """``tools/call``: asked of the guard, then run, answered from the ledger, or refused."""
        task = self.tasks.setdefault(_session_id(ctx), _Task())
        async with task.lock:
            task.used = time.monotonic()
            try:
                return await self._call(task, ctx, params.name, dict(params.arguments or {}))
            finally:
                task.used = time.monotonic()

    async def _call(
        self, task: _Task, ctx: Any, name: str, args: dict[str, Any]
    ) -> types.CallToolResult:
        routed = self.upstreams.route(name, args)
        if isinstance(routed, str):
            return _error(routed)
        route, key = routed
        call = Call(name, args, route.effect, key)
        try:
            seq = await self._sequencer(task, ctx)
            answer = await self._guarded(seq, route, call)
            if _held(task.guard, call):
                return await self._approved_or_not(task, route, call)
            return answer
        except (ConsoleUnreachable, ProtocolError) as exc:
            log.warning("the console could not be asked about %s: %s", name, exc)
            return _error(f"not run: the LoopGuard console could not be asked ({exc}).")

    async def _sequencer(self, task: _Task, ctx: Any) -> Sequencer:
        """The task's step order, the task started on the console at its first call (and
        taken again after a person approved its resumption)."""
        if task.guard is not None and task.guard.report is not None:
            await _blocking(partial(self._come_back, task))
        if task.seq is None:
            client = _client_of(ctx)
            guard = await _blocking(
                lambda: self._start_guard(
                    self._url,
                    token=self._token,
                    agent=self.config.agent,
                    tools=self.upstreams.effects(),
                    client=f"{client} via {GATEWAY}",
                    input={"mcp_client": client, "servers": [s.name for s in self.config.servers]},
                    limits=dict(self.config.limits) or None,
                    reason="an MCP client's session through the gateway",
                    approval=self.upstreams.needing_approval(),
                )
            )
            task.guard, task.seq = guard, Sequencer(guard, inspect=None)
        return task.seq

    def _come_back(self, task: _Task) -> None:
        """A stopped task may have been resumed by a person since (a new phase, its budgets
        carried over): if so, drive it again from here with a new lease. Asked at a call
        after the stop, so a task that stays stopped costs one heartbeat per refused call.
        A stop that changed meanwhile (a held call a person rejected) is the one kept."""
        stopped = task.guard
        if stopped is None:
            return
        report = stopped.report
        if report is not None and report.state == State.COMPLETED:
            return  # never resumed
        try:
            again = self._attach_guard(self._url, token=self._token, task=stopped.task, wait=5.0)
        except (ConsoleUnreachable, ProtocolError) as exc:
            log.info("task %s: not taken again (%s)", stopped.task, exc)
            return
        now = again.report
        if now is not None:
            again.close()  # still stopped: later calls are answered with its report
            if report is not None and (now.state, now.reason) == (report.state, report.reason):
                return
        stopped.close()
        task.guard, task.seq = again, Sequencer(again, inspect=None)

    async def _approved_or_not(
        self, task: _Task, route: Route, call: Call
    ) -> types.CallToolResult:
        """The call in hand is held for a person: wait (asking the console every
        ``APPROVAL_POLL_SECONDS``, up to the configured ``approval_wait_seconds``) until
        one decides. Approved, the resumed task is taken and the same call sent again: the
        console admits exactly that call, once. The MCP call stays unanswered meanwhile;
        the task's lock holds this session's other calls back, as one task's steps have
        one order."""
        until = time.monotonic() + self.config.approval_wait_seconds
        while True:
            await _blocking(partial(self._come_back, task))
            guard, seq = task.guard, task.seq
            if guard is None or seq is None:  # pragma: no cover - a held call has its guard
                return _error("not run: this session's task is gone.")
            report = guard.report
            if report is None:  # resumed: a person approved it (or let the task go on)
                log.info("task %s: resumed; sending the held %s again", guard.task, call.tool)
                answer = await self._guarded(seq, route, call)
                resent = guard.report
                if resent is not None and resent.reason is Reason.APPROVAL_REJECTED:
                    # Rejected, and the task let go on: the call asked again ends it.
                    return _error(_rejected_text(call.tool, resent))
                return answer
            if report.reason is Reason.APPROVAL_REJECTED:
                return _error(_rejected_text(call.tool, report))
            if not _held(guard, call):  # stopped otherwise meanwhile (an operator's Stop)
                return _stopped(report)
            if time.monotonic() >= until:
                return _error(
                    f"not run: {call.tool} waits for a person's approval on the LoopGuard "
                    "console, and nobody has decided yet. It will not run unless a person "
                    "approves it; tell the user it is waiting for approval, and do not ask "
                    "for it again until they say it was approved."
                )
            await anyio.sleep(APPROVAL_POLL_SECONDS)

    async def _guarded(self, seq: Sequencer, route: Route, call: Call) -> types.CallToolResult:
        """One call's steps: the wait its predecessor asked for, the model call (MCP shows
        none: one per tool call), the call admitted and entered in one request, then run
        upstream and reported — or the ledger's result, or the stop."""
        if seq.next().next is Next.WAIT:
            pause = await _blocking(seq.pause)
            if isinstance(pause, Report):
                return _stopped(pause)
            if pause > 0:
                await anyio.sleep(pause / 1000.0)
        if (stop := await _blocking(seq.model)) is not None:
            return _stopped(stop)
        admitted = await _blocking(lambda: seq.proposed(call, enter=True))
        if isinstance(admitted, Report):
            return _stopped(admitted)
        if isinstance(admitted, Nudge):
            return _error(admitted.message)
        ticket = admitted[0]
        decision = await _blocking(lambda: seq.enter(ticket))
        if decision.action is Action.STOP:
            return _stopped(decision.report or _report_of(seq))
        if decision.action is Action.REUSE:
            return _replayed(decision.result)
        return await self._run(seq, route, ticket)

    async def _run(self, seq: Sequencer, route: Route, ticket: Ticket) -> types.CallToolResult:
        """Send the allowed call upstream once, and report what came back (or that the
        answer was lost: then a write is ``UNKNOWN``, and it is never sent again)."""
        client = self.upstreams.clients[route.server]
        if (gone := self.upstreams.gone.get(route.server)) is not None:
            # Claimed, and surely not sent; protocol 1 has no word for "verified not sent",
            # so the write waits for a reconciler as UNKNOWN (who marks it not committed).
            why = f"the server {route.server!r} closed its connection earlier ({gone})"
            await _told(partial(seq.raised, ticket, ConnectionError(f"not sent: {why}")))
            return _error(
                f"not run: {why}, so this call was not sent. A person will confirm that "
                "before it may run again; do not ask for it again."
            )
        try:
            answer = await client.call_tool(route.tool.name, dict(ticket.call.args))
        except Exception as exc:
            if isinstance(exc, MCPError) and exc.code == types.CONNECTION_CLOSED:
                self.upstreams.gone[route.server] = describe(exc)
            await _told(partial(seq.raised, ticket, exc))
            lost = f"the answer of {route.name} was lost ({describe(exc)})"
            if route.effect == "write":
                return _error(
                    f"{lost}: whether it took effect is unknown, so it will not be run again; "
                    "a person will check it. Do not ask for it again."
                )
            return _error(f"{lost}; the task is stopped.")
        except BaseException as exc:  # cancelled while it ran: its outcome is lost too
            with anyio.CancelScope(shield=True):
                await _blocking(partial(seq.interrupted, ticket, exc))
            raise
        await _told(lambda: seq.returned(ticket, _result_of(answer, route.effect)))
        return answer

    def close(self) -> list[Report]:
        """The gateway stops: end every task (below); their reports."""
        reports = [self.end(key) for key in list(self.tasks)]
        return [report for report in reports if report is not None]

    def end(self, key: str | None) -> Report | None:
        """A client went away: end its task (``PARTIAL``/``goal_unverified`` unless it
        stopped before: MCP carries no final answer to verify) and stop its heartbeat."""
        task = self.tasks.pop(key, None)
        if task is None or task.seq is None or task.guard is None:
            return None
        try:
            return task.seq.end()
        except (ConsoleUnreachable, ProtocolError) as exc:
            log.warning("task %s: its end was not told to the console: %s", task.guard.task, exc)
            return None
        finally:
            task.guard.close()

    async def end_idle(self, idle_seconds: float) -> None:
        """Over HTTP no message says that a session is over: end the task of a session
        without a call for ``idle_seconds`` (its heartbeat would keep it running for ever)."""
        while True:
            await anyio.sleep(min(5.0, idle_seconds / 2))
            now = time.monotonic()
            for key, task in list(self.tasks.items()):
                if key is not None and not task.lock.locked() and now - task.used > idle_seconds:
                    await _blocking(partial(self.end, key))


# -- the MCP values ------------------------------------------------------------------------


def _result_of(answer: types.CallToolResult, effect: Effect) -> Result:
    """The guard's result for an upstream answer; its data is the answer itself, so that
    a reuse hands the client what the execution gave it."""
    data = answer.model_dump(mode="json", by_alias=True, exclude_none=True)
    if not answer.is_error:
        return Result(Kind.SUCCESS, data)
    if effect == "read":
        return Result(Kind.RETRYABLE, data, wait_ms=1)  # the model may correct the call
    return Result(Kind.FATAL, data)


def _replayed(result: Result | None) -> types.CallToolResult:
    """A committed write's stored answer, as the server first gave it."""
    data = result.data if result is not None else None
    if isinstance(data, dict):
        try:
            return types.CallToolResult.model_validate(data)
        except ValueError:
            pass
    text = json.dumps(data, ensure_ascii=False, default=repr)
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)])


def stop_text(report: Report) -> str:
    """What a refused call tells the model: the task is stopped, why, and that nothing more
    will run. It never invites a retry (a write whose outcome is uncertain must not be asked
    for again before a person has settled it)."""
    why = f"{report.state}/{report.reason}"
    if report.detail:
        why += f": {report.detail}"
    return (
        f"not run: the task is stopped ({why}). No tool will run any more in this task, so "
        "do not ask for this or any other call again; tell the user the task was stopped."
    )


def _held(guard: RemoteGuard | None, call: Call) -> bool:
    """Whether the task stopped to wait for a person's approval of this very call (the
    same tool, arguments and operation key: the stop report's ``pending``)."""
    report = None if guard is None else guard.report
    if report is None or report.reason is not Reason.APPROVAL_REQUIRED:
        return False
    pending = report.pending or {}
    try:
        same = pending.get("fingerprint") == fingerprint(call.tool, call.args)
    except (TypeError, ValueError):
        return False
    return same and pending.get("operation_key") == call.operation_key


def _rejected_text(tool: str, report: Report) -> str:
    """A rejection in words a model will not retry: refused by a person, final."""
    why = report.detail or f"a person rejected the call to {tool}"
    return (
        f"not run: a person rejected this call to {tool} on the LoopGuard console ({why}). "
        "It was not run and it will not be run; do not ask for it again. Go on without it, "
        "or tell the user what is left undone."
    )


def _stopped(report: Report) -> types.CallToolResult:
    return _error(stop_text(report))


def _error(text: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)], is_error=True)


def _report_of(seq: Sequencer) -> Report:
    report = seq.report
    if report is None:  # pragma: no cover - a STOP decision always comes with its report
        raise RuntimeError("the guard refused a call without a stop report")
    return report


def _session_id(ctx: Any) -> str | None:
    """The MCP session a request belongs to (Streamable HTTP's ``Mcp-Session-Id``), or
    ``None``: stdio, or a client of the stateless protocol, which has no session."""
    headers = getattr(getattr(ctx, "request", None), "headers", None)
    found = headers.get("mcp-session-id") if headers is not None else None
    return found if isinstance(found, str) and found else None


def _client_of(ctx: Any) -> str:
    """The MCP client's name and version, as it gave them (``an MCP client`` if not)."""
    params = getattr(getattr(ctx, "session", None), "client_params", None)
    info = getattr(params, "client_info", None)
    if info is None:
        return "an MCP client"
    version = f"/{info.version}" if getattr(info, "version", "") else ""
    return f"{info.name}{version}"[:150]


async def _told(step: Callable[[], object]) -> None:
    """Report what a call that ran came to. The call ran whatever the console says now, so
    a console that cannot be told does not turn its answer into "not run": the next call
    meets the unreported step instead (refused: nothing more runs), and a write left
    ``IN_FLIGHT`` becomes ``UNKNOWN`` for a person when the lease runs out."""
    try:
        await _blocking(step)
    except (ConsoleUnreachable, ProtocolError) as exc:
        log.warning("a call ran, and the console could not be told what it came to: %s", exc)


async def _blocking[T](step: Callable[[], T]) -> T:
    """A guard step (blocking HTTP to the console) off the event loop."""
    return await anyio.to_thread.run_sync(step)


# -- the process ---------------------------------------------------------------------------


async def serve(
    config: GatewayConfig,
    *,
    url: str,
    token: str,
    http: tuple[str, int] | None = None,
    err: TextIO = sys.stderr,
) -> list[Report]:
    """Connect to the upstream servers, then serve MCP clients until they go (stdio: one
    client; ``http``, a host and port: Streamable HTTP at ``/mcp`` until the process is
    stopped); the reports of the tasks it ended."""
    async with AsyncExitStack() as stack:
        gateway = Gateway(config, url=url, token=token)
        upstreams = gateway.upstreams
        await upstreams.connect(stack)
        print(f"{GATEWAY}: {len(upstreams.routes)} tools from {len(config.servers)} servers: "
              f"{', '.join(f'{n} ({r.effect})' for n, r in upstreams.routes.items())}",
              file=err, flush=True)  # fmt: skip
        for line in upstreams.problems():
            print(f"{GATEWAY}: {line}", file=err, flush=True)
        server: Server[Any] = Server(
            "loopguard-mcp-gateway",
            version="1",
            instructions="Tools behind LoopGuard: a refused call says why; do not repeat it.",
            on_list_tools=gateway.list_tools,
            on_call_tool=gateway.call_tool,
        )
        try:
            if http is None:
                async with stdio_server() as (read, write):
                    await server.run(read, write, server.create_initialization_options())
            else:
                await _serve_http(gateway, server, *http, err=err)
        finally:
            reports = await _blocking(gateway.close)
    return reports


async def _serve_http(
    gateway: Gateway, server: Server[Any], host: str, port: int, *, err: TextIO
) -> None:
    """Streamable HTTP at ``http://host:port/mcp`` (the SDK's app: a loopback host gets its
    DNS-rebinding protection), each session's idle task ended after the configured time."""
    app = server.streamable_http_app(host=host)
    web = _Web(uvicorn.Config(app, host=host, port=port, log_level="warning"))
    print(f"{GATEWAY}: serving http://{host}:{port}/mcp", file=err, flush=True)
    async with anyio.create_task_group() as group:
        group.start_soon(gateway.end_idle, gateway.config.session_idle_seconds)
        group.start_soon(_stop_on_signal, web)
        await web.serve()
        group.cancel_scope.cancel()


class _Web(uvicorn.Server):
    """uvicorn, without its own signal handlers: it raises a caught SIGTERM again once it
    has stopped, which would end the process before the gateway ends its tasks."""

    @contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


async def _stop_on_signal(web: uvicorn.Server) -> None:
    """SIGINT or SIGTERM: stop serving; the gateway then ends its tasks and exits."""
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for _ in signals:
            web.should_exit = True
            return


_LOOPBACK = ("127.0.0.1", "localhost", "::1")


def _address(value: str) -> tuple[str, int]:
    """``HOST:PORT`` to serve on: a loopback host only. The gateway asks its clients for no
    credential, and every call it passes runs with its token's authority: a client from
    elsewhere comes through a proxy that authenticates it."""
    host, _, port = value.rpartition(":")
    host = host.strip("[]")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"{value!r} is not HOST:PORT (127.0.0.1:8765, say)")
    if host not in _LOOPBACK:
        raise argparse.ArgumentTypeError(
            f"{host} is not a loopback address: the gateway checks no credentials of its "
            "clients, so it serves on 127.0.0.1 or ::1 only (put a proxy that authenticates "
            "them in front of it for clients on other machines)"
        )
    return host, int(port)


def main(argv: Sequence[str] | None = None, *, environ: Mapping[str, str] = os.environ) -> int:
    """``python -m guard.contrib.mcp --config FILE [--http HOST:PORT]``: the gateway."""
    parser = argparse.ArgumentParser(
        prog="python -m guard.contrib.mcp",
        description="An MCP gateway: serves MCP clients (over stdio, or Streamable HTTP with "
        "--http), passing every tool call to the configured servers through the LoopGuard "
        "console's guard (LOOPGUARD_URL, LOOPGUARD_TOKEN: a token of a person with the agent "
        "role).",
    )
    parser.add_argument("--config", type=Path, required=True, help="a JSON or TOML file")
    parser.add_argument(
        "--http",
        type=_address,
        metavar="HOST:PORT",
        help="serve Streamable HTTP at http://HOST:PORT/mcp, a task per MCP session",
    )
    options = parser.parse_args(argv)
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING)  # stdout is the MCP wire
    url, token = environ.get("LOOPGUARD_URL", ""), environ.get("LOOPGUARD_TOKEN", "")
    if not url or not token:
        print(f"{GATEWAY}: set LOOPGUARD_URL (the console) and LOOPGUARD_TOKEN (an API token "
              "of a person with the agent role)", file=sys.stderr)  # fmt: skip
        return 2
    try:
        config = GatewayConfig.load(options.config)
        anyio.run(lambda: serve(config, url=url, token=token, http=options.http))
    except ConfigError as exc:
        print(f"{GATEWAY}: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
