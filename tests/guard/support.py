"""Small fakes for replaying a guarded task offline: a clock, scripted agents, counters, a
shop whose functions an agent framework calls.

A scripted step is a value to return, an exception to raise, or a function of the input
(the observation for a planner, the call for an executor, ``(result, subject)`` for an
inspector). Scripts play their steps in order and then repeat the last one, or cycle.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from hypothesis import HealthCheck, settings

from guard import Call, Evidence, Finish, Guard, Kind, Limits, Report, Result

__all__ = [
    "BASE_LIMITS",
    "NOTICE_KEY",
    "Clock",
    "Executor",
    "Inspector",
    "Notices",
    "Pages",
    "Planner",
    "Records",
    "Script",
    "Shop",
    "Sleeps",
    "assert_stays_stopped",
    "base_limits",
    "functions",
    "make_guard",
    "notice",
    "page_after_page",
    "property_settings",
    "read",
    "roomy",
    "scripted",
    "statuses",
    "succeed",
    "tools",
]

BASE_LIMITS = Limits(deadline_ms=1000, model_calls=8, requests=8, executions=6, same=2, stagnant=3)
"""The base limits of the design's behaviour table."""


def base_limits(**changes: Any) -> Limits:
    """The behaviour table's base limits with one row's changes (``same=3``, ...)."""
    return replace(BASE_LIMITS, **changes)


class Clock:
    """A fake clock in milliseconds. ``wait`` advances it and records each wait."""

    def __init__(self, start: float = 0) -> None:
        self.ms = start
        self.waits: list[float] = []

    def now(self) -> float:
        """The current time in milliseconds."""
        return self.ms

    def wait(self, ms: float) -> None:
        """Wait ``ms`` milliseconds: the clock moves on at once."""
        self.waits.append(ms)
        self.ms += ms

    def advance(self, ms: float) -> None:
        """Let time pass without anybody waiting (a slow tool, a slow model)."""
        self.ms += ms


class Sleeps:
    """The remote client's injected sleep: records each wait, waits for none."""

    def __init__(self) -> None:
        self.waits: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)


def make_guard(clock: Clock, limits: Limits = BASE_LIMITS, **options: Any) -> Guard:
    """A guard on the fake clock; ``options`` go to :class:`Guard` (ledger, revision, ...)."""
    return Guard(limits, now=clock.now, wait=clock.wait, **options)


def _play(steps: Sequence[Any], index: int, cycle: bool, *inputs: Any) -> Any:
    step = steps[index % len(steps)] if cycle else steps[min(index, len(steps) - 1)]
    if isinstance(step, BaseException):
        raise step
    if callable(step):
        return step(*inputs)
    return step


def _require(steps: Sequence[Any], what: str) -> tuple[Any, ...]:
    if not steps:
        raise ValueError(f"a scripted {what} needs at least one step")
    return tuple(steps)


class Planner:
    """A scripted model: returns one proposal per call and keeps every observation."""

    def __init__(self, *steps: Any, cycle: bool = False) -> None:
        self.steps = _require(steps, "planner")
        self.cycle = cycle
        self.observations: list[Any] = []

    @property
    def calls(self) -> int:
        """How many times the guard let the model plan."""
        return len(self.observations)

    def __call__(self, observation: Any) -> Any:
        self.observations.append(observation)
        return _play(self.steps, self.calls - 1, self.cycle, observation)


class Executor:
    """A scripted tool adapter that counts every real entry: what "executes" means."""

    def __init__(self, *steps: Any, cycle: bool = False) -> None:
        self.steps = _require(steps, "executor")
        self.cycle = cycle
        self.calls: list[Call] = []

    @property
    def entries(self) -> int:
        """How many times a tool was really entered."""
        return len(self.calls)

    def __call__(self, call: Call) -> Any:
        self.calls.append(call)
        return _play(self.steps, self.entries - 1, self.cycle, call)


class Inspector:
    """A scripted inspector of trusted records; keeps what it was asked about."""

    def __init__(self, *steps: Any, cycle: bool = False) -> None:
        self.steps = _require(steps, "inspector")
        self.cycle = cycle
        self.seen: list[tuple[Result | None, Call | Finish]] = []

    def __call__(self, result: Result | None, subject: Call | Finish) -> Any:
        self.seen.append((result, subject))
        return _play(self.steps, len(self.seen) - 1, self.cycle, result, subject)


@dataclass
class Script:
    """The three functions an agent gives the guard, each of them counting."""

    plan: Planner
    execute: Executor
    inspect: Inspector = field(default_factory=lambda: Inspector(Evidence(0, False)))

    def run(self, guard: Guard, **options: Any) -> Report:
        """``guard.run`` over this script (``options``: ``lookup``)."""
        return guard.run(self.plan, self.execute, self.inspect, **options)


def scripted(
    plan: Sequence[Any],
    results: Sequence[Any] = (Result(Kind.SUCCESS),),
    evidence: Sequence[Any] = (Evidence(0, False),),
    *,
    cycle: bool = False,
) -> Script:
    """A script from lists of steps; ``cycle`` makes the planner go round its proposals."""
    return Script(Planner(*plan, cycle=cycle), Executor(*results), Inspector(*evidence))


def assert_stays_stopped(guard: Guard, script: Script, report: Report) -> None:
    """Running the stopped guard again gives the same report and starts no work at all."""
    planned, entered, inspected = (
        script.plan.calls,
        script.execute.entries,
        len(script.inspect.seen),
    )
    again = script.run(guard)
    assert again is report
    assert guard.report is report
    assert script.plan.calls == planned, "a stopped guard planned again"
    assert script.execute.entries == entered, "a stopped guard executed again"
    assert len(script.inspect.seen) == inspected, "a stopped guard inspected again"


class Pages:
    """A paged source of ``total`` pages whose inspector accepts each page once, in order.

    The revision is the number of pages accepted; the goal is all pages accepted.
    """

    def __init__(self, total: int = 3) -> None:
        self.total = total
        self.accepted: list[int] = []

    def next_page(self, observation: Any = None) -> Call:
        """What a sensible model proposes: the first page not yet accepted."""
        return Call("read_page", {"page": len(self.accepted) + 1})

    def read(self, call: Call) -> Result:
        """The tool: returns the requested page."""
        page = call.args["page"]
        return Result(Kind.SUCCESS, {"page": page, "ids": [f"item-{page}"]})

    def inspect(self, result: Result | None, subject: Call | Finish) -> Evidence:
        """Checks a returned page against the records before counting it as progress."""
        if isinstance(subject, Call) and result is not None:
            page = subject.args["page"]
            expected = {"page": page, "ids": [f"item-{page}"]}
            if result.data != expected or page != len(self.accepted) + 1 or page > self.total:
                raise ValueError(f"page {page} is not the next valid page")
            self.accepted.append(page)
        return Evidence(len(self.accepted), len(self.accepted) == self.total)

    def script(self) -> Script:
        """A model reading page after page, the page tool and this inspector."""
        return Script(Planner(self.next_page), Executor(self.read), Inspector(self.inspect))


class Notices:
    """A business service that sends notices; its records are the trusted truth for writes."""

    def __init__(self) -> None:
        self.sent: dict[str, dict[str, Any]] = {}  # operation key -> what was sent

    def send(self, call: Call) -> Result:
        """The write tool: really sends (records) the notice."""
        assert call.operation_key is not None
        self.sent[call.operation_key] = dict(call.args)
        return Result(Kind.SUCCESS, {"notice_id": f"n-{len(self.sent)}"})

    def inspect(self, result: Result | None, subject: Call | Finish) -> Evidence:
        """Revision 0 throughout (a notice does not resolve the incident); commits verified."""
        if isinstance(subject, Call) and subject.effect == "write":
            return Evidence(0, False, committed=subject.operation_key in self.sent)
        return Evidence(0, False)

    def script(self, *plan: Any, cycle: bool = False) -> Script:
        """An agent that proposes ``plan`` and sends and verifies its notices here."""
        return Script(Planner(*plan, cycle=cycle), Executor(self.send), Inspector(self.inspect))


def notice(text: str = "First notice", key: str | None = "incident-42-first-notice") -> Call:
    """A write that sends a notice about incident 42 under a stable operation key."""
    return Call("send_notice", {"incident": 42, "text": text}, effect="write", operation_key=key)


NOTICE_KEY = "incident-42-first-notice"
"""The operation key of :func:`notice`."""


def roomy(**changes: Any) -> Limits:
    """Budgets wide enough that only the rule under test can stop the task."""
    room = {
        "deadline_ms": 100_000,
        "model_calls": 50,
        "requests": 50,
        "executions": 50,
        "stagnant": 50,
    }
    return base_limits(**{**room, **changes})


def read(tool: str, **args: Any) -> Call:
    """A read of ``tool`` with keyword arguments."""
    return Call(tool, args)


def page_after_page(first: int = 1) -> Callable[[Any], Call]:
    """A model's step reading page after page from ``first``, each read a new call (never a
    repeat); it runs out (raises) after page 999, so that a guard that never stops fails."""
    pages = iter(range(first, 1000))
    return lambda observation: read("read_page", page=next(pages))


class Records:
    """Trusted business records: a revision the tools raise, and which writes took effect."""

    def __init__(self) -> None:
        self.revision = 0
        self.done = False
        self.committed: dict[str, bool | None] = {}

    def inspect(self, result: Result | None, subject: Call | Finish) -> Evidence:
        """The revision and goal as recorded; for a write, whether it took effect."""
        if isinstance(subject, Call) and subject.effect == "write":
            assert subject.operation_key is not None
            committed = self.committed.get(subject.operation_key)
            return Evidence(self.revision, self.done, committed=committed)
        return Evidence(self.revision, self.done)


def tools(**handlers: Callable[[Call], Any]) -> Executor:
    """One executor for several tools; every real entry is counted by the Executor."""
    return Executor(lambda call: handlers[call.tool](call))


def functions(script: Script) -> tuple[Any, Any, Any]:
    """The planner, executor and inspector of ``script``, for ``run`` or a loop of steps."""
    return script.plan, script.execute, script.inspect


class Shop:
    """A tiny business system whose functions count their real executions."""

    def __init__(self) -> None:
        self.lookups: list[int] = []
        self.refunds: list[int] = []

    def find_order(self, order: int) -> str:
        """Find an order by its number."""
        self.lookups.append(order)
        return f"order {order}: delivered, 30 EUR"

    def send_refund(self, order: int) -> str:
        """Refund an order."""
        self.refunds.append(order)
        return f"refund {len(self.refunds)} sent for order {order}"

    def lose_refund(self, order: int) -> str:
        """Refund an order (its response gets lost)."""
        self.refunds.append(order)
        raise TimeoutError("the payment service did not answer")


def property_settings(max_examples: int) -> settings:
    """Hypothesis settings for a property of the guard: ``max_examples`` examples, the same
    on every run (CI never turns red by chance), with no deadline per example."""
    return settings(
        max_examples=max_examples,
        deadline=None,
        derandomize=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


def succeed(call: Call) -> Result:
    """A tool that always succeeds."""
    return Result(Kind.SUCCESS)


def statuses(report: Report) -> list[str]:
    """What became of each call of the last model call, in order."""
    return [item["status"] for item in report.batch]
