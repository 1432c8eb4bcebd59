"""A database that drops the console's connections (PostgreSQL restarted, a failover, an
operator's ``pg_terminate_backend``) against a live console served by gunicorn as
``manage.py up`` runs it: two workers of four threads, each thread keeping its connection
for a minute (``CONN_MAX_AGE``), with DEBUG on (``up``'s default) and off.

A thread's kept connection is dead after the cut, and nothing says so until a statement is
sent on it: the next request of every thread must notice before its first statement, and
open another. An answer that cannot be given is a 503 with ``Retry-After``, never a 500.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.db import connection

from console.api.tokens import api_token_issue
from console.records.roles import Role, assign
from tests.databases import other_session
from tests.live_console import Answer, LiveConsole, serve
from tests.waiting import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

REQUESTS = 30  # sequential, right after the cut: more than the console's eight threads
APPLICATION = "loopguard-console-under-test"  # its sessions' name, to tell them from ours


@pytest.fixture(params=[True, False], ids=["debug-on", "debug-off"])
def console(
    request: pytest.FixtureRequest, transactional_db: None, tmp_path: Path
) -> Iterator[LiveConsole]:
    """gunicorn with ``up``'s own command line, on the test database."""
    with serve(tmp_path, debug=request.param, PGAPPNAME=APPLICATION) as served:
        yield served


def _token(role: Role) -> str:
    user = User.objects.create_user(f"{role.value}-{User.objects.count()}")
    assign(user, [role])
    return api_token_issue(user=user, name="live")[1]


def _console_backends() -> list[int]:
    """The sessions of the console's processes: every one on the database but this test's."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
            " AND pid <> pg_backend_pid()"
        )
        return [pid for (pid,) in cursor.fetchall()]


def _cut() -> int:
    """Terminate every session of the console on its database, as an operator would; wait
    until they are gone."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        (terminated,) = cursor.fetchone()
    wait_for(lambda: not _console_backends(), timeout=10, what="the sessions to end")
    return int(terminated)


def _every_thread_connected(console: LiveConsole, token: str) -> None:
    """Requests in parallel until each of gunicorn's threads has probably kept a connection
    (there is no asking a thread)."""
    with ThreadPoolExecutor(max_workers=16) as pool:
        for _ in range(4):
            answers = list(pool.map(lambda _: console.call(token, "GET", "/api/tasks"), range(16)))
            assert {a.status for a in answers} == {200}, answers
    assert len(_console_backends()) >= 4  # kept, not closed after each request


def test_requests_right_after_the_database_dropped_every_connection_never_fail_with_a_500(
    console: LiveConsole,
) -> None:
    reader, agent = _token(Role.VIEWER), _token(Role.AGENT)
    lease = "cut-test:1"
    started = console.call(agent, "POST", "/api/attached", {
        "protocol": 1, "request_id": "start", "lease": lease, "agent": "cut",
        "client": "test_database_cut", "tools": {"status": "read"},
    })  # fmt: skip
    assert started.status == 201, started
    steps = f"/api/attached/{started.body['task']}/steps"
    _every_thread_connected(console, reader)

    assert _cut() >= 4
    answers: list[tuple[str, Answer]] = []
    for n in range(REQUESTS):
        if n % 2:
            beat = {"protocol": 1, "request_id": f"beat-{n}", "lease": lease, "step": "heartbeat"}
            answers.append(("heartbeat", console.call(agent, "POST", steps, beat)))
        else:
            answers.append(("tasks", console.call(reader, "GET", "/api/tasks")))

    failed = [(what, a.status, a.body) for what, a in answers if a.status == 500]
    assert not failed, f"{len(failed)} of {REQUESTS} answered 500: {failed[:3]}"
    # Only idle connections were lost, and each thread noticed before its first statement:
    # nothing had to be refused either.
    assert [a.status for _, a in answers] == [200] * REQUESTS, answers
    assert "Traceback" not in console.log()


def test_connections_cut_again_and_again_during_requests_give_503s_never_a_500(
    console: LiveConsole,
) -> None:
    reader = _token(Role.VIEWER)
    _every_thread_connected(console, reader)

    # Every 20 ms the console's sessions are ended while requests arrive: some statements
    # meet a connection lost mid-request, after its health check passed.
    with _cutting(every=0.02) as cuts, ThreadPoolExecutor(max_workers=4) as pool:
        answers = list(pool.map(lambda _: console.call(reader, "GET", "/api/tasks"), range(120)))

    statuses = Counter(answer.status for answer in answers)
    assert sum(cuts) > 0 and set(statuses) <= {200, 503}, statuses
    assert statuses[503] > 0, f"no request lost its connection midway: {statuses}"
    for answer in answers:
        if answer.status == 503:
            assert answer.body["code"] == "database_unavailable", answer
            assert answer.retry_after is not None and int(answer.retry_after) > 0, answer
    assert console.call(reader, "GET", "/api/tasks").status == 200  # back once it stops
    assert "Traceback" not in console.log()


@contextmanager
def _cutting(*, every: float) -> Iterator[list[int]]:
    """End the console's sessions every ``every`` seconds, from a connection of our own
    (this test's stays alive); yields how many each cut ended."""
    cuts: list[int] = []
    done = threading.Event()

    def cut() -> None:
        with other_session() as own:
            while not done.wait(every):
                ended = own.execute(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                    " WHERE application_name = %s", [APPLICATION],
                ).fetchone()  # fmt: skip
                cuts.append(int(ended[0]) if ended else 0)

    cutter = threading.Thread(target=cut, daemon=True)
    cutter.start()
    try:
        yield cuts
    finally:
        done.set()
        cutter.join(timeout=10)
