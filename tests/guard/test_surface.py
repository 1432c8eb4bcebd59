"""The guard's public surface: a small top level for agent developers, the step-wise names
behind ``guard.steps``, the adapters behind ``guard.adapters``, each name documented."""

from __future__ import annotations

import inspect
from types import ModuleType

import pytest

import guard
import guard.adapters
import guard.steps

MODULES = [guard, guard.steps, guard.adapters]


def test_the_top_level_is_what_an_agent_developer_types() -> None:
    assert sorted(guard.__all__) == sorted(
        [
            "Guard",
            "Limits",
            "Call",
            "Finish",
            "Result",
            "Evidence",
            "Report",
            "InMemoryLedger",
            "Ledger",
            "Kind",
            "State",
            "Reason",
            "OperationState",
            "Settlement",
            "Nudge",
            "Usage",
            "Approval",
            "Price",
        ]
    )


def test_the_contract_of_the_design_imports_as_written() -> None:
    from guard import Call, Evidence, Finish, Guard, InMemoryLedger, Limits, Report, Result

    assert all([Call, Evidence, Finish, Guard, InMemoryLedger, Limits, Report, Result])


def test_step_wise_names_and_adapters_live_behind_their_own_modules() -> None:
    assert not set(guard.steps.__all__) & set(guard.__all__)
    assert not set(guard.adapters.__all__) & set(guard.__all__)
    assert "Ticket" in guard.steps.__all__ and "calls_from_openai" in guard.adapters.__all__
    assert "calls_from_openai" not in dir(guard)  # only a deprecated alias (tests/test_upgrade.py)


def _documented(module: ModuleType) -> list[tuple[str, object]]:
    found: list[tuple[str, object]] = []
    for name in module.__all__:
        obj = getattr(module, name)
        if inspect.isclass(obj) or inspect.isfunction(obj):
            found.append((f"{module.__name__}.{name}", obj))
        if inspect.isclass(obj) and obj.__module__.startswith("guard"):
            for attribute, member in vars(obj).items():
                if not attribute.startswith("_") and inspect.isfunction(member):
                    found.append((f"{module.__name__}.{name}.{attribute}", member))
    return found


@pytest.mark.parametrize(
    ("name", "obj"), [item for module in MODULES for item in _documented(module)]
)
def test_every_public_class_function_and_method_has_a_docstring(name: str, obj: object) -> None:
    assert (inspect.getdoc(obj) or "").strip(), f"{name} has no docstring"
