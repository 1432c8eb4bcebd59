"""The audit log's before → after reads as the fields that changed, in words (issue 22):
``state: QUEUED → CANCELLED``, money as money, not two blobs of JSON."""

from __future__ import annotations

import html as markup
import re

import pytest
from django.contrib.auth.models import User

from console.models import AuditAction, AuditEntry
from console.selectors import ABSENT, FieldChange, audit_changes
from console.templatetags.console import changes, whole_words

from .support import SignIn, World, body

pytestmark = pytest.mark.django_db


def _changes_read(page: str) -> list[str]:
    """Each change the page lists, as it reads."""
    items = re.findall(r'<ul class="changes">(.*?)</ul>', page, re.S)
    return [
        markup.unescape(" ".join(re.sub(r"<[^>]+>", " ", li).split()))
        for ul in items
        for li in re.findall(r"<li[^>]*>(.*?)</li>", ul, re.S)
    ]


def test_only_the_fields_that_changed_are_listed_nested_ones_down_to_their_leaves() -> None:
    before = {"state": "NEEDS_HUMAN", "limits": {"model_calls": 20, "spend": 20000}}
    after = {"state": "QUEUED", "limits": {"model_calls": 20, "spend": 25000}, "phase": 2}

    assert audit_changes(before, after) == [
        FieldChange(("state",), "NEEDS_HUMAN", "QUEUED"),
        FieldChange(("limits", "spend"), 20000, 25000),
        FieldChange(("phase",), ABSENT, 2),
    ]
    assert audit_changes({"state": "RUNNING"}, {"state": "RUNNING"}) == []
    assert audit_changes({}, None) == []


def test_a_stop_reads_as_its_state_and_flag_changing(signed_in: SignIn, world: World) -> None:
    signed_in("operator").post(f"/tasks/{world.queued.id}/stop", {"reason": "not needed"})

    for url in ("/audit/", f"/tasks/{world.queued.id}/"):
        page = body(signed_in("viewer").get(url))
        assert "state: QUEUED → CANCELLED" in _changes_read(page)
        assert "stop requested: no → yes" in _changes_read(page)
        assert not [c for c in _changes_read(page) if "{" in c]  # no JSON


def test_a_resumption_s_budgets_read_as_money_and_counts(
    people: dict[str, User], world: World
) -> None:
    entry = AuditEntry.objects.create(
        actor=people["approver"],
        action=AuditAction.APPROVE_RESUMPTION,
        task=world.stopped,
        reason="five more calls",
        before={"state": "CANCELLED", "limits": {"model_calls": 20, "spend": 20000}},
        after={
            "state": "QUEUED",
            "phase": 2,
            "grant": {"model_calls": 5, "spend": 5000},
            "limits": {"model_calls": 25, "spend": 25000},
        },
    )

    read = [
        f"{c.field}: {c.before} → {c.after}" if c.before else f"{c.field}: {c.after}"
        for c in changes(entry)
    ]

    assert read == [
        "state: CANCELLED → QUEUED",
        "model calls limit: 20 → 25",
        "spend limit: USD 0.02 → USD 0.025",
        "phase: 2",
        "model calls granted: +5",
        "spend granted: +USD 0.005",
    ]


def test_names_with_a_hyphen_stay_whole_and_everything_is_escaped() -> None:
    shown = whole_words("mail desk-lead@example.com <b>-x</b>")

    assert shown == (
        'mail <span class="nowrap">desk-lead@example.com</span> '
        '<span class="nowrap">&lt;b&gt;-x&lt;/b&gt;</span>'
    )
