"""Views of the console that belong to no feature: the health check."""

import logging

import redis
from django.conf import settings
from django.db import DatabaseError, connection
from django.http import HttpRequest, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

logger = logging.getLogger(__name__)

# A health check must answer quickly even when Redis is gone, not hang the probe.
REDIS_TIMEOUT_S = 2.0


def database_is_up() -> bool:
    """Return whether PostgreSQL answers `SELECT 1`."""
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            return bool(cursor.fetchone() == (1,))
    except DatabaseError:
        logger.exception("healthz: database check failed")
        return False


def redis_is_up() -> bool:
    """Return whether Redis answers PING."""
    client = redis.Redis.from_url(
        settings.REDIS_URL,
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


@never_cache
@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    """Answer 200 when the database and Redis both respond, 503 otherwise.

    Only "ok"/"down" per dependency is shown: error details go to the log, not to whoever
    can reach this URL.
    """
    checks = {"database": database_is_up(), "redis": redis_is_up()}
    healthy = all(checks.values())
    return JsonResponse(
        {
            "status": "ok" if healthy else "unavailable",
            "checks": {name: "ok" if up else "down" for name, up in checks.items()},
        },
        status=200 if healthy else 503,
    )
