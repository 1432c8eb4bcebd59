"""The agent guide's "Attach an agent you already have" examples run as printed, against a
live console: each is executed with ``LOOPGUARD_URL`` and ``LOOPGUARD_TOKEN`` pointing at
pytest-django's live server, prints what its comments promise, and leaves on the console
what the guide says — an attached task by the client it names, its write committed once
in the console's ledger although the model asked for it twice."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User

from console.models import Operation, OperationState, Task, TaskState
from console.roles import Role, assign
from console.tokens import api_token_issue

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


def _attached(agent: str) -> Task:
    task = Task.objects.get(agent=agent)
    assert task.client and task.state == TaskState.PARTIAL
    return task


def test_the_attached_langchain_example_notifies_once_through_the_console(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pytest.importorskip("langchain")
    namespace, printed = run_example("attach-langchain", monkeypatch, TITLE)
    assert printed == promised_output(example_source("attach-langchain", TITLE))
    assert namespace["sent"] == [42]
    task = _attached("incident-bot")
    assert (task.reason, task.client) == ("goal_unverified", "incident-service/1 (langchain)")
    op = Operation.objects.get(key="incident-42-first-notice")
    assert (op.state, op.task_id) == (OperationState.COMMITTED, task.id)


def test_the_attached_agents_sdk_example_refunds_once_through_the_console(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pytest.importorskip("agents")
    namespace, printed = run_example("attach-openai-agents", monkeypatch, TITLE)
    assert printed == promised_output(example_source("attach-openai-agents", TITLE))
    assert namespace["refunds"] == [42]
    task = _attached("refund-bot")
    assert task.executions == 2 and task.requests == 3
    assert Operation.objects.get(key="refund-order-42").state == OperationState.COMMITTED


def test_the_attached_plain_loop_example_refunds_once_through_the_console(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pytest.importorskip("openai")
    from tests.guard.integrations import test_plain_openai_loop as tested

    loop, _ = run_example("plain-openai", monkeypatch)  # defines guarded_chat_loop
    replies = [
        tested.tool_calls(("c1", "find_order", {"order": 42})),
        tested.tool_calls(("c2", "send_refund", {"order": 42})),
        tested.tool_calls(("c3", "send_refund", {"order": 42})),
        {"content": "Order 42 is refunded."},
    ]
    with tested.ScriptedServer(replies) as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.url)
        monkeypatch.setenv("OPENAI_API_KEY", "test-key")
        given = {"guarded_chat_loop": loop["guarded_chat_loop"]}
        namespace, printed = run_example("attach-plain-openai", monkeypatch, TITLE, given)
    assert printed == promised_output(example_source("attach-plain-openai", TITLE))
    assert namespace["refunds"] == [42]
    task = _attached("refund-loop")
    assert task.tokens == 60 and task.model_calls == 4
