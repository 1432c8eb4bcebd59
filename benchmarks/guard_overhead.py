"""Microseconds the guard adds to each step of an agent loop, against a bare loop.

Run: ``.venv/bin/python benchmarks/guard_overhead.py`` (``--quick`` for a smoke run).

Each workload runs the same planner, executor and inspector twice in this process: once
in a bare ``for`` loop (the baseline) and once under ``Guard.run``. The difference per step
is the guard's overhead. History length is the number of steps in one run; the target is
≤ 10 µs per step, flat as history grows.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from guard import Call, Evidence, Guard, InMemoryLedger, Kind, Limits, Result

BIG = 10**9
LENGTHS = (10, 1_000, 10_000)


@dataclass
class Workload:
    """One agent loop: how to plan, execute and inspect step ``i``."""

    name: str
    plan: Callable[[int], Call]
    progress: bool
    exempt: frozenset[str] = frozenset()


def _paging(i: int) -> Call:
    return Call("read_page", {"cursor": f"c{i}", "page": i, "size": 50})


def _tail(i: int) -> Call:
    return Call("tail_log", {"job": 7})


def _search(i: int) -> Call:
    return Call("search", {"q": f"order {i}", "filters": {"status": "open", "limit": 20}})


def _refund(i: int) -> Call:
    return Call("refund", {"order": i, "cents": 1500}, "write", f"order-{i}-refund")


WORKLOADS = [
    Workload("paging, progress every step", _paging, progress=True),
    Workload("exempt tool, no progress", _tail, progress=False, exempt=frozenset({"tail_log"})),
    Workload("distinct reads, no progress", _search, progress=False),
    Workload("writes through the ledger", _refund, progress=True),
]


def _functions(
    workload: Workload, steps: int
) -> tuple[Callable[[Any], Call], Callable[[Call], Result], Callable[[Any, Any], Evidence]]:
    state = {"i": 0, "revision": 0}
    result = Result(Kind.SUCCESS, {"rows": 50})

    def plan(observation: Any) -> Call:
        call = workload.plan(state["i"])
        state["i"] += 1
        return call

    def execute(call: Call) -> Result:
        if workload.progress:
            state["revision"] += 1
        return result

    def inspect(result: Any, call: Any) -> Evidence:
        return Evidence(state["revision"], state["i"] >= steps, committed=True)

    return plan, execute, inspect


def bare(workload: Workload, steps: int) -> float:
    """Seconds for ``steps`` plain plan → execute → inspect rounds."""
    plan, execute, inspect = _functions(workload, steps)
    start = time.perf_counter()
    observation: Any = None
    for _ in range(steps):
        call = plan(observation)
        observation = execute(call)
        if inspect(observation, call).done:
            break
    return time.perf_counter() - start


def guarded(workload: Workload, steps: int) -> float:
    """Seconds for the same rounds driven by ``Guard.run``."""
    plan, execute, inspect = _functions(workload, steps)
    limits = Limits(
        deadline_ms=BIG,
        model_calls=BIG,
        requests=BIG,
        executions=BIG,
        stagnant=BIG,
        exempt=workload.exempt,
    )
    guard = Guard(limits, ledger=InMemoryLedger())
    start = time.perf_counter()
    report = guard.run(plan, execute, inspect)
    elapsed = time.perf_counter() - start
    if report.executions != steps or report.reason != "goal_met":
        raise SystemExit(f"{workload.name}: expected {steps} steps, got {report.to_dict()}")
    return elapsed


def measure(workload: Workload, steps: int, rounds: int) -> tuple[float, float]:
    """Median µs per step for the bare loop and for the guarded loop."""
    base = [bare(workload, steps) / steps * 1e6 for _ in range(rounds)]
    with_guard = [guarded(workload, steps) / steps * 1e6 for _ in range(rounds)]
    return statistics.median(base), statistics.median(with_guard)


def main(argv: list[str]) -> int:
    """Print one row per workload and history length."""
    quick = "--quick" in argv
    lengths = (10, 100) if quick else LENGTHS
    print(f"python {sys.version.split()[0]}; median of rounds; µs per step")
    print(f"{'workload':<36} {'history':>8} {'bare':>8} {'guarded':>9} {'overhead':>9}")
    worst = 0.0
    for workload in WORKLOADS:
        for steps in lengths:
            rounds = 3 if quick else max(5, min(200, 20_000 // steps))
            base, with_guard = measure(workload, steps, rounds)
            overhead = with_guard - base
            worst = max(worst, overhead)
            print(
                f"{workload.name:<36} {steps:>8} {base:>8.2f} {with_guard:>9.2f} {overhead:>9.2f}"
            )
    print(f"worst overhead: {worst:.2f} µs per step (target ≤ 10)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
