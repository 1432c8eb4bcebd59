"""How a :class:`RemoteGuard` comes to be: a new task (``start``), or one that exists
(``attach``, or a start asked again), taken over from a predecessor that may have died at
any step: its lease waited out, then the calls it left running reported, a write with what
the tool's trusted lookup finds."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Self, TypedDict, Unpack

from .._settlement import Lookup
from .._values import Limits, Settlement, _json_ready
from ._session import _Session
from ._transport import ConsoleUnreachable, ProtocolError, _invalid
from ._wire import (
    _TEXT_LIMIT,
    DEFAULT_CLIENT,
    PROTOCOL,
    _effects,
    _limits,
    _message,
    _printable_id,
    _repr,
    _task_id,
)

# attach/start waiting out a predecessor's lease: in all (a lease and a bit), and per try.
_WAIT_SECONDS = 90.0
_LEASE_POLL_SECONDS, _LEASE_POLL_MAX = 2.0, 15.0
# Leases of the starts this process made, by start id: asking again is the same start.
_STARTED: dict[str, str] = {}
_STARTED_KEPT = 1024

log = logging.getLogger(__package__)  # "guard.remote": the client's one logger, as ever


class _Connection(TypedDict, total=False):
    """How a client reaches the console (the defaults are ``_Session``'s)."""

    timeout: float
    retries: int
    sleep: Callable[[float], None]
    heartbeat: bool


class _Reaching(_Connection, total=False):
    """The options :meth:`RemoteGuard.start` and :meth:`RemoteGuard.attach` share."""

    lookups: Mapping[str, Lookup] | None
    wait: float


class _Making(_Session):
    """The two ways to get a :class:`RemoteGuard`: :meth:`start` and :meth:`attach`."""

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
        approval: Iterable[str] = (),
        **options: Unpack[_Reaching],
    ) -> Self:
        """Start a new attached task on the console at ``url`` (``POST /api/attached``).

        ``token`` is an API token of a person with the agent role; ``agent`` what the task
        is called; ``tools`` every tool the agent may call, name → ``"read"``/``"write"``
        (or a :class:`guard.adapters.ToolSpec`); ``client`` what drives it; ``input`` the
        goal; ``limits`` the guard's limits (a mapping names only the limits it sets, the
        console's defaults fill the rest; a :class:`~guard.Limits` sends every field);
        ``reason`` goes to the audit log; ``approval`` names tools of ``tools`` whose every
        call waits for a person's approval (the call's step answers the stop
        ``NEEDS_HUMAN``/``approval_required``, its ``pending`` the call; once approved, the
        task is taken again with :meth:`attach` and the call proposed again). The other
        ``options``, all keywords: ``timeout`` (seconds, default 10) bounds each attempt,
        ``retries`` (default 3) how many more attempts a request without an answer gets;
        ``sleep`` (default ``time.sleep``) waits between them. ``heartbeat=False`` sends no
        heartbeats. ``lookups`` and ``wait`` (default 90 seconds) are :meth:`attach`'s.

        ``start_id`` names this start (1-100 printable ASCII characters; a job's id, say):
        the console makes at most one task per start id and person, so a start asked again
        with it — after :exc:`ConsoleUnreachable`, or by a new process that never saw the
        answer — finds the task instead of making a second one, and takes it over as
        :meth:`attach` does. Without it a new id is made; :exc:`ConsoleUnreachable` then
        carries it as ``start_id``, to ask again with.

        A goal started too often is held before it runs: the guard is then stopped at once
        (:attr:`report`, ``NEEDS_HUMAN``/``restart_loop``).
        """
        if start_id is not None and not _printable_id(start_id):
            raise ValueError(f"start_id must be 1-100 printable ASCII characters, got {start_id!r}")
        request_id = start_id or uuid.uuid4().hex
        guard, wait = cls._reaching(url, token, **options)
        # The same process asking again sends the very same start (its lease included): the
        # console answers it as the first; a new process has a lease of its own (below).
        guard.lease = _STARTED.setdefault(request_id, guard.lease)
        while len(_STARTED) > _STARTED_KEPT:  # the oldest first: dicts keep their order
            del _STARTED[next(iter(_STARTED))]
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
        if approval:
            if isinstance(approval, str):  # a lone name would be read letter by letter
                raise TypeError("approval is a list of tool names, not one name")
            body["approval"] = list(approval)
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
        **options: Unpack[_Reaching],
    ) -> Self:
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
        guard, wait = cls._reaching(url, token, **options)
        guard.task = _task_id(task, given=True)
        _take_over(guard, wait)
        return guard

    @classmethod
    def _reaching(
        cls,
        url: str,
        token: str,
        *,
        lookups: Mapping[str, Lookup] | None = None,
        wait: float = _WAIT_SECONDS,
        **connection: Unpack[_Connection],
    ) -> tuple[Self, float]:
        """A client of the console with the options :meth:`start` and :meth:`attach` share
        (each default written once: here, and the connection's in ``_Session``), and how
        long it may wait out a predecessor's lease. An option that is not one of them
        raises ``TypeError``."""
        guard = cls(url, token=token, **connection)
        guard._lookups = dict(lookups or {})
        return guard, wait


def _take_over(guard: _Session, wait: float) -> None:
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


def _report_interrupted(guard: _Session, raw: Any) -> None:
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
