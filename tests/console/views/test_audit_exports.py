"""The audit log exports as CSV (formulas defused) and JSON, keeping its filters."""

from __future__ import annotations

import csv
import io
import json

import pytest

from .support import (
    KEY,
    SignIn,
    World,
    body,
    streamed,
)

pytestmark = pytest.mark.django_db


def test_the_csv_export_holds_the_filtered_entries_and_defuses_formulas(
    signed_in: SignIn, history: World
) -> None:
    response = signed_in("viewer").get("/audit.csv?action=stop")

    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/csv")
    assert "attachment" in response["Content-Disposition"]
    rows = list(csv.DictReader(io.StringIO(streamed(response))))
    assert len(rows) == 1
    row = rows[0]
    assert (row["actor"], row["action"], row["task"]) == (
        "operator",
        "stop",
        str(history.queued.id),
    )
    assert row["reason"] == """'=HYPERLINK("http://evil.example")"""
    assert json.loads(row["before"]) == {"state": "QUEUED", "stop_requested": False}
    assert json.loads(row["after"]) == {"state": "CANCELLED", "stop_requested": True}


def test_the_json_export_holds_the_filtered_entries_as_they_were_written(
    signed_in: SignIn, history: World
) -> None:
    response = signed_in("viewer").get("/audit.json?actor=reconciler")

    assert response.status_code == 200
    entries = json.loads(streamed(response))
    assert [
        (e["actor"], e["action"], e["operation"], e["reason"], e["before"], e["after"])
        for e in entries
    ] == [
        (
            "reconciler",
            "mark_not_committed",
            KEY,
            "no notice with this key in the desk",
            {"state": "UNKNOWN"},
            # What the tool's lookup said when it was marked so (it found nothing).
            {
                "state": "NOT_COMMITTED",
                "lookup": {"committed": False, "evidence": "", "result": None},
            },
        )
    ]


def test_the_json_export_of_everything_lists_every_action_newest_first(
    signed_in: SignIn, history: World
) -> None:
    entries = json.loads(streamed(signed_in("viewer").get("/audit.json")))

    assert [e["action"] for e in entries] == ["mark_not_committed", "stop", "start"]
    assert entries[1]["reason"] == '=HYPERLINK("http://evil.example")'  # JSON is not a sheet


def test_the_audit_page_links_exports_that_keep_its_filters(
    signed_in: SignIn, history: World
) -> None:
    html = body(signed_in("viewer").get("/audit/?action=stop&page=1"))

    assert 'href="/audit.csv?action=stop"' in html
    assert 'href="/audit.json?action=stop"' in html


@pytest.mark.parametrize("fmt", ["xml", "html", "csv.exe"])
def test_an_audit_export_in_another_format_is_not_found(signed_in: SignIn, fmt: str) -> None:
    assert signed_in("viewer").get(f"/audit.{fmt}").status_code == 404
