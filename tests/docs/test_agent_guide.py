"""The agent guide's example agent runs as printed, against the desk and the real database.

The code is taken from docs/agent-guide.md, executed as a module, registered the way the
guide says, started through the service and driven by the runner: what a reader pastes is
what is tested.
"""

from __future__ import annotations

import re
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pytest_django.fixtures import Settings

from console import services
from console.demo import desk
from console.demo.models import Notice
from console.drivers import runner
from console.models import Operation, OperationState, Task, TaskState, TraceEvent

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "agent-guide.md"
MODULE = "loopguard_docs_shipping_notice"
AGENT = "shipping_notice"
ORDER = 43  # a demo order of the desk (grace@example.com)
KEY = f"order-{ORDER}-shipping-notice"

# The runner's heartbeat and the ledger's claims use their own transactions and
# connections, as in production: the test database is really committed to.
pytestmark = pytest.mark.django_db(transaction=True)

Run = Callable[[], Task]


def example_source() -> str:
    """The one fenced Python block of the guide that defines the example agent."""
    text = GUIDE.read_text(encoding="utf-8")
    blocks = re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)
    found = [block for block in blocks if "class ShippingNotice(Agent)" in block]
    assert len(found) == 1, "the agent guide must hold exactly one ShippingNotice block"
    return found[0]


@pytest.fixture
def run(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> Run:
    """Load the guide's agent, register it, seed the desk; returns: start and drive a task."""
    module = types.ModuleType(MODULE)
    module.__file__ = str(GUIDE)
    # In sys.modules first, so that LOOPGUARD_AGENTS can name it by dotted path.
    monkeypatch.setitem(sys.modules, MODULE, module)
    exec(compile(example_source(), str(GUIDE), "exec"), module.__dict__)  # noqa: S102 - our own docs
    settings.LOOPGUARD_AGENTS = {**settings.LOOPGUARD_AGENTS, AGENT: f"{MODULE}.ShippingNotice"}
    desk.seed_demo_data()

    def _run() -> Task:
        task = services.task_start(agent=AGENT, input={"order": ORDER}, enqueue=lambda i: None)
        runner.drive(task.id)
        task.refresh_from_db()
        return task

    return _run


def _decisions(task: Task) -> list[tuple[str, str]]:
    events = TraceEvent.objects.filter(task=task, kind="request").order_by("seq")
    return list(events.values_list("tool", "decision"))


def test_the_example_agent_completes_and_sends_exactly_one_notice(run: Run) -> None:
    task = run()

    assert (task.state, task.reason) == (TaskState.COMPLETED, "goal_met")
    assert _decisions(task) == [("order_lookup", "executed"), ("send_notice", "executed")]
    assert (task.model_calls, task.requests, task.executions) == (3, 2, 2)
    assert task.revision == 2  # the order as the desk holds it, and the notice
    notice = Notice.objects.get()
    assert (notice.idempotency_key, notice.recipient) == (KEY, "grace@example.com")
    assert Operation.objects.get(key=KEY).state == OperationState.COMMITTED


def test_a_second_task_for_the_same_order_reuses_the_committed_notice(run: Run) -> None:
    first = run()

    second = run()

    assert (second.state, second.reason) == (TaskState.COMPLETED, "goal_met")
    assert _decisions(second) == [("order_lookup", "executed"), ("send_notice", "reused")]
    assert second.executions == 1  # only the read ran; the write came from the ledger
    assert Notice.objects.filter(idempotency_key=KEY).count() == 1
    operation = Operation.objects.get(key=KEY)
    assert (operation.state, operation.task_id, operation.attempts) == (
        OperationState.COMMITTED,
        first.id,
        1,
    )


def test_a_lost_response_is_settled_by_the_lookup_without_a_second_notice(
    run: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    send = desk.notice_send

    def send_then_lose_the_response(**kwargs: Any) -> Notice:
        send(**kwargs)
        raise TimeoutError("the notice went out but its response was lost")

    monkeypatch.setattr(desk, "notice_send", send_then_lose_the_response)

    task = run()

    assert (task.state, task.reason) == (TaskState.COMPLETED, "goal_met")
    assert Notice.objects.filter(idempotency_key=KEY).count() == 1
    operation = Operation.objects.get(key=KEY)
    assert operation.state == OperationState.COMMITTED
    assert operation.evidence.startswith("desk notice #")
