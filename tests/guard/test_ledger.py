"""The idempotency ledger: one entry per business action, claimed atomically.

A business action happens at most once: ``COMMITTED`` hands back the stored result,
``IN_FLIGHT`` and ``UNKNOWN`` never run again, another input under the same key is a
conflict, and only ``NOT_COMMITTED`` (verified) may be claimed again — with the same input.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from guard import (
    Call,
    Evidence,
    Finish,
    Guard,
    InMemoryLedger,
    Kind,
    Ledger,
    Limits,
    OperationState,
    Reason,
    Result,
    State,
)
from guard.steps import CLAIM_ANSWERS, OPERATION_MOVES, ClaimStatus, LedgerError, fingerprint

FP = fingerprint("send_notice", {"incident": 42, "text": "Disk full"})
OTHER_FP = fingerprint("send_notice", {"incident": 42, "text": "Disk is full"})
RECEIPT = Result(Kind.SUCCESS, data={"message_id": "m-1"})


@pytest.fixture
def ledger() -> InMemoryLedger:
    return InMemoryLedger()


def in_flight(ledger: InMemoryLedger, key: str = "incident-42-first-notice") -> str:
    assert ledger.claim(key, FP).status is ClaimStatus.CLAIMED
    return key


# -- the protocol -------------------------------------------------------------------------


def test_the_in_memory_ledger_satisfies_the_ledger_protocol() -> None:
    assert isinstance(InMemoryLedger(), Ledger)


def test_an_object_without_claim_is_not_a_ledger() -> None:
    class ReadOnly:
        def get(self, key: str) -> None:
            return None

    assert not isinstance(ReadOnly(), Ledger)


def test_an_unknown_key_has_no_entry(ledger: InMemoryLedger) -> None:
    assert ledger.get("never-claimed") is None


# -- claims -------------------------------------------------------------------------------


def test_a_fresh_claim_is_claimed_and_leaves_the_operation_in_flight(
    ledger: InMemoryLedger,
) -> None:
    claim = ledger.claim("incident-42-first-notice", FP)

    assert claim.status is ClaimStatus.CLAIMED
    assert claim.operation.state is OperationState.IN_FLIGHT
    entry = ledger.get("incident-42-first-notice")
    assert entry is not None
    assert (entry.state, entry.fingerprint, entry.attempts) == (OperationState.IN_FLIGHT, FP, 1)


def test_a_committed_operation_returns_the_stored_result(ledger: InMemoryLedger) -> None:
    key = in_flight(ledger)
    ledger.record(key, FP, RECEIPT)

    claim = ledger.claim(key, FP)

    assert claim.status is ClaimStatus.COMMITTED
    assert claim.operation.state is OperationState.COMMITTED
    assert claim.operation.result == RECEIPT


def test_a_committed_operation_stays_committed_however_often_it_is_claimed(
    ledger: InMemoryLedger,
) -> None:
    key = in_flight(ledger)
    ledger.record(key, FP, RECEIPT)

    statuses = {ledger.claim(key, FP).status for _ in range(5)}

    assert statuses == {ClaimStatus.COMMITTED}
    entry = ledger.get(key)
    assert entry is not None and entry.attempts == 1


@pytest.mark.parametrize(
    "settle",
    [
        pytest.param(lambda lg, key: None, id="in-flight"),
        pytest.param(lambda lg, key: lg.mark_unknown(key, FP), id="unknown"),
        pytest.param(lambda lg, key: lg.record(key, FP, RECEIPT), id="committed"),
        pytest.param(lambda lg, key: lg.resolve(key, committed=False), id="not-committed"),
    ],
)
def test_another_fingerprint_under_the_same_key_is_a_conflict(
    ledger: InMemoryLedger, settle: Callable[[InMemoryLedger, str], Any]
) -> None:
    key = in_flight(ledger)
    settle(ledger, key)
    before = ledger.get(key)

    claim = ledger.claim(key, OTHER_FP)

    assert claim.status is ClaimStatus.CONFLICT
    assert claim.operation.fingerprint == FP
    assert ledger.get(key) == before


def test_an_in_flight_operation_is_never_claimed_again(ledger: InMemoryLedger) -> None:
    key = in_flight(ledger)

    statuses = [ledger.claim(key, FP).status for _ in range(3)]

    assert statuses == [ClaimStatus.IN_FLIGHT] * 3
    entry = ledger.get(key)
    assert entry is not None and entry.state is OperationState.IN_FLIGHT and entry.attempts == 1


def test_an_unknown_operation_is_never_claimed_again(ledger: InMemoryLedger) -> None:
    key = in_flight(ledger)
    ledger.mark_unknown(key, FP)

    statuses = [ledger.claim(key, FP).status for _ in range(3)]

    assert statuses == [ClaimStatus.UNKNOWN] * 3
    entry = ledger.get(key)
    assert entry is not None and entry.state is OperationState.UNKNOWN and entry.attempts == 1


def test_a_not_committed_operation_is_claimed_again_with_the_same_fingerprint(
    ledger: InMemoryLedger,
) -> None:
    key = in_flight(ledger)
    ledger.mark_unknown(key, FP)
    ledger.resolve(key, committed=False, evidence="no message m-1 in the outbox")

    claim = ledger.claim(key, FP)

    assert claim.status is ClaimStatus.CLAIMED
    assert claim.operation.state is OperationState.IN_FLIGHT
    assert claim.operation.attempts == 2
    assert ledger.claim(key, FP).status is ClaimStatus.IN_FLIGHT


def test_attempts_grow_with_each_verified_failure_and_reclaim(ledger: InMemoryLedger) -> None:
    key = in_flight(ledger)
    for _ in range(3):
        ledger.resolve(key, committed=False)
        assert ledger.claim(key, FP).status is ClaimStatus.CLAIMED
    ledger.record(key, FP, RECEIPT)

    entry = ledger.get(key)
    assert entry is not None
    assert (entry.state, entry.attempts, entry.result) == (OperationState.COMMITTED, 4, RECEIPT)


def test_a_not_committed_operation_is_not_reclaimed_with_another_fingerprint(
    ledger: InMemoryLedger,
) -> None:
    key = in_flight(ledger)
    ledger.resolve(key, committed=False)

    assert ledger.claim(key, OTHER_FP).status is ClaimStatus.CONFLICT
    entry = ledger.get(key)
    assert entry is not None and entry.state is OperationState.NOT_COMMITTED


def test_resolving_an_unknown_operation_as_committed_keeps_the_evidence_and_result(
    ledger: InMemoryLedger,
) -> None:
    key = in_flight(ledger)
    ledger.mark_unknown(key, FP)

    ledger.resolve(key, committed=True, result=RECEIPT, evidence="m-1 found in the outbox")

    entry = ledger.get(key)
    assert entry is not None
    assert entry.state is OperationState.COMMITTED
    assert entry.result == RECEIPT
    assert entry.evidence == "m-1 found in the outbox"
    assert ledger.claim(key, FP).status is ClaimStatus.COMMITTED


def test_operations_are_listed_in_the_order_they_were_first_claimed(
    ledger: InMemoryLedger,
) -> None:
    for key in ("c", "a", "b"):
        ledger.claim(key, FP)
    ledger.record("a", FP, RECEIPT)

    assert [op.key for op in ledger.operations()] == ["c", "a", "b"]


# -- illegal transitions ------------------------------------------------------------------


def committed(ledger: InMemoryLedger) -> str:
    key = in_flight(ledger)
    ledger.record(key, FP, RECEIPT)
    return key


def unknown(ledger: InMemoryLedger) -> str:
    key = in_flight(ledger)
    ledger.mark_unknown(key, FP)
    return key


def not_committed(ledger: InMemoryLedger) -> str:
    key = in_flight(ledger)
    ledger.resolve(key, committed=False)
    return key


def missing(ledger: InMemoryLedger) -> str:
    return "never-claimed"


ILLEGAL: list[Any] = [
    pytest.param(missing, lambda lg, k: lg.record(k, FP, RECEIPT), id="record-missing"),
    pytest.param(missing, lambda lg, k: lg.mark_unknown(k, FP), id="mark-unknown-missing"),
    pytest.param(missing, lambda lg, k: lg.resolve(k, committed=True), id="resolve-missing"),
    pytest.param(committed, lambda lg, k: lg.record(k, FP, RECEIPT), id="record-committed"),
    pytest.param(committed, lambda lg, k: lg.mark_unknown(k, FP), id="unknown-committed"),
    pytest.param(committed, lambda lg, k: lg.resolve(k, committed=False), id="undo-committed"),
    pytest.param(committed, lambda lg, k: lg.resolve(k, committed=True), id="resolve-committed"),
    pytest.param(unknown, lambda lg, k: lg.mark_unknown(k, FP), id="unknown-twice"),
    pytest.param(unknown, lambda lg, k: lg.record(k, FP, RECEIPT), id="record-unknown"),
    pytest.param(not_committed, lambda lg, k: lg.record(k, FP, RECEIPT), id="record-not-committed"),
    pytest.param(not_committed, lambda lg, k: lg.mark_unknown(k, FP), id="unknown-not-committed"),
    pytest.param(
        not_committed, lambda lg, k: lg.resolve(k, committed=True), id="resolve-not-committed"
    ),
    pytest.param(in_flight, lambda lg, k: lg.record(k, OTHER_FP, RECEIPT), id="record-other-fp"),
    pytest.param(in_flight, lambda lg, k: lg.mark_unknown(k, OTHER_FP), id="unknown-other-fp"),
]


@pytest.mark.parametrize(("arrange", "move"), ILLEGAL)
def test_an_illegal_transition_raises_and_changes_nothing(
    ledger: InMemoryLedger,
    arrange: Callable[[InMemoryLedger], str],
    move: Callable[[InMemoryLedger, str], Any],
) -> None:
    key = arrange(ledger)
    before = ledger.get(key)

    with pytest.raises(LedgerError):
        move(ledger, key)

    assert ledger.get(key) == before


# -- the one table ------------------------------------------------------------------------

ARRANGED: dict[OperationState | None, Callable[[InMemoryLedger], str]] = {
    None: missing,
    OperationState.IN_FLIGHT: in_flight,
    OperationState.UNKNOWN: unknown,
    OperationState.COMMITTED: committed,
    OperationState.NOT_COMMITTED: not_committed,
}


def _made(ledger: InMemoryLedger, move: str, key: str) -> bool:
    if move == "claim":
        return ledger.claim(key, FP).status is ClaimStatus.CLAIMED
    try:
        if move == "record":
            ledger.record(key, FP, RECEIPT)
        elif move == "lose":
            ledger.mark_unknown(key, FP)
        else:
            settled = move == "settle_committed"
            ledger.resolve(key, committed=settled, result=RECEIPT if settled else None)
    except LedgerError:
        return False
    return True


@pytest.mark.parametrize("state", list(ARRANGED), ids=str)
@pytest.mark.parametrize("move", sorted(OPERATION_MOVES))
def test_an_entry_makes_a_move_from_exactly_the_states_the_table_allows(
    move: str, state: OperationState | None
) -> None:
    ledger = InMemoryLedger()
    key = ARRANGED[state](ledger)
    sources, target = OPERATION_MOVES[move]

    made = _made(ledger, move, key)

    entry = ledger.get(key)
    assert made is (state in sources)
    assert (None if entry is None else entry.state) == (target if made else state)


@pytest.mark.parametrize("state", list(ARRANGED), ids=str)
def test_a_claim_answers_by_the_entry_s_state_as_the_claim_answers_say(
    state: OperationState | None,
) -> None:
    ledger = InMemoryLedger()
    key = ARRANGED[state](ledger)

    assert ledger.claim(key, FP).status is CLAIM_ANSWERS[state]


def test_the_claim_answers_take_only_a_fresh_or_a_verified_not_committed_key() -> None:
    assert dict(CLAIM_ANSWERS) == {
        None: ClaimStatus.CLAIMED,
        OperationState.NOT_COMMITTED: ClaimStatus.CLAIMED,
        OperationState.IN_FLIGHT: ClaimStatus.IN_FLIGHT,  # never run twice at once
        OperationState.UNKNOWN: ClaimStatus.UNKNOWN,  # a person settles it first
        OperationState.COMMITTED: ClaimStatus.COMMITTED,  # its result is reused
    }
    claimed = {state for state, answer in CLAIM_ANSWERS.items() if answer is ClaimStatus.CLAIMED}
    assert claimed == OPERATION_MOVES["claim"][0]


# -- concurrency --------------------------------------------------------------------------


def test_racing_threads_get_exactly_one_claim_per_key() -> None:
    threads, rounds, keys_per_round = 8, 200, 4
    ledger = InMemoryLedger()
    claimed: Counter[str] = Counter()
    refused: Counter[str] = Counter()
    lock = threading.Lock()
    barrier = threading.Barrier(threads)

    def worker() -> None:
        for round_no in range(rounds):
            keys = [f"op-{round_no}-{n}" for n in range(keys_per_round)]
            barrier.wait()  # everyone starts the round together, to make the race real
            for key in keys:
                status = ledger.claim(key, FP).status
                with lock:
                    (claimed if status is ClaimStatus.CLAIMED else refused)[key] += 1
                    assert status in (ClaimStatus.CLAIMED, ClaimStatus.IN_FLIGHT)

    pool = [threading.Thread(target=worker) for _ in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in pool)

    all_keys = {f"op-{r}-{n}" for r in range(rounds) for n in range(keys_per_round)}
    assert set(claimed) == all_keys
    assert set(claimed.values()) == {1}
    assert set(refused.values()) == {threads - 1}


def test_racing_threads_reclaim_a_not_committed_key_exactly_once() -> None:
    threads, rounds = 8, 200
    ledger = InMemoryLedger()
    key = "incident-42-first-notice"
    ledger.claim(key, FP)
    winners: list[int] = []
    lock = threading.Lock()

    def verified_not_committed() -> None:
        ledger.resolve(key, committed=False)

    # Each round starts with the key set back to NOT_COMMITTED by the barrier's action.
    start = threading.Barrier(threads, action=verified_not_committed)
    end = threading.Barrier(threads)

    def worker() -> None:
        for _ in range(rounds):
            start.wait()
            if ledger.claim(key, FP).status is ClaimStatus.CLAIMED:
                with lock:
                    winners.append(1)
            end.wait()

    pool = [threading.Thread(target=worker) for _ in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in pool)

    assert len(winners) == rounds
    entry = ledger.get(key)
    assert entry is not None and entry.attempts == rounds + 1


# -- guards sharing a ledger ----------------------------------------------------------------


class World:
    """A tiny business system: a notice outbox the inspector reads as its trusted record."""

    def __init__(self) -> None:
        self.now = 0.0
        self.outbox: list[dict[str, Any]] = []
        self.sent = 0  # real entries into the send tool

    def clock(self) -> float:
        return self.now

    def wait(self, ms: float) -> None:
        self.now += ms


NOTICE = Call(
    "send_notice",
    {"incident": 42, "text": "Disk full"},
    effect="write",
    operation_key="incident-42-first-notice",
)


def one_notice_then_finish(world: World, observed: list[Any]) -> Callable[[Any], Any]:
    def plan(observation: Any) -> Any:
        observed.append(observation)
        return NOTICE if len(observed) == 1 else Finish("notice sent")

    return plan


def sends(world: World, *, lose_response: bool = False) -> Callable[[Call], Any]:
    def execute(call: Call) -> Any:
        world.sent += 1
        world.outbox.append(dict(call.args))
        if lose_response:
            raise TimeoutError("connection reset after the request was written")
        return Result(Kind.SUCCESS, data={"message_id": f"m-{len(world.outbox)}"})

    return execute


def inspects(world: World) -> Callable[[Result | None, Any], Evidence]:
    def inspect(result: Result | None, step: Any) -> Evidence:
        if isinstance(step, Call):
            return Evidence(revision=len(world.outbox), done=False, committed=True)
        return Evidence(revision=len(world.outbox), done=len(world.outbox) >= 1)

    return inspect


def new_guard(world: World, ledger: InMemoryLedger, *, executions: int = 6) -> Guard:
    limits = Limits(
        deadline_ms=1000, model_calls=8, requests=8, executions=executions, same=2, stagnant=3
    )
    return Guard(limits, now=world.clock, wait=world.wait, ledger=ledger, revision=0)


def test_a_second_task_reuses_the_first_tasks_committed_result_without_executing() -> None:
    world, ledger = World(), InMemoryLedger()
    first = new_guard(world, ledger).run(
        one_notice_then_finish(world, []), sends(world), inspects(world)
    )
    assert (first.state, first.reason, world.sent) == (State.COMPLETED, Reason.GOAL_MET, 1)

    observed: list[Any] = []
    second = new_guard(world, ledger).run(
        one_notice_then_finish(world, observed), sends(world), inspects(world)
    )

    assert world.sent == 1
    assert len(world.outbox) == 1
    assert second.executions == 0
    assert second.requests == 1
    assert (second.state, second.reason) == (State.COMPLETED, Reason.GOAL_MET)
    assert observed[1] == Result(Kind.SUCCESS, data={"message_id": "m-1"})
    assert [op.state for op in second.operations] == [OperationState.COMMITTED]


def test_reusing_a_committed_result_needs_no_execution_budget() -> None:
    world, ledger = World(), InMemoryLedger()
    new_guard(world, ledger).run(one_notice_then_finish(world, []), sends(world), inspects(world))

    second = new_guard(world, ledger, executions=0).run(
        one_notice_then_finish(world, []), sends(world), inspects(world)
    )

    assert world.sent == 1
    assert (second.state, second.reason) == (State.COMPLETED, Reason.GOAL_MET)
    assert second.executions == 0


def test_a_second_task_stops_at_an_operation_the_first_left_unknown() -> None:
    world, ledger = World(), InMemoryLedger()
    first = new_guard(world, ledger).run(
        one_notice_then_finish(world, []), sends(world, lose_response=True), inspects(world)
    )
    assert (first.state, world.sent) == (State.NEEDS_HUMAN, 1)

    second = new_guard(world, ledger).run(
        one_notice_then_finish(world, []), sends(world), inspects(world)
    )

    assert world.sent == 1
    assert second.executions == 0
    assert (second.state, second.reason) == (State.NEEDS_HUMAN, Reason.UNKNOWN_COMMIT)
    assert [(op.key, op.state) for op in second.uncertain] == [
        ("incident-42-first-notice", OperationState.UNKNOWN)
    ]


def test_a_second_task_stops_at_another_input_under_the_first_tasks_key() -> None:
    world, ledger = World(), InMemoryLedger()
    new_guard(world, ledger).run(one_notice_then_finish(world, []), sends(world), inspects(world))
    reworded = Call(
        "send_notice",
        {"incident": 42, "text": "Disk is full"},
        effect="write",
        operation_key="incident-42-first-notice",
    )

    second = new_guard(world, ledger).run(
        lambda observation: reworded, sends(world), inspects(world)
    )

    assert world.sent == 1
    assert (second.state, second.reason) == (State.NEEDS_HUMAN, Reason.OPERATION_CONFLICT)


def test_a_key_a_human_marked_not_committed_executes_again_with_the_same_fingerprint() -> None:
    world, ledger = World(), InMemoryLedger()
    first = new_guard(world, ledger).run(
        one_notice_then_finish(world, []), sends(world, lose_response=True), inspects(world)
    )
    assert first.state is State.NEEDS_HUMAN
    # The reconciler checks the real outbox, finds nothing delivered, and says so.
    world.outbox.clear()
    ledger.resolve("incident-42-first-notice", committed=False, evidence="outbox is empty")

    second = new_guard(world, ledger).run(
        one_notice_then_finish(world, []), sends(world), inspects(world)
    )

    assert world.sent == 2
    assert (second.state, second.reason) == (State.COMPLETED, Reason.GOAL_MET)
    entry = ledger.get("incident-42-first-notice")
    assert entry is not None
    assert entry.state is OperationState.COMMITTED
    assert entry.fingerprint == fingerprint(NOTICE.tool, dict(NOTICE.args))
    assert entry.attempts == 2
