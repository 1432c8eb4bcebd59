"""The layers of docs/architecture.md, enforced: each module imports only from its own layer
or the layers below it, and a few doors are narrower still.

Read from the source (the import statements), so a new module is covered as soon as it
exists: it must be given a layer below, or this test fails and says so.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Lowest first. A module's layer is that of the longest prefix listed for it.
LAYERS: dict[str, int] = {
    "guard": 0,
    # The console's values and records: models, redaction, input checks, roles, logs, agents'
    # base.
    "console.models": 1,
    "console.redaction": 1,
    "console.inputs": 1,
    "console.spend": 1,
    "console.roles": 1,
    "console.logs": 1,
    "console.statements": 1,
    "console.agents": 1,
    "console.apps": 1,
    "console.migrations": 1,
    # One owner per state machine: the task's moves (operations' go by guard.steps).
    "console.lifecycle": 2,
    # Everything that persists a guard step, one implementation per database.
    "console.store": 3,
    # Drivers over the store: the hosted runner (and the Celery tasks that call it), and
    # the trace events both drivers write.
    "console.ledger": 4,
    "console.runner": 4,
    "console.trace": 4,
    "console.tasks": 4,
    # Notifications' outbox and delivery: below the Celery tasks that run it.
    "console.notifications": 4,
    # What people and clients ask for: services (writes), selectors (reads) and their kin.
    "console.services": 5,
    # The attached driver: a client's step requests, over the store, starting through the
    # services.
    "console.attached": 5,
    "console.selectors": 5,
    "console.tokens": 5,
    "console.health": 5,
    "console.serializers": 5,
    "console.metrics": 5,
    # HTTP: pages and the JSON API.
    "console.forms": 6,
    "console.views": 6,
    "console.notification_views": 6,
    "console.api_views": 6,
    "console.api": 6,
    "console.openapi": 6,
    "console.templatetags": 6,
    "console.charts": 6,
    # The demo app: a business system and agents, started like any other agents.
    "console.demo": 7,
    # Entry points and configuration.
    "console.project": 8,
    "console.launcher": 8,
    "console.healthcheck": 8,
    "console.management": 8,
    "console": 8,  # the package's face: it loads the Celery app
}

# Narrower doors, whatever the layers say: module -> the only product modules that may
# import it (besides its own package).
ONLY_FROM: dict[str, set[str]] = {
    # Only Celery runs the hosted driver; services enqueue through console.tasks.
    "console.runner": {"console.tasks"},
    # Only drivers touch the step store: the hosted runner and the attached driver.
    "console.store": {"console.ledger", "console.runner", "console.attached"},
    # The product does not depend on its demo; only the demo's own entry points start it.
    "console.demo": {"console.launcher", "console.management.commands.demo"},
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def product_modules() -> Iterator[tuple[str, Path]]:
    for package in ("guard", "console"):
        for path in sorted((ROOT / package).rglob("*.py")):
            yield module_name(path), path


def imports_of(name: str, path: Path) -> Iterator[tuple[int, str]]:
    """(line, imported module) for every import in ``path``, relative ones resolved."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            # `from console import services` imports the module console.services;
            # `from console.models import Task` imports console.models.
            names = [f"{base}.{alias.name}" for alias in node.names]
            modules = [name for name in names if is_module(name)]
            for target in modules or [base]:
                yield node.lineno, target


def is_module(name: str) -> bool:
    path = ROOT.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def owner(name: str, table: dict[str, int] | dict[str, set[str]]) -> str | None:
    found = [p for p in table if within(name, p)]
    return max(found, key=len) if found else None


def within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def layer(name: str) -> int | None:
    prefix = owner(name, LAYERS)
    return None if prefix is None else LAYERS[prefix]


def product(name: str) -> bool:
    return name.split(".")[0] in ("guard", "console")


MODULES = list(product_modules())


def test_every_module_of_the_product_has_a_layer() -> None:
    assert [name for name, _ in MODULES if layer(name) is None] == []


@pytest.mark.parametrize(("name", "path"), MODULES, ids=[name for name, _ in MODULES])
def test_each_module_imports_only_from_its_layer_or_below(name: str, path: Path) -> None:
    mine = layer(name)
    assert mine is not None
    upward = [
        f"line {line}: {target} (layer {layer(target)} above {mine})"
        for line, target in imports_of(name, path)
        if product(target) and (layer(target) or 0) > mine
    ]
    assert upward == []


@pytest.mark.parametrize(("name", "path"), MODULES, ids=[name for name, _ in MODULES])
def test_the_narrow_doors_are_kept(name: str, path: Path) -> None:
    crossed = []
    for line, target in imports_of(name, path):
        door = owner(target, ONLY_FROM) if product(target) else None
        if door is None or within(name, door):
            continue
        if not any(within(name, allowed) for allowed in ONLY_FROM[door]):
            crossed.append(f"line {line}: {target}")
    assert crossed == []


# The framework integrations each import their own framework (an optional extra), and
# nothing else from outside; tests/guard/test_isolation.py checks `import guard` loads none.
FRAMEWORKS = {
    "guard.langchain": {"langchain", "langchain_core", "langgraph"},
    "guard.openai_agents": {"agents"},
}


def test_the_guard_imports_nothing_but_the_standard_library_and_itself() -> None:
    outside = [
        f"{name} line {line}: {target}"
        for name, path in MODULES
        if name.split(".")[0] == "guard"
        for line, target in imports_of(name, path)
        if target.split(".")[0] not in ("guard", "__future__")
        and target.split(".")[0] not in sys.stdlib_module_names
        and target.split(".")[0] not in FRAMEWORKS.get(name, set())
    ]
    assert outside == []


def test_the_rules_would_catch_an_upward_import(tmp_path: Path) -> None:
    # The check itself: a model importing a view is refused.
    fake = tmp_path / "models.py"
    fake.write_text("from console import views\nfrom .services import task_stop\n")
    found = [t for _, t in imports_of("console.models", fake)]
    assert found == ["console.views", "console.services"]
    assert all((layer(t) or 0) > LAYERS["console.models"] for t in found)
