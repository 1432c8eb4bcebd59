"""Attached agents against a live console (pytest-django's live server on the real
PostgreSQL): the Python client ``guard.remote`` over real HTTP, LangChain's and the OpenAI
Agents SDK's own offline models, and agent processes that are started, raced and killed.

Each agent's business system here has no idempotency of its own (a notice is a line in a
file, one per execution), so "nothing sent twice" is read from the business records: only
the console's ledger stands between a retry and a second notice.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from http.client import HTTPConnection
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User

from console.api.tokens import api_token_issue
from console.drivers import runner
from console.models import Operation, OperationEvent, OperationState, StepRequest, Task, TaskState
from console.records.roles import Role, assign
from guard import Call, Finish, Kind, Report, Result
from guard.remote import ConsoleUnreachable, RemoteGuard
from guard.steps import Action
from tests.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
LIMITS = {"deadline_ms": 60_000, "model_calls": 8, "requests": 8, "executions": 6, "same": 2}

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@pytest.fixture
def token(transactional_db: None) -> Callable[[Role], str]:
    """A bearer token of a new person holding ``role``."""

    def issue(role: Role) -> str:
        user = User.objects.create_user(f"{role.value}-{User.objects.count()}")
        assign(user, [role])
        return api_token_issue(user=user, name="live")[1]

    return issue


@pytest.fixture
def url(live_server: Any) -> str:
    return str(live_server.url)


@pytest.fixture
def record(tmp_path: Path) -> Path:
    """The business system's records: one line per notice sent."""
    path = tmp_path / "notices.txt"
    path.touch()
    return path


def sent(record: Path) -> list[str]:
    return record.read_text().splitlines()


def api(url: str, token: str, method: str, path: str, body: Any = None) -> Any:
    """One call of the console's JSON API, as a person's program makes it."""
    connection = HTTPConnection(url.removeprefix("http://"), timeout=10)
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    connection.request(method, path, json.dumps(body) if body is not None else None, headers)
    response = connection.getresponse()
    answer = json.loads(response.read())
    assert response.status < 300, answer
    return answer


class AgentProcess:
    """``tests.console.attached_agent`` in a process of its own."""

    def __init__(self, scenario: str, url: str, token: str, record: Path, *extra: str) -> None:
        command = [
            sys.executable, "-m", "tests.console.attached_agent", scenario,
            "--url", url, "--token", token, "--record", str(record), *extra,
        ]  # fmt: skip
        env = {**os.environ, "PYTHONPATH": str(ROOT), "NO_PROXY": "*"}
        self.process = subprocess.Popen(  # noqa: S603 - our own script
            command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        _running.append(self.process)
        assert self.process.stdout is not None
        first = self.process.stdout.readline()
        assert first, self.process.stderr.read() if self.process.stderr else "no output"
        self.task = int(json.loads(first)["task"])

    def outcome(self, timeout: float = 60) -> dict[str, Any]:
        out, err = self.process.communicate(timeout=timeout)
        assert self.process.returncode == 0, err
        result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
        return result


_running: list[subprocess.Popen[str]] = []


@pytest.fixture(autouse=True)
def _no_agent_left_behind() -> Iterator[None]:
    yield
    while _running:
        process = _running.pop()
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    # The client talks to the console on this machine; a proxy in the environment would not.
    monkeypatch.setenv("NO_PROXY", "*")


# -- one client, the protocol over real HTTP ---------------------------------------------------


def test_a_remote_guard_stops_a_repeated_call_and_the_console_shows_the_trace_meanwhile(
    url: str, token: Callable[[Role], str]
) -> None:
    secret, reader = token(Role.AGENT), token(Role.VIEWER)
    seen: list[dict[str, Any]] = []
    with RemoteGuard.start(
        url, token=secret, agent="looper", tools={"status": "read"}, limits=LIMITS
    ) as guard:
        report: Report | None = None
        while report is None:
            if (report := guard.before_model()) is not None:
                break
            admitted = guard.before_tools(Call("status", {"service": "db"}))
            if isinstance(admitted, Report):
                report = admitted
                break
            assert isinstance(admitted, list)
            (ticket,) = admitted
            decision = guard.before_tool(ticket)
            if decision.action is Action.STOP:
                report = decision.report
                break
            # While it runs, the console shows the trace so far.
            seen.append(api(url, reader, "GET", f"/api/tasks/{guard.task}"))
            report = guard.after_tool(ticket, Result(Kind.SUCCESS, "db: degraded"), inspect=None)
    assert report is not None and (report.state, report.reason) == ("PARTIAL", "same_call")
    assert seen and seen[-1]["task"]["state"] == "RUNNING"
    assert any(e["kind"] == "request" for e in seen[-1]["events"])
    task = Task.objects.get(id=guard.task)
    assert (task.state, task.reason, task.executions) == (TaskState.PARTIAL, "same_call", 2)
    assert task.client  # marked attached, by its client


def test_a_console_that_cannot_be_reached_lets_no_tool_run(
    url: str, token: Callable[[Role], str]
) -> None:
    proxy = LosingProxy(url, lambda body: False)
    guard = RemoteGuard.start(
        proxy.url, token=token(Role.AGENT), agent="notifier", tools={"notify": "write"},
        retries=1, sleep=lambda seconds: None, heartbeat=False,
    )  # fmt: skip
    assert guard.before_model() is None
    (ticket,) = guard.before_tools(Call("notify", {"incident": 3}, "write", "incident-3"))
    proxy.close()  # the console cannot be reached any more
    with pytest.raises(ConsoleUnreachable):
        guard.before_tool(ticket)
    assert ticket.status != "executing"
    assert not Operation.objects.filter(key="incident-3").exists()  # nothing was claimed
    guard.close()


class LosingProxy:
    """A TCP proxy in front of the console that, once, forwards a request whose body
    matches ``lose`` but closes the connection instead of relaying the answer (a response
    lost on the way back); it remembers every request body it forwarded."""

    def __init__(self, target: str, lose: Callable[[dict[str, Any]], bool]) -> None:
        self.target = target.removeprefix("http://")
        self.lose = lose
        self.lost = 0
        self.bodies: list[dict[str, Any]] = []
        self.server = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.server.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self._relay, args=(client,), daemon=True).start()

    def _relay(self, client: socket.socket) -> None:
        with client:
            reader = client.makefile("rb")
            request_line = reader.readline().decode()
            headers: dict[str, str] = {}
            while (line := reader.readline().decode()) not in ("\r\n", "\n", ""):
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
            body = reader.read(int(headers.get("content-length", "0")))
            method, path, _ = request_line.split(" ", 2)
            parsed = json.loads(body) if body else {}
            self.bodies.append(parsed)
            upstream = HTTPConnection(self.target, timeout=10)
            keep = {k: v for k, v in headers.items() if k in ("authorization", "content-type")}
            upstream.request(method, path, body, keep)
            response = upstream.getresponse()
            payload = response.read()
            if not self.lost and self.lose(parsed):
                self.lost += 1
                return  # the console answered; the answer never arrives
            head = f"HTTP/1.1 {response.status} {response.reason}\r\n"
            head += f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n"
            client.sendall((head + "Connection: close\r\n\r\n").encode() + payload)

    def close(self) -> None:
        # shutdown() wakes the accept() blocked in the serving thread; close() alone would
        # leave the listening socket open for as long as that call lasts.
        with contextlib.suppress(OSError):
            self.server.shutdown(socket.SHUT_RDWR)
        self.server.close()


def test_a_lost_answer_to_a_claim_is_retried_with_the_same_request_id_and_claims_once(
    url: str, token: Callable[[Role], str], record: Path
) -> None:
    proxy = LosingProxy(url, lambda body: body.get("step") == "call")
    try:
        guard = RemoteGuard.start(
            proxy.url, token=token(Role.AGENT), agent="notifier", tools={"notify": "write"},
            limits=LIMITS,
        )  # fmt: skip
        with guard:
            assert guard.before_model() is None
            key = "incident-9-first-notice"
            (ticket,) = guard.before_tools(Call("notify", {"incident": 9}, "write", key))
            decision = guard.before_tool(ticket)
            assert decision.action is Action.EXECUTE
            record.write_text("sent once\n")
            assert guard.after_tool(ticket, Result(Kind.SUCCESS, "sent"), inspect=None) is None
    finally:
        proxy.close()
    calls = [body for body in proxy.bodies if body.get("step") == "call"]
    assert proxy.lost == 1 and len(calls) == 2
    assert calls[0] == calls[1]  # the retry is the same request: the same id, the same body
    op = Operation.objects.get(key=key)
    assert op.state == OperationState.COMMITTED and op.attempts == 1
    assert OperationEvent.objects.filter(operation=op).count() == 2  # claimed, recorded
    rid = calls[0]["request_id"]
    assert StepRequest.objects.filter(task_id=guard.task, request_id=rid).count() == 1


def test_a_start_whose_answer_is_cut_is_asked_again_and_makes_one_task(
    url: str, token: Callable[[Role], str]
) -> None:
    proxy = LosingProxy(url, lambda body: "agent" in body)  # the start's answer is lost
    secret = token(Role.AGENT)
    start = {"token": secret, "agent": "notifier", "tools": {"notify": "write"},
             "retries": 0, "heartbeat": False}  # fmt: skip
    try:
        with pytest.raises(ConsoleUnreachable) as cut:
            RemoteGuard.start(proxy.url, **start)
        assert cut.value.start_id  # what to ask again with
        with RemoteGuard.start(proxy.url, start_id=cut.value.start_id, **start) as guard:
            assert guard.before_model() is None  # the same process drives the one task
    finally:
        proxy.close()
    assert Task.objects.count() == 1 and guard.task == Task.objects.get().id
    starts = [body for body in proxy.bodies if "agent" in body]
    assert len(starts) == 2 and starts[0] == starts[1]  # the very same start, asked again


def test_a_new_process_starting_with_the_same_start_id_takes_over_the_task_it_made(
    url: str, token: Callable[[Role], str], settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.LOOPGUARD_ATTACHED_LEASE_SECONDS = 1.5
    secret = token(Role.AGENT)
    start = {"token": secret, "agent": "notifier", "tools": {"notify": "write"},
             "start_id": "nightly-job-2026-12-03", "heartbeat": False}  # fmt: skip
    first = RemoteGuard.start(url, **start)
    assert first.before_model() is None  # ...and the process dies here, its answer unsaved
    import guard.remote._coming_back

    # A new process remembers nothing (the starts it made are kept where start() runs).
    monkeypatch.setattr(guard.remote._coming_back, "_STARTED", {})
    second = RemoteGuard.start(url, **start)  # waits out the first one's lease, then goes on
    with second:
        assert second.task == first.task and second.lease != first.lease
        assert second.before_model() is None
        assert second.finish(Finish("done"), inspect=None).state == "PARTIAL"
    assert Task.objects.count() == 1


# -- agent processes: raced, losing a write, killed --------------------------------------------


def test_two_processes_asking_for_the_same_write_at_once_send_it_once(
    url: str, token: Callable[[Role], str], record: Path
) -> None:
    secret = token(Role.AGENT)
    first = AgentProcess("send", url, secret, record, "--hold", "1.0")
    second = AgentProcess("send", url, secret, record, "--hold", "1.0")
    outcomes = [first.outcome(), second.outcome()]
    assert len(sent(record)) == 1
    executed = [o for o in outcomes if "execute" in o["actions"]]
    assert len(executed) == 1
    other = next(o for o in outcomes if o is not executed[0])
    assert set(other["actions"]) == {"reuse"}  # PENDING while the first sent, then the result
    assert Operation.objects.get(key="incident-7-first-notice").attempts == 1


def test_a_lost_write_is_reconciled_resumed_and_reused_by_a_new_process(
    url: str, token: Callable[[Role], str], record: Path
) -> None:
    agent, reconciler, approver = token(Role.AGENT), token(Role.RECONCILER), token(Role.APPROVER)
    lost = AgentProcess("lose", url, agent, record)
    outcome = lost.outcome()
    assert (outcome["state"], outcome["actions"]) == ("NEEDS_HUMAN", ["execute"])
    key = "incident-7-first-notice"
    queue = api(url, reconciler, "GET", "/api/operations")
    assert key in [op["key"] for op in queue["operations"]]
    api(url, reconciler, "POST", f"/api/operations/{key}/resolve", {
        "committed": True, "evidence": "the notice is in the outbox",
        "result": {"notice": "sent for incident 7"},
    })  # fmt: skip
    api(url, approver, "POST", f"/api/tasks/{lost.task}/resume", {"reason": "reconciled"})
    again = AgentProcess("send", url, agent, record, "--task", str(lost.task))
    resumed = again.outcome()
    assert resumed["actions"] == ["reuse"]
    assert resumed["state"] == "PARTIAL"  # no inspector: finished, goal unverified
    assert len(sent(record)) == 1  # nothing sent twice
    task = Task.objects.get(id=lost.task)
    assert task.phase == 2 and task.executions == 1


def test_a_client_killed_mid_write_leaves_it_unknown_once_its_lease_expires(
    url: str, token: Callable[[Role], str], record: Path, settings: Any
) -> None:
    settings.LOOPGUARD_ATTACHED_LEASE_SECONDS = 1.5
    hung = AgentProcess("hang", url, token(Role.AGENT), record)
    wait_for(lambda: len(sent(record)) == 1, timeout=30, what="the notice being sent")
    os.kill(hung.process.pid, signal.SIGKILL)
    hung.process.wait(timeout=10)
    key = "incident-7-first-notice"
    assert Operation.objects.get(key=key).state == OperationState.IN_FLIGHT
    wait_for(
        lambda: runner.sweep(lambda _: None)["recovered"] == 1,
        timeout=30,
        what="the sweep to find the expired lease",
    )
    task = Task.objects.get(id=hung.task)
    assert task.state == TaskState.QUEUED  # waiting for its client, which may look it up
    assert Operation.objects.get(key=key).state == OperationState.UNKNOWN


@pytest.mark.parametrize("step", ["model", "tools", "call", "result", "wait"])
def test_a_client_killed_after_any_step_is_restarted_as_documented_and_finishes(
    url: str, token: Callable[[Role], str], record: Path, settings: Any, step: str
) -> None:
    settings.LOOPGUARD_ATTACHED_LEASE_SECONDS = 1.5
    agent = token(Role.AGENT)
    killed = AgentProcess("send", url, agent, record, "--die-after", step)
    killed.process.wait(timeout=30)
    assert killed.process.returncode == 9  # died without a word, its lease still alive
    again = AgentProcess("send", url, agent, record, "--task", str(killed.task), "--lookup")
    outcome = again.outcome()
    assert outcome["state"] == "PARTIAL"  # finished: no inspector, so goal unverified
    assert len(sent(record)) == 1  # the notice went out once, whenever the first one died
    op = Operation.objects.get(key="incident-7-first-notice")
    assert op.state == OperationState.COMMITTED
    assert not Task.objects.filter(state=TaskState.NEEDS_HUMAN).exists()  # nobody paged


def test_a_write_cut_by_a_kill_is_settled_by_the_restarted_clients_lookup_without_a_person(
    url: str, token: Callable[[Role], str], record: Path, settings: Any
) -> None:
    settings.LOOPGUARD_ATTACHED_LEASE_SECONDS = 1.5
    agent = token(Role.AGENT)
    hung = AgentProcess("hang", url, agent, record)
    wait_for(lambda: len(sent(record)) == 1, timeout=30, what="the notice being sent")
    os.kill(hung.process.pid, signal.SIGKILL)  # after the effect, before its result
    hung.process.wait(timeout=10)
    # Restarted as the agent guide says: the same task, a new process, its tool's lookup.
    # attach waits out the dead process's lease itself.
    again = AgentProcess("send", url, agent, record, "--task", str(hung.task), "--lookup")
    outcome = again.outcome()
    assert outcome["actions"] == ["reuse"]  # the notice asked for again is the one sent
    assert outcome["state"] == "PARTIAL"  # finished; no inspector, so goal unverified
    assert len(sent(record)) == 1  # nothing sent twice
    op = Operation.objects.get(key="incident-7-first-notice")
    assert op.state == OperationState.COMMITTED
    history = list(op.history.order_by("id").values_list("to_state", "evidence"))
    assert history[-1][0] == OperationState.COMMITTED and "in the record" in history[-1][1]
    assert not Task.objects.filter(state=TaskState.NEEDS_HUMAN).exists()  # nobody paged



def _one_call_steps(
    url: str, secret: str, tools: dict[str, str], calls: list[Call], *, enter: bool = False
) -> tuple[Report, int, list[str]]:
    """A loop of one-call steps, each run at once, then a finish: the report, the task and
    the steps the console answered (in order)."""
    with RemoteGuard.start(
        url, token=secret, agent="one-by-one", tools=tools,
        limits={**LIMITS, "model_calls": 20, "requests": 20, "executions": 20}, heartbeat=False,
    ) as guard:  # fmt: skip
        assert guard.before_model() is None
        for call in calls:
            (ticket,) = guard.before_tools(call, enter=enter)
            assert guard.before_tool(ticket).action is Action.EXECUTE
            assert guard.after_tool(ticket, Result(Kind.SUCCESS, "done"), inspect=None) is None
            assert guard.before_wait() == 0.0
            assert guard.before_model() is None  # answered ahead: no request
        report = guard.finish(Finish("done"), inspect=None)
    steps = StepRequest.objects.filter(task_id=guard.task).order_by("id")
    return report, guard.task, list(steps.values_list("step", flat=True))


def test_a_one_call_step_costs_the_client_three_requests_and_one_more_to_finish(
    url: str, token: Callable[[Role], str]
) -> None:
    """The last result of a model call brings the wait and the next model call's allowance
    with it (``then``): a loop of one-call steps sends tools, call and result per step."""
    pages = [Call("read_page", {"page": page}) for page in range(1, 4)]

    report, task_id, steps = _one_call_steps(url, token(Role.AGENT), {"read_page": "read"}, pages)

    assert report.reason == "goal_unverified"
    assert steps.count("model") == 1 and steps.count("wait") == 0
    assert (steps.count("tools"), steps.count("call"), steps.count("result")) == (3, 3, 3)
    task = Task.objects.get(id=task_id)
    assert task.model_calls == 4 and task.executions == 3  # 3 proposals and the finish


def test_a_one_call_step_entered_with_its_admission_costs_two_requests(
    url: str, token: Callable[[Role], str]
) -> None:
    """A loop that runs each call as soon as it is admitted (``enter=True``) asks for the
    admission and the entry in one request: tools and result per step, the writes claimed
    once and committed all the same."""
    notices = [
        Call("send_notice", {"n": n}, effect="write", operation_key=f"enter-{n}")
        for n in range(1, 4)
    ]

    report, _, steps = _one_call_steps(
        url, token(Role.AGENT), {"send_notice": "write"}, notices, enter=True
    )

    assert report.reason == "goal_unverified" and report.executions == 3
    assert (steps.count("tools"), steps.count("call"), steps.count("result")) == (3, 0, 3)
    operations = Operation.objects.filter(key__startswith="enter-").order_by("key")
    assert [(op.state, op.attempts) for op in operations] == [(OperationState.COMMITTED, 1)] * 3
