"""Every driver ends the same scripted loop the same way: ``Guard.run``, the LangChain
middleware and the Agents SDK run on a local guard (``tests/guard/integrations``), and here
the two that go through the console: an attached client's ``RemoteGuard.run`` against a
live console, and the hosted runner driving a console agent that plays the same script.

One loop is what the model asks, turn by turn, and what the business behind the tools
answers (``test_result_kinds.LOOPS``). Each must end in the same state, for the same reason,
after the same executions, with the same counts in its stop report, whichever driver ran
it. A hosted agent always has a trusted inspector, so the hosted runner plays the loops
that have one.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from typing import Any

import pytest
from django.contrib.auth.models import User

from console.agents import Agent, Tool
from console.api.tokens import api_token_issue
from console.drivers import runner
from console.models import StopReport, Task
from console.records.roles import Role, assign
from guard import Call, Evidence, Finish, Report, Result
from guard.adapters import tool_effects
from guard.remote import RemoteGuard
from tests.guard.integrations import test_result_kinds as kinds

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

_DESKS: dict[str, kinds.Desk] = {}  # the business behind one hosted run, by its run id


def _call(name: str, args: Mapping[str, Any]) -> Call:
    spec = kinds.SPECS[name]
    key = None if spec.operation_key is None else spec.operation_key(dict(args))
    return Call(name, dict(args), spec.effect, key)


class LoopAgent(Agent):
    """A hosted agent that plays one loop of ``LOOPS``: the model's turns from the script
    (its place in the script kept in its memory), the tools and inspector from its desk."""

    name = "every_driver_loop"
    title = "A scripted loop (tests)"

    def __init__(self, task_id: int, input: Mapping[str, Any], memory: dict[str, Any]) -> None:
        super().__init__(task_id, input, memory)
        self.loop = kinds.LOOPS[str(input["loop"])]
        self.desk = _DESKS[str(input["run"])]

    def tools(self) -> Sequence[Tool]:
        def run(call: Call) -> Result:
            return self.desk.answer(call.tool, dict(call.args))

        return [Tool(name, spec.effect, run) for name, spec in kinds.SPECS.items()]

    def plan(self, observation: Any) -> Call | Finish:
        turn = int(self.memory.get("turn", 0))
        if turn >= len(self.loop.turns):
            return Finish(self.loop.answer)
        self.memory["turn"] = turn + 1
        return _call(*self.loop.turns[turn])

    def inspect(self, result: Result | None, step: Call | Finish) -> Evidence:
        return self.desk.inspect(result, step)


@pytest.fixture
def hosted(settings: Any) -> Any:
    settings.LOOPGUARD_AGENTS = {**settings.LOOPGUARD_AGENTS, LoopAgent.name: _path(LoopAgent)}

    def run(loop: kinds.Loop, name: str) -> kinds.Ended:
        run_id = uuid.uuid4().hex
        desk = _DESKS[run_id] = loop.desk()
        limits = {k: v for k, v in asdict(loop.limits).items() if v is not None}
        task = runner_task(name, run_id, limits)
        runner.drive(task.id)
        stored = StopReport.objects.filter(task_id=task.id).latest("id")
        return kinds.Ended(Report.from_dict(stored.report), desk)

    return run


def runner_task(loop_name: str, run_id: str, limits: dict[str, Any]) -> Task:
    from console.services import task_start

    return task_start(
        agent=LoopAgent.name,
        input={"loop": loop_name, "run": run_id},
        limits=limits,
        enqueue=lambda task_id: None,  # the test drives it, in this process
    )


@pytest.fixture
def remote(live_server: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("NO_PROXY", "*")
    user = User.objects.create_user("every-driver")
    assign(user, [Role.AGENT])
    secret = api_token_issue(user=user, name="every driver")[1]

    def run(loop: kinds.Loop, name: str) -> kinds.Ended:
        desk = loop.desk()
        turns = iter(loop.turns)

        def plan(observation: Any) -> Call | Finish:
            for tool, args in turns:
                return _call(tool, args)
            return Finish(loop.answer)

        def execute(call: Call) -> Result:
            return desk.answer(call.tool, dict(call.args))

        with RemoteGuard.start(
            str(live_server.url),
            token=secret,
            agent="every-driver",
            tools=tool_effects(kinds.SPECS),
            client="the cross-driver test",
            limits=loop.limits,
            heartbeat=False,
        ) as guard:
            report = guard.run(plan, execute, desk.inspect if loop.inspected else None)
        return kinds.Ended(report, desk)

    return run


def _path(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _summary(report: Report) -> dict[str, Any]:
    return {
        "ending": (str(report.state), str(report.reason)),
        "counts": (report.requests, report.executions, report.polls, report.explored),
        "revision": report.revision,
        "operations": [(op.key, str(op.state)) for op in report.operations],
    }


INSPECTED = [name for name, loop in kinds.LOOPS.items() if loop.inspected]


@pytest.mark.parametrize("name", kinds.LOOPS)
def test_an_attached_client_ends_each_loop_as_guard_run_does(remote: Any, name: str) -> None:
    loop = kinds.LOOPS[name]

    ended = remote(loop, name)

    assert kinds.ending(ended) == loop.expected
    assert ended.desk.executions == loop.expected[2]  # executions are real entries
    assert loop.detail in ended.report.detail
    assert _summary(ended.report) == _summary(kinds.under_guard_run(loop).report)


@pytest.mark.parametrize("name", INSPECTED)
def test_the_hosted_runner_ends_each_loop_as_guard_run_does(hosted: Any, name: str) -> None:
    loop = kinds.LOOPS[name]

    ended = hosted(loop, name)

    assert kinds.ending(ended) == loop.expected
    assert ended.desk.executions == loop.expected[2]
    assert loop.detail in ended.report.detail
    assert _summary(ended.report) == _summary(kinds.under_guard_run(loop).report)
