"""Refuse environment variables that look like LoopGuard's settings but are not read.

Only ``DJANGO_DEBUG`` turns debug mode off. An operator who writes ``DEBUG=0`` or
``LOOPGUARD_DEBUG=false`` instead would otherwise get a console in debug mode that they
believe is in production mode. So, once the settings module has read everything it reads,
:func:`check_environment` looks at the environment for names in our namespaces that nothing
reads, and stops start-up naming the likely spelling.

- ``LOOPGUARD_*`` is our namespace: an unknown name is refused.
- ``DJANGO_*``: LoopGuard reads some, Django itself a few (:data:`DJANGO_OWN`); any other is
  refused, because operators set these believing they configure Django.
- A bare ``DEBUG`` is common in shells for other tools, so it is refused only when it says
  "off" while debug mode is on (the one case where it lies); otherwise, if it disagrees with
  ``DJANGO_DEBUG``, it is a warning.

``LOOPGUARD_IGNORE_VARIABLES`` lists names to leave alone, for a variable that belongs to
something else on the machine.
"""

from __future__ import annotations

import difflib
import warnings
from collections.abc import Collection, Mapping

from django.core.exceptions import ImproperlyConfigured

__all__ = ["DJANGO_OWN", "READ_ELSEWHERE", "SettingsWarning", "check_environment"]

# Read by Django, its test runner, createsuperuser or django-admin's completion, not by us.
DJANGO_OWN = frozenset(
    {
        "DJANGO_SETTINGS_MODULE",
        "DJANGO_ALLOW_ASYNC_UNSAFE",
        "DJANGO_AUTO_COMPLETE",
        "DJANGO_COLORS",
        "DJANGO_CONFIGURATION",
        "DJANGO_LIVE_TEST_SERVER_ADDRESS",
        "DJANGO_RUNSERVER_HIDE_WARNING",
        "DJANGO_TEST_PROCESSES",
        "DJANGO_WATCHMAN_TIMEOUT",
    }
)
# createsuperuser reads DJANGO_SUPERUSER_<FIELD> for any field of the user model.
_DJANGO_OWN_PREFIXES = ("DJANGO_SUPERUSER_",)

# LoopGuard's own variables that something other than the settings module reads: manage.py
# and `up` (docs/settings.md, "Containers and processes" and "Standalone mode"), the log
# format, docker-compose.yml, and the test suite's switch. A new LOOPGUARD_* variable read
# outside the settings module must be added here, or start-up refuses it.
READ_ELSEWHERE = frozenset(
    {
        "LOOPGUARD_PROCESS",
        "LOOPGUARD_PORT",
        "LOOPGUARD_HOST",
        "LOOPGUARD_IN_VENV",
        "LOOPGUARD_IMAGE",
        "LOOPGUARD_HTTP_PUBLISH",
        "LOOPGUARD_TEST_FRESH_VENV",
    }
)

_PREFIXES = ("LOOPGUARD_", "DJANGO_")
_FALSE = {"0", "false", "no", "off"}
_TRUE = {"1", "true", "yes", "on"}


class SettingsWarning(UserWarning):
    """A variable that LoopGuard does not read disagrees with one it does."""


def check_environment(
    environ: Mapping[str, str],
    *,
    read: Collection[str],
    debug: bool,
    ignore: Collection[str] = (),
) -> None:
    """Raise :class:`ImproperlyConfigured` for variables in our namespaces that nothing reads.

    ``read`` is every name the settings helpers looked at, ``debug`` the DEBUG they decided,
    ``ignore`` the names the operator said belong to something else. The message names each
    refused variable and the spelling it probably meant.
    """
    known = set(read) | READ_ELSEWHERE
    refused = [
        _refusal(name, known)
        for name in sorted(environ)
        if name.startswith(_PREFIXES)
        and name not in known
        and name not in ignore
        and name not in DJANGO_OWN
        and not name.startswith(_DJANGO_OWN_PREFIXES)
    ]
    if "DEBUG" not in ignore:
        refused += _bare_debug(environ, debug=debug)
    if refused:
        raise ImproperlyConfigured(
            " ".join(refused)
            + " (docs/settings.md lists LoopGuard's settings; a variable that belongs to "
            "another program can be listed in LOOPGUARD_IGNORE_VARIABLES.)"
        )


def _refusal(name: str, known: set[str]) -> str:
    guess = _likely(name, known)
    hint = f": did you mean {guess}?" if guess else "."
    return f"{name} is not a LoopGuard setting and would be ignored{hint}"


def _likely(name: str, known: set[str]) -> str | None:
    """The documented name ``name`` most probably meant, if any is close."""
    bare = name.removeprefix("LOOPGUARD_").removeprefix("DJANGO_")
    # The right word under the other prefix (LOOPGUARD_DEBUG -> DJANGO_DEBUG) is the common
    # mistake; a misspelling within a prefix (DJANGO_DEBGU) is the other.
    for prefix in _PREFIXES:
        if prefix + bare in known:
            return prefix + bare
    # Names we read without a prefix, as Django spells them (EMAIL_HOST): DJANGO_EMAIL_HOST
    # or LOOPGUARD_EMAIL_HOST is someone reaching for that one.
    if bare in known:
        return bare
    close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.8)
    return close[0] if close else None


def _bare_debug(environ: Mapping[str, str], *, debug: bool) -> list[str]:
    raw = environ.get("DEBUG")
    if raw is None:
        return []
    value = raw.strip().lower()
    says = False if value in _FALSE else True if value in _TRUE else None
    if says is None or says == debug:
        return []  # someone else's DEBUG (DEBUG=express:*), or it agrees
    explicit = environ.get("DJANGO_DEBUG", "").strip() != ""  # empty counts as unset
    if not says and debug and not explicit:
        return [
            f"DEBUG={raw!r} is not a LoopGuard setting, and debug mode is still on: "
            "did you mean DJANGO_DEBUG?"
        ]
    warnings.warn(
        f"DEBUG={raw!r} is not a LoopGuard setting: DJANGO_DEBUG decides, and debug mode is "
        f"{'on' if debug else 'off'}",
        SettingsWarning,
        stacklevel=3,
    )
    return []
