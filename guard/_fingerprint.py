"""Canonical call fingerprints: sha256 over the tool name and canonical JSON arguments."""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["BadArguments", "canonical_json", "fingerprint"]

# Deeper than any honest tool argument, shallow enough to stay far from the interpreter's
# recursion limit inside the C encoder.
MAX_DEPTH = 200

_SCALARS = (str, int, type(None))  # bool is an int


def _make_encoder() -> Callable[[Any], str]:
    # The C encoder, built once: json.dumps() would build it again on every call, which
    # costs more than the encoding itself for typical tool arguments. Cycles are refused by
    # _check() before encoding, so the encoder's own cycle markers are not needed.
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:  # pragma: no cover - interpreters without the _json accelerator
        encoder = json.JSONEncoder(
            ensure_ascii=False, allow_nan=False, sort_keys=True, separators=(",", ":")
        )
        return encoder.encode
    c_encode = make(None, None, json.encoder.encode_basestring, None, ":", ",", True, False, False)
    return lambda value: "".join(c_encode(value, 0))


_encode = _make_encoder()


class BadArguments(ValueError):
    """The arguments cannot be represented as JSON, so the call has no fingerprint."""


def canonical_json(args: Mapping[str, Any]) -> str:
    """Return the canonical JSON text of ``args``.

    Object keys are sorted; nothing else is normalised: whitespace inside strings, list
    order, numbers, cursors, page numbers and message text are all kept. Keys must be
    strings, floats finite, containers acyclic and not deeper than ``MAX_DEPTH``.
    """
    _check(args)
    try:
        return _encode(args)
    except (TypeError, ValueError, RecursionError) as exc:  # pragma: no cover - _check is exact
        raise BadArguments(str(exc)) from exc


def fingerprint(tool: str, args: Mapping[str, Any]) -> str:
    """sha256 hex digest of the tool name and the canonical arguments."""
    text = canonical_json(args)
    return hashlib.sha256(f"{tool}\x00{text}".encode()).hexdigest()


def _check(root: Any) -> None:
    """Refuse anything JSON cannot represent exactly in ``root``, a dict of arguments."""
    if not _plainly_json(root, 0):
        _walk(root)  # slower, and says precisely what is wrong


def _plainly_json(value: Any, depth: int) -> bool:
    """True if ``value`` is made of exact JSON types only (the fast path).

    Bounded by ``MAX_DEPTH``, so a cycle ends here as ``False`` and ``_walk`` names it.
    Scalars are tested inline: this runs before every tool call.
    """
    if depth >= MAX_DEPTH:
        return False
    kind = type(value)
    if kind is dict:
        items: Any = value.values()
        for key in value:
            if type(key) is not str:
                return False
    elif kind is list or kind is tuple:
        items = value
    else:
        return _plain_scalar(value)
    for item in items:
        kind = type(item)
        if kind is str or kind is int or item is None or kind is bool:
            continue
        if kind is float:
            if not math.isfinite(item):
                return False
        elif not _plainly_json(item, depth + 1):
            return False
    return True


def _plain_scalar(value: Any) -> bool:
    kind = type(value)
    if kind is float:
        return math.isfinite(value)
    return kind is str or kind is int or value is None or kind is bool


def _walk(root: Any) -> None:
    """Walk ``root`` once, iteratively, checking every key and value."""
    stack: list[tuple[Any, int]] = [(root, 0)]
    open_ids: set[int] = set()
    exits: list[tuple[int, int]] = []  # (depth, id) of containers still on the current path
    while stack:
        value, depth = stack.pop()
        while exits and exits[-1][0] >= depth:
            open_ids.discard(exits.pop()[1])
        if isinstance(value, _SCALARS):
            continue
        if isinstance(value, float):
            if not math.isfinite(value):
                raise BadArguments(f"{value!r} has no JSON form")
            continue
        if depth >= MAX_DEPTH:
            raise BadArguments(f"arguments nest deeper than {MAX_DEPTH} levels")
        if isinstance(value, dict):
            children: Any = value.values()
            for key in value:
                if not isinstance(key, str):
                    raise BadArguments(f"object key {key!r} is not a string")
        elif isinstance(value, list | tuple):
            children = value
        else:
            raise BadArguments(f"{type(value).__name__} has no JSON form")
        if id(value) in open_ids:
            raise BadArguments("arguments contain a reference cycle")
        open_ids.add(id(value))
        exits.append((depth, id(value)))
        stack.extend((child, depth + 1) for child in children)
