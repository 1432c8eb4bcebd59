"""The hosted demo agents reproduce the behaviour table against the support desk.

Each agent is driven in-process by a real guard with its own default limits, an in-memory
ledger and an executor that dispatches to the agent's tools; what a user would notice is
asserted: the state and reason, how many times a tool really ran, what the ledger holds and
which rows the desk has.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest
from django.conf import settings

from console.agents import Agent, agent_class
from console.demo import desk
from console.demo.agents import (
    BudgetBurner,
    ClaimedProgress,
    KeyConflict,
    LongRunner,
    LostResponse,
    MissingPrecondition,
    Oscillation,
    Paging,
    PermanentError,
    RepeatedWrite,
    RetryingRead,
    SlowJob,
    UnknownKind,
    UnverifiedFinish,
)
from console.demo.models import ExportJob, Fault, Notice, Order, Refund
from console.demo.support_desk import SupportDesk
from guard import (
    Call,
    Guard,
    InMemoryLedger,
    Kind,
    Limits,
    OperationState,
    Reason,
    Report,
    Result,
    State,
    Usage,
)
from tests.guard.support import Clock

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def seeded() -> None:
    desk.seed_demo_data()


@dataclass
class Run:
    """One guarded run of an agent, and what its tools really did."""

    agent: Agent
    guard: Guard
    report: Report
    entries: Counter[str] = field(default_factory=Counter)

    @property
    def executed(self) -> int:
        """Real entries into the agent's tools."""
        return sum(self.entries.values())

    def operation(self, key: str) -> OperationState:
        """The ledger state of ``key`` as the stop report shows it."""
        return next(op.state for op in self.report.operations if op.key == key)


def drive(
    agent: Agent,
    *,
    ledger: InMemoryLedger | None = None,
    limits: Mapping[str, Any] | None = None,
    lookups: Mapping[str, str] | None = None,
    **options: Any,
) -> Run:
    """Run ``agent`` under a guard with its default limits (or ``limits``) until it stops.

    ``lookups`` maps operation keys to the tool whose lookup may settle them: the runner's
    decision, never the agent's.
    """
    tools = {tool.name: tool for tool in agent.tools()}
    entries: Counter[str] = Counter()

    def execute(call: Call) -> Result:
        entries[call.tool] += 1
        return tools[call.tool].run(call)

    def lookup(key: str) -> Any:
        found = tools[(lookups or {})[key]].lookup
        assert found is not None
        return found(key)

    guard = Guard(
        Limits(**(limits if limits is not None else agent.default_limits)),
        ledger=ledger if ledger is not None else InMemoryLedger(),
        tools={tool.name: tool.effect for tool in tools.values()},
        **options,
    )
    report = guard.run(agent.plan, execute, agent.inspect, lookup=lookup if lookups else None)
    run = Run(agent, guard, report, entries)
    # Terminal is sticky: running again plans and executes nothing.
    before = run.executed
    assert guard.run(agent.plan, execute, agent.inspect) is report
    assert run.executed == before
    # Memory is what the runner persists between steps: it must survive a JSON round trip.
    assert json.loads(json.dumps(agent.memory)) == agent.memory
    return run


def outcome(run: Run) -> tuple[State, Reason, int]:
    """State, reason and real tool executions: the behaviour table's columns."""
    return (run.report.state, run.report.reason, run.executed)


# -- the registry --------------------------------------------------------------------------


BUILT_IN = [
    name for name, path in settings.LOOPGUARD_AGENTS.items() if path.startswith("console.demo.")
]


def test_every_built_in_agent_is_registered() -> None:
    # 16 scripted ones, and the model-planned support desk (tests.settings configure a model).
    assert len(BUILT_IN) == 17
    assert {"support_desk", "support_desk_model"} <= set(BUILT_IN)


@pytest.mark.parametrize("name", BUILT_IN)
def test_every_registered_agent_loads_and_its_example_input_and_limits_are_valid(
    name: str,
) -> None:
    cls = agent_class(name)

    assert cls.name == name
    assert cls.title and cls.description.endswith(".")
    cls.validate_input(cls.example_input)
    Limits(**cls.default_limits)
    agent = cls(1, dict(cls.example_input), {})
    names = [tool.name for tool in agent.tools()]
    assert len(names) == len(set(names))


@pytest.mark.parametrize(
    ("cls", "input", "message"),
    [
        (SupportDesk, {"order": 42, "reason": "damaged"}, "input needs 'amount_cents'"),
        (SupportDesk, {"order": 42, "amount_cents": 0, "reason": "x"}, "at least 1"),
        (SupportDesk, {"order": "42", "amount_cents": 5, "reason": "x"}, "'order' must be"),
        (SupportDesk, {"order": 42, "amount_cents": 5, "reason": " "}, "non-empty string"),
        (
            SupportDesk,
            {"order": 42, "amount_cents": 5, "reason": "x", "lose_response": "order_lookup"},
            "one of refund, notify_customer",
        ),
        (SupportDesk, {"order": 42, "amount_cents": 5, "reason": "x", "vip": 1}, "unknown input"),
        (LostResponse, {}, "input needs 'incident'"),
        (BudgetBurner, {"dimension": "tokens"}, "one of model_calls, executions"),
        (LongRunner, {"pages": 1000}, "at most 120"),
        (Paging, ["reports"], "must be a JSON object"),
    ],
)
def test_bad_input_is_refused_with_a_message_naming_the_problem(
    cls: type[Agent], input: Any, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        cls.validate_input(input)


# -- the support desk ------------------------------------------------------------------------

DESK_INPUT = {"order": 42, "amount_cents": 1500, "reason": "the parcel arrived damaged"}


def test_the_support_desk_refunds_notifies_and_completes_with_each_write_made_once() -> None:
    run = drive(SupportDesk(1, DESK_INPUT, {}))

    assert outcome(run) == (State.COMPLETED, Reason.GOAL_MET, 3)
    assert run.report.revision == 3
    assert run.operation("order-42-refund") is OperationState.COMMITTED
    assert run.operation("order-42-refund-notice") is OperationState.COMMITTED
    assert Refund.objects.get().amount_cents == 1500
    notice = Notice.objects.get()
    assert (notice.recipient, notice.idempotency_key) == (
        "ada@example.com",
        "order-42-refund-notice",
    )
    assert "We refunded 15.00 for order 42" in notice.text
    assert Order.objects.get(number=42).status == Order.Status.REFUNDED


def test_the_support_desk_asks_a_human_about_an_order_the_desk_does_not_have() -> None:
    run = drive(SupportDesk(1, {**DESK_INPUT, "order": 404}, {}))

    assert outcome(run) == (State.NEEDS_HUMAN, Reason.PRECONDITION, 1)
    assert Refund.objects.count() == 0


def test_the_support_desk_asks_a_human_when_the_desk_refuses_the_refund() -> None:
    run = drive(SupportDesk(1, {**DESK_INPUT, "amount_cents": 99_999}, {}))

    assert outcome(run) == (State.NEEDS_HUMAN, Reason.PRECONDITION, 2)
    assert run.operation("order-42-refund") is OperationState.NOT_COMMITTED
    assert Refund.objects.count() == 0


def test_the_support_desk_holds_a_refund_above_its_limit_before_it_runs() -> None:
    agent = SupportDesk(1, {**DESK_INPUT, "approve_above_cents": 1000}, {})

    run = drive(agent, needs_approval=agent.approval_policy())

    assert outcome(run) == (State.NEEDS_HUMAN, Reason.APPROVAL_REQUIRED, 1)  # the lookup only
    assert run.report.pending is not None
    assert (run.report.pending["tool"], run.report.pending["operation_key"]) == (
        "refund",
        "order-42-refund",
    )
    assert Refund.objects.count() == 0


def test_the_support_desk_refunds_at_or_below_its_limit_without_asking() -> None:
    agent = SupportDesk(1, {**DESK_INPUT, "approve_above_cents": 1500}, {})

    run = drive(agent, needs_approval=agent.approval_policy())

    assert outcome(run) == (State.COMPLETED, Reason.GOAL_MET, 3)


def test_a_lost_refund_response_is_settled_from_the_desk_when_the_runner_allows_lookups() -> None:
    agent = SupportDesk(1, {**DESK_INPUT, "lose_response": "refund"}, {})

    run = drive(agent, lookups={"order-42-refund": "refund"})

    assert outcome(run) == (State.COMPLETED, Reason.GOAL_MET, 3)
    assert run.operation("order-42-refund") is OperationState.COMMITTED
    assert (Refund.objects.count(), Notice.objects.count()) == (1, 1)


def test_a_lost_refund_response_goes_to_a_human_and_the_resumed_task_refunds_nothing_twice() -> (
    None
):
    ledger = InMemoryLedger()
    first = drive(SupportDesk(1, {**DESK_INPUT, "lose_response": "refund"}, {}), ledger=ledger)
    assert outcome(first) == (State.NEEDS_HUMAN, Reason.EXECUTOR_ERROR, 2)
    assert first.operation("order-42-refund") is OperationState.UNKNOWN

    # The reconciler finds the refund in the desk and says so.
    settlement = SupportDesk(1, DESK_INPUT, {}).tools()[1].lookup
    assert settlement is not None
    found = settlement("order-42-refund")
    assert found.committed is True
    ledger.resolve("order-42-refund", committed=True, result=found.result, evidence=found.evidence)

    resumed = SupportDesk(1, {**DESK_INPUT, "lose_response": "refund"}, first.agent.memory)
    second = drive(resumed, ledger=ledger, used=first.report.usage, revision=first.report.revision)

    assert outcome(second) == (State.COMPLETED, Reason.GOAL_MET, 1)  # only the notice ran
    assert second.report.executions == 3  # the budget carried over: 2 before, 1 now
    assert (Refund.objects.count(), Notice.objects.count()) == (1, 1)


# -- the behaviour table, row by row ----------------------------------------------------------


def test_three_pages_arriving_in_order_complete_the_paging_agent_at_revision_3() -> None:
    run = drive(Paging(1, {"collection": "reports"}, {}))

    assert outcome(run) == (State.COMPLETED, Reason.GOAL_MET, 3)
    assert run.report.revision == 3
    assert run.agent.memory["verified_pages"] == [1, 2, 3]


def test_a_page_the_desk_does_not_confirm_is_not_progress() -> None:
    agent = Paging(1, {}, {})
    forged = Result(Kind.SUCCESS, {"collection": "reports", "page": 1, "items": ["forged"]})

    evidence = agent.inspect(forged, Call("read_page", {"collection": "reports", "page": 1}))

    assert (evidence.revision, evidence.done) == (0, False)


def test_a_read_that_keeps_returning_retryable_runs_twice_then_stops_as_same_call() -> None:
    run = drive(RetryingRead(1, {"order": 42}, {}))

    assert outcome(run) == (State.PARTIAL, Reason.SAME_CALL, 2)
    assert run.report.requests == 3


def test_two_alternating_reads_run_three_times_and_the_fourth_stops_as_a_short_cycle() -> None:
    run = drive(Oscillation(1, {"incident": 7}, {}))

    assert outcome(run) == (State.PARTIAL, Reason.SHORT_CYCLE, 3)
    assert run.report.requests == 4
    assert run.report.call is not None and run.report.call["tool"] == "read_notices"


def test_changing_arguments_and_claims_of_progress_end_as_no_progress_at_revision_0() -> None:
    run = drive(ClaimedProgress(1, {"incident": 7}, {}))

    assert outcome(run) == (State.PARTIAL, Reason.NO_PROGRESS, 3)
    assert run.report.revision == 0


def test_a_committed_write_requested_again_runs_once_and_is_reused_until_no_progress() -> None:
    run = drive(RepeatedWrite(1, {"incident": 101}, {}))

    assert outcome(run) == (State.PARTIAL, Reason.NO_PROGRESS, 1)
    assert run.report.requests == 3
    assert [step["reused"] for step in run.report.completed] == [False, True, True]
    assert run.operation("incident-101-first-notice") is OperationState.COMMITTED
    assert Notice.objects.get().idempotency_key == "incident-101-first-notice"


LOST_KEY = "incident-102-first-notice"


def test_a_notice_whose_response_is_lost_stays_unknown_and_needs_a_human() -> None:
    run = drive(LostResponse(1, {"incident": 102}, {}))

    assert outcome(run) == (State.NEEDS_HUMAN, Reason.EXECUTOR_ERROR, 1)
    assert run.operation(LOST_KEY) is OperationState.UNKNOWN
    # It did go out, and the reconciler can find it by its operation key.
    assert Notice.objects.get().idempotency_key == LOST_KEY
    assert Fault.objects.filter(operation_key=LOST_KEY).count() == 1
    lookup = run.agent.tools()[0].lookup
    assert lookup is not None and lookup(LOST_KEY).committed is True


def test_the_lost_response_agent_leaves_settling_to_the_runner_and_a_human() -> None:
    assert LostResponse.auto_lookup is False
    assert SupportDesk.auto_lookup is True


def test_a_lost_notice_marked_committed_resumes_to_completed_with_one_notice() -> None:
    ledger = InMemoryLedger()
    first = drive(LostResponse(1, {"incident": 102}, {}), ledger=ledger)
    ledger.resolve(
        LOST_KEY,
        committed=True,
        result=Result(Kind.SUCCESS, {"notice": Notice.objects.get().pk}),
        evidence="notice found in the desk",
    )

    resumed = LostResponse(1, {"incident": 102}, first.agent.memory)
    second = drive(resumed, ledger=ledger, used=first.report.usage, revision=first.report.revision)

    assert outcome(second) == (State.COMPLETED, Reason.GOAL_MET, 0)  # reused, not re-sent
    assert second.report.executions == 1
    assert second.report.model_calls == first.report.model_calls + 1
    assert second.operation(LOST_KEY) is OperationState.COMMITTED
    assert Notice.objects.count() == 1


def test_a_lost_notice_wrongly_marked_not_committed_is_retried_without_a_second_notice() -> None:
    ledger = InMemoryLedger()
    first = drive(LostResponse(1, {"incident": 102}, {}), ledger=ledger)
    ledger.resolve(LOST_KEY, committed=False, evidence="looked in the wrong place")

    resumed = LostResponse(1, {"incident": 102}, first.agent.memory)
    second = drive(resumed, ledger=ledger, used=first.report.usage, revision=first.report.revision)

    # The desk's idempotency key and its memory of the fault make the retry harmless.
    assert outcome(second) == (State.COMPLETED, Reason.GOAL_MET, 1)
    assert Notice.objects.count() == 1
    assert Fault.objects.count() == 1


def test_one_operation_key_with_another_text_runs_once_then_stops_as_a_conflict() -> None:
    run = drive(KeyConflict(1, {"incident": 103}, {}))

    assert outcome(run) == (State.NEEDS_HUMAN, Reason.OPERATION_CONFLICT, 1)
    assert run.operation("incident-103-first-notice") is OperationState.COMMITTED
    assert Notice.objects.get().text.startswith("Incident 103: we are investigating")


def test_a_permanent_error_runs_once_and_fails() -> None:
    run = drive(PermanentError(1, {"order": 42}, {}))

    assert outcome(run) == (State.FAILED, Reason.FATAL, 1)


def test_a_missing_order_runs_once_and_needs_a_human() -> None:
    run = drive(MissingPrecondition(1, {"order": 404}, {}))

    assert outcome(run) == (State.NEEDS_HUMAN, Reason.PRECONDITION, 1)


def test_the_missing_precondition_agent_completes_once_the_order_exists() -> None:
    run = drive(MissingPrecondition(1, {"order": 42}, {}))

    assert outcome(run) == (State.COMPLETED, Reason.GOAL_MET, 1)


def test_waiting_for_a_slow_job_past_the_deadline_stops_as_deadline_without_another_poll() -> None:
    run = drive(SlowJob(1, {"job": 9}, {}))

    assert outcome(run) == (State.PARTIAL, Reason.DEADLINE, 2)
    assert run.entries == Counter({"start_export": 1, "job_status": 1})
    assert run.operation("export-9-start") is OperationState.COMMITTED
    assert ExportJob.objects.get().polls_done == 1


def test_a_slow_job_with_a_long_deadline_waits_between_polls_until_it_is_done() -> None:
    clock = Clock()
    limits = {**SlowJob.default_limits, "deadline_ms": 60_000}

    run = drive(
        SlowJob(1, {"job": 9, "wait_ms": 5000, "polls": 3}, {}),
        limits=limits,
        now=clock.now,
        wait=clock.wait,
    )

    assert outcome(run) == (State.COMPLETED, Reason.GOAL_MET, 4)
    assert clock.waits == [5000, 5000]
    assert run.report.revision == 2


def test_an_operator_stop_while_the_slow_job_waits_ends_it_without_another_poll() -> None:
    clock = Clock()
    stop = {"requested": False}

    def wait(ms: float) -> None:
        clock.wait(ms)
        stop["requested"] = True  # the operator presses Stop while the worker sleeps

    run = drive(
        SlowJob(1, {"job": 9, "wait_ms": 5000}, {}),
        limits={**SlowJob.default_limits, "deadline_ms": 600_000},
        now=clock.now,
        wait=wait,
        cancel=lambda: stop["requested"],
    )

    assert outcome(run) == (State.CANCELLED, Reason.OPERATOR_STOP, 2)
    assert clock.waits == [5000]


def test_running_out_of_model_calls_refuses_the_next_one_before_it_starts() -> None:
    run = drive(BudgetBurner(1, {"dimension": "model_calls"}, {}))

    assert outcome(run) == (State.PARTIAL, Reason.MODEL_BUDGET, 2)
    assert (run.report.model_calls, run.report.revision) == (2, 2)


def test_running_out_of_executions_refuses_the_next_batch_before_any_of_it_runs() -> None:
    run = drive(BudgetBurner(1, {"dimension": "executions"}, {}))

    assert outcome(run) == (State.PARTIAL, Reason.EXECUTION_BUDGET, 3)
    assert (run.report.model_calls, run.report.revision) == (2, 3)
    assert run.agent.memory["verified_pages"] == [1, 2, 3]  # pages 4-6 were never read


def test_a_result_of_an_unknown_kind_fails_the_task() -> None:
    run = drive(UnknownKind(1, {"order": 42}, {}))

    assert outcome(run) == (State.FAILED, Reason.BAD_RESULT, 1)


def test_a_finish_the_desk_cannot_verify_is_partial_never_completed() -> None:
    run = drive(UnverifiedFinish(1, {"order": 42}, {}))

    assert outcome(run) == (State.PARTIAL, Reason.GOAL_UNVERIFIED, 1)


def test_the_long_runner_makes_verified_progress_on_every_page() -> None:
    run = drive(LongRunner(1, {"pages": 3, "delay_ms": 0}, {}))

    assert outcome(run) == (State.COMPLETED, Reason.GOAL_MET, 3)
    assert run.report.revision == 3


def test_the_long_runner_has_the_pages_and_budget_to_run_about_half_a_minute() -> None:
    pages, delay_ms = LongRunner.example_input["pages"], LongRunner.example_input["delay_ms"]
    limits = Limits(**LongRunner.default_limits)

    assert 25_000 <= pages * delay_ms <= limits.deadline_ms
    assert min(limits.model_calls, limits.requests, limits.executions) > pages


def test_a_resumed_phase_keeps_the_budget_already_spent() -> None:
    first = drive(BudgetBurner(1, {"dimension": "model_calls"}, {}))
    limits = {**BudgetBurner.default_limits, "model_calls": 3}  # an approver grants one more

    second = drive(
        BudgetBurner(1, {"dimension": "model_calls"}, first.agent.memory),
        limits=limits,
        used=first.report.usage,
        revision=first.report.revision,
    )

    assert outcome(second) == (State.PARTIAL, Reason.MODEL_BUDGET, 1)
    assert (second.report.model_calls, second.report.revision) == (3, 3)
    assert second.agent.memory["verified_pages"] == [1, 2, 3]
    assert isinstance(first.report.usage, Usage)
