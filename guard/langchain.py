"""``guard.langchain``: the integration's old name, kept for those who import it so; it lives in
:mod:`guard.contrib.langchain` (the integrations' folder, ``guard/contrib/``)."""

from .contrib.langchain import *  # noqa: F403 - the same names, whatever the integration exports
from .contrib.langchain import __all__ as __all__
