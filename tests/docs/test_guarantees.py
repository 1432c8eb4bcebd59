"""docs/guarantees.md names where each promise is kept and which tests prove it: every one
of those names must exist, so the page cannot drift from the code it points at."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGE = (ROOT / "docs" / "guarantees.md").read_text()
TESTS = ROOT / "tests"

# `console/test_runner.py` or `guard/test_ledger.py`: test files, relative to tests/.
TEST_FILE = r"`((?:console|guard|e2e|docs|deploy)/[\w/]*test_\w+\.py)`"
TEST_FILES = sorted(set(re.findall(TEST_FILE, PAGE)))
# `test_a_claim_after_...`: test functions.
TEST_NAMES = sorted(set(re.findall(r"`(test_\w+)`", PAGE)))
# `console/store/postgresql.py`, `guard/_budget.py`: code files, relative to the root.
CODE_FILES = sorted(
    set(re.findall(r"`((?:console|guard)/[\w/]+\.py)`", PAGE)) - set(TEST_FILES)
)
# `Guard.before_tool`, `guard.steps.OPERATION_MOVES`, `console.lifecycle.task_finish`.
DOTTED = sorted(set(re.findall(r"`((?:guard|console)(?:\.\w+)+)`", PAGE)))
# `Guard.before_tool`, `lifecycle.recover`, `StepStore.claim`: a short first part, then what it
# holds; the short parts stand for these.
SHORT = {
    "Guard": "guard.Guard",
    "InMemoryLedger": "guard.InMemoryLedger",
    "Ledger": "guard.Ledger",
    "Result": "guard.Result",
    "Evidence": "guard.Evidence",
    "lifecycle": "console.lifecycle",
    "services": "console.services",
    "selectors": "console.selectors",
    "StepStore": "console.store.StepStore",
    "Saved": "console.store.Saved",
    "DatabaseLedger": "console.drivers.ledger.DatabaseLedger",
}
SHORT_PATTERN = "|".join(SHORT)
GUARD_NAMES = sorted(set(re.findall(rf"`((?:{SHORT_PATTERN})\.[\w.]+)`", PAGE)))

ALL_TESTS = "\n".join(path.read_text() for path in TESTS.rglob("test_*.py"))


def test_the_page_names_tests_and_code_at_all() -> None:
    assert len(TEST_NAMES) > 20 and len(TEST_FILES) > 10


@pytest.mark.parametrize("name", TEST_FILES)
def test_every_test_file_it_names_exists(name: str) -> None:
    assert (TESTS / name).is_file() or (TESTS / name.removesuffix(".py")).is_dir()


@pytest.mark.parametrize("name", TEST_NAMES)
def test_every_test_it_names_exists(name: str) -> None:
    assert re.search(rf"def {name}\b", ALL_TESTS), f"no test named {name}"


@pytest.mark.parametrize("name", CODE_FILES)
def test_every_code_file_it_names_exists(name: str) -> None:
    assert (ROOT / name).is_file()


@pytest.mark.parametrize("name", DOTTED + GUARD_NAMES)
def test_every_public_name_it_gives_exists(name: str) -> None:
    parts = name.split(".")
    if parts[0] in SHORT:
        parts = [*SHORT[parts[0]].split("."), *parts[1:]]
    for split in range(len(parts), 0, -1):  # the longest importable module, then attributes
        try:
            found: object = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        for attribute in parts[split:]:
            found = getattr(found, attribute)
        return
    pytest.fail(f"{name} does not exist")


def test_it_points_at_public_names_not_private_helpers() -> None:
    # A private helper may be renamed by any change; the page names what stays.
    private = re.findall(r"`((?:[A-Za-z]\w*\.)*_[A-Za-z]\w*(?:\.\w+)*)`", PAGE)
    assert private == []
