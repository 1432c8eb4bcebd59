"""Hosted agents whose planner is a real model behind an OpenAI-compatible Chat Completions API.

:class:`ChatAgent` keeps the conversation in ``memory``, sends it with the tools' JSON
schemas to ``{LOOPGUARD_MODEL_URL}/chat/completions``, charges the reply's tokens and reads
its tool calls with :func:`guard.calls_from_openai`; the next model call first answers every
call of the last reply (:func:`guard.openai_tool_messages`). The application, not the model,
says what each tool does and how a write's operation key is named (:class:`guard.ToolSpec`).

:class:`SupportDeskModel` is the support desk agent with such a planner: the same tools and
the same inspector, which reads the desk's records, never the model's word.

Any server speaking that API works (OpenAI, Azure OpenAI's compatible endpoint, vLLM,
Ollama, LiteLLM). Only the standard library is used to talk to it.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, cast

from django.conf import settings

from guard import Call, Finish, ToolSpec, calls_from_openai, openai_tool_messages

from .base import Agent
from .desk import SupportDesk

MAX_REPLY_BYTES = 2 * 1024 * 1024  # a chat completion is a few KiB; anything this big is wrong
_RETRY_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504})


class ModelUnavailable(RuntimeError):
    """The model could not be asked, or did not answer usably: the planner fails."""


@dataclass(frozen=True)
class ModelEndpoint:
    """Where the model is and how to ask it. ``api_key`` is sent, never stored or shown."""

    url: str
    model: str
    api_key: str = ""
    timeout_s: float = 60.0
    retries: int = 2

    @classmethod
    def from_settings(cls) -> ModelEndpoint:
        """The endpoint ``LOOPGUARD_MODEL_*`` configure; raises ``ModelUnavailable`` if unset."""
        url, model = settings.LOOPGUARD_MODEL_URL, settings.LOOPGUARD_MODEL_NAME
        if not url or not model:
            raise ModelUnavailable(
                "no model is configured: set LOOPGUARD_MODEL_URL (an OpenAI-compatible API, "
                "e.g. https://api.openai.com/v1) and LOOPGUARD_MODEL_NAME"
            )
        return cls(
            url=url,
            model=model,
            api_key=settings.LOOPGUARD_MODEL_API_KEY,
            timeout_s=settings.LOOPGUARD_MODEL_TIMEOUT_SECONDS,
            retries=settings.LOOPGUARD_MODEL_RETRIES,
        )

    def complete(self, messages: Sequence[Any], tools: Sequence[Any]) -> dict[str, Any]:
        """One chat completion. Retries a busy or failing server (HTTP 408, 409, 429, 5xx)
        and a connection that fails, ``retries`` times with a growing pause; raises
        :class:`ModelUnavailable` saying why when it cannot get a reply."""
        body = json.dumps({"model": self.model, "messages": list(messages), "tools": list(tools)})
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        address = self.url.rstrip("/") + "/chat/completions"
        if not address.startswith(("http://", "https://")):
            raise ModelUnavailable(f"LOOPGUARD_MODEL_URL must be an http(s) URL, got {self.url!r}")
        problem = ""
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(min(8.0, 0.5 * 2 ** (attempt - 1)))
            request = urllib.request.Request(  # noqa: S310 - http(s) only, checked above
                address, data=body.encode(), headers=headers, method="POST"
            )
            try:
                with urllib.request.urlopen(request, timeout=self.timeout_s) as response:  # noqa: S310
                    raw = response.read(MAX_REPLY_BYTES + 1)
            except urllib.error.HTTPError as exc:
                problem = f"the model answered HTTP {exc.code}: {_excerpt(exc.read(2000))}"
                if exc.code in _RETRY_STATUS:
                    continue
                raise ModelUnavailable(problem) from None
            except (urllib.error.URLError, TimeoutError, OSError) as exc:
                reason = getattr(exc, "reason", exc)
                problem = f"the model could not be reached at {_shown(address)}: {reason}"
                continue
            if len(raw) > MAX_REPLY_BYTES:
                raise ModelUnavailable(f"the model's reply is larger than {MAX_REPLY_BYTES} bytes")
            try:
                reply = json.loads(raw)
            except ValueError:
                raise ModelUnavailable(f"the model's reply is not JSON: {_excerpt(raw)}") from None
            if not isinstance(reply, dict):
                raise ModelUnavailable(f"the model's reply is not an object: {_excerpt(raw)}")
            return reply
        raise ModelUnavailable(f"{problem} (after {self.retries + 1} attempts)")


def _shown(address: str) -> str:
    """``address`` without any user or password in it, for messages that get stored."""
    parts = urllib.parse.urlsplit(address)
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


def _excerpt(raw: bytes) -> str:
    text = raw.decode("utf-8", "replace").strip()
    return text[:300] + ("…" if len(text) > 300 else "")


class ChatAgent(Agent):
    """An agent whose planner is a model (see the module's docstring).

    A subclass gives ``tool_specs`` (each tool's effect, and for a write how its operation
    key is named), ``tool_parameters`` (the JSON schema of each tool's arguments, shown to
    the model with the tool's ``description``), ``instructions`` and ``goal``; its
    ``tools()`` and ``inspect()`` are those of any agent. ``memory["messages"]`` holds the
    conversation, so a resumed task goes on with it.
    """

    tool_specs: ClassVar[Mapping[str, ToolSpec]]
    tool_parameters: ClassVar[Mapping[str, Mapping[str, Any]]]

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
        asked = self.memory.get("asked")
        if asked is not None:  # the calls of the last reply, answered in the model's order
            turn = calls_from_openai(asked, self.tool_specs)
            messages.extend(openai_tool_messages(turn, observation))
            self.memory["asked"] = None
        reply = self.endpoint().complete(messages, self._schemas())
        usage = reply.get("usage")
        if isinstance(usage, dict) and isinstance(usage.get("total_tokens"), int):
            self.tokens = max(0, usage["total_tokens"])
        try:
            message = reply["choices"][0]["message"]
        except (KeyError, IndexError, TypeError):
            message = None
        if not isinstance(message, dict):
            raise ModelUnavailable(f"the model's reply has no message: {str(reply)[:300]}")
        messages.append(message)
        turn = calls_from_openai(message, self.tool_specs)
        if turn.call_ids:
            self.memory["asked"] = message
        proposal = turn.proposal
        if isinstance(proposal, list) and len(proposal) == 1 and isinstance(proposal[0], Call):
            return proposal[0]
        # A malformed turn's proposal is refused by the guard for the right reason
        # (bad_call, bad_args, missing_operation_key) before anything runs.
        return cast("list[Call] | Finish", proposal)

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


def _object(**properties: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": dict(properties),
        "required": list(properties),
        "additionalProperties": False,
    }


class SupportDeskModel(ChatAgent, SupportDesk):
    """The support desk agent with a model for a planner: same tools, same inspector.

    Input as for ``support_desk``. The operation keys are named by the application from the
    order number the model passes, so a second request for the same refund meets the first.
    """

    name = "support_desk_model"
    title = "Support desk (a real model plans)"
    description = (
        "The support desk's refund and notice, planned by the model LOOPGUARD_MODEL_URL names."
    )
    tool_specs: ClassVar[Mapping[str, ToolSpec]] = {
        "order_lookup": ToolSpec("read"),
        "refund": ToolSpec("write", lambda args: f"order-{args['order']}-refund"),
        "notify_customer": ToolSpec("write", lambda args: f"order-{args['order']}-refund-notice"),
    }
    tool_parameters: ClassVar[Mapping[str, Mapping[str, Any]]] = {
        "order_lookup": _object(order={"type": "integer"}),
        "refund": _object(order={"type": "integer"}, amount_cents={"type": "integer"}),
        "notify_customer": _object(
            order={"type": "integer"}, recipient={"type": "string"}, text={"type": "string"}
        ),
    }

    @classmethod
    def validate_input(cls, input: Mapping[str, Any]) -> None:
        """The support desk's input, and a configured model."""
        SupportDesk.validate_input(input)
        ChatAgent.validate_input(input)

    def instructions(self) -> str:
        """What the model is, and the rules it works by."""
        return (
            "You are a support agent with tools for the order desk. Look the order up first. "
            "Refund exactly the amount you are asked to, once. Then send the customer one "
            "short notice about the refund at the e-mail address the desk holds for the "
            "order. When both are done, reply with a one-sentence summary and no tool call."
        )

    def goal(self) -> str:
        """The task's input as the request the model works on."""
        return (
            f"Refund {self.amount_cents} cents on order {self.order} "
            f"(reason: {self.reason}) and notify the customer."
        )


__all__ = ["ChatAgent", "ModelEndpoint", "ModelUnavailable", "SupportDeskModel"]
