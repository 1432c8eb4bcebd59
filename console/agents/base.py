"""What a hosted agent is: planner, tools (read/write, optional lookup) and inspector."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from guard import Call, Evidence, Finish, Result, Settlement
from guard.steps import Effect


class UnknownAgent(LookupError):
    """No agent is registered under that name."""


@dataclass(frozen=True)
class Tool:
    """One tool adapter.

    ``run`` performs the call and maps its outcome onto the closed set of result kinds; it
    may raise (a lost response). ``lookup`` answers, from the business system's own
    records, whether the action with an operation key took effect — it lets the guard and
    reconcilers settle an ``UNKNOWN`` write without guessing. ``approval`` says when a call
    must wait for a person's yes before it runs: ``"never"``, ``"always"``, or a predicate
    over the call (a refund above a limit, say).
    """

    name: str
    effect: Effect
    run: Callable[[Call], Result]
    lookup: Callable[[str], Settlement] | None = None
    description: str = ""
    approval: Literal["never", "always"] | Callable[[Call], bool] = "never"

    def needs_approval(self, call: Call) -> bool:
        """Whether ``call`` must be approved by a person before it runs."""
        if callable(self.approval):
            return bool(self.approval(call))
        return self.approval == "always"


class Agent(ABC):
    """One agent working on one task.

    The runner builds a fresh instance for every stretch it drives (a phase, or the rest of
    one after a crash) with the task's id, input and ``memory``: a JSON-ready dict the agent
    keeps its conversation or progress in. The runner saves ``memory`` after every step, so
    whatever the agent needs to go on after a restart must be in it.

    ``plan`` stands for the model: it returns a :class:`~guard.Call`, a list of them or a
    :class:`~guard.Finish`, and reports model usage by setting ``self.tokens`` (and, for
    the spend budget, ``self.input_tokens``/``self.output_tokens``, or ``self.cost``
    directly). ``inspect`` must read trusted records (the business system), never the
    model's word.

    Spend: ``model`` names the price (``LOOPGUARD_MODEL_PRICES``) and ``max_output_tokens``
    caps each reply; before each model call the runner reserves ``prompt_tokens`` of input
    plus that cap at the model's price, and after it charges what the call really cost.
    """

    name: ClassVar[str]
    title: ClassVar[str]
    description: ClassVar[str] = ""
    example_input: ClassVar[Mapping[str, Any]] = {}
    default_limits: ClassVar[Mapping[str, Any]] = {}
    nudge: ClassVar[bool] = False
    """Show the model one nudge on its first repeat or cycle before stopping."""
    auto_lookup: bool = True
    """Let the guard settle a lost write with the tool's ``lookup`` before stopping; when
    False, an uncertain write always goes to a human (the lost-response demo does this)."""
    model: ClassVar[str] = ""
    """The model whose price (``LOOPGUARD_MODEL_PRICES``) the spend budget charges."""
    max_output_tokens: int = 0
    """The most tokens one reply may have: the output part of each call's reservation."""
    summary_turn: bool = False
    """After a stop for a budget, the deadline or no progress, let the model answer the
    user once more, with no tools (:meth:`summarise`)."""

    def __init__(self, task_id: int, input: Mapping[str, Any], memory: dict[str, Any]) -> None:
        self.task_id = task_id
        self.input = input
        self.memory = memory
        self.tokens = 0
        self.input_tokens: int | None = None
        self.output_tokens: int | None = None
        self.cost: int | None = None

    @classmethod
    def model_name(cls) -> str:
        """The name its price is found under (``model`` unless configured elsewhere)."""
        return cls.model

    def usage_reset(self) -> None:
        """Forget the last model call's usage, before the next one."""
        self.tokens = 0
        self.input_tokens = self.output_tokens = self.cost = None

    def prompt_tokens(self, observation: Any) -> int:
        """An estimate of the next model call's input tokens (for its reservation).
        Overestimate rather than under: what is reserved must cover the call."""
        return 0

    def approval_policy(self) -> Callable[[Call], bool] | None:
        """The guard's ``needs_approval``: the tools' own policies, or ``None`` when no tool
        has one (then the guard asks nothing). Override to add an agent-wide rule."""
        tools = {tool.name: tool for tool in self.tools()}
        if all(tool.approval == "never" for tool in tools.values()):
            return None

        def needs_approval(call: Call) -> bool:
            tool = tools.get(call.tool)
            return tool is not None and tool.needs_approval(call)

        return needs_approval

    def summarise(self, prompt: str, observation: Any) -> Any:
        """The summary turn: one model call with ``prompt`` (why the task stopped) and no
        tools, after ``observation`` (what the last calls came to); returns its text,
        reporting usage as :meth:`plan` does. Agents that set ``summary_turn`` implement
        it."""
        raise NotImplementedError(f"{type(self).__name__} has no summary turn")

    @classmethod  # noqa: B027 - an optional hook, not an abstract method
    def validate_input(cls, input: Mapping[str, Any]) -> None:
        """Raise ``ValueError`` with a clear message if ``input`` cannot be worked on.

        Optional: the default accepts any JSON object.
        """

    @abstractmethod
    def tools(self) -> Sequence[Tool]:
        """The tools this agent may call."""

    @abstractmethod
    def plan(self, observation: Any) -> Call | list[Call] | Finish:
        """The next model step, given the previous observation (``None`` first)."""

    @abstractmethod
    def inspect(self, result: Result | None, step: Call | Finish) -> Evidence:
        """Verified progress from trusted records after a step."""
