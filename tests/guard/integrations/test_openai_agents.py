"""The guard in real OpenAI Agents SDK runs, the model played by the SDK's own ScriptedModel.

``agents.testing.ScriptedModel`` is the SDK's offline test double at its ``Model``
interface: ``Runner`` drives it exactly as it drives a real model (hooks, parallel tool
tasks, tool outputs fed back as input). Its steps are consumed in order; a step left over
is a model call the guard prevented, and a call beyond the script would raise.
"""

from __future__ import annotations

from typing import Any

import pytest

agents = pytest.importorskip("agents")

from agents import Agent, RunConfig, Usage  # noqa: E402
from agents.items import ToolCallOutputItem  # noqa: E402
from agents.testing import ModelStep, ScriptedModel, assistant_message, function_call  # noqa: E402

from guard import Call, Evidence, Finish, Guard, Limits, OperationState, Result  # noqa: E402
from guard.contrib.openai_agents import GuardedOutcome, GuardedRun, GuardStopped  # noqa: E402

from ..support import Shop  # noqa: E402

LIMITS = Limits(deadline_ms=60_000, model_calls=8, requests=8, executions=6, same=2, stagnant=3)
QUIET = RunConfig(tracing_disabled=True)  # no trace export to OpenAI from the tests


def refund_key(args: Any) -> str:
    return f"refund-order-{args['order']}"


def shop_agent(guarded: GuardedRun, shop: Shop, model: ScriptedModel, *, lose: bool = False) -> Any:
    refund = shop.lose_refund if lose else shop.send_refund
    return Agent(
        name="refunds",
        instructions="Refund the order the user names, once.",
        model=model,
        tools=[
            guarded.tool(shop.find_order, effect="read"),
            guarded.tool(
                refund, name_override="send_refund", effect="write", operation_key=refund_key
            ),
        ],
    )


def call(name: str, order: int, call_id: str) -> Any:
    return function_call(name, {"order": order}, call_id=call_id)


def outputs(outcome: GuardedOutcome) -> list[str]:
    """What the tools answered the model, in order, however the run ended."""
    items = outcome.result.new_items if outcome.result is not None else ()
    if outcome.run_data is not None:
        items = outcome.run_data.new_items
    return [str(item.output) for item in items if isinstance(item, ToolCallOutputItem)]


def test_a_tool_called_again_and_again_is_stopped_same_call_and_the_run_ends_with_the_report():
    shop = Shop()
    guarded = GuardedRun(Guard(LIMITS))
    model = ScriptedModel([[call("find_order", 42, f"c{n}")] for n in range(6)])

    outcome = guarded.run_sync(shop_agent(guarded, shop, model), "Refund 42", run_config=QUIET)

    assert (outcome.report.state, outcome.report.reason) == ("PARTIAL", "same_call")
    assert shop.lookups == [42, 42]  # the third identical request never ran
    assert outcome.result is None
    assert len(model.calls) == 3 and model.remaining_steps == 3  # no model call after the stop
    assert guarded.report is outcome.report


def test_a_write_runs_once_and_a_repeated_request_reuses_its_result():
    shop = Shop()
    guarded = GuardedRun(Guard(LIMITS))
    model = ScriptedModel(
        [
            [call("send_refund", 42, "c1")],
            [call("send_refund", 42, "c2")],
            [assistant_message("Refunded.")],
        ]
    )

    outcome = guarded.run_sync(shop_agent(guarded, shop, model), "Refund 42", run_config=QUIET)

    assert shop.refunds == [42]
    assert outputs(outcome) == ["refund 1 sent for order 42", "refund 1 sent for order 42"]
    report = outcome.report
    assert (report.executions, report.requests) == (1, 2)
    assert [(op.key, op.state) for op in report.operations] == [
        ("refund-order-42", OperationState.COMMITTED)
    ]


def test_a_lost_write_is_never_offered_again_and_its_siblings_are_refused_without_a_retry():
    shop = Shop()
    guarded = GuardedRun(Guard(LIMITS))
    model = ScriptedModel(
        [
            [call("send_refund", 42, "c1"), call("find_order", 43, "c2")],
            [call("send_refund", 42, "c3")],
        ]
    )
    # One tool at a time, so that the lookup meets the stop at its entry.
    config = RunConfig(tracing_disabled=True, tool_execution={"max_function_tool_concurrency": 1})

    agent = shop_agent(guarded, shop, model, lose=True)
    outcome = guarded.run_sync(agent, "Refund 42", run_config=config)

    assert (outcome.report.state, outcome.report.reason) == ("NEEDS_HUMAN", "executor_error")
    assert [op.state for op in outcome.report.uncertain] == [OperationState.UNKNOWN]
    assert shop.refunds == [42] and shop.lookups == []
    lost, refused = outputs(outcome)
    assert "will not be run again" in lost
    assert refused.startswith("not run: the task stopped (NEEDS_HUMAN/executor_error)")
    for text in (lost, refused):
        assert "retry" not in text.lower() and "try again" not in text.lower()
    assert model.remaining_steps == 1  # the model never saw the answers, let alone asked again


def test_a_nudged_repeat_tells_the_model_without_running_or_inviting_a_retry():
    shop = Shop()
    guarded = GuardedRun(Guard(LIMITS, nudge=True))
    model = ScriptedModel(
        [
            [call("find_order", 42, "c1")],
            [call("find_order", 42, "c2")],
            [call("find_order", 42, "c3")],
            [assistant_message("Order 42 was delivered.")],
        ]
    )

    outcome = guarded.run_sync(shop_agent(guarded, shop, model), "Where is 42?", run_config=QUIET)

    nudges = [text for text in outputs(outcome) if not text.startswith("order 42")]
    assert nudges, outputs(outcome)
    assert shop.lookups == [42, 42]
    for text in nudges:
        assert "retry" not in text.lower() and "try again" not in text.lower()


def test_the_model_call_budget_ends_the_run_before_another_llm_call():
    shop = Shop()
    guarded = GuardedRun(Guard(Limits(model_calls=2)))
    model = ScriptedModel(
        [
            [call("find_order", 1, "c1")],
            [call("find_order", 2, "c2")],
            [call("find_order", 3, "c3")],
        ]
    )

    outcome = guarded.run_sync(shop_agent(guarded, shop, model), "Look around", run_config=QUIET)

    assert (outcome.report.state, outcome.report.reason) == ("PARTIAL", "model_budget")
    assert len(model.calls) == 2 and model.remaining_steps == 1
    assert shop.lookups == [1, 2]
    assert outcome.report.model_calls == 2


def test_a_legitimate_run_ends_with_the_report_and_the_tokens_charged():
    shop = Shop()
    guarded = GuardedRun(Guard(LIMITS))
    usage = Usage(requests=1, input_tokens=100, output_tokens=20, total_tokens=120)
    model = ScriptedModel(
        [
            ModelStep(output=[call("find_order", 42, "c1")], usage=usage),
            ModelStep(output=[call("send_refund", 42, "c2")], usage=usage),
            ModelStep(output=[assistant_message("Order 42 refunded.")], usage=usage),
        ]
    )

    outcome = guarded.run_sync(shop_agent(guarded, shop, model), "Refund 42", run_config=QUIET)

    assert outcome.result is not None and outcome.result.final_output == "Order 42 refunded."
    report = outcome.report
    # No inspector: the model's word is not verification, the work done is in the report.
    assert (report.state, report.reason) == ("PARTIAL", "goal_unverified")
    assert (report.model_calls, report.executions, report.tokens) == (3, 2, 360)
    assert shop.refunds == [42]
    assert report.revision == 2  # a never-seen read result and a committed write


def test_a_run_with_a_trusted_inspector_completes_when_the_records_say_so():
    shop = Shop()

    def inspect(result: Result | None, subject: Call | Finish) -> Evidence:
        # The shop's own records, never the model's word, say what happened.
        write = isinstance(subject, Call) and subject.effect == "write"
        committed = 42 in shop.refunds if write else None
        return Evidence(len(shop.refunds), done=shop.refunds == [42], committed=committed)

    guarded = GuardedRun(Guard(LIMITS), inspect=inspect)
    model = ScriptedModel([[call("send_refund", 42, "c1")], [assistant_message("Refunded.")]])

    outcome = guarded.run_sync(shop_agent(guarded, shop, model), "Refund 42", run_config=QUIET)

    assert (outcome.report.state, outcome.report.reason) == ("COMPLETED", "goal_met")


def test_a_call_to_a_tool_the_guard_does_not_know_stops_the_turn_before_anything_runs():
    shop = Shop()
    guarded = GuardedRun(Guard(LIMITS))
    unguarded = agents.function_tool(shop.send_refund, name_override="raw_refund")
    model = ScriptedModel([[call("find_order", 42, "c1"), call("raw_refund", 42, "c2")]])
    agent = shop_agent(guarded, shop, model)
    agent.tools.append(unguarded)

    outcome = guarded.run_sync(agent, "Refund 42", run_config=QUIET)

    assert (outcome.report.state, outcome.report.reason) == ("FAILED", "bad_call")
    assert shop.lookups == [] and shop.refunds == []


def test_a_stopped_guard_ends_a_new_run_before_its_first_model_call():
    shop = Shop()
    guarded = GuardedRun(Guard(Limits(model_calls=1)))
    first = ScriptedModel([[call("find_order", 1, "c1")], [assistant_message("done")]])
    guarded.run_sync(shop_agent(guarded, shop, first), "Look", run_config=QUIET)
    report = guarded.report

    second = ScriptedModel([[assistant_message("done")]])
    agent = Agent(name="again", model=second)
    with pytest.raises(GuardStopped) as stopped:
        agents.Runner.run_sync(agent, "Look again", hooks=guarded.hooks, run_config=QUIET)

    assert stopped.value.report is report and report is not None
    assert report.reason == "model_budget"
    assert second.calls == ()


def test_a_guarded_tool_refuses_to_run_outside_a_guarded_run():
    shop = Shop()
    guarded = GuardedRun(Guard(LIMITS))
    model = ScriptedModel([[call("send_refund", 42, "c1")], [assistant_message("done")]])

    with pytest.raises(agents.exceptions.UserError, match="outside a guarded run"):
        agents.Runner.run_sync(shop_agent(guarded, shop, model), "Refund 42", run_config=QUIET)

    assert shop.refunds == []


def test_a_spend_budget_without_a_reservation_is_refused_before_anything_runs():
    with pytest.raises(ValueError, match="reserve="):
        GuardedRun(Guard(Limits(spend=100)))


def test_a_model_call_whose_reservation_does_not_fit_is_never_sent():
    shop = Shop()
    guarded = GuardedRun(Guard(Limits(spend=100)), reserve=60)
    model = ScriptedModel([[call("find_order", 1, "c1")], [call("find_order", 2, "c2")]])

    outcome = guarded.run_sync(shop_agent(guarded, shop, model), "Look around", run_config=QUIET)

    assert (outcome.report.state, outcome.report.reason) == ("PARTIAL", "spend_budget")
    assert len(model.calls) == 1 and shop.lookups == [1]
    assert outcome.report.spend == 60
