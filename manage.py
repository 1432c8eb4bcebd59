#!/usr/bin/env python3
"""LoopGuard's single entry point: `up`, `test`, or any Django management command.

Everything above `run_django` uses only the standard library, so any python3 (even one too
old for Django) can find a Python 3.12+, build `.venv` and re-exec itself inside it.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import NoReturn

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
VENV_PYTHON = VENV / "bin" / "python"
STAMP = VENV / ".loopguard-install"  # "<sha256 of pyproject.toml> <extras>"
MIN_VERSION = (3, 12)
REEXEC_MARK = "LOOPGUARD_IN_VENV"


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


def install(extras: str) -> None:
    """`pip install -e .[extras]` into .venv unless pyproject.toml is unchanged since last time."""
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
    print(f"manage.py: installing {target} into .venv ({why}; quiet unless it fails)", flush=True)
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    pip = [str(VENV_PYTHON), "-m", "pip", "install", "--quiet", "--editable", target]
    if subprocess.run(pip, cwd=ROOT, env=env, check=False).returncode != 0:
        sys.exit("manage.py: pip install failed (see the errors above)")
    STAMP.write_text(f"{digest} {extras}\n")


def ensure_environment(extras: str = "") -> None:
    """Make sure we run inside an up-to-date .venv; re-exec into it when we are not."""
    inside = Path(sys.prefix).resolve() == VENV.resolve()
    if inside:
        os.environ.pop(REEXEC_MARK, None)  # so that a nested `python3 manage.py` may re-exec
    else:
        if os.environ.get(REEXEC_MARK):
            sys.exit(f"manage.py: re-exec into {VENV_PYTHON} did not land in the venv")
        version = python_version(VENV_PYTHON) if VENV_PYTHON.exists() else None
        if version is None or version < MIN_VERSION:
            create_venv()
    install(extras)
    if not inside:
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


def run_tests(pytest_args: list[str]) -> None:
    """Run ruff, mypy and pytest in order; stop at the first step that fails."""
    ensure_browser()
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
                    (for instance `-m "not slow"`, `tests/guard`, `-x`).

Before it runs, .venv gets the project with its dev, model, langchain and openai-agents
extras (the first time, or when pyproject.toml changed), and Debian's chromium package is
installed if it is missing and this is root with apt (otherwise the browser tests are
skipped, and say so).

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
    if len(argv) > 2 and command == "help" and argv[2] == "up":
        argv = [argv[0], "up", "--help"]  # up's own options, from its parser
        command = "up"
    if command == "test":
        # The model agent's client and the framework integrations are extras their tests need.
        ensure_environment("dev,model,langchain,openai-agents")
        run_tests(argv[2:])
    elif command == "up":
        ensure_environment(model_extra())
        from console.launcher import main as up  # inside .venv now: Django is importable

        sys.exit(up(argv[2:]))
    else:
        ensure_environment(model_extra())
        run_django(argv)


if __name__ == "__main__":
    main(sys.argv)
