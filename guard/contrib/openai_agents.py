"""The guard in an OpenAI Agents SDK run (``pip install "loopguard-guard[openai-agents]"``).

This module imports ``agents``; ``import guard`` does not import it. It works with any
object offering the guard's step-wise methods (:class:`StepGuard`: the local
:class:`guard.Guard` today, a remote guard over the console's API later)::

    from agents import Agent
    from guard import Guard, Limits
    from guard.contrib.openai_agents import GuardedRun

    guarded = GuardedRun(Guard(Limits(model_calls=8, requests=16, executions=12)))
    agent = Agent(
        name="refunds",
        instructions="...",
        tools=[
            guarded.tool(find_order, effect="read"),
            guarded.tool(send_refund, effect="write",
                         operation_key=lambda args: f"refund-{args['order']}"),
        ],
    )
    outcome = guarded.run_sync(agent, "Refund order 42")
    outcome.report          # the stop report, however the run ended
    outcome.result          # the SDK's RunResult, or None when the guard stopped the run

What it does, step by step:

- **Model calls.** The run hooks (:attr:`GuardedRun.hooks`, a ``RunHooks``) ask
  ``before_model`` in ``on_llm_start``, before every LLM call (after waiting what
  ``before_wait`` asks for a ``RETRYABLE``/``PENDING`` result), and charge each response's
  ``usage.total_tokens`` with ``spend_tokens`` in ``on_llm_end`` (and its cost with
  ``settle_spend`` when a :class:`~guard.Price` is given).
- **The batch check.** The SDK executes a turn's tool calls itself, concurrently, but its
  ``on_llm_end`` hook sees the whole response first. There the turn's ``function_call``
  items are read with :func:`guard.adapters.calls_from_openai` and admitted as one batch
  (``before_tools``): a repeat, a cycle or a malformed call is caught before any call of
  the turn starts, exactly as in ``Guard.run``.
- **Tool calls.** :meth:`GuardedRun.tool` builds the SDK's ``FunctionTool`` from a Python
  function and puts the guard at its executor's entry (a wrapper of ``on_invoke_tool``;
  the SDK's tool input guardrails can only allow or reject, not hand back a stored result).
  The tool declares ``read`` or ``write`` and, for a write, how its operation key is named
  from the arguments (a :class:`guard.adapters.ToolSpec`). ``before_tool`` decides:
  ``EXECUTE`` runs the function and reports its result (``after_tool``); ``REUSE`` answers
  with the committed result without running it; ``STOP`` answers with a refusal that says
  the task stopped and nothing more will run (never "try again"). A function returns a
  :class:`~guard.Result` to report its kind itself — ``PENDING`` (a job still running,
  ``Result(Kind.PENDING, {"job": job}, wait_ms=2_000)``), ``RETRYABLE``, ``PRECONDITION``,
  ``FATAL`` or ``SUCCESS`` — and each is honoured as ``Guard.run`` honours it: a poll of a
  ``PENDING`` job with the same arguments is charged to ``Limits.polls`` (not a repeat),
  the wait is waited before the next LLM call, ``PRECONDITION`` ends the run
  ``NEEDS_HUMAN``/``precondition`` and ``FATAL`` ``FAILED``/``fatal``, the result's data in
  the report's ``detail``; the model reads the result as ``{"kind": ..., "data": ...}``
  (a ``SUCCESS`` as its data). Any other return value is a ``SUCCESS`` with that data, sent
  to the model as the SDK sends it unguarded. An exception is reported as the tool's error
  (a write's outcome is then ``UNKNOWN``) and answered as such; the SDK's own
  failure formatter is switched off, since it would turn a failed write into a success.
- **Ending the run.** A stop ends the run with :exc:`GuardStopped`, which carries the stop
  report. It is raised where nothing is running: in ``on_llm_start`` (a budget, the
  deadline, an operator's stop, or a stop found while the last turn's tools ran) and in
  ``on_llm_end`` (the turn's batch refused). A stop found at a tool's entry is *not* raised
  there: the SDK cancels a failing tool's sibling tasks, and cancelling a write that is
  executing would lose its outcome. That call is answered with the refusal, its siblings
  finish (or are refused at their own entry) and the run ends before the next LLM call. An
  exception rather than a final output, because it is the one way out that works at every
  one of those points, before a model call included, and it neither overrides the agent's
  ``tool_use_behavior`` nor has to fit its ``output_type``. :meth:`GuardedRun.run` and
  :meth:`~GuardedRun.run_sync` catch it and return a :class:`GuardedOutcome`; a run driven
  with ``Runner`` directly (``hooks=guarded.hooks``) sees the exception itself.
- **Finish.** When the model answers without calling a tool, ``on_agent_end`` hands its
  final output to ``finish``: with no inspector that ends ``PARTIAL``/``goal_unverified``
  (the work done is in the report; docs/guard.md, "Progress without an inspector"); pass
  ``inspect=`` for a trusted one. A run that ends on a tool's output (``tool_use_behavior``
  ``stop_on_first_tool`` and the like) ends ``PARTIAL``/``goal_unverified`` too.

What it cannot cover:

- **Hosted tools** (web search, file search, code interpreter, computer use, hosted MCP,
  image generation): OpenAI's servers run them inside the model call, so no guard stands
  at their entry. Only the model call around them is counted.
- **Handoffs**: a handoff is not a tool call; the guard counts the next agent's model
  calls and guards its tools if they were built by the same :class:`GuardedRun`, but does
  not decide the handoff itself.
- **MCP server tools and other ready-made ``FunctionTool`` objects** (agents as tools,
  too) are not guarded unless they are wrapped as a Python function with
  :meth:`GuardedRun.tool`. A call to a function tool the guard does not know stops the
  task ``FAILED``/``bad_call`` before the turn runs (no tool executes without an allow),
  unless its name is listed in ``passthrough``, which leaves it unguarded on purpose.
- The SDK's own human approvals (``needs_approval``) and a run resumed from a serialized
  ``RunState`` are outside the guard; use the guard's approvals instead.
- One :class:`GuardedRun` is one task: do not run it concurrently with itself.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from agents import (
    Agent,
    FunctionTool,
    ModelResponse,
    RunContextWrapper,
    RunErrorDetails,
    RunHooks,
    Runner,
    RunResult,
    TResponseInputItem,
    function_tool,
)
from agents.exceptions import AgentsException, UserError
from agents.handoffs import Handoff
from agents.tool_context import ToolContext

from .. import Call, Evidence, Finish, Kind, Nudge, Price, Report, Result
from .._protocol import require_reservation
from ..adapters import OperationKey, Outcome, ToolSpec, Turn, calls_from_openai
from ..adapters import openai_tool_messages as _tool_messages
from ..steps import Action, Effect, Sequencer, StepGuard, Ticket

__all__ = ["GuardStopped", "GuardedOutcome", "GuardedRun", "StepGuard"]

Inspect = Callable[[Result | None, Call | Finish], Evidence]
"""A trusted inspector, as ``Guard.after_tool`` and ``Guard.finish`` take it."""



class GuardStopped(AgentsException):
    """The guard stopped the task: the run ends here, before the next model call or tool.

    ``report`` is the stop report. Being an ``AgentsException``, it also carries the SDK's
    ``run_data`` (the items of the run so far) when the SDK attached them.
    """

    def __init__(self, report: Report) -> None:
        super().__init__(f"the guard stopped the task: {report.state}/{report.reason}")
        self.report = report


@dataclass(frozen=True, slots=True)
class GuardedOutcome:
    """How a guarded run ended: always with the stop ``report``; ``result`` is the SDK's
    ``RunResult`` when the run reached its end, ``None`` when the guard stopped it (then
    ``run_data`` holds what the SDK kept of the run, if anything)."""

    report: Report
    result: RunResult | None = None
    run_data: RunErrorDetails | None = None


def refusal_text(report: Report) -> str:
    """What a refused call tells the model: the task stopped and why, and that nothing more
    will run. It never invites a retry: a write whose outcome is uncertain must not be asked
    for again until a person has settled it."""
    return (
        f"not run: the task stopped ({report.state}/{report.reason}); "
        "no tool will run any more in this task, so do not ask for this call again."
    )


class GuardedRun:
    """One task's guard, put into an Agents SDK run: run hooks for the model calls and the
    batch check, and function tools whose entry the guard decides.

    ``guard`` is any :class:`StepGuard`. ``inspect`` is a trusted inspector (``None``: the
    observed-evidence policy). ``reserve`` is each model call's maximum cost for the spend
    budget, and ``price`` turns a response's token counts into its real cost. ``passthrough``
    names function tools left outside the guard on purpose (they run unasked).
    """

    def __init__(
        self,
        guard: StepGuard,
        *,
        inspect: Inspect | None = None,
        reserve: int = 0,
        price: Price | None = None,
        passthrough: Iterable[str] = (),
    ) -> None:
        require_reservation(guard, reserve)
        self.guard = guard
        self._seq = Sequencer(guard, inspect=inspect)  # the order of the guard's steps
        self.hooks: RunHooks[Any] = _GuardHooks(self)
        self._inspect = inspect
        self._reserve = reserve
        self._price = price
        self._passthrough = frozenset(passthrough)
        self._specs: dict[str, ToolSpec] = {}
        # The current turn: its admitted tickets by the model's call id, or the nudge that
        # answers every call of it, and whether the model answered without calling a tool.
        self._tickets: dict[str, Ticket] = {}
        self._nudge: Nudge | None = None
        self._finishing = False

    @property
    def report(self) -> Report | None:
        """The stop report once the guard has stopped, else ``None``."""
        return self.guard.report

    # -- tools ---------------------------------------------------------------------------

    def tool(
        self,
        func: Callable[..., Any],
        *,
        effect: Effect = "read",
        operation_key: OperationKey | None = None,
        **options: Any,
    ) -> FunctionTool:
        """The SDK's ``FunctionTool`` for ``func`` (as ``agents.function_tool`` builds it,
        with ``options`` passed on), run only when the guard allows that exact call.

        ``effect`` says what the tool does; a ``write`` needs ``operation_key``, which names
        the business action from the call's arguments (never the model's call id).
        ``func`` may return a :class:`~guard.Result` to say its result kind (``PENDING``
        with a wait, ``PRECONDITION``, ...); anything else is a ``SUCCESS``.
        ``failure_error_function`` cannot be given: the guard must see the tool's errors.
        """
        if "failure_error_function" in options:
            raise TypeError("a guarded tool reports its errors to the guard, not a formatter")
        spec = ToolSpec(effect, operation_key)
        built = function_tool(func, failure_error_function=None, **options)
        if not isinstance(built, FunctionTool):  # pragma: no cover - func is given
            raise TypeError("function_tool() did not build a FunctionTool")
        if built.name in self._specs:
            raise ValueError(f"a guarded tool named {built.name!r} exists already")
        self._specs[built.name] = spec
        invoke = built.on_invoke_tool

        async def guarded_invoke(context: ToolContext[Any], arguments: str) -> Any:
            return await self._invoke(invoke, context, arguments)

        built.on_invoke_tool = guarded_invoke
        return built

    async def _invoke(
        self,
        invoke: Callable[[ToolContext[Any], str], Any],
        context: ToolContext[Any],
        arguments: str,
    ) -> Any:
        """One call at the executor's entry: ask the guard, then run, reuse or refuse."""
        ticket = self._tickets.pop(context.tool_call_id, None)
        if ticket is None:
            if self._nudge is not None:
                return self._nudge.message
            if (report := self.guard.report) is not None:
                return refusal_text(report)
            raise UserError(
                f"the guarded tool {context.tool_name!r} was called outside a guarded run: "
                "run the agent with GuardedRun.run() or hooks=GuardedRun.hooks"
            )
        seq = self._seq
        decision = seq.enter(ticket)
        if decision.action is Action.STOP:
            return refusal_text(decision.report or _stopped(self.guard))
        if decision.action is Action.REUSE:  # the sequencer reported the stored result
            reused = decision.result or Result(Kind.SUCCESS)
            if reused.kind == Kind.SUCCESS and reused.data is not None:
                return reused.data  # the model gets what the execution gave it
            return _answer(ticket, reused)
        try:
            output = await invoke(context, arguments)
        except Exception as exc:
            seq.raised(ticket, exc)
            return _answer(ticket, exc)
        except BaseException as exc:  # a timeout's cancellation: the outcome is lost
            seq.interrupted(ticket, exc)
            raise
        result = output if isinstance(output, Result) else Result(Kind.SUCCESS, output)
        seq.returned(ticket, result)
        # The tool's own value goes to the model as the SDK would send it unguarded.
        return _answer(ticket, result) if isinstance(output, Result) else output

    # -- hooks ---------------------------------------------------------------------------

    async def _before_model(self) -> None:
        seq = self._seq
        pause = seq.pause()  # what the last turn's results asked for, if anything
        if isinstance(pause, Report):
            raise GuardStopped(pause)
        if pause > 0:
            await asyncio.sleep(pause / 1000.0)
        if (stop := seq.model(reserve=self._reserve)) is not None:
            raise GuardStopped(stop)
        self._tickets, self._nudge, self._finishing = {}, None, False

    def _after_model(self, agent: Agent[Any], response: ModelResponse) -> None:
        usage = response.usage
        if usage.total_tokens:
            self.guard.spend_tokens(usage.total_tokens)
        if self._price is not None:
            self.guard.settle_spend(self._price.cost(usage.input_tokens, usage.output_tokens))
        skipped = self._passthrough | _handoff_names(agent)
        entries: list[dict[str, Any]] = []
        calls = 0
        for item in response.output:
            if _field(item, "type") != "function_call":
                continue
            calls += 1
            name = _field(item, "name")
            if name in skipped:
                continue
            entries.append(
                {
                    "id": _field(item, "call_id"),
                    "type": "function",
                    "function": {"name": name, "arguments": _field(item, "arguments")},
                }
            )
        if not calls:
            self._finishing = True  # the model answered: its output is the finish
            return
        if not entries:
            return  # only handoffs and passthrough tools: nothing for the guard to admit
        turn = calls_from_openai({"role": "assistant", "tool_calls": entries}, self._specs)
        admitted = self._seq.proposed(turn.proposal)
        if isinstance(admitted, Report):
            raise GuardStopped(admitted)  # nothing of this turn has started
        if isinstance(admitted, Nudge):
            self._nudge = admitted
            return
        self._tickets = dict(zip(turn.call_ids, admitted, strict=True))

    def _after_agent(self, output: Any) -> None:
        # The model's final answer, or a run that ended on a tool's output (the agent's
        # tool_use_behavior): the sequencer's one rule for a run without an answer.
        self._seq.end(Finish(output) if self._finishing else None)

    # -- running -------------------------------------------------------------------------

    async def run(
        self, agent: Agent[Any], input: str | list[TResponseInputItem], **options: Any
    ) -> GuardedOutcome:
        """``Runner.run`` with the guard's hooks; ``options`` go to ``Runner.run``.

        Returns how the run ended, always with the stop report. An error that is not the
        guard's (the model's API failing, say) stops the task ``FAILED``/``planner_error``
        and is raised.
        """
        try:
            result = await Runner.run(agent, input, hooks=self.hooks, **options)
        except Exception as exc:
            return self._ended(exc)
        return GuardedOutcome(self._finished(), result)

    def run_sync(
        self, agent: Agent[Any], input: str | list[TResponseInputItem], **options: Any
    ) -> GuardedOutcome:
        """``Runner.run_sync`` with the guard's hooks: :meth:`run` for synchronous code."""
        try:
            result = Runner.run_sync(agent, input, hooks=self.hooks, **options)
        except Exception as exc:
            return self._ended(exc)
        return GuardedOutcome(self._finished(), result)

    def _ended(self, exc: Exception) -> GuardedOutcome:
        report = exc.report if isinstance(exc, GuardStopped) else self.guard.report
        run_data = exc.run_data if isinstance(exc, AgentsException) else None
        if report is not None:
            # The guard's stop ended the run, or the SDK noticed the run could not go on
            # (its turn limit, say) after the guard had already stopped it.
            return GuardedOutcome(report, None, run_data)
        self._seq.planner_failed(exc)
        raise exc

    def _finished(self) -> Report:
        return self._seq.end()  # on_agent_end did not fire: the run ended without an answer


class _GuardHooks(RunHooks[Any]):
    """The run hooks of one :class:`GuardedRun`."""

    def __init__(self, run: GuardedRun) -> None:
        self._run = run

    async def on_llm_start(
        self,
        context: RunContextWrapper[Any],
        agent: Agent[Any],
        system_prompt: str | None,
        input_items: list[TResponseInputItem],
    ) -> None:
        """Before each LLM call: the guard's ``before_model``."""
        await self._run._before_model()

    async def on_llm_end(
        self, context: RunContextWrapper[Any], agent: Agent[Any], response: ModelResponse
    ) -> None:
        """After each LLM call: charge its usage, admit its tool calls as one batch."""
        self._run._after_model(agent, response)

    async def on_agent_end(
        self, context: RunContextWrapper[Any], agent: Agent[Any], output: Any
    ) -> None:
        """The run's final output: the model's finish."""
        self._run._after_agent(output)


def _answer(ticket: Ticket, outcome: Outcome) -> str:
    """The text the model gets for a reused result, a ``Result`` a tool returned, or an
    error: the same words :func:`guard.adapters.openai_tool_messages` uses."""
    turn = Turn(calls=(ticket.call,), call_ids=("call",))
    content: str = _tool_messages(turn, [outcome])[0]["content"]
    return content


def _stopped(guard: StepGuard) -> Report:
    report = guard.report
    if report is None:  # pragma: no cover - a STOP decision always comes with its report
        raise RuntimeError("the guard refused a call without a stop report")
    return report


def _handoff_names(agent: Agent[Any]) -> frozenset[str]:
    """The tool names under which the model asks for the agent's handoffs."""
    names = set()
    for target in agent.handoffs:
        if isinstance(target, Handoff):
            names.add(target.tool_name)
        else:
            names.add(Handoff.default_tool_name(target))
    return frozenset(names)


def _field(item: Any, name: str) -> Any:
    """A field of a response output item: a pydantic model, or a plain mapping."""
    if isinstance(item, Mapping):
        return item.get(name)
    return getattr(item, name, None)
