"""Every result kind ends a task the same way under ``Guard.run``, the LangChain middleware
and a guarded Agents SDK run, and so does an agent that reads before it writes.

One scripted loop — what the model asks, turn by turn, and what the business behind the
tools answers — is driven three ways: by ``Guard.run`` over plain functions, by
``create_agent`` with LangChain's own offline chat model (``FakeMessagesListChatModel``),
and by ``Runner`` with the SDK's own ``agents.testing.ScriptedModel``. A LangChain tool says
its kind with a ``guard.Result`` as its message's artifact
(``response_format="content_and_artifact"``); an SDK function returns the ``Result``. Each
loop must end in the same state, for the same reason, after the same executions.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import pytest

pytest.importorskip("langchain")  # the extras are missing: the test command installs them
pytest.importorskip("agents")

from agents import Agent
from agents.testing import ScriptedModel, assistant_message, function_call
from langchain.agents import create_agent
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.tools import BaseTool, tool

from guard import (
    Call,
    Evidence,
    Finish,
    Guard,
    InMemoryLedger,
    Kind,
    Limits,
    Report,
    Result,
)
from guard.adapters import ToolSpec, tool_effects
from guard.contrib.langchain import LoopGuardMiddleware
from guard.contrib.openai_agents import GuardedRun
from guard.steps import ENDED_WITHOUT_ANSWER

from ..support import Clock
from .test_langchain_result_kinds import OfflineChatModel
from .test_openai_agents import QUIET

LIMITS = Limits(
    deadline_ms=60_000, model_calls=12, requests=12, executions=10, same=2, stagnant=3, polls=5
)
WAIT_MS = 1  # what a RETRYABLE or PENDING answer asks for (the SDK run really sleeps it)

SPECS = {
    "export_status": ToolSpec("read"),
    "fetch_rates": ToolSpec("read"),
    "coupons": ToolSpec("read"),
    "read_archive": ToolSpec("read"),
    "load": ToolSpec("read"),
    "search": ToolSpec("read"),
    "send_notice": ToolSpec("write", lambda args: f"incident-{args['incident']}-first-notice"),
    "refund": ToolSpec("write", lambda args: f"order-{args['order']}-refund"),
    "read_feed": ToolSpec("read"),
    "post_status": ToolSpec("write", lambda args: f"incident-{args['incident']}-status"),
}


class Desk:
    """The business behind every tool: it counts each real execution and keeps the records
    a trusted inspector reads."""

    def __init__(self, export_ready_on: int | None) -> None:
        self.export_ready_on = export_ready_on  # the look at which the export is ready
        self.runs: Counter[str] = Counter()
        self.notices: list[str] = []

    @property
    def executions(self) -> int:
        return sum(self.runs.values())

    def answer(self, tool: str, args: dict[str, Any]) -> Result:
        """What the tool ``tool`` returns for ``args``, in the guard's words."""
        self.runs[tool] += 1
        if tool == "export_status":
            if self.export_ready_on is None or self.runs[tool] < self.export_ready_on:
                return Result(Kind.PENDING, {"job": args["job"], "state": "running"}, WAIT_MS)
            return Result(Kind.SUCCESS, {"job": args["job"], "url": "https://files/e-7.csv"})
        if tool == "fetch_rates":
            return Result(Kind.RETRYABLE, {"error": "rate service busy"}, WAIT_MS)
        if tool == "coupons":
            return Result(Kind.PRECONDITION, {"missing": "shop_id"})
        if tool == "read_archive":
            return Result(Kind.FATAL, {"error": f"archive box {args['box']} was destroyed"})
        if tool == "load":
            return Result(Kind.SUCCESS, {"what": args["what"], "facts": [args["what"].upper()]})
        if tool == "search":
            return Result(Kind.SUCCESS, {"orders": []})  # reworded or not, nothing found
        if tool == "send_notice":
            self.notices.append(f"incident-{args['incident']}-first-notice")
            return Result(Kind.SUCCESS, {"notice": len(self.notices)})
        if tool == "refund":
            return Result(Kind.FATAL, {"error": "the card was closed; nothing was charged"})
        if tool == "read_feed":
            raise ConnectionError(f"the {args['feed']} feed is unreachable")
        if tool == "post_status":  # posted, and then its answer was lost on the way back
            raise TimeoutError("the status page did not answer")
        raise AssertionError(f"no tool {tool}")

    def inspect(self, result: Result | None, subject: Call | Finish) -> Evidence:
        """Trusted records: progress is notices sent and exports ready; the goal is met once
        the model finishes with one of them done."""
        ready = self.export_ready_on is not None and self.runs["export_status"] >= (
            self.export_ready_on
        )
        revision = len(self.notices) + int(ready)
        if isinstance(subject, Call) and subject.effect == "write":
            key = SPECS[subject.tool].operation_key
            assert key is not None
            return Evidence(revision, False, committed=key(subject.args) in self.notices)
        return Evidence(revision, isinstance(subject, Finish) and revision > 0)


@dataclass(frozen=True)
class Loop:
    """One scripted loop: the model's tool calls, one per model call, then its answer."""

    turns: tuple[tuple[str, dict[str, Any]], ...]
    expected: tuple[str, str, int]  # state, reason, executions
    inspected: bool = False
    export_ready_on: int | None = None
    limits: Limits = LIMITS
    detail: str = ""  # what the stop report's detail must hold
    answer: str = "Done."

    def desk(self) -> Desk:
        return Desk(self.export_ready_on)


def times(n: int, tool: str, **args: Any) -> tuple[tuple[str, dict[str, Any]], ...]:
    return tuple((tool, dict(args)) for _ in range(n))


READS_THEN_WRITE = (
    ("load", {"what": "incident"}),
    ("load", {"what": "owner"}),
    ("load", {"what": "rota"}),
    ("send_notice", {"incident": 42}),
)
REWORDED = tuple(("search", {"q": q}) for q in ("late", "late orders", "delayed", "slow", "stuck"))

LOOPS: dict[str, Loop] = {
    "a job ready on its fifth look completes": Loop(
        times(5, "export_status", job="e-7"),
        ("COMPLETED", "goal_met", 5),
        inspected=True,
        export_ready_on=5,
    ),
    "a job ready on its fifth look runs to the finish without an inspector": Loop(
        times(5, "export_status", job="e-7"),
        ("PARTIAL", "goal_unverified", 5),
        export_ready_on=5,
    ),
    "a job that is never ready stops at its poll budget": Loop(
        times(9, "export_status", job="e-7"),
        ("PARTIAL", "poll_budget", 6),  # the first look, then polls=5
        inspected=True,
    ),
    "a read that keeps answering retryable stops as a repeat": Loop(
        times(4, "fetch_rates", day="2024-05-01"),
        ("PARTIAL", "same_call", 2),
        inspected=True,
    ),
    "a missing precondition stops for a person, naming it": Loop(
        times(2, "coupons", sku=1),
        ("NEEDS_HUMAN", "precondition", 1),
        inspected=True,
        detail='coupons returned PRECONDITION: {"missing": "shop_id"}',
    ),
    "a missing precondition stops the same without an inspector": Loop(
        times(2, "coupons", sku=1),
        ("NEEDS_HUMAN", "precondition", 1),
        detail="shop_id",
    ),
    "a permanent error fails the task": Loop(
        times(2, "read_archive", box=7),
        ("FAILED", "fatal", 1),
        inspected=True,
        detail="archive box 7 was destroyed",
    ),
    "a write refused for good, verified not committed, fails the task": Loop(
        times(2, "refund", order=42),
        ("FAILED", "fatal", 1),
        inspected=True,
        detail="the card was closed",
    ),
    # Without an inspector nothing says the refund did not happen: a person settles it.
    "a write refused for good on the tool's word alone waits for a person": Loop(
        times(2, "refund", order=42),
        ("NEEDS_HUMAN", "unknown_commit", 1),
    ),
    "three distinct reads then the write complete with an inspector": Loop(
        READS_THEN_WRITE, ("COMPLETED", "goal_met", 4), inspected=True
    ),
    "three distinct reads then the write run to the finish without one": Loop(
        READS_THEN_WRITE, ("PARTIAL", "goal_unverified", 4)
    ),
    "reworded searches with the same answer stop with an inspector": Loop(
        REWORDED, ("PARTIAL", "no_progress", 3), inspected=True
    ),
    "reworded searches with the same answer stop without one": Loop(
        REWORDED,
        ("PARTIAL", "no_progress", 4),  # its first answer was new: progress
    ),
    # A tool's exception is the guard's to judge, in every driver: a read's fails the task,
    # a write's leaves the write UNKNOWN for a person (no lookup here).
    "a read that raises fails the task": Loop(
        times(2, "read_feed", feed="status"),
        ("FAILED", "executor_error", 1),
        inspected=True,
        detail="ConnectionError: the status feed is unreachable",
    ),
    "a read that raises fails the task without an inspector too": Loop(
        times(2, "read_feed", feed="status"),
        ("FAILED", "executor_error", 1),
        detail="ConnectionError",
    ),
    "a write whose answer is lost waits for a person": Loop(
        times(2, "post_status", incident=42),
        ("NEEDS_HUMAN", "executor_error", 1),
        inspected=True,
        detail="TimeoutError",
    ),
    "three distinct reads stop early when the agent opts out of exploration": Loop(
        READS_THEN_WRITE,
        ("PARTIAL", "no_progress", 3),
        inspected=True,
        limits=replace(LIMITS, explore=0),
    ),
}


@dataclass
class Ended:
    """How one driver's run of a loop ended."""

    report: Report
    desk: Desk
    waits: list[float] = field(default_factory=list)


# -- the three drivers --------------------------------------------------------------------


def under_guard_run(loop: Loop) -> Ended:
    desk, clock = loop.desk(), Clock()
    guard = Guard(loop.limits, now=clock.now, wait=clock.wait, ledger=InMemoryLedger())
    turns = iter(loop.turns)

    def plan(observation: Any) -> Call | Finish:
        for name, args in turns:
            spec = SPECS[name]
            key = None if spec.operation_key is None else spec.operation_key(args)
            return Call(name, args, spec.effect, key)
        return Finish(loop.answer)

    def execute(call: Call) -> Result:
        return desk.answer(call.tool, dict(call.args))

    report = guard.run(plan, execute, desk.inspect if loop.inspected else None)
    return Ended(report, desk, clock.waits)


def langchain_tools(desk: Desk) -> list[BaseTool]:
    """The desk's tools as LangChain tools: text for the model, the Result as the artifact."""

    def answered(name: str, **args: Any) -> tuple[str, Result]:
        result = desk.answer(name, args)
        return json.dumps(result.data), result

    @tool(response_format="content_and_artifact")
    def export_status(job: str) -> tuple[str, Result]:
        """Look at an export job."""
        return answered("export_status", job=job)

    @tool(response_format="content_and_artifact")
    def fetch_rates(day: str) -> tuple[str, Result]:
        """Fetch the day's exchange rates."""
        return answered("fetch_rates", day=day)

    @tool(response_format="content_and_artifact")
    def coupons(sku: int) -> tuple[str, Result]:
        """List the coupons of a product."""
        return answered("coupons", sku=sku)

    @tool(response_format="content_and_artifact")
    def read_archive(box: int) -> tuple[str, Result]:
        """Read an archive box."""
        return answered("read_archive", box=box)

    @tool(response_format="content_and_artifact")
    def load(what: str) -> tuple[str, Result]:
        """Load a record about the incident."""
        return answered("load", what=what)

    @tool(response_format="content_and_artifact")
    def search(q: str) -> tuple[str, Result]:
        """Search the orders."""
        return answered("search", q=q)

    @tool(response_format="content_and_artifact")
    def send_notice(incident: int) -> tuple[str, Result]:
        """Send the first notice about an incident."""
        return answered("send_notice", incident=incident)

    @tool(response_format="content_and_artifact")
    def refund(order: int) -> tuple[str, Result]:
        """Refund an order."""
        return answered("refund", order=order)

    @tool(response_format="content_and_artifact")
    def read_feed(feed: str) -> tuple[str, Result]:
        """Read a status feed."""
        return answered("read_feed", feed=feed)

    @tool(response_format="content_and_artifact")
    def post_status(incident: int) -> tuple[str, Result]:
        """Post the incident's status."""
        return answered("post_status", incident=incident)

    return [
        export_status, fetch_rates, coupons, read_archive, load, search, send_notice, refund,
        read_feed, post_status,
    ]  # fmt: skip


def under_langchain(loop: Loop) -> Ended:
    desk, clock = loop.desk(), Clock()
    replies: list[BaseMessage] = [
        AIMessage("", tool_calls=[{"name": name, "args": args, "id": f"call-{n}"}])
        for n, (name, args) in enumerate(loop.turns)
    ]
    replies.append(AIMessage(loop.answer))
    guard = Guard(loop.limits, ledger=InMemoryLedger(), tools=tool_effects(SPECS))
    middleware = LoopGuardMiddleware(
        guard, SPECS, inspect=desk.inspect if loop.inspected else None, wait=clock.wait
    )
    agent = create_agent(
        OfflineChatModel(responses=replies), tools=langchain_tools(desk), middleware=[middleware]
    )
    try:
        agent.invoke({"messages": [{"role": "user", "content": "Look after incident 42."}]})
    except (ConnectionError, TimeoutError):
        middleware.close()  # no retry middleware took a read's exception: the guard is told
    assert middleware.report is not None
    return Ended(middleware.report, desk, clock.waits)


def agents_sdk_functions(desk: Desk) -> list[Callable[..., Result]]:
    """The desk's tools as plain functions for the SDK: each returns its Result."""

    def export_status(job: str) -> Result:
        """Look at an export job."""
        return desk.answer("export_status", {"job": job})

    def fetch_rates(day: str) -> Result:
        """Fetch the day's exchange rates."""
        return desk.answer("fetch_rates", {"day": day})

    def coupons(sku: int) -> Result:
        """List the coupons of a product."""
        return desk.answer("coupons", {"sku": sku})

    def read_archive(box: int) -> Result:
        """Read an archive box."""
        return desk.answer("read_archive", {"box": box})

    def load(what: str) -> Result:
        """Load a record about the incident."""
        return desk.answer("load", {"what": what})

    def search(q: str) -> Result:
        """Search the orders."""
        return desk.answer("search", {"q": q})

    def send_notice(incident: int) -> Result:
        """Send the first notice about an incident."""
        return desk.answer("send_notice", {"incident": incident})

    def refund(order: int) -> Result:
        """Refund an order."""
        return desk.answer("refund", {"order": order})

    def read_feed(feed: str) -> Result:
        """Read a status feed."""
        return desk.answer("read_feed", {"feed": feed})

    def post_status(incident: int) -> Result:
        """Post the incident's status."""
        return desk.answer("post_status", {"incident": incident})

    return [
        export_status, fetch_rates, coupons, read_archive, load, search, send_notice, refund,
        read_feed, post_status,
    ]  # fmt: skip


def under_agents_sdk(loop: Loop) -> Ended:
    desk = loop.desk()
    guarded = GuardedRun(
        Guard(loop.limits, ledger=InMemoryLedger()),
        inspect=desk.inspect if loop.inspected else None,
    )
    steps: list[Any] = [
        [function_call(name, args, call_id=f"call-{n}")]
        for n, (name, args) in enumerate(loop.turns)
    ]
    steps.append([assistant_message(loop.answer)])
    tools = [
        guarded.tool(
            function,
            effect=SPECS[function.__name__].effect,
            operation_key=SPECS[function.__name__].operation_key,
        )
        for function in agents_sdk_functions(desk)
    ]
    agent = Agent(name="desk", model=ScriptedModel(steps), tools=tools)
    outcome = guarded.run_sync(agent, "Look after incident 42.", run_config=QUIET)
    return Ended(outcome.report, desk)


DRIVERS: dict[str, Callable[[Loop], Ended]] = {
    "Guard.run": under_guard_run,
    "langchain": under_langchain,
    "openai-agents": under_agents_sdk,
}


# -- the comparison -----------------------------------------------------------------------


def ending(ended: Ended) -> tuple[str, str, int]:
    report = ended.report
    return str(report.state), str(report.reason), report.executions


@pytest.mark.parametrize("driver", DRIVERS)
@pytest.mark.parametrize("name", LOOPS)
def test_each_loop_ends_as_expected_under_every_driver(name: str, driver: str) -> None:
    loop = LOOPS[name]

    ended = DRIVERS[driver](loop)

    assert ending(ended) == loop.expected
    assert ended.desk.executions == loop.expected[2]  # executions are real entries
    assert loop.detail in ended.report.detail


@pytest.mark.parametrize("name", LOOPS)
def test_each_loop_leaves_the_same_stop_report_whichever_driver_ran_it(name: str) -> None:
    loop = LOOPS[name]

    reports = {driver: run(loop).report for driver, run in DRIVERS.items()}

    def summary(report: Report) -> dict[str, Any]:
        return {
            "ending": (str(report.state), str(report.reason)),
            "counts": (report.requests, report.executions, report.polls, report.explored),
            "revision": report.revision,
            "detail": report.detail,
            "operations": [(op.key, str(op.state)) for op in report.operations],
        }

    reference = summary(reports["Guard.run"])
    for driver, report in reports.items():
        assert summary(report) == reference, driver


def test_a_job_ready_on_its_fifth_look_is_polled_four_times_each_after_its_wait() -> None:
    for driver in ("Guard.run", "langchain"):  # the SDK run waits with asyncio.sleep
        ended = DRIVERS[driver](LOOPS["a job ready on its fifth look completes"])

        assert ended.report.polls == 4, driver
        assert ended.waits == [WAIT_MS] * 4, driver  # one wait before each poll


def test_a_job_that_is_never_ready_is_polled_until_its_budget_whatever_drives_it() -> None:
    for driver, run in DRIVERS.items():
        ended = run(LOOPS["a job that is never ready stops at its poll budget"])

        assert ended.report.polls == LIMITS.polls, driver
        assert ended.desk.runs["export_status"] == 1 + LIMITS.polls, driver
        assert ended.report.call is not None
        assert ended.report.call["tool"] == "export_status"


def test_a_run_that_ends_on_a_tools_output_ends_goal_unverified_under_either_framework() -> None:
    # The export is ready on the first look: had the model said it was done, the inspector
    # would have verified it. It never said so: a tool's output ended the run.
    loop = Loop(
        times(1, "export_status", job="e-7"),
        ("PARTIAL", "goal_unverified", 1),
        inspected=True,
        export_ready_on=1,
    )
    endings = {}

    desk = loop.desk()
    guard = Guard(loop.limits, ledger=InMemoryLedger(), tools=tool_effects(SPECS))
    middleware = LoopGuardMiddleware(guard, SPECS, inspect=desk.inspect)

    @tool(return_direct=True)
    def export_status(job: str) -> str:
        """Look at an export job; its answer goes to the user as it is."""
        return json.dumps(desk.answer("export_status", {"job": job}).data)

    reply = AIMessage("", tool_calls=[{"name": "export_status", "args": {"job": "e-7"}, "id": "1"}])
    model = OfflineChatModel(responses=[reply, AIMessage("never asked")])
    agent = create_agent(model, tools=[export_status], middleware=[middleware])
    agent.invoke({"messages": [{"role": "user", "content": "Is the export ready?"}]})
    assert middleware.report is not None
    endings["langchain"] = middleware.report

    desk = loop.desk()
    guarded = GuardedRun(Guard(loop.limits, ledger=InMemoryLedger()), inspect=desk.inspect)
    status = next(f for f in agents_sdk_functions(desk) if f.__name__ == "export_status")
    agent_sdk = Agent(
        name="desk",
        model=ScriptedModel([[function_call("export_status", {"job": "e-7"}, call_id="1")]]),
        tools=[guarded.tool(status, effect="read")],
        tool_use_behavior="stop_on_first_tool",
    )
    endings["openai-agents"] = guarded.run_sync(agent_sdk, "Is it ready?", run_config=QUIET).report

    for driver, report in endings.items():
        assert ending(Ended(report, desk)) == loop.expected, driver
        assert report.detail == ENDED_WITHOUT_ANSWER, driver
