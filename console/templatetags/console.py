"""Small template filters: times with their zone, ages, durations, a task's gauges."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any

from django import template
from django.utils import timezone

from console.models import Task
from console.selectors import Gauge, gauges

register = template.Library()


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


@register.filter
def gauge_value(gauge: Any) -> str:
    """``used / limit`` with the right units."""
    if gauge.name == "elapsed_ms":
        limit = "∞" if gauge.limit is None else duration(gauge.limit)
        return f"{duration(gauge.used)} / {limit}"
    limit = "∞" if gauge.limit is None else f"{gauge.limit:,}"
    return f"{gauge.used:,} / {limit}"


@register.filter
def compact_json(value: Any) -> str:
    """One-line JSON text (escaped by the template like any other text)."""
    return json.dumps(value, ensure_ascii=False, default=str, separators=(", ", ": "))


@register.filter(name="json")
def as_json(value: Any) -> str:
    """Pretty JSON text (the template escapes it like any other text)."""
    return json.dumps(value, indent=2, ensure_ascii=False, default=str, sort_keys=False)
