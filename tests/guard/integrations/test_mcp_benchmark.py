"""benchmarks/mcp_gateway.py runs as a user runs it, prints every row, and checks that the
calls it timed through the gateway did their work exactly once (it stops otherwise)."""

from __future__ import annotations

import re

import pytest

from tests.benchmarks.support import run

pytest.importorskip("mcp")


def test_its_help_says_what_it_measures() -> None:
    done = run("mcp_gateway", "--help")
    assert done.returncode == 0, done.stderr
    for word in ("direct", "gateway", "added", "--calls", "--quick", "p95"):
        assert word in done.stdout


@pytest.mark.slow
def test_a_small_run_prints_each_row_and_every_write_happened_once() -> None:
    done = run("mcp_gateway", "--calls", "6", timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    number = r"\s+-?[\d.]+"
    for label in ("direct", "gateway", "added"):
        assert re.search(rf"^{label}(?:{number}){{3}}$", out, re.MULTILINE), out
    # 10 calls a side (4 unmeasured), half of them writes: 5 notices each side, each once.
    assert "checked: every call answered, 10 notices each once" in out
    assert "with 10 executions" in out
