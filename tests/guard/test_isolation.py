"""The guard is a standard-library-only package: agent developers can embed it anywhere.

Importing it must not drag in the console's stack (Django, Celery, the PostgreSQL driver,
Redis), and no module under ``guard/`` may import anything outside the standard library.
"""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

import pytest

import guard
from guard.contrib import INTEGRATIONS as TABLE
from tests.processes import clean_environment, run_python

GUARD_DIR = Path(guard.__file__).resolve().parent
# Every module, its packages' too (guard/remote/), by its path in guard/: "remote/_guard.py".
MODULES = sorted(GUARD_DIR.rglob("*.py"))
CONSOLE_STACK = ("django", "celery", "kombu", "psycopg", "psycopg2", "redis")
# The framework integrations (guard/contrib/__init__.py): each imports its own framework (an
# optional extra) and nothing else from outside; `import guard` loads none of them.
INTEGRATIONS = {
    module.removeprefix("guard.").replace(".", "/") + ".py": i.imports
    for i in TABLE
    for module in i.modules
}
FRAMEWORKS = {root for roots in INTEGRATIONS.values() for root in roots} | {"openai"}


def test_importing_guard_loads_none_of_the_consoles_stack() -> None:
    probe = (
        "import json, sys\n"
        "import guard\n"
        "from guard import Guard, InMemoryLedger, Limits\n"
        "Guard(Limits(), ledger=InMemoryLedger())\n"
        "print(json.dumps({'file': guard.__file__, 'modules': sorted(sys.modules)}))\n"
    )
    # A fresh interpreter: this test process has long since imported Django via pytest.
    env = clean_environment(PYTHONPATH=str(GUARD_DIR.parent))  # no DJANGO_SETTINGS_MODULE
    done = run_python(probe, env=env, cwd=GUARD_DIR.parent, timeout=60)
    assert done.returncode == 0, done.stderr

    found = json.loads(done.stdout)
    assert Path(found["file"]).resolve().parent == GUARD_DIR
    loaded = set(found["modules"])
    leaked = {name for name in loaded if name.split(".")[0] in CONSOLE_STACK}
    assert leaked == set()
    frameworks = {name for name in loaded if name.split(".")[0] in FRAMEWORKS}
    assert frameworks == set()
    integrations = {module for integration in TABLE for module in integration.modules}
    assert not (integrations | {"guard.remote"}) & loaded


def imported_roots(path: Path) -> set[str]:
    """Top-level names of the absolute imports in one module (relative ones stay inside)."""
    roots: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


def in_guard(path: Path) -> str:
    return path.relative_to(GUARD_DIR).as_posix()


def test_the_guard_package_has_modules_to_check() -> None:
    names = {in_guard(path) for path in MODULES}
    assert {"__init__.py", "_guard.py", "_ledger.py", "_fingerprint.py"} <= names
    assert {"remote/__init__.py", "remote/_transport.py", "remote/_guard.py"} <= names
    assert set(INTEGRATIONS) <= names  # each integration of the table is checked here


@pytest.mark.parametrize("path", MODULES, ids=in_guard)
def test_every_guard_module_imports_only_the_standard_library(path: Path) -> None:
    outside = imported_roots(path) - set(sys.stdlib_module_names) - {"__future__"}
    assert outside <= INTEGRATIONS.get(in_guard(path), set())


def test_every_guard_module_uses_relative_imports_for_its_own_package() -> None:
    absolute_self = {in_guard(path) for path in MODULES if "guard" in imported_roots(path)}
    assert absolute_self == set()


def test_the_import_check_would_notice_a_third_party_import(tmp_path: Path) -> None:
    module = tmp_path / "sneaky.py"
    module.write_text(
        "import os\nfrom django.conf import settings\nimport redis.client\nfrom . import x\n"
    )
    outside = imported_roots(module) - set(sys.stdlib_module_names)
    assert outside == {"django", "redis"}
