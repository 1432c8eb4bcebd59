"""The lease kept alive: a daemon thread that sends a ``heartbeat`` every third of the lease
while nothing else is sent (a long tool, a slow model), on a connection of its own."""

from __future__ import annotations

import logging
import threading
import uuid
from typing import TYPE_CHECKING

from ._transport import ConsoleUnreachable, ProtocolError, _Transport
from ._wire import PROTOCOL

if TYPE_CHECKING:
    from ._session import _Session

log = logging.getLogger(__package__)  # "guard.remote": the client's one logger, as ever


class _Heartbeat:
    """The heartbeats of one guard's task, from a thread of their own: a heartbeat that fails
    is logged and tried again at the next beat; a refusal ends them, and so does the task's
    stop. What a heartbeat's answer says is taken in by the guard (its ``stop_requested``,
    and its state when no step has answered since)."""

    def __init__(self, guard: _Session, transport: _Transport, *, enabled: bool) -> None:
        self._guard = guard
        self._transport = transport  # the guard's second connection: steps never wait on it
        self._enabled = enabled
        self._quiet = threading.Event()  # set on close() and once the task has stopped
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Beat from now on (nothing, if the guard was made with ``heartbeat=False``)."""
        if self._enabled:
            self._thread = threading.Thread(
                target=self._beat, name=f"loopguard-heartbeat-{self._guard.task}", daemon=True
            )
            self._thread.start()

    def quiet(self) -> None:
        """No more beats: the task has stopped."""
        self._quiet.set()

    def stop(self, timeout: float) -> None:
        """No more beats, and the thread waited for (at most ``timeout`` seconds)."""
        self._quiet.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def _beat(self) -> None:
        """The heartbeat thread: one attempt every third of the lease (the next beat is
        the retry) until closed or stopped. A refusal ends it: it would not change."""
        guard = self._guard
        interval = max(guard.lease_seconds / 3.0, 0.01)
        while not self._quiet.wait(interval):
            try:
                self._beat_once()
            except ConsoleUnreachable as exc:
                log.warning("heartbeat of task %s got no answer: %s", guard.task, exc)
            except ProtocolError as exc:
                log.warning("heartbeat of task %s refused, no more heartbeats: %s", guard.task, exc)
                return
            except Exception:  # a bug must not kill the thread silently
                log.exception("heartbeat of task %s failed", guard.task)

    def _beat_once(self) -> None:
        guard = self._guard
        with guard._lock:
            seen = guard._answers
        body = {
            "protocol": PROTOCOL,
            "request_id": uuid.uuid4().hex,
            "lease": guard.lease,
            "step": "heartbeat",
        }
        # Outside the lock: a step is never held up by a heartbeat.
        answer = self._transport.post(guard._steps_path, body)
        with guard._lock:
            if answer.get("stop_requested") is True:
                guard._stop_requested = True
            if guard._answers == seen:
                guard._take(answer)
            elif answer.get("stop") is not None and guard._report is None:
                guard._take({"stop": answer["stop"]})  # the stop is news however late
