"""What a hosted agent is: planner, tools (read/write, optional lookup) and inspector."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

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
    reconcilers settle an ``UNKNOWN`` write without guessing.
    """

    name: str
    effect: Effect
    run: Callable[[Call], Result]
    lookup: Callable[[str], Settlement] | None = None
    description: str = ""


class Agent(ABC):
    """One agent working on one task.

    The runner builds a fresh instance for every stretch it drives (a phase, or the rest of
    one after a crash) with the task's id, input and ``memory``: a JSON-ready dict the agent
    keeps its conversation or progress in. The runner saves ``memory`` after every step, so
    whatever the agent needs to go on after a restart must be in it.

    ``plan`` stands for the model: it returns a :class:`~guard.Call`, a list of them or a
    :class:`~guard.Finish`, and reports model usage by setting ``self.tokens``.
    ``inspect`` must read trusted records (the business system), never the model's word.
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

    def __init__(self, task_id: int, input: Mapping[str, Any], memory: dict[str, Any]) -> None:
        self.task_id = task_id
        self.input = input
        self.memory = memory
        self.tokens = 0

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
