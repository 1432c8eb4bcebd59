"""Charts for the dashboard, drawn on the server as SVG markup.

Server-rendered SVG rather than a charting library: the console's CSP allows no inline
script or style, a library would need a script file, a JSON endpoint and a second code path
to test, and the data is a few dozen numbers the page already has. SVG attributes
(``x``, ``width``, ``height``) are markup, not inline style, so the CSP holds; colours come
from classes styled in ``console.css`` with the theme's custom properties.

Geometry is in percent across and in pixels down, with no ``viewBox``: a chart takes the
width of its card (390 px phones included) and its text keeps the page's font size instead
of shrinking with the drawing. Every piece of text is escaped (once, by ``_e``, as it goes
into the markup: a dashboard draws some 800 elements, and ``format_html`` per element cost
10 ms a page where this costs one or two); every bar has a ``<title>``
with its value (a tooltip on hover); every chart has an ``aria-label`` saying what it shows
and a table of its numbers under a "Numbers" disclosure, for screen readers and for anyone
who wants the exact figures.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

EMPTY = "Nothing in this window."
ROW_HEIGHT = 34  # px per row of a bar chart: its label line, then its bar
BAR_HEIGHT = 10
LABEL_CHARS = 34  # a longer label is cut short in the drawing (see _clip)
PLOT_HEIGHT = 120  # px of a column chart's plot area
LEGEND_HEIGHT = 22
AXIS_HEIGHT = 20
SLOT_GAP = 12  # percent of each column chart slot left empty, so neighbouring hours part

Format = Callable[[float], str]


def count(value: float) -> str:
    """A whole number with thousands separators: ``1,204``."""
    return f"{round(value):,}"


@dataclass(frozen=True)
class Series:
    """One row of values for a column chart, one value per slot (``None``: no data)."""

    name: str
    """What people read in the legend and the table: ``started``, ``p95``."""
    css: str
    """The class its bars are drawn with (``bar-started``): colours live in the CSS."""
    values: Sequence[float | None]


def bars(
    rows: Sequence[tuple[str, float]],
    *,
    title: str,
    fmt: Format = count,
    css: str = "bar",
    head: tuple[str, str] = ("", "value"),
    empty: str = EMPTY,
) -> SafeString:
    """A horizontal bar chart of ``(label, value)`` rows, in the order given: each row is
    its label and value on one line and a bar below, as long as the value is against the
    largest one."""
    if not rows or not any(value > 0 for _, value in rows):
        return _figure(title, f'<p class="empty">{_e(empty)}</p>')
    top = max(value for _, value in rows)
    parts: list[str] = []
    for i, (label, value) in enumerate(rows):
        y = i * ROW_HEIGHT
        text, shown = _e(label), _e(fmt(value))
        parts.append(
            f"<g><title>{text}: {shown}</title>"
            f'<text class="chart-label" x="0" y="{y + 14}">{_e(_clip(label))}</text>'
            f'<text class="chart-value" x="100%" y="{y + 14}" text-anchor="end">{shown}</text>'
            f'<rect class="chart-track" x="0" y="{y + 19}" width="100%" height="{BAR_HEIGHT}">'
            f'</rect><rect class="{_e(css)}" x="0" y="{y + 19}" width="{_share(value, top)}%" '
            f'height="{BAR_HEIGHT}"></rect></g>'
        )
    summary = "; ".join(f"{label} {fmt(value)}" for label, value in rows)
    svg = _svg(f"{title}: {summary}", len(rows) * ROW_HEIGHT, parts)
    table = _table(head, [[label, fmt(value)] for label, value in rows])
    return _figure(title, svg + table)


def columns(
    slots: Sequence[str],
    series: Sequence[Series],
    *,
    title: str,
    fmt: Format = count,
    overlay: bool = False,
    every: int = 6,
    head: str = "",
    empty: str = EMPTY,
) -> SafeString:
    """A column chart: one slot per label in ``slots`` (hours, left to right), in each slot
    one column per series side by side, or, with ``overlay``, drawn over one another in the
    order given, each half as wide as the one before and centred on it (a p95 column with
    its p50 inside it). Heights are proportional to the largest value of any series; every
    ``every``-th slot is labelled under the axis."""
    values = [v for s in series for v in s.values if v is not None]
    if not slots or not values or max(values) <= 0:
        return _figure(title, f'<p class="empty">{_e(empty)}</p>')
    top = max(values)
    slot = 100 / len(slots)
    lanes = 1 if overlay else len(series)
    lane = round(slot * (100 - SLOT_GAP) / 100 / lanes, 3)
    base = LEGEND_HEIGHT + PLOT_HEIGHT
    names = [_e(s.name) for s in series]
    classes = [_e(s.css) for s in series]
    parts: list[str] = [_legend(series, f"peak {fmt(top)}")]
    for i, label in enumerate(slots):
        text = _e(label)
        for j, value in enumerate(_column(series, i)):
            if value is None or value <= 0:
                continue  # nothing to draw; the table says "—" or 0
            height = round(PLOT_HEIGHT * value / top, 1)
            left, width = i * slot + slot * SLOT_GAP / 200, lane
            if overlay:
                # Narrower than the column under it, so both show even at the same height
                # (one step in an hour: its p50 is its p95): apart by shape, not only colour.
                width = lane / 2**j
                left += (lane - width) / 2
            else:
                left += j * lane
            parts.append(
                f'<rect class="{classes[j]}" x="{round(left, 3)}%" y="{round(base - height, 1)}" '
                f'width="{round(width, 3)}%" height="{height}">'
                f"<title>{text}, {names[j]}: {_e(fmt(value))}</title></rect>"
            )
    parts.append(f'<line class="chart-axis" x1="0" y1="{base}" x2="100%" y2="{base}"></line>')
    for i in range(0, len(slots), every):
        anchor, x = ("start", 0.0) if i == 0 else ("middle", round((i + 0.5) * slot, 3))
        parts.append(
            f'<text class="chart-value" x="{x}%" y="{base + 15}" text-anchor="{anchor}">'
            f"{_e(slots[i])}</text>"
        )
    peaks = "; ".join(
        f"{s.name} peak {fmt(max((v for v in s.values if v is not None), default=0))}"
        for s in series
    )
    svg = _svg(f"{title}, {slots[0]} to {slots[-1]}: {peaks}", base + AXIS_HEIGHT, parts)
    rows = [
        [label, *("—" if v is None else fmt(v) for v in _column(series, i))]
        for i, label in enumerate(slots)
    ]
    table = _table([head, *(s.name for s in series)], rows)
    return _figure(title, svg + table)


# -- the pieces --------------------------------------------------------------------------------


def _e(text: str) -> str:
    """``text`` escaped for markup, attribute values included; every piece of text that
    goes into a chart passes through here."""
    return str(escape(text))


def _clip(label: str) -> str:
    """A label short enough to leave room for its value on a phone (the bar's ``<title>``
    and the table keep it whole)."""
    return label if len(label) <= LABEL_CHARS else label[: LABEL_CHARS - 1] + "…"


def _share(value: float, top: float) -> float:
    """``value`` as a percentage of ``top``, never below a sliver for a non-zero value."""
    if value <= 0:
        return 0.0
    return round(max(0.5, 100 * value / top), 2)


def _column(series: Sequence[Series], i: int) -> list[float | None]:
    return [s.values[i] if i < len(s.values) else None for s in series]


def _legend(series: Sequence[Series], peak: str) -> str:
    parts = []
    x = 0
    for s in series:
        parts.append(
            f'<rect class="chart-key {_e(s.css)}" x="{x}" y="4" width="10" height="10"></rect>'
            f'<text class="chart-value" x="{x + 14}" y="13">{_e(s.name)}</text>'
        )
        x += 14 + 8 * len(s.name) + 16  # room for the name at the page's font size
    parts.append(f'<text class="chart-value" x="100%" y="13" text-anchor="end">{_e(peak)}</text>')
    return "".join(parts)


def _svg(label: str, height: int, parts: Sequence[str]) -> str:
    # role="img" with an aria-label: assistive technology reads one sentence for the
    # drawing (the table under it has the numbers) instead of every rectangle.
    return (
        f'<svg class="chart" width="100%" height="{height}" role="img" aria-label="{_e(label)}">'
        + "".join(parts)
        + "</svg>"
    )


def _table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    header = "".join(f"<th>{_e(h)}</th>" for h in head)
    body = "".join(
        "<tr>" + "".join(f"<td>{_e(cell)}</td>" for cell in row) + "</tr>" for row in rows
    )
    return (
        '<details class="chart-numbers"><summary>Numbers</summary><div class="scroll"><table>'
        f"<thead><tr>{header}</tr></thead><tbody>{body}</tbody></table></div></details>"
    )


def _figure(title: str, inner: str) -> SafeString:
    # The one place markup is declared safe: ``inner`` was built by this module from our
    # own tags and numbers, with every piece of text passed through _e.
    return mark_safe(  # noqa: S308
        f'<figure class="chart"><figcaption>{_e(title)}</figcaption>{inner}</figure>'
    )


__all__ = ["EMPTY", "Series", "bars", "columns", "count"]
