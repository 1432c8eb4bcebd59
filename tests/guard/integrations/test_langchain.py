"""The LangChain v1 middleware (guard/contrib/langchain.py) on real ``create_agent`` agents.

The model is LangChain's own offline double (``FakeMessagesListChatModel``, scripted, with
the ``bind_tools`` it lacks); the tools are real ``@tool`` functions that count their
calls; ``ToolRetryMiddleware`` is LangChain's own. Nothing of the framework is mocked.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import pytest

pytest.importorskip("langchain")  # the extra is missing: the test command installs it

from langchain.agents import create_agent
from langchain.agents.middleware import ToolRetryMiddleware
from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import BaseTool, tool

from guard import Call, Evidence, Finish, Guard, InMemoryLedger, Limits, Result
from guard.adapters import ToolSpec, tool_effects
from guard.contrib.langchain import REPORT_KEY, LoopGuardMiddleware

NO_RETRY_INVITATION = re.compile(r"retry|try again", re.IGNORECASE)


class ScriptedModel(FakeMessagesListChatModel):
    """LangChain's fake chat model, cycling through its replies, with the ``bind_tools`` an
    agent needs; each reply is a fresh message (its own tool call ids), and ``invoked``
    counts the real model calls."""

    invoked: int = 0

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> ScriptedModel:
        return self

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: Any = None,
        **kwargs: Any,
    ) -> ChatResult:
        self.invoked += 1
        reply = super()._generate(messages, stop, run_manager, **kwargs).generations[0].message
        assert isinstance(reply, AIMessage)
        calls = [{**call, "id": f"{call['id']}-{self.invoked}"} for call in reply.tool_calls]
        fresh = AIMessage(
            content=reply.content, tool_calls=calls, usage_metadata=reply.usage_metadata
        )
        return ChatResult(generations=[ChatGeneration(message=fresh)])


def asks(*calls: tuple[str, dict[str, Any]]) -> AIMessage:
    """A model reply asking for these tool calls, in order."""
    return AIMessage(
        "",
        tool_calls=[
            {"name": name, "args": args, "id": f"call-{number}"}
            for number, (name, args) in enumerate(calls)
        ],
    )


def answers(text: str) -> AIMessage:
    return AIMessage(text)


class Business:
    """The application's side: real tools that count their executions, and its records."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self.pages: set[int] = set()
        self.notices: list[tuple[int, str]] = []
        self.failures: dict[str, int] = {}  # tool -> how many more calls raise

    def _fail_if_asked(self, name: str) -> None:
        if self.failures.get(name, 0) > 0:
            self.failures[name] -= 1
            raise ConnectionError(f"{name}: the backend did not answer")

    def tools(self) -> list[BaseTool]:
        @tool
        def search(query: str) -> str:
            """Search the knowledge base."""
            self.calls["search"] += 1
            self._fail_if_asked("search")
            return f"no results for {query}"

        @tool
        def status(service: str) -> str:
            """Read a service's status."""
            self.calls["status"] += 1
            return f"{service}: degraded"

        @tool
        def read_page(page: int) -> str:
            """Read one page of the incident log."""
            self.calls["read_page"] += 1
            self.pages.add(page)
            return f"page {page}: {page * 3} events"

        @tool
        def notify(incident: int, text: str = "Database down") -> str:
            """Send the first notice about an incident."""
            self.calls["notify"] += 1
            self._fail_if_asked("notify")
            self.notices.append((incident, text))
            return f"notice {len(self.notices)} sent for incident {incident}"

        @tool
        def refund(order: str) -> str:
            """Refund an order."""
            self.calls["refund"] += 1
            return f"refunded {order}"

        return [search, status, read_page, notify, refund]

    def inspect(self, result: Result | None, subject: Call | Finish) -> Evidence:
        """A trusted inspector: progress is the pages the business records say were read."""
        read = len(self.pages)
        return Evidence(read, done=isinstance(subject, Finish) and read == 3)


SPECS = {
    "search": ToolSpec("read"),
    "status": ToolSpec("read"),
    "read_page": ToolSpec("read"),
    "notify": ToolSpec("write", lambda args: f"incident-{args['incident']}-first-notice"),
    "refund": ToolSpec("write", lambda args: f"refund-{args['order']}"),
}

LIMITS = Limits(deadline_ms=60_000, model_calls=12, requests=20, executions=10, same=2, stagnant=3)


def run_agent(
    replies: list[AIMessage],
    *,
    limits: Limits = LIMITS,
    business: Business | None = None,
    inspect: Callable[[Result | None, Call | Finish], Evidence] | None = None,
    before: Sequence[Any] = (),
    specs: dict[str, ToolSpec] = SPECS,
    **guard_options: Any,
) -> tuple[dict[str, Any], LoopGuardMiddleware, ScriptedModel, Business]:
    """Run one guarded agent to its end: its final state, the middleware, the model."""
    business = business or Business()
    model = ScriptedModel(responses=list[BaseMessage](replies))
    guard = Guard(limits, ledger=InMemoryLedger(), tools=tool_effects(specs), **guard_options)
    middleware = LoopGuardMiddleware(guard, specs, inspect=inspect)
    agent = create_agent(model, tools=business.tools(), middleware=[*before, middleware])
    state = agent.invoke({"messages": [{"role": "user", "content": "Look after incident 42."}]})
    return state, middleware, model, business


def tool_messages(state: dict[str, Any]) -> list[ToolMessage]:
    return [m for m in state["messages"] if isinstance(m, ToolMessage)]


def assert_ends_with_the_stop_report(state: dict[str, Any], reason: str) -> dict[str, Any]:
    """The agent's last message is the stop report: words first, then its JSON."""
    last = state["messages"][-1]
    assert isinstance(last, AIMessage)
    assert last.name == "loopguard"
    assert not last.tool_calls
    text = str(last.content)
    assert text.startswith("LoopGuard stopped this task:")
    assert reason in text.splitlines()[0]
    report: dict[str, Any] = json.loads(text[text.index("\n{") + 1 :])
    assert report["reason"] == reason
    assert state[REPORT_KEY] == report
    return report


# -- loops ----------------------------------------------------------------------------


def test_an_agent_that_keeps_calling_the_same_tool_is_stopped_same_call() -> None:
    state, middleware, model, business = run_agent([asks(("search", {"query": "db down"}))])

    report = assert_ends_with_the_stop_report(state, "same_call")
    assert middleware.report is not None
    assert (middleware.report.state, middleware.report.reason) == ("PARTIAL", "same_call")
    assert business.calls["search"] == 2
    assert report["used"]["executions"] == 2
    assert model.invoked == 3  # the third identical request was refused before it ran


def test_ping_pong_between_two_tools_is_stopped() -> None:
    replies = [asks(("search", {"query": "db"})), asks(("status", {"service": "db"}))]
    state, middleware, _, business = run_agent(replies, limits=LIMITS)

    assert_ends_with_the_stop_report(state, "short_cycle")
    assert middleware.report is not None
    assert middleware.report.reason == "short_cycle"
    assert business.calls["search"] + business.calls["status"] <= 4


def test_a_repeated_call_is_first_nudged_without_running_then_stopped() -> None:
    state, middleware, _, business = run_agent([asks(("search", {"query": "db down"}))], nudge=True)

    nudges = [m for m in tool_messages(state) if m.status == "error" and "search" in str(m.content)]
    assert nudges, "the model was told about its repeat before the task stopped"
    assert business.calls["search"] == 2  # the nudged request did not run
    assert middleware.report is not None
    assert middleware.report.reason == "same_call"


def test_the_same_loop_is_stopped_under_ainvoke_too() -> None:
    business = Business()
    model = ScriptedModel(responses=[asks(("search", {"query": "db down"}))])
    guard = Guard(LIMITS, ledger=InMemoryLedger(), tools=tool_effects(SPECS))
    middleware = LoopGuardMiddleware(guard, SPECS)
    agent = create_agent(model, tools=business.tools(), middleware=[middleware])

    state = asyncio.run(agent.ainvoke({"messages": [{"role": "user", "content": "Go."}]}))

    assert_ends_with_the_stop_report(state, "same_call")
    assert business.calls["search"] == 2


# -- writes ---------------------------------------------------------------------------


def test_a_write_runs_once_and_a_repeated_request_reuses_its_committed_result() -> None:
    notify = ("notify", {"incident": 42})
    replies = [asks(notify), asks(notify), answers("Incident 42 is notified.")]
    state, middleware, _, business = run_agent(replies)

    assert business.calls["notify"] == 1
    assert business.notices == [(42, "Database down")]
    first, second = tool_messages(state)
    assert second.content == first.content == "notice 1 sent for incident 42"
    report = middleware.report
    assert report is not None
    assert report.executions == 1
    assert report.requests == 2
    assert [(op.key, str(op.state)) for op in report.operations] == [
        ("incident-42-first-notice", "COMMITTED")
    ]


def test_a_refused_write_is_answered_without_inviting_a_retry_and_ends_the_agent() -> None:
    first = ("notify", {"incident": 42, "text": "Database down"})
    other = ("notify", {"incident": 42, "text": "Database is fine"})
    replies = [asks(first), asks(other), answers("never reached")]
    state, _, model, business = run_agent(replies)

    assert_ends_with_the_stop_report(state, "operation_conflict")
    assert business.calls["notify"] == 1
    refused = tool_messages(state)[-1]
    assert refused.status == "error"
    assert "operation_conflict" in str(refused.content)
    assert not NO_RETRY_INVITATION.search(str(refused.content))
    assert model.invoked == 2


def test_a_call_held_for_approval_is_not_run_and_its_message_invites_no_retry() -> None:
    replies = [asks(("refund", {"order": "A-7"})), answers("never reached")]
    state, middleware, model, business = run_agent(
        replies, needs_approval=lambda call: call.tool == "refund"
    )

    report = assert_ends_with_the_stop_report(state, "approval_required")
    assert business.calls["refund"] == 0
    assert report["pending"]["operation_key"] == "refund-A-7"
    refused = tool_messages(state)[-1]
    assert "approval_required" in str(refused.content)
    assert not NO_RETRY_INVITATION.search(str(refused.content))
    assert model.invoked == 1  # the stop ended the agent before another model call
    assert middleware.report is not None
    assert middleware.report.state == "NEEDS_HUMAN"


def test_a_write_that_raises_is_unknown_never_retried_and_never_invites_a_retry() -> None:
    business = Business()
    business.failures["notify"] = 5
    retry = ToolRetryMiddleware(max_retries=3, initial_delay=0, backoff_factor=0, jitter=False)
    state, middleware, _, _ = run_agent(
        [asks(("notify", {"incident": 42})), answers("never reached")],
        business=business,
        before=[retry],
    )

    assert_ends_with_the_stop_report(state, "executor_error")
    assert business.calls["notify"] == 1
    report = middleware.report
    assert report is not None
    assert report.state == "NEEDS_HUMAN"
    assert [str(op.state) for op in report.operations] == ["UNKNOWN"]
    answered = tool_messages(state)[-1]
    assert "will not be run again" in str(answered.content)
    assert not NO_RETRY_INVITATION.search(str(answered.content))


def test_a_tool_the_middleware_was_not_told_about_is_refused_without_running() -> None:
    specs = {name: spec for name, spec in SPECS.items() if name != "refund"}
    state, _, _, business = run_agent([asks(("refund", {"order": "A-7"}))], specs=specs)

    assert_ends_with_the_stop_report(state, "bad_call")
    assert business.calls["refund"] == 0


# -- retries --------------------------------------------------------------------------


def retries(max_retries: int) -> ToolRetryMiddleware:
    return ToolRetryMiddleware(
        max_retries=max_retries, initial_delay=0, backoff_factor=0, jitter=False
    )


def test_tool_retry_middleware_listed_first_has_every_retry_charged_as_an_execution() -> None:
    business = Business()
    business.failures["search"] = 2
    replies = [asks(("search", {"query": "db"})), answers("Nothing found.")]
    state, middleware, _, _ = run_agent(replies, business=business, before=[retries(3)])

    assert business.calls["search"] == 3
    assert tool_messages(state)[-1].content == "no results for db"
    report = middleware.report
    assert report is not None
    assert report.reason == "goal_unverified"
    assert report.executions == 3


def test_a_retry_that_does_not_fit_in_the_execution_budget_does_not_run() -> None:
    business = Business()
    business.failures["search"] = 10
    limits = Limits(deadline_ms=60_000, model_calls=12, requests=20, executions=2)
    state, middleware, _, _ = run_agent(
        [asks(("search", {"query": "db"}))], limits=limits, business=business, before=[retries(5)]
    )

    assert_ends_with_the_stop_report(state, "execution_budget")
    assert business.calls["search"] == 2
    assert middleware.report is not None
    assert middleware.report.executions == 2


def test_a_read_that_fails_every_retry_stops_the_task_with_every_attempt_charged() -> None:
    business = Business()
    business.failures["search"] = 10
    state, _, model, _ = run_agent(
        [asks(("search", {"query": "db"})), answers("never reached")],
        business=business,
        before=[retries(2)],
    )

    report = assert_ends_with_the_stop_report(state, "executor_error")
    assert business.calls["search"] == 3
    assert report["state"] == "FAILED"
    assert report["used"]["executions"] == 3
    assert "after 3 attempts" in report["detail"]
    assert model.invoked == 1


# -- legitimate runs and budgets ------------------------------------------------------


PAGES = [asks(("read_page", {"page": page})) for page in (1, 2, 3)]


def test_distinct_reads_then_a_finish_end_goal_unverified_without_an_inspector() -> None:
    state, middleware, _, business = run_agent([*PAGES, answers("Three pages, 18 events.")])

    assert business.calls["read_page"] == 3
    assert state["messages"][-1].content == "Three pages, 18 events."
    report = middleware.report
    assert report is not None
    assert (report.state, report.reason) == ("PARTIAL", "goal_unverified")
    assert report.revision == 3  # three never-seen results counted as progress
    assert state[REPORT_KEY]["reason"] == "goal_unverified"


def test_distinct_reads_then_a_finish_are_completed_when_the_inspector_verifies() -> None:
    business = Business()
    state, middleware, _, _ = run_agent(
        [*PAGES, answers("Three pages, 18 events.")], business=business, inspect=business.inspect
    )

    report = middleware.report
    assert report is not None
    assert (report.state, report.reason) == ("COMPLETED", "goal_met")
    assert report.revision == 3
    assert state[REPORT_KEY]["state"] == "COMPLETED"


def test_the_model_budget_ends_the_agent_before_the_model_is_called_again() -> None:
    limits = Limits(deadline_ms=60_000, model_calls=2, requests=20, executions=10)
    state, middleware, model, business = run_agent(PAGES, limits=limits)

    assert_ends_with_the_stop_report(state, "model_budget")
    assert model.invoked == 2
    assert business.calls["read_page"] == 2
    assert middleware.report is not None
    assert middleware.report.model_calls == 2


def test_the_token_budget_counts_what_the_model_reports_and_stops_before_the_next_call() -> None:
    usage = {"input_tokens": 50, "output_tokens": 10, "total_tokens": 60}
    replies = [AIMessage("", tool_calls=[*page.tool_calls], usage_metadata=usage) for page in PAGES]
    limits = Limits(deadline_ms=60_000, model_calls=12, requests=20, executions=10, tokens=100)
    state, _, model, _ = run_agent(replies, limits=limits)

    report = assert_ends_with_the_stop_report(state, "token_budget")
    assert model.invoked == 2
    assert report["used"]["tokens"] == 120


def test_a_read_that_raises_with_no_retry_middleware_is_recorded_once_the_host_closes() -> None:
    business = Business()
    business.failures["search"] = 1
    model = ScriptedModel(responses=[asks(("search", {"query": "db"}))])
    guard = Guard(LIMITS, ledger=InMemoryLedger(), tools=tool_effects(SPECS))
    middleware = LoopGuardMiddleware(guard, SPECS)
    agent = create_agent(model, tools=business.tools(), middleware=[middleware])

    with pytest.raises(ConnectionError):
        agent.invoke({"messages": [{"role": "user", "content": "Go."}]})
    report = middleware.close()

    assert report is not None
    assert (report.state, report.reason) == ("FAILED", "executor_error")
    assert report.executions == 1
    assert middleware.report is report


def test_a_spend_budget_without_a_reservation_is_refused_before_anything_runs() -> None:
    guard = Guard(Limits(spend=100), ledger=InMemoryLedger(), tools=tool_effects(SPECS))

    with pytest.raises(ValueError, match="reserve="):
        LoopGuardMiddleware(guard, SPECS)


def test_a_model_call_whose_reservation_does_not_fit_is_never_sent() -> None:
    business = Business()
    model = ScriptedModel(responses=list[BaseMessage](PAGES))
    limits = Limits(deadline_ms=60_000, model_calls=12, requests=20, executions=10, spend=100)
    guard = Guard(limits, ledger=InMemoryLedger(), tools=tool_effects(SPECS))
    middleware = LoopGuardMiddleware(guard, SPECS, reserve=60)
    agent = create_agent(model, tools=business.tools(), middleware=[middleware])

    state = agent.invoke({"messages": [{"role": "user", "content": "Read the report."}]})

    report = assert_ends_with_the_stop_report(state, "spend_budget")
    assert model.invoked == 1  # the second call's 60 did not fit in the 40 left
    assert report["used"]["spend"] == 60
