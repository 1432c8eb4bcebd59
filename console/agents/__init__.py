"""Hosted agents: a planner, tool adapters and an inspector, registered by dotted path.

``settings.LOOPGUARD_AGENTS`` maps an agent name to the dotted path of an
:class:`~console.agents.base.Agent` subclass; users plug in their own the same way.
"""

from __future__ import annotations

from functools import cache

from django.conf import settings
from django.utils.module_loading import import_string

from .base import Agent, Tool, UnknownAgent

__all__ = ["Agent", "Tool", "UnknownAgent", "agent_class", "agent_names"]


def agent_names() -> list[str]:
    """The registered agent names, in settings order."""
    return list(settings.LOOPGUARD_AGENTS)


@cache
def _load(path: str) -> type[Agent]:
    cls = import_string(path)
    if not (isinstance(cls, type) and issubclass(cls, Agent)):
        raise TypeError(f"{path} is not an Agent subclass")
    return cls


def agent_class(name: str) -> type[Agent]:
    """The agent class registered as ``name``; raises :class:`UnknownAgent` otherwise."""
    try:
        path = settings.LOOPGUARD_AGENTS[name]
    except KeyError:
        raise UnknownAgent(f"there is no agent named {name!r}") from None
    return _load(path)
