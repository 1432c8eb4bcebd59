"""Secrets stay out: what is stored of arguments and results is redacted first.

Keys that name a secret (authorization headers, API keys, passwords, tokens, and the
field names configured in ``LOOPGUARD_REDACT_FIELDS``) have their values replaced, and
strings that look like credentials (bearer tokens, ``sk-``/``ghp_``-style keys, JWTs) are
masked wherever they appear. Previews are bounded so a huge payload cannot bloat a trace.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from functools import lru_cache
from typing import Any

from django.conf import settings

REDACTED = "[redacted]"
PREVIEW_CHARS = 2_000
MAX_DEPTH = 20
"""How deep :func:`redact` walks; below it a value is cut (``…``)."""
_MAX_DEPTH = MAX_DEPTH
# A surrogate code point alone: JSON can carry one ("\ud800"), UTF-8 cannot encode it.

# Compared with the key lower-cased and without separators: "X-Api-Key" -> "xapikey".
_SECRET_NAMES = frozenset({"auth", "pass", "pwd", "session", "sessionid", "cookie", "otp", "pin"})
_SECRET_ENDINGS = (
    "password",
    "passwd",
    "secret",
    "token",
    "apikey",
    "authorization",
    "cookie",
    "credential",
    "credentials",
    "privatekey",
    "accesskey",
    "signature",
)
_SEPARATORS = re.compile(r"[-_.\s]")
_SECRET_TEXT = re.compile(
    r"(?i:bearer|basic)\s+[A-Za-z0-9._~+/=-]{8,}"
    r"|\b(?:sk|pk|rk|ghp|gho|ghs|ghu|xox[abpr]|AKIA)[-_A-Za-z0-9]{12,}"
    r"|\b(?:github_pat_|glpat-)[-_A-Za-z0-9]{12,}"
    r"|\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"
)
# "password=hunter2", "api_key: abc", 'token="xyz"', '"client_secret": "xyz"',
# "Authorization: Token abc" inside free text (error messages, reasons people type). A name
# may carry a prefix ("db_password", "x-api-key"), never glued letters ("tokens: 5" is not a
# token). The value is a quoted string, an auth scheme and its credential, or a run up to the
# next space, comma, semicolon or ampersand.
_PAIR_VALUE = r"(\"[^\"]*\"|'[^']*'|(?i:bearer|basic|token|digest)\s+[^\s,;&]+|[^\s,;&]+)"
_PAIR_SEPARATOR = r"[\"']?\s*[=:]\s*"
_SECRET_PAIR = re.compile(
    r"(?i)(?<![A-Za-z0-9])((?:pass(?:word|wd)?|pwd|secret|token|api[-_]?key|access[-_]?key"
    r"|auth|authorization|credentials?|private[-_]?key)" + _PAIR_SEPARATOR + ")" + _PAIR_VALUE
)


# Every pattern above needs one of these words to match: a text without any of them has
# nothing to mask, and one search answers that (most arguments and results are such).
_MAYBE_SECRET = re.compile(
    r"(?i:pass|pwd|secret|token|api|access|auth|bearer|basic|credential|private)"
    r"|sk|pk|rk|gh[opsu]|github_pat_|glpat-|xox|AKIA|eyJ"
)


def _extra_fields() -> frozenset[str]:
    fields: Iterable[str] = getattr(settings, "LOOPGUARD_REDACT_FIELDS", ())
    return _lowered(tuple(fields))


@lru_cache(maxsize=64)
def _lowered(fields: tuple[str, ...]) -> frozenset[str]:
    return frozenset(name.lower() for name in fields)


def redact(value: Any) -> Any:
    """A copy of ``value`` (JSON-like data) with secrets replaced by ``[redacted]``."""
    return _redact(value, _extra_fields(), 0)


def _is_secret(name: str, extra: frozenset[str]) -> bool:
    compact = _SEPARATORS.sub("", name.lower())
    return (
        compact in _SECRET_NAMES
        or compact.endswith(_SECRET_ENDINGS)
        or name.lower() in extra
        or compact in extra
    )


@lru_cache(maxsize=4096, typed=True)
def _key(key: Any, extra: frozenset[str]) -> tuple[str, bool]:
    """A mapping key as stored (text, NUL replaced) and whether it names a secret.

    Keys are field names, few and repeated step after step: each is judged once."""
    name = str(key).replace("\x00", "\ufffd")
    return name, _is_secret(name, extra)


def _redact(value: Any, extra: frozenset[str], depth: int) -> Any:
    if depth > _MAX_DEPTH:
        return "…"
    kind = type(value)  # the exact JSON types first: the common case, cheaply
    if kind is str:
        return _redact_text(value, extra)
    if value is None or kind is int or kind is bool or kind is float:
        return value
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            try:
                name, secret = _key(key, extra)
            except TypeError:  # a key that cannot be hashed: judged on its own
                name = str(key).replace("\x00", "\ufffd")
                secret = _is_secret(name, extra)
            out[name] = REDACTED if secret else _redact(item, extra, depth + 1)
        return out
    if isinstance(value, list | tuple):
        return [_redact(item, extra, depth + 1) for item in value]
    if isinstance(value, str):
        # PostgreSQL text and jsonb cannot hold NUL: keep a visible stand-in instead.
        return _redact_text(value, extra)
    if isinstance(value, bool | int | float):
        return value
    return _redact(repr(value), extra, depth)


def redact_text(text: str) -> str:
    """``text`` with credential-looking spans masked, the rest kept readable.

    For free text: messages, and what people type (reasons, evidence). Masked are
    credentials of known shapes (``Bearer …``, ``sk-…``, ``ghp_…``, ``xox…``, JWTs), and the
    value after a secret's name (``password=…``, ``passwd: …``, ``token=…``, ``api_key=…``,
    ``client_secret=…``, ``Authorization: …``) or after a field named in
    ``LOOPGUARD_REDACT_FIELDS`` (``iban=…``). A NUL becomes U+FFFD.
    """
    return _redact_text(text, _extra_fields())


def _redact_text(text: str, extra: frozenset[str]) -> str:
    custom = _field_pair(extra) if extra else None
    if _MAYBE_SECRET.search(text) is None and (custom is None or custom.search(text) is None):
        return text.replace("\x00", "\ufffd") if "\x00" in text else text
    # Credentials of a known shape first: "Authorization: Bearer abc…" then leaves a pair
    # whose whole value is already masked, rather than a masked scheme and a bare token.
    masked = _SECRET_TEXT.sub(REDACTED, text)
    masked = _SECRET_PAIR.sub(_keep_name, masked)
    if custom is not None:
        masked = custom.sub(_keep_name, masked)
    return masked.replace("\x00", "\ufffd")


def _keep_name(match: re.Match[str]) -> str:
    value = match.group(2)
    if value[:1] in "\"'":  # a quoted value stays quoted: JSON text stays JSON
        return match.group(1) + value[0] + REDACTED + value[0]
    return match.group(1) + REDACTED


@lru_cache(maxsize=16)
def _field_pair(extra: frozenset[str]) -> re.Pattern[str]:
    """``name=value`` (or ``name: value``) of the configured fields, inside free text."""
    names = "|".join(re.escape(name) for name in sorted(extra, key=len, reverse=True))
    return re.compile(
        r"(?i)(?<![A-Za-z0-9])((?:" + names + ")" + _PAIR_SEPARATOR + ")" + _PAIR_VALUE
    )


def preview(value: Any, limit: int = PREVIEW_CHARS) -> str:
    """Redacted, compact JSON text of ``value``, cut to ``limit`` characters."""
    text = json.dumps(redact(value), ensure_ascii=False, default=repr, separators=(", ", ": "))
    if len(text) > limit:
        return text[: limit - 1] + "…"
    return text
