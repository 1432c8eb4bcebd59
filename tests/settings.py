"""Settings for the test suite: the console's own, plus agents that exist only for tests.

Celery workers started by the tests use this module too, so the agents they drive and the
lease timing they see are the same as in the test process.
"""

import os
from urllib.parse import urlsplit, urlunsplit

from console.project.settings import *  # noqa: F403
from console.project.settings import CELERY_BROKER_URL, LOOPGUARD_AGENTS, REDIS_URL


def _redis_of_worker(url: str, worker: str) -> str:
    """``url`` with the Redis database of pytest-xdist's ``worker`` (gw0, gw1, ...): the
    one after the given one per worker, as pytest-django gives each its own test database,
    so that one worker's Celery workers never take another's tasks."""
    parts = urlsplit(url)
    given = int(parts.path.strip("/") or 0)
    return urlunsplit(parts._replace(path=f"/{given + 1 + int(worker.removeprefix('gw'))}"))


# Said in the environment once REDIS_URL is the worker's: what the worker starts (Celery
# workers, gunicorn, manage.py) inherits both, and must not move it again.
_MOVED = "TESTS_REDIS_OF_XDIST_WORKER"
_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
if _WORKER and os.environ.get(_MOVED) != _WORKER and urlsplit(REDIS_URL).scheme == "redis":
    if CELERY_BROKER_URL == REDIS_URL:
        CELERY_BROKER_URL = _redis_of_worker(REDIS_URL, _WORKER)
    REDIS_URL = _redis_of_worker(REDIS_URL, _WORKER)
    os.environ["REDIS_URL"], os.environ[_MOVED] = REDIS_URL, _WORKER

LOOPGUARD_AGENTS = {
    **LOOPGUARD_AGENTS,
    "test_notices": "tests.console.agents.NoticeWriter",
    "test_reader": "tests.console.agents.SlowReader",
    "test_waiter": "tests.console.agents.Waiter",
    "test_shared_notice": "tests.console.agents.SharedNotice",
    "support_desk_model": "console.demo.support_desk.SupportDeskModel",
}
# A model that is never there (the discard port refuses): tests that talk to one start a
# stub server of their own and point these at it.
LOOPGUARD_MODEL_URL = "http://127.0.0.1:9/v1"
LOOPGUARD_MODEL_NAME = "test-model"
LOOPGUARD_MODEL_RETRIES = 0
# Short leases so that crash recovery happens within a test's patience.
LOOPGUARD_LEASE_SECONDS = 2.0
LOOPGUARD_RECOVERY_QUIET_SECONDS = 3 * LOOPGUARD_LEASE_SECONDS  # as the default reads it
# An attached client's: long enough for a test's steps through the test client; the tests
# of a client that vanishes shorten it.
LOOPGUARD_ATTACHED_LEASE_SECONDS = 10.0
LOOPGUARD_SWEEP_SECONDS = 1.0
CELERY_BEAT_SCHEDULE = {
    "recover-expired-leases": {"task": "console.tasks.sweep", "schedule": LOOPGUARD_SWEEP_SECONDS},
    "deliver-notifications": {"task": "console.tasks.notify", "schedule": 1.0},
}
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # fast test users
LOOPGUARD_NOTIFY_ALLOW_HTTP, LOOPGUARD_NOTIFY_ALLOWED_NETWORKS = True, ["127.0.0.1/32"]  # receivers
