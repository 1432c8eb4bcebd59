"""Replay the design's behaviour table offline: ``python -m guard`` (add ``--json`` for reports).

Every scenario runs a real :class:`~guard.Guard` against a fake clock, a scripted planner
and a fake executor that counts its entries; nothing here talks to a model or a service.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from . import Call, Evidence, Finish, Guard, Kind, Limits, Report, Result

# The design's behaviour table's base limits; the console's demo agents start from them too.
BASE: dict[str, Any] = {
    "deadline_ms": 1000,
    "model_calls": 8,
    "requests": 8,
    "executions": 6,
    "same": 2,
    "stagnant": 3,
}


@dataclass
class World:
    """A fake clock and a fake business system for one scenario."""

    time: float = 0
    entries: int = 0
    revision: int = 0
    pages: set[int] = field(default_factory=set)

    def now(self) -> float:
        return self.time

    def wait(self, ms: float) -> None:
        self.time += ms


Scenario = Callable[[World], Report]


def _guard(world: World, **changes: int) -> Guard:
    return Guard(Limits(**{**BASE, **changes}), now=world.now, wait=world.wait)


def _counting(world: World, respond: Callable[[Call], Result | None]) -> Callable[[Call], Any]:
    def execute(call: Call) -> Result | None:
        world.entries += 1
        return respond(call)

    return execute


def _steady(world: World) -> Callable[[Result | None, Any], Evidence]:
    return lambda result, call: Evidence(world.revision, False, committed=True)


def retrying_read(world: World) -> Report:
    execute = _counting(world, lambda c: Result(Kind.RETRYABLE, wait_ms=10))
    return _guard(world).run(lambda o: Call("fetch_status", {"id": 7}), execute, _steady(world))


def oscillation(world: World) -> Report:
    turn = iter(["A", "B"] * 10)
    execute = _counting(world, lambda c: Result(Kind.SUCCESS))
    return _guard(world, stagnant=5).run(
        lambda o: Call(f"read_{next(turn)}", {}), execute, _steady(world)
    )


def three_pages(world: World) -> Report:
    def inspect(result: Result | None, call: Any) -> Evidence:
        if result is not None:
            world.pages.add(result.data["page"])
        return Evidence(len(world.pages), len(world.pages) == 3)

    execute = _counting(world, lambda c: Result(Kind.SUCCESS, {"page": c.args["page"]}))
    plan = lambda o: Call("read_page", {"page": len(world.pages) + 1})  # noqa: E731
    return _guard(world).run(plan, execute, inspect)


def claimed_progress(world: World) -> Report:
    step = iter(range(100))

    def plan(observation: Any) -> Call:
        world.time += 50
        return Call("search", {"q": f"almost done {next(step)}", "note": "progress: 90%"})

    execute = _counting(world, lambda c: Result(Kind.SUCCESS, {"claimed": "nearly there"}))
    return _guard(world).run(plan, execute, _steady(world))


def repeated_write(world: World) -> Report:
    execute = _counting(world, lambda c: Result(Kind.SUCCESS, {"refund": "r-1"}))
    call = Call("refund", {"order": 42, "cents": 1500}, "write", "order-42-refund")
    return _guard(world, same=3).run(lambda o: call, execute, _steady(world))


def lost_write(world: World) -> Report:
    def respond(call: Call) -> Result:
        raise TimeoutError("response lost after the notice was sent")

    call = Call("send_notice", {"incident": 42}, "write", "incident-42-first-notice")
    return _guard(world).run(lambda o: call, _counting(world, respond), _steady(world))


def conflicting_key(world: World) -> Report:
    amounts = iter([1500, 9900])
    execute = _counting(world, lambda c: Result(Kind.SUCCESS))
    plan = lambda o: Call("refund", {"cents": next(amounts)}, "write", "order-42-refund")  # noqa: E731
    return _guard(world).run(plan, execute, _steady(world))


def fatal(world: World) -> Report:
    execute = _counting(world, lambda c: Result(Kind.FATAL, {"error": "permission denied"}))
    return _guard(world).run(lambda o: Call("delete_file", {"p": "/x"}), execute, _steady(world))


def precondition(world: World) -> Report:
    execute = _counting(world, lambda c: Result(Kind.PRECONDITION, {"missing": "shop_id"}))
    return _guard(world).run(lambda o: Call("coupons", {"sku": 1}), execute, _steady(world))


def deadline(world: World) -> Report:
    execute = _counting(world, lambda c: Result(Kind.PENDING, wait_ms=2000))
    return _guard(world).run(lambda o: Call("job_status", {"job": 9}), execute, _steady(world))


def _progressing(world: World) -> tuple[Callable[[Any], Call], Callable[[Call], Any], Any]:
    def respond(call: Call) -> Result:
        world.revision += 1
        return Result(Kind.SUCCESS)

    return (
        lambda o: Call("read_page", {"page": world.revision + 1}),
        _counting(world, respond),
        _steady(world),
    )


def model_budget(world: World) -> Report:
    return _guard(world, model_calls=2).run(*_progressing(world))


def execution_budget(world: World) -> Report:
    return _guard(world, executions=1).run(*_progressing(world))


def unknown_kind(world: World) -> Report:
    execute = _counting(world, lambda c: Result("MAYBE"))
    return _guard(world).run(lambda o: Call("lookup", {"id": 1}), execute, _steady(world))


def unverified_finish(world: World) -> Report:
    execute = _counting(world, lambda c: Result(Kind.SUCCESS))
    plan = lambda o: Finish("all done, trust me") if o else Call("lookup", {"id": 1})  # noqa: E731
    return _guard(world).run(plan, execute, _steady(world))


SCENARIOS: list[tuple[str, Scenario]] = [
    ("the same read keeps returning RETRYABLE", retrying_read),
    ("reads A, B alternate with no progress (stagnant=5)", oscillation),
    ("three valid pages arrive in order", three_pages),
    ("arguments change, only the model claims progress", claimed_progress),
    ("a committed write is requested again (same=3)", repeated_write),
    ("a write commits but its response is lost", lost_write),
    ("the same operation key arrives with other input", conflicting_key),
    ("a permanent error", fatal),
    ("a missing precondition", precondition),
    ("waiting for PENDING would cross the deadline", deadline),
    ("model budget exhausted (model_calls=2)", model_budget),
    ("execution budget exhausted (executions=1)", execution_budget),
    ("unknown result kind", unknown_kind),
    ("the model declares finish without verification", unverified_finish),
]


def main(argv: list[str]) -> int:
    """Print one line per scenario (or every stop report with ``--json``)."""
    as_json = "--json" in argv
    width = max(len(name) for name, _ in SCENARIOS)
    if not as_json:
        print(f"{'situation':<{width}}  executes  state        reason               revision")
    for name, scenario in SCENARIOS:
        world = World()
        report = scenario(world)
        if as_json:
            print(f"# {name}\n{report.to_json(indent=2)}")
            continue
        ops = ", ".join(f"{op.key}={op.state}" for op in report.operations)
        print(
            f"{name:<{width}}  {world.entries:>8}  {report.state:<11}  {report.reason:<19}"
            f"  {report.revision:>8}  {ops}".rstrip()
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
