"""One attached task as this client holds it: its lease, what the console's latest answer
said (the state, the budget left, the stop report, kept once and for all), the usage to send
with the next step, and the sending of one step at a time."""

from __future__ import annotations

import threading
import time
import urllib.parse
import uuid
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any, Self

from .._checks import amount
from .._report import Report
from .._settlement import Lookup
from .._ticket import Batch, Ticket
from .._values import Reason
from ._heartbeat import _Heartbeat
from ._transport import ConsoleUnreachable, ProtocolError, _invalid, _Transport
from ._wire import PROTOCOL, _new_lease, _remaining

_LEASE_SECONDS = 60.0  # when an answer does not say (a heartbeat's need not)
_REASONS = frozenset(Reason)


class _Session:
    """One attached task on the console as this process holds it (what :class:`RemoteGuard`
    is made of, under its steps): the connections, the lease and its heartbeat, what the
    latest answer said, and the usage not sent yet. A step is sent with :meth:`_step`, one
    at a time (under the lock), and every answer is taken in by :meth:`_take`."""

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
        self._lock = threading.RLock()
        self._heartbeat = _Heartbeat(self, self._beats, enabled=heartbeat)
        self._report: Report | None = None
        self._remaining: dict[str, int | None] = {}
        self._remaining_at = time.monotonic()
        self._stop_requested = False
        self._batch = Batch()  # the calls of the current model call
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
        return tuple(self._batch.tickets)

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

    # -- closing ---------------------------------------------------------------------------

    def close(self) -> None:
        """Stop the heartbeat and close the connection (the task itself goes on: its lease
        runs out unless another :meth:`attach` takes it). Safe to call more than once."""
        self._heartbeat.stop(self._transport.timeout + 1.0)
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
        if self._report is None:
            self._heartbeat.start()

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

    def _final(self, step: str, fields: Mapping[str, Any]) -> Report:
        """A step whose answer is the stop report."""
        self._step(step, fields)
        stop = self._stopped()
        if stop is None:
            raise _invalid(f"a {step} step answered no stop report")
        self._batch.stopped()  # the calls never entered will not be
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
                self._heartbeat.quiet()
                raise ProtocolError(200, reason, detail, answer=answer)
            try:
                self._report = Report.from_dict(stop)
            except ValueError as exc:
                raise _invalid(str(exc)) from exc
            self._heartbeat.quiet()
