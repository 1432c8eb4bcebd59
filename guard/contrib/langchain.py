"""LoopGuard for LangChain v1 agents: a middleware for ``langchain.agents.create_agent``.

Install the extra (``pip install "loopguard-guard[langchain]"``); ``import guard`` itself still
imports nothing outside the standard library, and this module is never imported by it.

:class:`LoopGuardMiddleware` drives the guard's step-wise interface (:class:`StepGuard`: the
local :class:`guard.Guard` today, a remote guard over the console's API later) from the
agent's own loop:

- ``before_model``: the guard's ``before_model`` (after honouring a wait that a
  ``RETRYABLE``/``PENDING`` result asked for); a stop ends the agent (``jump_to="end"``)
  before the model is called, with the stop report as the last message (an ``AIMessage``
  named ``loopguard``: a readable text, then the report's JSON).
- ``after_model``: the batch check (``before_tools``) of the AI message's tool calls, each
  read with :class:`guard.adapters.ToolSpec` (its effect, and for a write the operation key
  derived from its arguments). A :class:`guard.Nudge` answers every call with a tool message
  carrying the nudge and goes back to the model without running anything; a stop answers
  every call ("not run") and ends the agent. A tool the middleware was not told about is
  refused (``bad_call``): every tool declares what it does.
- ``wrap_tool_call``: ``before_tool`` at the executor's entry. ``EXECUTE`` runs the handler
  and reports what came back; ``REUSE`` answers with the stored (committed) result and never
  runs the tool; ``STOP`` answers with a tool message that never invites the model to ask
  again, and the agent ends at the next ``before_model``.
- ``after_agent``: a final answer (an AI message without tool calls) is
  ``finish(Finish(answer), inspect)``; a run that ended on anything else (a
  ``return_direct`` tool's output) ended without the model's answer: ``PARTIAL``/
  ``goal_unverified`` (the sequencer's rule, the same in every driver). The stop report,
  however the task ended, is :attr:`LoopGuardMiddleware.report` and the state's
  ``loopguard_report`` (its JSON form).

What a tool's outcome is reported as:

- a tool message whose ``artifact`` is a :class:`guard.Result`: that result, whatever its
  kind. This is how a LangChain tool says ``PENDING`` (a job still running, with its id and
  a wait), ``RETRYABLE``, ``PRECONDITION`` or ``FATAL``: declare it with
  ``response_format="content_and_artifact"`` and return ``(text for the model, Result)``
  (or return a ``ToolMessage``/``Command`` with the artifact set yourself)::

      @tool(response_format="content_and_artifact")
      def export_status(job: str) -> tuple[str, Result]:
          \"\"\"Look at an export job.\"\"\"
          state = exports.status(job)
          if state.running:
              return f"export {job} is still running", Result(
                  Kind.PENDING, {"job": job}, wait_ms=2_000
              )
          return f"export {job} is ready: {state.url}", Result(Kind.SUCCESS, {"url": state.url})

  Each kind is then honoured as ``Guard.run`` honours it: polling a ``PENDING`` job with
  the same arguments is charged to ``Limits.polls`` (not a repeat), the wait a
  ``RETRYABLE``/``PENDING`` result asks for is waited before the next model call,
  ``PRECONDITION`` stops ``NEEDS_HUMAN``/``precondition`` and ``FATAL`` ``FAILED``/``fatal``,
  the tool's data in the report's ``detail``. A result without data takes the message's
  content as its data. The artifact wins over the message's ``status``;
- otherwise, a tool message (or a ``Command`` carrying one) with ``status="success"``:
  ``SUCCESS``, its ``content`` the result's data;
- a tool message with ``status="error"`` (LangChain's ``ToolNode`` turned an error into a
  message for the model, e.g. arguments that failed validation): ``RETRYABLE`` (data: the
  content; wait :data:`ERROR_WAIT_MS`). The model reads the error and may ask for something
  else, and asking for the same call again is bounded by the repeat rules (``same_call``)
  like any retry. For a write this is no commit: the observed-evidence policy (or a lookup,
  or the inspector) settles it, otherwise it is ``UNKNOWN`` and the task ``NEEDS_HUMAN`` —
  the message may hide an action that took effect;
- an exception from a **write**: ``after_tool(error=...)`` at once (the operation is
  ``UNKNOWN`` unless a lookup settles it): the exception is not re-raised, so no retry
  middleware replays the write, and the model is told that it will not be run again;
- an exception from a **read**: re-raised, so that an outer ``ToolRetryMiddleware`` may try
  again (see below). If no later attempt succeeds, the guard is told at its next step
  (``before_model`` or ``after_agent``): one attempt is ``after_tool(error=...)``, the
  guard's own rule (``FAILED``/``executor_error``); after several, they are charged as a
  ``RETRYABLE`` result of that many attempts and the task is stopped
  ``FAILED``/``executor_error`` with the error and the count in the report's ``detail``.
  Without a retry middleware LangChain lets the exception end the agent (as it does without
  the guard): call :meth:`LoopGuardMiddleware.close` then, and the guard records it.

**Ordering with ToolRetryMiddleware** (invariant 7: one budget for every retry layer).
LangChain composes ``wrap_tool_call`` first-listed-outermost, so put the retry middleware
*before* the guard::

    create_agent(model, tools, middleware=[ToolRetryMiddleware(...), guard_middleware])

Then every attempt of the retry middleware enters the guard's ``wrap_tool_call``: the first
through ``before_tool`` (one execution), each further one only if the guard's execution
budget and deadline still have room for it (else the task stops ``execution_budget`` /
``deadline`` and the attempt does not run), and all of them are charged as executions
(``Result.attempts``) when the call is reported. Listed the other way round, the retries
would happen inside one guarded execution, uncounted — and a write could be replayed
blindly; do not. A write is never retried in the recommended order either: its exception
does not reach the retry middleware.

Parallel tool calls run in LangGraph's own threads; the middleware serialises its calls into
the guard (the tools themselves still run in parallel). The synchronous and asynchronous
agent APIs (``invoke``/``ainvoke``) are both supported.

A complete example (``FakeMessagesListChatModel`` stands in for a real chat model so that
it runs offline; pass ``"openai:gpt-4.1-mini"`` or any tool-calling ``BaseChatModel``)::

    from langchain.agents import create_agent
    from langchain.agents.middleware import ToolRetryMiddleware
    from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
    from langchain_core.messages import AIMessage
    from langchain_core.tools import tool

    from guard import Guard, InMemoryLedger, Limits
    from guard.adapters import ToolSpec, tool_effects
    from guard.contrib.langchain import LoopGuardMiddleware

    class Model(FakeMessagesListChatModel):
        def bind_tools(self, tools, **kwargs):  # a real model binds them; this one is scripted
            return self

    model = Model(responses=[
        AIMessage("", tool_calls=[{"name": "read_incident", "args": {"incident": 42}, "id": "1"}]),
        AIMessage("", tool_calls=[{"name": "notify", "args": {"incident": 42}, "id": "2"}]),
        AIMessage("The on-call engineer was notified about incident 42."),
    ])

    @tool
    def read_incident(incident: int) -> str:
        \"\"\"Read one incident.\"\"\"
        return f"incident {incident}: database down"

    @tool
    def notify(incident: int) -> str:
        \"\"\"Send the first notice about an incident.\"\"\"
        return f"notice for incident {incident} sent"

    specs = {
        "read_incident": ToolSpec("read"),
        "notify": ToolSpec("write", lambda args: f"incident-{args['incident']}-first-notice"),
    }
    guard = Guard(Limits(model_calls=8, executions=6), ledger=InMemoryLedger(),
                  tools=tool_effects(specs))
    loop_guard = LoopGuardMiddleware(guard, specs)  # inspect=None: no trusted inspector
    agent = create_agent(
        model,
        tools=[read_incident, notify],
        middleware=[ToolRetryMiddleware(max_retries=2, initial_delay=0.1), loop_guard],
    )
    state = agent.invoke({"messages": [{"role": "user", "content": "Handle incident 42."}]})
    print(loop_guard.report.state, loop_guard.report.reason)  # PARTIAL goal_unverified
    print(state["loopguard_report"]["operations"][0]["state"])  # COMMITTED

With no inspector a finish is ``PARTIAL``/``goal_unverified`` (docs/guard.md, "Progress
without an inspector"); pass ``inspect=`` (reading trusted records) for ``COMPLETED``.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, NotRequired

from langchain.agents.middleware import AgentMiddleware, AgentState, hook_config
from langchain_core.messages import AIMessage, AnyMessage, ToolMessage
from langgraph.errors import GraphBubbleUp
from langgraph.prebuilt.tool_node import ToolCallRequest
from langgraph.runtime import Runtime
from langgraph.types import Command

from .. import Call, Finish, Kind, Nudge, Report, Result
from .._protocol import require_reservation
from ..adapters import ToolSpec, calls_from_openai
from ..steps import Action, Decision, Sequencer, StepGuard, Ticket

__all__ = [
    "ERROR_WAIT_MS",
    "REPORT_KEY",
    "GuardState",
    "Inspect",
    "LoopGuardMiddleware",
    "StepGuard",
    "stop_message",
]

ERROR_WAIT_MS = 1
"""The wait a tool message with ``status="error"`` asks for (the guard's ``RETRYABLE``
needs one): the model's next call is the real pause."""

REPORT_KEY = "loopguard_report"
"""The state key that holds the stop report's JSON form once the task has stopped."""

STOP_NAME = "loopguard"
"""The ``name`` of the AI message that carries the stop report."""

Inspect = Callable[[Result | None, Call | Finish], Any]
"""The application's trusted inspector (``Evidence`` from its own records), as the guard
takes it."""

Handler = Callable[[ToolCallRequest], ToolMessage | Command[Any]]
AsyncHandler = Callable[[ToolCallRequest], Awaitable[ToolMessage | Command[Any]]]


class GuardState(AgentState[Any]):
    """The agent's state with the middleware's key: the stop report, once there is one."""

    loopguard_report: NotRequired[dict[str, Any]]


@dataclass(slots=True)
class _Entry:
    """One admitted call of the current model call, by the model's call id."""

    ticket: Ticket
    tool: str
    attempts: int = 0  # entries into the tool so far (an outer retry middleware adds more)
    error: Exception | None = None  # the last attempt's exception, not yet reported
    reported: bool = False  # the guard has been told what became of it


class LoopGuardMiddleware(AgentMiddleware[GuardState, Any, Any]):
    """Guards a ``create_agent`` agent: every model call and tool execution asks ``guard``
    first (see the module's docstring for each hook and the ordering with retries).

    ``tools`` says what each tool does (name → :class:`~guard.adapters.ToolSpec`); a tool
    missing from it is refused. ``inspect`` is the application's trusted inspector, or
    ``None`` for the observed-evidence policy. ``reserve`` is each model call's maximum
    cost for the spend budget; ``wait(ms)`` waits before a model call when a result asked
    for it; ``count_tokens`` charges the AI messages' ``usage_metadata`` to the token budget.
    """

    state_schema = GuardState

    def __init__(
        self,
        guard: StepGuard,
        tools: Mapping[str, ToolSpec],
        *,
        inspect: Inspect | None = None,
        reserve: int = 0,
        wait: Callable[[float], None] | None = None,
        count_tokens: bool = True,
    ) -> None:
        require_reservation(guard, reserve)
        super().__init__()
        self.guard = guard
        # The order of the guard's steps, as every driver keeps it.
        self._seq = Sequencer(guard, inspect=inspect)
        self.specs: Mapping[str, ToolSpec] = dict(tools)
        self.inspect = inspect
        self.reserve = reserve
        self.count_tokens = count_tokens
        self.tools = []  # the middleware registers no tools of its own
        self._wait = wait if wait is not None else _sleep_ms
        # LangGraph runs a model call's tool calls in parallel threads; the guard is asked
        # one step at a time.
        self._lock = threading.RLock()
        self._entries: dict[str, _Entry] = {}

    @property
    def report(self) -> Report | None:
        """The stop report once the task has stopped (also in the state's
        ``loopguard_report``), else ``None``."""
        return self.guard.report

    # -- model calls ---------------------------------------------------------------------

    @hook_config(can_jump_to=["end"])
    def before_model(self, state: GuardState, runtime: Runtime[Any]) -> dict[str, Any] | None:
        """Settle what the last tool calls left open, wait if a result asked for it, then
        ask for the model call; a stop ends the agent before the model runs."""
        seq = self._seq
        with self._lock:
            stop = self._settle_left_over()
            if stop is None:
                pause = seq.pause()
                if isinstance(pause, Report):
                    stop = pause
                elif pause > 0:
                    self._wait(pause)
            if stop is None:
                stop = seq.model(reserve=self.reserve)
        return None if stop is None else _end(stop)

    async def abefore_model(
        self, state: GuardState, runtime: Runtime[Any]
    ) -> dict[str, Any] | None:
        """:meth:`before_model` (the guard's steps do no I/O of their own here)."""
        return self.before_model(state, runtime)

    @hook_config(can_jump_to=["end", "model"])
    def after_model(self, state: GuardState, runtime: Runtime[Any]) -> dict[str, Any] | None:
        """Check the AI message's tool calls as one batch before any of them runs."""
        message = _last_ai_message(state["messages"])
        if message is None:
            return None
        if self.count_tokens and message.usage_metadata:
            with self._lock:
                self.guard.spend_tokens(int(message.usage_metadata.get("total_tokens", 0)))
        if not message.tool_calls and not message.invalid_tool_calls:
            return None  # a final answer: after_agent finishes the task
        turn = calls_from_openai(_wire(message), self.specs)
        ids = [str(call.get("id") or "") for call in message.tool_calls] + [
            str(call.get("id") or "") for call in message.invalid_tool_calls
        ]
        names = [call["name"] for call in message.tool_calls] + [
            str(call.get("name") or "") for call in message.invalid_tool_calls
        ]
        with self._lock:
            self._entries = {}
            admitted = self._seq.proposed(turn.proposal)
            if isinstance(admitted, list):
                for ticket in admitted:
                    call_id = turn.call_ids[ticket.index]
                    self._entries[call_id] = _Entry(ticket, ticket.call.tool)
                return None
        if isinstance(admitted, Nudge):
            answers = [
                _tool_message(admitted.message, i, n) for i, n in zip(ids, names, strict=True)
            ]
            return {"messages": answers, "jump_to": "model"}
        not_run = [
            _tool_message(_not_run_text(admitted, write=False), i, n)
            for i, n in zip(ids, names, strict=True)
        ]
        ended = _end(admitted)
        return {**ended, "messages": [*not_run, *ended["messages"]]}

    async def aafter_model(self, state: GuardState, runtime: Runtime[Any]) -> dict[str, Any] | None:
        """:meth:`after_model`."""
        return self.after_model(state, runtime)

    # -- tool calls ----------------------------------------------------------------------

    def wrap_tool_call(
        self, request: ToolCallRequest, handler: Handler
    ) -> ToolMessage | Command[Any]:
        """Run the call only if the guard lets it execute now, and report what it returned."""
        entry, refused = self._enter(request)
        if entry is None:
            return refused
        try:
            outcome = handler(request)
        except GraphBubbleUp:
            raise  # LangGraph's interrupts and parent commands: not the tool's outcome
        except Exception as exc:
            return self._raised(entry, request, exc)
        return self._returned(entry, request, outcome)

    async def awrap_tool_call(
        self, request: ToolCallRequest, handler: AsyncHandler
    ) -> ToolMessage | Command[Any]:
        """:meth:`wrap_tool_call` for ``ainvoke``."""
        entry, refused = self._enter(request)
        if entry is None:
            return refused
        try:
            outcome = await handler(request)
        except GraphBubbleUp:
            raise
        except Exception as exc:
            return self._raised(entry, request, exc)
        return self._returned(entry, request, outcome)

    # -- the end -------------------------------------------------------------------------

    def after_agent(self, state: GuardState, runtime: Runtime[Any]) -> dict[str, Any] | None:
        """A final answer is the model's finish; the report goes into the state."""
        with self._lock:
            report = self._settle_left_over() or self.guard.report
            if report is None:
                # The model's final answer is an AI message without tool calls; a run
                # that ended on anything else (a tool's output) ended without one.
                message = _last_ai_message(state["messages"])
                final = message is not None and not message.tool_calls
                answer = Finish(message.content) if final and message is not None else None
                report = self._seq.end(answer)
        return {REPORT_KEY: report.to_dict()}

    async def aafter_agent(self, state: GuardState, runtime: Runtime[Any]) -> dict[str, Any] | None:
        """:meth:`after_agent`."""
        return self.after_agent(state, runtime)

    def close(self) -> Report | None:
        """After ``agent.invoke`` raised a read's exception (no retry middleware caught
        it, or one with ``on_failure="error"`` gave up): tell the guard, which stops
        ``FAILED``/``executor_error``. Returns the stop report, if the task has stopped."""
        with self._lock:
            return self._settle_left_over() or self.guard.report

    # -- internals -----------------------------------------------------------------------

    def _enter(self, request: ToolCallRequest) -> tuple[_Entry | None, ToolMessage]:
        """The entry allowed to run now, or (``None``, the answer instead of running)."""
        call_id = str(request.tool_call.get("id") or "")
        name = request.tool_call["name"]
        with self._lock:
            entry = self._entries.get(call_id)
            report = self.guard.report
            if entry is None or entry.reported:
                # Never admitted (or already answered): nothing runs without the guard's yes.
                text = (
                    _not_run_text(report, write=False)
                    if report is not None
                    else "Not run: this call was not admitted by the loop guard."
                )
                return None, _tool_message(text, call_id, name)
            if entry.attempts == 0:
                decision = self._seq.enter(entry.ticket)
                if decision.action is Action.EXECUTE:
                    entry.attempts = 1
                    return entry, _NOTHING
                return None, self._decided(entry, decision, call_id, name)
            # An outer middleware (ToolRetryMiddleware) tries a read again.
            refused = self._seq.again(entry.ticket, entry.attempts)
            if refused is not None:
                entry.reported, entry.error = True, None
                return None, _tool_message(_not_run_text(refused, write=False), call_id, name)
            entry.attempts += 1
            return entry, _NOTHING

    def _decided(self, entry: _Entry, decision: Decision, call_id: str, name: str) -> ToolMessage:
        """The answer to a call the guard reuses or refuses (nothing runs)."""
        write = entry.ticket.call.effect == "write"
        if decision.action is Action.REUSE:
            entry.reported = True  # the sequencer reported the stored result
            result = decision.result or Result(Kind.SUCCESS)
            return ToolMessage(_content(result), tool_call_id=call_id, name=name)
        entry.reported = True
        report = decision.report or self.guard.report
        text = (
            _not_run_text(report, write=write)
            if report is not None
            else "Not run: the loop guard refused this call."
        )
        return _tool_message(text, call_id, name)

    def _raised(self, entry: _Entry, request: ToolCallRequest, exc: Exception) -> ToolMessage:
        """A tool raised: a write's outcome is lost (reported now, never replayed); a read's
        exception goes on to an outer retry middleware and is reported later."""
        call_id, name = str(request.tool_call.get("id") or ""), request.tool_call["name"]
        with self._lock:
            if entry.ticket.call.effect == "write":
                entry.reported = True
                report = self._seq.raised(entry.ticket, exc)
                text = (
                    f"Error: {_describe(exc)}. Whether {name} took effect is unknown, so it "
                    "will not be run again; a person will check it."
                )
                if report is not None:
                    text += f" The task is stopped ({report.reason})."
                return _tool_message(text, call_id, name)
            entry.error = exc
        raise exc

    def _returned(
        self, entry: _Entry, request: ToolCallRequest, outcome: ToolMessage | Command[Any]
    ) -> ToolMessage | Command[Any]:
        """The tool answered: report it, and show the model what it said (or, when a failed
        call stopped the task, that nothing more will run)."""
        call_id, name = str(request.tool_call.get("id") or ""), request.tool_call["name"]
        content, failed, artifact = _outcome_of(outcome, call_id)
        if isinstance(artifact, Result):
            result = _declared(artifact, content, entry.attempts)
            failed = result.kind != Kind.SUCCESS
        elif failed:
            result = Result(Kind.RETRYABLE, content, wait_ms=ERROR_WAIT_MS, attempts=entry.attempts)
        else:
            result = Result(Kind.SUCCESS, content, attempts=entry.attempts)
        with self._lock:
            entry.reported, entry.error = True, None
            report = self._seq.returned(entry.ticket, result)
        if report is not None and (failed or entry.ticket.call.effect == "write"):
            write = entry.ticket.call.effect == "write"
            return _tool_message(_not_run_text(report, write=write, ran=True), call_id, name)
        return outcome

    def _settle_left_over(self) -> Report | None:
        """Tell the guard about reads whose last attempt raised and that nobody tried again
        (the retry middleware gave up), with every attempt: the guard's stop, if it stops."""
        for entry in self._entries.values():
            if entry.reported or entry.error is None:
                continue
            error, attempts = entry.error, entry.attempts
            entry.reported, entry.error = True, None
            stop = self._seq.raised(entry.ticket, error, attempts=attempts)
            if stop is not None:
                return stop
        return None


# -- messages -----------------------------------------------------------------------------

_NOTHING = ToolMessage("", tool_call_id="")  # placeholder: the call runs, no answer yet


def stop_message(report: Report) -> AIMessage:
    """The last message of a stopped agent: what happened in words, then the full report."""
    lines = [f"LoopGuard stopped this task: {report.state} / {report.reason}."]
    if report.detail:
        lines.append(f"Detail: {report.detail}")
    if report.uncertain:
        keys = ", ".join(op.key for op in report.uncertain)
        lines.append(f"Uncertain operations (a person must settle them): {keys}.")
    lines.append(
        f"Used: {report.model_calls} model calls, {report.requests} requests, "
        f"{report.executions} executions."
    )
    lines.append(f"To go on: {report.resume_condition}")
    return AIMessage("\n".join(lines) + "\n\n" + report.to_json(indent=2), name=STOP_NAME)


def _end(report: Report) -> dict[str, Any]:
    return {"messages": [stop_message(report)], "jump_to": "end", REPORT_KEY: report.to_dict()}


def _not_run_text(report: Report, *, write: bool, ran: bool = False) -> str:
    """What the model reads about a call that will not (or will no more) run. It never asks
    the model to repeat anything: a write's fate is a person's to settle."""
    text = (
        f"The task was stopped ({report.reason})."
        if ran
        else f"Not run: the task was stopped ({report.reason})."
    )
    if write and ran:
        # The call ran: whether its action took effect is in the ledger, not for the model.
        text += " Its outcome is in the task's ledger; this action will not be run again."
    elif write:
        text += " This action was not performed by this call; a person decides what follows."
    return text + " No more tools will run."


def _tool_message(text: str, call_id: str, name: str) -> ToolMessage:
    return ToolMessage(text, tool_call_id=call_id, name=name, status="error")


def _content(result: Result) -> str:
    """A stored result as a tool message's content (text as it was, else JSON)."""
    if str(result.kind) == Kind.SUCCESS and isinstance(result.data, str):
        return result.data
    value = result.data if str(result.kind) == Kind.SUCCESS else result.to_dict()
    return json.dumps(value, ensure_ascii=False, default=repr)


def _outcome_of(outcome: ToolMessage | Command[Any], call_id: str) -> tuple[Any, bool, Any]:
    """(the content the model will read, whether it is an error, its artifact) of a tool's
    answer."""
    message: Any = outcome
    if isinstance(outcome, Command):
        update = outcome.update
        found = update.get("messages", []) if isinstance(update, Mapping) else []
        message = next(
            (m for m in found if isinstance(m, ToolMessage) and m.tool_call_id == call_id), None
        )
        if message is None:
            return None, False, None  # a state update without an answer of its own
    if isinstance(message, ToolMessage):
        return message.content, message.status == "error", message.artifact
    return message, False, None


def _declared(result: Result, content: Any, attempts: int) -> Result:
    """The :class:`~guard.Result` a tool gave as its message's artifact, as the guard is
    told it: without data of its own, the data is what the model reads (so a reused write
    answers with the same words); the middleware's entries beyond the first (an outer retry
    middleware's) are executions too, beside the tool's own ``attempts``. A malformed one is
    passed on as it is, for the guard to refuse (``bad_result``)."""
    own: Any = result.attempts
    if type(own) is not int or own < 1:
        return result
    data = content if result.data is None else result.data
    return replace(result, data=data, attempts=own + attempts - 1)


def _last_ai_message(messages: Sequence[AnyMessage]) -> AIMessage | None:
    last = messages[-1] if messages else None
    return last if isinstance(last, AIMessage) else None


def _wire(message: AIMessage) -> dict[str, Any]:
    """The AI message's tool calls in the Chat Completions shape that
    :func:`guard.adapters.calls_from_openai` reads (arguments already decoded; a call the
    model garbled keeps its raw text, which the reader refuses as ``bad_call``)."""
    calls: list[dict[str, Any]] = [
        {"id": call.get("id"), "function": {"name": call["name"], "arguments": call["args"]}}
        for call in message.tool_calls
    ]
    calls += [
        {
            "id": call.get("id"),
            "function": {"name": call.get("name"), "arguments": call.get("args")},
        }
        for call in message.invalid_tool_calls
    ]
    return {"role": "assistant", "content": message.content, "tool_calls": calls}


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _sleep_ms(ms: float) -> None:
    time.sleep(ms / 1000.0)
