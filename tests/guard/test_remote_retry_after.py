"""The Python client (guard/remote/) waits as long as the console asks before it sends a
request again: ``Retry-After`` on a 503 (the console's database restarting) or a 429,
never less than its own backoff, never more than 30 s.

A real ``http.server`` on a local port plays the answers; the client's injected sleep
records each wait and waits for none.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from guard.remote import ConsoleUnreachable, ProtocolError, RemoteGuard

from .support import Sleeps

Answer = tuple[int, dict[str, str]]
"""A status and the headers that come with it; a 201 carries a started task."""

STARTED: Answer = (201, {})


class Console:
    """Answers each request with the next of its answers (the last one repeated)."""

    def __init__(self, *answers: Answer) -> None:
        self.answers = list(answers)
        self.bodies: list[bytes] = []
        console = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                console.bodies.append(body)
                played = min(len(console.bodies), len(console.answers)) - 1
                status, headers = console.answers[played]
                request_id = json.loads(body)["request_id"]
                payload = _started(request_id) if status < 300 else _failure(status)
                data = json.dumps(payload).encode()
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, args=(0.02,), daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _started(request_id: str) -> dict[str, Any]:
    return {
        "protocol": 1, "task": 41, "phase": 1, "state": "RUNNING", "request_id": request_id,
        "remaining": {}, "stop": None, "lease_seconds": 60, "url": "/tasks/41/",
    }  # fmt: skip


def _failure(status: int) -> dict[str, str]:
    codes = {503: "database_unavailable", 429: "throttled", 409: "refused"}
    return {"error": "not now", "code": codes.get(status, "internal_error")}


@pytest.fixture
def serve() -> Iterator[Any]:
    started: list[Console] = []

    def _serve(*answers: Answer) -> Console:
        started.append(Console(*answers))
        return started[-1]

    yield _serve
    for console in started:
        console.close()


def waits_to_start(console: Console, *, retries: int = 3) -> list[float]:
    """What the client waited between the attempts of its first request, a start."""
    sleeps = Sleeps()
    guard = RemoteGuard.start(
        console.url, token="lg_test", agent="a", tools={"t": "read"}, retries=retries,
        sleep=sleeps, heartbeat=False,
    )  # fmt: skip
    assert guard.task == 41
    guard.close()
    return sleeps.waits


def unavailable(retry_after: str) -> Answer:
    return 503, {"Retry-After": retry_after}


def test_a_503_with_retry_after_is_sent_again_after_the_seconds_it_asks_for(serve: Any) -> None:
    console = serve(unavailable("2"), unavailable("2"), STARTED)

    assert waits_to_start(console) == [2.0, 2.0]
    assert len(set(console.bodies)) == 1 and len(console.bodies) == 3  # the same request


def test_a_429_with_retry_after_is_waited_for_too(serve: Any) -> None:
    console = serve((429, {"Retry-After": "5"}), STARTED)

    assert waits_to_start(console) == [5.0]


def test_a_retry_after_shorter_than_the_backoff_never_shortens_it(serve: Any) -> None:
    console = serve(unavailable("0"), unavailable("0.2"), unavailable("0"), STARTED)

    assert waits_to_start(console) == [0.1, 0.3, 0.9]


def test_a_retry_after_is_waited_for_at_most_30_seconds(serve: Any) -> None:
    console = serve(unavailable("3600"), STARTED)

    assert waits_to_start(console) == [30.0]


def test_each_wait_follows_the_answer_just_before_it(serve: Any) -> None:
    console = serve(unavailable("4"), (502, {}), STARTED)

    assert waits_to_start(console) == [4.0, 0.3]


@pytest.mark.parametrize(
    "header", ["Wed, 21 Oct 2026 07:28:00 GMT", "soon", "-5", "nan", "inf", ""]
)
def test_a_retry_after_that_is_not_seconds_leaves_the_backoff(serve: Any, header: str) -> None:
    console = serve(unavailable(header), STARTED)

    assert waits_to_start(console) == [0.1]


def test_the_retry_after_of_another_5xx_is_not_taken(serve: Any) -> None:
    console = serve((500, {"Retry-After": "10"}), STARTED)

    assert waits_to_start(console) == [0.1]


def test_a_console_that_keeps_asking_to_wait_is_given_up_on_after_the_retries(
    serve: Any,
) -> None:
    console = serve(unavailable("2"))
    sleeps = Sleeps()

    with pytest.raises(ConsoleUnreachable) as raised:
        RemoteGuard.start(
            console.url, token="lg_test", agent="a", tools={"t": "read"}, retries=2,
            sleep=sleeps, heartbeat=False,
        )  # fmt: skip

    assert raised.value.attempts == 3 and sleeps.waits == [2.0, 2.0]
    assert "503" in str(raised.value)


def test_a_refusal_is_not_sent_again_whatever_its_retry_after_says_but_carries_it(
    serve: Any,
) -> None:
    console = serve((409, {"Retry-After": "7"}))
    sleeps = Sleeps()

    with pytest.raises(ProtocolError) as raised:
        RemoteGuard.start(
            console.url, token="lg_test", agent="a", tools={"t": "read"}, sleep=sleeps,
            heartbeat=False,
        )  # fmt: skip

    assert (raised.value.status, raised.value.code, raised.value.retry_after) == (
        409, "refused", 7.0,
    )  # fmt: skip
    assert len(console.bodies) == 1 and sleeps.waits == []
