"""Whether the console can reach what it needs: its database and its broker.

The ``/healthz`` view only answers with :func:`health`. Only "ok"/"down" per dependency is
given back: what went wrong goes to the log, not to whoever can reach the probe's URL.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import redis
from django.conf import settings
from django.db import DatabaseError

from console.store.queries import database_answers

logger = logging.getLogger(__name__)

# A health check must answer quickly even when Redis is gone, not hang the probe.
REDIS_TIMEOUT_S = 2.0


def database_is_up() -> bool:
    """Return whether the database (PostgreSQL, or SQLite standalone) answers `SELECT 1`."""
    try:
        return database_answers()
    except DatabaseError:
        logger.exception("healthz: database check failed")
        return False


def redis_is_up(url: str) -> bool:
    """Return whether the Redis at ``url`` answers PING."""
    client = redis.Redis.from_url(
        url,
        socket_connect_timeout=REDIS_TIMEOUT_S,
        socket_timeout=REDIS_TIMEOUT_S,
    )
    try:
        return bool(client.ping())
    except redis.RedisError:
        logger.exception("healthz: redis check failed")
        return False
    finally:
        client.close()


def broker_folders_are_up() -> bool:
    """Return whether the filesystem broker's folders exist and this process can write them."""
    options = settings.CELERY_BROKER_TRANSPORT_OPTIONS
    folders = {Path(str(options[name])) for name in ("data_folder_in", "data_folder_out")}
    missing = [str(f) for f in folders if not (f.is_dir() and os.access(f, os.W_OK | os.X_OK))]
    if missing:
        logger.error("healthz: broker folder(s) missing or not writable: %s", ", ".join(missing))
    return not missing


def broker_check() -> tuple[str, bool]:
    """The configured broker's name in the health answer, and whether it is reachable.

    The broker is Redis (shown as ``redis``) or, in standalone mode, kombu's filesystem
    transport (``broker``: its folders are there and writable).
    """
    if urlsplit(settings.CELERY_BROKER_URL).scheme == "filesystem":
        return "broker", broker_folders_are_up()
    return "redis", redis_is_up(settings.CELERY_BROKER_URL)


@dataclass(frozen=True, slots=True)
class Health:
    """Each dependency's name and whether it answered."""

    checks: dict[str, bool]

    @property
    def healthy(self) -> bool:
        """Every dependency answered."""
        return all(self.checks.values())

    def to_dict(self) -> dict[str, object]:
        """The body of ``/healthz``: an overall status and "ok"/"down" per dependency."""
        return {
            "status": "ok" if self.healthy else "unavailable",
            "checks": {name: "ok" if up else "down" for name, up in self.checks.items()},
        }


def health() -> Health:
    """Ask the database and the configured broker, now."""
    broker, broker_up = broker_check()
    return Health({"database": database_is_up(), broker: broker_up})
