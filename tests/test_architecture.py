"""The layers of docs/architecture.md, enforced: each module imports only from its own layer
or the layers below it, a few doors are narrower still, and SQL is written in the store.

Read from the source (the import statements), so a new module is covered as soon as it
exists: it must be given a layer below and a row in the document's table, or this test
fails and says so.
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from guard.contrib import INTEGRATIONS

ROOT = Path(__file__).resolve().parents[1]

# Lowest first, by folder: each folder of console/ is a layer (console/records/, store/,
# drivers/, web/, api/), and the modules Django and Celery want at the top (models, apps,
# migrations, tasks, templatetags, management) are placed by name, as are services,
# selectors and lifecycle. A module's layer is that of the longest prefix listed for it; the
# package itself, "console", is its __init__ only. docs/architecture.md's table says the same.
LAYERS: dict[str, int] = {
    "guard": 0,
    # The console's values and records: models (their app and migrations), redaction, input
    # checks, spend, roles, logs (console/records/), agents' base.
    "console.models": 1,
    "console.records": 1,
    "console.agents": 1,
    "console.apps": 1,
    "console.migrations": 1,
    # One owner per state machine: the task's, an approval's, a notice's moves; and the
    # roll-ups a task's moves keep right (beat rolls, lifecycle takes a moving task out).
    "console.lifecycle": 2,
    "console.rollups": 2,
    # Everything that persists a guard step, one implementation per database, the few
    # statements of the services, and the prepared statements that run the store's texts.
    "console.store": 3,
    # Drivers over the store: the hosted runner (and the Celery tasks that call it), the
    # guard's Ledger, the trace events both drivers write, the notices' outbox and delivery.
    "console.drivers": 4,
    "console.tasks": 4,
    # The attached driver (console/drivers/attached/, its parts all at this layer): a client's
    # step requests, over the store. It starts its task through the services (and takes their
    # errors and the goal lock), so it sits with them.
    "console.drivers.attached": 5,
    # What people and clients ask for: services (writes) and selectors (reads).
    "console.services": 5,
    "console.selectors": 5,
    # HTTP: the pages (console/web/: views, forms, charts, /healthz, /metrics) and the JSON
    # API (console/api/: its URL map, views, serializers, OpenAPI document, tokens).
    "console.web": 6,
    "console.api": 6,
    "console.templatetags": 6,
    # The demo app: a business system and agents, started like any other agents.
    "console.demo": 7,
    # Entry points and configuration: settings, URLs, Celery, `manage.py up`, the health probe.
    "console.project": 8,
    "console.settings": 8,  # the settings' old name, kept with a warning
    "console.management": 8,
    "console": 8,  # the package's face: it loads the Celery app
}

# Narrower doors, whatever the layers say: module -> the only product modules that may
# import it (besides its own package).
ONLY_FROM: dict[str, set[str]] = {
    # Only Celery runs the hosted driver; services enqueue through console.tasks.
    "console.drivers.runner": {"console.tasks"},
    # Only drivers touch the step store.
    "console.store": {"console.drivers"},
    # The services' own statements (the token check, the goal lock, the health probe, the
    # snapshot /metrics reads in): their callers only.
    "console.store.queries": {
        "console.api.tokens",
        "console.services",
        "console.web.health",
        "console.web.metrics",
    },
    # The history tables' partitions: only the beat's task makes them, and the archives
    # read which there are.
    "console.store.history": {"console.tasks", "console.store.archive"},
    # A partition taken out of the database only once its file is written and checked: by
    # the archives' driver alone.
    "console.store.archive": {"console.drivers.archive"},
    # Prepared statements run the store's texts, and only the store's.
    "console.store.statements": {"console.store"},
    # The product does not depend on its demo; only the demo's own entry points start it.
    "console.demo": {"console.project.launcher", "console.management.commands.demo"},
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
    if prefix is None or (prefix == "console" and name != "console"):
        return None  # "console" is the package's face, not a layer for what has none
    return LAYERS[prefix]


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
    module: integration.imports for integration in INTEGRATIONS for module in integration.modules
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


def test_every_integration_is_a_module_of_the_guard() -> None:
    assert set(FRAMEWORKS) <= {name for name, _ in MODULES}


def test_pyproject_has_the_extra_of_every_integration_and_no_other_framework_extra() -> None:
    import tomllib

    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    guard_distribution = pyproject["tool"]["loopguard"]["guard-distribution"]
    guards, name = guard_distribution["optional-dependencies"], guard_distribution["name"]
    consoles = pyproject["project"]["optional-dependencies"]
    extras = [integration.extra for integration in INTEGRATIONS]

    assert sorted(guards) == sorted(extras)  # the guard's extras are its integrations'
    # The console's distribution passes each one on (`loopguard-console[langchain]`), and
    # passes on nothing else of the guard's.
    passed_on = {extra: needs for extra, needs in consoles.items() if any(name in n for n in needs)}
    assert passed_on == {extra: [f"{name}[{extra}]"] for extra in extras}


def test_the_test_command_installs_the_extra_of_every_integration() -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("manage", ROOT / "manage.py")
    assert spec is not None and spec.loader is not None
    manage = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(manage)

    installed = manage.extras_for_tests().split(",")

    # "otel": the trace's OpenTelemetry exporter (console/drivers/otel.py), tested every run.
    expected = ["dev", "model", "otel", *(i.extra for i in INTEGRATIONS)]
    assert sorted(installed) == sorted(expected)


def test_the_rules_would_catch_an_upward_import(tmp_path: Path) -> None:
    # The check itself: a model importing a view is refused.
    fake = tmp_path / "models.py"
    fake.write_text("from console.web import views\nfrom .services import task_stop\n")
    found = [t for _, t in imports_of("console.models", fake)]
    assert found == ["console.web.views", "console.services"]
    assert all((layer(t) or 0) > LAYERS["console.models"] for t in found)


# -- docs/architecture.md's table is this test's -------------------------------------------

DOCUMENT = ROOT / "docs" / "architecture.md"


def console_parts() -> list[str]:
    """The package's face and every module and package directly in console/."""
    found = ["console"]
    for path in sorted((ROOT / "console").iterdir()):
        if path.suffix == ".py" and path.name != "__init__.py":
            found.append(f"console.{path.stem}")
        elif (path / "__init__.py").is_file():
            found.append(f"console.{path.name}")
    return found


def module_of_path(written: str) -> str:
    """``console/store/`` → console.store, ``console/api/tokens.py`` → console.api.tokens,
    ``console/__init__.py`` → console."""
    path = Path(written.rstrip("/"))
    parts = list(path.with_suffix("").parts if path.suffix == ".py" else path.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def documented_layers(text: str) -> list[tuple[str, int]]:
    """(module, layer) for every module named in the modules column of the document's
    table of layers (``| layer | modules | … |``), in the order written."""
    lines = text.splitlines()
    heading = re.compile(r"\|\s*layer\s*\|\s*modules\s*\|")
    header = next((i for i, line in enumerate(lines) if heading.match(line)), None)
    assert header is not None, "no table of layers (| layer | modules | … |)"
    placed = []
    for line in lines[header + 2 :]:
        if not line.startswith("|"):
            break
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        placed += [(module_of_path(p), int(cells[0])) for p in re.findall(r"`([^`]+)`", cells[1])]
    return placed


def test_every_console_module_is_placed_by_name_in_the_test_and_the_document() -> None:
    documented = {name for name, _ in documented_layers(DOCUMENT.read_text())}
    assert [name for name in console_parts() if name not in LAYERS] == []
    assert [name for name in console_parts() if name not in documented] == []


def test_the_document_places_each_module_once_and_as_the_test_does() -> None:
    placed = documented_layers(DOCUMENT.read_text())
    names = [name for name, _ in placed]
    assert sorted({name for name in names if names.count(name) > 1}) == []
    disagree = [
        f"{name}: document {dict(placed).get(name)}, test {LAYERS.get(name)}"
        for name in sorted(set(names) | set(LAYERS))
        if dict(placed).get(name) != LAYERS.get(name)
    ]
    assert disagree == []
    assert [name for name in LAYERS if not is_module(name)] == []  # no stale row either


def test_the_document_check_reads_a_table_and_would_catch_a_module_in_the_wrong_row() -> None:
    table = (
        "| layer | modules | what |\n| ---: | --- | --- |\n"
        "| 5 | `console/services.py`, `console/drivers/attached/` | the `services` |\n"
        "| 3 | `console/store/`, `console/store/statements.py` | the store |\n"
        "| 8 | `console/__init__.py` | its face |\n\nAfter: `console/web/views.py`\n"
    )
    found = documented_layers("# Layers\n\n" + table)
    assert found == [
        ("console.services", 5),
        ("console.drivers.attached", 5),
        ("console.store", 3),
        ("console.store.statements", 3),
        ("console", 8),
    ]
    moved = documented_layers(table.replace("| 5 |", "| 4 |"))
    assert dict(moved)["console.drivers.attached"] != LAYERS["console.drivers.attached"]


# -- SQL only in console/store/ ------------------------------------------------------------

# A string that starts a statement: its first word in upper case, as this code writes SQL
# (prose does not start so).
SQL_TEXT = re.compile(
    r"\s*(SELECT|INSERT|UPDATE|DELETE|WITH|MERGE|CREATE|ALTER|DROP|TRUNCATE|LOCK|COPY"
    r"|PRAGMA|VACUUM|ANALYZE|EXPLAIN|SET|BEGIN|COMMIT|ROLLBACK|SAVEPOINT)\b"
)
# Calls that open a database cursor or hand the database text to run.
SQL_CALLS = {"cursor", "execute", "executemany", "executescript", "raw", "extra", "RawSQL"}

# Outside console/store/ (and the migrations), what may write SQL ("writes": its text) or
# run it ("runs": a cursor, an execute), and why. An entry that no longer applies fails
# too, so that this stays the list of what is true.
SQL_ELSEWHERE: dict[str, tuple[set[str], str]] = {
    "console.store.statements": (
        {"runs"},
        "runs the store's texts as prepared statements; only the store imports it",
    ),
    "console.project.launcher": (
        {"runs", "writes"},
        "`manage.py up` looks for the console's database in the server's catalogue and "
        "creates it: before Django is set up, so before the store can be imported",
    ),
    "console.project.settings": (
        {"writes"},
        "SQLite's connection pragmas (WAL), which Django runs as it opens a connection",
    ),
}


def sql_of(path: Path) -> Iterator[tuple[str, int, str]]:
    """("writes" | "runs", line, what) for each SQL text and each cursor call in ``path``;
    docstrings and comments are prose, not SQL."""
    tree = ast.parse(path.read_text(), str(path))
    # A string standing alone (a docstring) is prose; an f-string's parts are read whole.
    skip = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr)}
    skip |= {
        id(v) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for v in node.values
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr | ast.Constant) and id(node) not in skip:
            text = (
                "".join(str(v.value) if isinstance(v, ast.Constant) else "{}" for v in node.values)
                if isinstance(node, ast.JoinedStr)
                else node.value
            )
            if isinstance(text, str) and SQL_TEXT.match(text):
                yield "writes", node.lineno, " ".join(text.split())[:60]
        if isinstance(node, ast.Call):
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if called in SQL_CALLS:
                yield "runs", node.lineno, f"{called}()"


OUTSIDE_THE_STORE = [
    (name, path)
    for name, path in MODULES
    if within(name, "console")
    and not within(name, "console.store")
    and "migrations" not in name.split(".")
]


@pytest.mark.parametrize(
    ("name", "path"), OUTSIDE_THE_STORE, ids=[name for name, _ in OUTSIDE_THE_STORE]
)
def test_no_module_outside_the_store_writes_or_runs_sql(name: str, path: Path) -> None:
    allowed, why = SQL_ELSEWHERE.get(name, (set(), ""))
    found = list(sql_of(path))
    assert [
        f"line {line}: {kind} {what}" for kind, line, what in found if kind not in allowed
    ] == []
    stale = allowed - {kind for kind, _, _ in found}
    assert not stale, f"{name} no longer {' or '.join(sorted(stale))} SQL ({why}): drop it"


def test_the_sql_check_would_catch_a_statement_and_not_prose(tmp_path: Path) -> None:
    fake = tmp_path / "services.py"
    fake.write_text(
        '"""SELECT … FOR UPDATE is prose here."""\n'
        "def lock(key, cursor):\n"
        '    """UPDATE: also prose."""\n'
        '    cursor.execute("SELECT pg_advisory_xact_lock(%s)", [key])\n'
        "    table = 'console_task'\n"
        '    return f"DELETE FROM {table}", "Select a task", "updated"\n'
    )
    assert sorted(sql_of(fake)) == [
        ("runs", 4, "execute()"),
        ("writes", 4, "SELECT pg_advisory_xact_lock(%s)"),
        ("writes", 6, "DELETE FROM {}"),
    ]
