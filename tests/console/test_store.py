"""The step store: one interface for every driver, the lease an owner and an expiry, and
operations that move only as ``guard.steps.OPERATION_MOVES`` says.

The second driver here stands in for the attached-agent API: no heartbeat thread, a new
store and a guard restored from it per "request", the lease renewed by each request.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from console import lifecycle
from console.drivers import runner
from console.models import Operation, OperationEvent, Task, TaskState, TraceEvent
from console.store import LeaseLost, Record, Step, open_store
from guard import Guard, Kind, OperationState, Result
from guard.steps import CLAIM_ANSWERS, OPERATION_MOVES, ClaimStatus, LedgerError

pytestmark = pytest.mark.django_db(transaction=True)

Start = Callable[..., Task]
FP = "f" * 64
OTHER_FP = "0" * 64


def _usage(**spent: int) -> dict[str, int]:
    zero = {"model_calls": 0, "requests": 0, "executions": 0, "tokens": 0, "spend": 0}
    zero |= {"explored": 0, "polls": 0}
    return {**zero, "elapsed_ms": 0, **spent}


def _request(tool: str = "read_page") -> dict[str, Any]:
    return {"kind": "request", "at": timezone.now(), "decision": "executed", "tool": tool}


# -- the lease -------------------------------------------------------------------------------


def test_its_holder_may_take_the_lease_again_and_another_driver_may_not(start: Start) -> None:
    task = start("test_reader", {"pages": 2})

    first = open_store(task.id, "client-a")
    assert isinstance(first.take_lease(30), Task)
    again = open_store(task.id, "client-a").take_lease(30)  # the next request of the same client
    other = open_store(task.id, "client-b").take_lease(30)

    assert isinstance(again, Task) and again.state == TaskState.RUNNING
    assert isinstance(other, str) and other.startswith("another driver holds the lease for")
    assert "client-a" not in other  # the holder's lease is its own credential
    assert Task.objects.get(id=task.id).lease_owner == "client-a"


def test_a_stop_recorded_meanwhile_does_not_end_a_running_task_its_holder_takes_again(
    start: Start, operator: User
) -> None:
    """The holder's next request gets its task back, write in flight and all; the stop is
    seen where every driver sees it (here: the claim's gate), not as "stopped before it
    ran"."""
    task = start("test_notices", {"count": 1})
    first = open_store(task.id, "client-a")
    first.take_lease(30)
    first.claim("k-1", FP, tool="send_notice", args="{}")
    lifecycle.request_stop(Task.objects.get(id=task.id), actor=operator, note="stop it")

    again = open_store(task.id, "client-a")
    taken = again.take_lease(30)

    assert isinstance(taken, Task) and taken.state == TaskState.RUNNING
    assert Operation.objects.get(key="k-1").state == "IN_FLIGHT"
    assert again.claim("k-2", FP, tool="send_notice", args="{}").status is ClaimStatus.STOPPING
    assert not Operation.objects.filter(key="k-2").exists()
    assert Task.objects.get(id=task.id).state == TaskState.RUNNING


def test_a_released_lease_lets_the_next_driver_in_where_the_task_stood(start: Start) -> None:
    task = start("test_reader", {"pages": 2})
    first = open_store(task.id, "client-a")
    first.take_lease(30)
    first.save(Step(_usage(model_calls=1), 0, [{"kind": "model_call", "at": timezone.now()}]))

    assert first.release_lease()
    second = open_store(task.id, "client-b")
    taken = second.take_lease(30)

    assert isinstance(taken, Task)
    assert (taken.lease_owner, taken.model_calls, taken.next_seq) == ("client-b", 1, 2)
    assert not first.renew_lease(30)  # the first client learns it at its next request
    with pytest.raises(LeaseLost):
        first.save(Step(_usage(model_calls=2), 0))
    assert Task.objects.get(id=task.id).model_calls == 1


def test_a_released_lease_leaves_the_task_to_the_recovery_sweep(start: Start) -> None:
    task = start("test_notices", {"count": 1, "auto_lookup": False})  # no lookup to ask
    store = open_store(task.id, "client-a")
    store.take_lease(30)
    store.claim("k-1", FP, tool="send_notice", args="{}")

    assert store.release_lease()
    counts = runner.sweep(enqueue=lambda task_id: None)

    task.refresh_from_db()
    assert counts["recovered"] == 1
    assert (task.state, task.reason) == (TaskState.NEEDS_HUMAN, "unknown_commit")
    assert Operation.objects.get(key="k-1").state == "UNKNOWN"  # never run again


def test_a_lease_renewed_by_each_request_keeps_the_sweep_away(start: Start) -> None:
    task = start("test_reader", {"pages": 2})
    store = open_store(task.id, "client-a")
    store.take_lease(0.5)
    Task.objects.filter(id=task.id).update(lease_expires_at=timezone.now() - timedelta(seconds=1))

    assert store.renew_lease(30)

    assert Task.objects.get(id=task.id).lease_expires_at > timezone.now()


def test_a_driver_restored_from_the_store_per_request_goes_on_where_the_last_one_stopped(
    start: Start,
) -> None:
    """Each request restores the real guard from the store (checkpoint without history,
    history rebuilt from the trace) and saves its step; nothing repeats or resets."""
    task = start("test_reader", {"pages": 3})
    for n in range(1, 4):
        store = open_store(task.id, "client-a")
        row = store.take_lease(30)
        assert isinstance(row, Task)
        limits = lifecycle.limits_of(row)
        checkpoint = row.checkpoint or {}
        if "guard" in checkpoint:
            saved = {**checkpoint["guard"], "usage": lifecycle.usage_of(row).to_dict()}
            guard = Guard.restore(saved, limits, history=store.history(row.phase))
        else:
            guard = Guard(limits, used=lifecycle.usage_of(row), revision=row.revision)
        assert guard.usage.model_calls == n - 1
        assert guard.before_model() is None
        saved_step = store.save(
            Step(
                guard.usage.to_dict(),
                n,
                [_request()],
                {"phase": row.phase, "guard": guard.checkpoint(history=False)},
            )
        )
        assert not saved_step.stop_requested

    task.refresh_from_db()
    assert (task.model_calls, task.revision, task.next_seq) == (3, 3, 4)
    assert list(TraceEvent.objects.filter(task=task).values_list("seq", flat=True)) == [1, 2, 3]


# -- the step's save -------------------------------------------------------------------------


def test_a_save_reads_back_a_stop_recorded_since_the_last_one(start: Start) -> None:
    task = start("test_reader", {"pages": 2})
    store = open_store(task.id, "driver")
    store.take_lease(30)
    assert not store.save(Step(_usage(), 0)).stop_requested

    Task.objects.filter(id=task.id).update(stop_requested_at=timezone.now())

    assert store.save(Step(_usage(), 0)).stop_requested
    assert store.stop_requested()


def test_a_record_riding_on_a_save_that_cannot_make_it_says_why(start: Start) -> None:
    task = start("test_notices", {"count": 1})
    store = open_store(task.id, "driver")
    store.take_lease(30)
    store.claim("k-1", FP, tool="send_notice", args="{}")
    store.resolve("k-1", "settle_not_committed", result=None, evidence="nothing in the desk")

    saved = store.save(
        Step(_usage(executions=1), 0, [_request("send_notice")]),
        record=Record("k-1", FP, {"kind": "SUCCESS", "data": None}),
    )

    assert isinstance(saved.record_failed, LedgerError)
    assert "NOT_COMMITTED, cannot become COMMITTED" in str(saved.record_failed)
    assert Operation.objects.get(key="k-1").state == "NOT_COMMITTED"
    assert Task.objects.get(id=task.id).executions == 1  # the step itself is saved


def test_a_claim_carrying_a_step_with_a_checkpoint_saves_the_checkpoint_with_it(
    start: Start,
) -> None:
    task = start("test_notices", {"count": 1})
    store = open_store(task.id, "driver")
    store.take_lease(30)
    step = Step(_usage(model_calls=1), 0, [_request("send_notice")], {"phase": 1, "memo": "m"})

    claim = store.claim("k-1", FP, tool="send_notice", args="{}", carry=step)

    assert claim.status == "claimed"
    assert step.saved is not None
    task.refresh_from_db()
    assert (task.checkpoint, task.model_calls, task.next_seq) == ({"phase": 1, "memo": "m"}, 1, 2)


def test_claims_moves_and_saves_are_stamped_by_the_application_clock(
    start: Start, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One clock for every path: the reconciliation queue orders operations by
    ``updated_at``, whichever store or service wrote it."""
    task = start("test_notices", {"count": 2})
    store = open_store(task.id, "driver")
    store.take_lease(30)
    then = timezone.now() - timedelta(hours=1)
    monkeypatch.setattr(timezone, "now", lambda: then)

    store.claim("k-1", FP, tool="send_notice", args="{}")
    claimed = Operation.objects.get(key="k-1")
    store.claim("k-2", FP, tool="send_notice", args="{}", carry=Step(_usage(), 0))
    store.settle("k-2", FP, "lose")
    store.save(Step(_usage(), 0), record=Record("k-1", FP, {"kind": "SUCCESS", "data": None}))

    recorded = Operation.objects.get(key="k-1")
    assert (claimed.claimed_at, claimed.updated_at, recorded.updated_at) == (then, then, then)
    assert Operation.objects.get(key="k-2").updated_at == then
    assert set(OperationEvent.objects.values_list("at", flat=True)) == {then}
    assert Task.objects.get(id=task.id).last_step_at == then


# -- operation moves, by the table -----------------------------------------------------------

STATES = [None, "IN_FLIGHT", "UNKNOWN", "COMMITTED", "NOT_COMMITTED"]


def _operation_in(store: Any, key: str, state: str | None) -> None:
    if state is None:
        return
    store.claim(key, FP, tool="send_notice", args="{}")
    if state == "UNKNOWN":
        store.settle(key, FP, "lose")
    elif state == "COMMITTED":
        store.settle(key, FP, "record", {"kind": "SUCCESS", "data": None})
    elif state == "NOT_COMMITTED":
        store.resolve(key, "settle_not_committed", result=None, evidence="verified")


def _make(store: Any, move: str, key: str) -> Any:
    if move == "claim":
        return store.claim(key, FP, tool="send_notice", args="{}")
    if move in ("record", "lose"):
        result = {"kind": "SUCCESS", "data": None} if move == "record" else None
        return store.settle(key, FP, move, result)
    result = {"kind": "SUCCESS", "data": None} if move == "settle_committed" else None
    return store.resolve(key, move, result=result, evidence="a person checked")


@pytest.mark.parametrize("move", sorted(OPERATION_MOVES))
def test_an_operation_makes_a_move_from_exactly_the_states_the_table_allows(
    start: Start, move: str
) -> None:
    task = start("test_notices", {"count": 1})
    store = open_store(task.id, "driver")
    store.take_lease(30)
    sources, target = OPERATION_MOVES[move]
    for state in STATES:
        key = f"{move}-{state}"
        _operation_in(store, key, state)
        events = OperationEvent.objects.filter(operation__key=key).count()
        allowed = state in {None if s is None else s.value for s in sources}

        if move == "claim":
            made = _make(store, move, key).status == "claimed"
        else:
            try:
                _make(store, move, key)
                made = True
            except LedgerError:
                made = False

        row = Operation.objects.filter(key=key).first()
        assert made is allowed, (move, state)
        assert (row.state if row else None) == (target.value if made else state), (move, state)
        assert OperationEvent.objects.filter(operation__key=key).count() == events + made


@pytest.mark.parametrize("state", STATES, ids=str)
def test_a_claim_answers_by_the_entry_s_state_as_the_guard_s_claim_answers_say(
    start: Start, state: str | None
) -> None:
    task = start("test_notices", {"count": 1})
    store = open_store(task.id, "driver")
    store.take_lease(30)
    _operation_in(store, "k-1", state)

    claim = store.claim("k-1", FP, tool="send_notice", args="{}")

    assert claim.status is CLAIM_ANSWERS[None if state is None else OperationState(state)]
    first = state is None
    history = OperationEvent.objects.filter(operation__key="k-1").order_by("id")
    if claim.status == "claimed":  # its history row says where it was taken from
        assert history.values_list("from_state", flat=True).last() == ("" if first else state)


def test_a_settling_move_for_other_input_is_refused(start: Start) -> None:
    task = start("test_notices", {"count": 1})
    store = open_store(task.id, "driver")
    store.take_lease(30)
    store.claim("k-1", FP, tool="send_notice", args="{}")

    with pytest.raises(LedgerError, match="another input"):
        store.settle("k-1", OTHER_FP, "record", Result(Kind.SUCCESS).to_dict())

    assert Operation.objects.get(key="k-1").state == "IN_FLIGHT"


def test_a_claim_whose_rival_is_settled_not_committed_meanwhile_claims_it_instead_of_failing(
    start: Start, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PostgreSQL reads a refused claim's entry after the claim's own transaction: the
    execution that held it may have been settled NOT_COMMITTED in between (its lookup proved
    nothing happened). That is a key this write may claim, not an error."""
    from console.store import postgresql

    first, second = start("test_reader", {"pages": 1}), start("test_reader", {"pages": 2})
    holder, rival = open_store(first.id, "client-a"), open_store(second.id, "client-b")
    assert isinstance(holder.take_lease(30), Task) and isinstance(rival.take_lease(30), Task)
    fp = "f" * 64
    assert holder.claim("k-1", fp, tool="send_notice", args="{}").status == "claimed"
    real_entry_of = postgresql.entry_of
    settled: list[str] = []

    def settled_just_before_the_read(op: Operation) -> Any:
        if not settled:
            holder.resolve("k-1", "settle_not_committed", result=None, evidence="not sent")
            settled.append("k-1")
            op.refresh_from_db()
        return real_entry_of(op)

    monkeypatch.setattr(postgresql, "entry_of", settled_just_before_the_read)

    claim = rival.claim("k-1", fp, tool="send_notice", args="{}")

    assert settled == ["k-1"]
    assert claim.status == "claimed"
    op = Operation.objects.get(key="k-1")
    assert (op.state, op.task_id, op.attempts) == ("IN_FLIGHT", second.id, 2)
