"""The agent guide's framework examples ("Guard an agent you already have") run as printed.

Each example is the fenced Python block of that section holding the line
``# example: <name>``. It is executed in a fresh module, on the framework's own offline test
model, and must print what its comments promise and leave behind what the guide says: the
stop report, and a write that ran once although the model asked for it twice. The plain
``openai`` loop needs a server; its block must be the loop that
tests/guard/integrations/test_plain_openai_loop.py drives, and it is run here against the
same scripted server.
"""

from __future__ import annotations

import ast
import contextlib
import inspect
import io
import re
import sys
import types
from pathlib import Path
from typing import Any

import pytest

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "agent-guide.md"
SECTION = "## Guard an agent you already have"


def section(title: str = SECTION) -> str:
    """The guide's section ``title``, up to the next section of its level."""
    text = GUIDE.read_text(encoding="utf-8")
    assert text.count(f"\n{title}\n") == 1, f"the agent guide must hold one {title!r}"
    body = text.split(f"\n{title}\n", 1)[1]
    return re.split(r"^## ", body, maxsplit=1, flags=re.M)[0]


def example_source(name: str, title: str = SECTION) -> str:
    """The one fenced Python block of the section marked ``# example: <name>``."""
    blocks: list[str] = re.findall(r"^```python\n(.*?)^```", section(title), flags=re.S | re.M)
    marker = re.compile(rf"^# example: {re.escape(name)}$", re.M)
    found = [block for block in blocks if marker.search(block)]
    assert len(found) == 1, f"the section must hold exactly one '# example: {name}' block"
    return found[0]


def promised_output(source: str) -> list[str]:
    """What the block's ``print(...)  # ...`` lines say they print, in order."""
    return [m.strip() for m in re.findall(r"^print\(.*\)\s+# (.+)$", source, flags=re.M)]


def run_example(
    name: str,
    monkeypatch: pytest.MonkeyPatch,
    title: str = SECTION,
    given: dict[str, Any] | None = None,
) -> tuple[dict[str, Any], list[str]]:
    """Execute the example as a module of its own (holding ``given`` first): its namespace
    and the lines it printed."""
    module = types.ModuleType(f"loopguard_docs_{name.replace('-', '_')}")
    module.__dict__.update(given or {})
    module.__file__ = str(GUIDE)
    # Classes the example defines name this module; some libraries look them up there.
    monkeypatch.setitem(sys.modules, module.__name__, module)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(example_source(name, title), str(GUIDE), "exec"), module.__dict__)  # noqa: S102 - our own docs
    return module.__dict__, out.getvalue().splitlines()


def test_the_langchain_example_notifies_once_and_ends_with_the_report_it_prints(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pytest.importorskip("langchain")
    source = example_source("langchain")
    # The ordering rule the guide states: the retry middleware first, the guard after it.
    assert re.search(r"middleware=\[ToolRetryMiddleware\(.*\), loop_guard\]", source)

    namespace, printed = run_example("langchain", monkeypatch)

    assert printed == promised_output(source)
    report = namespace["report"]
    assert (report.state, report.reason) == ("PARTIAL", "goal_unverified")
    assert namespace["sent"] == [42]  # asked for twice, sent once
    assert (report.model_calls, report.requests, report.executions) == (4, 3, 2)
    assert [(op.key, op.state) for op in report.operations] == [
        ("incident-42-first-notice", "COMMITTED")
    ]
    state = namespace["state"]
    assert state["loopguard_report"] == report.to_dict()
    assert state["messages"][-1].content == "The on-call engineer was notified about incident 42."


def test_the_agents_sdk_example_refunds_once_and_ends_with_the_report_it_prints(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pytest.importorskip("agents")
    source = example_source("openai-agents")

    namespace, printed = run_example("openai-agents", monkeypatch)

    assert printed == promised_output(source)
    outcome = namespace["outcome"]
    report = outcome.report
    assert (report.state, report.reason) == ("PARTIAL", "goal_unverified")
    assert namespace["refunds"] == [42]  # asked for twice, refunded once
    assert (report.model_calls, report.requests, report.executions) == (4, 3, 2)
    assert [(op.key, op.state) for op in report.operations] == [("refund-order-42", "COMMITTED")]
    assert outcome.result is not None
    assert namespace["model"].remaining_steps == 0  # the whole script was played


def _function(source: str, name: str) -> str:
    """The AST of one top-level function of ``source``, without its position in the file."""
    tree = ast.parse(source)
    found = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name]
    assert len(found) == 1, f"{name} must be defined once"
    return ast.dump(found[0])


def test_the_plain_loop_in_the_guide_is_the_tested_loop_and_refunds_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pytest.importorskip("openai")
    import openai

    from guard import Guard
    from tests.guard.integrations import test_plain_openai_loop as tested

    source = example_source("plain-openai")
    assert _function(source, "guarded_chat_loop") == _function(
        inspect.getsource(tested), "guarded_chat_loop"
    ), "the guide's loop differs from the one tests/guard/integrations tests"
    namespace, printed = run_example("plain-openai", monkeypatch)
    assert printed == []  # it only defines the loop
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")  # the server is on loopback
    shop = tested.Shop()
    replies = [
        tested.tool_calls(("c1", "find_order", {"order": 42})),
        tested.tool_calls(("c2", "send_refund", {"order": 42})),
        tested.tool_calls(("c3", "send_refund", {"order": 42})),
        {"content": "Order 42 is refunded."},
    ]

    with tested.ScriptedServer(replies) as server:
        client = openai.OpenAI(base_url=server.url, api_key="test-key", max_retries=0)
        report = namespace["guarded_chat_loop"](
            client,
            Guard(tested.LIMITS),
            {"find_order": shop.find_order, "send_refund": shop.send_refund},
            tested.SPECS,
            [{"role": "user", "content": "Refund order 42"}],
            tested.SCHEMAS,
        )

    assert (report.state, report.reason) == ("PARTIAL", "goal_unverified")
    assert shop.refunds == [42]
    assert (report.model_calls, report.requests, report.executions) == (4, 3, 2)
