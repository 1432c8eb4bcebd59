"""A write that meets another execution of its operation waits for it; a write that failed
on a passing error, and that a trusted lookup proves did not happen, is tried again.

Neither ever runs an action twice: a write still ``IN_FLIGHT`` elsewhere is never run, and
only a ``NOT_COMMITTED`` entry (trusted evidence) is claimed again (invariant 2).
"""

from __future__ import annotations

from typing import Any

from guard import (
    Call,
    Evidence,
    Finish,
    Guard,
    InMemoryLedger,
    Kind,
    OperationState,
    Reason,
    Result,
    Settlement,
    State,
)
from guard.steps import IN_FLIGHT_WAIT_MS, RETRY_WAIT_MS, Ticket, fingerprint, transient_error

from .support import (
    NOTICE_KEY,
    Clock,
    Executor,
    Inspector,
    Notices,
    Planner,
    Script,
    make_guard,
    notice,
    roomy,
)

NOT_SENT = Settlement(committed=False, evidence="the outbox holds no such notice")


def _holding(ledger: InMemoryLedger, call: Call) -> tuple[Guard, Ticket]:
    """Another task's guard that has claimed ``call``'s key and is executing it now."""
    other = make_guard(Clock(), ledger=ledger)
    assert other.before_model() is None
    tickets = other.before_tools(call)
    assert isinstance(tickets, list)
    assert other.before_tool(tickets[0]).action == "execute"
    return other, tickets[0]


def _goal(notices: Notices) -> Inspector:
    """The goal is the notice sent, by whoever sent it; writes are checked in the outbox."""

    def inspect(result: Result | None, subject: Call | Finish) -> Evidence:
        sent = NOTICE_KEY in notices.sent
        committed = sent if isinstance(subject, Call) and subject.effect == "write" else None
        return Evidence(int(sent), isinstance(subject, Finish) and sent, committed)

    return Inspector(inspect)


def test_a_write_another_task_is_executing_waits_and_then_reuses_its_result() -> None:
    ledger, notices, write = InMemoryLedger(), Notices(), notice()
    other, held = _holding(ledger, write)
    observations: list[Any] = []

    def plan(observation: Any) -> Call | Finish:
        observations.append(observation)
        if len(observations) == 2:  # while this one waited, the other one finished
            assert other.after_tool(held, notices.send(write), inspect=notices.inspect) is None
        return write if len(observations) <= 2 else Finish("sent")

    clock = Clock()
    guard = make_guard(clock, roomy(), ledger=ledger)
    script = Script(Planner(plan), Executor(notices.send), _goal(notices))

    report = script.run(guard)

    assert (report.state, report.reason) == (State.COMPLETED, Reason.GOAL_MET)
    assert script.execute.entries == 0  # this task ran nothing
    assert len(notices.sent) == 1  # the other task's one notice
    # It was told to wait, waited, asked again, and got the other's committed result.
    pending = observations[1]
    assert (pending.kind, pending.wait_ms) == (Kind.PENDING, IN_FLIGHT_WAIT_MS)
    assert pending.data["operation_key"] == NOTICE_KEY
    assert clock.waits == [IN_FLIGHT_WAIT_MS]
    assert observations[2] == Result(Kind.SUCCESS, {"notice_id": "n-1"})
    assert guard.usage.executions == 0


def test_a_write_whose_other_execution_proved_harmless_is_claimed_and_run_once() -> None:
    ledger, notices, write = InMemoryLedger(), Notices(), notice()
    other, held = _holding(ledger, write)
    calls = 0

    def plan(observation: Any) -> Call | Finish:
        nonlocal calls
        calls += 1
        if calls == 2:  # the other one failed on a bad template, and did not send
            refused = other.after_tool(
                held,
                error=ValueError("bad template"),
                inspect=notices.inspect,
                lookup=lambda key: NOT_SENT,
            )
            assert refused is not None and refused.state is State.FAILED
        return write if calls <= 2 else Finish("sent")

    guard = make_guard(Clock(), roomy(), ledger=ledger)
    script = Script(Planner(plan), Executor(notices.send), _goal(notices))

    report = script.run(guard)

    assert (report.state, report.reason) == (State.COMPLETED, Reason.GOAL_MET)
    assert script.execute.entries == 1
    entry = ledger.get(NOTICE_KEY)
    assert entry is not None
    assert (entry.state, entry.attempts) == (OperationState.COMMITTED, 2)


def test_waiting_for_another_execution_is_bounded_by_the_deadline() -> None:
    ledger, notices, write = InMemoryLedger(), Notices(), notice()
    _holding(ledger, write)
    clock = Clock()
    guard = make_guard(clock, roomy(deadline_ms=2500, polls=50), ledger=ledger)
    script = Script(Planner(write), Executor(notices.send), _goal(notices))

    report = script.run(guard)

    assert (report.state, report.reason) == (State.PARTIAL, Reason.DEADLINE)
    assert script.execute.entries == 0
    assert notices.sent == {}
    assert clock.waits == [IN_FLIGHT_WAIT_MS, IN_FLIGHT_WAIT_MS]  # a third would cross it


def test_a_write_lost_to_a_dropped_connection_that_did_not_happen_is_tried_again() -> None:
    ledger, notices = InMemoryLedger(), Notices()
    clock = Clock()
    guard = make_guard(clock, roomy(), ledger=ledger)
    dropped = ConnectionResetError("connection reset by the notice service")
    plan = Planner(notice(), notice(), Finish("sent"))
    script = Script(plan, Executor(dropped, notices.send), _goal(notices))

    report = script.run(guard, lookup=lambda key: None if key in notices.sent else NOT_SENT)

    assert (report.state, report.reason) == (State.COMPLETED, Reason.GOAL_MET)
    assert script.execute.entries == 2
    assert len(notices.sent) == 1
    retry = plan.observations[1]
    assert (retry.kind, retry.wait_ms) == (Kind.RETRYABLE, RETRY_WAIT_MS)
    assert retry.data["committed"] is False
    assert clock.waits == [RETRY_WAIT_MS]
    entry = ledger.get(NOTICE_KEY)
    assert entry is not None
    assert (entry.state, entry.attempts) == (OperationState.COMMITTED, 2)
    assert guard.usage.executions == 2  # the retry drew from the same budget


def test_a_write_that_keeps_losing_its_connection_stops_at_the_repeat_limit() -> None:
    ledger = InMemoryLedger()
    guard = make_guard(Clock(), roomy(same=2), ledger=ledger)
    script = Script(
        Planner(notice()), Executor(ConnectionError("down")), Inspector(Evidence(0, False))
    )

    report = script.run(guard, lookup=lambda key: NOT_SENT)

    assert (report.state, report.reason) == (State.PARTIAL, Reason.SAME_CALL)
    assert script.execute.entries == 2
    entry = ledger.get(NOTICE_KEY)
    assert entry is not None and entry.state is OperationState.NOT_COMMITTED


def test_a_passing_error_whose_write_nobody_can_look_up_is_still_unknown() -> None:
    ledger = InMemoryLedger()
    guard = make_guard(Clock(), roomy(), ledger=ledger)
    script = Script(Planner(notice()), Executor(TimeoutError("no answer")))

    report = script.run(guard)  # no lookup: nobody can tell whether it happened

    assert (report.state, report.reason) == (State.NEEDS_HUMAN, Reason.EXECUTOR_ERROR)
    assert script.execute.entries == 1
    entry = ledger.get(NOTICE_KEY)
    assert entry is not None and entry.state is OperationState.UNKNOWN


def test_the_host_says_which_errors_pass() -> None:
    ledger = InMemoryLedger()

    class Busy(Exception):
        """The business system's own word for "try again"."""

    guard = make_guard(Clock(), roomy(), ledger=ledger, transient=lambda exc: isinstance(exc, Busy))
    script = Script(Planner(notice()), Executor(ConnectionError("down")))

    report = script.run(guard, lookup=lambda key: NOT_SENT)

    assert (report.state, report.reason) == (State.FAILED, Reason.EXECUTOR_ERROR)
    assert transient_error(ConnectionError()) and transient_error(TimeoutError())
    assert not transient_error(ValueError())


def test_a_retry_of_a_write_marked_not_committed_runs_only_if_the_lookup_does_not_find_it() -> None:
    ledger, notices = InMemoryLedger(), Notices()
    ledger.claim(NOTICE_KEY, fingerprint("send_notice", dict(notice().args)))
    ledger.resolve(NOTICE_KEY, committed=False, evidence="a person found no notice")
    notices.sent[NOTICE_KEY] = {"text": "First notice"}  # ...but it had gone out after all
    guard = make_guard(Clock(), roomy(), ledger=ledger)
    script = Script(Planner(notice()), Executor(notices.send), _goal(notices))

    report = script.run(guard, lookup=lambda key: Settlement(committed=key in notices.sent))

    assert (report.state, report.reason) == (State.NEEDS_HUMAN, Reason.UNKNOWN_COMMIT)
    assert "marked not committed" in report.detail
    assert script.execute.entries == 0  # not sent a second time
    entry = ledger.get(NOTICE_KEY)
    assert entry is not None and entry.state is OperationState.UNKNOWN


def test_a_retry_the_lookup_confirms_never_happened_runs_once() -> None:
    ledger, notices = InMemoryLedger(), Notices()
    ledger.claim(NOTICE_KEY, fingerprint("send_notice", dict(notice().args)))
    ledger.resolve(NOTICE_KEY, committed=False, evidence="no notice in the outbox")
    guard = make_guard(Clock(), roomy(), ledger=ledger)
    script = Script(Planner(notice(), Finish("sent")), Executor(notices.send), _goal(notices))

    report = script.run(guard, lookup=lambda key: Settlement(committed=key in notices.sent))

    assert (report.state, report.reason) == (State.COMPLETED, Reason.GOAL_MET)
    assert script.execute.entries == 1
    entry = ledger.get(NOTICE_KEY)
    assert entry is not None and (entry.state, entry.attempts) == (OperationState.COMMITTED, 2)
