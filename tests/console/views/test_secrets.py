"""Secrets typed into forms or found by a lookup never show in the console."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from console.agents import Agent, Tool
from console.models import AuditEntry, Task
from guard import Call, Evidence, Finish, Kind, Result, Settlement

from .support import (
    KEY,
    START_FORM,
    SignIn,
    Start,
    World,
    body,
    resolve_form,
    streamed,
    unknown_operation,
)

pytestmark = pytest.mark.django_db


class ReceiptDesk(Agent):
    """A write tool whose business system answers a lookup with a receipt holding a secret."""

    name = "test_receipts"
    title = "Receipt desk (view tests)"

    def tools(self) -> list[Tool]:
        return [Tool("send_notice", "write", self._send, lookup=self._lookup)]

    def _send(self, call: Call) -> Result:
        return Result(Kind.SUCCESS, {})

    def _lookup(self, key: str) -> Settlement:
        receipt = {"receipt": "R-17", "api_token": "hunter2"}
        return Settlement(True, Result(Kind.SUCCESS, receipt), evidence="receipt R-17")

    def plan(self, observation: Any) -> Finish:
        return Finish()

    def inspect(self, result: Result | None, step: Call | Finish) -> Evidence:
        return Evidence(0, True)


def _shows_secret(text: str) -> bool:
    return "hunter2" in text or re.search(r"\babc\b", text) is not None


def test_a_password_and_token_typed_into_the_start_form_never_show_in_the_console(
    signed_in: SignIn,
) -> None:
    operator = signed_in("operator")
    started = operator.post(
        "/tasks/new",
        {**START_FORM, "input": '{"pages": 1, "password": "hunter2", "token": "abc"}'},
        follow=True,
    )
    task = Task.objects.get()
    operator.post(f"/tasks/{task.id}/stop", {"reason": "done looking"})

    assert started.status_code == 200
    assert not _shows_secret(body(started))
    assert "[redacted]" in body(started)
    viewer = signed_in("viewer")
    for url in (f"/tasks/{task.id}/", f"/tasks/{task.id}/report.json", "/tasks/", "/", "/audit/"):
        assert not _shows_secret(body(viewer.get(url))), url
    for url in ("/audit.csv", "/audit.json"):
        assert not _shows_secret(streamed(viewer.get(url))), url
    assert task.input == {"pages": 1, "password": "[redacted]", "token": "[redacted]"}


def test_a_secret_in_what_a_lookup_finds_is_neither_shown_nor_written_to_the_audit_log(
    signed_in: SignIn, start: Start, settings: Any
) -> None:
    settings.LOOPGUARD_AGENTS = {
        **settings.LOOPGUARD_AGENTS,
        "test_receipts": f"{__name__}.ReceiptDesk",
    }
    unknown_operation(start("test_receipts", {}), "receipts/17")

    found = body(signed_in("reconciler").post("/operations/receipts/17/lookup"))

    assert "It happened." in found
    assert "R-17" in found
    assert "hunter2" not in found
    assert "hunter2" not in json.dumps(AuditEntry.objects.get(action="lookup").after)
    assert "hunter2" not in body(signed_in("viewer").get("/audit/"))


def test_a_secret_inside_a_resolve_result_is_redacted_before_it_is_stored(
    signed_in: SignIn, world: World
) -> None:
    form = resolve_form(world.op, "committed", result='{"notice": 1, "api_key": "hunter2"}')

    signed_in("reconciler").post(f"/operations/{KEY}/resolve", form)

    world.reload()
    assert world.op.result["data"] == {"notice": 1, "api_key": "[redacted]"}
    assert not _shows_secret(body(signed_in("viewer").get(f"/tasks/{world.uncertain.id}/")))
