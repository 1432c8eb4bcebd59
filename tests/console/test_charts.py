"""The dashboard's charts: what the SVG draws for known series, what the selector counts for
a known set of tasks and trace events, and what the dashboard page shows."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from console.models import Task, TaskState, TraceEvent
from console.records.roles import Role, assign
from console.selectors import trends
from console.web import charts
from console.web.charts import Series

from .views.support import ATTRIBUTE_BREAKER, XSS, XSS_ESCAPED, unknown_operation

HOUR = timedelta(hours=1)


def _numbers(attribute: str, html: str, css: str) -> list[float]:
    """The ``attribute`` of every rect drawn with class ``css``, in document order."""
    rects = re.findall(rf'<rect class="{css}"[^>]*>', html)
    return [float(re.search(rf'{attribute}="([\d.]+)%?"', r).group(1)) for r in rects]  # type: ignore[union-attr]


# -- drawing -----------------------------------------------------------------------------------


def test_bars_are_as_long_as_their_value_against_the_largest() -> None:
    html = charts.bars([("fatal", 8), ("no_progress", 4), ("deadline", 2)], title="Stops")

    assert _numbers("width", html, "bar") == [100.0, 50.0, 25.0]


def test_columns_are_as_tall_as_their_value_against_the_largest_of_any_series() -> None:
    html = charts.columns(
        ["10:00", "11:00", "12:00"],
        [
            Series("started", "bar-started", [4, 2, 0]),
            Series("finished", "bar-finished", [1, 8, 2]),
        ],
        title="Tasks",
    )

    # 8 is the peak: it fills the plot; an hour with nothing draws no column.
    assert _numbers("height", html, "bar-started") == [60.0, 30.0]
    assert _numbers("height", html, "bar-finished") == [15.0, 120.0, 30.0]
    assert "peak 8" in html


def test_overlaid_series_share_their_slot_so_p50_sits_inside_p95_half_as_wide() -> None:
    html = charts.columns(
        ["10:00"],
        [Series("p95", "bar-p95", [300]), Series("p50", "bar-p50", [100])],
        title="Latency",
        overlay=True,
    )

    (x95,), (w95,) = _numbers("x", html, "bar-p95"), _numbers("width", html, "bar-p95")
    (x50,), (w50,) = _numbers("x", html, "bar-p50"), _numbers("width", html, "bar-p50")
    assert w50 == w95 / 2
    assert x50 == x95 + w95 / 4  # centred in it
    assert _numbers("height", html, "bar-p95") == [120.0]
    assert _numbers("height", html, "bar-p50") == [40.0]


def test_every_bar_tells_its_value_in_a_title_and_the_chart_has_a_text_alternative() -> None:
    html = charts.bars([("fatal", 1204), ("deadline", 3)], title="Stops by reason")

    assert "<title>fatal: 1,204</title>" in html
    assert "<title>deadline: 3</title>" in html
    assert 'role="img" aria-label="Stops by reason: fatal 1,204; deadline 3"' in html
    assert "<td>fatal</td><td>1,204</td>" in html  # the table under "Numbers"


def test_a_label_with_markup_is_drawn_as_text_not_as_markup() -> None:
    bars = charts.bars([(XSS, 3)], title=XSS)
    columns = charts.columns([XSS], [Series(XSS, "bar", [2])], title=XSS)

    for html in (bars, columns):
        assert "<script>" not in html
        assert XSS_ESCAPED in html


def test_a_label_cannot_break_out_of_the_attribute_that_describes_the_chart() -> None:
    html = charts.bars([(ATTRIBUTE_BREAKER, 1)], title=ATTRIBUTE_BREAKER)

    assert ATTRIBUTE_BREAKER not in html
    assert 'aria-label="&quot; onmouseover=&quot;alert(2)' in html


def test_a_long_label_is_cut_short_in_the_drawing_but_whole_in_its_title_and_table() -> None:
    key = "incident-4242-first-notice-to-the-customer-and-the-desk"

    html = charts.bars([(key, 1)], title="Ages")

    assert f"<title>{key}: 1</title>" in html
    assert f"<td>{key}</td>" in html
    assert f">{key[:33]}…</text>" in html


def test_an_empty_window_says_so_instead_of_drawing_nothing() -> None:
    for html in (
        charts.bars([], title="Stops by reason, last 24 h"),
        charts.bars([("fatal", 0)], title="Stops by reason, last 24 h"),
        charts.columns(["10:00", "11:00"], [Series("p50", "bar", [None, None])], title="Latency"),
    ):
        assert '<p class="empty">Nothing in this window.</p>' in html
        assert "<svg" not in html


# -- counting ----------------------------------------------------------------------------------


def _task(
    state: str = TaskState.COMPLETED,
    reason: str = "goal_met",
    *,
    created: datetime,
    finished: datetime | None = None,
) -> Task:
    return Task.objects.create(
        agent="test_reader",
        input_fingerprint="f" * 64,
        state=state,
        reason=reason if state not in (TaskState.QUEUED, TaskState.RUNNING) else "",
        created_at=created,
        updated_at=finished or created,
        finished_at=finished,
    )


@pytest.mark.django_db
def test_stops_are_counted_by_reason_over_the_last_24_hours_and_the_last_7_days() -> None:
    now = timezone.now()
    for ago, state, reason in [
        (2, "FAILED", "fatal"),
        (3, "FAILED", "fatal"),
        (5, "PARTIAL", "no_progress"),
        (1, "NEEDS_HUMAN", "unknown_commit"),  # held for a person: a stop too
        (50, "FAILED", "fatal"),
        (70, "CANCELLED", "operator_stop"),
        (24 * 8, "FAILED", "fatal"),  # more than a week ago: in neither window
    ]:
        at = now - ago * HOUR
        _task(state, reason, created=at - HOUR, finished=at)
    _task(TaskState.RUNNING, created=now - HOUR)  # not stopped: not counted

    counted = trends(now=now)

    assert counted.stops_day == [("fatal", 2), ("no_progress", 1), ("unknown_commit", 1)]
    assert counted.stops_week == [
        ("fatal", 3),
        ("no_progress", 1),
        ("operator_stop", 1),
        ("unknown_commit", 1),
    ]


@pytest.mark.django_db
def test_tasks_started_and_finished_are_counted_per_hour_of_the_last_24() -> None:
    now = timezone.now()
    current = now.astimezone(UTC).replace(minute=0, second=0, microsecond=0)
    # Three started in the current hour, one finished in it; two started 5 hours ago and
    # finished 4 hours ago; one started 30 hours ago (before the chart) finished 20 ago.
    for _ in range(3):
        _task(TaskState.QUEUED, created=current)
    _task(created=current - 2 * HOUR, finished=min(now, current + timedelta(seconds=1)))
    for _ in range(2):
        _task(created=current - 5 * HOUR + timedelta(minutes=10), finished=current - 4 * HOUR)
    _task("FAILED", "fatal", created=now - 30 * HOUR, finished=current - 20 * HOUR)

    counted = trends(now=now)

    assert counted.hours[-1] == current
    assert counted.hours[0] == current - 23 * HOUR
    started = dict(zip(counted.hours, counted.started, strict=True))
    finished = dict(zip(counted.hours, counted.finished, strict=True))
    assert {h: n for h, n in started.items() if n} == {
        current: 3,
        current - 2 * HOUR: 1,
        current - 5 * HOUR: 2,
    }
    assert {h: n for h, n in finished.items() if n} == {
        current: 1,
        current - 4 * HOUR: 2,
        current - 20 * HOUR: 1,
    }


def _percentile(values: list[int], fraction: float) -> float:
    """percentile_cont's definition: linear between the two nearest ranks."""
    ordered = sorted(values)
    at = fraction * (len(ordered) - 1)
    low = int(at)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (at - low)


@pytest.mark.django_db
def test_step_latency_p50_and_p95_are_those_of_each_hours_steps() -> None:
    now = timezone.now()
    current = now.astimezone(UTC).replace(minute=0, second=0, microsecond=0)
    task = _task(TaskState.RUNNING, created=current - 3 * HOUR)
    earlier = [120, 40, 900, 35, 60, 75, 2400, 50, 45, 80]  # three hours ago
    latest = [10, 20, 30]  # this hour
    events = [(current - 3 * HOUR + timedelta(minutes=i), ms) for i, ms in enumerate(earlier)]
    events += [(current, ms) for ms in latest]
    TraceEvent.objects.bulk_create(
        TraceEvent(task=task, phase=1, seq=seq, at=at, kind="request", latency_ms=ms)
        for seq, (at, ms) in enumerate(events, start=1)
    )
    # A step without a latency (a stop, a note) is not a step that took no time.
    TraceEvent.objects.create(task=task, phase=1, seq=99, at=current, kind="note")

    counted = trends(now=now)

    p50 = dict(zip(counted.hours, counted.latency_p50, strict=True))
    p95 = dict(zip(counted.hours, counted.latency_p95, strict=True))
    assert (
        (p50[current - 3 * HOUR], p95[current - 3 * HOUR])
        == (
            round(_percentile(earlier, 0.5)),
            round(_percentile(earlier, 0.95)),
        )
        == (68, 1725)
    )
    assert (p50[current], p95[current]) == (20, 29)
    assert p50[current - HOUR] is None  # no step in that hour
    assert counted.latency_note == ""


# -- the page ----------------------------------------------------------------------------------


@pytest.fixture
def viewer(db: None) -> Client:
    user = User.objects.create_user("vera", password="pw-vera")
    assign(user, [Role.VIEWER])
    client = Client()
    client.force_login(user)
    return client


@pytest.mark.django_db
def test_the_dashboard_draws_the_trends_with_what_happened(viewer: Client) -> None:
    now = timezone.now()
    for _ in range(3):
        _task("PARTIAL", "deadline", created=now - 2 * HOUR, finished=now - HOUR)
    doubt = _task(TaskState.QUEUED, created=now - HOUR)
    unknown_operation(doubt, key=f"orders/7/{XSS}")

    html = viewer.get("/").content.decode()

    assert html.count('<figure class="chart">') == 5
    assert "Stops by reason, last 24 h" in html
    assert "<title>deadline: 3</title>" in html
    assert "Tasks started and finished per hour" in html
    assert "Step latency per hour" in html
    assert "Age of uncertain writes (oldest:" in html
    # The operation's key is drawn as text, never as markup.
    assert f"orders/7/{XSS_ESCAPED}" in html
    assert XSS not in html
    assert " style=" not in html  # the CSP forbids inline style


@pytest.mark.django_db
def test_an_empty_console_shows_each_chart_empty_rather_than_blank(viewer: Client) -> None:
    html = viewer.get("/").content.decode()

    assert html.count("Nothing in this window.") == 4
    assert "No write is in doubt." in html
    assert "<svg" not in html


@pytest.mark.django_db
def test_the_boards_htmx_poll_leaves_the_charts_out(viewer: Client) -> None:
    _task("FAILED", "fatal", created=timezone.now() - HOUR, finished=timezone.now())

    poll = viewer.get("/", headers={"HX-Request": "true", "HX-Target": "board"})

    assert poll.status_code == 200
    assert 'id="board"' in poll.content.decode()
    assert "Stops by reason" not in poll.content.decode()
