"""The agent guide's "Attach an agent you already have" examples run as printed, against a
live console: each is executed twice with ``LOOPGUARD_URL`` and ``LOOPGUARD_TOKEN``
pointing at pytest-django's live server, prints what its comments promise both times, and
leaves on the console what the guide says — per run, an attached task by the client it
names, its write committed once in the console's ledger although the model asked for it
twice. A reader who runs an example again sees the same lines, not the ledger reusing the
first run's write: each run's operation key holds the example's run id."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User

from console.api.tokens import api_token_issue
from console.models import Operation, OperationState, Task, TaskState
from console.records.roles import Role, assign

from .test_integration_examples import example_source, promised_output, run_example

TITLE = "## Attach an agent you already have"

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@pytest.fixture(autouse=True)
def console(live_server: Any, monkeypatch: pytest.MonkeyPatch, transactional_db: None) -> None:
    """The environment the examples read: the live console and an agent's token."""
    user = User.objects.create_user("incident-bot")
    assign(user, [Role.AGENT])
    monkeypatch.setenv("LOOPGUARD_URL", str(live_server.url))
    monkeypatch.setenv("LOOPGUARD_TOKEN", api_token_issue(user=user, name="docs")[1])
    monkeypatch.setenv("NO_PROXY", "*")


def _run_twice(name: str, monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Run the example twice against the same console; each run prints what it promises."""
    promised = promised_output(example_source(name, TITLE))
    runs = []
    for _ in range(2):
        namespace, printed = run_example(name, monkeypatch, TITLE)
        assert printed == promised
        runs.append(namespace)
    return runs


def _attached(agent: str, client: str, runs: int) -> list[Task]:
    """The example's tasks on the console, oldest first: one per run, attached, finished."""
    tasks = list(Task.objects.filter(agent=agent).order_by("created_at", "id"))
    assert len(tasks) == runs
    for task in tasks:
        assert (task.state, task.reason, task.client) == (
            TaskState.PARTIAL,
            "goal_unverified",
            client,
        )
        assert (task.requests, task.executions) == (3, 2)  # asked for the write twice
    return tasks


def _written_once_per_run(tasks: list[Task], keys: list[str]) -> None:
    """Each run's write is one committed operation of its own task, under its own key."""
    held = Operation.objects.filter(task__in=tasks).order_by("claimed_at", "id")
    assert [(op.key, op.state, op.task_id) for op in held] == [
        (key, OperationState.COMMITTED, task.id) for key, task in zip(keys, tasks, strict=True)
    ]
    assert len(set(keys)) == len(keys)


def test_the_attached_langchain_example_notifies_once_per_run_through_the_console(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pytest.importorskip("langchain")
    runs = _run_twice("attach-langchain", monkeypatch)
    assert [run["sent"] for run in runs] == [[42], [42]]
    tasks = _attached("incident-bot", "incident-service/1 (langchain)", runs=2)
    _written_once_per_run(tasks, [f"incident-42-first-notice-{run['run']}" for run in runs])


def test_the_attached_agents_sdk_example_refunds_once_per_run_through_the_console(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pytest.importorskip("agents")
    runs = _run_twice("attach-openai-agents", monkeypatch)
    assert [run["refunds"] for run in runs] == [[42], [42]]
    assert [run["model"].remaining_steps for run in runs] == [0, 0]  # the script was played
    tasks = _attached("refund-bot", "refund-service/4 (openai-agents)", runs=2)
    _written_once_per_run(tasks, [f"refund-order-42-{run['run']}" for run in runs])


def test_the_attached_plain_loop_example_runs_on_its_own_and_refunds_once_per_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pytest.importorskip("openai")
    from tests.guard.integrations import test_plain_openai_loop as tested

    asks_twice = [
        tested.tool_calls(("c1", "find_order", {"order": 42})),
        tested.tool_calls(("c2", "send_refund", {"order": 42})),
        tested.tool_calls(("c3", "send_refund", {"order": 42})),
        {"content": "Order 42 is refunded."},
    ]
    # The environment the guide names, pointed at a compatible server on localhost.
    with tested.ScriptedServer(asks_twice * 2) as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.url)
        monkeypatch.setenv("OPENAI_API_KEY", "test-key")
        monkeypatch.delenv("OPENAI_MODEL", raising=False)
        runs = _run_twice("attach-plain-openai", monkeypatch)
    assert not server.replies  # both runs played the whole script
    assert {request["model"] for request in server.requests} == {"gpt-4.1-mini"}
    assert [run["refunds"] for run in runs] == [[42], [42]]
    tasks = _attached("refund-loop", "refund-loop/1 (openai)", runs=2)
    assert [(task.model_calls, task.tokens) for task in tasks] == [(4, 60), (4, 60)]
    _written_once_per_run(tasks, [f"refund-order-42-{run['run']}" for run in runs])


def test_the_attached_plain_loop_example_without_a_model_key_stops_before_the_console(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    openai = pytest.importorskip("openai")
    for name in ("OPENAI_API_KEY", "OPENAI_ADMIN_KEY", "OPENAI_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(openai.OpenAIError, match="Missing credentials"):
        run_example("attach-plain-openai", monkeypatch, TITLE)
    assert not Task.objects.exists()  # as the guide says: no task was started
