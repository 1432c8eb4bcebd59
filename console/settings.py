"""Django settings for the console, read from the environment.

Every value comes through a small helper that raises ImproperlyConfigured on a bad value, so
a typo in the environment stops the process at start-up instead of misbehaving later.
Defaults suit a first run on a developer machine (DEBUG on, local PostgreSQL and Redis).
"""

import os
from pathlib import Path
from urllib.parse import urlsplit

import dj_database_url
from django.core.exceptions import ImproperlyConfigured
from django.utils.csp import CSP

BASE_DIR = Path(__file__).resolve().parent.parent

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def env_bool(name: str, default: bool) -> bool:
    """Read a yes/no variable (1/0, true/false, yes/no, on/off)."""
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ImproperlyConfigured(f"{name}={raw!r} is not a boolean (use 1/0, true/false, on/off)")


def env_str(name: str, default: str | None = None) -> str:
    """Read a non-empty string; without a default the variable is required."""
    value = os.environ.get(name, "").strip() or default
    if value is None:
        raise ImproperlyConfigured(f"{name} must be set")
    return value


def env_list(name: str, default: list[str]) -> list[str]:
    """Read a comma-separated list, ignoring blanks around items."""
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    return [item.strip() for item in raw.split(",") if item.strip()]


def env_int(name: str, default: int) -> int:
    """Read a whole number."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r} is not a whole number") from None


def env_float(name: str, default: float) -> float:
    """Read a positive number (seconds, say)."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r} is not a number") from None
    if not value > 0:
        raise ImproperlyConfigured(f"{name} must be positive")
    return value


def env_database(name: str, default: str) -> dict[str, object]:
    """Read a database URL (postgres://user:pass@host:port/name) into a DATABASES entry."""
    url = env_str(name, default)
    try:
        # Health checks keep a persistent connection from failing the first request after
        # PostgreSQL restarts.
        return dict(dj_database_url.parse(url, conn_max_age=60, conn_health_checks=True))
    except ValueError as error:
        raise ImproperlyConfigured(f"{name} is not a usable database URL: {error}") from error


def env_redis_url(name: str, default: str) -> str:
    """Read a Redis URL (redis://, rediss:// or unix://)."""
    url = env_str(name, default)
    if urlsplit(url).scheme not in {"redis", "rediss", "unix"}:
        raise ImproperlyConfigured(f"{name}={url!r} must start with redis://, rediss:// or unix://")
    return url


DEBUG = env_bool("DJANGO_DEBUG", default=True)

# The insecure key exists only so that a first run works; without DEBUG a real key is required.
_DEV_SECRET_KEY = "django-insecure-loopguard-development-only"  # noqa: S105
SECRET_KEY = env_str("DJANGO_SECRET_KEY", _DEV_SECRET_KEY if DEBUG else None)

ALLOWED_HOSTS = env_list("DJANGO_ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]"])

DATABASES = {
    "default": env_database("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres"),
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REDIS_URL = env_redis_url("REDIS_URL", "redis://127.0.0.1:6379/0")

INSTALLED_APPS = [
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",  # runserver serves static files the way production does
    "django.contrib.staticfiles",
    "django_htmx",
    "console",
    "console.desk",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    # Every page needs a signed-in person; the few exceptions say so (@login_not_required).
    "django.contrib.auth.middleware.LoginRequiredMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django.middleware.csp.ContentSecurityPolicyMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
]

# Everything, htmx included, is served from our own origin: no CDN, no inline scripts.
SECURE_CSP = {"default-src": [CSP.SELF]}

ROOT_URLCONF = "console.urls"
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "dashboard"
LOGOUT_REDIRECT_URL = "login"
WSGI_APPLICATION = "console.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.template.context_processors.csp",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "staticfiles"
STATICFILES_DIRS = [BASE_DIR / "static"]
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    # The manifest storage needs `collectstatic` to have run, which a deployment does and a
    # developer's first run does not.
    "staticfiles": {
        "BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"
        if DEBUG
        else "whitenoise.storage.CompressedManifestStaticFilesStorage"
    },
}

# Decided here rather than by WhiteNoise at start-up, because the test runner switches DEBUG off
# at run time and would otherwise make WhiteNoise expect a collected STATIC_ROOT.
WHITENOISE_USE_FINDERS = DEBUG
WHITENOISE_AUTOREFRESH = DEBUG

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

SESSION_COOKIE_SECURE = not DEBUG
CSRF_COOKIE_SECURE = not DEBUG

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": env_str("DJANGO_LOG_LEVEL", "INFO")},
}

# -- LoopGuard ------------------------------------------------------------------------------

# Agents the workers can run, by name; add your own as "name": "package.module.Class".
LOOPGUARD_AGENTS = {
    "support_desk": "console.agents.desk.SupportDesk",
    "paging": "console.agents.demos.Paging",
    "retrying_read": "console.agents.demos.RetryingRead",
    "oscillation": "console.agents.demos.Oscillation",
    "claimed_progress": "console.agents.demos.ClaimedProgress",
    "repeated_write": "console.agents.demos.RepeatedWrite",
    "lost_response": "console.agents.demos.LostResponse",
    "key_conflict": "console.agents.demos.KeyConflict",
    "permanent_error": "console.agents.demos.PermanentError",
    "missing_precondition": "console.agents.demos.MissingPrecondition",
    "slow_job": "console.agents.demos.SlowJob",
    "budget_burner": "console.agents.demos.BudgetBurner",
    "unknown_kind": "console.agents.demos.UnknownKind",
    "unverified_finish": "console.agents.demos.UnverifiedFinish",
    "long_runner": "console.agents.demos.LongRunner",
}

# Budgets every task starts from; an agent's defaults and the starter's values override them.
LOOPGUARD_DEFAULT_LIMITS = {
    "deadline_ms": 600_000,
    "model_calls": 50,
    "requests": 100,
    "executions": 60,
    "same": 2,
    "stagnant": 5,
    "polls": 20,
}
# Extra argument or field names whose values are never stored (besides passwords, tokens,
# API keys, authorization headers and cookies, which are always redacted).
LOOPGUARD_REDACT_FIELDS = env_list("LOOPGUARD_REDACT_FIELDS", [])
# A driver's lease on its task; renewed every third of it while the driver is alive.
LOOPGUARD_LEASE_SECONDS = env_float("LOOPGUARD_LEASE_SECONDS", 30.0)
# How often Celery beat looks for tasks whose driver's lease expired.
LOOPGUARD_SWEEP_SECONDS = env_float("LOOPGUARD_SWEEP_SECONDS", 10.0)
LOOPGUARD_REQUEUE_AFTER_SECONDS = env_float("LOOPGUARD_REQUEUE_AFTER_SECONDS", 120.0)
LOOPGUARD_MAX_RECOVERIES = env_int("LOOPGUARD_MAX_RECOVERIES", 3)
# The same agent and input started more than this many times inside the window is held.
LOOPGUARD_RESTART_LIMIT = env_int("LOOPGUARD_RESTART_LIMIT", 3)
LOOPGUARD_RESTART_WINDOW_SECONDS = env_int("LOOPGUARD_RESTART_WINDOW_SECONDS", 600)

# -- Celery ---------------------------------------------------------------------------------
# Why these values: a task message only carries a task id, and the runner's lease makes a
# second delivery harmless (it finds the lease held or the task finished). So we acknowledge
# late (after the run), re-queue the message when a worker process dies, and fetch one
# message at a time so that a long agent run never sits on messages another worker could
# take. The Redis visibility timeout bounds how long an unacknowledged message waits before
# redelivery; the beat sweep recovers crashed runs on its own much sooner, so the timeout
# only needs to exceed the longest task we expect to run in one go.
CELERY_BROKER_URL = env_str("CELERY_BROKER_URL", REDIS_URL)
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_IGNORE_RESULT = True
CELERY_BROKER_TRANSPORT_OPTIONS = {
    "visibility_timeout": env_int("CELERY_VISIBILITY_TIMEOUT", 3600),
}
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_TASK_DEFAULT_QUEUE = env_str("CELERY_QUEUE", "loopguard")
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_BEAT_SCHEDULE = {
    "recover-expired-leases": {
        "task": "console.tasks.sweep",
        "schedule": LOOPGUARD_SWEEP_SECONDS,
    },
}
# Beat keeps its last-run times in a file; outside the source tree.
CELERY_BEAT_SCHEDULE_FILENAME = env_str(
    "CELERY_BEAT_SCHEDULE_FILENAME",
    str(Path(os.environ.get("TMPDIR", "/tmp")) / "loopguard-celerybeat-schedule"),  # noqa: S108
)
