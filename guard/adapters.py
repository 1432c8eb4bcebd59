"""Adapters between the tool calls of model APIs and the guard's values.

A model's reply is read into a :class:`Turn`: the guard's :class:`~guard.Call` for each tool
call, with the model's id beside it so that each call can be answered, or a
:class:`~guard.Finish`. Reading never raises: whatever is wrong with the model's output is
described in :attr:`Turn.problem`, and :attr:`Turn.proposal` is then something the guard
refuses for the right reason (``bad_call``, ``bad_args`` or ``missing_operation_key``).

The application, not the model, says what each tool does (:class:`ToolSpec`): its effect,
and for a write how the business action is named from the arguments. The model's call id is
only ever used to answer the call.

Supported: OpenAI Chat Completions (:func:`calls_from_openai`, :func:`openai_tool_messages`)
and Anthropic Messages (:func:`calls_from_anthropic`, :func:`anthropic_tool_results`), both
as the plain dicts of their JSON wire format.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, cast

from ._fingerprint import canonical_json
from ._values import Call, Effect, Finish, Kind, Nudge, Result, _json_ready

__all__ = [
    "MalformedModelOutput",
    "OperationKey",
    "Outcome",
    "ToolSpec",
    "Turn",
    "anthropic_tool_results",
    "calls_from_anthropic",
    "calls_from_openai",
    "openai_tool_messages",
    "tool_effects",
]

OperationKey = Callable[[Mapping[str, Any]], str | None]
"""Names the business action of a write from its arguments (``None``: cannot tell)."""

Outcome = Result | BaseException | None
"""What became of one call: its result, the exception its tool raised, or ``None`` (not run)."""

_NOT_RUN = "not run: the task stopped"

_TEXT_LIMIT = 100  # model-given names quoted in problems and stop reports stay this short


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """What the application knows about one tool the model may call.

    ``effect`` is ``"read"`` or ``"write"``. A write needs ``operation_key``: a function of
    the call's arguments that returns the stable key of the business action (for example
    ``lambda args: f"incident-{args['incident']}-first-notice"``), or ``None`` when the
    arguments do not name one. It is never the model's call id.
    """

    effect: Effect
    operation_key: OperationKey | None = None

    def __post_init__(self) -> None:
        if self.effect not in ("read", "write"):
            raise ValueError(f"effect must be 'read' or 'write', got {self.effect!r}")
        if self.operation_key is not None and not callable(self.operation_key):
            raise TypeError("operation_key must be a function of the arguments")
        if self.effect == "write" and self.operation_key is None:
            raise ValueError("a write tool needs an operation_key function")
        if self.effect == "read" and self.operation_key is not None:
            raise ValueError("only a write tool has an operation key")


@dataclass(frozen=True, slots=True)
class MalformedModelOutput:
    """What :attr:`Turn.proposal` holds when the model's output has no call to show the guard.

    It is not a :class:`~guard.Call`, so the guard stops ``FAILED/bad_call`` with the detail
    ``MalformedModelOutput is not a Call``; ``problem`` says what was wrong.
    """

    problem: str


@dataclass(frozen=True, slots=True)
class Turn:
    """One reply of the model, read for the guard.

    ``calls`` are the tool calls in the model's order and ``call_ids`` the model's id of
    each, used to answer it. ``finish`` is set when the reply has no tool calls. ``problem``
    says what is malformed; such a turn must not run, and its :attr:`proposal` is refused
    by the guard. On such a turn ``calls`` may keep a field as the model gave it (arguments
    that are not an object, a tool without an effect), and is empty when the reply could not
    be read as calls at all; ``call_ids`` still lists every id found, so each can be answered.
    """

    calls: tuple[Call, ...] = ()
    call_ids: tuple[str, ...] = ()
    finish: Finish | None = None
    problem: str | None = None

    @property
    def proposal(self) -> Finish | list[Call] | list[MalformedModelOutput]:
        """What the planner returns to the guard for this turn.

        The calls as a list (parallel calls keep their order), the finish, or — for a reply
        that could not be read as calls — a :class:`MalformedModelOutput`. A turn with a
        problem is always refused: ``bad_call`` for a malformed reply, an unknown tool or
        arguments that are not an object; ``bad_args`` for arguments JSON cannot represent;
        ``missing_operation_key`` for a write whose key cannot be derived.
        """
        if self.problem is not None and not self.calls:
            return [MalformedModelOutput(self.problem)]
        if self.finish is not None and not self.calls:
            return self.finish
        return list(self.calls)


def tool_effects(tools: Mapping[str, ToolSpec]) -> dict[str, Effect]:
    """The tools' effects by name, for ``Guard(tools=...)``: the guard checks them too."""
    return {name: spec.effect for name, spec in tools.items()}


# -- reading replies ----------------------------------------------------------------------


def calls_from_openai(message: Any, tools: Mapping[str, ToolSpec]) -> Turn:
    """Read an OpenAI Chat Completions assistant message (a dict) into a :class:`Turn`.

    ``message["tool_calls"]`` holds ``{"id", "type": "function", "function": {"name",
    "arguments"}}`` entries whose arguments are JSON text; without tool calls the turn
    finishes with the message's ``content``. Never raises on malformed output.
    """
    try:
        return _read_openai(message, tools)
    except Exception as exc:  # a mapping of someone else's making may raise on any read
        return _unreadable(exc)


def calls_from_anthropic(content: Any, tools: Mapping[str, ToolSpec]) -> Turn:
    """Read the ``content`` of an Anthropic Messages reply (a list of blocks) into a :class:`Turn`.

    ``{"type": "tool_use", "id", "name", "input"}`` blocks are the calls; without any, the
    turn finishes with the text of the ``text`` blocks. Other blocks (thinking, tools the
    server runs itself) are not the application's to run and are skipped. Never raises on
    malformed output.
    """
    try:
        return _read_anthropic(content, tools)
    except Exception as exc:  # a mapping of someone else's making may raise on any read
        return _unreadable(exc)


class _Reading:
    """The calls of one reply as they are read, and the first problem of each kind."""

    def __init__(self, tools: Mapping[str, ToolSpec]) -> None:
        self.tools = tools
        self.calls: list[Call] = []
        self.ids: list[str] = []
        self.unreadable: str | None = None  # the reply as a whole cannot be read as calls
        self.malformed: str | None = None  # a call the guard refuses as bad_call
        self.refused: str | None = None  # a call the guard refuses as bad_args or missing key

    def fail(self, problem: str) -> None:
        if self.unreadable is None:
            self.unreadable = problem

    def add_id(self, number: int, call_id: Any) -> None:
        if not isinstance(call_id, str) or not call_id:
            self.fail(f"tool call {number} has no id")
        elif call_id in self.ids:
            self.fail(f"two tool calls share the id {_short(call_id)!r}")
        else:
            self.ids.append(call_id)

    def add_call(self, number: int, name: Any, args: Any, args_problem: str | None) -> None:
        """Add the guard's view of one call; a malformed field keeps what the model gave."""
        if not isinstance(name, str) or not name:
            problem = f"tool call {number} has no tool name"
            if name is not None and not isinstance(name, str):
                problem = f"tool call {number} names its tool with {_kind(name)}, not text"
            # The guard quotes the name in its detail: keep whatever is not text out of it.
            tool: Any = "" if isinstance(name, str) else None
            self._add(Call(tool, args), problem, malformed=True)
            return
        spec = self.tools.get(name)
        if args_problem is not None:
            effect: Any = None if spec is None else spec.effect
            self._add(Call(name, args, effect=effect), args_problem, malformed=True)
            return
        if spec is None:
            # The application does not know this tool, so nothing says what it does: the
            # guard refuses a call whose effect is neither read nor write.
            call = Call(_short(name), args, effect=cast(Effect, None))
            self._add(call, f"there is no tool named {_short(name)!r}", malformed=True)
            return
        try:
            canonical_json(args)
        except Exception as exc:  # the guard refuses these arguments as bad_args
            self._add(Call(name, args, spec.effect), f"arguments of {name}: {exc}")
            return
        if spec.effect == "read":
            self._add(Call(name, args), None)
            return
        key, key_problem = _operation_key(spec, name, args)
        self._add(Call(name, args, effect="write", operation_key=key), key_problem)

    def add_malformed(self, call: Call, problem: str) -> None:
        """Add a call the guard refuses as ``bad_call``, and what is wrong with it."""
        self._add(call, problem, malformed=True)

    def _add(self, call: Call, problem: str | None, *, malformed: bool = False) -> None:
        self.calls.append(call)
        if problem is None:
            return
        if malformed and self.malformed is None:
            self.malformed = problem
        elif not malformed and self.refused is None:
            self.refused = problem

    def turn(self, finish: Finish | None) -> Turn:
        ids = tuple(self.ids)
        if self.unreadable is not None:
            return Turn(call_ids=ids, problem=self.unreadable)
        # The guard checks the shape of every call before anything else, so a malformed
        # call is what it reports even when an earlier call has bad arguments.
        problem = self.malformed or self.refused
        if self.calls:
            return Turn(calls=tuple(self.calls), call_ids=ids, problem=problem)
        return Turn(finish=finish)


def _read_openai(message: Any, tools: Mapping[str, ToolSpec]) -> Turn:
    reading = _Reading(tools)
    if not isinstance(message, Mapping):
        reading.fail(f"the message is {_kind(message)}, not an object")
        return reading.turn(None)
    entries = message.get("tool_calls")
    if entries is None or (isinstance(entries, list) and not entries):
        if message.get("function_call") is not None:
            reading.fail("function_call (the deprecated single-function form) is not supported")
            return reading.turn(None)
        return reading.turn(Finish(message.get("content")))
    if not isinstance(entries, list | tuple):
        reading.fail(f"tool_calls is {_kind(entries)}, not a list")
        return reading.turn(None)
    for number, entry in enumerate(entries, start=1):
        if not isinstance(entry, Mapping):
            reading.fail(f"tool call {number} is {_kind(entry)}, not an object")
            continue
        reading.add_id(number, entry.get("id"))
        kind = entry.get("type")
        if kind not in (None, "function"):
            reading.fail(f"tool call {number} is of type {_quote(kind)}, not 'function'")
            continue
        function = entry.get("function")
        if not isinstance(function, Mapping):
            nothing: Any = None
            reading.add_malformed(Call(nothing, nothing), f"tool call {number} has no function")
            continue
        name = function.get("name")
        args, problem = _parse_arguments(_label(number, name), function.get("arguments"))
        reading.add_call(number, name, args, problem)
    return reading.turn(None)


def _read_anthropic(content: Any, tools: Mapping[str, ToolSpec]) -> Turn:
    reading = _Reading(tools)
    if isinstance(content, str):  # the short form of a reply that is only text
        return reading.turn(Finish(content))
    if not isinstance(content, list | tuple):
        reading.fail(f"the content is {_kind(content)}, not a list of blocks")
        return reading.turn(None)
    texts: list[str] = []
    number = 0
    for index, block in enumerate(content, start=1):
        if not isinstance(block, Mapping):
            reading.fail(f"content block {index} is {_kind(block)}, not an object")
            continue
        kind = block.get("type")
        if kind == "text":
            text = block.get("text")
            if isinstance(text, str):
                texts.append(text)
            continue
        if kind != "tool_use":
            continue
        number += 1
        reading.add_id(number, block.get("id"))
        name = block.get("name")
        args: Any = block.get("input")
        problem = None
        if isinstance(args, Mapping):
            args = dict(args)
        else:
            problem = f"input of {_label(number, name)} is {_kind(args)}, not an object"
        reading.add_call(number, name, args, problem)
    return reading.turn(Finish("".join(texts) if texts else None))


def _parse_arguments(label: str, arguments: Any) -> tuple[Any, str | None]:
    """The arguments as an object, or what the model gave and what is wrong with it."""
    if isinstance(arguments, Mapping):  # already decoded by whoever built the message
        return dict(arguments), None
    if not isinstance(arguments, str):
        return arguments, f"arguments of {label} are {_kind(arguments)}, not JSON text"
    try:
        value = json.loads(arguments)
    except (ValueError, RecursionError) as exc:
        return arguments, f"arguments of {label} are not valid JSON: {_short(str(exc))}"
    if not isinstance(value, dict):
        return value, f"arguments of {label} are {_kind(value)}, not an object"
    return value, None


def _operation_key(
    spec: ToolSpec, name: str, args: Mapping[str, Any]
) -> tuple[str | None, str | None]:
    """The write's key from the application's function, or why there is none."""
    derive = spec.operation_key
    if derive is None:  # pragma: no cover - ToolSpec refuses a write without one
        return None, f"{name} has no operation key function"
    try:
        key = derive(MappingProxyType(args))  # read only: these are the call's own arguments
    except Exception as exc:
        return None, f"the operation key of {name} could not be derived: {_describe(exc)}"
    if not isinstance(key, str) or not key:
        return None, f"the operation key of {name} came out as {_short(repr(key))}, not text"
    return key, None


def _unreadable(exc: Exception) -> Turn:
    return Turn(problem=f"the reply could not be read: {_describe(exc)}")


# -- answering calls ----------------------------------------------------------------------


def openai_tool_messages(
    turn: Turn, results: Result | Nudge | Sequence[Outcome] | None
) -> list[dict[str, Any]]:
    """The ``{"role": "tool", "tool_call_id", "content"}`` messages answering every call.

    ``results`` is what the guard observed after the turn: a :class:`~guard.Result` per call
    in order (a list; a single one for a one-call turn), or a :class:`~guard.Nudge`, which
    answers every call. A call without a result (a shorter list, ``None``) did not run and is
    answered ``"not run: the task stopped"``; an exception its tool raised is answered as an
    error. Data is JSON text: a ``SUCCESS`` result's data as it is, any other kind as
    ``{"kind": ..., "data": ...}``, which is how a failure is marked for this API.
    """
    return [
        {"role": "tool", "tool_call_id": call_id, "content": content}
        for call_id, content, _ in _answers(turn, results)
    ]


def anthropic_tool_results(
    turn: Turn, results: Result | Nudge | Sequence[Outcome] | None
) -> list[dict[str, Any]]:
    """The ``tool_result`` blocks answering every call, for the next user message's content.

    Answers as :func:`openai_tool_messages` does; ``is_error`` is true for a failed kind
    (``RETRYABLE``, ``PRECONDITION``, ``FATAL``), an exception, a nudge and a call not run.
    """
    return [
        {"type": "tool_result", "tool_use_id": call_id, "content": content, "is_error": error}
        for call_id, content, error in _answers(turn, results)
    ]


def _answers(turn: Turn, results: Any) -> list[tuple[str, str, bool]]:
    """(call id, content, is error) for every call of the turn, in order.

    ``results`` is typed by the public functions; checked here all the same, since a wrong
    one would answer calls with the wrong outcomes.
    """
    if isinstance(results, Nudge):
        return [(call_id, results.message, True) for call_id in turn.call_ids]
    outcomes: list[Any]
    if results is None:
        outcomes = []
    elif isinstance(results, Result):
        outcomes = [results]
    elif isinstance(results, Sequence) and not isinstance(results, str | bytes):
        outcomes = list(results)
    else:
        raise TypeError(f"results must be a Result, a list of them or a Nudge, not {results!r}")
    if len(outcomes) > len(turn.call_ids):
        raise ValueError(f"{len(outcomes)} results for {len(turn.call_ids)} calls")
    answers: list[tuple[str, str, bool]] = []
    for index, call_id in enumerate(turn.call_ids):
        outcome = outcomes[index] if index < len(outcomes) else None
        write = index < len(turn.calls) and turn.calls[index].effect == "write"
        answers.append((call_id, *_answer(outcome, write)))
    return answers


def _answer(outcome: Any, write: bool) -> tuple[str, bool]:
    if outcome is None:
        return _NOT_RUN, True
    if isinstance(outcome, BaseException):
        text = f"error: {_describe(outcome)}"
        if write:
            text += "; whether it took effect is unknown, so it will not be run again"
        return text, True
    if not isinstance(outcome, Result):
        raise TypeError(f"a result must be a Result, an exception or None, not {outcome!r}")
    kind = str(outcome.kind)
    if kind == Kind.SUCCESS:
        return _json_text(outcome.data), False
    return _json_text({"kind": kind, "data": outcome.data}), kind != Kind.PENDING


def _json_text(value: Any) -> str:
    try:
        return json.dumps(_json_ready(value), ensure_ascii=False, allow_nan=False)
    except Exception:  # data whose repr fails, and the like: the call is still answered
        return json.dumps(f"<{type(value).__name__} that cannot be shown>")


# -- small helpers ------------------------------------------------------------------------

_JSON_KINDS: Mapping[type, str] = {
    dict: "an object",
    list: "a list",
    str: "text",
    int: "a number",
    float: "a number",
    bool: "a boolean",
    type(None): "null",
}


def _kind(value: Any) -> str:
    """What a value is, in JSON's words where it has them."""
    kind = type(value)
    return _JSON_KINDS.get(kind) or f"a {kind.__name__}"


def _quote(value: Any) -> str:
    return _short(repr(value)) if isinstance(value, str) else _kind(value)


def _label(number: int, name: Any) -> str:
    return _short(name) if isinstance(name, str) and name else f"tool call {number}"


def _short(text: str) -> str:
    return text if len(text) <= _TEXT_LIMIT else text[: _TEXT_LIMIT - 1] + "…"


def _describe(exc: BaseException) -> str:
    name = type(exc).__name__
    try:
        text = str(exc)
    except Exception:  # an exception that cannot describe itself
        text = ""
    return f"{name}: {_short(text)}" if text else name
