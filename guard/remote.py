"""The console's guard, asked over HTTP: the Python client of the step protocol for attached
agents (``docs/protocol.md``, version 1), standard library only.

:class:`RemoteGuard` offers the step-wise interface of the local :class:`guard.Guard`
(:class:`guard.steps.StepGuard`), so ``guard.langchain.LoopGuardMiddleware`` and
``guard.openai_agents.GuardedRun`` take it unchanged; every decision is the console's::

    from guard.langchain import LoopGuardMiddleware
    from guard.remote import RemoteGuard

    with RemoteGuard.start("https://console.example", token=token, agent="support-bot",
                           tools=specs, client="support-service/3") as guard:
        middleware = LoopGuardMiddleware(guard, specs)
        ...                                       # create_agent(..., middleware=[middleware])
        print(guard.page_url)                     # the task's page on the console

What it promises:

- **Fail closed.** A step that gets no answer is sent again, then raises
  :exc:`ConsoleUnreachable`; a refusal raises :exc:`ProtocolError`. Neither ever comes back
  as an allow: ``before_tool`` returns ``EXECUTE`` only when the console said so, so a tool
  never runs on a console that cannot be reached.
- **Retries are the same request.** A connection error, a timeout, a 5xx or a 429 is retried
  ``retries`` times (backoff 0.1 s, 0.3 s, 0.9 s, … at most 2 s) with the same body and the
  same ``request_id``: the console answers a request it has already seen with its stored
  answer and never claims twice. A 503 or 429 with ``Retry-After`` (seconds) waits that long
  instead, never less than the backoff, at most 30 s. A step the caller asks again after
  :exc:`ConsoleUnreachable`, with the same content, is sent with that request id too.
- **One connection.** Requests go over one kept-alive connection (HTTP/1.1); one the
  console closed while idle is opened again and the request sent once more, with its own
  request id. ``before_tools(proposal, enter=True)`` (a host that runs a one-call
  proposal's call at once) has the call's entry decided in the admission's request: a
  step is then two requests, not three.
- **Usage rides along.** ``spend_tokens`` and ``settle_spend`` make no request: they are
  sent as the next step's ``usage``, and kept until a step carrying them is answered (an
  answer that was lost may have charged them already; a budget is never under-counted).
- **The lease is kept alive.** A daemon thread sends a ``heartbeat`` every third of the
  lease while nothing else is sent (a long tool, a slow model); a heartbeat that fails is
  logged and tried again at the next beat, and the console's ``stop_requested`` is kept
  (:attr:`RemoteGuard.stop_requested`). It stops at :meth:`RemoteGuard.close` and once the
  task has stopped.
- **Terminal is sticky.** Once an answer carries the stop report, every step returns it
  without asking the console again.

- **It comes back.** :meth:`RemoteGuard.attach` (or :meth:`RemoteGuard.start` with the
  same ``start_id``) from a new process takes the task over after its predecessor died at
  any step: it waits out the dead lease, then reports the calls left running — a write
  with what ``lookups[tool]`` (the tool's trusted lookup) finds, which settles it.

What protocol 1 does not offer, and so this client does not either: approval before a call
(a hosted tool's ``approval=``); a tool's ``lookup`` on its own calls (``before_tool``/
``after_tool`` accept ``lookup=`` and ignore it: a lookup is asked only about a write a
lost predecessor left running, above); the summary turn; ``checkpoint``/``restore`` (a
new process continues a task with :meth:`RemoteGuard.attach`); and an in-process
``cancel`` (an operator presses Stop on the console).
"""

from __future__ import annotations

import base64
import http
import http.client
import json
import logging
import math
import os
import socket
import threading
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Mapping
from dataclasses import fields as dataclass_fields
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

from ._checks import amount, as_calls, describe, evidence_problem, plain, safe_repr, transient_error
from ._driver import Execute, Plan, Reserve, loop
from ._fingerprint import canonical_json
from ._report import Report
from ._sequence import Inspect, Sequencer
from ._settlement import Lookup
from ._ticket import Action, Decision, Status, Ticket, execute, reuse
from ._values import (
    Call,
    Effect,
    Finish,
    Limits,
    Nudge,
    Reason,
    Result,
    Settlement,
    State,
    _json_ready,
)

if TYPE_CHECKING:
    from ._protocol import StepGuard

__all__ = ["ConsoleUnreachable", "ProtocolError", "RemoteGuard"]

PROTOCOL = 1
"""The version of the step protocol this client speaks."""

MAX_CALLS = 64
"""The most calls one ``tools`` step may carry (the protocol's bound)."""

DEFAULT_CLIENT = "guard.remote/1"
"""What the console shows as the task's client when ``start`` is not told."""

_LEASE_SECONDS = 60.0  # when an answer does not say (a heartbeat's need not)
# attach/start waiting out a predecessor's lease: in all (a lease and a bit), and per try.
_WAIT_SECONDS = 90.0
_LEASE_POLL_SECONDS, _LEASE_POLL_MAX = 2.0, 15.0
# Leases of the starts this process made, by start id: asking again is the same start.
_STARTED: dict[str, str] = {}
_STARTED_KEPT = 1024
_BACKOFF_FIRST, _BACKOFF_FACTOR, _BACKOFF_MAX = 0.1, 3.0, 2.0
_TEXT_LIMIT = 2000  # an error's message, a wrong return value's repr
_REASONS = frozenset(Reason)

log = logging.getLogger(__name__)


class ConsoleUnreachable(RuntimeError):
    """The console gave no usable answer to one request, after every retry: ``url``, how
    many ``attempts`` were made and the last ``cause`` (the exception of the connection,
    the timeout, the 5xx or 429 answer, or the answer that could not be read).

    The request may or may not have reached the console. Nothing waiting for this step's
    allow may run: no model call, no tool.
    """

    def __init__(self, url: str, cause: BaseException, attempts: int) -> None:
        super().__init__(
            f"the console did not answer {url} ({attempts} attempt(s)); last: {describe(cause)}"
        )
        self.url = url
        self.cause = cause
        self.attempts = attempts
        self.start_id: str | None = None
        """For a start: its request id, to ask again with (``RemoteGuard.start(start_id=)``)."""


class ProtocolError(RuntimeError):
    """The console refused a request (a 4xx other than 429, which is never retried), or
    answered something this client cannot read as the protocol's answer.

    ``status`` is the HTTP status, ``code`` and ``message`` the refusal's ``code`` and
    ``error`` (``docs/protocol.md``, "Errors"); an answer that does not follow the protocol
    has the code ``invalid_answer``. A refusal changes nothing on the console.

    A task the console stopped for a reason of its own, outside the guard's words (a goal
    started too often and held before it runs, ``NEEDS_HUMAN``/``restart_loop``; a client
    that did not come back in time, ``NEEDS_HUMAN``/``client_lost``), has no
    guard report to hand back: ``start``/``attach`` raise this with that reason as the
    ``code``, the stop's ``detail`` as the ``message`` and the console's whole ``answer``
    (the task id, the stop as JSON). Nothing may run for such a task.
    """

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        url: str = "",
        answer: Mapping[str, Any] | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(f"{status} {code}: {message}" + (f" ({url})" if url else ""))
        self.status = status
        self.code = code
        self.message = message
        self.url = url
        self.answer = answer
        self.retry_after = retry_after
        """For ``lease_held``: the seconds the holder's lease has left, when the console said."""


class _Lost(Exception):
    """One attempt got no usable answer; another may."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(describe(cause))
        self.cause = cause


class _Transport:
    """POSTs JSON to one console with a bearer token over one kept-alive connection;
    retries what may be retried.

    The connection is opened on first use and kept while the console keeps it (a step is
    a few small requests in a row: a new connection for each would cost more than the
    request). One that the console closed while idle is opened again at once, and the
    request sent on it once more: a request the console may have answered is only ever
    repeated with its own request id. A proxy named by the environment (``https_proxy``,
    ``http_proxy``, ``no_proxy``, as ``urllib`` reads them) is used as ``urllib`` would:
    a tunnel for https, the whole URL for http. A redirect is answered as what it is: a
    POST is not replayed elsewhere (nor its bearer token sent there).

    A 503 or a 429 that says how long to wait (``Retry-After`` in seconds: a database
    restarting, a throttle) is waited for before the next attempt, never less than the
    backoff and at most :attr:`RETRY_AFTER_MAX`; a date in it, or anything else, leaves the
    backoff as it is.
    """

    RETRY_AFTER_MAX = 30.0
    """The longest a ``Retry-After`` is waited for: a console that asks for more is asked
    again after this, so that one request never waits more than ``retries`` times it."""

    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        timeout: float,
        retries: int,
        sleep: Callable[[float], None],
    ) -> None:
        parts = urllib.parse.urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.netloc or not parts.hostname:
            raise ValueError(f"the console's URL must be http(s)://host[:port], not {base_url!r}")
        if not isinstance(retries, int) or isinstance(retries, bool) or retries < 0:
            raise ValueError(f"retries must be a non-negative int, got {retries!r}")
        if not timeout > 0:
            raise ValueError(f"timeout must be positive seconds, got {timeout!r}")
        self.base_url = base_url.rstrip("/")
        self.timeout = float(timeout)
        self.retries = retries
        self._token = token
        self._sleep = sleep
        self._https = parts.scheme == "https"
        self._host = parts.hostname
        self._port = parts.port
        self._prefix = parts.path.rstrip("/")
        self._proxy = _proxy_for(parts)
        self._connection: http.client.HTTPConnection | None = None
        self._used = False  # whether the open connection carried a request already
        self._lock = threading.Lock()  # one request at a time on the connection

    def post(self, path: str, body: Mapping[str, Any], *, retries: int | None = None) -> Any:
        """The JSON answer (an object) to ``body`` at ``path``. Raises
        :exc:`ConsoleUnreachable` once ``retries`` more attempts of the very same bytes got
        no answer, :exc:`ProtocolError` on a refusal, ``TypeError``/``ValueError`` (before
        anything is sent) if ``body`` is not JSON."""
        url = self.base_url + path
        data = json.dumps(body, ensure_ascii=False, allow_nan=False).encode("utf-8")
        tries = self.retries if retries is None else retries
        cause: BaseException | None = None
        for attempt in range(tries + 1):
            if attempt:
                self._sleep(self._pause(attempt, cause))
            try:
                return self._once(path, data)
            except _Lost as lost:
                cause = lost.cause
                log.debug("no answer from %s (attempt %d): %s", url, attempt + 1, lost)
        assert cause is not None  # noqa: S101 - the loop ran at least once
        raise ConsoleUnreachable(url, cause, tries + 1) from cause

    @classmethod
    def _pause(cls, attempt: int, cause: BaseException | None) -> float:
        """Seconds to wait before retry ``attempt`` (from 1): the backoff, or what the last
        answer asked for when that is longer."""
        delay = min(_BACKOFF_FIRST * _BACKOFF_FACTOR ** (attempt - 1), _BACKOFF_MAX)
        if isinstance(cause, _Answered) and cause.retry_after is not None:
            delay = max(delay, min(cause.retry_after, cls.RETRY_AFTER_MAX))
        return round(delay, 3)

    def close(self) -> None:
        """Close the kept connection (the next request opens another)."""
        with self._lock:
            self._drop()

    def _once(self, path: str, data: bytes) -> Any:
        with self._lock:
            try:
                status, raw, retry_after = self._exchange(path, data)
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                # A kept connection the console closed while it was idle: once more, anew.
                status, raw, retry_after = self._exchange(path, data)
        url = self.base_url + path
        if status == 429 or status >= 500:
            # Retry-After is the console's word on when to ask again only with these two
            # (RFC 9110 15.6.4, RFC 6585): another 5xx's is not taken.
            wait = _Answered.seconds(retry_after) if status in (429, 503) else None
            raise _Lost(_Answered(status, raw, url, retry_after=wait))
        if not 200 <= status < 300:
            refusal = _refusal(status, raw, url)
            # A refusal may say when it would not be one (a 409 lease_held: when the lease
            # runs out); it is still not retried here.
            refusal.retry_after = _Answered.seconds(retry_after)
            raise refusal
        try:
            answer = json.loads(raw)
        except ValueError as exc:  # cut short or garbled on the way: ask again
            raise _Lost(exc) from exc
        if not isinstance(answer, dict):
            raise _Lost(ValueError(f"the answer is {type(answer).__name__}, not an object"))
        return answer

    def _exchange(self, path: str, data: bytes) -> tuple[int, bytes, str | None]:
        """Send one request and read its whole answer: the status, the body and its
        ``Retry-After``. A failure on a connection that had carried a request before is
        raised as it is (the caller may try a new one); any other is :class:`_Lost`."""
        connection = self._connection
        if connection is None:
            connection = self._connection = self._connect()
            self._used = False
        target = self._prefix + path
        if self._proxy is not None and not self._https:
            target = self.base_url + path  # a proxy of plain http is sent the whole URL
        headers = {
            "Content-Type": "application/json",
            "Accept": "application/json",
            "Authorization": f"Bearer {self._token}",
        }
        if self._proxy is not None and not self._https and self._proxy.authorization:
            headers["Proxy-Authorization"] = self._proxy.authorization
        try:
            connection.request("POST", target, body=data, headers=headers)
            response = connection.getresponse()
            raw = response.read()
        except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError) as exc:
            self._drop()
            if self._used:
                raise
            raise _Lost(exc) from exc
        except (OSError, http.client.HTTPException) as exc:  # timeouts, refusals, garbage
            self._drop()
            raise _Lost(exc) from exc
        self._used = True
        if response.will_close:
            self._drop()
        return response.status, raw, response.getheader("Retry-After")

    def _connect(self) -> http.client.HTTPConnection:
        proxy = self._proxy
        if proxy is None:
            if self._https:
                return http.client.HTTPSConnection(self._host, self._port, timeout=self.timeout)
            return http.client.HTTPConnection(self._host, self._port, timeout=self.timeout)
        if not self._https:
            return http.client.HTTPConnection(proxy.host, proxy.port, timeout=self.timeout)
        # Through the proxy's tunnel (CONNECT): TLS with the console itself.
        tunnelled = http.client.HTTPSConnection(proxy.host, proxy.port, timeout=self.timeout)
        tunnel = {"Proxy-Authorization": proxy.authorization} if proxy.authorization else {}
        tunnelled.set_tunnel(self._host, self._port, headers=tunnel)
        return tunnelled

    def _drop(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            connection.close()


class _Answered(Exception):
    """An answer that says to ask again (a 5xx, a 429), and after how many seconds when it
    said so (``retry_after``)."""

    def __init__(
        self, status: int, body: bytes, url: str, *, retry_after: float | None = None
    ) -> None:
        super().__init__(f"HTTP Error {status}: {_reason(status)} ({url})")
        self.status = status
        self.body = body
        self.retry_after = retry_after

    @staticmethod
    def seconds(header: str | None) -> float | None:
        """A ``Retry-After`` of delay-seconds as a number; None for none, for an HTTP-date
        (which would need the wall clock) and for anything that is not a finite number ≥ 0."""
        if header is None:
            return None
        try:
            value = float(header.strip())
        except ValueError:
            return None
        return value if math.isfinite(value) and value >= 0 else None


def _reason(status: int) -> str:
    try:
        return http.HTTPStatus(status).phrase
    except ValueError:
        return "unknown status"


class _Proxy:
    """The proxy that ``urllib`` would use for the console's URL."""

    def __init__(self, url: str) -> None:
        parts = urllib.parse.urlsplit(url if "://" in url else f"http://{url}")
        if not parts.hostname:
            raise ValueError(f"the proxy {url!r} names no host")
        self.host = parts.hostname
        self.port = parts.port  # None: the connection's own default, as urllib connects
        self.authorization = ""
        if parts.username is not None:
            user = urllib.parse.unquote(parts.username)
            password = urllib.parse.unquote(parts.password or "")
            token = base64.b64encode(f"{user}:{password}".encode()).decode("ascii")
            self.authorization = f"Basic {token}"


def _proxy_for(parts: urllib.parse.SplitResult) -> _Proxy | None:
    proxies = urllib.request.getproxies()
    proxy = proxies.get(parts.scheme)
    if not proxy or urllib.request.proxy_bypass(parts.netloc):
        return None
    return _Proxy(proxy)


def _refusal(status: int, body: bytes, url: str) -> ProtocolError:
    """The console's ``{"error", "code"}`` refusal (or what came instead) as an error."""
    try:
        found = json.loads(body)
    except ValueError:
        found = None
    if isinstance(found, dict) and isinstance(found.get("code"), str):
        return ProtocolError(status, found["code"], str(found.get("error", "")), url)
    text = body.decode("utf-8", "replace").strip()[:200]
    return ProtocolError(status, f"http_{status}", text or "no explanation given", url)


def _invalid(what: str) -> ProtocolError:
    return ProtocolError(200, "invalid_answer", what)


def _new_lease() -> str:
    """``host:pid:random``: one value per client process (and per guard in it)."""
    host = "".join(c for c in socket.gethostname() if c.isascii() and c.isprintable())
    host = host.replace(":", "-")[:100] or "host"
    return f"{host}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def _effects(tools: Mapping[str, Any]) -> dict[str, Effect]:
    """Tool name → effect, from effects or from :class:`guard.adapters.ToolSpec` values."""
    effects: dict[str, Effect] = {}
    for name, declared in tools.items():
        effect = getattr(declared, "effect", declared)
        if not isinstance(name, str) or effect not in ("read", "write"):
            raise ValueError(f"tool {name!r} must be declared 'read' or 'write', not {effect!r}")
        effects[name] = effect
    return effects


def _limits(limits: Limits | Mapping[str, Any]) -> dict[str, Any]:
    """The limits as the start request carries them (a :class:`Limits` sends every field)."""
    if isinstance(limits, Limits):
        raw = {field.name: getattr(limits, field.name) for field in dataclass_fields(limits)}
    else:
        raw = dict(limits)
    if isinstance(raw.get("exempt"), set | frozenset):
        raw["exempt"] = sorted(raw["exempt"])
    return raw


def _remaining(raw: Any) -> dict[str, int | None]:
    if not isinstance(raw, Mapping):
        raise _invalid(f"remaining is {type(raw).__name__}, not an object")
    left: dict[str, int | None] = {}
    for name, value in raw.items():
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
            raise _invalid(f"remaining {name} is {value!r}, not a count")
        left[str(name)] = value
    return left


def _evidence(inspect: Inspect, result: Result | None, subject: Call | Finish) -> dict[str, Any]:
    """What the local, trusted inspector says, as the protocol's ``evidence``; an inspector
    that raises or answers nonsense is sent as ``{"error"}``, which the console stops
    ``invalid_evidence`` (as the local guard would)."""
    try:
        evidence = inspect(result, subject)
    except Exception as exc:
        return {"error": describe(exc)}
    # Only the types are checked here: the console knows the revision so far.
    problem = evidence_problem(evidence, 0)
    if problem is not None:
        return {"error": problem}
    return {"revision": evidence.revision, "done": evidence.done, "committed": evidence.committed}


class RemoteGuard:
    """One attached task's guard on the console, driven step by step from this process.

    Make one with :meth:`start` (a new task) or :meth:`attach` (a task that exists: after
    an approved resumption, or from a new process); then drive it like a local guard (see
    :mod:`guard.steps`) and :meth:`close` it (or use it as a context manager). ``task`` is
    the task's id, ``lease`` this client's lease, ``page_url`` the task's page on the
    console, ``state`` and ``phase`` as the latest answer gave them.

    The steps are serialised (one request at a time); the heartbeat goes beside them. Every
    step may raise :exc:`ConsoleUnreachable` or :exc:`ProtocolError` (see the module's
    docstring); neither ever lets a tool run.
    """

    def __init__(
        self,
        url: str,
        *,
        token: str,
        timeout: float = 10.0,
        retries: int = 3,
        sleep: Callable[[float], None] = time.sleep,
        heartbeat: bool = True,
    ) -> None:
        """A client of the console at ``url`` that has no task yet: use :meth:`start` or
        :meth:`attach`, which make one and ask the console for its task."""
        self._transport = _Transport(url, token, timeout=timeout, retries=retries, sleep=sleep)
        # The heartbeat's own connection: a step never waits for a heartbeat's answer.
        self._beats = _Transport(url, token, timeout=timeout, retries=0, sleep=sleep)
        self.lease = _new_lease()
        self.task = 0
        self.phase = 0
        self.state = ""
        self.page_url = ""
        self.lease_seconds = _LEASE_SECONDS
        self._heartbeat = heartbeat
        self._lock = threading.RLock()
        self._quiet = threading.Event()  # set on close() and once the task has stopped
        self._beater: threading.Thread | None = None
        self._report: Report | None = None
        self._remaining: dict[str, int | None] = {}
        self._remaining_at = time.monotonic()
        self._stop_requested = False
        self._tickets: list[Ticket] = []
        self._tokens = 0
        self._cost: int | None = None
        self._settleable = False
        self._answers = 0  # step answers taken in: a heartbeat's older news must not win
        # Answered ahead by a model call's last result (``then``): the wait, and the next
        # model call's allowance when there was no wait.
        self._wait_ahead: float | None = None
        self._model_ahead = False
        # A one-call proposal's entry, decided with its admission (``before_tools(enter=)``).
        self._entered: Mapping[str, Any] | None = None
        self._unanswered: tuple[str, dict[str, Any]] | None = None
        self._lookups: dict[str, Lookup] = {}
        self._sleep = sleep

    # -- making one ------------------------------------------------------------------------

    @classmethod
    def start(
        cls,
        url: str,
        *,
        token: str,
        agent: str,
        tools: Mapping[str, Any],
        client: str = DEFAULT_CLIENT,
        input: Mapping[str, Any] | None = None,
        limits: Limits | Mapping[str, Any] | None = None,
        reason: str = "",
        start_id: str | None = None,
        lookups: Mapping[str, Lookup] | None = None,
        wait: float = _WAIT_SECONDS,
        timeout: float = 10.0,
        retries: int = 3,
        sleep: Callable[[float], None] = time.sleep,
        heartbeat: bool = True,
    ) -> RemoteGuard:
        """Start a new attached task on the console at ``url`` (``POST /api/attached``).

        ``token`` is an API token of a person with the agent role; ``agent`` what the task
        is called; ``tools`` every tool the agent may call, name → ``"read"``/``"write"``
        (or a :class:`guard.adapters.ToolSpec`); ``client`` what drives it; ``input`` the
        goal; ``limits`` the guard's limits (a mapping names only the limits it sets, the
        console's defaults fill the rest; a :class:`~guard.Limits` sends every field);
        ``reason`` goes to the audit log. ``timeout`` (seconds) bounds each attempt,
        ``retries`` how many more attempts a request without an answer gets; ``sleep``
        waits between them. ``heartbeat=False`` sends no heartbeats.

        ``start_id`` names this start (1-100 printable ASCII characters; a job's id, say):
        the console makes at most one task per start id and person, so a start asked again
        with it — after :exc:`ConsoleUnreachable`, or by a new process that never saw the
        answer — finds the task instead of making a second one, and takes it over as
        :meth:`attach` does (``lookups`` and ``wait`` are :meth:`attach`'s). Without it a
        new id is made; :exc:`ConsoleUnreachable` then carries it as ``start_id``, to ask
        again with.

        A goal started too often is held before it runs: the guard is then stopped at once
        (:attr:`report`, ``NEEDS_HUMAN``/``restart_loop``).
        """
        if start_id is not None and not _printable_id(start_id):
            raise ValueError(f"start_id must be 1-100 printable ASCII characters, got {start_id!r}")
        request_id = start_id or uuid.uuid4().hex
        guard = cls(
            url, token=token, timeout=timeout, retries=retries, sleep=sleep, heartbeat=heartbeat
        )
        # The same process asking again sends the very same start (its lease included): the
        # console answers it as the first; a new process has a lease of its own (below).
        guard.lease = _STARTED.setdefault(request_id, guard.lease)
        while len(_STARTED) > _STARTED_KEPT:  # the oldest first: dicts keep their order
            del _STARTED[next(iter(_STARTED))]
        guard._lookups = dict(lookups or {})
        body: dict[str, Any] = {
            "protocol": PROTOCOL,
            "request_id": request_id,
            "lease": guard.lease,
            "agent": agent,
            "client": client,
            "tools": _effects(tools),
        }
        if input is not None:
            body["input"] = dict(input)
        if limits is not None:
            body["limits"] = _limits(limits)
        if reason:
            body["reason"] = reason
        try:
            answer = guard._transport.post("/api/attached", body)
        except ConsoleUnreachable as exc:
            exc.start_id = request_id
            raise
        if answer.get("attach") is True:
            # Made before, by a start whose answer this process never had: take it over.
            guard.task = _task_id(answer.get("task"))
            _take_over(guard, wait)
            return guard
        guard._opened(answer)
        return guard

    @classmethod
    def attach(
        cls,
        url: str,
        *,
        token: str,
        task: int,
        lookups: Mapping[str, Lookup] | None = None,
        wait: float = _WAIT_SECONDS,
        timeout: float = 10.0,
        retries: int = 3,
        sleep: Callable[[float], None] = time.sleep,
        heartbeat: bool = True,
    ) -> RemoteGuard:
        """Drive an existing attached task ``task`` from here, with a new lease: after an
        approved resumption, or from a new process after its predecessor died (at any step).

        Its first request is a ``heartbeat``, which takes the task's lease. While a
        predecessor's lease is alive (it may still be running) the console answers
        ``lease_held`` with the seconds it has left: this waits them out, up to ``wait``
        seconds in all, then raises :exc:`ProtocolError` (``lease_held``). The calls the
        predecessor left running are then reported as interrupted, before anything else:
        a read may be asked for again; a write is looked up with ``lookups[tool]`` (the
        tool's trusted lookup by operation key, returning a :class:`~guard.Settlement`),
        which settles it through the console (audited as an automatic settle) — committed,
        the task goes on; not committed, it may be claimed again — and without a lookup,
        or when it cannot tell, the write is ``UNKNOWN`` and the task stops for a person.
        The other options are :meth:`start`'s."""
        guard = cls(
            url, token=token, timeout=timeout, retries=retries, sleep=sleep, heartbeat=heartbeat
        )
        guard.task = _task_id(task, given=True)
        guard._lookups = dict(lookups or {})
        _take_over(guard, wait)
        return guard

    # -- state -----------------------------------------------------------------------------

    @property
    def report(self) -> Report | None:
        """The stop report once the console has stopped the task, else ``None``."""
        return self._report

    @property
    def stop_requested(self) -> bool:
        """Whether a heartbeat has said an operator asked to stop the task (a long tool may
        give up early; the next step answers the stop)."""
        return self._stop_requested

    @property
    def tickets(self) -> tuple[Ticket, ...]:
        """The admitted calls of the current model call, in order."""
        return tuple(self._tickets)

    def remaining(self) -> dict[str, int | None]:
        """Budget left per dimension (``None``: no limit), as the latest answer gave it; the
        deadline's ``deadline_ms`` counts down from that answer while the task runs."""
        with self._lock:
            left = dict(self._remaining)
            deadline = left.get("deadline_ms")
            if deadline is not None and self._report is None:
                passed = int((time.monotonic() - self._remaining_at) * 1000)
                left["deadline_ms"] = max(0, deadline - passed)
            return left

    def spend_tokens(self, tokens: int) -> None:
        """Charge model usage to the token budget: sent with the next step (``ValueError``
        unless a non-negative int)."""
        tokens = amount("tokens", tokens)
        with self._lock:
            self._tokens += tokens

    def settle_spend(self, cost: int) -> None:
        """The last model call's real cost replaces its reservation: sent with the next
        step (``ValueError`` unless a non-negative int, or with no model call allowed since
        the last settlement)."""
        cost = amount("cost", cost)
        with self._lock:
            if not self._settleable:
                raise ValueError("settle_spend() needs a model call not settled yet")
            self._settleable = False
            self._cost = cost

    # -- steps -----------------------------------------------------------------------------

    def before_model(self, *, reserve: int = 0) -> Report | None:
        """Ask for one model call (``reserve``: its maximum cost, for the spend budget):
        ``None`` if it may happen, else the stop report."""
        reserve = amount("reserve", reserve)
        with self._lock:
            if self._report is not None:
                return self._report
            self._wait_ahead = None
            if self._model_ahead:
                # Allowed (and counted) with the last result, without a spend budget to
                # reserve in: nothing to ask again.
                self._model_ahead = False
                self._tickets = []
                self._settleable = True
                return None
            answer = self._step("model", {"reserve": reserve})
            if (stop := self._stopped()) is not None:
                return stop
            if answer.get("allowed") is not True:
                raise _invalid("a model step answered neither allowed nor a stop")
            self._tickets = []
            self._settleable = True
            return None

    def before_tools(self, proposal: Any, *, enter: bool = False) -> list[Ticket] | Nudge | Report:
        """Admit the calls of one model call (a :class:`~guard.Call` or a list of them):
        the tickets, a :class:`~guard.Nudge` to show the model instead, or the stop report.

        ``enter=True`` promises that the host calls :meth:`before_tool` for a proposal of
        one call at once, with nothing in between (no person asked, no other check that
        may drop the call): the console then decides the call's entry — its claim, for a
        write — in the same request, and :meth:`before_tool` hands that decision back
        without asking again. A step is then two requests, not three. A host that may not
        run an admitted call straight away (an approval step of its framework, say) must
        not promise it: a write claimed and never run waits for a person as ``UNKNOWN``.
        With several calls ``enter`` is ignored (each is entered on its own).

        A proposal that is not well-formed calls, or whose arguments JSON cannot hold, is
        not sent: the task is halted ``FAILED``/``bad_call`` or ``bad_args`` (unlike the
        local guard, without counting a request for it). So is a model call of more than
        :data:`MAX_CALLS` calls.
        """
        with self._lock:
            if self._report is not None:
                return self._report
            calls = as_calls(proposal, None)
            if isinstance(calls, str):
                return self.halt(State.FAILED, Reason.BAD_CALL, calls)
            if len(calls) > MAX_CALLS:
                detail = f"{len(calls)} calls in one model call; at most {MAX_CALLS} are checked"
                return self.halt(State.FAILED, Reason.BAD_CALL, detail)
            wire: list[dict[str, Any]] = []
            for call in calls:
                try:
                    args = json.loads(canonical_json(plain(call.args)))
                except Exception as exc:  # BadArguments, or a Mapping that cannot be read
                    return self.halt(State.FAILED, Reason.BAD_ARGS, describe(exc))
                item: dict[str, Any] = {"tool": call.tool, "args": args, "effect": call.effect}
                if call.operation_key is not None:
                    item["operation_key"] = call.operation_key
                wire.append(item)
            entering = enter and len(wire) == 1
            fields: dict[str, Any] = {"calls": wire}
            if entering:
                fields["enter"] = True
            answer = self._step("tools", fields)
            self._tickets = []
            self._entered = None
            if (stop := self._stopped()) is not None:
                return stop
            if "nudge" in answer:
                return _nudge(answer["nudge"])
            admitted = answer.get("admitted")
            if not isinstance(admitted, list) or not admitted:
                raise _invalid("a tools step answered neither tickets, a nudge nor a stop")
            self._tickets = [_ticket(item, calls) for item in admitted]
            if entering:
                self._entered = answer
            return list(self._tickets)

    def before_tool(self, ticket: Ticket, *, lookup: Any = None) -> Decision:
        """Ask, at the executor's entry, whether this admitted call may run now: ``EXECUTE``
        (run it once, then :meth:`after_tool`), ``REUSE`` with the stored result (do not
        run it) or ``STOP``. Raises rather than allow when the console cannot be asked.

        ``lookup`` is accepted for the local guard's signature and not used: protocol 1
        runs no lookups for attached tools."""
        with self._lock:
            if self._report is not None:
                return Decision(Action.STOP, ticket, report=self._report)
            if ticket not in self._tickets or ticket.status is not Status.ADMITTED:
                raise ValueError(
                    "before_tool() needs a fresh ticket from the current before_tools()"
                )
            answer, self._entered = self._entered, None
            if answer is None or "action" not in answer:  # not decided with the admission
                answer = self._step("call", {"ticket": ticket.index})
            if (stop := self._stopped()) is not None:
                self._not_run()
                return Decision(Action.STOP, ticket, report=stop)
            action = answer.get("action")
            if action == Action.EXECUTE:
                return execute(ticket)
            if action == Action.REUSE:
                try:
                    result = Result.from_dict(answer["result"])
                except (KeyError, TypeError, ValueError, AttributeError) as exc:
                    raise _invalid(f"a reuse without a readable result: {exc!r}") from exc
                return reuse(ticket, result)
            raise _invalid(f"a call step answered the action {action!r} without a stop")

    def after_tool(
        self,
        ticket: Ticket,
        result: Any = None,
        *,
        error: BaseException | None = None,
        inspect: Inspect | None = None,
        lookup: Any = None,
    ) -> Report | None:
        """Report what one executed (or reused) call came to; the stop report if the task
        stops here.

        Pass the tool's return value as ``result`` (a :class:`~guard.Result`; anything else
        is sent as such, and the console stops ``bad_result``), or the exception it raised
        as ``error``. A reused call sends no result: the stored one counts. ``inspect``, the
        application's trusted inspector, runs here and its evidence is sent with a result
        (``None``: the console reads progress from the results). ``lookup`` is not used.
        """
        with self._lock:
            if self._report is not None and ticket.status is not Status.EXECUTING:
                return self._report
            fields: dict[str, Any] = {"ticket": ticket.index}
            fields |= self._then(ticket)
            if ticket.status is Status.REUSING:
                if inspect is not None:
                    fields["evidence"] = _evidence(inspect, ticket.result, ticket.call)
                self._ahead(self._step("result", fields))
                ticket.status = Status.REUSED
                return self._report
            if ticket.status is not Status.EXECUTING:
                raise ValueError("after_tool() needs a ticket that before_tool() let execute")
            returned: Result | None = None
            if error is not None:
                fields["error"] = {
                    "type": type(error).__name__,
                    "message": _message(error),
                    "transient": transient_error(error),
                }
            elif isinstance(result, Result):
                returned = result
                fields["result"] = _json_ready(result.to_dict())
                if inspect is not None:
                    fields["evidence"] = _evidence(inspect, result, ticket.call)
            else:
                # Not a result: the console stops bad_result, as the local guard does.
                fields["result"] = {"kind": "<not a result>", "data": _repr(result)}
            self._ahead(self._step("result", fields))
            ticket.status = Status.RAN
            ticket.result = returned
            return self._report

    def before_wait(self) -> float | Report:
        """Milliseconds to wait before the next model call (0: none), or the stop report."""
        with self._lock:
            if self._report is not None:
                return self._report
            if self._wait_ahead is not None:
                ahead, self._wait_ahead = self._wait_ahead, None
                return ahead
            answer = self._step("wait", {})
            if (stop := self._stopped()) is not None:
                return stop
            wait_ms = answer.get("wait_ms")
            if (
                not isinstance(wait_ms, int | float)
                or isinstance(wait_ms, bool)
                or not math.isfinite(wait_ms)
                or wait_ms < 0
            ):
                raise _invalid(f"a wait step answered wait_ms={wait_ms!r}")
            return float(wait_ms)

    def finish(self, finish: Finish, inspect: Inspect | None) -> Report:
        """The model says it is done: ``COMPLETED`` only if ``inspect`` (run here, on the
        finish) verifies the goal; with no inspector ``PARTIAL``/``goal_unverified``."""
        with self._lock:
            if self._report is not None:
                return self._report
            fields: dict[str, Any] = {"answer": _json_ready(finish.answer)}
            if inspect is not None:
                fields["evidence"] = _evidence(inspect, None, finish)
            return self._final("finish", fields)

    def planner_failed(self, error: BaseException) -> Report:
        """The model call raised instead of proposing: ``FAILED``/``planner_error``."""
        with self._lock:
            if self._report is not None:
                return self._report
            return self._final("failed", {"error": describe(error)})

    def halt(self, state: State, reason: Reason, detail: str = "") -> Report:
        """Stop now for a reason found outside the guard (``ValueError`` for a state or
        reason that is not one of the guard's words)."""
        state, reason = State(state), Reason(reason)
        with self._lock:
            if self._report is not None:
                return self._report
            return self._final(
                "halt",
                {"state": str(state), "reason": str(reason), "detail": str(detail)[:_TEXT_LIMIT]},
            )

    # -- driving ---------------------------------------------------------------------------

    def run(
        self,
        plan: Plan,
        execute: Execute,
        inspect: Inspect | None,
        *,
        reserve: Reserve | None = None,
    ) -> Report:
        """Drive ``plan`` / ``execute`` / ``inspect`` until the console stops the task, in
        the order ``Guard.run`` keeps (the same sequencer): ``plan(observation)`` returns a
        :class:`~guard.Call`, a list of them or a :class:`~guard.Finish`; ``execute(call)``
        runs one call the console let execute and returns its :class:`~guard.Result`;
        ``inspect`` is the trusted inspector (``None``: the console reads progress from
        the results). A wait a result asked for is slept here. Raises what a step raises
        (:exc:`ConsoleUnreachable`, :exc:`ProtocolError`); no tool runs without an allow.
        """
        seq = Sequencer(self, inspect=inspect)

        def wait(ms: float) -> None:
            self._sleep(ms / 1000.0)

        def cancelled() -> bool:
            return self._stop_requested

        report, _ = loop(seq, plan, execute, reserve=reserve, wait=wait, cancelled=cancelled)
        return report

    # -- closing ---------------------------------------------------------------------------

    def close(self) -> None:
        """Stop the heartbeat and close the connection (the task itself goes on: its lease
        runs out unless another :meth:`attach` takes it). Safe to call more than once."""
        self._quiet.set()
        beater = self._beater
        if beater is not None and beater is not threading.current_thread():
            beater.join(self._transport.timeout + 1.0)
        self._transport.close()
        self._beats.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    # -- internals -------------------------------------------------------------------------

    @property
    def _steps_path(self) -> str:
        return f"/api/attached/{self.task}/steps"

    def _opened(self, answer: Mapping[str, Any]) -> None:
        """Take in the first answer (a start's, or an attach's heartbeat), then beat."""
        task = answer.get("task", self.task)
        if not isinstance(task, int) or isinstance(task, bool) or task < 1:
            raise _invalid(f"the task is {task!r}")
        self.task = task
        seconds = answer.get("lease_seconds")
        if isinstance(seconds, int | float) and not isinstance(seconds, bool) and seconds > 0:
            self.lease_seconds = float(seconds)
        page = answer.get("url")
        page = page if isinstance(page, str) and page else f"/tasks/{task}/"
        self.page_url = urllib.parse.urljoin(self._transport.base_url + "/", page)
        with self._lock:
            self._take(answer)
        if self._heartbeat and self._report is None:
            self._beater = threading.Thread(
                target=self._beat, name=f"loopguard-heartbeat-{task}", daemon=True
            )
            self._beater.start()

    def _step(self, step: str, fields: Mapping[str, Any]) -> Any:
        """Send one step (with the buffered usage) and take in its answer. A step asked
        again with the same content after it got no answer keeps its request id."""
        body: dict[str, Any] = {"protocol": PROTOCOL, "lease": self.lease, "step": step, **fields}
        usage: dict[str, int] = {}
        if self._tokens:
            usage["tokens"] = self._tokens
        if self._cost is not None:
            usage["cost"] = self._cost
        if usage:
            body["usage"] = usage
        unanswered = self._unanswered
        if unanswered is not None and unanswered[1] == body:
            request_id = unanswered[0]
        else:
            request_id = uuid.uuid4().hex
        try:
            answer = self._transport.post(self._steps_path, {"request_id": request_id, **body})
        except ConsoleUnreachable:
            self._unanswered = (request_id, body)
            raise
        except ProtocolError:
            self._unanswered = None  # refused: it changed nothing, usage included
            raise
        self._unanswered = None
        self._tokens, self._cost = 0, None
        self._answers += 1
        self._take(answer)
        return answer

    def _then(self, ticket: Ticket) -> dict[str, Any]:
        """For the last call of a model call to report: ask for what follows in the same
        request — the wait, and, without a spend budget (no reservation to make), the next
        model call too. That call is then counted even if none follows (as the hosted runner
        counts the next one ahead): a client that ends here has one model call too many."""
        others = (t for t in self._tickets if t is not ticket)
        if any(t.status in (Status.ADMITTED, Status.EXECUTING, Status.REUSING) for t in others):
            return {}
        if self._remaining.get("spend") is None:
            return {"then": "model"}
        return {"then": "wait"}

    def _ahead(self, answer: Any) -> None:
        """Keep what a result's ``then`` answered ahead."""
        if self._report is not None or not isinstance(answer, Mapping):
            return
        wait_ms = answer.get("wait_ms")
        if isinstance(wait_ms, int | float) and not isinstance(wait_ms, bool) and wait_ms >= 0:
            self._wait_ahead = float(wait_ms)
        if answer.get("allowed") is True:
            self._model_ahead = True

    def _final(self, step: str, fields: Mapping[str, Any]) -> Report:
        """A step whose answer is the stop report."""
        self._step(step, fields)
        stop = self._stopped()
        if stop is None:
            raise _invalid(f"a {step} step answered no stop report")
        self._not_run()
        return stop

    def _stopped(self) -> Report | None:
        """The stop report, read again after a request (which may have brought it)."""
        return self._report

    def _take(self, answer: Mapping[str, Any]) -> None:
        """Keep what every answer carries: ``remaining``, ``state``, ``phase`` and the stop
        report, which is kept once and for all."""
        if "remaining" in answer:
            self._remaining = _remaining(answer["remaining"])
            self._remaining_at = time.monotonic()
        if isinstance(answer.get("state"), str):
            self.state = answer["state"]
        if isinstance(answer.get("phase"), int):
            self.phase = answer["phase"]
        stop = answer.get("stop")
        if stop is not None and self._report is None:
            reason = stop.get("reason") if isinstance(stop, Mapping) else None
            if isinstance(reason, str) and reason not in _REASONS:
                detail = str(stop.get("detail") or stop.get("resume_condition") or reason)
                self._quiet.set()
                raise ProtocolError(200, reason, detail, answer=answer)
            try:
                self._report = Report.from_dict(stop)
            except ValueError as exc:
                raise _invalid(str(exc)) from exc
            self._quiet.set()

    def _not_run(self) -> None:
        """The calls of a stopped model call that never entered will not: marked so."""
        for ticket in self._tickets:
            if ticket.status is Status.ADMITTED:
                ticket.status = Status.NOT_RUN

    def _beat(self) -> None:
        """The heartbeat thread: one attempt every third of the lease (the next beat is
        the retry) until closed or stopped. A refusal ends it: it would not change."""
        interval = max(self.lease_seconds / 3.0, 0.01)
        while not self._quiet.wait(interval):
            try:
                self._beat_once()
            except ConsoleUnreachable as exc:
                log.warning("heartbeat of task %s got no answer: %s", self.task, exc)
            except ProtocolError as exc:
                log.warning("heartbeat of task %s refused, no more heartbeats: %s", self.task, exc)
                return
            except Exception:  # a bug must not kill the thread silently
                log.exception("heartbeat of task %s failed", self.task)

    def _beat_once(self) -> None:
        with self._lock:
            seen = self._answers
        body = {
            "protocol": PROTOCOL,
            "request_id": uuid.uuid4().hex,
            "lease": self.lease,
            "step": "heartbeat",
        }
        # Outside the lock: a step is never held up by a heartbeat.
        answer = self._beats.post(self._steps_path, body)
        with self._lock:
            if answer.get("stop_requested") is True:
                self._stop_requested = True
            if self._answers == seen:
                self._take(answer)
            elif answer.get("stop") is not None and self._report is None:
                self._take({"stop": answer["stop"]})  # the stop is news however late


def _printable_id(value: Any) -> bool:
    return (
        isinstance(value, str)
        and 0 < len(value) <= 100
        and value.isascii()
        and (value.isprintable() and not value.isspace())
    )


def _task_id(raw: Any, *, given: bool = False) -> int:
    if not isinstance(raw, int) or isinstance(raw, bool) or raw < 1:
        if given:
            raise ValueError(f"task must be a task id, got {raw!r}")
        raise _invalid(f"the task is {raw!r}")
    return raw


def _take_over(guard: RemoteGuard, wait: float) -> None:
    """Take the task's lease with a heartbeat (waiting out a live predecessor's, up to
    ``wait`` seconds), then report what the predecessor left running."""
    waited = 0.0  # counted from the pauses, so that an injected sleep bounds it too
    while True:
        body = {
            "protocol": PROTOCOL,
            "request_id": uuid.uuid4().hex,
            "lease": guard.lease,
            "step": "heartbeat",
        }
        try:
            answer = guard._transport.post(guard._steps_path, body)
            break
        except ProtocolError as exc:
            left = wait - waited
            if exc.code != "lease_held" or left <= 0:
                raise
            pause = exc.retry_after if exc.retry_after is not None else _LEASE_POLL_SECONDS
            pause = max(0.05, min(pause, left, _LEASE_POLL_MAX))
            log.info("task %s: another lease is alive; waiting %.1f s", guard.task, pause)
            guard._sleep(pause)
            waited += pause
    guard._stop_requested = answer.get("stop_requested") is True
    interrupted = answer.get("interrupted") or []
    guard._opened(answer)
    for raw in interrupted:
        if guard._report is not None:
            break
        _report_interrupted(guard, raw)


def _report_interrupted(guard: RemoteGuard, raw: Any) -> None:
    """One call a lost predecessor left running, reported with a ``result`` step: nothing
    for a read or a reuse (the console treats it as interrupted), and for a write what the
    tool's lookup found (nothing without one: it stays ``UNKNOWN``)."""
    if not isinstance(raw, Mapping) or not isinstance(raw.get("ticket"), int):
        raise _invalid(f"an interrupted call without its ticket: {raw!r}")
    fields: dict[str, Any] = {"ticket": raw["ticket"]}
    lookup = guard._lookups.get(str(raw.get("tool")))
    key = raw.get("operation_key")
    if raw.get("effect") == "write" and raw.get("status") == "executing" and lookup and key:
        fields["lookup"] = _looked_up(lookup, str(key))
    with guard._lock:
        guard._step("result", fields)


def _looked_up(lookup: Lookup, key: str) -> dict[str, Any]:
    """What a trusted lookup says about ``key``, as the protocol carries it; a lookup that
    fails or answers something else cannot tell."""
    try:
        found = lookup(key)
    except Exception as exc:  # a failing lookup settles nothing
        return {"committed": None, "evidence": f"the lookup failed: {_message(exc)}"}
    if not isinstance(found, Settlement) or found.committed not in (True, False, None):
        return {"committed": None, "evidence": f"the lookup answered {_repr(found)}"}
    said: dict[str, Any] = {"committed": found.committed}
    said["evidence"] = (found.evidence or "the tool's lookup by operation key")[:_TEXT_LIMIT]
    if found.committed is True and found.result is not None:
        said["result"] = _json_ready(found.result.to_dict())
    return said


def _ticket(raw: Any, calls: list[Call]) -> Ticket:
    """An admitted ticket of the wire (``ticket`` is its index), holding the caller's own
    call: the console answers with the arguments redacted, as it stores them."""
    try:
        ticket = Ticket.from_dict({**raw, "index": raw["ticket"], "result": raw.get("result")})
        ticket.call = calls[ticket.index]
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
        raise _invalid(f"a ticket that cannot be read: {exc!r}") from exc
    return ticket


def _nudge(raw: Any) -> Nudge:
    try:
        return Nudge(
            str(raw["message"]), str(raw["tool"]), str(raw["fingerprint"]), Reason(raw["reason"])
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise _invalid(f"a nudge that cannot be read: {exc!r}") from exc


def _message(error: BaseException) -> str:
    try:
        return str(error)[:_TEXT_LIMIT]
    except Exception:  # an exception that cannot describe itself is still reported
        return ""


def _repr(value: Any) -> str:
    try:
        return repr(value)[:_TEXT_LIMIT]
    except Exception:
        return safe_repr(value)


if TYPE_CHECKING:

    def _offers_the_steps(guard: RemoteGuard) -> StepGuard:
        return guard  # mypy checks that RemoteGuard satisfies the StepGuard protocol
