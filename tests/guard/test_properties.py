"""Properties of the guard over arbitrary agents.

Hypothesis builds planners that mix reads, writes, parallel calls, finishes, garbage and
exceptions; executors that return any result, nothing, junk, or raise; inspectors that
return odd evidence or raise; lookups; shared ledgers already holding entries in every
state; and an operator who may press Stop at any moment. Whatever they do, the guard keeps
its promises: it never raises, never exceeds a budget, never repeats a business action,
stays stopped, reports exactly what happened, and completes only on verified evidence.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from guard import (
    Call,
    Evidence,
    Finish,
    Guard,
    InMemoryLedger,
    Kind,
    Limits,
    OperationState,
    Reason,
    Report,
    Result,
    Settlement,
    State,
)
from guard.steps import Claim, ClaimStatus, Operation, fingerprint

from .support import Clock, property_settings

# Each example is a few dozen steps at most; keep the whole file well under 20 s.
PROPERTY = property_settings(200)


class Boom(Exception):
    """What a misbehaving planner, tool, inspector or lookup raises."""


class Mute(Exception):
    """An exception that cannot even describe itself."""

    def __str__(self) -> str:
        raise RuntimeError("no description")


RAISE = "<raise>"


# -- a shared ledger that remembers every transition ----------------------------------------


class RecordingLedger(InMemoryLedger):
    """An in-memory ledger that writes down what every claim found and decided."""

    def __init__(self) -> None:
        super().__init__()
        self.claims: list[tuple[str, OperationState | None, ClaimStatus]] = []
        self.not_committed: Counter[str] = Counter()  # times each key became NOT_COMMITTED

    def claim(self, key: str, fingerprint: str) -> Claim:
        before = self.get(key)
        claim = super().claim(key, fingerprint)
        self.claims.append((key, None if before is None else before.state, claim.status))
        return claim

    def resolve(
        self,
        key: str,
        *,
        committed: bool,
        result: Result | None = None,
        evidence: str = "",
    ) -> Operation:
        entry = super().resolve(key, committed=committed, result=result, evidence=evidence)
        if entry.state is OperationState.NOT_COMMITTED:
            self.not_committed[key] += 1
        return entry


# -- strategies ---------------------------------------------------------------------------

KEYS = ("incident-1-notice", "incident-2-notice")
TEXTS = ("Disk full", "Disk full.")


def notice(text: str, key: str | None) -> Call:
    return Call("send_notice", {"text": text}, effect="write", operation_key=key)


def weighted(*options: tuple[int, st.SearchStrategy[Any]]) -> st.SearchStrategy[Any]:
    """One of ``options``, drawn about as often as its weight says.

    Mostly sensible agents, sometimes odd ones: an agent that misbehaves at every step
    stops at once and would leave the interesting paths unexplored.
    """
    pool = [strategy for weight, strategy in options for _ in range(weight)]
    return st.sampled_from(pool).flatmap(lambda strategy: strategy)


reads = st.builds(
    lambda tool, n: Call(tool, {"n": n}),
    st.sampled_from(["read_inbox", "read_page", "job_status", "tail_log"]),
    st.integers(0, 2),
)
writes = weighted(
    (10, st.sampled_from(KEYS).map(lambda key: notice(TEXTS[0], key))),
    (1, st.builds(notice, st.sampled_from(TEXTS), st.sampled_from([*KEYS, None, ""]))),
)
calls = weighted((2, reads), (1, writes))
garbage_proposals = st.sampled_from(
    [
        None,
        42,
        "finish",
        [],
        [None],
        (Call("read_inbox", {"n": 0}), "x"),
        Call("", {}),
        Call("read_inbox", {"n": float("nan")}),
        Call("read_inbox", {1: 2}),  # type: ignore[dict-item]
        Call("read_inbox", [1, 2]),  # type: ignore[arg-type]
        Call("read_inbox", {}, effect="delete"),  # type: ignore[arg-type]
        Call("send_notice", {}, effect="write", operation_key=5),  # type: ignore[arg-type]
        Finish,  # the class, not an instance
    ]
)
proposals = weighted(
    (12, calls),
    (3, st.lists(calls, min_size=1, max_size=3)),
    (1, st.just(Finish("done"))),
    (1, garbage_proposals),
    (1, st.just(RAISE)),
)

waits = st.sampled_from([1, 10, 250, 0.5])
odd_waits = st.sampled_from([None, 0, -5, float("nan"), float("inf"), 10**400, "10", True])
results = weighted(
    (6, st.builds(Result, kind=st.just(Kind.SUCCESS), data=st.integers(0, 3))),
    (3, st.builds(Result, kind=st.sampled_from([Kind.RETRYABLE, Kind.PENDING]), wait_ms=waits)),
    (
        2,
        st.builds(
            Result,
            kind=st.sampled_from(Kind),
            wait_ms=st.one_of(st.none(), waits),
            attempts=st.sampled_from([1, 2, 3]),
        ),
    ),
    (
        1,
        st.builds(
            Result,
            kind=st.sampled_from([*Kind, "DONE", ["SUCCESS"]]),
            wait_ms=st.one_of(waits, odd_waits),
            attempts=st.sampled_from([1, 2, 0, -1, True, 1.0]),
        ),
    ),
    (1, st.sampled_from([None, "SUCCESS", 0, RAISE, Mute])),
)

evidences = weighted(
    (
        8,
        st.tuples(
            weighted((12, st.sampled_from([0, 0, 1, 1, 2])), (1, st.just(-1))),
            weighted((9, st.just(False)), (1, st.just(True))),
            st.sampled_from([True, True, False, None]),
        ),
    ),
    (
        1,
        st.sampled_from(
            [
                RAISE,
                None,
                "ok",
                Evidence("1", False),  # type: ignore[arg-type]
                Evidence(True, False),
                Evidence(0, "yes"),  # type: ignore[arg-type]
                Evidence(0, False, committed="maybe"),  # type: ignore[arg-type]
            ]
        ),
    ),
)

settlements = weighted(
    (
        4,
        st.builds(
            Settlement,
            committed=st.sampled_from([True, False, None]),
            result=st.one_of(st.none(), st.just(Result(Kind.SUCCESS, "found"))),
        ),
    ),
    (
        1,
        st.sampled_from(
            [
                RAISE,
                None,
                True,
                Settlement(committed="yes"),  # type: ignore[arg-type]
                Settlement(committed=True, result="x"),  # type: ignore[arg-type]
                Settlement(committed=True, result=Result(["SUCCESS"])),  # type: ignore[arg-type]
            ]
        ),
    ),
)

seeds = st.tuples(
    st.sampled_from(
        [
            None,
            None,
            OperationState.IN_FLIGHT,
            OperationState.UNKNOWN,
            OperationState.COMMITTED,
            OperationState.NOT_COMMITTED,
        ]
    ),
    weighted((4, st.just(TEXTS[0])), (1, st.just(TEXTS[1]))),
)


def budget(most: int) -> st.SearchStrategy[int]:
    return weighted((1, st.integers(0, 3)), (4, st.integers(4, most)))


limits = st.builds(
    Limits,
    deadline_ms=weighted((1, st.integers(0, 500)), (4, st.integers(500, 5000))),
    model_calls=budget(14),
    requests=budget(18),
    executions=budget(14),
    same=st.integers(1, 3),
    stagnant=st.integers(1, 8),
    polls=st.integers(0, 3),
    tokens=st.one_of(st.none(), st.none(), st.integers(0, 300)),
    max_period=st.integers(1, 4),
    exempt=st.sampled_from([frozenset(), frozenset({"tail_log"})]),
)


@dataclass
class Scenario:
    limits: Limits
    plan: list[Any]
    cycle: bool  # the planner goes round its proposals instead of finishing after them
    tokens: list[int]
    results: list[Any]
    slowness: list[int]
    evidence: list[Any]
    lookup: list[Any] | None
    seeded: dict[str, tuple[OperationState | None, str]]
    nudge: bool
    stop_at: int | None  # the operator presses Stop during this agent event (plan or tool)


def scenario_strategy(
    proposals: st.SearchStrategy[Any],
    results: st.SearchStrategy[Any],
    evidences: st.SearchStrategy[Any],
) -> st.SearchStrategy[Scenario]:
    return st.builds(
        Scenario,
        limits=limits,
        plan=st.lists(proposals, min_size=1, max_size=12),
        cycle=st.booleans(),
        tokens=st.lists(st.integers(0, 80), min_size=1, max_size=4),
        results=st.lists(results, min_size=1, max_size=6),
        slowness=st.lists(st.integers(0, 200), min_size=1, max_size=3),
        evidence=st.lists(evidences, min_size=1, max_size=6),
        lookup=st.one_of(st.none(), st.lists(settlements, min_size=1, max_size=3)),
        seeded=st.fixed_dictionaries({key: seeds for key in KEYS}),
        nudge=st.booleans(),
        stop_at=st.one_of(st.none(), st.none(), st.integers(0, 20)),
    )


scenarios = scenario_strategy(proposals, results, evidences)

# Writes whose outcomes are often verified as not committed, so that the same business
# action is legitimately tried again — and must then run once per verified failure only.
write_heavy = scenario_strategy(
    weighted((6, writes), (1, reads), (1, st.lists(writes, min_size=2, max_size=3))),
    weighted(
        (3, st.builds(Result, kind=st.sampled_from([Kind.RETRYABLE, Kind.PENDING]), wait_ms=waits)),
        (2, st.just(Result(Kind.SUCCESS))),
        (1, st.sampled_from([Result(Kind.FATAL), None, RAISE, Result(Kind.SUCCESS, attempts=2)])),
    ),
    st.tuples(
        st.sampled_from([0, 0, 1]),
        st.just(False),
        weighted((3, st.just(False)), (1, st.just(True)), (1, st.just(None))),
    ),
)


# -- playing a scenario -------------------------------------------------------------------


@dataclass
class Observed:
    """What really happened, counted outside the guard."""

    plans: int = 0
    entries: int = 0
    charged: int = 0  # attempts - 1 of every well-formed result a tool returned
    max_attempts: int = 1
    tokens: int = 0
    tokens_before_plans: list[int] = field(default_factory=list)
    proposed_calls: int = 0
    inspections: int = 0
    lookups: int = 0
    found: Counter[str] = field(default_factory=Counter)  # lookups that found the action
    last_evidence: Any = None
    write_entries: Counter[str] = field(default_factory=Counter)
    unkeyed_writes: int = 0
    events: int = 0  # plans + tool entries, in order
    stopped_at_event: int | None = None
    work_after_stop: int = 0
    in_flight_at_entry: bool = True


def well_formed(result: Any) -> bool:
    if not isinstance(result, Result):
        return False
    try:
        known = result.kind in set(Kind)
    except TypeError:
        return False
    attempts = result.attempts
    return known and isinstance(attempts, int) and not isinstance(attempts, bool) and attempts > 0


def seed(ledger: InMemoryLedger, key: str, state: OperationState | None, text: str) -> None:
    if state is None:
        return
    fp = fingerprint("send_notice", {"text": text})
    ledger.claim(key, fp)
    if state is OperationState.UNKNOWN:
        ledger.mark_unknown(key, fp)
    elif state is OperationState.COMMITTED:
        ledger.record(key, fp, Result(Kind.SUCCESS, "sent earlier"))
    elif state is OperationState.NOT_COMMITTED:
        ledger.resolve(key, committed=False, evidence="nothing in the outbox")


class Agent:
    """The planner, tool, inspector and lookup of one scenario, each counting what it did."""

    def __init__(self, scenario: Scenario, clock: Clock, ledger: RecordingLedger) -> None:
        self.s = scenario
        self.clock = clock
        self.ledger = ledger
        self.seen = Observed()
        self.guard: Guard | None = None
        self.revision = 0
        self.stop = False

    def cancelled(self) -> bool:
        return self.stop

    def _event(self) -> None:
        seen = self.seen
        if self.stop:
            seen.work_after_stop += 1
        if self.s.stop_at is not None and seen.events == self.s.stop_at:
            self.stop = True
            seen.stopped_at_event = seen.events
        seen.events += 1

    def plan(self, observation: Any) -> Any:
        seen = self.seen
        self._event()
        index = seen.plans
        seen.plans += 1
        assert self.guard is not None
        seen.tokens_before_plans.append(seen.tokens)
        spend = self.s.tokens[index % len(self.s.tokens)]
        self.guard.spend_tokens(spend)
        seen.tokens += spend
        plan = self.s.plan
        if plan and self.s.cycle:
            proposal = plan[index % len(plan)]
        else:
            proposal = plan[index] if index < len(plan) else Finish("out of ideas")
        if proposal == RAISE:
            raise Boom("the model API failed")
        if isinstance(proposal, Call):
            seen.proposed_calls += 1
        elif isinstance(proposal, list | tuple):
            seen.proposed_calls += sum(isinstance(c, Call) for c in proposal)
        return proposal

    def execute(self, call: Call) -> Any:
        seen = self.seen
        self._event()
        assert isinstance(call, Call)
        if call.effect == "write":
            key = call.operation_key
            if not key:
                seen.unkeyed_writes += 1
            else:
                seen.write_entries[key] += 1
                entry = self.ledger.get(key)
                fp = fingerprint(call.tool, dict(call.args))
                holds_claim = (
                    entry is not None
                    and entry.state is OperationState.IN_FLIGHT
                    and entry.fingerprint == fp
                )
                seen.in_flight_at_entry &= holds_claim
        index = seen.entries
        seen.entries += 1
        self.clock.advance(self.s.slowness[index % len(self.s.slowness)])
        outcome = self.s.results[index % len(self.s.results)]
        if outcome == RAISE:
            raise Boom("tool failed")
        if outcome is Mute:
            raise Mute
        if well_formed(outcome):
            seen.charged += outcome.attempts - 1
            seen.max_attempts = max(seen.max_attempts, outcome.attempts)
        return outcome

    def inspect(self, result: Result | None, subject: Call | Finish) -> Any:
        seen = self.seen
        index = seen.inspections
        seen.inspections += 1
        outcome = self.s.evidence[index % len(self.s.evidence)]
        if isinstance(outcome, tuple):
            step, done, committed = outcome
            self.revision = max(0, self.revision + step)
            outcome = Evidence(self.revision, done, committed)
        seen.last_evidence = outcome
        if outcome == RAISE:
            raise Boom("records unavailable")
        return outcome

    def lookup(self, key: str) -> Any:
        assert self.s.lookup is not None
        seen = self.seen
        outcome = self.s.lookup[seen.lookups % len(self.s.lookup)]
        seen.lookups += 1
        if outcome == RAISE:
            raise Boom("lookup failed")
        if getattr(outcome, "committed", None) is True:
            seen.found[key] += 1
        return outcome


@dataclass
class Played:
    scenario: Scenario
    guard: Guard
    agent: Agent
    ledger: RecordingLedger
    report: Report
    error: BaseException | None


def play(scenario: Scenario) -> Played:
    clock = Clock()
    ledger = RecordingLedger()
    for key, (state, text) in scenario.seeded.items():
        seed(ledger, key, state, text)
    ledger.claims.clear()
    ledger.not_committed.clear()
    agent = Agent(scenario, clock, ledger)
    guard = Guard(
        scenario.limits,
        now=clock.now,
        wait=clock.wait,
        ledger=ledger,
        nudge=scenario.nudge,
        cancel=agent.cancelled,
    )
    agent.guard = guard
    lookup = agent.lookup if scenario.lookup is not None else None
    error: BaseException | None = None
    report: Any = None
    try:
        report = guard.run(agent.plan, agent.execute, agent.inspect, lookup=lookup)
    except Exception as exc:  # the property under test is that this never happens
        error = exc
    return Played(scenario, guard, agent, ledger, report, error)


def played_cleanly(scenario: Scenario) -> Played:
    """Play ``scenario``; one where ``run`` raised is left to the property that forbids it."""
    played = play(scenario)
    assume(played.error is None)
    assert isinstance(played.report, Report)
    return played


# -- properties ---------------------------------------------------------------------------


@PROPERTY
@given(scenarios)
def test_run_never_raises_and_always_returns_a_report(scenario: Scenario) -> None:
    played = play(scenario)
    assert played.error is None, f"run raised {played.error!r}"
    assert isinstance(played.report, Report)
    assert isinstance(played.report.state, State)
    assert isinstance(played.report.reason, Reason)


@PROPERTY
@given(scenarios)
def test_no_budget_is_ever_exceeded(scenario: Scenario) -> None:
    played = played_cleanly(scenario)
    report, limits, seen = played.report, scenario.limits, played.agent.seen

    assert report.model_calls <= limits.model_calls
    assert report.requests <= limits.requests
    assert seen.entries <= limits.executions
    # Only a tool's own retries, learnt after the fact, can carry the count past the limit.
    assert report.executions <= limits.executions + seen.max_attempts - 1
    if limits.tokens is not None:
        # Tokens are reported after a model call; none starts once they are spent.
        assert all(spent < limits.tokens for spent in seen.tokens_before_plans)


@PROPERTY
@given(scenarios)
def test_the_report_counts_exactly_what_happened(scenario: Scenario) -> None:
    played = played_cleanly(scenario)
    report, seen = played.report, played.agent.seen

    assert report.model_calls == seen.plans
    assert report.executions == seen.entries + seen.charged
    assert report.tokens == seen.tokens
    assert seen.entries <= report.requests <= seen.proposed_calls
    assert report.usage.model_calls == report.model_calls
    for operation in report.operations:
        assert played.ledger.get(operation.key) == operation


@PROPERTY
@given(st.one_of(scenarios, write_heavy))
def test_a_business_action_runs_at_most_once_unless_verified_not_committed(
    scenario: Scenario,
) -> None:
    played = played_cleanly(scenario)
    seen, ledger = played.agent.seen, played.ledger

    assert seen.unkeyed_writes == 0
    assert seen.in_flight_at_entry, "a write ran without holding its claim"
    claimed = Counter(key for key, _, status in ledger.claims if status is ClaimStatus.CLAIMED)
    for key in KEYS:
        seeded_not_committed = scenario.seeded[key][0] is OperationState.NOT_COMMITTED
        allowed = 1 + ledger.not_committed[key] + int(seeded_not_committed)
        assert seen.write_entries[key] <= allowed
        # Every execution held a claim of its own; a claim runs nothing only when the
        # lookup that a retry asks first finds the action done after all (then UNKNOWN).
        assert seen.write_entries[key] <= claimed[key]
        assert claimed[key] - seen.write_entries[key] <= seen.found[key]
        if scenario.seeded[key][0] in (
            OperationState.IN_FLIGHT,
            OperationState.UNKNOWN,
            OperationState.COMMITTED,
        ):
            assert seen.write_entries[key] == 0


@PROPERTY
@given(scenarios)
def test_after_a_stop_nothing_more_runs_and_the_report_stays_the_same(scenario: Scenario) -> None:
    played = played_cleanly(scenario)
    guard, agent, report = played.guard, played.agent, played.report
    before = (agent.seen.plans, agent.seen.entries, agent.seen.inspections, agent.seen.lookups)
    ledger_before = list(played.ledger.operations())

    again = guard.run(agent.plan, agent.execute, agent.inspect, lookup=agent.lookup)

    assert again is report
    assert guard.report is report
    assert guard.before_model() is report
    after = (agent.seen.plans, agent.seen.entries, agent.seen.inspections, agent.seen.lookups)
    assert after == before
    assert list(played.ledger.operations()) == ledger_before


@PROPERTY
@given(scenarios)
def test_once_the_operator_stops_the_task_no_model_call_or_tool_starts(
    scenario: Scenario,
) -> None:
    played = played_cleanly(scenario)
    assert played.agent.seen.work_after_stop == 0


@PROPERTY
@given(scenarios)
def test_completed_only_ever_follows_verified_evidence_that_the_goal_is_met(
    scenario: Scenario,
) -> None:
    played = played_cleanly(scenario)
    report, seen = played.report, played.agent.seen

    assert (report.state is State.COMPLETED) == (report.reason is Reason.GOAL_MET)
    if report.state is State.COMPLETED:
        evidence = seen.last_evidence
        assert isinstance(evidence, Evidence)
        assert evidence.done is True


ALLOWED_STATES: dict[Reason, set[State]] = {
    Reason.GOAL_MET: {State.COMPLETED},
    Reason.GOAL_UNVERIFIED: {State.PARTIAL},
    **{
        reason: {State.PARTIAL}
        for reason in (
            Reason.DEADLINE,
            Reason.MODEL_BUDGET,
            Reason.REQUEST_BUDGET,
            Reason.EXECUTION_BUDGET,
            Reason.TOKEN_BUDGET,
            Reason.POLL_BUDGET,
            Reason.SAME_CALL,
            Reason.SHORT_CYCLE,
            Reason.NO_PROGRESS,
        )
    },
    Reason.PLANNER_ERROR: {State.FAILED},
    Reason.BAD_CALL: {State.FAILED},
    Reason.BAD_ARGS: {State.FAILED},
    Reason.FATAL: {State.FAILED},
    Reason.INVALID_WAIT: {State.FAILED},
    Reason.MISSING_OPERATION_KEY: {State.NEEDS_HUMAN},
    Reason.OPERATION_CONFLICT: {State.NEEDS_HUMAN},
    Reason.OPERATION_IN_FLIGHT: {State.NEEDS_HUMAN},
    Reason.UNKNOWN_COMMIT: {State.NEEDS_HUMAN},
    Reason.PRECONDITION: {State.NEEDS_HUMAN},
    # A lost write turns these into NEEDS_HUMAN; a read or a settled write fails.
    Reason.EXECUTOR_ERROR: {State.FAILED, State.NEEDS_HUMAN},
    Reason.BAD_RESULT: {State.FAILED, State.NEEDS_HUMAN},
    Reason.INVALID_EVIDENCE: {State.FAILED, State.NEEDS_HUMAN},
    Reason.OPERATOR_STOP: {State.CANCELLED, State.NEEDS_HUMAN},
}


@PROPERTY
@given(scenarios)
def test_the_stop_report_is_coherent_and_serialisable(scenario: Scenario) -> None:
    played = played_cleanly(scenario)
    report = played.report

    assert report.state in ALLOWED_STATES[report.reason]
    if report.reason is Reason.UNKNOWN_COMMIT:
        assert report.uncertain, "unknown_commit must name the uncertain operation"
    if any(op.state is OperationState.UNKNOWN for op in report.operations):
        assert report.state is State.NEEDS_HUMAN
    data = json.loads(report.to_json())
    assert (data["state"], data["reason"]) == (str(report.state), str(report.reason))
    assert data["resume_condition"]
    assert data["used"]["model_calls"] == report.model_calls


# -- odd values the strategies above reach, pinned so a failure names them ----------------


@pytest.mark.parametrize(
    "outcome",
    [
        Result(["SUCCESS"]),  # type: ignore[arg-type]
        Result({"kind": "SUCCESS"}),  # type: ignore[arg-type]
        Result(Kind.RETRYABLE, wait_ms=10**400),
        Result(Kind.PENDING, wait_ms=10**400),
        Mute,
    ],
    ids=["unhashable-kind", "dict-kind", "huge-retry-wait", "huge-pending-wait", "mute-error"],
)
@pytest.mark.parametrize("effect", ["read", "write"])
def test_run_never_raises_on_an_odd_tool_outcome(outcome: Any, effect: str) -> None:
    clock = Clock()
    call = Call("tool", {"n": 1}, effect=effect, operation_key="op-1")  # type: ignore[arg-type]

    def execute(_: Call) -> Any:
        if outcome is Mute:
            raise Mute
        return outcome

    guard = Guard(Limits(deadline_ms=1000), now=clock.now, wait=clock.wait)
    report = guard.run(
        lambda observation: call, execute, lambda result, subject: Evidence(0, False, True)
    )

    assert report.state is not State.COMPLETED
    if effect == "write" and report.operations:
        assert report.operations[0].state is not OperationState.IN_FLIGHT


def test_run_never_raises_when_a_lookup_returns_a_result_of_an_unhashable_kind() -> None:
    clock = Clock()
    call = Call("send_notice", {"n": 1}, effect="write", operation_key="op-1")

    def execute(_: Call) -> Any:
        raise TimeoutError("response lost")

    guard = Guard(Limits(deadline_ms=1000), now=clock.now, wait=clock.wait)
    report = guard.run(
        lambda observation: call,
        execute,
        lambda result, subject: Evidence(0, False, True),
        lookup=lambda key: Settlement(True, Result(["SUCCESS"])),  # type: ignore[arg-type]
    )

    assert report.state is State.NEEDS_HUMAN
    assert [op.state for op in report.uncertain] == [OperationState.UNKNOWN]


@pytest.mark.parametrize("where", ["plan", "inspect"])
def test_run_never_raises_when_an_exception_cannot_describe_itself(where: str) -> None:
    clock = Clock()

    def plan(observation: Any) -> Any:
        if where == "plan":
            raise Mute
        return Call("read_inbox", {}) if observation is None else Finish()

    def inspect(result: Any, subject: Any) -> Any:
        raise Mute

    guard = Guard(Limits(deadline_ms=1000), now=clock.now, wait=clock.wait)
    report = guard.run(plan, lambda call: Result(Kind.SUCCESS), inspect)

    assert report.state is State.FAILED
