"""How an Agents SDK function tells the guard its result kind: it returns a ``guard.Result``.

The model is the SDK's own offline ``agents.testing.ScriptedModel``, driven by ``Runner``
as a real model is. The comparison with ``Guard.run`` and LangChain is in
test_result_kinds.py.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

pytest.importorskip("agents")

from agents import Agent
from agents.testing import ScriptedModel, assistant_message, function_call

from guard import Call, Evidence, Finish, Guard, Kind, Limits, OperationState, Result
from guard.contrib.openai_agents import GuardedRun

from .test_openai_agents import QUIET, outputs

LIMITS = Limits(deadline_ms=60_000, model_calls=12, requests=12, executions=10, polls=5)


def looks(n: int) -> list[Any]:
    steps: list[Any] = [
        [function_call("export_status", {"job": "e-7"}, call_id=f"c{i}")] for i in range(n)
    ]
    return [*steps, [assistant_message("The export is ready.")]]


def test_the_model_reads_a_pending_job_as_its_kind_and_data_then_the_finished_result() -> None:
    seen: list[str] = []

    def export_status(job: str) -> Result:
        """Look at an export job."""
        seen.append(job)
        if len(seen) < 3:
            return Result(Kind.PENDING, {"job": job, "state": "running"}, wait_ms=1)
        return Result(Kind.SUCCESS, {"job": job, "url": "https://files/e-7.csv"})

    guarded = GuardedRun(Guard(LIMITS))
    model = ScriptedModel(looks(3))
    agent = Agent(name="exports", model=model, tools=[guarded.tool(export_status)])

    outcome = guarded.run_sync(agent, "Fetch export e-7", run_config=QUIET)

    assert (outcome.report.state, outcome.report.reason) == ("PARTIAL", "goal_unverified")
    assert (outcome.report.executions, outcome.report.polls) == (3, 2)
    answers = [json.loads(text) for text in outputs(outcome)]
    assert answers[:2] == [{"kind": "PENDING", "data": {"job": "e-7", "state": "running"}}] * 2
    assert answers[2] == {"job": "e-7", "url": "https://files/e-7.csv"}
    assert model.remaining_steps == 0


def test_a_write_that_needs_a_missing_precondition_waits_for_a_person_not_committed() -> None:
    charged: list[int] = []

    def refund(order: int) -> Result:
        """Refund an order."""
        return Result(Kind.PRECONDITION, {"missing": "a card on file", "order": order})

    def inspect(result: Result | None, subject: Call | Finish) -> Evidence:
        # The payment records say nothing was charged.
        write = isinstance(subject, Call) and subject.effect == "write"
        return Evidence(len(charged), False, committed=False if write else None)

    guarded = GuardedRun(Guard(LIMITS), inspect=inspect)
    model = ScriptedModel([[function_call("refund", {"order": 42}, call_id="c1")]] * 2)
    tool = guarded.tool(refund, effect="write", operation_key=lambda a: f"refund-{a['order']}")
    agent = Agent(name="refunds", model=model, tools=[tool])

    outcome = guarded.run_sync(agent, "Refund order 42", run_config=QUIET)

    report = outcome.report
    assert (report.state, report.reason) == ("NEEDS_HUMAN", "precondition")
    assert "a card on file" in report.detail
    assert [(op.key, op.state) for op in report.operations] == [
        ("refund-42", OperationState.NOT_COMMITTED)
    ]
    assert model.remaining_steps == 1  # the run ended before the model was asked again
