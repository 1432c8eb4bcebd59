"""``python3 manage.py up``: from a clean clone to a running console, with one command.

It decides where to run, prepares the database, seeds the demo, starts the web server
(gunicorn), a Celery worker and the beat scheduler as separate process groups, prints the
URL and the demo people's passwords once the console answers, and then watches: Ctrl-C
or SIGTERM stops everything it started. A worker or beat that dies on its own is started
again, a few times at most (:class:`Restarts`); the web server dying, or a worker or beat
dying once too often, stops the rest, and ``up`` exits non-zero saying which one. While it
watches it also keeps the demo going: the admin's stop of one task, and a task always
running (the next one started when the last has ended).

The children get the address ``up`` serves as ``LOOPGUARD_PUBLIC_URL`` unless it is set,
so that the notices the worker and beat send link to whole URLs.

Where it runs: with PostgreSQL and Redis reachable (``DATABASE_URL``, ``REDIS_URL`` /
``CELERY_BROKER_URL``) it uses them, creating the database if it does not exist. When
either one does not answer, or ``LOOPGUARD_STANDALONE=1`` (``--standalone``), it runs in
standalone mode: SQLite and kombu's filesystem broker under ``LOOPGUARD_DATA_DIR``, the
same code, and it says so in its first lines.

manage.py runs this module inside ``.venv`` (``console.project.launcher.main``).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import importlib
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from types import FrameType, ModuleType
from typing import Any
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parents[2]
SAY = "manage.py up:"
PROBE_TIMEOUT_S = 2
READY_TIMEOUT_S = 90.0
POLL_S = 0.2
QUIT_GRACE_S = 3.0
# A worker or beat that dies on its own is started again, at most this often.
RESTARTS = 5
RESTART_WINDOW_S = 600.0
# How often `up` looks whether the demo's running task has ended (to start the next).
DEMO_CHECK_S = 10.0

# Exit statuses: 0 stopped on request, 1 a child died on its own and was not (or no longer)
# started again, 2 could not start.
EXIT_FAILED = 1
EXIT_NOT_STARTED = 2


class CannotStart(Exception):
    """``up`` cannot go on; the message says why and what to do."""


def say(*lines: str) -> None:
    """Print ``up``'s own lines (flushed: the children write to the same stream)."""
    for line in lines:
        print(f"{SAY} {line}" if line else "", flush=True)


# -- options -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Options:
    host: str
    port: int
    standalone: bool
    demo: bool | None
    concurrency: int
    web_workers: int
    grace: float


def parse(argv: Sequence[str]) -> Options:
    """Read ``up``'s command line (defaults from the environment)."""
    parser = argparse.ArgumentParser(
        prog="manage.py up",
        description="Start the LoopGuard console (web, worker, beat) with its demo.",
    )
    parser.add_argument(
        "--port",
        type=int,
        default=int(os.environ.get("LOOPGUARD_PORT", "") or 8000),
        help="the web server's port (default: $LOOPGUARD_PORT or 8000)",
    )
    parser.add_argument(
        "--host",
        default=os.environ.get("LOOPGUARD_HOST", "") or "127.0.0.1",
        help="the address to listen on (default 127.0.0.1: this machine only)",
    )
    parser.add_argument(
        "--standalone",
        action="store_true",
        default=os.environ.get("LOOPGUARD_STANDALONE", "").strip().lower()
        in {"1", "true", "yes", "on"},
        help="SQLite and a filesystem broker even if PostgreSQL and Redis answer",
    )
    parser.add_argument(
        "--demo",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="create the demo people and tasks (default: yes while DEBUG is on)",
    )
    parser.add_argument(
        "--concurrency", type=int, default=4, help="worker processes driving tasks (4)"
    )
    parser.add_argument("--web-workers", type=int, default=2, help="gunicorn workers (2)")
    parser.add_argument(
        "--grace",
        type=float,
        default=5.0,
        help="seconds the processes get to finish on Ctrl-C before they are killed (5)",
    )
    args = parser.parse_args(list(argv))
    if not 0 < args.port < 65536:
        parser.error(f"--port {args.port} is not a TCP port")
    if args.concurrency < 1 or args.web_workers < 1:
        parser.error("--concurrency and --web-workers must be at least 1")
    return Options(
        host=args.host,
        port=args.port,
        standalone=args.standalone,
        demo=args.demo,
        concurrency=args.concurrency,
        web_workers=args.web_workers,
        grace=max(0.0, args.grace),
    )


# -- where to run --------------------------------------------------------------------------


@dataclass(frozen=True)
class Probe:
    """One server ``up`` needs, and why it did not answer (None: it answered)."""

    name: str
    where: str
    problem: str | None

    def line(self) -> str:
        if self.problem is None:
            return f"{self.name} at {self.where} answers"
        return f"{self.name} at {self.where} is not reachable ({self.problem})"


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return (text[0] if text else type(error).__name__)[:200]


def postgres_where(db: dict[str, Any]) -> str:
    host = db.get("HOST") or "localhost"
    port = f":{db['PORT']}" if db.get("PORT") else ""
    return f"{host}{port}/{db.get('NAME')}"


def _pg_connect(db: dict[str, Any], dbname: str) -> Any:
    import psycopg

    return psycopg.connect(
        host=db.get("HOST") or None,
        port=db.get("PORT") or None,
        user=db.get("USER") or None,
        password=db.get("PASSWORD") or None,
        dbname=dbname,
        connect_timeout=PROBE_TIMEOUT_S,
        autocommit=True,
    )


def probe_postgres(db: dict[str, Any]) -> Probe:
    """Whether PostgreSQL answers: through the database itself, or (it may not exist yet)
    through the maintenance database ``postgres``."""
    import psycopg

    where = postgres_where(db)
    problem = None
    for dbname in (str(db["NAME"]), "postgres"):
        try:
            with _pg_connect(db, dbname):
                return Probe("PostgreSQL", where, None)
        except psycopg.Error as error:
            problem = problem or _first_line(error)
    return Probe("PostgreSQL", where, problem)


def redis_where(url: str) -> str:
    parts = urlsplit(url)
    host = parts.hostname or "localhost"
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{host}{port}{parts.path}"


def probe_redis(url: str) -> Probe:
    """Whether the Redis broker answers PING."""
    import redis

    client = redis.Redis.from_url(
        url, socket_connect_timeout=PROBE_TIMEOUT_S, socket_timeout=PROBE_TIMEOUT_S
    )
    try:
        client.ping()
        return Probe("Redis", redis_where(url), None)
    except redis.RedisError as error:
        return Probe("Redis", redis_where(url), _first_line(error))
    finally:
        client.close()


def _configured(config: ModuleType) -> tuple[dict[str, Any], str]:
    return dict(config.DATABASES["default"]), str(config.CELERY_BROKER_URL)


def choose_shape(options: Options) -> ModuleType:
    """Decide between the configured servers and standalone mode; say which, and why.

    Returns the settings module as it will be used (re-read when switching to standalone).
    """
    config = importlib.import_module("console.project.settings")
    if options.standalone:
        os.environ["LOOPGUARD_STANDALONE"] = "1"
        config = importlib.reload(config)
        say_standalone(config, ["asked for (LOOPGUARD_STANDALONE=1 or --standalone)"])
        return config
    db, broker = _configured(config)
    checks: list[Callable[[], Probe]] = []
    if db["ENGINE"] == "django.db.backends.postgresql":
        checks.append(lambda: probe_postgres(db))
    if urlsplit(broker).scheme in {"redis", "rediss", "unix"}:
        checks.append(lambda: probe_redis(broker))
    with ThreadPoolExecutor(max_workers=2) as pool:  # both at once: a first run is not slow
        probes = list(pool.map(lambda check: check(), checks))
    missing = [probe for probe in probes if probe.problem is not None]
    if not missing:
        sqlite = db["ENGINE"] == "django.db.backends.sqlite3"
        if sqlite and urlsplit(broker).scheme == "filesystem":
            say_standalone(config, ["configured (sqlite:/// DATABASE_URL, filesystem:// broker)"])
        else:
            say(*(probe.line() for probe in probes))
            say(*([f"database: SQLite, {_short(Path(db['NAME']))}"] if sqlite else []))
        return config
    reasons = [probe.line() for probe in missing]
    reasons += [f"{probe.line()}, but both are needed" for probe in probes if not probe.problem]
    os.environ["LOOPGUARD_STANDALONE"] = "1"
    config = importlib.reload(config)
    say_standalone(config, reasons)
    return config


def say_standalone(config: ModuleType, reasons: list[str]) -> None:
    db, _ = _configured(config)
    data = Path(config.LOOPGUARD_DATA_DIR)
    say(
        "STANDALONE MODE: " + reasons[0],
        *(f"  {reason}" for reason in reasons[1:]),
        f"  database: SQLite, {_short(Path(db['NAME']))}",
        f"  broker: kombu's filesystem transport, {_short(data / 'broker')}",
        "  same code as with PostgreSQL and Redis; for one machine, not for production",
    )
    if sqlite3.sqlite_version_info < (3, 35):
        raise CannotStart(
            f"standalone mode needs SQLite 3.35 or newer (RETURNING); this Python has "
            f"{sqlite3.sqlite_version}. Use a newer Python, or PostgreSQL and Redis."
        )


def _short(path: Path) -> str:
    with contextlib.suppress(ValueError):
        return str(path.relative_to(Path.cwd()))
    return str(path)


# -- preparing -----------------------------------------------------------------------------


def create_postgres_database(db: dict[str, Any]) -> bool:
    """Create the database ``DATABASE_URL`` names unless it exists; True if created."""
    import psycopg
    from psycopg import sql

    name = str(db["NAME"])
    with contextlib.suppress(psycopg.Error), _pg_connect(db, name):
        return False  # it is there (and a role may reach it without the maintenance database)
    try:
        with _pg_connect(db, "postgres") as conn:
            found = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name])
            if found.fetchone() is not None:
                return False
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
            return True
    except psycopg.errors.DuplicateDatabase:
        return False  # another `up` created it a moment ago
    except psycopg.Error as error:
        raise CannotStart(
            f"cannot create the database {name!r} on {postgres_where(db)}: {_first_line(error)}"
            " (create it yourself, or point DATABASE_URL at one)"
        ) from error


def prepare_folders(config: ModuleType) -> None:
    """The standalone data folder and the filesystem broker's folders."""
    db, broker = _configured(config)
    if db["ENGINE"].endswith("sqlite3"):
        Path(db["NAME"]).parent.mkdir(parents=True, exist_ok=True)
    if urlsplit(broker).scheme == "filesystem":
        options = config.CELERY_BROKER_TRANSPORT_OPTIONS
        for name in ("data_folder_in", "data_folder_out", "control_folder", "processed_folder"):
            if name in options:
                Path(options[name]).mkdir(parents=True, exist_ok=True)
        # Messages already taken by a worker: nothing reads them again.
        processed = options.get("processed_folder")
        if processed:
            for message in Path(processed).glob("*.msg"):
                message.unlink(missing_ok=True)


def migrate() -> int:
    """Apply pending migrations; returns how many there were."""
    from django.core.management import call_command
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor

    executor = MigrationExecutor(connection)
    pending = len(executor.migration_plan(executor.loader.graph.leaf_nodes()))
    if pending:
        call_command("migrate", interactive=False, verbosity=0)
    return pending


@dataclass
class Demo:
    """What the demo seeding printed and what it still has to do while the console runs."""

    credentials: list[str] = field(default_factory=list)
    tasks: list[str] = field(default_factory=list)
    started: int = 0
    stops_pending: bool = False
    keeps_running: bool = False
    """Whether a scenario is started again whenever it ends, while the console runs."""


def seed_demo() -> Demo:
    from console.demo.scenarios import SCENARIOS, demo_tasks, demo_users
    from console.management.commands.demo import credentials, task_lines

    people = demo_users()
    shown = demo_tasks()
    return Demo(
        credentials=credentials(people),
        tasks=task_lines(shown),
        started=sum(1 for _, _, new in shown if new),
        stops_pending=any(scenario.stop_after_s is not None for scenario in SCENARIOS),
        keeps_running=any(scenario.keep_running for scenario in SCENARIOS),
    )


def check_port(host: str, port: int) -> None:
    """Fail early, and clearly, when something already listens on the port."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as error:
            raise CannotStart(
                f"cannot listen on {host}:{port} ({error.strerror}); is another console "
                "running? Choose another port with --port or LOOPGUARD_PORT."
            ) from error


# -- the processes -------------------------------------------------------------------------


def _die_with_parent(signum: int) -> None:  # pragma: no cover - between fork and exec
    """Linux: the child gets ``signum`` if ``up`` itself is killed (no orphans even then)."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(1, signum)  # PR_SET_PDEATHSIG


@dataclass
class Child:
    """One started process group: gunicorn, the Celery worker or beat."""

    name: str
    argv: list[str]
    orphaned: int = signal.SIGTERM
    """What it gets if ``up`` is killed without a chance to stop it (Linux only)."""
    restartable: bool = False
    """Whether ``up`` starts it again when it dies on its own (see :class:`Restarts`)."""
    popen: subprocess.Popen[bytes] | None = None

    def start(self, env: dict[str, str]) -> None:
        self.popen = subprocess.Popen(  # noqa: S603 - our own interpreter and arguments
            self.argv,
            cwd=ROOT,
            env={**env, "LOOPGUARD_PROCESS": self.name},
            stdin=subprocess.DEVNULL,
            # Its own process group: the terminal's Ctrl-C reaches `up` alone, which stops
            # the children in order, and a whole group can be killed at the end.
            process_group=0,
            preexec_fn=partial(_die_with_parent, self.orphaned)
            if sys.platform == "linux"
            else None,
        )

    @property
    def pid(self) -> int:
        return 0 if self.popen is None else self.popen.pid

    def exited(self) -> int | None:
        return None if self.popen is None else self.popen.poll()

    def signal(self, signum: int) -> None:
        if self.popen is not None and self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.popen.pid, signum)

    def kill_group(self) -> None:
        """SIGKILL whatever is left of the group (a pool child whose parent is gone, say)."""
        if self.popen is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        self.popen.wait()


def children(options: Options, config: ModuleType) -> list[Child]:
    python = sys.executable
    return [
        Child(
            "web",
            [
                python, "-m", "gunicorn", "console.project.wsgi:application",
                "--config", "python:console.project.gunicorn_conf",
                "--bind", f"{options.host}:{options.port}",
                "--workers", str(options.web_workers),
                "--threads", "4",
                "--graceful-timeout", str(max(1, int(options.grace))),
            ],
        ),
        Child(
            "worker",
            [
                python, "-m", "celery", "-A", "console", "--quiet", "worker",
                "--loglevel", "INFO",
                "--concurrency", str(options.concurrency),
                "--hostname", f"loopguard-up-{os.getpid()}@%h",
                "--without-mingle", "--without-gossip",
            ],
            # Cold shutdown: a warm one would wait for the longest task with nobody to stop it.
            orphaned=signal.SIGQUIT,
            # Celery exits the whole worker when a pool process dies while it starts
            # (WorkerLostError: Could not start worker processes). Tasks are safe across a
            # new worker (leases, the ledger), so one is started in its place.
            restartable=True,
        ),
        Child(
            "beat",
            [
                python, "-m", "celery", "-A", "console", "--quiet", "beat",
                "--loglevel", "INFO",
            ],
            # Without beat no sweep recovers the tasks of a lost worker; a second beat is
            # never running at once (the old one is gone), so starting it again is safe.
            restartable=True,
        ),
        # The web server is not started again: gunicorn's master already replaces its own
        # workers, so the master dying means something a new one would meet too (the port
        # taken, the configuration broken), and the address `up` printed would stop
        # answering without anyone noticing in the log.
    ]  # fmt: skip


def served_url(host: str, port: int) -> str:
    """The address ``up`` opens, probes and prints: ``http://127.0.0.1:8000/``, or the host
    it binds (this machine's own address when it listens on every one)."""
    host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)  # noqa: S104
    return f"http://{f'[{host}]' if ':' in host else host}:{port}/"


def child_environment(public_url: str) -> dict[str, str]:
    """The environment of web, worker and beat: ``up``'s own, this checkout's code first,
    and ``LOOPGUARD_PUBLIC_URL`` set to ``public_url`` unless it is set already."""
    env = dict(os.environ)
    # The children import this checkout's code, whatever is installed in the venv.
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("DJANGO_SETTINGS_MODULE", "console.project.settings")
    # Notices are sent by the worker and beat, which know no request to take a host from:
    # without an address their links would be bare paths (/tasks/42/). The one `up` serves
    # is right on this machine; an operator's own value (a proxy's name) wins.
    if not env.get("LOOPGUARD_PUBLIC_URL", "").strip():
        env["LOOPGUARD_PUBLIC_URL"] = public_url.rstrip("/")
    return env


class Restarts:
    """How often a child may be started again: at most ``limit`` times in ``window`` seconds.

    A child that keeps dying (a broken configuration, a database that refuses it) would
    otherwise be restarted forever while the console looks alive; past the bound ``up``
    gives up and stops, saying why.
    """

    def __init__(self, limit: int = RESTARTS, window: float = RESTART_WINDOW_S) -> None:
        self.limit = limit
        self.window = window
        self._at: dict[str, list[float]] = {}

    def allow(self, name: str, now: float) -> int | None:
        """Count a restart of ``name`` at ``now``: its number in the window, or None if the
        bound is reached (and nothing is counted)."""
        recent = [at for at in self._at.get(name, []) if now - at < self.window]
        if len(recent) >= self.limit:
            self._at[name] = recent
            return None
        recent.append(now)
        self._at[name] = recent
        return len(recent)

    def describe(self) -> str:
        """The bound in words, for ``up``'s lines."""
        return f"{self.limit} in {_duration(self.window)}"


def _duration(seconds: float) -> str:
    if seconds >= 60 and seconds % 60 == 0:
        minutes = int(seconds // 60)
        return f"{minutes} minute{'s' if minutes != 1 else ''}"
    return f"{seconds:g} s"


class Supervisor:
    """Starts the children, watches them, starts a worker or beat again when it dies (a few
    times at most), and stops them all on a signal or a death it cannot mend."""

    def __init__(
        self, processes: list[Child], grace: float, restarts: Restarts | None = None
    ) -> None:
        self.processes = processes
        self.grace = grace
        self.restarts = restarts or Restarts()
        self.stop_signal: int | None = None
        self.hurry = False
        self.env: dict[str, str] = {}

    def on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self.stop_signal is not None:
            self.hurry = True  # a second Ctrl-C: no more waiting
        self.stop_signal = signum

    def start(self, env: dict[str, str]) -> None:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, self.on_signal)
        self.env = env
        for child in self.processes:
            child.start(env)

    def dead(self) -> Child | None:
        """A child that exited although nobody asked it to."""
        return next((c for c in self.processes if c.exited() is not None), None)

    def mend(self) -> Child | None:
        """Start again each restartable child that died, within the bound; return a child
        that died and may not be started again (having said so), or None."""
        for child in self.processes:
            status = child.exited()
            if status is None or self.stop_signal is not None:
                continue
            count = self.restarts.allow(child.name, time.monotonic()) if child.restartable else None
            if count is None:
                given_up = (
                    f", after {self.restarts.limit} restarts within "
                    f"{_duration(self.restarts.window)}: giving up"
                    if child.restartable
                    else ""
                )
                say(
                    f"the {child.name} process (pid {child.pid}) exited unexpectedly with "
                    f"status {status}{given_up}; stopping the others"
                )
                return child
            old = child.pid
            # What is left of its group (a pool process whose parent is gone) must not go
            # on beside the new one.
            child.kill_group()
            child.start(self.env)
            say(
                f"the {child.name} process (pid {old}) exited unexpectedly with status "
                f"{status}; started it again as pid {child.pid} (restart {count}, at most "
                f"{self.restarts.describe()})"
            )
        return None

    def stop(self) -> None:
        """SIGTERM each group leader (beat first, web, then the worker, which may be mid-step);
        whoever is still busy after the grace period gets SIGQUIT (the worker's cold shutdown
        hands its unacknowledged messages back to the broker), then SIGKILL for the group."""
        for child in reversed(self.processes):
            child.signal(signal.SIGTERM)
        self._wait(self.grace)
        late = [child for child in self.processes if child.exited() is None]
        if late:
            names = ", ".join(child.name for child in late)
            say(f"{names} still busy after {self.grace:g} s: stopping it at once")
            for child in late:
                child.signal(signal.SIGQUIT)
            self._wait(QUIT_GRACE_S)
        for child in self.processes:
            child.kill_group()

    def _wait(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and not self.hurry:
            if all(child.exited() is not None for child in self.processes):
                return
            time.sleep(0.05)


# -- the command ---------------------------------------------------------------------------


def wait_until_up(url: str, supervisor: Supervisor) -> None:
    """Wait for ``/healthz`` to answer 200; fail if a child dies or it takes too long."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    last = "no answer yet"
    while time.monotonic() < deadline:
        if supervisor.stop_signal is not None:
            return
        dead = supervisor.dead()
        if dead is not None:
            raise CannotStart(
                f"the {dead.name} process exited during start-up (status {dead.exited()}); "
                "see its lines above"
            )
        try:
            with urllib.request.urlopen(f"{url}healthz", timeout=2) as response:  # noqa: S310
                if response.status == 200:
                    return
        except urllib.error.HTTPError as error:
            last = f"HTTP {error.code}: {error.read(300).decode(errors='replace')}"
        except OSError as error:
            last = str(error)
        time.sleep(0.25)
    raise CannotStart(f"the console did not become healthy in {READY_TIMEOUT_S:g} s ({last})")


def banner(url: str, demo: Demo | None) -> None:
    rule = "=" * 78
    lines = [rule, f"LoopGuard console: {url}"]
    if demo is not None:
        lines += ["Sign in as (new passwords on every run):"]
        lines += [f"    {line}" for line in demo.credentials]
        lines += ["Demo tasks:"] + [f"    {line}" for line in demo.tasks]
    else:
        lines += ["No demo. Make someone: python3 manage.py create_user NAME --role admin"]
    lines += ["Ctrl-C stops the web server, the worker and beat.", rule]
    print("\n".join(lines), flush=True)


def run(options: Options) -> int:
    os.environ["LOOPGUARD_PROCESS"] = "up"
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.project.settings")
    if os.environ["DJANGO_SETTINGS_MODULE"] != "console.project.settings":
        say(f"using settings {os.environ['DJANGO_SETTINGS_MODULE']}")
    check_port(options.host, options.port)
    config = choose_shape(options)
    db, _ = _configured(config)
    created = False
    if db["ENGINE"] == "django.db.backends.postgresql":
        created = create_postgres_database(db)
    prepare_folders(config)

    import django
    from django.conf import settings
    from django.db import connections

    django.setup()
    applied = migrate()
    say(
        ("created the database, " if created else "database ready, ")
        + (f"{applied} migration(s) applied" if applied else "no migration pending")
    )
    if not settings.DEBUG:
        from django.core.management import call_command

        call_command("collectstatic", interactive=False, verbosity=0)
        say(f"static files collected into {settings.STATIC_ROOT}")
    demo_on = settings.DEBUG if options.demo is None else options.demo
    demo = seed_demo() if demo_on else None
    if demo is not None:
        earlier = len(demo.tasks) - demo.started
        say(
            f"demo: {len(demo.credentials)} people (new passwords), {demo.started} task(s) "
            f"started" + (f", {earlier} from earlier runs" if earlier else "")
        )
    connections.close_all()  # no connection of ours held across the children's start-up

    processes = children(options, config)
    supervisor = Supervisor(processes, options.grace)
    say(
        f"starting web (gunicorn, {options.web_workers} workers, {options.host}:{options.port}), "
        f"worker (Celery, {options.concurrency} processes) and beat"
    )
    # Listening on every address: this machine's own is the one to open (and to probe).
    url = served_url(options.host, options.port)
    env = child_environment(url)
    everywhere = options.host in {"0.0.0.0", "::"}  # noqa: S104
    if everywhere and env["LOOPGUARD_PUBLIC_URL"] == url.rstrip("/"):
        say(
            f"notices link to {url} (this machine only): set LOOPGUARD_PUBLIC_URL to the "
            "address other people reach the console at"
        )
    supervisor.start(env)
    try:
        wait_until_up(url, supervisor)
    except CannotStart:
        supervisor.stop()
        raise
    if supervisor.stop_signal is None:
        banner(url, demo)
    stops_pending = demo is not None and demo.stops_pending
    keeps_running = demo is not None and demo.keeps_running
    next_look = time.monotonic() + DEMO_CHECK_S
    while supervisor.stop_signal is None:
        if supervisor.mend() is not None:
            supervisor.stop()
            say("stopped: LoopGuard is not running")
            return EXIT_FAILED
        if stops_pending:
            stops_pending = _demo_stops()
        if keeps_running and time.monotonic() >= next_look:
            _demo_keep_running()
            next_look = time.monotonic() + DEMO_CHECK_S
        time.sleep(POLL_S if not stops_pending else 0.5)
    name = signal.Signals(supervisor.stop_signal).name
    say(f"{name}: stopping web, worker and beat")
    supervisor.stop()
    say("stopped")
    return 0


def _demo_stops() -> bool:
    """Do the demo's due stops; True while some are still to come."""
    from django.db import DatabaseError, close_old_connections

    from console.demo.scenarios import demo_stop_due, demo_stop_pending

    try:
        for task in demo_stop_due():
            say(f"demo: the admin stopped task {task.id} ({task.agent})")
        return demo_stop_pending()
    except DatabaseError as error:
        say(f"demo: could not do its stop now ({_first_line(error)}); trying again")
        close_old_connections()
        return True


def _demo_keep_running() -> None:
    """Start the demo's running task again if it has ended (stopped, or done reading)."""
    from django.db import DatabaseError, close_old_connections

    from console.demo.scenarios import demo_keep_running
    from console.services import ServiceError

    try:
        for _, task in demo_keep_running():
            say(f"demo: started task {task.id} ({task.agent}): the last running one had ended")
    except (DatabaseError, ServiceError) as error:
        say(f"demo: could not start its running task now ({_first_line(error)}); trying again")
        close_old_connections()


def main(argv: Sequence[str]) -> int:
    """``manage.py up [--port N] [--standalone] ...``; returns the exit status."""
    options = parse(argv)
    from django.core.exceptions import ImproperlyConfigured

    try:
        return run(options)
    except (CannotStart, ImproperlyConfigured) as error:
        say(f"cannot start: {error}")
        return EXIT_NOT_STARTED
    except KeyboardInterrupt:
        say("interrupted before the console started")
        return 130


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
