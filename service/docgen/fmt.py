"""How the corpus prints numbers and dates (pure functions; the ground truth never goes
through them, it is kept as ``Decimal`` and ``date`` values).

Conventions: thousands separators are commas (``1,284,372``); negatives are printed the
way financial statements do, in parentheses (``(12,345)``), or with U+2212 MINUS SIGN in
running text and performance tables (``−4.2%``); a nil amount is an em dash.
"""

from __future__ import annotations

import datetime as dt
from decimal import ROUND_HALF_UP, Decimal

MINUS = "\u2212"
NIL = "\u2014"


def q(value: Decimal | int | str, decimals: int) -> Decimal:
    """``value`` rounded half-up to ``decimals`` places (``q("2.345", 2)`` -> 2.35)."""
    return Decimal(value).quantize(Decimal(1).scaleb(-decimals), rounding=ROUND_HALF_UP)


def num(
    value: Decimal | int,
    decimals: int = 0,
    *,
    negative: str = "parens",
    nil: bool = False,
    sep: str = ",",
) -> str:
    """``value`` with thousands separators and ``decimals`` places.

    ``negative``: ``parens`` -> ``(1,234)``, ``minus`` -> ``−1,234`` (U+2212), ``hyphen``
    -> ``-1,234``. ``nil``: print zero as an em dash.
    """
    rounded = q(value, decimals)
    if nil and rounded == 0:
        return NIL
    text = f"{abs(rounded):,.{decimals}f}"
    if sep != ",":
        text = text.replace(",", sep)
    if rounded < 0:
        if negative == "parens":
            return f"({text})"
        return (MINUS if negative == "minus" else "-") + text
    return text


def pct(value: Decimal | int, decimals: int = 1, *, plus: bool = False) -> str:
    """A percentage in points: ``12.5%``, ``−4.2%`` (``plus``: ``+3.1%``)."""
    rounded = q(value, decimals)
    text = f"{abs(rounded):.{decimals}f}%"
    if rounded < 0:
        return MINUS + text
    return ("+" + text) if plus and rounded > 0 else text


def date_long(d: dt.date) -> str:
    """``31 December 2023``."""
    return f"{d.day} {d:%B %Y}"


def date_us(d: dt.date) -> str:
    """``December 31, 2023``."""
    return f"{d:%B} {d.day}, {d.year}"


def date_abbr_us(d: dt.date) -> str:
    """``Nov. 15, 2024`` (``May`` has no dot)."""
    month = d.strftime("%b")
    month = month if month == "May" else month + "."
    return f"{month} {d.day}, {d.year}"


def date_dmy_dots(d: dt.date) -> str:
    """``02.12.2024`` (day first, the German convention)."""
    return f"{d:%d.%m.%Y}"


def date_mdy_slash(d: dt.date) -> str:
    """``11/14/2024`` (month first, the US convention)."""
    return f"{d:%m/%d/%Y}"


def date_dd_mon_yyyy(d: dt.date) -> str:
    """``03-Feb-2025``."""
    return f"{d:%d-%b-%Y}"


def date_weekday(d: dt.date) -> str:
    """``Thursday, 12 June 2025``."""
    return f"{d:%A}, {d.day} {d:%B %Y}"
