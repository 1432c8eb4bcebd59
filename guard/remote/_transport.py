"""The console's client over HTTP: one console, one kept-alive connection, the retries of a
request that got no answer, and the two errors a request may end in (no usable answer
after every retry, a refusal)."""

from __future__ import annotations

import base64
import http
import http.client
import json
import logging
import math
import threading
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from typing import Any

from .._checks import describe

_BACKOFF_FIRST, _BACKOFF_FACTOR, _BACKOFF_MAX = 0.1, 3.0, 2.0

log = logging.getLogger(__package__)  # "guard.remote": the client's one logger, as ever


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
