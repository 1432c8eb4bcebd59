"""A hosted agent whose planner is a model behind an OpenAI-compatible HTTP API.

The model here is a stub HTTP server on loopback that plays scripted replies in the Chat
Completions wire format and keeps every request it got; the agent talks to it over real
HTTP, and its tools act on the desk's real tables.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from console import services
from console.demo.desk import seed_demo_data
from console.demo.models import Notice, Refund
from console.drivers import runner
from console.models import Operation, OperationState, StopReport, Task, TaskState, TraceEvent
from console.store import statements
from tests.processes import run_python

pytestmark = pytest.mark.django_db(transaction=True)

API_KEY = "sk-test-0123456789abcdefghij"
DESK_INPUT = {"order": 42, "amount_cents": 1500, "reason": "the parcel arrived damaged"}

Reply = tuple[int, Any]  # HTTP status, JSON body
SLOW = -1  # a reply (SLOW, seconds): the model answers, too late
HANG_UP = -2  # a reply (HANG_UP, None): the connection closes with no answer at all
RAW = -3  # a reply (RAW, bytes): a 200 whose body is these bytes, JSON or not


class WorkerGone(BaseException):
    """The worker process vanishes here (nothing below catches a BaseException)."""


class StubModel:
    """Plays ``replies`` in order, one per request; records each request's headers and body."""

    def __init__(self) -> None:
        self.replies: list[Reply] = []
        self.requests: list[dict[str, Any]] = []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                stub.requests.append(
                    {
                        "path": self.path,
                        "authorization": self.headers.get("Authorization"),
                        "body": json.loads(self.rfile.read(length)),
                    }
                )
                status, body = stub.replies.pop(0) if stub.replies else (500, {"error": "none"})
                if status == SLOW:  # answer, but only after ``body`` seconds
                    time.sleep(body)
                    status, body = text("late")
                if status == HANG_UP:
                    self.close_connection = True
                    return
                data = body if status == RAW else json.dumps(body).encode()
                status = 200 if status == RAW else status
                self.send_response(status)
                if status in (301, 302, 303, 307, 308):
                    self.send_header("Location", body["location"])
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def messages(self, n: int) -> list[dict[str, Any]]:
        """The messages the ``n``-th request (from 0) sent."""
        return list(self.requests[n]["body"]["messages"])


@pytest.fixture
def model(settings: Any) -> Iterator[StubModel]:
    stub = StubModel()
    stub.thread.start()
    settings.LOOPGUARD_MODEL_URL = stub.url
    settings.LOOPGUARD_MODEL_API_KEY = API_KEY
    settings.LOOPGUARD_MODEL_RETRIES = 1
    try:
        yield stub
    finally:
        stub.server.shutdown()
        stub.server.server_close()


def calls(*asked: tuple[str, str, Any], tokens: int = 100) -> Reply:
    """A reply asking for tool calls: (call id, tool, arguments as an object or raw text)."""
    tool_calls = [
        {
            "id": call_id,
            "type": "function",
            "function": {
                "name": tool,
                "arguments": args if isinstance(args, str) else json.dumps(args),
            },
        }
        for call_id, tool, args in asked
    ]
    message = {"role": "assistant", "content": None, "tool_calls": tool_calls}
    return 200, {"choices": [{"message": message}], "usage": {"total_tokens": tokens}}


def text(content: str, tokens: int = 50) -> Reply:
    message = {"role": "assistant", "content": content}
    return 200, {"choices": [{"message": message}], "usage": {"total_tokens": tokens}}


NOTICE = {
    "order": 42,
    "recipient": "ada@example.com",
    "text": "We refunded 15.00 for order 42: the parcel arrived damaged.",
}
# The inspector sees the goal met once the notice is in the desk: no fourth model call.
THE_WHOLE_JOB = [
    calls(("call_1", "order_lookup", {"order": 42})),
    calls(("call_2", "refund", {"order": 42, "amount_cents": 1500})),
    calls(("call_3", "notify_customer", NOTICE)),
]


def start(input: dict[str, Any] | None = None) -> Task:
    seed_demo_data()
    return services.task_start(
        agent="support_desk_model", input=input or DESK_INPUT, enqueue=lambda task_id: None
    )


def test_the_model_plans_the_refund_and_the_notice_and_each_is_made_once(
    model: StubModel,
) -> None:
    model.replies = list(THE_WHOLE_JOB)
    task = start()

    outcome = runner.drive(task.id)

    task.refresh_from_db()
    assert outcome == "COMPLETED/goal_met"
    assert (task.model_calls, task.executions, task.tokens) == (3, 3, 300)
    assert len(model.requests) == 3
    assert Refund.objects.get().amount_cents == 1500
    assert Notice.objects.get().idempotency_key == "order-42-refund-notice"
    assert set(Operation.objects.values_list("key", "state")) == {
        ("order-42-refund", OperationState.COMMITTED),
        ("order-42-refund-notice", OperationState.COMMITTED),
    }
    # What the model was sent: the tools, then every call answered under its own id.
    first = model.requests[0]
    assert first["path"] == "/v1/chat/completions"
    assert first["authorization"] == f"Bearer {API_KEY}"
    assert first["body"]["model"] == "test-model"
    names = [tool["function"]["name"] for tool in first["body"]["tools"]]
    assert names == ["order_lookup", "refund", "notify_customer"]
    assert [m["role"] for m in model.messages(0)] == ["system", "user"]
    answer = model.messages(1)[-1]
    assert (answer["role"], answer["tool_call_id"]) == ("tool", "call_1")
    assert json.loads(answer["content"])["customer_email"] == "ada@example.com"
    assert model.messages(2)[-1]["tool_call_id"] == "call_2"
    # The key went to the model only: nothing stored holds it.
    stored = json.dumps(
        [
            list(TraceEvent.objects.values()),
            task.checkpoint,
            StopReport.objects.get(task=task).report,
        ],
        default=str,
    )
    assert API_KEY not in stored


def test_a_model_that_asks_for_the_same_refund_twice_gets_the_first_result_back(
    model: StubModel,
) -> None:
    refund = ("refund", {"order": 42, "amount_cents": 1500})
    model.replies = [
        calls(("call_1", "order_lookup", {"order": 42})),
        calls(("call_2", *refund)),
        calls(("call_3", *refund)),  # the model forgot it refunded already
        calls(("call_4", "notify_customer", NOTICE)),
    ]
    task = start()

    runner.drive(task.id)

    task.refresh_from_db()
    assert (task.state, task.reason) == (TaskState.COMPLETED, "goal_met")
    assert Refund.objects.count() == 1
    decisions = list(
        TraceEvent.objects.filter(task=task, tool="refund").values_list("decision", flat=True)
    )
    assert decisions == ["executed", "reused"]
    reused = json.loads(model.messages(3)[-1]["content"])
    assert reused["refund"] == Refund.objects.get().pk  # the stored result, not a new refund


@pytest.mark.parametrize(
    ("reply", "state", "reason"),
    [
        (calls(("call_1", "refund", "{not json")), "FAILED", "bad_call"),
        (calls(("call_1", "wire_money", {"order": 42})), "FAILED", "bad_call"),
        (
            calls(("call_1", "refund", {"amount_cents": 1500})),
            "NEEDS_HUMAN",
            "missing_operation_key",
        ),
        (
            calls(("call_1", "refund", {"order": 43, "amount_cents": 1500})),
            "NEEDS_HUMAN",
            "missing_operation_key",
        ),
    ],
    ids=["arguments-not-json", "unknown-tool", "write-without-an-order", "another-order"],
)
def test_malformed_tool_calls_are_refused_before_anything_runs(
    model: StubModel, reply: Reply, state: str, reason: str
) -> None:
    model.replies = [reply]
    task = start()

    runner.drive(task.id)

    task.refresh_from_db()
    assert (task.state, task.reason) == (state, reason)
    assert task.executions == 0
    assert not Refund.objects.exists() and not Operation.objects.exists()


def test_a_busy_model_is_asked_again_and_the_task_goes_on(model: StubModel) -> None:
    model.replies = [(503, {"error": "overloaded"}), *THE_WHOLE_JOB]
    task = start()

    assert runner.drive(task.id) == "COMPLETED/goal_met"

    assert len(model.requests) == 4
    task.refresh_from_db()
    # The first model call took two requests; the 503 produced no reply and spent nothing.
    assert (task.model_calls, task.tokens) == (3, 300)


@pytest.mark.parametrize(
    ("replies", "said"),
    [
        ([(500, {"error": "boom"}), (500, {"error": "boom"})], "HTTP 500"),
        ([(401, {"error": "bad key"})], "HTTP 401"),
        ([(200, {"choices": []})], "no message"),
    ],
    ids=["failing", "refused", "empty-reply"],
)
def test_a_model_that_gives_no_usable_reply_fails_the_task_saying_why(
    model: StubModel, replies: list[Reply], said: str
) -> None:
    model.replies = list(replies)
    task = start()

    runner.drive(task.id)

    task.refresh_from_db()
    assert (task.state, task.reason) == (TaskState.FAILED, "planner_error")
    assert said in task.detail
    assert API_KEY not in task.detail
    assert task.executions == 0


def test_an_unreachable_model_fails_the_task_saying_where_it_looked() -> None:
    task = start()  # tests.settings point at the discard port: nothing answers

    runner.drive(task.id)

    task.refresh_from_db()
    assert (task.state, task.reason) == (TaskState.FAILED, "planner_error")
    assert "could not be reached at http://127.0.0.1:9/v1/chat/completions" in task.detail


def test_without_a_configured_model_the_task_is_refused_before_it_is_queued(
    settings: Any,
) -> None:
    settings.LOOPGUARD_MODEL_URL = ""

    with pytest.raises(services.InvalidInput, match="set LOOPGUARD_MODEL_URL"):
        start()

    assert not Task.objects.exists()


def test_a_task_resumed_mid_conversation_answers_the_pending_call_first(
    model: StubModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The conversation lives in the agent's memory: a worker lost after the lookup resumes
    with the lookup answered, and the model sees no gap."""
    model.replies = list(THE_WHOLE_JOB)
    task = start()
    real_fetch_one: Callable[..., Any] = statements.fetch_one
    cut: list[int] = []

    def lose_the_worker_at_the_refund_claim(sql: str, params: Any) -> Any:
        if not cut and "claimed AS" in sql:
            cut.append(1)
            raise WorkerGone
        return real_fetch_one(sql, params)

    monkeypatch.setattr("console.store.postgresql.fetch_one", lose_the_worker_at_the_refund_claim)
    with pytest.raises(WorkerGone):
        runner.drive(task.id)
    monkeypatch.undo()
    Task.objects.filter(id=task.id).update(lease_expires_at=None, lease_owner="")
    model.replies = list(THE_WHOLE_JOB[1:])

    runner.drive(task.id)

    task.refresh_from_db()
    assert (task.state, task.reason) == (TaskState.COMPLETED, "goal_met")
    resumed = model.messages(2)  # the first request after the restart
    assert [m.get("tool_call_id") for m in resumed if m["role"] == "tool"] == ["call_1"]
    assert Refund.objects.count() == 1


def test_a_model_that_says_it_is_done_before_the_desk_agrees_ends_partial(
    model: StubModel,
) -> None:
    model.replies = [
        calls(("call_1", "order_lookup", {"order": 42})),
        text("All done: the customer has been refunded."),  # it has not
    ]
    task = start()

    runner.drive(task.id)

    task.refresh_from_db()
    assert (task.state, task.reason) == (TaskState.PARTIAL, "goal_unverified")
    assert not Refund.objects.exists()
    finish = TraceEvent.objects.filter(task=task, decision="finished").get()
    assert "All done" in finish.detail


@pytest.mark.parametrize(
    "url",
    ["http://bot:hunter2-secret@127.0.0.1:9/v1", "https://bot:hunter2-secret@api.example.com/v1"],
    ids=["with-a-port", "without-a-port"],
)
def test_a_password_in_the_model_url_is_refused_and_never_repeated(settings: Any, url: str) -> None:
    settings.LOOPGUARD_MODEL_URL = url
    with pytest.raises(services.InvalidInput, match="must not hold a user or password") as refused:
        start()
    assert "hunter2" not in str(refused.value)

    # Set after a task was queued: its first model call fails, saying why, and no more.
    settings.LOOPGUARD_MODEL_URL = "http://127.0.0.1:9/v1"
    task = start()
    settings.LOOPGUARD_MODEL_URL = url
    runner.drive(task.id)

    task.refresh_from_db()
    assert (task.state, task.reason) == (TaskState.FAILED, "planner_error")
    assert "must not hold a user or password" in task.detail
    stored = json.dumps(
        [list(TraceEvent.objects.values()), StopReport.objects.get(task=task).report],
        default=str,
    )
    assert "hunter2" not in task.detail + stored


REFUND = ("refund", {"order": 42, "amount_cents": 1500})
BOTH_WRITES = calls(("call_r", *REFUND), ("call_n", "notify_customer", NOTICE))


def _answers(messages: list[dict[str, Any]]) -> dict[str, str]:
    return {m["tool_call_id"]: m["content"] for m in messages if m["role"] == "tool"}


def test_a_worker_lost_in_the_middle_of_a_batch_resumes_with_each_call_answered_truly(
    model: StubModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The refund of a two-call reply ran, the worker died claiming the notice: the resumed
    conversation answers the refund with its result and the notice as not run."""
    model.replies = [calls(("call_1", "order_lookup", {"order": 42})), BOTH_WRITES]
    task = start()
    real_fetch_one: Callable[..., Any] = statements.fetch_one

    def lose_the_worker_at_the_notice_claim(sql: str, params: Any) -> Any:
        values = params.values() if isinstance(params, dict) else params
        if "claimed AS" in sql and "order-42-refund-notice" in values:
            raise WorkerGone
        return real_fetch_one(sql, params)

    monkeypatch.setattr("console.store.postgresql.fetch_one", lose_the_worker_at_the_notice_claim)
    with pytest.raises(WorkerGone):
        runner.drive(task.id)
    monkeypatch.undo()
    Task.objects.filter(id=task.id).update(lease_expires_at=None, lease_owner="")
    model.replies = [calls(("call_3", "notify_customer", NOTICE))]

    runner.drive(task.id)

    task.refresh_from_db()
    assert (task.state, task.reason) == (TaskState.COMPLETED, "goal_met")
    answered = _answers(model.messages(2))
    assert json.loads(answered["call_r"])["refund"] == Refund.objects.get().pk
    assert answered["call_n"] == "not run: the task stopped"
    assert Notice.objects.count() == 1


def test_after_an_approved_resumption_the_model_learns_what_ran_before_the_stop(
    model: StubModel, monkeypatch: pytest.MonkeyPatch, django_user_model: Any
) -> None:
    """An operator stopped the task between the two writes of one reply. In the next phase
    the model is told the refund was made (its result) and the notice was not run."""
    from console.demo.support_desk import SupportDeskModel
    from console.records.roles import Role, assign

    boss = django_user_model.objects.create_user("boss")
    assign(boss, [Role.OPERATOR, Role.APPROVER])
    real_refund = SupportDeskModel._refund

    def refund_then_stop(self: SupportDeskModel, call: Any) -> Any:
        result = real_refund(self, call)
        services.task_stop(task_id=self.task_id, actor=boss, reason="hold on")
        return result

    monkeypatch.setattr(SupportDeskModel, "_refund", refund_then_stop)
    model.replies = [calls(("call_1", "order_lookup", {"order": 42})), BOTH_WRITES]
    task = start()
    runner.drive(task.id)
    task.refresh_from_db()
    assert (task.state, task.reason) == (TaskState.CANCELLED, "operator_stop")
    monkeypatch.undo()

    services.task_approve_resumption(
        task_id=task.id, actor=boss, reason="go on", enqueue=lambda task_id: None
    )
    model.replies = [calls(("call_3", "notify_customer", NOTICE))]
    runner.drive(task.id)

    task.refresh_from_db()
    assert (task.state, task.reason, task.phase) == (TaskState.COMPLETED, "goal_met", 2)
    answered = _answers(model.messages(2))
    assert json.loads(answered["call_r"])["refund"] == Refund.objects.get().pk
    assert answered["call_n"] == "not run: the task stopped"
    assert (Refund.objects.count(), Notice.objects.count()) == (1, 1)


def test_a_model_too_slow_to_answer_is_not_asked_again(model: StubModel, settings: Any) -> None:
    """The request may have been answered (and billed) after the reply was given up on:
    sending it again would spend the budget twice without counting it."""
    settings.LOOPGUARD_MODEL_TIMEOUT_SECONDS = 0.3
    model.replies = [(SLOW, 1.0), *THE_WHOLE_JOB]
    task = start()

    runner.drive(task.id)

    task.refresh_from_db()
    assert (task.state, task.reason) == (TaskState.FAILED, "planner_error")
    assert "broke off without a reply" in task.detail
    assert len(model.requests) == 1


def test_a_redirect_is_not_followed_with_the_key(model: StubModel) -> None:
    elsewhere = StubModel()
    elsewhere.thread.start()
    try:
        model.replies = [(302, {"location": elsewhere.url + "/chat/completions"})]
        task = start()

        runner.drive(task.id)

        task.refresh_from_db()
        assert (task.state, task.reason) == (TaskState.FAILED, "planner_error")
        assert "HTTP 302" in task.detail
        assert elsewhere.requests == []
    finally:
        elsewhere.server.shutdown()
        elsewhere.server.server_close()


def test_tokens_of_a_reply_that_cannot_be_used_are_still_charged(model: StubModel) -> None:
    model.replies = [(200, {"choices": [], "usage": {"total_tokens": 77}})]
    task = start()

    runner.drive(task.id)

    task.refresh_from_db()
    assert (task.state, task.reason, task.tokens) == (TaskState.FAILED, "planner_error", 77)


def test_a_model_that_hangs_up_without_a_reply_is_not_asked_again(model: StubModel) -> None:
    """Like a timeout: the request arrived, so it may have been answered and billed."""
    model.replies = [(HANG_UP, None), *THE_WHOLE_JOB]
    task = start()

    runner.drive(task.id)

    task.refresh_from_db()
    assert (task.state, task.reason) == (TaskState.FAILED, "planner_error")
    assert "broke off without a reply" in task.detail
    assert len(model.requests) == 1


def test_a_reply_too_large_to_be_a_completion_fails_the_task(model: StubModel) -> None:
    model.replies = [(RAW, b'{"choices": [], "padding": "' + b"x" * (3 * 1024 * 1024) + b'"}')]
    task = start()

    runner.drive(task.id)

    task.refresh_from_db()
    assert (task.state, task.reason) == (TaskState.FAILED, "planner_error")
    assert "reply is larger than" in task.detail


def test_without_a_key_no_authorization_is_sent(
    model: StubModel, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A local server (Ollama, vLLM) needs no key: none is made up, none read elsewhere."""
    settings.LOOPGUARD_MODEL_API_KEY = ""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-meant-for-another-server-0123")
    model.replies = list(THE_WHOLE_JOB)
    task = start()

    assert runner.drive(task.id) == "COMPLETED/goal_met"

    assert [request["authorization"] for request in model.requests] == [None, None, None]


def test_a_key_the_server_quotes_back_in_its_refusal_is_not_stored(
    model: StubModel, settings: Any
) -> None:
    key = "4f1c2a9be07d43c8a6e5b1d0c9f8e7a6"  # an Azure-style key: no prefix gives it away
    settings.LOOPGUARD_MODEL_API_KEY = key
    model.replies = [(401, {"error": {"message": f"Incorrect API key provided: {key}."}})]
    task = start()

    runner.drive(task.id)

    task.refresh_from_db()
    assert (task.state, task.reason) == (TaskState.FAILED, "planner_error")
    assert "HTTP 401" in task.detail and "Incorrect API key provided" in task.detail
    stored = json.dumps(
        [task.detail, list(TraceEvent.objects.values()), StopReport.objects.get(task=task).report],
        default=str,
    )
    assert key not in stored


NEEDS_THE_EXTRA = "pip install 'loopguard-console[model]'"


def test_without_the_openai_package_a_model_task_is_refused_naming_the_extra(
    model: StubModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "openai", None)  # `import openai` fails, as if not installed

    with pytest.raises(services.InvalidInput, match="openai package") as refused:
        start()

    assert NEEDS_THE_EXTRA in str(refused.value)
    assert not Task.objects.exists()


def test_a_task_queued_before_the_package_went_missing_fails_naming_the_extra(
    model: StubModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    model.replies = list(THE_WHOLE_JOB)
    task = start()
    monkeypatch.setitem(sys.modules, "openai", None)

    runner.drive(task.id)

    task.refresh_from_db()
    assert (task.state, task.reason) == (TaskState.FAILED, "planner_error")
    assert NEEDS_THE_EXTRA in task.detail
    assert model.requests == []


WITHOUT_OPENAI = """
import sys

sys.modules["openai"] = None  # what `import openai` meets when the package is not installed
import django

django.setup()
from console.agents import agent_class

agent = agent_class("support_desk_model")
try:
    agent.validate_input({"order": 42, "amount_cents": 1500, "reason": "damaged"})
except ValueError as refused:
    print(refused)
"""


def test_a_console_installed_without_the_extra_starts_and_says_what_to_install() -> None:
    """A fresh process that never had ``openai``: the console and its agents load, and the
    model agent refuses its task with the command that installs what it needs."""
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings"}
    done = run_python(WITHOUT_OPENAI, env=env)

    assert done.returncode == 0, done.stderr
    assert NEEDS_THE_EXTRA in done.stdout
