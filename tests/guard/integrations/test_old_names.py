"""The integrations live in ``guard/contrib/``; the names users import them by today,
``guard.langchain`` and ``guard.openai_agents``, still give the same objects."""

from __future__ import annotations

import importlib

import pytest

from guard.contrib import INTEGRATIONS, Integration

# The integrations that were importable before guard/contrib/ (a newer one has no old name).
OLD_NAMES = ("guard.contrib.langchain", "guard.contrib.openai_agents")
OLD = [integration for integration in INTEGRATIONS if integration.module in OLD_NAMES]


@pytest.mark.parametrize("integration", OLD, ids=lambda i: i.extra)
def test_an_integration_is_importable_by_its_old_name_with_the_same_objects(
    integration: Integration,
) -> None:
    for needed in integration.imports:
        pytest.importorskip(needed)
    new = importlib.import_module(integration.module)
    old = importlib.import_module("guard." + integration.module.rpartition(".")[2])

    assert old is not new
    assert sorted(old.__all__) == sorted(new.__all__)
    assert [name for name in new.__all__ if getattr(old, name) is not getattr(new, name)] == []
