"""Hosted agents from configuration: ``LOOPGUARD_EXTRA_AGENTS`` and what using one checks.

The parsing is tested directly; what an operator sees (a process that will not start on a
malformed entry, an agent added from the environment alone) is tested in a fresh Python
process with the console's own settings, as a web server or a worker would load them.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured
from pytest_django import Settings

from console.agents import AgentNotLoadable, agent_class, agents_from_environment
from console.selectors import startable_agents
from tests.processes import run_python

ROOT = Path(__file__).resolve().parents[2]


def django_process(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` after ``django.setup()`` with console.project.settings and ``env``."""
    return run_python(
        f"import django\ndjango.setup()\n{code}",
        env={
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "console.project.settings",
            "PYTHONPATH": str(ROOT),
            **env,
        },
        timeout=60,
    )


# -- the variable's spelling ------------------------------------------------------------------


def test_it_reads_name_equals_path_entries_separated_by_commas() -> None:
    agents = agents_from_environment(
        " shipping_notice = shipping.agents.ShippingNotice ,, billing-v2=billing.Agent, "
    )

    assert agents == {
        "shipping_notice": "shipping.agents.ShippingNotice",
        "billing-v2": "billing.Agent",
    }


def test_an_empty_value_adds_no_agent() -> None:
    assert agents_from_environment("") == {}
    assert agents_from_environment("  ") == {}


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("shipping.agents.ShippingNotice", "'shipping.agents.ShippingNotice' is not name="),
        ("=shipping.agents.ShippingNotice", "'' is not an agent name"),
        ("ship ping=shipping.Agent", "'ship ping' is not an agent name"),
        ("shipping=ShippingNotice", "agent 'shipping' has 'ShippingNotice', which is not"),
        ("shipping=shipping..Agent", "agent 'shipping' has 'shipping..Agent'"),
        ("shipping=shipping.agents:Agent", "agent 'shipping' has 'shipping.agents:Agent'"),
        ("shipping=", "agent 'shipping' has ''"),
        ("a=x.A,a=y.B", "agent 'a' is given twice"),
    ],
)
def test_it_refuses_a_malformed_entry_naming_the_variable_and_the_entry(
    value: str, said: str
) -> None:
    with pytest.raises(ImproperlyConfigured) as refused:
        agents_from_environment(value)

    assert str(refused.value).startswith("LOOPGUARD_EXTRA_AGENTS: ")
    assert said in str(refused.value)


# -- what a process started with it does --------------------------------------------------------


def test_an_agent_added_from_the_environment_is_registered_over_the_built_in_ones() -> None:
    done = django_process(
        "from console.agents import agent_class, agent_names\n"
        "names = agent_names()\n"
        "print(names[0], names[-1], agent_class('extra_notices').__name__, "
        "agent_class('paging').__name__)",
        LOOPGUARD_EXTRA_AGENTS=(
            "extra_notices=tests.console.agents.NoticeWriter,paging=tests.console.agents.SlowReader"
        ),
    )

    assert done.returncode == 0, done.stderr
    # Added after the built-in agents; a built-in name given again points elsewhere.
    assert done.stdout.split() == ["support_desk", "extra_notices", "NoticeWriter", "SlowReader"]


def test_a_process_will_not_start_with_a_malformed_entry() -> None:
    done = django_process("print('started')", LOOPGUARD_EXTRA_AGENTS="shipping:shipping.Agent")

    assert done.returncode != 0
    assert "started" not in done.stdout
    assert "ImproperlyConfigured: LOOPGUARD_EXTRA_AGENTS: 'shipping:shipping.Agent'" in (
        done.stderr
    )


# -- using an agent that does not load ------------------------------------------------------------


def test_an_agent_whose_module_does_not_import_is_named_with_its_path_when_used(
    settings: Settings,
) -> None:
    settings.LOOPGUARD_AGENTS = {**settings.LOOPGUARD_AGENTS, "shipping": "shipping.agents.Nope"}

    with pytest.raises(AgentNotLoadable) as refused:
        agent_class("shipping")

    assert str(refused.value).startswith(
        "agent 'shipping' is registered as 'shipping.agents.Nope', which cannot be imported: "
    )
    assert "No module named 'shipping'" in str(refused.value)


def test_an_agent_whose_path_is_not_an_agent_class_is_named_with_its_path_when_used(
    settings: Settings,
) -> None:
    settings.LOOPGUARD_AGENTS = {**settings.LOOPGUARD_AGENTS, "notices": "console.demo.desk"}

    with pytest.raises(AgentNotLoadable) as refused:
        agent_class("notices")

    assert str(refused.value) == (
        "agent 'notices' is registered as 'console.demo.desk', which is not an Agent subclass"
    )


def test_the_start_page_leaves_out_an_agent_that_does_not_load(settings: Settings) -> None:
    settings.LOOPGUARD_AGENTS = {**settings.LOOPGUARD_AGENTS, "shipping": "shipping.agents.Nope"}

    names = [card.name for card in startable_agents()]

    assert "shipping" not in names
    assert "support_desk" in names
