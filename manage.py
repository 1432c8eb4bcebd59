#!/usr/bin/env python3
"""LoopGuard's single entry point: `up`, `test`, `dist`, or any Django management command.

Everything above `run_django` uses only the standard library, so any python3 (even one too
old for Django) can find a Python 3.12+, build `.venv` and re-exec itself inside it;
pyproject.toml is read only on that Python 3.12+ (tomllib).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import runpy
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
VENV_PYTHON = VENV / "bin" / "python"
STAMP = VENV / ".loopguard-install"  # "<sha256 of pyproject.toml> <extras>"
MIN_VERSION = (3, 12)
REEXEC_MARK = "LOOPGUARD_IN_VENV"
DIST = ROOT / ".loopguard" / "dist"  # where `manage.py dist` puts the wheels (--out to change)
# Where .venv's editable install of the guard's distribution is laid out (pip's place for
# editable sources); its guard/ is a link to this checkout's.
GUARD_EDITABLE = VENV / "src" / "loopguard-guard"
# The framework integrations, each with its extra: named there once.
INTEGRATIONS = ROOT / "guard" / "contrib" / "__init__.py"


def python_version(executable: str | Path) -> tuple[int, int] | None:
    """Return the (major, minor) version of an interpreter, or None if it does not run."""
    code = "import sys; print(*sys.version_info[:2])"
    try:
        out = subprocess.run(
            [str(executable), "-c", code], capture_output=True, text=True, timeout=30, check=True
        ).stdout.split()
        return int(out[0]), int(out[1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def pyenv_roots() -> list[Path]:
    """Return the pyenv roots worth searching: `pyenv root`, $PYENV_ROOT and ~/.pyenv."""
    roots = [os.environ.get("PYENV_ROOT", ""), str(Path.home() / ".pyenv")]
    if shutil.which("pyenv"):
        result = subprocess.run(["pyenv", "root"], capture_output=True, text=True, check=False)
        roots.insert(0, result.stdout.strip())
    return list(dict.fromkeys(Path(r) for r in roots if r))


def find_python(searched: list[str]) -> Path | None:
    """Return the newest Python >= 3.12 found, recording each place looked at in `searched`."""
    if sys.version_info >= MIN_VERSION:
        return Path(sys.executable)
    candidates: list[str | Path] = []
    for name in ("python3.14", "python3.13", "python3.12"):
        searched.append(f"{name} on PATH")
        found = shutil.which(name)  # an inactive pyenv shim is found but fails to run
        if found:
            candidates.append(found)
    for root in pyenv_roots():
        searched.append(f"{root / 'versions'}/3.12+")
        for version_dir in sorted((root / "versions").glob("3.*")):
            if re.fullmatch(r"3\.(\d+)\.\d+", version_dir.name):
                candidates.append(version_dir / "bin" / "python3")
    best: tuple[tuple[int, int], Path] | None = None
    for candidate in candidates:
        version = python_version(candidate)
        if version and version >= MIN_VERSION and (best is None or version > best[0]):
            best = (version, Path(candidate))
    return best[1] if best else None


def fail_no_python(searched: list[str]) -> NoReturn:
    """Say what is missing, where we looked and how to get it; exit with status 2."""
    print(
        "manage.py: LoopGuard needs Python 3.12 or newer, and none was found.\n"
        f"  running interpreter: {sys.executable} (Python {sys.version.split()[0]})\n"
        "  searched:\n    " + "\n    ".join(searched) + "\n"
        "  to get one: `pyenv install 3.13`, or your OS package (e.g. python3.13),\n"
        "  then run the same command again.",
        file=sys.stderr,
    )
    sys.exit(2)


def create_venv() -> None:
    """Create `.venv` with the newest Python >= 3.12 found, replacing an unusable one."""
    searched: list[str] = []
    python = find_python(searched) or fail_no_python(searched)
    print(f"manage.py: creating .venv with {python}", flush=True)
    shutil.rmtree(VENV, ignore_errors=True)
    subprocess.run([str(python), "-m", "venv", str(VENV)], check=True)


def read_pyproject() -> dict[str, Any]:
    """pyproject.toml, parsed; only ever called on a Python 3.12+ (tomllib is 3.11's)."""
    import tomllib

    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


# The guard's distribution takes these from [project] unchanged, and GUARD_OWNS from
# [tool.loopguard.guard-distribution]; it has no dependencies at all.
GUARD_SHARES = ("version", "requires-python", "readme", "license", "authors", "urls")
GUARD_OWNS = ("name", "description", "optional-dependencies", "scripts")
NOT_BUILT = shutil.ignore_patterns("__pycache__", "*.py[cod]")


def toml_value(value: object) -> str:
    """``value`` in TOML: the strings, lists and tables that [project] holds."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {toml_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(item) for item in value) + "]"
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)  # a JSON string is a TOML basic string
    raise TypeError(f"no TOML for {value!r} here")


def guard_pyproject(pyproject: dict[str, Any]) -> str:
    """The guard's own pyproject.toml, written from this repository's one: guard/ alone, no
    dependencies, the extras and names of [tool.loopguard.guard-distribution]."""
    project, own = pyproject["project"], pyproject["tool"]["loopguard"]["guard-distribution"]
    if unknown := sorted(set(own) - set(GUARD_OWNS)):
        sys.exit(
            f"manage.py: [tool.loopguard.guard-distribution] takes only {GUARD_OWNS}, "
            f"not {unknown} (the guard depends on nothing outside the standard library)"
        )
    build = pyproject["build-system"]
    lines = [
        "# Written by `python3 manage.py dist` from the repository's pyproject.toml.",
        "[build-system]",
        f"requires = {toml_value(build['requires'])}",
        f"build-backend = {toml_value(build['build-backend'])}",
        "",
        "[project]",
        f"name = {toml_value(own['name'])}",
        f"description = {toml_value(own['description'])}",
        *(f"{key} = {toml_value(project[key])}" for key in GUARD_SHARES if key in project),
        "dependencies = []",
        "",
        "[project.optional-dependencies]",
        *(f"{json.dumps(extra)} = {toml_value(needs)}"
          for extra, needs in own.get("optional-dependencies", {}).items()),
        "",
        "[project.scripts]",  # commands of the guard's own, each a function of guard/
        *(f"{json.dumps(name)} = {toml_value(target)}"
          for name, target in own.get("scripts", {}).items()),
        "",
        "[tool.setuptools]",
        'packages = ["guard", "guard.contrib", "guard.remote"]',  # each package of guard/, named
    ]  # fmt: skip
    return "\n".join(lines) + "\n"


def readme_of(project: dict[str, Any]) -> str | None:
    """The file [project]'s readme names, if any."""
    readme = project.get("readme")
    return readme if isinstance(readme, str) else (readme or {}).get("file")


def guard_project(folder: Path, *, editable: bool) -> Path:
    """The guard's distribution laid out in ``folder`` (emptied first): its pyproject.toml,
    the readme and guard/ — copied for a wheel, linked for an editable install (setuptools
    maps that to this checkout's guard/ itself)."""
    pyproject = read_pyproject()
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    (folder / "pyproject.toml").write_text(guard_pyproject(pyproject), encoding="utf-8")
    if readme := readme_of(pyproject["project"]):
        shutil.copy2(ROOT / readme, folder / readme)
    if editable:
        (folder / "guard").symlink_to(ROOT / "guard", target_is_directory=True)
    else:
        shutil.copytree(ROOT / "guard", folder / "guard", ignore=NOT_BUILT)
    return folder


def console_project(folder: Path) -> Path:
    """The console's distribution (this repository's pyproject.toml) in ``folder``, so that
    building it leaves no build/ or egg-info in the checkout."""
    folder.mkdir(parents=True)
    names = ["pyproject.toml", readme_of(read_pyproject()["project"])]
    for name in filter(None, names):
        shutil.copy2(ROOT / name, folder / name)
    shutil.copytree(ROOT / "console", folder / "console", ignore=NOT_BUILT)
    return folder


def build_wheels(out: Path) -> list[Path]:
    """Build the guard's and the console's wheels into ``out`` (replacing older ones of
    theirs there) with this interpreter's pip; return their paths."""
    pyproject = read_pyproject()
    project = pyproject["project"]
    guard_name = pyproject["tool"]["loopguard"]["guard-distribution"]["name"]
    pin = re.compile(rf"{re.escape(guard_name)}\s*==\s*{re.escape(project['version'])}")
    if not any(pin.fullmatch(need) for need in project["dependencies"]):
        sys.exit(
            f"manage.py dist: pyproject.toml's dependencies must name "
            f"{guard_name}=={project['version']}, the guard of the console's version"
        )
    names = [guard_name, project["name"]]
    out.mkdir(parents=True, exist_ok=True)
    for name in names:
        for old in out.glob(f"{wheel_stem(name)}-*.whl"):
            old.unlink()
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    with tempfile.TemporaryDirectory(prefix="loopguard-dist-") as scratch:
        projects = [
            guard_project(Path(scratch) / "guard", editable=False),
            console_project(Path(scratch) / "console"),
        ]
        for name, source in zip(names, projects, strict=True):
            pip = [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                   "--wheel-dir", str(out), str(source)]  # fmt: skip
            if subprocess.run(pip, env=env, check=False).returncode != 0:
                sys.exit(f"manage.py dist: building {name} failed (see the errors above)")
    return [wheel for name in names for wheel in sorted(out.glob(f"{wheel_stem(name)}-*.whl"))]


def wheel_stem(name: str) -> str:
    """How a distribution's name begins its wheel's file name."""
    return re.sub(r"[-_.]+", "_", name).lower()


def run_dist(args: list[str]) -> None:
    """`manage.py dist`: both wheels, built from this checkout, with any Python 3.12+."""
    parser = argparse.ArgumentParser(
        prog="python3 manage.py dist",
        description="Build LoopGuard's two wheels from this checkout: the guard's "
        "(loopguard-guard: guard/ alone, standard library only) and the console's "
        "(loopguard-console, which depends on it). Needs pip and the package index "
        "(for setuptools); uses no .venv.",
    )
    parser.add_argument("--out", type=Path, default=DIST, help=f"default: {DIST}")
    options = parser.parse_args(args)
    if sys.version_info < MIN_VERSION:
        searched: list[str] = []
        python = find_python(searched) or fail_no_python(searched)
        os.execv(python, [str(python), str(ROOT / "manage.py"), "dist", *args])
    for wheel in build_wheels(options.out.resolve()):
        print(wheel)


def install(extras: str) -> None:
    """`pip install -e .[extras]` into .venv, with the guard's own distribution (editable,
    from this checkout's guard/), unless pyproject.toml is unchanged since last time."""
    digest = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()
    installed = STAMP.read_text().split() if STAMP.exists() else []
    have = set(",".join(installed[1:]).split(",")) - {""}
    wanted = set(extras.split(",")) - {""}
    if installed[:1] == [digest] and wanted <= have:
        return
    missing = ",".join(sorted(wanted - have))
    changed = "pyproject.toml changed" if installed[:1] != [digest] else f"[{missing}] missing"
    why = changed if installed else "first install"
    extras = ",".join(sorted(wanted | have))  # keep the dev tools once they are there
    target = f".[{extras}]" if extras else "."
    said = f"the guard and {target}"
    print(f"manage.py: installing {said} into .venv ({why}; quiet unless it fails)", flush=True)
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    # Before 0.2.0 this repository was one distribution, "loopguard" (a name PyPI gives to
    # another project); left in an older .venv it would still claim guard/ and console/.
    if any(VENV.glob("lib/python*/site-packages/loopguard-*.dist-info")):
        uninstall = [str(VENV_PYTHON), "-m", "pip", "uninstall", "--quiet", "--yes", "loopguard"]
        subprocess.run(uninstall, cwd=ROOT, env=env, check=False)
    guard = guard_project(GUARD_EDITABLE, editable=True)
    pip = [str(VENV_PYTHON), "-m", "pip", "install", "--quiet",
           "--editable", str(guard), "--editable", target]  # fmt: skip
    if subprocess.run(pip, cwd=ROOT, env=env, check=False).returncode != 0:
        sys.exit("manage.py: pip install failed (see the errors above)")
    STAMP.write_text(f"{digest} {extras}\n")


def ensure_environment(extras: str | Callable[[], str] = "") -> None:
    """Make sure we run inside an up-to-date .venv; re-exec into it when we are not (the
    install happens in there: reading pyproject.toml needs a Python 3.12+). ``extras`` may
    be a function, called only in there."""
    if Path(sys.prefix).resolve() == VENV.resolve():
        os.environ.pop(REEXEC_MARK, None)  # so that a nested `python3 manage.py` may re-exec
        install(extras() if callable(extras) else extras)
        return
    if os.environ.get(REEXEC_MARK):
        sys.exit(f"manage.py: re-exec into {VENV_PYTHON} did not land in the venv")
    version = python_version(VENV_PYTHON) if VENV_PYTHON.exists() else None
    if version is None or version < MIN_VERSION:
        create_venv()
    os.environ[REEXEC_MARK] = "1"
    os.execv(VENV_PYTHON, [str(VENV_PYTHON), str(ROOT / "manage.py"), *sys.argv[1:]])


CHROMIUM = Path("/usr/bin/chromium")


def ensure_browser() -> None:
    """Install Debian's chromium for the browser tests if it is missing (never a download of
    a browser build of Playwright's own); without root or apt, say the tests will skip."""
    if CHROMIUM.exists():
        return
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        print("manage.py test: no /usr/bin/chromium; the browser tests will be skipped "
              "(install Debian's chromium package to run them)", flush=True)
        return
    print("manage.py test: installing Debian's chromium for the browser tests", flush=True)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for command in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "chromium"]):
        if subprocess.run(command, env=env, stdout=subprocess.DEVNULL, check=False).returncode:
            sys.exit(f"manage.py test: `{' '.join(command)}` failed")


def test_processes() -> int:
    """How many pytest processes the whole suite runs on: two where there are two cores or
    more (each with its own test database and Redis database), else one."""
    return 2 if (os.cpu_count() or 1) >= 2 else 1


def run_tests(pytest_args: list[str]) -> None:
    """Run ruff, mypy and pytest in order; stop at the first step that fails. Without
    arguments pytest runs the whole suite on :func:`test_processes` processes (a process
    that is free takes the next test); with arguments, exactly as they say."""
    ensure_browser()
    if not pytest_args and (processes := test_processes()) > 1:
        pytest_args = ["-n", str(processes), "--dist", "worksteal"]
    steps = [
        ("ruff", ["ruff", "check", "."]),
        ("mypy", ["mypy"]),
        ("pytest", ["pytest", *pytest_args]),
    ]
    for name, command in steps:
        print(f"==> {' '.join(command)}", flush=True)
        code = subprocess.run([sys.executable, "-m", *command], cwd=ROOT, check=False).returncode
        if code != 0:  # pytest's 5 ("no tests collected") is a failure too
            hint = " - no tests were collected" if name == "pytest" and code == 5 else ""
            sys.exit(f"manage.py test: step '{name}' failed (exit {code}{hint})")
    print("manage.py test: ruff, mypy and pytest passed")


def run_django(argv: list[str]) -> None:
    """Hand the command line to Django (only ever called inside .venv)."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.project.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(argv)


def integration_extras() -> list[str]:
    """The extra of each framework integration, from guard/contrib/__init__.py, run by its path:
    it imports only the standard library, nothing of the guard's."""
    return [integration.extra for integration in runpy.run_path(str(INTEGRATIONS))["INTEGRATIONS"]]


def extras_for_tests() -> str:
    """What `manage.py test` installs: the dev tools, the model agent's client, the trace's
    OpenTelemetry exporter and every framework integration's framework (their tests need them)."""
    return ",".join(["dev", "model", "otel", *integration_extras()])


def model_extra() -> str:
    """The model agent's client once a model is configured (LOOPGUARD_MODEL_URL)."""
    return "model" if os.environ.get("LOOPGUARD_MODEL_URL") else ""


OVERVIEW = """\
usage: python3 manage.py <command> [options]

LoopGuard's one entry point. It finds a Python 3.12+, keeps .venv up to date (installing
what a command needs the first time), then runs the command there.

  up       start the console (web server, worker, beat) with its demo data; it uses
           PostgreSQL and Redis when they answer and a standalone mode (SQLite, a broker in
           folders) when they do not.  `python3 manage.py up --help` lists its options.
  test     the whole test suite: ruff, mypy --strict, then pytest against the real
           PostgreSQL and Redis (installs the dev and framework extras, and Debian's
           chromium for the browser tests).  `python3 manage.py help test` says more.
  dist     build the two wheels, loopguard-guard (guard/ alone, no dependencies) and
           loopguard-console (which depends on it), into .loopguard/dist (uses no .venv).
  <other>  any Django management command (migrate, createsuperuser, start_task,
           create_user, create_api_token, ...); `python3 manage.py help <command>` for one,
           `python3 manage.py help --commands` for the list (these need .venv).

Nothing is installed to show this text.
"""

TEST_HELP = """\
usage: python3 manage.py test [pytest arguments]

Runs, in order and stopping at the first that fails:
  ruff check .      style and lint, the whole repository
  mypy              --strict over guard/, console/ and benchmarks/
  pytest ...        every test, against the real PostgreSQL and Redis named by
                    DATABASE_URL and REDIS_URL (defaults: 127.0.0.1), with real Celery
                    workers and headless Chromium; arguments are passed to pytest
                    (for instance `-m "not slow"`, `tests/guard`, `-x`). Without any,
                    the whole suite runs on two processes where there are two cores.

Before it runs, .venv gets the guard's distribution and the console's with its dev and
model extras and the extra of every framework integration (guard/contrib/__init__.py names
them), both editable (the first time, or when pyproject.toml changed), and Debian's
chromium package is installed if it is missing and this is root with apt (otherwise the
browser tests are skipped, and say so). tests/deploy builds both wheels as `manage.py
dist` does and runs an agent on the guard's alone, in an empty venv.

Nothing is installed to show this text.
"""


def wants_help(argv: list[str]) -> str | None:
    """The help text a command line asks for that needs nothing installed, else None."""
    args = argv[1:]
    if not args or args[0] in ("-h", "--help") or args == ["help"]:
        return OVERVIEW
    asks_test = args[0] == "test" and any(a in ("-h", "--help") for a in args[1:])
    if asks_test or args == ["help", "test"]:
        return TEST_HELP
    return None


def main(argv: list[str]) -> None:
    """Dispatch `up`, `test` or a Django command."""
    text = wants_help(argv)
    if text is not None:
        print(text, end="")
        return
    command = argv[1] if len(argv) > 1 else ""
    if len(argv) > 2 and command == "help" and argv[2] in ("up", "dist"):
        argv = [argv[0], argv[2], "--help"]  # the command's own options, from its parser
        command = argv[1]
    if command == "dist":
        run_dist(argv[2:])  # needs no .venv, and installs nothing into one
    elif command == "test":
        ensure_environment(extras_for_tests)
        run_tests(argv[2:])
    elif command == "up":
        ensure_environment(model_extra())
        from console.project.launcher import main as up  # inside .venv now: Django is importable

        sys.exit(up(argv[2:]))
    else:
        ensure_environment(model_extra())
        run_django(argv)


if __name__ == "__main__":
    main(sys.argv)
