"""Money: the prices that turn a model call's tokens into spend, and how spend reads.

Spend is an integer count of the currency's minor unit (``LOOPGUARD_CURRENCY``,
``LOOPGUARD_CURRENCY_DECIMALS`` digits after the point: 2 for cents, 6 for millionths).
Prices come from ``LOOPGUARD_MODEL_PRICES``: ``model=input:output`` entries, each in
minor units per million tokens. No float ever holds an amount.
"""

from __future__ import annotations

from collections.abc import Mapping

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from guard import Price

__all__ = ["money", "price_of", "prices_from_environment"]


def prices_from_environment(
    value: str, *, variable: str = "LOOPGUARD_MODEL_PRICES"
) -> dict[str, tuple[int, int]]:
    """Read ``model=input:output`` entries, separated by commas, into model → (input,
    output) minor units per million tokens. Raises ``ImproperlyConfigured`` naming
    ``variable`` and the entry that is wrong."""
    prices: dict[str, tuple[int, int]] = {}
    for entry in value.split(","):
        if not entry.strip():
            continue
        model, equals, rest = (part.strip() for part in entry.partition("="))
        given, colon, taken = (part.strip() for part in rest.partition(":"))
        if not model or not equals or not colon or not (given.isdigit() and taken.isdigit()):
            raise ImproperlyConfigured(
                f"{variable}: {entry.strip()!r} is not model=input:output (whole minor units "
                "per million tokens, e.g. gpt-4o-mini=150000:600000)"
            )
        if model in prices:
            raise ImproperlyConfigured(f"{variable}: model {model!r} is given twice")
        prices[model] = (int(given), int(taken))
    return prices


def price_of(model: str) -> Price | None:
    """The configured price of ``model``, or ``None`` when it has none."""
    prices: Mapping[str, tuple[int, int]] = settings.LOOPGUARD_MODEL_PRICES
    found = prices.get(model) if model else None
    return None if found is None else Price(*found)


def money(amount: int | None) -> str:
    """``amount`` minor units as people read it: ``USD 0.0036`` (trailing zeros beyond two
    decimals dropped); ``—`` for none."""
    if amount is None:
        return "—"
    decimals: int = settings.LOOPGUARD_CURRENCY_DECIMALS
    currency: str = settings.LOOPGUARD_CURRENCY
    sign = "-" if amount < 0 else ""
    whole, part = divmod(abs(amount), 10**decimals)
    digits = f"{part:0{decimals}d}" if decimals else ""
    digits = digits.rstrip("0").ljust(min(2, decimals), "0")
    number = f"{whole:,}" + (f".{digits}" if digits else "")
    return f"{currency} {sign}{number}"
