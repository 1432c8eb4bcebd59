"""The two distributions `python3 manage.py dist` builds from this repository, as the people
who install them get them: ``loopguard-guard`` (guard/ alone, standard library only, with
the framework extras) and ``loopguard-console`` (console/, depending on that guard and
shipping no copy of it). PyPI's ``loopguard`` and ``loopguard-ai`` are other projects.

The last test is an agent developer's first hour: the guard's wheel with its ``langchain``
extra in an empty virtual environment — no Django, no checkout on the path — runs the agent
guide's attached LangChain example, as printed, against a live console. Its packages come
from the package index through pip's cache, so after the first run they cost seconds.
"""

from __future__ import annotations

import email.parser
import os
import re
import sys
import zipfile
from email.message import Message
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

from console.api.tokens import api_token_issue
from console.models import Operation, OperationState, Task, TaskState
from console.records.roles import Role, assign
from tests.docs.test_integration_examples import example_source, promised_output
from tests.processes import run

ROOT = Path(__file__).resolve().parents[2]
GUARD, CONSOLE = "loopguard-guard", "loopguard-console"
# What an agent that only needs the guard must never be made to install.
SERVER_SIDE = {"django", "celery", "psycopg", "redis", "gunicorn", "whitenoise"}
ATTACH = "## Attach an agent you already have"

pytestmark = pytest.mark.slow  # building a wheel takes seconds


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Both wheels, built by the command the docs give (into a folder of this test's)."""
    out = tmp_path_factory.mktemp("dist")
    done = run([sys.executable, str(ROOT / "manage.py"), "dist", "--out", str(out)], timeout=600)
    assert done.returncode == 0, done.stderr
    built = {name: [Path(line) for line in done.stdout.split() if _is_wheel_of(name, line)]
             for name in (GUARD, CONSOLE)}  # fmt: skip
    assert all(len(paths) == 1 for paths in built.values()), done.stdout
    return {name: paths[0] for name, paths in built.items()}


def _is_wheel_of(name: str, path: str) -> bool:
    return Path(path).name.startswith(name.replace("-", "_") + "-") and path.endswith(".whl")


def files(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as archive:
        return archive.namelist()


def metadata(wheel: Path) -> Message:
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        return email.parser.Parser().parsestr(archive.read(name).decode())


def requirements(wheel: Path) -> list[Requirement]:
    return [Requirement(line) for line in metadata(wheel).get_all("Requires-Dist") or []]


EXTRAS = ("langchain", "openai-agents", "mcp", "model", "dev", "bench")


def extras_of(requirement: Requirement) -> set[str]:
    """Under which of our extras ``requirement`` is installed ("": with none)."""
    marker = requirement.marker
    return {e for e in ("", *EXTRAS) if marker is None or marker.evaluate({"extra": e})}


# -- the guard's wheel ----------------------------------------------------------------------


def test_the_guard_wheel_holds_guard_alone(wheels: dict[str, Path]) -> None:
    names = set(files(wheels[GUARD]))
    version = metadata(wheels[GUARD])["Version"]

    tops = {name.split("/")[0] for name in names}
    assert tops == {"guard", f"loopguard_guard-{version}.dist-info"}  # no console/
    assert {"guard/__init__.py", "guard/remote/__init__.py", "guard/contrib/langchain.py"} <= names
    # Every module of the checkout's guard/, its packages' too (guard/remote/ is one).
    checkout = ROOT / "guard"
    assert {f"guard/{p.relative_to(checkout).as_posix()}" for p in checkout.rglob("*.py")} <= names
    assert "guard/py.typed" in names  # its types reach the agent's mypy


def test_the_guard_wheel_installs_nothing_but_itself_without_an_extra(
    wheels: dict[str, Path],
) -> None:
    meta = metadata(wheels[GUARD])
    needs = requirements(wheels[GUARD])

    assert (meta["Name"], meta["Requires-Python"]) == (GUARD, ">=3.12")
    assert [str(r) for r in needs if "" in extras_of(r)] == []  # not even Django
    assert not {r.name.lower() for r in needs} & SERVER_SIDE  # nor with an extra


def test_the_guard_wheel_has_the_framework_extras_with_their_pins(
    wheels: dict[str, Path],
) -> None:
    needs = requirements(wheels[GUARD])

    assert set(metadata(wheels[GUARD]).get_all("Provides-Extra") or []) == {
        "langchain", "openai-agents", "mcp"
    }  # fmt: skip
    pins = {(r.name, r.specifier, frozenset(extras_of(r))) for r in needs}
    assert pins == {
        ("langchain", SpecifierSet(">=1.2,<2"), frozenset({"langchain"})),
        ("openai-agents", SpecifierSet(">=0.20,<1"), frozenset({"openai-agents"})),
        ("mcp", SpecifierSet(">=2.3,<3"), frozenset({"mcp"})),
    }


def test_the_guard_wheel_has_the_mcp_gateways_command(wheels: dict[str, Path]) -> None:
    with zipfile.ZipFile(wheels[GUARD]) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/entry_points.txt")]
        entry_points = archive.read(name).decode()
    assert "[console_scripts]\nloopguard-mcp-gateway = guard.contrib.mcp:main" in entry_points


# -- the console's wheel --------------------------------------------------------------------


def test_the_console_wheel_ships_no_copy_of_the_guard(wheels: dict[str, Path]) -> None:
    names = set(files(wheels[CONSOLE]))

    assert not [name for name in names if name.startswith("guard/")]
    assert {
        "console/__init__.py",
        "console/drivers/attached/__init__.py",
        "console/migrations/__init__.py",
    } <= names


def test_the_console_wheel_depends_on_the_guard_of_its_own_version(
    wheels: dict[str, Path],
) -> None:
    meta = metadata(wheels[CONSOLE])
    needs = {(r.name, str(r.specifier), frozenset(r.extras), frozenset(extras_of(r)))
             for r in requirements(wheels[CONSOLE]) if r.name == GUARD}  # fmt: skip

    assert meta["Name"] == CONSOLE
    assert meta["Version"] == metadata(wheels[GUARD])["Version"]
    assert needs == {
        (GUARD, f"=={meta['Version']}", frozenset(), frozenset({"", *EXTRAS})),
        (GUARD, "", frozenset({"langchain"}), frozenset({"langchain"})),
        (GUARD, "", frozenset({"openai-agents"}), frozenset({"openai-agents"})),
        (GUARD, "", frozenset({"mcp"}), frozenset({"mcp"})),
    }


# -- the names people are told to install ---------------------------------------------------

# `loopguard[...]` or a bare `pip install loopguard`: PyPI's loopguard is someone else's.
TAKEN_NAME = re.compile(r"(?<![-\w])loopguard\[|pip install ['\"]?loopguard(?![-\w])")


def test_no_doc_or_message_sends_people_to_the_name_pypi_gives_another_project() -> None:
    here = Path(__file__).resolve()
    texts = [
        ROOT / "README.md", ROOT / "manage.py", ROOT / "console" / "Dockerfile",
        *ROOT.glob("docs/*.md"), *ROOT.glob("guard/**/*.py"), *ROOT.glob("console/**/*.py"),
        *ROOT.glob("benchmarks/*.py"), *(p for p in ROOT.glob("tests/**/*.py") if p != here),
    ]  # fmt: skip
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in texts
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if TAKEN_NAME.search(line)
    ]
    assert found == [], "use loopguard-guard[...] or loopguard-console[...]:\n" + "\n".join(found)


# -- the guard's wheel alone, in an empty virtual environment -------------------------------


def _outside_this_checkout() -> dict[str, str]:
    """This environment without what would put the checkout or .venv on a Python's path."""
    drop = {"PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "DJANGO_SETTINGS_MODULE"}
    env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("PYTEST_")}
    # pip's cache stays on (its default place): the second run installs without downloading.
    return {**env, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "NO_PROXY": "*"}


def _run(command: list[str], cwd: Path, env: dict[str, str]) -> str:
    done = run(command, cwd=cwd, env=env, timeout=900)
    assert done.returncode == 0, f"{command}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.mark.django_db(transaction=True)
def test_the_guard_wheel_alone_runs_the_guides_attached_langchain_agent(
    wheels: dict[str, Path], tmp_path: Path, live_server: Any
) -> None:
    env = _outside_this_checkout()
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], tmp_path, env)
    python = str(venv / "bin" / "python")
    _run([python, "-m", "pip", "install", "--quiet", f"{wheels[GUARD]}[langchain]"], tmp_path, env)
    installed = _run([python, "-m", "pip", "list", "--format=freeze"], tmp_path, env)
    # -I: the venv's own packages only (no PYTHONPATH, user site or working directory).
    probe = "import guard, importlib.util as u; print(guard.__file__, u.find_spec('django'))"
    where = _run([python, "-I", "-c", probe], tmp_path, env)

    user = User.objects.create_user("incident-bot")
    assign(user, [Role.AGENT])
    token = api_token_issue(user=user, name="clean-venv")[1]
    source = example_source("attach-langchain", ATTACH)
    (tmp_path / "attach_langchain.py").write_text(source)
    printed = _run(
        [python, "-I", "attach_langchain.py"],
        tmp_path,
        {**env, "LOOPGUARD_URL": str(live_server.url), "LOOPGUARD_TOKEN": token},
    )
    print(f"installed in {venv}:\n{installed}guard from: {where}the example printed:\n{printed}")

    names = {line.split("==")[0].lower() for line in installed.splitlines()}
    assert GUARD in names and "langchain" in names
    assert not names & SERVER_SIDE, "the guard's wheel pulled in the console's dependencies"
    module, django = where.split()
    assert Path(module).is_relative_to(venv) and django == "None"
    assert printed.splitlines() == promised_output(source)
    task = Task.objects.get(agent="incident-bot")
    assert (task.state, task.reason) == (TaskState.PARTIAL, "goal_unverified")
    assert task.client == "incident-service/1 (langchain)"
    operation = Operation.objects.get(task=task)
    assert operation.key.startswith("incident-42-first-notice-")  # the example's run id
    assert (operation.state, operation.task_id, operation.attempts) == (
        OperationState.COMMITTED, task.id, 1
    )  # fmt: skip
