"""Moved: the settings are ``console.project.settings``.

This module keeps an existing ``DJANGO_SETTINGS_MODULE=console.settings`` and a settings
module of your own that starts ``from console.settings import *`` working, with a warning,
until the next minor release.
"""

import warnings

from console.project.settings import *  # noqa: F403

warnings.warn(
    "console.settings is now console.project.settings; point DJANGO_SETTINGS_MODULE and "
    "your own settings module's import there",
    DeprecationWarning,
    stacklevel=2,
)
