"""``guard.openai_agents``: the integration's old name, kept for those who import it so; it lives in
:mod:`guard.contrib.openai_agents` (the integrations' folder, ``guard/contrib/``)."""

from .contrib.openai_agents import *  # noqa: F403 - the same names, whatever the integration exports
from .contrib.openai_agents import __all__ as __all__
