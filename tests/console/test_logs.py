"""A log line cannot be forged: what someone sends stays on the line that quotes it."""

from __future__ import annotations

import io
import logging
import re
import sys
from collections.abc import Iterator

import pytest
from django.contrib.auth.models import User
from django.test import Client

from console.api.tokens import api_token_issue
from console.records.logs import LineFormatter, TaskFilter, escape
from console.records.roles import Role, assign
from console.services import task_start
from tests.console.api.helpers import bearer

pytestmark = pytest.mark.django_db

# Every record's own line starts with its time; anything else is a traceback's continuation.
RECORD = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} ")
FORGED = "2026-12-01 00:00:00,000 web[1] INFO task=- console.drivers.runner: FORGED"


@pytest.fixture
def log() -> Iterator[io.StringIO]:
    """What the console's configured log handler writes (settings.LOGGING), as text."""
    handlers = [
        h
        for h in logging.getLogger().handlers
        if isinstance(h, logging.StreamHandler) and isinstance(h.formatter, LineFormatter)
    ]
    assert handlers, "the root logger has no handler with the console's line format"
    stream = io.StringIO()
    previous = [h.setStream(stream) for h in handlers]
    try:
        yield stream
    finally:
        for handler, old in zip(handlers, previous, strict=True):
            handler.setStream(old)


def records(text: str) -> list[str]:
    return [line for line in text.splitlines() if RECORD.match(line)]


def test_a_request_path_with_a_line_break_is_logged_on_one_line(
    client: Client, log: io.StringIO
) -> None:
    # Django escapes the path in its own "Not Found" line too; what is checked here is the
    # whole line as written, time first, with nothing after it that passes for a record.
    response = client.get("/api/tasks/%0d%0a" + FORGED.replace(" ", "%20"))

    assert response.status_code == 404
    written = log.getvalue()
    quoting = [line for line in written.splitlines() if "FORGED" in line]
    assert len(quoting) == 1, written
    assert "\\r\\n2026-12-01" in quoting[0]
    assert records(written) == [line for line in written.splitlines() if line], written


def test_a_stop_reason_with_a_line_break_is_logged_on_one_line(log: io.StringIO) -> None:
    operator = User.objects.create_user("olga")
    assign(operator, [Role.OPERATOR])
    _, secret = api_token_issue(user=operator, name="tests")
    task = task_start(agent="test_reader", input={"pages": 1}, enqueue=lambda task_id: None)

    response = bearer(secret).post(
        f"/api/tasks/{task.id}/stop",
        data={"reason": f"wrong customer\n{FORGED}\u2028{FORGED}"},
        content_type="application/json",
    )

    assert response.status_code == 200
    written = log.getvalue()
    assert "wrong customer" in written  # the stop is logged, quoting the reason
    assert not any(line.startswith(FORGED) for line in written.splitlines()), written
    assert all(RECORD.match(line) for line in written.splitlines() if line), written


def test_a_traceback_keeps_its_lines_but_none_of_them_passes_for_a_record(
    log: io.StringIO,
) -> None:
    try:
        raise ValueError(f"bad path /api/x\r\n{FORGED}")
    except ValueError:
        logging.getLogger("console.api.views").exception("API %s %s failed", "GET", f"/a\n{FORGED}")

    lines = log.getvalue().splitlines()
    assert len(records(log.getvalue())) == 1, lines
    assert lines[0].endswith(f"API GET /a\\n{FORGED} failed")
    assert lines[1] == "  Traceback (most recent call last):"
    assert any("raise ValueError" in line for line in lines[2:])
    # The exception's own message keeps its line break (CR escaped), and the line after it
    # is indented like every line of a traceback: no record starts there.
    assert lines[-2:] == ["  ValueError: bad path /api/x\\r", f"  {FORGED}"]


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("a\rb", "a\\rb"),
        ("a\nb", "a\\nb"),
        ("a\tb", "a\\tb"),
        ("a\x1b[31mb", "a\\x1b[31mb"),
        ("a\x85b", "a\\x85b"),
        ("a\u2028b\u2029c", "a\\u2028b\\u2029c"),
        ("C:\\path\\ünïcode", "C:\\path\\ünïcode"),
    ],
)
def test_each_control_character_is_written_as_an_escape(raw: str, shown: str) -> None:
    assert escape(raw) == shown
    formatter = LineFormatter("%(message)s")
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "seen %s", (raw,), None)
    TaskFilter().filter(record)
    assert formatter.format(record) == f"seen {shown}"


def test_a_traceback_another_handler_formatted_first_is_still_indented() -> None:
    try:
        raise ValueError(f"bad\n{FORGED}")
    except ValueError:
        record = logging.getLogger("x").makeRecord(
            "x", logging.ERROR, __file__, 1, "failed", (), sys.exc_info()
        )
    logging.Formatter().format(record)  # leaves its own, unindented traceback on the record

    lines = LineFormatter("%(message)s").format(record).split("\n")

    assert lines[0] == "failed"
    assert all(line.startswith("  ") for line in lines[1:]), lines
    assert lines[-1] == f"  {FORGED}"
