"""Django settings for the console, read from the environment.

Every value comes through a small helper that raises ImproperlyConfigured on a bad value, so
a typo in the environment stops the process at start-up instead of misbehaving later.
Defaults suit a first run on a developer machine (DEBUG on, local PostgreSQL and Redis).
"""

import ipaddress
import os
from datetime import timedelta
from pathlib import Path
from urllib.parse import urlsplit

import dj_database_url
from django.core.exceptions import ImproperlyConfigured
from django.utils.csp import CSP

from console.agents import agents_from_environment
from console.project.environment import check_environment
from console.records.logs import logging_config
from console.records.spend import prices_from_environment

BASE_DIR = Path(__file__).resolve().parents[2]

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}

# Every variable the helpers below look at, so that the end of this module can tell a
# variable we read from a look-alike we would silently ignore (console/project/environment.py).
_READ: set[str] = set()


def _environ(name: str) -> str | None:
    _READ.add(name)
    return os.environ.get(name)


def env_bool(name: str, default: bool) -> bool:
    """Read a yes/no variable (1/0, true/false, yes/no, on/off)."""
    raw = _environ(name)
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
    value = (_environ(name) or "").strip() or default
    if value is None:
        raise ImproperlyConfigured(f"{name} must be set")
    return value


def env_list(name: str, default: list[str]) -> list[str]:
    """Read a comma-separated list, ignoring blanks around items."""
    raw = _environ(name)
    if raw is None or raw.strip() == "":
        return default
    return [item.strip() for item in raw.split(",") if item.strip()]


def env_int(name: str, default: int) -> int:
    """Read a whole number."""
    raw = (_environ(name) or "").strip()
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r} is not a whole number") from None


def env_float(name: str, default: float) -> float:
    """Read a positive number (seconds, say)."""
    raw = (_environ(name) or "").strip()
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
# Sessions and CSRF tokens are signed with it: a placeholder copied from .env.example, the
# development key or a short one must not reach production (50 is Django's own minimum).
if not DEBUG and (SECRET_KEY.startswith(("change-me", "django-insecure")) or len(SECRET_KEY) < 50):
    raise ImproperlyConfigured(
        "DJANGO_SECRET_KEY must be a real secret of 50+ characters when DEBUG is off; make one "
        "with: python3 -c 'import secrets; print(secrets.token_urlsafe(50))'"
    )

ALLOWED_HOSTS = env_list("DJANGO_ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]"])
# Origins (https://console.example.com) trusted for POSTs when the browser's Origin differs
# from what Django sees, e.g. TLS ends at a proxy that does not send X-Forwarded-Proto.
CSRF_TRUSTED_ORIGINS = env_list("DJANGO_CSRF_TRUSTED_ORIGINS", [])

# Standalone mode: a first look on one machine with nothing installed but Python. The same
# code runs on SQLite and on a broker kept in folders (kombu's filesystem transport), both
# under LOOPGUARD_DATA_DIR (git-ignored). `manage.py up` turns it on by itself when
# PostgreSQL or Redis does not answer; a sqlite:/// DATABASE_URL with
# CELERY_BROKER_URL=filesystem:// is the same thing spelt out.
LOOPGUARD_STANDALONE = env_bool("LOOPGUARD_STANDALONE", False)
LOOPGUARD_DATA_DIR = Path(env_str("LOOPGUARD_DATA_DIR", str(BASE_DIR / ".loopguard")))

DATABASES = {
    "default": env_database("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/loopguard"),
}
if LOOPGUARD_STANDALONE and DATABASES["default"]["ENGINE"] != "django.db.backends.sqlite3":
    DATABASES["default"] = {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": str(LOOPGUARD_DATA_DIR / "loopguard.sqlite3"),
    }
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # Several processes write (web, worker children, beat's sweep). WAL lets readers go on
    # while one writes; IMMEDIATE takes the write lock when a transaction begins, so writers
    # queue for it (up to the timeout, in seconds) instead of failing when a transaction
    # that began by reading tries to write. That queueing is what keeps the ledger's
    # gate-and-claim transaction atomic without row locks.
    DATABASES["default"]["OPTIONS"] = {
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL",
        "transaction_mode": "IMMEDIATE",
        "timeout": 30,
    }
# PostgreSQL's JIT compiles a plan whose estimated cost passes jit_above_cost. The dashboard's
# and /metrics' aggregates over a million tasks and ten million trace events do, and spend
# more compiling than running (tens to hundreds of ms a query); the console's queries are
# short, so its connections turn JIT off unless this asks to keep the server's setting.
LOOPGUARD_DATABASE_JIT = env_bool("LOOPGUARD_DATABASE_JIT", False)
_POSTGRESQL = DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql"
if _POSTGRESQL and not LOOPGUARD_DATABASE_JIT:
    _given = DATABASES["default"].get("OPTIONS")
    _options: dict[str, object] = dict(_given) if isinstance(_given, dict) else {}
    _options["options"] = f"{_options.get('options', '')} -c jit=off".strip()
    DATABASES["default"]["OPTIONS"] = _options
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
    "axes",  # sign-in throttling: its attempts and access logs are tables in our database
    "console",
    "console.demo",
]

# A form refused by the CSRF check gets the console's page, with its navigation.
CSRF_FAILURE_VIEW = "console.project.pages.csrf_failure"

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    # Outside everything that may read the database (the session, the sign-in check).
    "console.project.pages.DatabaseUnavailable",
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
    # Pages in the viewer's time zone; the console's own 404 page in development too.
    "console.project.pages.ViewerTimeZone",
    "console.project.pages.BrandedNotFound",
    # After WhiteNoise (which answers static files itself, with their long cache lifetime):
    # every page, export and API answer is private to the person who asked for it.
    "console.project.security.NoStoreMiddleware",
    # Last, as django-axes asks: it turns a throttled sign-in into the lockout page.
    "axes.middleware.AxesMiddleware",
]

# Everything, htmx included, is served from our own origin: no CDN, no inline scripts. No
# other site may frame the console (clickjacking), forms post only to it, and an injected
# <base> cannot redirect relative URLs.
SECURE_CSP = {
    "default-src": [CSP.SELF],
    "frame-ancestors": [CSP.NONE],
    "form-action": [CSP.SELF],
    "base-uri": [CSP.NONE],
}

# -- Signing in (see docs/deployment.md, "Signing in") ---------------------------------------
# django-axes counts failed sign-ins in the database (PostgreSQL, or SQLite in standalone
# mode: no Redis needed) and refuses sign-ins for an account, and from an address, that
# failed too often within the cool-off. Its backend goes first so that a throttled sign-in
# is refused before the password is even checked.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
# One account from one address: a person's typos, or one attacker guessing one password.
LOOPGUARD_LOGIN_FAILURE_LIMIT = env_int("LOOPGUARD_LOGIN_FAILURE_LIMIT", 5)
# One address, whatever accounts it tries (password spraying). Everyone behind an office's
# NAT shares it, so it must stay far above their typos: each of them stops counting towards
# it at the limit above, so reaching it takes guesses at ten accounts or more.
LOOPGUARD_LOGIN_ADDRESS_FAILURE_LIMIT = env_int(
    "LOOPGUARD_LOGIN_ADDRESS_FAILURE_LIMIT", 10 * LOOPGUARD_LOGIN_FAILURE_LIMIT
)
# One account, whatever addresses guess it: bounds guessing from many addresses, while no one
# address (which stops at the first limit) can lock its owner out everywhere.
LOOPGUARD_LOGIN_ACCOUNT_FAILURE_LIMIT = env_int(
    "LOOPGUARD_LOGIN_ACCOUNT_FAILURE_LIMIT", 4 * LOOPGUARD_LOGIN_FAILURE_LIMIT
)
LOOPGUARD_LOGIN_COOLOFF_MINUTES = env_float("LOOPGUARD_LOGIN_COOLOFF_MINUTES", 15.0)
# How many reverse proxies in front of the console append the client's address to
# X-Forwarded-For. 0: the connecting address (REMOTE_ADDR) is the client, and the header,
# which any client can write, is ignored.
LOOPGUARD_TRUSTED_PROXIES = env_int("LOOPGUARD_TRUSTED_PROXIES", 0)
if LOOPGUARD_LOGIN_FAILURE_LIMIT < 1 or LOOPGUARD_TRUSTED_PROXIES < 0:
    raise ImproperlyConfigured(
        "LOOPGUARD_LOGIN_FAILURE_LIMIT must be at least 1 and LOOPGUARD_TRUSTED_PROXIES at least 0"
    )
for _name, _limit in [
    ("LOOPGUARD_LOGIN_ADDRESS_FAILURE_LIMIT", LOOPGUARD_LOGIN_ADDRESS_FAILURE_LIMIT),
    ("LOOPGUARD_LOGIN_ACCOUNT_FAILURE_LIMIT", LOOPGUARD_LOGIN_ACCOUNT_FAILURE_LIMIT),
]:
    # Below it, the wider counter would refuse first and the pair's limit would mean nothing.
    if _limit < LOOPGUARD_LOGIN_FAILURE_LIMIT:
        raise ImproperlyConfigured(
            f"{_name}={_limit} must be at least LOOPGUARD_LOGIN_FAILURE_LIMIT "
            f"({LOOPGUARD_LOGIN_FAILURE_LIMIT})"
        )
AXES_FAILURE_LIMIT = LOOPGUARD_LOGIN_FAILURE_LIMIT
AXES_COOLOFF_TIME = timedelta(minutes=LOOPGUARD_LOGIN_COOLOFF_MINUTES)
# Three counters: the pair (account, address), the address alone, the account alone. axes
# holds every counter to AXES_FAILURE_LIMIT; our handler gives the two wider ones their own
# limits above (LoginThrottle.get_failures). Any one at its limit refuses the sign-in.
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"], "ip_address", "username"]
# A refused attempt does not restart the cool-off, so "try again in N minutes" holds.
AXES_RESET_COOL_OFF_ON_FAILURE_DURING_LOCKOUT = False
# axes' own reset on success would also forgive the address's failures against other
# accounts (an attacker signing in to their own account between guesses); our handler
# forgives only the account that signed in.
AXES_RESET_ON_SUCCESS = False
AXES_HANDLER = "console.project.security.LoginThrottle"
AXES_CLIENT_IP_CALLABLE = "console.project.security.client_address"
AXES_USERNAME_CALLABLE = "console.project.security.attempted_username"
AXES_CLIENT_STR_CALLABLE = "console.project.security.client_description"
AXES_LOCKOUT_CALLABLE = "console.project.security.lockout_response"
# Every failure is kept (up to 1000 per account) beside the counters, which expire.
AXES_ENABLE_ACCESS_FAILURE_LOG = True

# -- Sessions --------------------------------------------------------------------------------
# One shift: a session ends this long after signing in (using the console does not extend
# it), and, unless turned off, when the browser closes.
LOOPGUARD_SESSION_HOURS = env_float("LOOPGUARD_SESSION_HOURS", 8.0)
SESSION_COOKIE_AGE = max(60, round(LOOPGUARD_SESSION_HOURS * 3600))
SESSION_EXPIRE_AT_BROWSER_CLOSE = env_bool("LOOPGUARD_SESSION_ENDS_WITH_BROWSER", True)

# Not a strength rule: Django tells each validator when a password was changed (set_password
# then save; not a hash upgrade at sign-in), which is when a user's API tokens are revoked.
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "console.project.security.RevokeApiTokensOnPasswordChange"},
]

ROOT_URLCONF = "console.project.urls"
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "dashboard"
LOGOUT_REDIRECT_URL = "login"
WSGI_APPLICATION = "console.project.wsgi.application"

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
                # Whether the navigation offers the notifications page (admins only).
                "console.web.notification_views.navigation",
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

# -- HTTPS (see docs/settings.md) ----------------------------------------------------------
# Cookies are Secure (sent over https only; browsers count http://localhost as secure) unless
# DEBUG. The rest depends on where TLS ends, so each is a switch, and none applies with DEBUG.
_SECURE_COOKIES = env_bool("DJANGO_SECURE_COOKIES", not DEBUG)
SESSION_COOKIE_SECURE = _SECURE_COOKIES
CSRF_COOKIE_SECURE = _SECURE_COOKIES
# Each switch is read even with DEBUG on (where it is ignored), so that a malformed value or a
# misspelt name is caught on a developer's machine too, before production.
# Trust X-Forwarded-Proto only behind a proxy that sets it (and drops the client's own):
# otherwise any client could claim to be on https.
if env_bool("DJANGO_SECURE_PROXY_SSL_HEADER", False) and not DEBUG:
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SECURE_SSL_REDIRECT = env_bool("DJANGO_SECURE_SSL_REDIRECT", False) and not DEBUG
# Health checks and Prometheus call from inside the network over plain http.
SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^metrics$"]
_HSTS_SECONDS = env_int("DJANGO_SECURE_HSTS_SECONDS", 0)
SECURE_HSTS_SECONDS = 0 if DEBUG else _HSTS_SECONDS
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("DJANGO_SECURE_HSTS_INCLUDE_SUBDOMAINS", False)
SECURE_HSTS_PRELOAD = env_bool("DJANGO_SECURE_HSTS_PRELOAD", False)

# One line per event, with time, process and task id (console/records/logs.py; gunicorn uses
# it too).
LOGGING = logging_config(env_str("DJANGO_LOG_LEVEL", "INFO"))
# django-axes narrates every sign-in at INFO; its warnings (a failure, a lockout) are the
# lines worth keeping.
LOGGING["loggers"]["axes"] = {"level": "WARNING"}

# -- LoopGuard ------------------------------------------------------------------------------

# Agents the workers can run, by name; add your own as "name": "package.module.Class".
LOOPGUARD_AGENTS = {
    "support_desk": "console.demo.support_desk.SupportDesk",
    "paging": "console.demo.agents.Paging",
    "retrying_read": "console.demo.agents.RetryingRead",
    "oscillation": "console.demo.agents.Oscillation",
    "claimed_progress": "console.demo.agents.ClaimedProgress",
    "repeated_write": "console.demo.agents.RepeatedWrite",
    "lost_response": "console.demo.agents.LostResponse",
    "key_conflict": "console.demo.agents.KeyConflict",
    "permanent_error": "console.demo.agents.PermanentError",
    "missing_precondition": "console.demo.agents.MissingPrecondition",
    "slow_job": "console.demo.agents.SlowJob",
    "budget_burner": "console.demo.agents.BudgetBurner",
    "paid_reader": "console.demo.agents.PaidReader",
    "unknown_kind": "console.demo.agents.UnknownKind",
    "unverified_finish": "console.demo.agents.UnverifiedFinish",
    "long_runner": "console.demo.agents.LongRunner",
}

# A model behind an OpenAI-compatible Chat Completions API, for agents whose planner is a real
# model (console/agents/model.py). The support_desk_model agent is offered once it is set.
LOOPGUARD_MODEL_URL = env_str("LOOPGUARD_MODEL_URL", "")
LOOPGUARD_MODEL_NAME = env_str("LOOPGUARD_MODEL_NAME", "")
LOOPGUARD_MODEL_API_KEY = env_str("LOOPGUARD_MODEL_API_KEY", "")
LOOPGUARD_MODEL_TIMEOUT_SECONDS = env_float("LOOPGUARD_MODEL_TIMEOUT_SECONDS", 60.0)
LOOPGUARD_MODEL_RETRIES = env_int("LOOPGUARD_MODEL_RETRIES", 2)
if LOOPGUARD_MODEL_TIMEOUT_SECONDS <= 0 or LOOPGUARD_MODEL_RETRIES < 0:
    raise ImproperlyConfigured(
        "LOOPGUARD_MODEL_TIMEOUT_SECONDS must be above 0 and LOOPGUARD_MODEL_RETRIES at least 0"
    )
LOOPGUARD_MODEL_MAX_OUTPUT_TOKENS = env_int("LOOPGUARD_MODEL_MAX_OUTPUT_TOKENS", 1024)
if LOOPGUARD_MODEL_MAX_OUTPUT_TOKENS < 1:
    raise ImproperlyConfigured("LOOPGUARD_MODEL_MAX_OUTPUT_TOKENS must be at least 1")
# Spend: an integer count of the currency's minor unit (console/records/spend.py). Prices are
# "model=input:output" in minor units per million tokens; the demo's scripted planner
# stands in for a model priced at 2 and 8 dollars a million tokens.
LOOPGUARD_CURRENCY = env_str("LOOPGUARD_CURRENCY", "USD")
LOOPGUARD_CURRENCY_DECIMALS = env_int("LOOPGUARD_CURRENCY_DECIMALS", 6)
if not 0 <= LOOPGUARD_CURRENCY_DECIMALS <= 9:
    raise ImproperlyConfigured("LOOPGUARD_CURRENCY_DECIMALS must be between 0 and 9")
LOOPGUARD_MODEL_PRICES = prices_from_environment(
    env_str("LOOPGUARD_MODEL_PRICES", "demo-scripted=2000000:8000000")
)
if LOOPGUARD_MODEL_URL:
    LOOPGUARD_AGENTS["support_desk_model"] = "console.demo.support_desk.SupportDeskModel"
# More agents without a settings module of one's own: "name=package.module.Class, ...",
# merged over the ones above (the spelling is checked here, the import when one is used).
LOOPGUARD_AGENTS.update(agents_from_environment(env_str("LOOPGUARD_EXTRA_AGENTS", "")))

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
# An attached client's lease (docs/protocol.md): each step renews it, and so does the
# client's heartbeat every third of it while a tool runs. Longer than a worker's: it
# travels over HTTP, through the client's own network.
LOOPGUARD_ATTACHED_LEASE_SECONDS = env_float("LOOPGUARD_ATTACHED_LEASE_SECONDS", 60.0)
# How long after its client's lease lapsed an attached task waits for the client to come
# back (a crashed process restarted, a laptop woken) before the sweep stops it for a person
# (NEEDS_HUMAN/client_lost): without it, a client that never returns leaves the task
# queued for ever.
LOOPGUARD_ATTACHED_CLIENT_LOST_SECONDS = env_float("LOOPGUARD_ATTACHED_CLIENT_LOST_SECONDS", 3600.0)
# The trace is partitioned by ranges of this many task ids (PostgreSQL): a task's trace is in
# one partition, and a range of long-finished tasks leaves as one table. The beat keeps the
# partitions ahead of the newest task (docs/deployment.md, "History that lasts").
LOOPGUARD_TRACE_PARTITION_TASKS = env_int("LOOPGUARD_TRACE_PARTITION_TASKS", 100_000)
if LOOPGUARD_TRACE_PARTITION_TASKS < 1:
    raise ImproperlyConfigured("LOOPGUARD_TRACE_PARTITION_TASKS must be at least 1")
# The operation history and the audit log are partitioned by ranges of this many of their
# own ids (PostgreSQL), made ahead by the same beat entry.
LOOPGUARD_HISTORY_PARTITION_ROWS = env_int("LOOPGUARD_HISTORY_PARTITION_ROWS", 1_000_000)
if LOOPGUARD_HISTORY_PARTITION_ROWS < 1:
    raise ImproperlyConfigured("LOOPGUARD_HISTORY_PARTITION_ROWS must be at least 1")
# Where `manage.py archive` writes the partitions it takes out of the database (a file and
# its manifest each), and how many whole months after its tasks finished beat archives a
# range by itself, daily (0: never; `manage.py archive` by hand only).
LOOPGUARD_ARCHIVE_DIR = Path(env_str("LOOPGUARD_ARCHIVE_DIR", str(LOOPGUARD_DATA_DIR / "archive")))
LOOPGUARD_ARCHIVE_AFTER_MONTHS = env_int("LOOPGUARD_ARCHIVE_AFTER_MONTHS", 0)
if LOOPGUARD_ARCHIVE_AFTER_MONTHS < 0:
    raise ImproperlyConfigured(
        "LOOPGUARD_ARCHIVE_AFTER_MONTHS must be 0 (off) or a whole number of months"
    )
# How often Celery beat looks for tasks whose driver's lease expired.
LOOPGUARD_SWEEP_SECONDS = env_float("LOOPGUARD_SWEEP_SECONDS", 10.0)
LOOPGUARD_REQUEUE_AFTER_SECONDS = env_float("LOOPGUARD_REQUEUE_AFTER_SECONDS", 120.0)
LOOPGUARD_MAX_RECOVERIES = env_int("LOOPGUARD_MAX_RECOVERIES", 3)
# Before a person is paged for a write a lost driver left in flight, its tool's lookup is
# asked, outside any transaction: this many tries, within this many seconds for one write.
LOOPGUARD_RECOVERY_LOOKUP_TRIES = env_int("LOOPGUARD_RECOVERY_LOOKUP_TRIES", 3)
if LOOPGUARD_RECOVERY_LOOKUP_TRIES < 1:
    raise ImproperlyConfigured("LOOPGUARD_RECOVERY_LOOKUP_TRIES must be at least 1")
LOOPGUARD_RECOVERY_LOOKUP_SECONDS = env_float("LOOPGUARD_RECOVERY_LOOKUP_SECONDS", 10.0)
# A lookup's "not committed" lets the write run again only once the lost driver has been
# silent this long (a frozen worker may still be about to make it): three leases.
LOOPGUARD_RECOVERY_QUIET_SECONDS = env_float(
    "LOOPGUARD_RECOVERY_QUIET_SECONDS", 3 * LOOPGUARD_LEASE_SECONDS
)
# The runner prepares its few fixed statements (console/store/statements.py); off for poolers
# that cannot keep prepared statements.
LOOPGUARD_PREPARED_STATEMENTS = env_bool("LOOPGUARD_PREPARED_STATEMENTS", True)
# The same agent and input started more than this many times inside the window is held.
LOOPGUARD_RESTART_LIMIT = env_int("LOOPGUARD_RESTART_LIMIT", 3)
LOOPGUARD_RESTART_WINDOW_SECONDS = env_int("LOOPGUARD_RESTART_WINDOW_SECONDS", 600)
# The bearer token Prometheus sends to /metrics. Unset, /metrics answers loopback clients only.
LOOPGUARD_METRICS_TOKEN = env_str("LOOPGUARD_METRICS_TOKEN", "")
if LOOPGUARD_METRICS_TOKEN and (
    len(LOOPGUARD_METRICS_TOKEN) < 16 or LOOPGUARD_METRICS_TOKEN.startswith("change-me")
):
    raise ImproperlyConfigured("LOOPGUARD_METRICS_TOKEN must be a secret of 16+ characters")

# -- Notifications (console/drivers/notifications.py; docs/operator-guide.md, "Notifications") -----
# The console's address as people reach it (https://console.example.com), so that a notice
# links straight to the page to act on. Unset, notices carry paths (/tasks/42/) only, and
# the notifications page says so.
LOOPGUARD_PUBLIC_URL = env_str("LOOPGUARD_PUBLIC_URL", "").rstrip("/")
if LOOPGUARD_PUBLIC_URL and (
    urlsplit(LOOPGUARD_PUBLIC_URL).scheme not in {"http", "https"}
    or not urlsplit(LOOPGUARD_PUBLIC_URL).netloc
    or urlsplit(LOOPGUARD_PUBLIC_URL).query
):
    raise ImproperlyConfigured(
        f"LOOPGUARD_PUBLIC_URL={LOOPGUARD_PUBLIC_URL!r} must be an http(s) address such as "
        "https://console.example.com"
    )
# A write still UNKNOWN this long after it became so is told about (once per operation).
LOOPGUARD_NOTIFY_UNKNOWN_AFTER_MINUTES = env_float("LOOPGUARD_NOTIFY_UNKNOWN_AFTER_MINUTES", 30.0)
# Events of one kind within this many seconds of the first go out as one notice per channel.
LOOPGUARD_NOTIFY_BATCH_SECONDS = env_int("LOOPGUARD_NOTIFY_BATCH_SECONDS", 60)
# How often beat looks for events to route and notices to deliver.
LOOPGUARD_NOTIFY_SECONDS = env_float("LOOPGUARD_NOTIFY_SECONDS", 10.0)
# How often beat sends the trace events added since to the OpenTelemetry collector (only
# when an OTEL_EXPORTER_OTLP_* endpoint is set: console/drivers/otel.py).
LOOPGUARD_OTEL_EXPORT_SECONDS = env_float("LOOPGUARD_OTEL_EXPORT_SECONDS", 5.0)
if LOOPGUARD_OTEL_EXPORT_SECONDS <= 0:
    raise ImproperlyConfigured(
        f"LOOPGUARD_OTEL_EXPORT_SECONDS={LOOPGUARD_OTEL_EXPORT_SECONDS:g} must be above 0"
    )
# Tries per notice (the first included), the wait before the second (doubled each time
# after), and how long one try may take.
LOOPGUARD_NOTIFY_ATTEMPTS = env_int("LOOPGUARD_NOTIFY_ATTEMPTS", 5)
LOOPGUARD_NOTIFY_BACKOFF_SECONDS = env_float("LOOPGUARD_NOTIFY_BACKOFF_SECONDS", 30.0)
LOOPGUARD_NOTIFY_TIMEOUT_SECONDS = env_float("LOOPGUARD_NOTIFY_TIMEOUT_SECONDS", 10.0)
if LOOPGUARD_NOTIFY_BATCH_SECONDS < 0 or LOOPGUARD_NOTIFY_ATTEMPTS < 1:
    raise ImproperlyConfigured(
        "LOOPGUARD_NOTIFY_BATCH_SECONDS must be at least 0 and LOOPGUARD_NOTIFY_ATTEMPTS at least 1"
    )
# Where webhooks may go (console/drivers/notifications.py, "where a webhook may go"). A webhook is a
# request from inside the console's network to a URL an admin typed: by default only https,
# only to public addresses (checked after resolution, at every delivery), so that an admin
# session cannot read the metadata service, Redis or PostgreSQL through it. A receiver on
# the internal network needs its network named here (CIDR: 10.20.0.0/16, fd00::/8).
LOOPGUARD_NOTIFY_ALLOW_HTTP = env_bool("LOOPGUARD_NOTIFY_ALLOW_HTTP", False)
LOOPGUARD_NOTIFY_ALLOWED_NETWORKS = env_list("LOOPGUARD_NOTIFY_ALLOWED_NETWORKS", [])
for _network in LOOPGUARD_NOTIFY_ALLOWED_NETWORKS:
    try:
        ipaddress.ip_network(_network)  # strict: 10.1.2.3/8 is a typo more often than a wish
    except ValueError as _error:
        raise ImproperlyConfigured(
            f"LOOPGUARD_NOTIFY_ALLOWED_NETWORKS: {_network!r} is not a network such as "
            f"10.20.0.0/16 or fd00::/8 ({_error})"
        ) from None
# Email notices go through Django's mailer ("default" in MAILERS), made from the EMAIL_*
# variables. Without EMAIL_HOST there is no mailer and no email is sent (an email channel's
# tries fail and say so); webhooks need none of these.
_EMAIL_HOST = env_str("EMAIL_HOST", "")
_EMAIL_OPTIONS: dict[str, object] = {
    "host": _EMAIL_HOST,
    "port": env_int("EMAIL_PORT", 25),
    "username": env_str("EMAIL_HOST_USER", ""),
    "password": env_str("EMAIL_HOST_PASSWORD", ""),
    "use_tls": env_bool("EMAIL_USE_TLS", False),
    "use_ssl": env_bool("EMAIL_USE_SSL", False),
    "timeout": env_float("EMAIL_TIMEOUT", 10.0),
}
if _EMAIL_OPTIONS["use_tls"] and _EMAIL_OPTIONS["use_ssl"]:
    raise ImproperlyConfigured("EMAIL_USE_TLS and EMAIL_USE_SSL cannot both be on: choose one")
MAILERS: dict[str, dict[str, object]] = (
    {
        "default": {
            "BACKEND": "django.core.mail.backends.smtp.EmailBackend",
            "OPTIONS": _EMAIL_OPTIONS,
        }
    }
    if _EMAIL_HOST
    else {}
)
DEFAULT_FROM_EMAIL = env_str("EMAIL_FROM", "loopguard@localhost")
# No mailer is a choice (no email channels), not a mistake worth a warning on every command.
SILENCED_SYSTEM_CHECKS = [] if MAILERS else ["mail.W001"]

# -- Celery ---------------------------------------------------------------------------------
# Why these values: a task message only carries a task id, and the runner's lease makes a
# second delivery harmless (it finds the lease held or the task finished). So we acknowledge
# late (after the run), re-queue the message when a worker process dies, and fetch one
# message at a time so that a long agent run never sits on messages another worker could
# take. The Redis visibility timeout bounds how long an unacknowledged message waits before
# redelivery; the beat sweep recovers crashed runs on its own much sooner, so the timeout
# only needs to exceed the longest task we expect to run in one go.
CELERY_BROKER_URL = env_str("CELERY_BROKER_URL", REDIS_URL)
if LOOPGUARD_STANDALONE and urlsplit(CELERY_BROKER_URL).scheme != "filesystem":
    CELERY_BROKER_URL = "filesystem://localhost/"
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_IGNORE_RESULT = True
CELERY_BROKER_TRANSPORT_OPTIONS: dict[str, object] = {
    "visibility_timeout": env_int("CELERY_VISIBILITY_TIMEOUT", 3600),
}
LOOPGUARD_BROKER_DIR = LOOPGUARD_DATA_DIR / "broker"
if urlsplit(CELERY_BROKER_URL).scheme == "filesystem":
    # A message is a file. Producers write into the folder consumers read from, so "in"
    # and "out" are one folder. A consumer takes a message by renaming it into
    # "processed" (atomic on one file system, so two workers cannot both take it; the
    # folder is emptied when `manage.py up` starts). Folders are polled: 0.25 s keeps a
    # started task's latency low at the cost of a directory listing.
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(LOOPGUARD_BROKER_DIR / "messages"),
        "data_folder_out": str(LOOPGUARD_BROKER_DIR / "messages"),
        "control_folder": str(LOOPGUARD_BROKER_DIR / "control"),
        "store_processed": True,
        "processed_folder": str(LOOPGUARD_BROKER_DIR / "processed"),
        "polling_interval": 0.25,
    }
    # Remote control (celery inspect/control) broadcasts through fanout files nobody
    # here reads; the console does not use it.
    CELERY_WORKER_ENABLE_REMOTE_CONTROL = False
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_TASK_DEFAULT_QUEUE = env_str("CELERY_QUEUE", "loopguard")
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_BEAT_SCHEDULE = {
    "recover-expired-leases": {
        "task": "console.tasks.sweep",
        "schedule": LOOPGUARD_SWEEP_SECONDS,
    },
    # Ranges of the history tables ready ahead of their newest rows (console/store/history.py).
    "trace-partitions-ahead": {
        "task": "console.tasks.partitions_ahead",
        "schedule": 3600.0,
    },
    # Route notification events into notices and deliver what is due; safe at any time.
    "deliver-notifications": {
        "task": "console.tasks.notify",
        "schedule": LOOPGUARD_NOTIFY_SECONDS,
    },
    # Totals of history for /metrics and the dashboard (console/rollups.py).
    "roll-ups": {
        "task": "console.tasks.roll_up",
        "schedule": 60.0,
    },
    # The trace to OpenTelemetry, behind the steps (does nothing without an endpoint).
    "export-trace": {
        "task": "console.tasks.export_trace",
        "schedule": LOOPGUARD_OTEL_EXPORT_SECONDS,
    },
}
if LOOPGUARD_ARCHIVE_AFTER_MONTHS:
    # Closed ranges of finished tasks older than the retention, to files (console/tasks.py).
    CELERY_BEAT_SCHEDULE["trace-archive"] = {
        "task": "console.tasks.archive",
        "schedule": 86400.0,
    }
# Beat keeps its schedule in memory: its entries (the sweep, the notifier) run every few
# seconds and are safe to run at any time, so there is nothing worth remembering across a
# restart. (The default, persistent scheduler keeps a shelve file; on Python 3.13 that is
# SQLite, which we have seen fail with "locking protocol" at start, and a beat that does not
# start recovers nothing.)
CELERY_BEAT_SCHEDULER = "celery.beat:Scheduler"

# -- Names that look like ours but are not read -----------------------------------------------
# Last, once every helper above has run: DEBUG=0 or LOOPGUARD_DEBUG=false would otherwise be
# silently ignored, leaving debug mode on while the operator believes it off.
LOOPGUARD_IGNORE_VARIABLES = env_list("LOOPGUARD_IGNORE_VARIABLES", [])
check_environment(os.environ, read=_READ, debug=DEBUG, ignore=set(LOOPGUARD_IGNORE_VARIABLES))
