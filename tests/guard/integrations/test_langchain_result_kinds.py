"""How a LangChain tool tells the guard its result kind: a ``guard.Result`` as the artifact
of its tool message, however the tool builds that message.

The agents are real ``create_agent`` agents on LangChain's own offline chat model
(``FakeMessagesListChatModel``); the tools are real ``@tool`` functions. The comparison
with ``Guard.run`` and the Agents SDK is in test_result_kinds.py.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Annotated, Any

import pytest

pytest.importorskip("langchain")  # the extra is missing: the test command installs it

from langchain.agents import create_agent
from langchain.agents.middleware import ToolRetryMiddleware
from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.tools import BaseTool, InjectedToolCallId, tool
from langgraph.types import Command

from guard import Guard, InMemoryLedger, Kind, Limits, Report, Result
from guard.adapters import ToolSpec, tool_effects
from guard.contrib.langchain import LoopGuardMiddleware

from ..support import Clock

LIMITS = Limits(deadline_ms=60_000, model_calls=12, requests=12, executions=10, polls=5)


class OfflineChatModel(FakeMessagesListChatModel):
    """LangChain's fake chat model with the ``bind_tools`` an agent needs."""

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> OfflineChatModel:
        return self


def asks(name: str, n: int, **args: Any) -> AIMessage:
    return AIMessage("", tool_calls=[{"name": name, "args": args, "id": f"call-{n}"}])


def run(
    tools: list[BaseTool],
    replies: list[BaseMessage],
    specs: dict[str, ToolSpec],
    *,
    before: Sequence[Any] = (),
    limits: Limits = LIMITS,
) -> tuple[dict[str, Any], Report, Clock]:
    """Run a guarded agent to its end: its final state, the stop report, the waits."""
    clock = Clock()
    guard = Guard(limits, ledger=InMemoryLedger(), tools=tool_effects(specs))
    middleware = LoopGuardMiddleware(guard, specs, wait=clock.wait)
    agent = create_agent(
        OfflineChatModel(responses=replies), tools=tools, middleware=[*before, middleware]
    )
    state = agent.invoke({"messages": [{"role": "user", "content": "Fetch the export."}]})
    assert middleware.report is not None
    return state, middleware.report, clock


def tool_texts(state: dict[str, Any]) -> list[str]:
    return [str(m.content) for m in state["messages"] if isinstance(m, ToolMessage)]


def polled(n: int, name: str = "export_status") -> list[BaseMessage]:
    """A model that looks at export e-7 ``n`` times, then answers."""
    return [*(asks(name, i, job="e-7") for i in range(n)), AIMessage("The export is ready.")]


def test_a_tool_message_built_by_the_tool_itself_carries_its_kind_in_the_artifact() -> None:
    looks: list[str] = []

    @tool
    def export_status(job: str, tool_call_id: Annotated[str, InjectedToolCallId]) -> ToolMessage:
        """Look at an export job."""
        looks.append(job)
        if len(looks) < 3:
            pending = Result(Kind.PENDING, {"job": job}, wait_ms=250)
            return ToolMessage("still running", tool_call_id=tool_call_id, artifact=pending)
        return ToolMessage("ready", tool_call_id=tool_call_id, artifact=Result(Kind.SUCCESS))

    state, report, clock = run([export_status], polled(3), {"export_status": ToolSpec("read")})

    assert (report.state, report.reason) == ("PARTIAL", "goal_unverified")
    assert (report.executions, report.polls) == (3, 2)
    assert clock.waits == [250, 250]
    assert tool_texts(state) == ["still running", "still running", "ready"]


def test_a_command_answer_carries_its_kind_in_its_tool_messages_artifact() -> None:
    @tool
    def export_status(job: str, tool_call_id: Annotated[str, InjectedToolCallId]) -> Command[Any]:
        """Look at an export job."""
        missing = Result(Kind.PRECONDITION, {"missing": "export permission"})
        answer = ToolMessage("not allowed", tool_call_id=tool_call_id, artifact=missing)
        return Command(update={"messages": [answer]})

    _, report, _ = run([export_status], polled(2), {"export_status": ToolSpec("read")})

    assert (report.state, report.reason) == ("NEEDS_HUMAN", "precondition")
    assert report.executions == 1
    assert "export permission" in report.detail


def test_the_artifact_wins_over_an_error_status() -> None:
    @tool
    def export_status(job: str, tool_call_id: Annotated[str, InjectedToolCallId]) -> ToolMessage:
        """Look at an export job."""
        gone = Result(Kind.FATAL, {"error": f"export {job} was deleted"})
        return ToolMessage("gone", tool_call_id=tool_call_id, status="error", artifact=gone)

    _, report, _ = run([export_status], polled(3), {"export_status": ToolSpec("read")})

    # Without the artifact an error message is RETRYABLE, and the model could ask again.
    assert (report.state, report.reason) == ("FAILED", "fatal")
    assert report.executions == 1


def test_a_stop_for_a_missing_precondition_tells_the_reader_what_is_missing() -> None:
    @tool(response_format="content_and_artifact")
    def coupons(sku: int) -> tuple[str, Result]:
        """List the coupons of a product."""
        return "no shop configured", Result(Kind.PRECONDITION, {"missing": "shop_id"})

    state, report, _ = run([coupons], [asks("coupons", 0, sku=1)], {"coupons": ToolSpec("read")})

    last = state["messages"][-1]
    assert isinstance(last, AIMessage) and last.name == "loopguard"
    assert 'Detail: coupons returned PRECONDITION: {"missing": "shop_id"}' in str(last.content)
    assert report.resume_condition.startswith("Provide the missing precondition")


def test_a_result_without_data_is_told_apart_by_the_text_the_model_reads() -> None:
    @tool(response_format="content_and_artifact")
    def load(what: str) -> tuple[str, Result]:
        """Load a record."""
        return f"the {what} record", Result(Kind.SUCCESS)

    replies = [asks("load", 0, what="incident"), asks("load", 1, what="owner"), AIMessage("Ok.")]
    _, report, _ = run([load], replies, {"load": ToolSpec("read")})

    assert report.revision == 2  # two new answers, read from their text (no inspector)
    assert report.explored == 2


def test_a_reused_write_answers_with_the_text_its_execution_gave() -> None:
    sent: list[int] = []

    @tool(response_format="content_and_artifact")
    def notify(incident: int) -> tuple[str, Result]:
        """Send the first notice about an incident."""
        sent.append(incident)
        return f"notice sent for incident {incident}", Result(Kind.SUCCESS)

    specs = {"notify": ToolSpec("write", lambda args: f"incident-{args['incident']}-notice")}
    replies = [asks("notify", 0, incident=42), asks("notify", 1, incident=42), AIMessage("Ok.")]
    state, report, _ = run([notify], replies, specs)

    assert sent == [42]
    assert tool_texts(state) == ["notice sent for incident 42"] * 2
    assert [str(op.state) for op in report.operations] == ["COMMITTED"]


def test_a_declared_results_own_attempts_add_to_the_retry_middlewares() -> None:
    tries: list[str] = []

    @tool(response_format="content_and_artifact")
    def export_status(job: str) -> tuple[str, Result]:
        """Look at an export job."""
        tries.append(job)
        if len(tries) == 1:
            raise ConnectionError("the export service did not answer")
        return "ready", Result(Kind.SUCCESS, {"job": job}, attempts=2)  # it retried inside

    retry = ToolRetryMiddleware(max_retries=2, initial_delay=0, backoff_factor=0, jitter=False)
    _, report, _ = run(
        [export_status], polled(1), {"export_status": ToolSpec("read")}, before=[retry]
    )

    assert len(tries) == 2
    assert report.executions == 3  # the failed entry, then one entry of two tries


def test_an_artifact_of_an_unknown_kind_stops_as_a_bad_result() -> None:
    @tool(response_format="content_and_artifact")
    def export_status(job: str) -> tuple[str, Result]:
        """Look at an export job."""
        return "maybe", Result("MAYBE", {"job": job})

    _, report, _ = run([export_status], polled(2), {"export_status": ToolSpec("read")})

    assert (report.state, report.reason) == ("FAILED", "bad_result")


def test_a_tool_with_no_result_artifact_still_reports_its_text_as_success() -> None:
    @tool(response_format="content_and_artifact")
    def export_status(job: str) -> tuple[str, dict[str, Any]]:
        """Look at an export job."""
        return "ready", {"rows": 3}  # an artifact of its own, not a Result

    _, report, _ = run([export_status], polled(1), {"export_status": ToolSpec("read")})

    assert (report.state, report.reason) == ("PARTIAL", "goal_unverified")
    assert report.revision == 1
    assert json.loads(json.dumps(report.to_dict()))["used"]["explored"] == 1
