"""Approval: a call the policy says must not run unasked waits for a person (invariant 11).

It stops the task ``NEEDS_HUMAN``/``approval_required`` at the executor's entry, after every
other check and before the ledger's claim; the next phase's guard takes the person's answer
(an :class:`Approval` bound to one fingerprint and operation key, used once) and either runs
the approved call or tells the model plainly that it was rejected.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from guard import (
    Approval,
    Call,
    Evidence,
    Finish,
    Guard,
    InMemoryLedger,
    Kind,
    Limits,
    Nudge,
    OperationState,
    Reason,
    Report,
    Result,
    State,
)
from guard.steps import Action, fingerprint

from .support import (
    NOTICE_KEY,
    Clock,
    Executor,
    Inspector,
    Notices,
    Planner,
    Script,
    assert_stays_stopped,
    make_guard,
    notice,
    read,
    roomy,
    scripted,
)


def writes(call: Call) -> bool:
    """The policy under test: every write waits for a person."""
    return call.effect == "write"


def _asking(**options: Any) -> Guard:
    """A guard with room to spare that holds every write for a person's approval."""
    return make_guard(Clock(), roomy(), needs_approval=writes, **options)


def _fp(call: Call) -> str:
    return fingerprint(call.tool, call.args)


def _from_pending(pending: Mapping[str, Any]) -> Call:
    """The exact call a stop report's ``pending`` names, as an approver gives it back."""
    return Call(
        pending["tool"],
        pending["args"],
        effect=pending["effect"],
        operation_key=pending["operation_key"],
    )


def _held_notice(ledger: InMemoryLedger, notices: Notices) -> Report:
    """Phase one: the model asks for the notice, and the task stops waiting for a person."""
    guard = _asking(ledger=ledger)
    report = notices.script(notice()).run(guard)
    assert (report.state, report.reason) == (State.NEEDS_HUMAN, Reason.APPROVAL_REQUIRED)
    return report


def _approved(report: Report, *, with_call: bool = True) -> Approval:
    pending = report.pending
    assert pending is not None
    call = _from_pending(pending) if with_call else None
    return Approval(pending["fingerprint"], pending["operation_key"], approved=True, call=call)


# -- holding a call -----------------------------------------------------------------------


def test_a_write_that_needs_approval_does_not_run_and_the_report_names_it() -> None:
    ledger, notices = InMemoryLedger(), Notices()
    guard = _asking(ledger=ledger)
    script = notices.script(notice())

    report = script.run(guard)

    assert (report.state, report.reason) == (State.NEEDS_HUMAN, Reason.APPROVAL_REQUIRED)
    assert script.execute.entries == 0
    assert notices.sent == {}
    assert ledger.get(NOTICE_KEY) is None  # nothing was claimed: nothing is uncertain
    assert report.uncertain == ()
    assert report.executions == 0
    assert report.pending == {
        "tool": "send_notice",
        "args": {"incident": 42, "text": "First notice"},
        "effect": "write",
        "operation_key": NOTICE_KEY,
        "fingerprint": _fp(notice()),
    }
    assert "approval" in report.resume_condition
    assert_stays_stopped(guard, script, report)


def test_the_pending_call_survives_the_json_report_and_rebuilds_the_same_call() -> None:
    report = _held_notice(InMemoryLedger(), Notices())

    raw = json.loads(report.to_json())

    assert raw == json.loads(json.dumps(report.to_dict()))
    assert raw["pending"] == dict(report.pending or {})
    assert raw["reason"] == "approval_required"
    rebuilt = _from_pending(raw["pending"])
    assert rebuilt == notice()
    assert _fp(rebuilt) == raw["pending"]["fingerprint"]


def test_a_read_the_policy_does_not_name_runs_without_asking() -> None:
    guard = _asking()
    script = scripted([read("lookup", id=1), Finish()], evidence=[Evidence(0, True)])

    report = script.run(guard)

    assert (report.state, report.reason) == (State.COMPLETED, Reason.GOAL_MET)
    assert script.execute.entries == 1
    assert report.pending is None


def test_a_policy_that_raises_holds_the_call_for_a_person() -> None:
    def broken(call: Call) -> bool:
        raise RuntimeError("policy service down")

    ledger = InMemoryLedger()
    guard = make_guard(Clock(), roomy(), ledger=ledger, needs_approval=broken)
    script = scripted([notice()])

    report = script.run(guard)

    assert (report.state, report.reason) == (State.NEEDS_HUMAN, Reason.APPROVAL_REQUIRED)
    assert "policy service down" in report.detail
    assert script.execute.entries == 0
    assert ledger.get(NOTICE_KEY) is None
    assert report.pending is not None and report.pending["tool"] == "send_notice"


def test_the_second_of_two_parallel_calls_held_for_approval_stops_before_running() -> None:
    guard = _asking()
    script = scripted([[read("lookup", id=1), notice()]])

    report = script.run(guard)

    assert (report.state, report.reason) == (State.NEEDS_HUMAN, Reason.APPROVAL_REQUIRED)
    assert [c.tool for c in script.execute.calls] == ["lookup"]  # the read ran, the write not
    assert report.pending is not None and report.pending["tool"] == "send_notice"


# -- after every other check, before the claim ---------------------------------------------


def test_a_call_refused_for_the_execution_budget_stops_for_that_not_for_approval() -> None:
    asked: list[Call] = []

    def policy(call: Call) -> bool:
        asked.append(call)
        return True

    guard = make_guard(Clock(), roomy(executions=0), needs_approval=policy)
    script = scripted([notice()])

    report = script.run(guard)

    assert (report.state, report.reason) == (State.PARTIAL, Reason.EXECUTION_BUDGET)
    assert report.pending is None
    assert asked == []  # nobody is asked to approve what could not run anyway


def test_a_call_past_the_deadline_stops_for_the_deadline_not_for_approval() -> None:
    clock = Clock()
    guard = make_guard(clock, roomy(deadline_ms=100), needs_approval=writes)

    def plan(observation: Any) -> Call:
        clock.advance(200)  # a slow model
        return notice()

    script = Script(Planner(plan), Executor(Result(Kind.SUCCESS)))

    report = script.run(guard)

    assert (report.state, report.reason) == (State.PARTIAL, Reason.DEADLINE)
    assert report.pending is None
    assert script.execute.entries == 0


def test_a_write_without_an_operation_key_stops_for_the_key_not_for_approval() -> None:
    guard = _asking()
    script = scripted([notice(key=None)])

    report = script.run(guard)

    assert report.reason is Reason.MISSING_OPERATION_KEY
    assert report.pending is None
    assert script.execute.entries == 0


def test_a_repeated_call_stops_for_the_repeat_even_when_it_needs_approval() -> None:
    lookup = read("lookup", id=1)
    approval = Approval(_fp(lookup), None, approved=True)
    guard = make_guard(
        Clock(), roomy(same=1), needs_approval=lambda call: True, approvals=[approval]
    )
    script = scripted([lookup])

    report = script.run(guard)

    assert (report.state, report.reason) == (State.PARTIAL, Reason.SAME_CALL)
    assert script.execute.entries == 1  # the approved one ran; the repeat was refused first
    assert report.pending is None


def test_a_write_already_committed_for_the_same_call_is_reused_without_asking() -> None:
    ledger, notices = InMemoryLedger(), Notices()
    earlier = make_guard(Clock(), roomy(), ledger=ledger)  # a phase without the policy
    first = notices.script(notice(), Finish())
    first.run(earlier)
    entry = ledger.get(NOTICE_KEY)
    assert entry is not None and entry.state is OperationState.COMMITTED

    guard = _asking(ledger=ledger)
    script = notices.script(notice(), Finish())

    report = script.run(guard)

    assert report.reason is not Reason.APPROVAL_REQUIRED
    assert report.reason is Reason.GOAL_UNVERIFIED  # the model's finish, unverified
    assert script.execute.entries == 0
    assert script.plan.observations[1] == Result(Kind.SUCCESS, {"notice_id": "n-1"})
    assert len(notices.sent) == 1


# -- the next phase: an approved call -------------------------------------------------------


def test_an_approved_call_runs_once_before_the_model_is_asked_again() -> None:
    ledger, notices = InMemoryLedger(), Notices()
    held = _held_notice(ledger, notices)
    guard = make_guard(
        Clock(),
        roomy(),
        ledger=ledger,
        used=held.usage,
        revision=held.revision,
        needs_approval=writes,
        approvals=[_approved(held)],
    )
    script = notices.script(Finish("sent"))

    report = script.run(guard)

    assert script.execute.entries == 1
    assert notices.sent == {NOTICE_KEY: {"incident": 42, "text": "First notice"}}
    # The model was not asked before the approved call: its first look is that call's result.
    assert script.plan.observations == [Result(Kind.SUCCESS, {"notice_id": "n-1"})]
    entry = ledger.get(NOTICE_KEY)
    assert entry is not None
    assert (entry.state, entry.fingerprint) == (OperationState.COMMITTED, _fp(notice()))
    assert report.reason is Reason.GOAL_UNVERIFIED


def test_the_budgets_of_the_approved_phase_go_on_from_the_stopped_one() -> None:
    ledger, notices = InMemoryLedger(), Notices()
    held = _held_notice(ledger, notices)
    assert (held.model_calls, held.requests, held.executions) == (1, 1, 0)
    guard = make_guard(
        Clock(), roomy(), ledger=ledger, used=held.usage, approvals=[_approved(held)]
    )
    script = notices.script(Finish("sent"))

    report = script.run(guard, lookup=None)

    # The approved call costs a request and an execution but no model call; the finish one.
    assert (report.model_calls, report.requests, report.executions) == (2, 2, 1)


def test_an_approved_call_is_refused_by_a_budget_that_ran_out() -> None:
    ledger, notices = InMemoryLedger(), Notices()
    held = _held_notice(ledger, notices)
    guard = make_guard(
        Clock(),
        roomy(requests=1),
        ledger=ledger,
        used=held.usage,
        needs_approval=writes,
        approvals=[_approved(held)],
    )
    script = notices.script(Finish())

    report = script.run(guard)

    assert (report.state, report.reason) == (State.PARTIAL, Reason.REQUEST_BUDGET)
    assert script.execute.entries == 0
    assert script.plan.calls == 0


def test_an_approval_without_its_call_waits_for_the_model_to_ask_for_it() -> None:
    ledger, notices = InMemoryLedger(), Notices()
    held = _held_notice(ledger, notices)
    guard = make_guard(
        Clock(),
        roomy(),
        ledger=ledger,
        used=held.usage,
        needs_approval=writes,
        approvals=[_approved(held, with_call=False)],
    )
    script = notices.script(notice(), Finish())

    report = script.run(guard)

    assert script.plan.observations[0] is None  # the model was asked first
    assert script.execute.entries == 1
    assert report.reason is Reason.GOAL_UNVERIFIED
    entry = ledger.get(NOTICE_KEY)
    assert entry is not None and entry.state is OperationState.COMMITTED


def _held_instead(other: Call) -> tuple[Report, Report, InMemoryLedger]:
    """Phase one holds the first notice and a person approves it (without the call); phase
    two proposes ``other`` instead, and it is held too, never run."""
    ledger, notices = InMemoryLedger(), Notices()
    held = _held_notice(ledger, notices)
    script = notices.script(other)

    report = script.run(_asking(ledger=ledger, approvals=[_approved(held, with_call=False)]))

    assert (report.state, report.reason) == (State.NEEDS_HUMAN, Reason.APPROVAL_REQUIRED)
    assert script.execute.entries == 0
    assert report.pending is not None
    return held, report, ledger


def test_an_approval_does_not_cover_other_arguments_under_the_same_key() -> None:
    other = notice("A bigger notice")
    held, report, _ = _held_instead(other)
    assert report.pending is not None
    assert report.pending["fingerprint"] == _fp(other) != held.pending["fingerprint"]  # type: ignore[index]


def test_an_approval_does_not_cover_the_same_arguments_under_another_key() -> None:
    _, report, ledger = _held_instead(notice(key="incident-42-second-notice"))
    assert report.pending is not None
    assert report.pending["operation_key"] == "incident-42-second-notice"
    assert ledger.get("incident-42-second-notice") is None


def test_an_approved_write_asked_for_again_reuses_its_result_and_runs_once() -> None:
    ledger, notices = InMemoryLedger(), Notices()
    held = _held_notice(ledger, notices)
    guard = _asking(ledger=ledger, approvals=[_approved(held)])
    script = notices.script(notice(), Finish())

    report = script.run(guard)

    assert report.reason is Reason.GOAL_UNVERIFIED
    assert script.execute.entries == 1
    assert len(notices.sent) == 1
    assert script.plan.observations[1] == Result(Kind.SUCCESS, {"notice_id": "n-1"})  # reused


def test_an_approved_read_asked_for_a_second_time_needs_a_new_approval() -> None:
    balance = read("read_balance", account="acme")
    approval = Approval(_fp(balance), None, approved=True)
    guard = make_guard(
        Clock(),
        roomy(),
        needs_approval=lambda call: call.tool == "read_balance",
        approvals=[approval],
    )
    script = scripted([balance], [Result(Kind.SUCCESS, {"balance": 10})])

    report = script.run(guard)

    assert (report.state, report.reason) == (State.NEEDS_HUMAN, Reason.APPROVAL_REQUIRED)
    assert script.execute.entries == 1
    assert script.plan.calls == 2
    assert report.pending is not None and report.pending["fingerprint"] == _fp(balance)


def test_an_approval_is_not_usable_again_after_a_checkpoint_and_restore() -> None:
    balance = read("read_balance", account="acme")
    approval = Approval(_fp(balance), None, approved=True)

    def policy(call: Call) -> bool:
        return call.tool == "read_balance"

    clock = Clock()
    guard = make_guard(clock, roomy(), needs_approval=policy, approvals=[approval])
    assert guard.before_model() is None
    tickets = guard.before_tools(balance)
    assert isinstance(tickets, list)
    assert guard.before_tool(tickets[0]).action is Action.EXECUTE
    evidence = Inspector(Evidence(0, False))
    assert guard.after_tool(tickets[0], Result(Kind.SUCCESS), inspect=evidence) is None

    saved = json.loads(json.dumps(guard.checkpoint()))
    restored = Guard.restore(
        saved,
        roomy(),
        now=clock.now,
        wait=clock.wait,
        needs_approval=policy,
        approvals=[approval],
    )
    assert restored.before_model() is None
    again = restored.before_tools(balance)
    assert isinstance(again, list)
    decision = restored.before_tool(again[0])

    assert decision.action is Action.STOP
    assert decision.report is not None
    assert decision.report.reason is Reason.APPROVAL_REQUIRED


def test_an_approved_call_that_ran_is_not_offered_again_after_a_restore() -> None:
    ledger, notices = InMemoryLedger(), Notices()
    held = _held_notice(ledger, notices)
    approval = _approved(held)
    clock = Clock()
    guard = make_guard(clock, roomy(), ledger=ledger, needs_approval=writes, approvals=[approval])
    tickets = guard.before_approved()
    assert isinstance(tickets, list)
    assert guard.before_tool(tickets[0]).action is Action.EXECUTE
    result = notices.send(tickets[0].call)
    assert guard.after_tool(tickets[0], result, inspect=notices.inspect) is None

    restored = Guard.restore(
        guard.checkpoint(),
        roomy(),
        now=clock.now,
        wait=clock.wait,
        ledger=ledger,
        needs_approval=writes,
        approvals=[approval],
    )
    script = notices.script(Finish())
    script.run(restored)

    assert script.execute.entries == 0
    assert script.plan.observations == [None]  # the model, not the approved call, came first
    assert len(notices.sent) == 1


# -- the next phase: a rejected call ---------------------------------------------------------


def _rejected(call: Call) -> Approval:
    return Approval(
        _fp(call), call.operation_key, approved=False, reason="too large", tool="refund"
    )


def _refund(amount: int = 500) -> Call:
    return Call("refund", {"order": 7, "amount": amount}, effect="write", operation_key="order-7")


def test_a_rejection_is_the_models_first_observation_told_plainly() -> None:
    guard = make_guard(Clock(), roomy(), needs_approval=writes, approvals=[_rejected(_refund())])
    script = scripted([Finish()])

    script.run(guard)

    first = script.plan.observations[0]
    assert isinstance(first, Nudge)
    assert first.reason is Reason.APPROVAL_REJECTED
    assert first.tool == "refund"
    assert first.fingerprint == _fp(_refund())
    assert "too large" in first.message
    lowered = first.message.lower()
    assert "try again" not in lowered
    assert "retry" not in lowered
    assert script.execute.entries == 0


def test_a_rejected_call_asked_for_again_ends_the_task_without_running() -> None:
    ledger = InMemoryLedger()
    guard = _asking(ledger=ledger, approvals=[_rejected(_refund())])
    script = scripted([_refund()])

    report = script.run(guard)

    assert (report.state, report.reason) == (State.PARTIAL, Reason.APPROVAL_REJECTED)
    assert "too large" in report.detail
    assert script.execute.entries == 0
    assert ledger.get("order-7") is None
    assert report.summary is None
    assert_stays_stopped(guard, script, report)


def test_a_rejection_is_enforced_even_without_a_policy() -> None:
    guard = make_guard(Clock(), roomy(), approvals=[_rejected(_refund())])
    script = scripted([_refund()])

    report = script.run(guard)

    assert report.reason is Reason.APPROVAL_REJECTED
    assert script.execute.entries == 0


def test_after_a_rejection_the_model_may_go_on_with_other_work() -> None:
    guard = make_guard(Clock(), roomy(), approvals=[_rejected(_refund())])
    script = scripted(
        [read("lookup", order=7), Finish()], evidence=[Evidence(1, False), Evidence(1, True)]
    )

    report = script.run(guard)

    assert (report.state, report.reason) == (State.COMPLETED, Reason.GOAL_MET)
    assert script.execute.entries == 1
    assert isinstance(script.plan.observations[0], Nudge)


def test_a_rejection_is_told_once() -> None:
    guard = make_guard(Clock(), Limits(), approvals=[_rejected(_refund())])

    first = guard.rejection()

    assert isinstance(first, Nudge)
    assert guard.rejection() is None


# -- known gaps ------------------------------------------------------------------------------


def test_a_write_whose_key_holds_another_input_stops_as_a_conflict_not_for_approval() -> None:
    ledger, notices = InMemoryLedger(), Notices()
    earlier = make_guard(Clock(), roomy(), ledger=ledger)
    notices.script(notice(), Finish()).run(earlier)
    guard = _asking(ledger=ledger)
    script = Script(Planner(notice("Another text")), Executor(notices.send))

    report = script.run(guard)

    assert script.execute.entries == 0
    # An approval could never let this call run (its claim meets the other input): asking
    # a person for one promises "it then runs once, exactly as asked", which is untrue.
    assert (report.state, report.reason) == (State.NEEDS_HUMAN, Reason.OPERATION_CONFLICT)
