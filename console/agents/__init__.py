"""Hosted agents: a planner, tool adapters and an inspector, registered by dotted path.

``settings.LOOPGUARD_AGENTS`` maps an agent name to the dotted path of an
:class:`~console.agents.base.Agent` subclass; users plug in their own the same way, in a
settings module of their own or, without one, through ``LOOPGUARD_EXTRA_AGENTS`` (read by
:func:`agents_from_environment`).
"""

from __future__ import annotations

import re
from functools import cache

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

from console.agents.base import Agent, Tool, UnknownAgent

__all__ = [
    "Agent",
    "AgentNotLoadable",
    "Tool",
    "UnknownAgent",
    "agent_class",
    "agent_names",
    "agents_from_environment",
]

# A name goes into URLs, form choices, log lines and Task.agent (100 characters).
_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,99}")


class AgentNotLoadable(ImportError):
    """An agent is registered, but its dotted path does not lead to an Agent subclass.

    An ``ImportError``, so that code which already skips an agent that fails to import
    (the start page's list) skips this one too.
    """


def agents_from_environment(
    value: str, *, variable: str = "LOOPGUARD_EXTRA_AGENTS"
) -> dict[str, str]:
    """Read ``name=package.module.Class`` entries, separated by commas, into a name → path map.

    Settings merge the result over the built-in agents, so an operator can add an agent (or
    point a built-in name elsewhere) from the environment alone. Only the spelling is checked
    here, while settings load; the import happens when the agent is first used (see
    :func:`agent_class`), because importing an agent module may need Django's apps ready.
    Raises ``ImproperlyConfigured`` naming ``variable`` and the entry that is wrong.
    """
    agents: dict[str, str] = {}
    for entry in value.split(","):
        if not entry.strip():
            continue  # blanks around commas, a trailing comma
        name, equals, path = (part.strip() for part in entry.partition("="))
        if not equals:
            raise ImproperlyConfigured(
                f"{variable}: {entry.strip()!r} is not name=package.module.Class"
            )
        if not _NAME.fullmatch(name):
            raise ImproperlyConfigured(
                f"{variable}: {name!r} is not an agent name (a letter, then letters, digits, "
                "'_' or '-', at most 100 characters)"
            )
        parts = path.split(".")
        if len(parts) < 2 or not all(part.isidentifier() for part in parts):
            raise ImproperlyConfigured(
                f"{variable}: agent {name!r} has {path!r}, which is not a dotted path to a "
                "class (package.module.Class)"
            )
        if name in agents:
            # Two paths for one name: which one the operator meant cannot be guessed.
            raise ImproperlyConfigured(f"{variable}: agent {name!r} is given twice")
        agents[name] = path
    return agents


def agent_names() -> list[str]:
    """The registered agent names, in settings order."""
    return list(settings.LOOPGUARD_AGENTS)


@cache
def _load(name: str, path: str) -> type[Agent]:
    try:
        cls = import_string(path)
    except ImportError as error:
        raise AgentNotLoadable(
            f"agent {name!r} is registered as {path!r}, which cannot be imported: {error}"
        ) from error
    if not (isinstance(cls, type) and issubclass(cls, Agent)):
        raise AgentNotLoadable(
            f"agent {name!r} is registered as {path!r}, which is not an Agent subclass"
        )
    return cls


def agent_class(name: str) -> type[Agent]:
    """The agent class registered as ``name``.

    Raises :class:`UnknownAgent` if no agent has that name, and :class:`AgentNotLoadable`
    (naming the agent and its path) if its path does not import or is not an Agent.
    """
    try:
        path = settings.LOOPGUARD_AGENTS[name]
    except KeyError:
        raise UnknownAgent(f"there is no agent named {name!r}") from None
    return _load(name, path)
