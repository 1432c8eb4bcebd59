"""Whether this driver may go on: its lease (kept alive by a heartbeat thread) and the
task's stop fact, asked in one place (:meth:`StopFact.asked`)."""

from __future__ import annotations

import logging
import threading
import time

from django.conf import settings
from django.db import DatabaseError, close_old_connections, connection

from console.models import Task
from console.store import Saved, StepStore

logger = logging.getLogger(__name__)

STOP_POLL_S = 0.2  # how often a waiting driver looks for a stop: well under a second

__all__ = ["STOP_POLL_S", "Heartbeat", "StopFact", "lease_seconds"]


def lease_seconds() -> float:
    return float(settings.LOOPGUARD_LEASE_SECONDS)


class Heartbeat(threading.Thread):
    """Keeps the lease alive while the driver works; notices when it is lost."""

    def __init__(self, store: StepStore) -> None:
        super().__init__(name=f"lease-{store.task_id}", daemon=True)
        self.store = store
        self.lost = False
        self._halt = threading.Event()

    def run(self) -> None:
        interval = lease_seconds() / 3
        deadline = time.monotonic() + lease_seconds()
        try:
            while not self._halt.wait(interval):
                try:
                    renewed = self.store.renew_lease(lease_seconds())
                except DatabaseError:
                    close_old_connections()
                    if time.monotonic() > deadline:  # it has expired by now
                        self.lost = True
                        return
                    continue
                if not renewed:
                    self.lost = True
                    return
                deadline = time.monotonic() + lease_seconds()
        finally:
            connection.close()

    def halt(self) -> None:
        self._halt.set()
        self.join(timeout=5)


class StopFact:
    """Has this task been asked to stop? The runner's one place for its stop fact
    (:meth:`asked`), which is also the guard's cancel signal.

    The fact is read back by every save (:meth:`take`, ``Saved.stop_requested``); when time
    has passed since (the model thought, a tool ran), the driver :meth:`forget`\\ s it and
    it is asked again. A lost lease (the heartbeat's) counts as a stop: this driver may not
    start anything more. If the database cannot be asked, nothing may start: the answer is
    "stop", and the driver leaves the task to recovery. A write's claim reads the fact in
    its own statement and answers the guard itself (``ClaimStatus.STOPPING``): a stop
    recorded after the last look is refused there, and the guard stops ``operator_stop``.
    """

    def __init__(self, task: Task, store: StepStore, heartbeat: Heartbeat) -> None:
        self.task_id = task.id
        self.store = store
        self.heartbeat = heartbeat
        self.seen: bool | None = task.stop_requested_at is not None

    def take(self, saved: Saved) -> None:
        self.seen = saved.stop_requested

    def forget(self) -> None:
        self.seen = None

    def asked(self, *, again: bool = False) -> bool:
        """Whether the task was asked to stop (or this driver lost its lease).

        ``again``: ask the database now, whatever was seen, about the fact alone, as the
        end of a drive records it; a fact that cannot be read raises ``DatabaseError`` then
        (no verdict is recorded on it) instead of answering "stop"."""
        if again:
            self.seen = None
        elif self.heartbeat.lost:
            return True
        if self.seen is None:
            try:
                self.seen = self.store.stop_requested()
            except DatabaseError:
                if again:
                    raise
                logger.exception("task %s: cannot read its stop fact", self.task_id)
                return True
        return self.seen

    def wait(self, ms: float) -> None:
        """Wait for a RETRYABLE/PENDING result, waking within ``STOP_POLL_S`` for a stop."""
        end = time.monotonic() + ms / 1000.0
        while True:
            self.seen = None
            left = end - time.monotonic()
            if left <= 0 or self.asked():
                return
            time.sleep(min(left, STOP_POLL_S))
