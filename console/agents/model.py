"""Hosted agents whose planner is a real model behind an OpenAI-compatible Chat Completions API.

:class:`ChatAgent` keeps the conversation in ``memory``, sends it with the tools' JSON
schemas to ``{LOOPGUARD_MODEL_URL}/chat/completions``, charges the reply's tokens and reads
its tool calls with :func:`guard.adapters.calls_from_openai`; the next model call first
answers every call of the last reply (:func:`guard.adapters.openai_tool_messages`). The
application, not the model, says what each tool does and how a write's operation key is
named (:class:`guard.adapters.ToolSpec`).

The demo's ``SupportDeskModel`` (``console.demo.support_desk``) is the support desk agent
with such a planner: the same tools and the same inspector, which reads the desk's records,
never the model's word.

Any server speaking that API works (OpenAI, Azure OpenAI's compatible endpoint, vLLM,
Ollama, LiteLLM). The official ``openai`` package talks to it, from the ``model`` extra
(``pip install 'loopguard-console[model]'``); without it a model agent refuses to start, saying so.
"""

from __future__ import annotations

import functools
import json
import socket
import ssl
import time
import urllib.parse
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, cast

from django.conf import settings

from console.agents.base import Agent
from console.records.inputs import MAX_DEPTH, InputRefused, load_json, text_depth, unstorable
from guard import Call, Finish, Result
from guard.adapters import ToolSpec, calls_from_openai, openai_tool_messages

MAX_REPLY_BYTES = 2 * 1024 * 1024  # a chat completion is a few KiB; anything this big is wrong
_RETRY_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504})
NEEDS_OPENAI = (
    "a model agent needs the openai package, which is not installed: "
    "pip install 'loopguard-console[model]'"
)
# openai refuses to build a client without a key (or reads OPENAI_API_KEY, meant for another
# server); with none configured, _ask() omits the Authorization header, so this is never sent.
_NO_KEY = "no-key"


class ModelUnavailable(RuntimeError):
    """The model could not be asked, or did not answer usably: the planner fails."""


def _require_openai() -> None:
    """Raise :class:`ModelUnavailable` naming the extra if ``openai`` cannot be imported."""
    try:
        import openai  # noqa: F401
    except ImportError:
        raise ModelUnavailable(NEEDS_OPENAI) from None


@functools.cache
def _tls() -> ssl.SSLContext:
    """The TLS context (CA bundle loaded) that every model call's new client shares: loading
    it takes ~25 ms of CPU, more than building the rest of a client."""
    import httpx2

    return httpx2.create_ssl_context()


@dataclass(frozen=True)
class ModelEndpoint:
    """Where the model is and how to ask it. ``api_key`` is sent, never stored or shown."""

    url: str
    model: str
    api_key: str = field(default="", repr=False)
    timeout_s: float = 60.0
    retries: int = 2

    @classmethod
    def from_settings(cls) -> ModelEndpoint:
        """The endpoint ``LOOPGUARD_MODEL_*`` configure; raises ``ModelUnavailable`` if it is
        not configured, or not usable (not http(s), a user or password in the URL, no
        ``openai`` package)."""
        url, model = settings.LOOPGUARD_MODEL_URL, settings.LOOPGUARD_MODEL_NAME
        if not url or not model:
            raise ModelUnavailable(
                "no model is configured: set LOOPGUARD_MODEL_URL (an OpenAI-compatible API, "
                "e.g. https://api.openai.com/v1) and LOOPGUARD_MODEL_NAME"
            )
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ModelUnavailable("LOOPGUARD_MODEL_URL must be an http(s) URL with a host")
        if parts.username is not None or parts.password is not None:
            # Never repeated in the message: it would be stored with the task.
            raise ModelUnavailable(
                "LOOPGUARD_MODEL_URL must not hold a user or password; "
                "put the credential in LOOPGUARD_MODEL_API_KEY"
            )
        _require_openai()
        return cls(
            url=url,
            model=model,
            api_key=settings.LOOPGUARD_MODEL_API_KEY,
            timeout_s=settings.LOOPGUARD_MODEL_TIMEOUT_SECONDS,
            retries=settings.LOOPGUARD_MODEL_RETRIES,
        )

    def complete(
        self, messages: Sequence[Any], tools: Sequence[Any], *, max_tokens: int | None = None
    ) -> dict[str, Any]:
        """One chat completion, or :class:`ModelUnavailable` saying why there is none.

        Asks again (``retries`` times, 0.5 s, 1 s, 2 s… apart) only when the model cannot
        have answered: the server refused the connection, or said it was busy or failing
        (HTTP 408, 409, 429, 5xx). A request that timed out or broke off may have been
        answered, and billed, without the reply arriving: it is not sent again. So the
        client's own retries are off (it would resend after a timeout), and so are redirects
        (following one would send the API key to wherever it points).
        """
        import httpx2
        import openai

        address = self.url.rstrip("/") + "/chat/completions"
        problem = ""
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(min(8.0, 0.5 * 2 ** (attempt - 1)))
            try:
                raw = self._ask(messages, tools, max_tokens)
            except openai.APIStatusError as exc:
                said = self.redact(_excerpt(exc.response.content[:2000]))
                problem = f"the model answered HTTP {exc.status_code}: {said}"
                if exc.status_code in _RETRY_STATUS:
                    continue
                raise ModelUnavailable(problem) from None
            except openai.APIConnectionError as exc:
                cause = exc.__cause__ or exc
                if isinstance(cause, httpx2.ConnectError | httpx2.ConnectTimeout):
                    problem = f"the model could not be reached at {address}: {_root(cause)}"
                    if _refused(cause):
                        continue  # nothing was sent
                    raise ModelUnavailable(problem) from None
                raise ModelUnavailable(_broke_off(address, cause)) from None
            except httpx2.RequestError as exc:  # reading the reply's body
                raise ModelUnavailable(_broke_off(address, exc)) from None
            except openai.OpenAIError as exc:
                said = self.redact(str(exc))
                raise ModelUnavailable(f"the model could not be asked: {said}") from None
            if len(raw) > MAX_REPLY_BYTES:
                raise ModelUnavailable(f"the model's reply is larger than {MAX_REPLY_BYTES} bytes")
            try:
                # Bounded before it is parsed: a reply is walked again and again (the
                # arguments' fingerprint, the redaction, the checkpoint's encoder).
                reply = load_json(raw, what="the model's reply")
            except InputRefused as exc:
                said = self.redact(_excerpt(raw))
                raise ModelUnavailable(f"{exc}: {said}") from None
            if not isinstance(reply, dict):
                said = self.redact(_excerpt(raw))
                raise ModelUnavailable(f"the model's reply is not an object: {said}")
            _check_reply(reply)
            return reply
        raise ModelUnavailable(f"{problem} (after {self.retries + 1} attempts)")

    def _ask(self, messages: Sequence[Any], tools: Sequence[Any], max_tokens: int | None) -> bytes:
        """One request; the reply's body as sent (at most ``MAX_REPLY_BYTES`` + 1 bytes).

        The body is kept raw rather than parsed into the library's types: the conversation
        keeps the message as the API sent it, and the tokens are charged from its usage
        even when the rest of it cannot be used.
        """
        import openai

        # A new client, so a new connection, per call: a kept-alive one that the server is
        # closing just then breaks the request off, and such a request is never sent again.
        with (
            openai.OpenAI(
                base_url=self.url,
                api_key=self.api_key or _NO_KEY,
                timeout=self.timeout_s,
                max_retries=0,
                http_client=openai.DefaultHttpxClient(follow_redirects=False, verify=_tls()),
            ) as client,
            client.chat.completions.with_streaming_response.create(
                model=self.model,
                messages=list(messages),
                tools=list(tools) if tools else openai.omit,
                max_tokens=openai.omit if max_tokens is None else max_tokens,
                extra_headers={} if self.api_key else {"Authorization": openai.omit},
            ) as response,
        ):
            return _capped(response.iter_bytes())

    def redact(self, text: str) -> str:
        """``text`` without the API key (a server may quote the key it refused)."""
        return text.replace(self.api_key, "[redacted]") if self.api_key else text


def _capped(chunks: Iterable[bytes]) -> bytes:
    body = bytearray()
    for chunk in chunks:
        body += chunk
        if len(body) > MAX_REPLY_BYTES:
            break
    return bytes(body)


def _root(error: BaseException) -> BaseException:
    """The innermost cause: the operating system's own words ("Connection refused")."""
    while error.__cause__ is not None:
        error = error.__cause__
    return error


def _refused(error: BaseException) -> bool:
    """The connection was refused, or the host's name did not resolve: nothing was sent."""
    return isinstance(_root(error), ConnectionRefusedError | socket.gaierror)


def _broke_off(address: str, error: BaseException) -> str:
    reason = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
    return f"the request to {address} broke off without a reply ({reason})"


def _check_reply(reply: Mapping[str, Any]) -> None:
    """Refuse a reply the task could not keep: its conversation and trace are stored, and
    a lone surrogate cannot be (a NUL can: the redaction stores a stand-in). Its tool calls'
    arguments are JSON text inside the reply's JSON, unseen by the reply's own bound, and
    are parsed and walked next: they are bounded here too."""
    problem = unstorable(reply, what="the model's reply", nul=False)
    if problem is not None:
        raise ModelUnavailable(problem)
    try:
        calls = reply["choices"][0]["message"]["tool_calls"] or ()
    except (KeyError, IndexError, TypeError):
        return  # no tool calls, or a malformed reply that plan() refuses by itself
    for number, call in enumerate(calls if isinstance(calls, list) else (), start=1):
        function = call.get("function") if isinstance(call, Mapping) else None
        arguments = function.get("arguments") if isinstance(function, Mapping) else None
        if not isinstance(arguments, str):
            continue
        what = f"the arguments of the model's tool call {number}"
        try:
            parsed = load_json(arguments)
        except InputRefused as exc:
            if text_depth(arguments, limit=MAX_DEPTH) > MAX_DEPTH:
                raise ModelUnavailable(f"{what} are {exc.problem}") from None
            continue  # not JSON: the guard refuses the call as bad_args, saying why
        problem = unstorable(parsed, what=what, nul=False)
        if problem is not None:
            raise ModelUnavailable(problem)


def _excerpt(raw: bytes) -> str:
    text = raw.decode("utf-8", "replace").strip()
    return text[:300] + ("…" if len(text) > 300 else "")


class ChatAgent(Agent):
    """An agent whose planner is a model (see the module's docstring).

    A subclass gives ``tool_specs()`` (each tool's effect, and for a write how its
    operation key is named from the arguments), ``tool_parameters`` (the JSON schema of each
    tool's arguments, shown to the model with the tool's ``description``), ``instructions``
    and ``goal``; its ``tools()`` and ``inspect()`` are those of any agent.
    ``memory["messages"]`` holds the conversation, so a resumed task goes on with it.
    """

    tool_parameters: ClassVar[Mapping[str, Mapping[str, Any]]]

    @classmethod
    def model_name(cls) -> str:
        """The configured model, whose price the spend budget charges."""
        return str(settings.LOOPGUARD_MODEL_NAME)

    @property
    def max_output_tokens(self) -> int:  # type: ignore[override]
        """Each reply's cap, sent with the request: the output part of its reservation."""
        return int(settings.LOOPGUARD_MODEL_MAX_OUTPUT_TOKENS)

    def prompt_tokens(self, observation: Any) -> int:
        """An overestimate of the next request's input: a token per three characters of
        the conversation and the tool schemas, and of what answers the last calls."""
        sent = (self.memory.get("messages"), self._schemas(), _encoded(observation))
        return len(json.dumps(sent, default=str)) // 3 + 16

    def tool_specs(self) -> Mapping[str, ToolSpec]:
        """Each tool's effect and, for a write, how its operation key is named."""
        raise NotImplementedError

    def instructions(self) -> str:
        """The system message."""
        raise NotImplementedError

    def goal(self) -> str:
        """The first user message: what this task is to achieve."""
        raise NotImplementedError

    def endpoint(self) -> ModelEndpoint:
        """Where the model is (settings by default)."""
        return ModelEndpoint.from_settings()

    @classmethod
    def validate_input(cls, input: Mapping[str, Any]) -> None:
        """Refuse a task no model is configured for, before it is queued."""
        try:
            ModelEndpoint.from_settings()
        except ModelUnavailable as exc:
            raise ValueError(str(exc)) from None

    def plan(self, observation: Any) -> Call | list[Call] | Finish:
        """Answer the last reply's calls with ``observation``, ask the model, read its reply."""
        messages: list[Any] = self.memory.setdefault(
            "messages",
            [
                {"role": "system", "content": self.instructions()},
                {"role": "user", "content": self.goal()},
            ],
        )
        specs = self.tool_specs()
        asked = self.memory.get("asked")
        if asked is not None:  # the calls of the last reply, answered in the model's order
            messages.extend(openai_tool_messages(calls_from_openai(asked, specs), observation))
            self.memory["asked"] = None
        endpoint = self.endpoint()
        reply = endpoint.complete(messages, self._schemas(), max_tokens=self.max_output_tokens)
        self._charge(reply)
        try:
            message = reply["choices"][0]["message"]
        except (KeyError, IndexError, TypeError):
            message = None
        if not isinstance(message, dict):
            said = endpoint.redact(str(reply))[:300]
            raise ModelUnavailable(f"the model's reply has no message: {said}")
        turn = calls_from_openai(message, specs)  # what the model said, for the guard to judge
        kept = _as_sent(message)  # what the API takes back, for the conversation
        messages.append(kept)
        if kept.get("tool_calls"):
            self.memory["asked"] = kept
        proposal = turn.proposal
        if isinstance(proposal, list) and len(proposal) == 1 and isinstance(proposal[0], Call):
            return proposal[0]
        # A malformed turn's proposal is refused by the guard for the right reason
        # (bad_call, bad_args, missing_operation_key) before anything runs.
        return cast("list[Call] | Finish", proposal)

    def summarise(self, prompt: str, observation: Any) -> Any:
        """The summary turn: the conversation so far (the last calls answered with what
        became of them, ``observation``), ``prompt`` as the user's last word, and no tools
        offered."""
        messages: list[Any] = list(self.memory.get("messages") or [])
        asked = self.memory.get("asked")
        if asked is not None:  # calls the model asked for must be answered before it speaks
            turn = calls_from_openai(asked, self.tool_specs())
            messages.extend(openai_tool_messages(turn, observation))
        messages.append({"role": "user", "content": prompt})
        endpoint = self.endpoint()
        reply = endpoint.complete(messages, (), max_tokens=self.max_output_tokens)
        self._charge(reply)
        try:
            message = reply["choices"][0]["message"]
        except (KeyError, IndexError, TypeError):
            return ""
        if not isinstance(message, dict):
            return ""
        if message.get("tool_calls"):
            return calls_from_openai(message, self.tool_specs()).proposal
        content = message.get("content")
        return content if isinstance(content, str) else ""

    def _charge(self, reply: Mapping[str, Any]) -> None:
        """Report the reply's usage: its tokens, in and out."""
        usage = reply.get("usage")
        if not isinstance(usage, dict):
            return
        if isinstance(usage.get("total_tokens"), int):
            self.tokens = max(0, usage["total_tokens"])
        given, taken = usage.get("prompt_tokens"), usage.get("completion_tokens")
        if isinstance(given, int) and isinstance(taken, int):
            self.input_tokens, self.output_tokens = max(0, given), max(0, taken)

    def _schemas(self) -> list[dict[str, Any]]:
        return [
            {
                "type": "function",
                "function": {
                    "name": tool.name,
                    "description": tool.description,
                    "parameters": dict(self.tool_parameters[tool.name]),
                },
            }
            for tool in self.tools()
        ]


def _encoded(observation: Any) -> Any:
    """An observation as JSON-ready data, for estimating its size."""
    if isinstance(observation, Result):
        return observation.to_dict()
    if isinstance(observation, list):
        return [item.to_dict() if isinstance(item, Result) else str(item) for item in observation]
    return None if observation is None else str(observation)


def _as_sent(message: Mapping[str, Any]) -> dict[str, Any]:
    """The parts of an assistant message the API takes back: its text, and each tool call
    that has an id of its own (so that every call kept can be answered)."""
    content = message.get("content")
    kept: dict[str, Any] = {
        "role": "assistant",
        "content": content if isinstance(content, str) else None,
    }
    calls: list[dict[str, Any]] = []
    for call in message.get("tool_calls") or ():
        function = call.get("function") if isinstance(call, Mapping) else None
        call_id = call.get("id") if isinstance(call, Mapping) else None
        if not isinstance(function, Mapping) or not isinstance(call_id, str):
            continue
        if any(kept_call["id"] == call_id for kept_call in calls):
            continue
        arguments = function.get("arguments")
        calls.append(
            {
                "id": call_id,
                "type": "function",
                "function": {
                    "name": str(function.get("name") or ""),
                    "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments),
                },
            }
        )
    if calls:
        kept["tool_calls"] = calls
    return kept


__all__ = ["ChatAgent", "ModelEndpoint", "ModelUnavailable"]
