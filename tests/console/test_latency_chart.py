"""The dashboard's latency chart: its p50 column shows inside its p95 column, at any height,
in colours that part from each other and from the card in both themes (issue 22)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from console.web import charts
from console.web.charts import Series

CSS = (Path(__file__).parents[2] / "static" / "console" / "console.css").read_text()
HEX = r"#[0-9a-fA-F]{6}"


def _rects(html: str, css: str) -> list[dict[str, float]]:
    """Each rect drawn with class ``css``: its x, width and height (percent or px)."""
    return [
        {name: float(value) for name, value in re.findall(r'(x|width|height)="([\d.]+)%?"', r)}
        for r in re.findall(rf'<rect class="{css}"[^>]*>', html)
    ]


def test_a_p50_as_high_as_its_p95_still_leaves_the_p95_in_sight() -> None:
    # One step in an hour: its p50 is its p95.
    html = charts.columns(
        ["10:00"],
        [Series("p95", "bar-p95", [250]), Series("p50", "bar-p50", [250])],
        title="Latency",
        overlay=True,
    )

    (p95,), (p50,) = _rects(html, "bar-p95"), _rects(html, "bar-p50")
    assert p50["height"] == p95["height"]
    assert p95["x"] < p50["x"] and p50["x"] + p50["width"] < p95["x"] + p95["width"]


# -- colours: WCAG 2.x non-text contrast (1.4.11), 3:1 between adjacent colours -----------------


def _theme(dark: bool) -> dict[str, tuple[int, int, int]]:
    """The custom properties of the light (``:root``) or the dark theme, as RGB."""
    blocks = re.findall(r":root\s*\{([^}]*)\}", CSS)
    light, darker = blocks[0], blocks[1]  # the second :root is inside the dark media query
    found = re.findall(rf"--([\w-]+):\s*({HEX})", darker if dark else light)
    return {name: _rgb(value) for name, value in found}


def _rgb(value: str) -> tuple[int, int, int]:
    return (int(value[1:3], 16), int(value[3:5], 16), int(value[5:7], 16))


def _colour(expression: str, theme: dict[str, tuple[int, int, int]]) -> tuple[float, ...]:
    """``var(--x)`` or ``color-mix(in srgb, var(--a) N%, var(--b))`` in ``theme``."""
    mixed = re.fullmatch(
        r"color-mix\(in srgb, var\(--([\w-]+)\) (\d+)%, var\(--([\w-]+)\)\)", expression
    )
    if mixed:
        a, share, b = theme[mixed.group(1)], int(mixed.group(2)) / 100, theme[mixed.group(3)]
        return tuple(share * x + (1 - share) * y for x, y in zip(a, b, strict=True))
    plain = re.fullmatch(r"var\(--([\w-]+)\)", expression)
    assert plain, f"cannot read the colour {expression!r}"
    return tuple(float(x) for x in theme[plain.group(1)])


def _rule(selector: str, prop: str) -> str:
    found = re.search(rf"{re.escape(selector)}\s*\{{[^}}]*?\b{prop}:\s*([^;]+);", CSS)
    assert found, f"{selector} has no {prop}"
    return found.group(1).strip()


def _contrast(a: tuple[float, ...], b: tuple[float, ...]) -> float:
    def luminance(rgb: tuple[float, ...]) -> float:
        c = [v / 255 for v in rgb]
        c = [v / 12.92 if v <= 0.03928 else ((v + 0.055) / 1.055) ** 2.4 for v in c]
        return 0.2126 * c[0] + 0.7152 * c[1] + 0.0722 * c[2]

    high, low = sorted((luminance(a), luminance(b)), reverse=True)
    return (high + 0.05) / (low + 0.05)


@pytest.mark.parametrize("dark", [False, True], ids=["light", "dark"])
def test_p50_p95_and_the_card_part_at_3_to_1_in_each_theme(dark: bool) -> None:
    theme = _theme(dark)
    panel = _colour("var(--panel)", theme)
    p95_edge = _colour(_rule("svg.chart .bar-p95", "stroke"), theme)
    p95_fill = _colour(_rule("svg.chart .bar-p95", "fill"), theme)
    p50 = _colour(_rule("svg.chart .bar-p50", "fill"), theme)

    assert _contrast(p95_edge, panel) >= 3  # where the p95 column meets the card
    assert _contrast(p50, p95_fill) >= 3  # where the p50 column meets the p95 around it
    assert _contrast(p50, panel) >= 3  # a p50 as high as its p95 meets the card at its top
    assert p50 != p95_fill
