"""What a deployment or an agent developer wrote against 0.1 keeps working through 0.2, with a
warning that says where the name went (docs/deployment.md, "Names that moved in 0.2")."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import pytest

from tests.processes import run_python

ROOT = Path(__file__).resolve().parents[1]


def test_the_old_settings_module_still_configures_the_console_and_says_where_it_went() -> None:
    script = (
        "import warnings, django\n"
        "warnings.simplefilter('always')\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    django.setup()\n"
        "from django.conf import settings\n"
        "print(settings.ROOT_URLCONF)\n"
        "print([str(w.message) for w in caught if w.category is DeprecationWarning])\n"
    )
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "console.settings"}
    done = run_python(script, env=env, timeout=60)

    assert done.returncode == 0, done.stderr
    urlconf, said = done.stdout.splitlines()[-2:]
    assert urlconf == "console.project.urls"
    assert "console.project.settings" in said


@pytest.mark.parametrize(
    ("name", "home"),
    [
        ("Action", "guard.steps"),
        ("Ticket", "guard.steps"),
        ("LedgerError", "guard.steps"),
        ("fingerprint", "guard.steps"),
        ("ToolSpec", "guard.adapters"),
        ("calls_from_openai", "guard.adapters"),
    ],
)
def test_a_name_that_left_the_guards_top_level_still_imports_with_a_warning(
    name: str, home: str
) -> None:
    import importlib

    import guard

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        found = getattr(guard, name)

    assert found is getattr(importlib.import_module(home), name)
    assert [w.category for w in caught] == [DeprecationWarning]
    assert home in str(caught[0].message)
    assert name not in guard.__all__


def test_a_name_the_guard_never_had_is_still_an_attribute_error() -> None:
    import guard

    with pytest.raises(AttributeError, match="no_such_name"):
        guard.no_such_name  # noqa: B018
