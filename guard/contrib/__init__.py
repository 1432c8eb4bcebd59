"""The framework integrations, named once: for each, the module of ``guard/`` that drives the
guard from one agent framework, the extra of the guard's distribution that installs that
framework, and the top-level packages the module may import beside the standard library.

Nothing in the guard imports this table (``import guard`` loads no integration and no
framework). ``manage.py test`` installs every extra it names, and the tests hold each
module to its imports and the extras of pyproject.toml to the table. It imports nothing of
the guard's and only the standard library, so that manage.py can run it by its path.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["INTEGRATIONS", "Integration"]


@dataclass(frozen=True, slots=True)
class Integration:
    """One framework integration: ``module`` (``guard.contrib.langchain``), the ``extra`` that
    installs its framework (``pip install "loopguard-guard[langchain]"``; the console's
    distribution has the same extra, passed on), and the top-level packages it may
    ``imports`` (the framework's own, which its extra brings); ``parts``, the modules it is
    split into beside it, which may import the same."""

    module: str
    extra: str
    imports: frozenset[str]
    parts: tuple[str, ...] = ()

    @property
    def modules(self) -> tuple[str, ...]:
        """The integration's module and its parts."""
        return (self.module, *self.parts)


INTEGRATIONS: tuple[Integration, ...] = (
    Integration(
        "guard.contrib.langchain",
        "langchain",
        frozenset({"langchain", "langchain_core", "langgraph"}),
    ),
    Integration("guard.contrib.openai_agents", "openai-agents", frozenset({"agents"})),
    # The MCP gateway: the SDK, its protocol's types (a distribution of their own), anyio,
    # whose event loop and threads the SDK runs on, and uvicorn, which serves the SDK's
    # Streamable HTTP app; the SDK brings all three.
    Integration(
        "guard.contrib.mcp",
        "mcp",
        frozenset({"mcp", "mcp_types", "anyio", "uvicorn"}),
        parts=("guard.contrib.mcp_upstreams",),  # mcp_config needs only the standard library
    ),
)
"""Every framework integration. A new one is its module (and any parts it is split into),
its entry here and its extra in pyproject.toml (the guard's distribution's and the
console's, which pip reads from there)."""
