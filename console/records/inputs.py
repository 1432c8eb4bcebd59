"""JSON and text from outside, checked before anything walks it.

Every door that takes JSON (the API's bodies, the console's forms, ``manage.py start_task``,
a model server's reply and its tool calls' arguments) reads it with :func:`load_json`. It
measures how deeply the text nests by scanning its brackets, without recursion, *before*
``json.loads`` builds anything; a recursive walk further on (the redaction, a fingerprint,
the database driver's encoder) then never meets more than :data:`MAX_DEPTH` levels, so a
1 KiB request of 600 brackets is a clear refusal instead of a ``RecursionError`` and
thousands of lines of traceback. It also refuses ``NaN``, ``Infinity`` and numbers too
large for a float, which are not JSON and which PostgreSQL's ``jsonb`` cannot hold.

Values that are stored and later handed to an agent (a task's input, a committed result)
must also fit within :data:`KEPT_DEPTH`, the depth :mod:`console.records.redaction` keeps whole: a
deeper value would be cut there, and the agent would get something other than what was
typed. :func:`unstorable` finds text the database cannot hold (a NUL character, a lone
surrogate), so that it is refused at the door rather than failing inside a transaction.

Everything here is iterative and runs in time linear in the input.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any

from console.records.redaction import MAX_DEPTH as REDACTION_DEPTH
from console.records.redaction import redact_text

MAX_DEPTH = 32
"""How deeply any JSON the console takes may nest (``{}`` is 1, ``{"a": []}`` is 2).

Generous for real inputs and replies, which nest a handful of levels; small enough that
every recursive walk over a value stays far from Python's recursion limit."""

KEPT_DEPTH = REDACTION_DEPTH
"""How deeply a stored value handed to an agent may nest: the depth the redaction keeps
whole (:data:`console.records.redaction.MAX_DEPTH`; it cuts what lies deeper). At most
:data:`MAX_DEPTH`."""

MAX_NUMBER_CHARS = 1000
"""The most digits a JSON integer may have."""

MAX_KEY_CHARS = 200
"""The longest operation key there can be (``Operation.key``'s column)."""

# The bounds of what a request may carry, one per field and the same at every door (the
# console's forms, the JSON API, the step protocol): docs/protocol.md and docs/api.md say
# them. A value beyond its bound is refused, never cut: a cut key names another business
# action, a cut argument is another call, a cut result is not what the tool returned.
MAX_AGENT_CHARS = 100
"""The longest agent name (``Task.agent``'s column)."""

MAX_NAME_CHARS = 200
"""The longest client, tool name or error type (``Task.client``'s and the tool columns)."""

MAX_REQUEST_ID_CHARS = 100
"""The longest request id of the step protocol (``StepRequest.request_id``'s column)."""

MAX_LEASE_CHARS = 200
"""The longest lease of the step protocol (``Task.lease_owner``'s column)."""

MAX_INPUT_BYTES = 64 * 1024
"""The largest task input, as JSON encoded in UTF-8."""

MAX_ARGS_BYTES = 64 * 1024
"""The largest arguments of one tool call, as JSON encoded in UTF-8: what a model proposes
for one call is a few hundred bytes; every step's checkpoint carries its calls' arguments."""

MAX_RESULT_BYTES = 256 * 1024
"""The largest result of one tool call (its ``data`` with it), as JSON encoded in UTF-8:
stored with the operation and handed to the agent again, so bounded well within a body."""

MAX_ANSWER_BYTES = 256 * 1024
"""The largest final answer of a finish, as JSON encoded in UTF-8."""

# A JSON string (escapes included), or one bracket outside strings. The string branch is
# written as an unrolled loop so that a long string is one linear match.
_TOKENS = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]', re.DOTALL)
# NUL, or a UTF-16 surrogate standing alone (a pair is one code point in a Python str).
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
_SURROGATE = re.compile("[\ud800-\udfff]")


class InputRefused(ValueError):
    """Input the console will not take; the message says what to change.

    ``problem`` reads after the name of what was given ("not valid JSON: …"), so a form
    shows it beside its field; ``str()`` is the whole sentence ("the body is not valid …").
    """

    def __init__(self, problem: str, *, what: str = "") -> None:
        super().__init__(f"{what} is {problem}" if what else problem)
        self.problem = problem
        self.what = what


def text_depth(text: str, *, limit: int | None = None) -> int:
    """How deeply the JSON ``text`` nests, counting brackets outside strings.

    Stops as soon as it passes ``limit``: the answer is then ``limit + 1``. For text that
    is not JSON the count is a guess, and ``json.loads`` says what is wrong with it.
    """
    level = deepest = 0
    for match in _TOKENS.finditer(text):
        found = match.group()
        if found in ("[", "{"):
            level += 1
            if level > deepest:
                deepest = level
                if limit is not None and deepest > limit:
                    return deepest
        elif found in ("]", "}"):
            level -= 1
    return deepest


def depth(value: Any, *, limit: int | None = None) -> int:
    """How deeply an already parsed value nests (a scalar is 0, ``{}`` and ``[]`` are 1).

    Iterative, so a value built elsewhere however deep is measured without recursion;
    stops as soon as it passes ``limit`` (the answer is then ``limit + 1``).
    """
    deepest = 0
    todo: list[tuple[Any, int]] = [(value, 0)]
    while todo:
        item, level = todo.pop()
        if isinstance(item, Mapping):
            children: Any = item.values()
        elif isinstance(item, list | tuple):
            children = item
        else:
            continue
        level += 1
        if level > deepest:
            deepest = level
            if limit is not None and deepest > limit:
                return deepest
        todo.extend((child, level) for child in children)
    return deepest


def load_json(raw: str | bytes, *, what: str = "", max_depth: int = MAX_DEPTH) -> Any:
    """Parse ``raw`` as JSON, refusing it with :class:`InputRefused` if it is not JSON,
    nests deeper than ``max_depth``, or holds ``NaN``, ``Infinity`` or a number beyond a
    float's range. ``what`` names it in the message ("the body", "the input")."""
    if isinstance(raw, bytes | bytearray):
        try:
            text = bytes(raw).decode("utf-8")
        except UnicodeDecodeError as exc:
            problem = f"not valid JSON: not UTF-8 text ({exc.reason})"
            raise InputRefused(problem, what=what) from None
    else:
        text = raw
    # Before json.loads: it recurses once per level, and so does everything after it.
    if text_depth(text, limit=max_depth) > max_depth:
        raise InputRefused(too_deep(max_depth), what=what)
    try:
        return json.loads(
            text, parse_constant=_refuse_constant, parse_float=_finite_float, parse_int=_int
        )
    except json.JSONDecodeError as exc:
        problem = f"not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})"
        raise InputRefused(problem, what=what) from None
    except ValueError as exc:  # a constant or number refused below, an integer too long
        raise InputRefused(f"not valid JSON: {exc}", what=what) from None


def too_deep(max_depth: int) -> str:
    """The problem of a value nesting deeper than ``max_depth``, for :class:`InputRefused`."""
    return f"nested more than {max_depth} levels deep (at most {max_depth} are taken)"


def check_kept(value: Any, *, what: str) -> None:
    """Refuse ``value`` if it nests deeper than :data:`KEPT_DEPTH`, which the redaction
    would cut before it is stored and handed to an agent."""
    if _deeper_than(value, KEPT_DEPTH):
        problem = (
            f"nested more than {KEPT_DEPTH} levels deep: deeper levels would be cut before "
            "it is stored and handed to the agent, so at most "
            f"{KEPT_DEPTH} are taken"
        )
        raise InputRefused(problem, what=what)


def check_bounded(value: Any, *, what: str, most_bytes: int) -> None:
    """Refuse ``value`` (:class:`InputRefused`) if it nests deeper than :data:`KEPT_DEPTH`
    or is larger than ``most_bytes`` as JSON: for a value that is stored and handed back as
    it was sent (a call's arguments, a result, an answer), where a cut would change it."""
    check_kept(value, what=what)
    size = json_size(value)
    if size > most_bytes:
        problem = (
            f"larger than {most_bytes // 1024} KiB as JSON ({size:,} bytes): at most "
            f"{most_bytes:,} bytes are taken"
        )
        raise InputRefused(problem, what=what)


def json_size(value: Any) -> int:
    """How many bytes ``value`` takes as compact JSON in UTF-8: the measure of every size
    bound here. Call it on a value that nests within :data:`MAX_DEPTH` (the encoder
    recurses); text that cannot be stored is counted as it stands (another check refuses
    it)."""
    try:
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InputRefused(f"not JSON ({exc})") from None
    return len(text.encode("utf-8", "surrogatepass"))


def _deeper_than(value: Any, limit: int) -> bool:
    """Whether an item of ``value`` lies below more than ``limit`` levels: the rule the
    redaction cuts by (and :func:`unstorable`'s ``max_depth``), so an empty ``{}`` at the last
    level it keeps is kept. Iterative."""
    todo: list[tuple[Any, int]] = [(value, 0)]
    while todo:
        item, level = todo.pop()
        if level > limit:
            return True
        if isinstance(item, Mapping):
            todo.extend((child, level + 1) for child in item.values())
        elif isinstance(item, list | tuple):
            todo.extend((child, level + 1) for child in item)
    return False


MAX_TEXT_CHARS = 4000
"""The longest free text taken: what a person types (a reason, evidence, an override) and
what a client reports in words (an error's message, a stop's detail, a lookup's or a failed
inspector's evidence)."""


def typed_text(text: str, *, what: str) -> str:
    """Text a person typed, as it is stored: trimmed; refused (:class:`InputRefused`) if it
    holds what cannot be stored (a NUL, a lone surrogate) or is longer than
    :data:`MAX_TEXT_CHARS` (the console's forms refuse it too: one rule at every door);
    secrets masked."""
    if not text:
        return ""
    problem = text_problem(text)
    if problem is not None:
        raise InputRefused(f"{what} cannot be stored: it {problem}")
    text = text.strip()
    if len(text) > MAX_TEXT_CHARS:
        raise InputRefused(
            f"{what} is {len(text):,} characters long: at most {MAX_TEXT_CHARS:,} are taken"
        )
    # A mask may be longer than the secret it hides: the stored text stays within the bound.
    return redact_text(text)[:MAX_TEXT_CHARS].strip()


def text_problem(text: str) -> str | None:
    """What makes ``text`` impossible to store, or None: PostgreSQL's text and ``jsonb``
    hold no NUL character, and UTF-8 has no lone surrogate."""
    found = _UNSTORABLE.search(text)
    if found is None:
        return None
    if found.group() == "\x00":
        return "holds a NUL character (\\u0000), which cannot be stored"
    return f"holds a lone surrogate (\\u{ord(found.group()):04x}), which is not text"


def unstorable(
    value: Any, *, what: str = "", nul: bool = True, max_depth: int | None = None
) -> str | None:
    """The first thing in ``value`` that cannot be stored as it is, as a sentence naming
    where it is (``input.note holds a NUL character …``), or None: a string or key the
    database cannot hold (:func:`text_problem`), a key that is not text, a float that is not
    finite, a value that is not JSON, or — with ``max_depth`` — an item below more than
    ``max_depth`` levels (the redaction cuts there, ``KEPT_DEPTH``). ``nul=False`` lets NUL
    characters pass, for what the redaction will store with a stand-in for them. Iterative,
    like :func:`depth`, so a value of any depth gets an answer."""
    check = text_problem if nul else _surrogate_problem
    todo: list[tuple[Any, str, int]] = [(value, what, 0)]
    while todo:
        item, where, level = todo.pop()
        if max_depth is not None and level > max_depth:
            return f"{what or 'it'} is nested deeper than {max_depth} levels"
        if isinstance(item, str):
            problem = check(item)
            if problem is not None:
                return f"{where} {problem}".lstrip()
        elif item is None or isinstance(item, bool | int):
            continue
        elif isinstance(item, float):
            if not math.isfinite(item):
                return f"{where or 'it'} is {item!r}, which is not a JSON number"
        elif isinstance(item, Mapping):
            for key, child in item.items():
                if not isinstance(key, str):
                    return f"the key {key!r} in {where or 'it'} is not text"
                problem = check(key)
                if problem is not None:
                    return f"a key in {where} {problem}" if where else f"a key {problem}"
                todo.append((child, _member(where, key), level + 1))
        elif isinstance(item, list | tuple):
            todo.extend((child, f"{where}[{i}]", level + 1) for i, child in enumerate(item))
        else:
            return f"{where or 'it'} is a {type(item).__name__}, which is not JSON"
    return None


def _surrogate_problem(text: str) -> str | None:
    found = _SURROGATE.search(text)
    if found is None:
        return None
    return f"holds a lone surrogate (\\u{ord(found.group()):04x}), which is not text"


def key_problem(key: str) -> str | None:
    """Why ``key`` cannot be an operation key, or None: text that cannot be stored, or
    longer than any key can be. (A well-formed key that names nothing is another thing:
    not found.)"""
    problem = text_problem(key)
    if problem is not None:
        return f"the operation key {problem}"
    if len(key) > MAX_KEY_CHARS:
        return f"the operation key is longer than {MAX_KEY_CHARS} characters"
    return None


def _member(where: str, name: str) -> str:
    shown = name if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_-]{0,40}", name) else json.dumps(name)[:44]
    path = f"{where}.{shown}" if where else shown
    return path if len(path) <= 120 else "…" + path[-119:]


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number (use null or a string)")


def _int(text: str) -> int:
    # Python refuses longer digit strings itself, in words meant for programmers.
    if len(text) > MAX_NUMBER_CHARS:
        raise ValueError(f"a number of {len(text)} digits is longer than {MAX_NUMBER_CHARS}")
    return int(text)


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text[:40]} is beyond the range of a number the console keeps")
    return value


__all__ = [
    "KEPT_DEPTH",
    "MAX_AGENT_CHARS",
    "MAX_ANSWER_BYTES",
    "MAX_ARGS_BYTES",
    "MAX_DEPTH",
    "MAX_INPUT_BYTES",
    "MAX_KEY_CHARS",
    "MAX_LEASE_CHARS",
    "MAX_NAME_CHARS",
    "MAX_REQUEST_ID_CHARS",
    "MAX_RESULT_BYTES",
    "MAX_TEXT_CHARS",
    "InputRefused",
    "check_bounded",
    "check_kept",
    "depth",
    "json_size",
    "key_problem",
    "load_json",
    "text_depth",
    "text_problem",
    "typed_text",
    "unstorable",
]
