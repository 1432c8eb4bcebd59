"""The framework integrations over a live console: LangChain's middleware, the OpenAI
Agents SDK's guarded run and the plain ``openai`` loop, each given a ``guard.remote``
guard instead of a local one, on the frameworks' own offline test models.

The agents, tools and scripted models are those of ``tests/guard/integrations`` (the
integrations' own tests run them on a local guard): the same scenario's core, now with
the rules applied by the console, its ledger holding the writes and its pages showing them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import User

from console.api.tokens import api_token_issue
from console.models import Operation, OperationState, Task, TaskState
from console.records.roles import Role, assign
from guard.adapters import tool_effects
from guard.remote import RemoteGuard

pytest.importorskip("langchain")
pytest.importorskip("agents")
pytest.importorskip("openai")

from langchain.agents import create_agent
from langchain_core.messages import BaseMessage

from guard.contrib.langchain import LoopGuardMiddleware
from guard.contrib.openai_agents import GuardedRun
from tests.guard.integrations import test_langchain as lc
from tests.guard.integrations import test_openai_agents as sdk
from tests.guard.integrations import test_plain_openai_loop as plain

LIMITS = {"deadline_ms": 60_000, "model_calls": 12, "requests": 20, "executions": 10, "same": 2}

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@pytest.fixture
def attach(live_server: Any, transactional_db: None) -> Callable[..., RemoteGuard]:
    """A new attached task on the live console, for an agent with these tools."""
    user = User.objects.create_user("agent-process")
    assign(user, [Role.AGENT])
    secret = api_token_issue(user=user, name="frameworks")[1]

    def start(tools: dict[str, Any], client: str) -> RemoteGuard:
        return RemoteGuard.start(
            str(live_server.url), token=secret, agent="framework-agent", tools=tools,
            client=client, limits=LIMITS, heartbeat=False,
        )  # fmt: skip

    return start


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NO_PROXY", "*")


def _task(guard: RemoteGuard) -> Task:
    return Task.objects.get(id=guard.task)


# -- LangChain ---------------------------------------------------------------------------------


def _langchain(guard: RemoteGuard, replies: list[Any]) -> tuple[dict[str, Any], lc.Business]:
    business = lc.Business()
    model = lc.ScriptedModel(responses=list[BaseMessage](replies))
    middleware = LoopGuardMiddleware(guard, lc.SPECS)
    agent = create_agent(model, tools=business.tools(), middleware=[middleware])
    state = agent.invoke({"messages": [{"role": "user", "content": "Look after incident 42."}]})
    return state, business


def test_a_langchain_agent_repeating_a_call_is_stopped_same_call_by_the_console(
    attach: Callable[..., RemoteGuard],
) -> None:
    with attach(tool_effects(lc.SPECS), "langchain") as guard:
        state, business = _langchain(guard, [lc.asks(("search", {"query": "db down"}))])
    report = lc.assert_ends_with_the_stop_report(state, "same_call")
    assert business.calls["search"] == 2
    assert report["used"]["executions"] == 2
    task = _task(guard)
    assert (task.state, task.reason, task.client) == (TaskState.PARTIAL, "same_call", "langchain")
    assert task.executions == 2 and task.model_calls == 3


def test_a_langchain_agent_writes_once_and_a_repeat_reuses_the_consoles_stored_result(
    attach: Callable[..., RemoteGuard],
) -> None:
    replies = [
        lc.asks(("notify", {"incident": 42})),
        lc.asks(("notify", {"incident": 42})),
        lc.answers("Notified."),
    ]
    with attach(tool_effects(lc.SPECS), "langchain") as guard:
        state, business = _langchain(guard, replies)
    assert business.notices == [(42, "Database down")]  # sent once
    answers = [str(m.content) for m in lc.tool_messages(state)]
    assert answers[0] == answers[1] == "notice 1 sent for incident 42"
    op = Operation.objects.get(key="incident-42-first-notice")
    assert op.state == OperationState.COMMITTED and op.task_id == guard.task


# -- the OpenAI Agents SDK ---------------------------------------------------------------------


def test_an_agents_sdk_run_repeating_a_call_is_stopped_same_call_by_the_console(
    attach: Callable[..., RemoteGuard],
) -> None:
    shop = sdk.Shop()
    tools = {"find_order": "read", "send_refund": "write"}
    with attach(tools, "openai-agents") as guard:
        guarded = GuardedRun(guard)
        model = sdk.ScriptedModel([[sdk.call("find_order", 42, f"c{n}")] for n in range(6)])
        agent = sdk.shop_agent(guarded, shop, model)
        outcome = guarded.run_sync(agent, "Refund 42", run_config=sdk.QUIET)
    assert (outcome.report.state, outcome.report.reason) == ("PARTIAL", "same_call")
    assert shop.lookups == [42, 42]
    assert model.remaining_steps == 3  # no model call after the stop
    assert _task(guard).reason == "same_call"


def test_an_agents_sdk_write_runs_once_and_its_repeat_reuses_the_stored_result(
    attach: Callable[..., RemoteGuard],
) -> None:
    shop = sdk.Shop()
    tools = {"find_order": "read", "send_refund": "write"}
    script = [
        [sdk.call("send_refund", 42, "c1")],
        [sdk.call("send_refund", 42, "c2")],
        [sdk.assistant_message("Refunded.")],
    ]
    with attach(tools, "openai-agents") as guard:
        guarded = GuardedRun(guard)
        agent = sdk.shop_agent(guarded, shop, sdk.ScriptedModel(script))
        outcome = guarded.run_sync(agent, "Refund 42", run_config=sdk.QUIET)
    assert shop.refunds == [42]
    assert sdk.outputs(outcome) == ["refund 1 sent for order 42"] * 2
    assert Operation.objects.get(key="refund-order-42").state == OperationState.COMMITTED


# -- a plain openai loop -----------------------------------------------------------------------


def _plain(guard: RemoteGuard, shop: plain.Shop, replies: list[dict[str, Any]]) -> Any:
    functions = {"find_order": shop.find_order, "send_refund": shop.send_refund}
    with plain.ScriptedServer(replies) as server:
        client = plain.openai.OpenAI(base_url=server.url, api_key="test-key", max_retries=0)
        messages = [{"role": "user", "content": "Refund order 42"}]
        return plain.guarded_chat_loop(
            client, guard, functions, plain.SPECS, messages, plain.SCHEMAS  # type: ignore[arg-type]
        )


def test_a_plain_openai_loop_writes_once_and_is_stopped_when_it_repeats(
    attach: Callable[..., RemoteGuard],
) -> None:
    shop = plain.Shop()
    replies = [
        plain.tool_calls(("c1", "send_refund", {"order": 42})),
        *[plain.tool_calls((f"c{n}", "find_order", {"order": 42})) for n in range(2, 7)],
    ]
    with attach(tool_effects(plain.SPECS), "openai") as guard:
        report = _plain(guard, shop, replies)
    assert (report.state, report.reason) == ("PARTIAL", "same_call")
    assert shop.refunds == [42] and shop.lookups == [42, 42]
    task = _task(guard)
    assert task.tokens == 15 * 4  # each model call's usage, charged by the console
    assert Operation.objects.get(key="refund-order-42").state == OperationState.COMMITTED
