"""Normalization of answer values before they are compared with ground truth.

Pure functions, no I/O; the document verifier (``service.verifiers.document``) uses them to
score ``answer.json`` fields. Every function raises ``NormalizationError`` (a ``ValueError``)
with a message a person can act on when a value cannot be read; it never guesses.

Rules (each one has a unit test with exact expected values):

Numbers (``parse_amount``), read as: ``prefix NUMBER suffix``, exactly one number.
  * Sign: a leading ``-``, ``+``, U+2212 MINUS SIGN, U+2012 FIGURE DASH, U+2013 EN DASH,
    U+FE63 or U+FF0D, or parentheses around the amount (``(123)``, ``$(1,234)``,
    ``(€1.2m)``: accounting negatives). The em dash is never a sign (tables use it for nil).
  * Separators, English convention first: with both ``.`` and ``,`` the one that comes last
    is the decimal mark (``1,234.5`` and ``1.234,5`` are both 1234.5). With only commas, one
    comma followed by exactly three digits is a thousands separator (``1,234`` = 1234), any
    other single comma is a decimal mark (``12,5`` = 12.5); several commas group
    thousands. With only dots, one dot is a decimal mark (``1.234`` = 1.234), several group
    thousands (``1.234.567``). Spaces, no-break and thin spaces and apostrophes (``1 234``,
    ``1'234.5``) always group thousands. Groups must be well formed: three digits after the
    first group (or the Indian 2-2-3 pattern, ``12,34,567``), else the value is refused.
  * Scale words after the number: ``k``/``thousand(s)`` = 1e3; ``m``/``M``/``mm``/``mn``/
    ``mln``/``mio``/``million(s)`` = 1e6; ``b``/``bn``/``bln``/``billion(s)`` = 1e9;
    ``tn``/``trillion(s)`` = 1e12 (``$1.2M`` = 1,200,000; ``in thousands`` is accepted).
    A number with no scale word is taken to be in the scale the field asks for
    (``to_scale``): answering 1234.5 for a field "in millions" means 1234.5 million.
  * Currency: a symbol (``$`` = USD, ``US$``, ``€``, ``£``, ``¥`` = JPY, ``CN¥``, ``C$``,
    ``A$``, ``HK$``, ``S$``, ``NZ$``, ``R$``, ``₹``, ``₩``, ``Fr.``...), an ISO 4217 code
    (``EUR``, any case) or an English name (``euros``, ``US dollars``, ``pounds sterling``,
    ``yen``, ``Swiss francs``...) before or after the number; several different currencies
    are refused. ``kr`` is refused (SEK, NOK, DKK and ISK all use it).
  * Percent: ``%``, ``percent``, ``per cent``, ``pct``, ``pp``/``percentage points`` mark
    a percentage in points; ``bp``/``bps``/``basis points`` are hundredths of a point.
  * A bare JSON number is used as it is (``True``/``False`` are not numbers); ``1.2e6``
    style exponents are accepted.
  * Range: a number (scale word applied) of magnitude 1e19 or more, a non-zero one below
    1e-18, one with more than 40 digits, or a non-finite one is refused (``OutOfRange``).

Percentages (``percent_points``): a value with a percent sign or word is in points
(``"12.5%"`` = 12.5). A bare number follows the field's ``bare`` rule: ``auto`` (default)
reads ``|x| < 1`` as a fraction (``0.125`` = 12.5 points) and anything else as points
(``12.5`` = 12.5); ``points`` always reads points, ``fraction`` always a fraction.
Tasks keep percent fields under ``auto`` away from true values below one point.

Dates (``parse_date``) to ISO ``YYYY-MM-DD``: ISO (``2024-03-15``, ``2024/03/15``,
``20240315``, a trailing time is ignored); day-month-name (``15 March 2024``,
``15-Mar-2024``, ``15th of March, 2024``, with or without a weekday);
month-name-day (``March 15, 2024``, ``Mar. 15th 2024``); numeric with dots is day first
(``15.03.2024``, the German convention); numeric with ``/`` or ``-`` is resolved by the
numbers (a first part above 12 is a day, a second part above 12 is a day) and otherwise by
the field's ``order`` (``DMY`` or ``MDY``), else refused as ambiguous. Two-digit years are
2000-2069 for 00-69 and 1970-1999 for 70-99. English month names and abbreviations only.

Currencies (``parse_currency``) to an ISO 4217 code, from a code, symbol or name.

Free text (``normalize_text``, ``anls``): NFKC, case-folded, whitespace runs collapsed to
one space, stripped. ANLS (Biten et al., "Scene Text Visual Question Answering", ICCV 2019):
``NL = levenshtein(a, g) / max(len(a), len(g))``; the score against one ground truth is
``1 - NL`` when ``NL < threshold`` (0.5) and 0 otherwise; against several accepted answers
it is the best of them.
"""

from __future__ import annotations

import datetime as dt
import math
import re
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Literal

BareRule = Literal["auto", "points", "fraction"]
DateOrder = Literal["DMY", "MDY"]

#: Powers of ten of the scales a field can ask for.
SCALES: dict[str, int] = {"units": 0, "thousands": 3, "millions": 6, "billions": 9}

MINUS_SIGNS = "-\u2212\u2012\u2013\ufe63\uff0d"
_GROUP_SPACES = " \u00a0\u2009\u202f\u2007'\u2019"

_SCALE_WORDS: dict[str, int] = {
    "k": 3,
    "thousand": 3,
    "thousands": 3,
    "m": 6,
    "mm": 6,
    "mn": 6,
    "mln": 6,
    "mio": 6,
    "million": 6,
    "millions": 6,
    "b": 9,
    "bn": 9,
    "bln": 9,
    "billion": 9,
    "billions": 9,
    "tn": 12,
    "trillion": 12,
    "trillions": 12,
}

#: ISO 4217 codes accepted as written (upper- or lower-case).
ISO_CODES: frozenset[str] = frozenset(
    re.findall(
        r"[A-Z]{3}",
        "USD EUR GBP JPY CHF CNY CAD AUD NZD HKD SGD SEK NOK DKK ISK INR KRW BRL MXN ZAR PLN "
        "CZK HUF TRY RUB ILS AED SAR QAR TWD THB MYR IDR PHP VND CLP COP PEN ARS EGP NGN KES "
        "MAD RON BGN UAH KZT PKR BDT LKR",
    )
)

# Symbols, longest first so that "US$" wins over "$".
_SYMBOLS: tuple[tuple[str, str], ...] = tuple(
    sorted(
        {
            "US$": "USD",
            "U.S.$": "USD",
            "$": "USD",
            "C$": "CAD",
            "CA$": "CAD",
            "A$": "AUD",
            "AU$": "AUD",
            "NZ$": "NZD",
            "HK$": "HKD",
            "S$": "SGD",
            "R$": "BRL",
            "MX$": "MXN",
            "€": "EUR",
            "£": "GBP",
            "¥": "JPY",
            "JP¥": "JPY",
            "CN¥": "CNY",
            "RMB": "CNY",
            "₹": "INR",
            "₩": "KRW",
            "₽": "RUB",
            "₺": "TRY",
            "₪": "ILS",
            "zł": "PLN",
            "SFr.": "CHF",
            "Fr.": "CHF",
        }.items(),
        key=lambda kv: -len(kv[0]),
    )
)

# English names (compared case-folded, whitespace collapsed), longest first.
_NAMES: tuple[tuple[str, str], ...] = tuple(
    sorted(
        {
            "us dollar": "USD",
            "us dollars": "USD",
            "u.s. dollar": "USD",
            "u.s. dollars": "USD",
            "united states dollar": "USD",
            "united states dollars": "USD",
            "dollar": "USD",
            "dollars": "USD",
            "euro": "EUR",
            "euros": "EUR",
            "pound sterling": "GBP",
            "pounds sterling": "GBP",
            "sterling": "GBP",
            "british pound": "GBP",
            "british pounds": "GBP",
            "pound": "GBP",
            "pounds": "GBP",
            "yen": "JPY",
            "japanese yen": "JPY",
            "swiss franc": "CHF",
            "swiss francs": "CHF",
            "franc": "CHF",
            "francs": "CHF",
            "yuan": "CNY",
            "renminbi": "CNY",
            "chinese yuan": "CNY",
            "canadian dollar": "CAD",
            "canadian dollars": "CAD",
            "australian dollar": "AUD",
            "australian dollars": "AUD",
            "hong kong dollar": "HKD",
            "hong kong dollars": "HKD",
            "singapore dollar": "SGD",
            "singapore dollars": "SGD",
            "swedish krona": "SEK",
            "swedish kronor": "SEK",
            "norwegian krone": "NOK",
            "norwegian kroner": "NOK",
            "danish krone": "DKK",
            "danish kroner": "DKK",
            "indian rupee": "INR",
            "indian rupees": "INR",
            "rupee": "INR",
            "rupees": "INR",
            "won": "KRW",
            "south korean won": "KRW",
        }.items(),
        key=lambda kv: -len(kv[0]),
    )
)

_PERCENT_WORDS: dict[str, Decimal] = {
    "%": Decimal(1),
    "percent": Decimal(1),
    "per cent": Decimal(1),
    "pct": Decimal(1),
    "pp": Decimal(1),
    "percentage point": Decimal(1),
    "percentage points": Decimal(1),
    "bp": Decimal("0.01"),
    "bps": Decimal("0.01"),
    "basis point": Decimal("0.01"),
    "basis points": Decimal("0.01"),
}

_CORE_RE = re.compile(r"\d(?:[\d,.\u00a0\u2009\u202f\u2007' \u2019]*\d)?|\.\d+")
_EXPONENT_RE = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)[eE][+-]?\d+")
_FILLERS = ("in", "of")
_IN_SCALE_RE = re.compile(r"(.*?\S)\s*\(\s*(in\s[^()]*?)\s*\)\.?", re.IGNORECASE)


class NormalizationError(ValueError):
    """A value could not be read under the rules of this module."""


class OutOfRange(NormalizationError):
    """A number outside what any answer needs: magnitude ``>= 10**(MAX_EXPONENT + 1)``, a
    non-zero magnitude below ``10**-MAX_EXPONENT``, or more than ``MAX_DIGITS`` digits
    (so no later step formats or scales a number of a billion digits)."""


#: Largest decimal exponent of a number read (``|x| < 1e19``; smallest non-zero ``1e-18``).
MAX_EXPONENT = 18
#: Most significant digits of a number read.
MAX_DIGITS = 40


def bounded(number: Decimal, original: object) -> Decimal:
    """``number`` itself when it is within range, else ``OutOfRange``."""
    if not number.is_finite():
        raise OutOfRange(f"{json_repr(original)} is not a finite number")
    if len(number.as_tuple().digits) > MAX_DIGITS:
        raise OutOfRange(f"{json_repr(original)} has more than {MAX_DIGITS} digits")
    if number and not -MAX_EXPONENT <= number.adjusted() <= MAX_EXPONENT:
        raise OutOfRange(f"{json_repr(original)} is out of range (|x| < 1e{MAX_EXPONENT + 1})")
    return number


@dataclass(frozen=True, kw_only=True)
class Amount:
    """A number as written: ``number`` with its sign, before any scale word is applied.

    ``scale_exp`` is the power of ten of a stated scale word (3 for ``k``), None when none
    was written; ``currency`` an ISO 4217 code or None; ``percent`` whether a percent sign or
    word was present (``number`` is then in percentage points, basis points converted).
    """

    number: Decimal
    scale_exp: int | None = None
    currency: str | None = None
    percent: bool = False

    @property
    def absolute(self) -> Decimal:
        """The number with its scale word applied (``$1.2M`` -> 1200000)."""
        return self.number.scaleb(self.scale_exp or 0)


# --------------------------------------------------------------------------- numbers


def parse_number_text(core: str) -> Decimal:
    """The value of a bare digit string with separators (``"1,234.5"`` -> 1234.5).

    See the module docstring for the separator rules. Raises ``NormalizationError``.
    """
    text = core.strip()
    if not text:
        raise NormalizationError("no digits")
    spaced = any(c in _GROUP_SPACES for c in text)
    dots, commas = text.count("."), text.count(",")
    decimal_mark: str | None = None
    if dots and commas:
        decimal_mark = "." if text.rfind(".") > text.rfind(",") else ","
        if text.count(decimal_mark) > 1:
            raise NormalizationError(f"{core!r}: more than one decimal mark")
    elif commas == 1:
        after = text.split(",")[1]
        if len(after) != 3 or spaced:
            decimal_mark = ","
    elif dots == 1:
        decimal_mark = "."
    elif dots > 1 and commas == 0 and spaced:
        raise NormalizationError(f"{core!r}: mixed thousands separators")
    if decimal_mark:
        integer, _, fraction = text.rpartition(decimal_mark)
    else:
        integer, fraction = text, ""
    group_chars = {c for c in integer if not c.isdigit()}
    if len(group_chars) > 1 and not group_chars <= set(_GROUP_SPACES):
        raise NormalizationError(f"{core!r}: mixed thousands separators")
    if fraction and not fraction.isdigit():
        raise NormalizationError(f"{core!r}: the decimals after {decimal_mark!r} are not digits")
    groups = re.split(r"[^\d]", integer) if integer else [""]
    if integer and not _well_grouped(groups):
        raise NormalizationError(f"{core!r}: digit groups are not groups of three")
    digits = "".join(groups) or "0"
    try:
        return Decimal(f"{digits}.{fraction}" if fraction else digits)
    except InvalidOperation:  # pragma: no cover - digits only by construction
        raise NormalizationError(f"{core!r}: not a number") from None


def _well_grouped(groups: list[str]) -> bool:
    if len(groups) == 1:
        return groups[0].isdigit()
    first, rest = groups[0], groups[1:]
    if not (1 <= len(first) <= 3) or not all(g.isdigit() for g in groups):
        return False
    if all(len(g) == 3 for g in rest):
        return True
    # Indian grouping: 12,34,56,789
    return len(first) <= 2 and all(len(g) == 2 for g in rest[:-1]) and len(rest[-1]) == 3


def parse_amount(value: object) -> Amount:
    """Read a number with optional sign, currency, scale word and percent (module rules).

    ``value`` is a JSON value: an int or float (used as is) or a string. Raises
    ``NormalizationError`` for anything else, several numbers, or unknown words.
    """
    if isinstance(value, bool) or value is None:
        raise NormalizationError(f"expected a number, got {json_repr(value)}")
    if isinstance(value, int):
        if value.bit_length() > 4 * MAX_DIGITS:
            raise OutOfRange(f"an integer of {value.bit_length()} bits is out of range")
        return Amount(number=bounded(Decimal(value), value))
    if isinstance(value, float):
        if not math.isfinite(value):
            raise OutOfRange(f"{value} is not a finite number")
        return Amount(number=bounded(Decimal(repr(value)), value))
    if not isinstance(value, str):
        raise NormalizationError(f"expected a number or a string, got {json_repr(value)}")
    text = " ".join(value.split())
    if _EXPONENT_RE.fullmatch(text):
        return Amount(number=bounded(Decimal(text), value))
    if m := _IN_SCALE_RE.fullmatch(text):  # "1,234 (in thousands of euros)"
        text = f"{m.group(1)} {m.group(2)}"
    cores = list(_CORE_RE.finditer(text))
    if not cores:
        raise NormalizationError(f"{value!r}: no number found")
    if len(cores) > 1:
        raise NormalizationError(f"{value!r}: more than one number")
    core = cores[0]
    number = bounded(parse_number_text(core.group()), value)
    prefix, suffix = text[: core.start()], text[core.end() :]
    negative = False
    currencies: set[str] = set()
    scale: int | None = None
    percent: Decimal | None = None
    opened = closed = 0

    rest = prefix.strip()
    while rest:
        if rest[0] in MINUS_SIGNS:
            if negative:
                raise NormalizationError(f"{value!r}: more than one sign")
            negative, rest = True, rest[1:].lstrip()
            continue
        if rest[0] in "+(":
            opened += rest[0] == "("
            rest = rest[1:].lstrip()
            continue
        found = _take_currency(rest)
        if found is None:
            raise NormalizationError(f"{value!r}: cannot read {rest!r} before the number")
        currencies.add(found[0])
        rest = found[1]

    rest = suffix.strip()
    while rest and rest != ".":
        if rest[0] == ")":
            closed, rest = closed + 1, rest[1:].lstrip()
            continue
        word = _take_word(rest, _PERCENT_WORDS)
        if word is not None:
            if percent is not None:
                raise NormalizationError(f"{value!r}: more than one percent mark")
            percent, rest = _PERCENT_WORDS[word[0].casefold()], word[1]
            continue
        scaled = _take_scale(rest)
        if scaled is not None:
            if scale is not None:
                raise NormalizationError(f"{value!r}: more than one scale word")
            scale, rest = scaled
            continue
        found = _take_currency(rest) or _take_word(rest, dict.fromkeys(_FILLERS))
        if found is None:
            raise NormalizationError(f"{value!r}: cannot read {rest!r} after the number")
        if found[0] not in _FILLERS:
            currencies.add(found[0])
        rest = found[1]

    if opened != closed or opened > 1:
        raise NormalizationError(f"{value!r}: unbalanced parentheses")
    negative = negative or opened == 1
    if len(currencies) > 1:
        raise NormalizationError(f"{value!r}: several currencies {sorted(currencies)}")
    if percent is not None and (scale is not None or currencies):
        raise NormalizationError(f"{value!r}: a percentage cannot carry a scale or currency")
    if negative:
        number = -number
    if percent is not None:
        number = number * percent
    if scale is not None:
        bounded(number.scaleb(scale), value)
    return Amount(
        number=number,
        scale_exp=scale,
        currency=next(iter(currencies), None),
        percent=percent is not None,
    )


def to_scale(amount: Amount, *, scale: str) -> Decimal:
    """``amount`` expressed in the field's ``scale`` (``units``, ``thousands``, ...).

    A number without a scale word is taken to be in ``scale`` already.
    """
    if scale not in SCALES:
        raise NormalizationError(f"unknown scale {scale!r}; known: {sorted(SCALES)}")
    if amount.scale_exp is None:
        return amount.number
    return amount.absolute.scaleb(-SCALES[scale])


def percent_points(value: object, *, bare: BareRule = "auto") -> Decimal:
    """A percentage in points (``"12.5%"`` -> 12.5, ``0.125`` -> 12.5 under ``auto``)."""
    amount = parse_amount(value)
    if amount.currency is not None or amount.scale_exp is not None:
        raise NormalizationError(f"{value!r}: a percentage cannot carry a scale or currency")
    if amount.percent:
        return amount.number
    if bare == "fraction" or (bare == "auto" and abs(amount.number) < 1):
        return amount.number * 100
    return amount.number


# --------------------------------------------------------------------------- currencies


def _take_currency(text: str) -> tuple[str, str] | None:
    """(ISO code, the rest) when ``text`` starts with a currency code, symbol or name."""
    for symbol, code in _SYMBOLS:
        if text.startswith(symbol):
            return code, text[len(symbol) :].lstrip()
    match = re.match(r"([A-Za-z]{3})(?![A-Za-z])", text)
    if match and match.group(1).upper() in ISO_CODES:
        return match.group(1).upper(), text[3:].lstrip()
    word = _take_word(text, dict(_NAMES))
    if word is not None:
        return dict(_NAMES)[word[0].casefold()], word[1]
    return None


def _take_word(text: str, words: dict[str, object]) -> tuple[str, str] | None:
    """(the matched word, the rest) for the longest of ``words`` that starts ``text``."""
    folded = text.casefold()
    for word in sorted(words, key=len, reverse=True):
        if folded.startswith(word):
            end = len(word)
            if word[-1].isalnum() and end < len(text) and text[end].isalnum():
                continue
            return text[:end], text[end:].lstrip()
    return None


def _take_scale(text: str) -> tuple[int, str] | None:
    match = re.match(r"([A-Za-z]+)\.?", text)
    if not match:
        return None
    word = match.group(1)
    exp = _SCALE_WORDS.get(word.casefold())
    if exp is None:
        return None
    return exp, text[match.end() :].lstrip()


def parse_currency(value: object) -> str:
    """An ISO 4217 code from a code, symbol or English name (``"€"`` -> ``"EUR"``)."""
    if not isinstance(value, str) or not value.strip():
        raise NormalizationError(f"expected a currency code, symbol or name, got {value!r}")
    text = " ".join(value.split())
    found = _take_currency(text)
    if found is None or found[1].strip():
        raise NormalizationError(f"{value!r}: not a known currency code, symbol or name")
    return found[0]


# --------------------------------------------------------------------------- dates

_MONTHS: dict[str, int] = {}
_MONTH_NAMES = (
    "january",
    "february",
    "march",
    "april",
    "may",
    "june",
    "july",
    "august",
    "september",
    "october",
    "november",
    "december",
)
for _i, _name in enumerate(_MONTH_NAMES, start=1):
    _MONTHS[_name] = _i
    _MONTHS[_name[:3]] = _i
_MONTHS["sept"] = 9
_WEEKDAY_RE = re.compile(
    r"^(?:mon|tue|tues|wed|thu|thur|thurs|fri|sat|sun)(?:day|nesday|sday|rsday|urday)?\.?,?\s+",
    re.IGNORECASE,
)
_ISO_RE = re.compile(r"(\d{4})([-/.])(\d{1,2})\2(\d{1,2})(?:[T ][\d:.]+(?:Z|[+-]\d\d:?\d\d)?)?")
_COMPACT_RE = re.compile(r"(\d{4})(\d{2})(\d{2})")
_NUMERIC_RE = re.compile(r"(\d{1,2})([-/.])(\d{1,2})\2(\d{2}|\d{4})")
_DAY_MONTH_RE = re.compile(
    r"(\d{1,2})(?:st|nd|rd|th)?(?:\s+of)?[\s\-/.]+([A-Za-z]+)\.?,?[\s\-/.]+(\d{2}|\d{4})",
    re.IGNORECASE,
)
_MONTH_DAY_RE = re.compile(
    r"([A-Za-z]+)\.?[\s\-/.]+(\d{1,2})(?:st|nd|rd|th)?,?\s+(\d{4})", re.IGNORECASE
)


def _year(text: str) -> int:
    year = int(text)
    if len(text) == 2:
        year += 2000 if year < 70 else 1900
    return year


def _month(name: str, original: object) -> int:
    month = _MONTHS.get(name.casefold())
    if month is None:
        raise NormalizationError(f"{original!r}: {name!r} is not an English month name")
    return month


def _make(year: int, month: int, day: int, original: object) -> dt.date:
    try:
        return dt.date(year, month, day)
    except ValueError as e:
        raise NormalizationError(f"{original!r}: not a calendar date ({e})") from None


def parse_date(value: object, *, order: DateOrder | None = None) -> dt.date:
    """A calendar date from one of the formats in the module docstring.

    ``order`` resolves numeric dates like ``03/04/2024`` whose parts could both be months.
    """
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str):
        raise NormalizationError(f"expected a date string, got {json_repr(value)}")
    text = " ".join(value.strip().split())
    text = _WEEKDAY_RE.sub("", text)
    if m := _ISO_RE.fullmatch(text):
        return _make(int(m.group(1)), int(m.group(3)), int(m.group(4)), value)
    if m := _COMPACT_RE.fullmatch(text):
        return _make(int(m.group(1)), int(m.group(2)), int(m.group(3)), value)
    if m := _NUMERIC_RE.fullmatch(text):
        a, sep, b, year = int(m.group(1)), m.group(2), int(m.group(3)), _year(m.group(4))
        if sep == "." or a > 12 or a == b:
            day, month = a, b
        elif b > 12:
            day, month = b, a
        elif order == "DMY":
            day, month = a, b
        elif order == "MDY":
            day, month = b, a
        else:
            raise NormalizationError(
                f"{value!r}: ambiguous (day/month or month/day); write it as YYYY-MM-DD"
            )
        return _make(year, month, day, value)
    if m := _DAY_MONTH_RE.fullmatch(text):
        return _make(_year(m.group(3)), _month(m.group(2), value), int(m.group(1)), value)
    if m := _MONTH_DAY_RE.fullmatch(text):
        return _make(int(m.group(3)), _month(m.group(1), value), int(m.group(2)), value)
    raise NormalizationError(f"{value!r}: not a date in a known format (use YYYY-MM-DD)")


# --------------------------------------------------------------------------- text


def normalize_text(value: str) -> str:
    """NFKC, case-folded, whitespace collapsed, stripped (``" ACME  Corp "`` -> ``"acme corp"``)."""
    return " ".join(unicodedata.normalize("NFKC", value).casefold().split())


def levenshtein(a: str, b: str) -> int:
    """Edit distance (insertions, deletions, substitutions, each costing 1)."""
    if len(a) < len(b):
        a, b = b, a
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, start=1):
        current = [i]
        for j, cb in enumerate(b, start=1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ca != cb)))
        previous = current
    return previous[-1]


def anls(answer: str, truths: Iterable[str], *, threshold: float = 0.5) -> float:
    """Average Normalized Levenshtein Similarity of one answer against accepted answers.

    Both sides go through ``normalize_text``. Returns the best score over ``truths``, each
    ``1 - NL`` when ``NL < threshold`` else 0 (Biten et al. 2019, threshold 0.5).
    """
    a = normalize_text(answer)
    best = 0.0
    for truth in truths:
        g = normalize_text(truth)
        longest = max(len(a), len(g))
        if longest and abs(len(a) - len(g)) / longest >= threshold:
            continue  # the distance is at least the length gap: past the threshold already
        nl = levenshtein(a, g) / longest if longest else 0.0
        best = max(best, 1.0 - nl if nl < threshold else 0.0)
    return best


def json_repr(value: object) -> str:
    """A short JSON-ish rendering of a value for error messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
