"""Small template filters: times with their zone, ages, durations, a task's gauges, money."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django import template
from django.utils import timezone
from django.utils.html import escape, format_html
from django.utils.safestring import mark_safe

from console.models import AuditEntry, Task
from console.records.spend import money
from console.selectors import (
    ABSENT,
    Gauge,
    ReportBudget,
    audit_changes,
    gauges,
    report_budgets,
    summary_pending,
)
from guard.steps import DIMENSIONS

register = template.Library()

MONEY = frozenset(d.used for d in DIMENSIONS if d.limit == "spend")
"""The budgets counted in the currency's minor unit: they read as money, never as a count."""
MONEY_LABELS = frozenset(d.label for d in DIMENSIONS if d.used in MONEY)
"""The same, by the names a stop report's budget rows carry (:class:`ReportBudget`)."""


@register.filter
def stamp(value: datetime | None) -> str:
    """``2026-11-30 03:32:01 UTC``: a time always says which zone it is in."""
    if value is None:
        return "—"
    local = timezone.localtime(value)
    return f"{local:%Y-%m-%d %H:%M:%S} {local.tzname() or ''}".rstrip()


@register.filter
def age(value: datetime | timedelta | None) -> str:
    """How long ago (or how long): ``3 min``, ``2 h 5 min``, ``4 d``."""
    if value is None:
        return "—"
    delta = value if isinstance(value, timedelta) else timezone.now() - value
    seconds = max(0, int(delta.total_seconds()))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min"
    if seconds < 86400:
        return f"{seconds // 3600} h {seconds % 3600 // 60} min"
    return f"{seconds // 86400} d"


@register.filter
def duration(ms: Any) -> str:
    """Milliseconds as a readable duration."""
    if ms is None or ms == "":
        return "—"
    ms = int(ms)
    if ms < 1000:
        return f"{ms} ms"
    if ms < 60_000:
        return f"{ms / 1000:.1f} s"
    return f"{ms // 60_000} min {ms % 60_000 // 1000} s"


@register.filter(name="gauges")
def task_gauges(task: Task) -> list[Gauge]:
    """The task's budget gauges (:func:`console.selectors.gauges`): no query of its own."""
    return gauges(task)


@register.filter(name="grant_words")
def grant_words(grant: Any) -> str:
    """A resumption's budget grant in words: ``+5 model calls, +60000 time (ms)``; spend
    in the currency (``+USD 0.02 spend``)."""
    if not isinstance(grant, dict) or not grant:
        return ""
    labels = {d.limit: d.label for d in DIMENSIONS}
    money_limits = {d.limit for d in DIMENSIONS if d.used in MONEY}
    return ", ".join(
        f"+{money(amount) if name in money_limits else amount} {labels.get(name, name)}"
        for name, amount in grant.items()
    )


@register.filter(name="money")
def as_money(amount: Any) -> str:
    """Minor units of the currency as people read them (:func:`console.records.spend.money`)."""
    return money(None if amount is None or amount == "" else int(amount))


@register.filter(name="report_budgets")
def stop_report_budgets(report: Any) -> list[ReportBudget]:
    """A stop report's budgets, spent and left (:func:`console.selectors.report_budgets`)."""
    return report_budgets(report if isinstance(report, dict) else {})


@register.filter
def gauge_value(gauge: Any) -> str:
    """``used / limit`` with the right units: spend in the currency (``USD 0.0144 / USD
    0.02``), time as a duration, counts with thousands separators; ``∞`` for no limit."""
    if gauge.name == "elapsed_ms":
        limit = "∞" if gauge.limit is None else duration(gauge.limit)
        return f"{duration(gauge.used)} / {limit}"
    if gauge.name in MONEY:
        limit = "∞" if gauge.limit is None else money(gauge.limit)
        return f"{money(gauge.used)} / {limit}"
    limit = "∞" if gauge.limit is None else f"{gauge.limit:,}"
    return f"{gauge.used:,} / {limit}"


@register.filter
def budget_amount(budget: ReportBudget, which: str) -> str:
    """A stop report budget's ``used`` or ``remaining`` amount as its cell shows it: spend
    in the currency, every other budget as the bare count it always was; ``—`` for none."""
    amount = budget.used if which == "used" else budget.remaining
    if amount is None:
        return "—"
    return money(amount) if budget.label in MONEY_LABELS else str(amount)


@register.filter
def call_usage(event: Any) -> str:
    """A model call's tokens and cost for the trace: ``1,200 · USD 0.0036``; only what
    was reported (a call without a price has tokens alone), ``""`` for neither."""
    parts = []
    if event.tokens is not None:
        parts.append(f"{event.tokens:,}")
    if event.cost is not None:
        parts.append(money(event.cost))
    return " · ".join(parts)


@register.filter
def awaits_summary(detail: Any) -> bool:
    """Whether a stopped task's page should wait for its summary turn
    (:func:`console.selectors.summary_pending`, on the page's latest stop report)."""
    reports = getattr(detail, "reports", None)
    return summary_pending(detail.task, reports[0] if reports else None)


@dataclass(frozen=True)
class ChangeWords:
    """One changed field of an audit entry as the log shows it: ``state: RUNNING →
    CANCELLED``; ``before`` is ``None`` for a field the action added."""

    field: str
    before: str | None
    after: str


BUDGET_LABELS = {d.limit: d.label for d in DIMENSIONS}
MONEY_LIMITS = frozenset(d.limit for d in DIMENSIONS if d.used in MONEY)
WHOLE_LABELS = {"limits": "{} limit", "grant": "{} granted"}
"""Budgets nested in a resumption's entry, named as people say them (``spend limit``)."""


def _field_words(path: tuple[str, ...]) -> str:
    if len(path) == 2 and path[0] in WHOLE_LABELS:
        return WHOLE_LABELS[path[0]].format(BUDGET_LABELS.get(path[1], path[1]))
    return " ".join(path).replace("_", " ") or "value"


def _value_words(path: tuple[str, ...], value: Any) -> str:
    if value is ABSENT or value is None or value == "":
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        shown = money(value) if path and path[-1] in MONEY_LIMITS else f"{value:,}"
        return f"+{shown}" if path[:1] == ("grant",) and len(path) == 2 else shown
    if isinstance(value, list | tuple) and all(not isinstance(v, dict | list) for v in value):
        return ", ".join(str(v) for v in value) or "—"
    if isinstance(value, str):
        return value
    return compact_json(value)


@register.filter
def changes(entry: AuditEntry) -> list[ChangeWords]:
    """An audit entry's before → after as the fields it changed, in words: ``state:
    RUNNING → CANCELLED``, ``spend limit: USD 0.02 → USD 0.03`` (money as money, yes/no
    for flags), from :func:`console.selectors.audit_changes`."""
    return [
        ChangeWords(
            _field_words(c.path),
            None if c.before is ABSENT else _value_words(c.path, c.before),
            _value_words(c.path, c.after),
        )
        for c in audit_changes(entry.before, entry.after)
    ]


WHOLE_WORD = 32
"""The longest name :func:`whole_words` keeps on one line; a longer one (a URL) may break."""


@register.filter(is_safe=True)
def whole_words(value: Any) -> str:
    """``value`` escaped, each name in it that holds a hyphen (``desk-lead@example.com``,
    ``2026-12-03``) kept on one line: a line may still break between words."""
    text = "" if value is None else str(value)
    pieces = re.split(r"(\s+)", text)
    return mark_safe(  # noqa: S308 - every piece is escaped here
        "".join(
            format_html('<span class="nowrap">{}</span>', piece)
            if "-" in piece and len(piece) <= WHOLE_WORD
            else escape(piece)
            for piece in pieces
        )
    )


@register.filter
def compact_json(value: Any) -> str:
    """One-line JSON text (escaped by the template like any other text)."""
    return json.dumps(value, ensure_ascii=False, default=str, separators=(", ", ": "))


@register.filter(name="json")
def as_json(value: Any) -> str:
    """Pretty JSON text (the template escapes it like any other text)."""
    return json.dumps(value, indent=2, ensure_ascii=False, default=str, sort_keys=False)


# -- dashboard charts (drawn by console.web.charts from console.selectors.Trends) ------------------


def _ms(value: float) -> str:
    return duration(round(value))


def _hour_labels(hours: list[datetime]) -> list[str]:
    return [f"{timezone.localtime(hour):%H:%M}" for hour in hours]


@register.simple_tag
def stops_chart(rows: list[tuple[str, int]], window: str) -> str:
    """Tasks stopped in ``window`` (``last 24 h``) by stop reason, as a bar chart."""
    from console.web import charts

    return charts.bars(
        rows, title=f"Stops by reason, {window}", css="bar-stops", head=("reason", "tasks")
    )


@register.simple_tag
def activity_chart(trends: Any) -> str:
    """Tasks started and finished per hour over the last 24 hours, as a column chart."""
    series = {"started": trends.started, "finished": trends.finished}
    return _per_hour(trends, series, title="Tasks started and finished per hour")


@register.simple_tag
def latency_chart(trends: Any) -> str:
    """Step latency per hour, p95 with p50 drawn inside it; a note where it cannot be had."""
    from console.web import charts

    series = {"p95": trends.latency_p95, "p50": trends.latency_p50}
    title = "Step latency per hour (model calls and tool requests)"
    empty = trends.latency_note or charts.EMPTY
    return _per_hour(trends, series, title=title, fmt=_ms, overlay=True, empty=empty)


def _per_hour(trends: Any, series: dict[str, Any], *, title: str, **options: Any) -> str:
    """A column chart over the dashboard's last 24 hours: one column an hour of each series,
    drawn in its own ``bar-<name>`` class."""
    from console.web import charts

    return charts.columns(
        _hour_labels(trends.hours),
        [charts.Series(name, f"bar-{name}", values) for name, values in series.items()],
        title=title,
        head="hour",
        **options,
    )


@register.simple_tag
def uncertain_chart(operations: list[Any]) -> str:
    """How long each uncertain write has waited for a reconciler, oldest first."""
    from console.web import charts

    now = timezone.now()
    rows = [(op.key, max(1.0, (now - op.updated_at).total_seconds())) for op in operations]
    oldest = f" (oldest: {age(operations[0].updated_at)})" if operations else ""
    return charts.bars(
        rows,
        title=f"Age of uncertain writes{oldest}",
        fmt=lambda seconds: age(timedelta(seconds=seconds)),
        css="bar-uncertain",
        head=("operation", "uncertain for"),
        empty="No write is in doubt.",
    )
