"""Every normalization rule of ``service.verifiers.normalize``, with exact expected values."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest

from service.verifiers.normalize import (
    Amount,
    NormalizationError,
    anls,
    levenshtein,
    normalize_text,
    parse_amount,
    parse_currency,
    parse_date,
    parse_number_text,
    percent_points,
    to_scale,
)


def amount(number: str, scale: int | None = None, currency: str | None = None) -> Amount:
    return Amount(number=Decimal(number), scale_exp=scale, currency=currency)


# --------------------------------------------------------------------------- separators


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1234", "1234"),
        ("1,234", "1234"),  # one comma + three digits: thousands
        ("1,234.5", "1234.5"),  # both: the last one is the decimal mark
        ("1.234,5", "1234.5"),
        ("1,234,567.89", "1234567.89"),
        ("1.234.567,89", "1234567.89"),
        ("12,5", "12.5"),  # one comma, not three digits after: decimal
        ("1,23", "1.23"),
        ("1,2345", "1.2345"),
        ("1.234", "1.234"),  # one dot: always decimal
        ("1.234.567", "1234567"),  # several dots: thousands
        ("1,234,567", "1234567"),
        ("1 234 567", "1234567"),  # spaces group thousands
        ("1\u00a0234,5", "1234.5"),  # no-break space + decimal comma
        ("1\u2009234", "1234"),  # thin space
        ("1\u202f234", "1234"),  # narrow no-break space
        ("1'234.5", "1234.5"),  # Swiss apostrophe
        ("1 234,567", "1234.567"),  # spaces group, so the comma is decimal
        ("12,34,567", "1234567"),  # Indian 2-2-3 grouping
        ("0.5", "0.5"),
        (".5", "0.5"),
    ],
)
def test_separators(text: str, value: str) -> None:
    assert parse_amount(text).number == Decimal(value)


@pytest.mark.parametrize(
    "text",
    ["1,2,3", "12 34", "1.234.5", "1,234.5.6", "1..2", "1,234 567", "1.234 567"],
)
def test_malformed_grouping_is_refused(text: str) -> None:
    with pytest.raises(NormalizationError):
        parse_amount(text)


def test_parse_number_text_needs_digits() -> None:
    with pytest.raises(NormalizationError, match="no digits"):
        parse_number_text("  ")


# --------------------------------------------------------------------------- sign


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("-123", "-123"),
        ("+123", "123"),
        ("\u2212123", "-123"),  # U+2212 MINUS SIGN
        ("\u2013123", "-123"),  # en dash
        ("\u2012123", "-123"),  # figure dash
        ("\ufe63123", "-123"),
        ("\uff0d123", "-123"),
        ("(123)", "-123"),  # accounting negative
        ("(1,234.5)", "-1234.5"),
        ("( 1,234 )", "-1234"),
    ],
)
def test_signs(text: str, value: str) -> None:
    assert parse_amount(text).number == Decimal(value)


@pytest.mark.parametrize("text", ["\u2014123", "--123", "((123))", "(123", "123)"])
def test_bad_signs_are_refused(text: str) -> None:
    with pytest.raises(NormalizationError):
        parse_amount(text)


# --------------------------------------------------------------------------- scale


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("$1.2M", amount("1.2", 6, "USD")),
        ("1.2m", amount("1.2", 6)),
        ("1.2 mm", amount("1.2", 6)),
        ("1.2mn", amount("1.2", 6)),
        ("1.2 mln", amount("1.2", 6)),
        ("1.2 Mio.", amount("1.2", 6)),
        ("1.2 million", amount("1.2", 6)),
        ("3 millions", amount("3", 6)),
        ("450k", amount("450", 3)),
        ("450 K", amount("450", 3)),
        ("450 thousand", amount("450", 3)),
        ("1,234 (in thousands)", amount("1234", 3)),
        ("1,234 in thousands of euros", amount("1234", 3, "EUR")),
        ("€1.2bn", amount("1.2", 9, "EUR")),
        ("1.2 B", amount("1.2", 9)),
        ("1.2 bln", amount("1.2", 9)),
        ("1.2 billion", amount("1.2", 9)),
        ("2 tn", amount("2", 12)),
        ("2 trillion", amount("2", 12)),
        ("(€1.2m)", amount("-1.2", 6, "EUR")),
    ],
)
def test_scale_words(text: str, expected: Amount) -> None:
    assert parse_amount(text) == expected


def test_absolute_and_to_scale() -> None:
    a = parse_amount("$1.2M")
    assert a.absolute == Decimal("1200000")
    assert to_scale(a, scale="thousands") == Decimal("1200")
    assert to_scale(a, scale="millions") == Decimal("1.2")
    assert to_scale(a, scale="units") == Decimal("1200000")
    assert to_scale(parse_amount("1.2345 billion"), scale="millions") == Decimal("1234.5")
    # no scale word: already in the scale the field asks for
    assert to_scale(parse_amount("1234.5"), scale="millions") == Decimal("1234.5")
    assert to_scale(parse_amount("190,151,000"), scale="thousands") == Decimal("190151000")
    with pytest.raises(NormalizationError, match="unknown scale"):
        to_scale(a, scale="lakhs")


def test_two_scale_words_are_refused() -> None:
    with pytest.raises(NormalizationError, match="more than one scale word"):
        parse_amount("1.2 thousand million")


# --------------------------------------------------------------------------- currency


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ("$5", "USD"),
        ("US$5", "USD"),
        ("U.S.$5", "USD"),
        ("C$5", "CAD"),
        ("CA$5", "CAD"),
        ("A$5", "AUD"),
        ("NZ$5", "NZD"),
        ("HK$5", "HKD"),
        ("S$5", "SGD"),
        ("R$5", "BRL"),
        ("€5", "EUR"),
        ("5 €", "EUR"),
        ("£5", "GBP"),
        ("¥5", "JPY"),
        ("CN¥5", "CNY"),
        ("RMB 5", "CNY"),
        ("₹5", "INR"),
        ("₩5", "KRW"),
        ("Fr. 5", "CHF"),
        ("CHF 5", "CHF"),
        ("5 CHF", "CHF"),
        ("eur 5", "EUR"),
        ("5 euros", "EUR"),
        ("5 US dollars", "USD"),
        ("5 pounds sterling", "GBP"),
        ("5 yen", "JPY"),
        ("5 Swiss francs", "CHF"),
        ("EUR 1,234.5 thousand", "EUR"),
    ],
)
def test_currency_in_amounts(text: str, code: str) -> None:
    assert parse_amount(text).currency == code
    assert parse_amount(text).number in (Decimal(5), Decimal("1234.5"))


@pytest.mark.parametrize("text", ["$1.2 EUR", "€5 £", "kr 100", "100 kr"])
def test_ambiguous_or_conflicting_currency_is_refused(text: str) -> None:
    with pytest.raises(NormalizationError):
        parse_amount(text)


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ("EUR", "EUR"),
        ("eur", "EUR"),
        ("€", "EUR"),
        ("euro", "EUR"),
        ("Euros", "EUR"),
        ("$", "USD"),
        ("US dollars", "USD"),
        ("  Canadian   dollars ", "CAD"),
        ("C$", "CAD"),
        ("pound sterling", "GBP"),
        ("Swiss franc", "CHF"),
        ("renminbi", "CNY"),
    ],
)
def test_parse_currency(text: str, code: str) -> None:
    assert parse_currency(text) == code


@pytest.mark.parametrize("value", ["", "XYZ", "kr", "EUR 5", 5, None, "dollars and euros"])
def test_parse_currency_refuses(value: object) -> None:
    with pytest.raises(NormalizationError):
        parse_currency(value)


# --------------------------------------------------------------------------- JSON values


def test_json_numbers_are_used_as_they_are() -> None:
    assert parse_amount(7) == amount("7")
    assert parse_amount(-0.25) == amount("-0.25")
    assert parse_amount(1284.372).number == Decimal("1284.372")  # repr, not binary expansion
    assert parse_amount("1.2e6").number == Decimal("1200000")
    assert parse_amount("-2.5E-3").number == Decimal("-0.0025")


@pytest.mark.parametrize(
    "value", [True, False, None, [1], {"v": 1}, float("nan"), float("inf"), "", "abc"]
)
def test_non_numbers_are_refused(value: object) -> None:
    with pytest.raises(NormalizationError):
        parse_amount(value)


def test_several_numbers_are_refused() -> None:
    with pytest.raises(NormalizationError, match="more than one number"):
        parse_amount("1,234 or 5,678")
    with pytest.raises(NormalizationError, match="cannot read"):
        parse_amount("about 12")


# --------------------------------------------------------------------------- percent


@pytest.mark.parametrize(
    ("value", "bare", "points"),
    [
        ("12.5%", "auto", "12.5"),
        ("12.5 %", "auto", "12.5"),
        ("12.5 percent", "auto", "12.5"),
        ("12.5 per cent", "auto", "12.5"),
        ("12.5 pct", "auto", "12.5"),
        ("1.5 pp", "auto", "1.5"),
        ("1.5 percentage points", "auto", "1.5"),
        ("25 bp", "auto", "0.25"),
        ("25bps", "auto", "0.25"),
        ("25 basis points", "auto", "0.25"),
        ("\u22124.2%", "auto", "-4.2"),
        ("(4.2%)", "auto", "-4.2"),
        (12.5, "auto", "12.5"),
        ("12.5", "auto", "12.5"),
        (0.125, "auto", "12.5"),  # |x| < 1: a fraction
        ("0.125", "auto", "12.5"),
        (-0.042, "auto", "-4.2"),
        (1, "auto", "1"),  # |x| = 1 is points
        (0.62, "points", "0.62"),
        ("0.62%", "points", "0.62"),
        (0.125, "fraction", "12.5"),
        (1.5, "fraction", "150"),
        ("12.5%", "fraction", "12.5"),  # a percent sign always means points
    ],
)
def test_percent_points(value: object, bare: str, points: str) -> None:
    assert percent_points(value, bare=bare) == Decimal(points)  # type: ignore[arg-type]


@pytest.mark.parametrize("value", ["$12%", "12%m", "12% %", "5 EUR"])
def test_percent_refuses_currency_and_scale(value: str) -> None:
    with pytest.raises(NormalizationError):
        percent_points(value)


# --------------------------------------------------------------------------- dates


@pytest.mark.parametrize(
    ("text", "iso"),
    [
        ("2024-03-15", "2024-03-15"),
        ("2024/03/15", "2024-03-15"),
        ("2024.03.15", "2024-03-15"),
        ("2024-3-5", "2024-03-05"),
        ("20240315", "2024-03-15"),
        (20240315, "2024-03-15"),
        ("2024-03-15T10:30:00Z", "2024-03-15"),
        ("2024-03-15 10:30:00+01:00", "2024-03-15"),
        ("15 March 2024", "2024-03-15"),
        ("15 Mar 2024", "2024-03-15"),
        ("15 Mar. 2024", "2024-03-15"),
        ("15-Mar-2024", "2024-03-15"),
        ("15-Mar-24", "2024-03-15"),
        ("03-Feb-2025", "2025-02-03"),
        ("15th of March, 2024", "2024-03-15"),
        ("1st March 2024", "2024-03-01"),
        ("Friday, 15 March 2024", "2024-03-15"),
        ("Thursday, 12 June 2025", "2025-06-12"),
        ("March 15, 2024", "2024-03-15"),
        ("Mar. 15th 2024", "2024-03-15"),
        ("Sept. 30, 2024", "2024-09-30"),
        ("Wed, March 13, 2024", "2024-03-13"),
        ("15.03.2024", "2024-03-15"),  # dots: day first
        ("02.12.2024", "2024-12-02"),
        ("04.05.2023", "2023-05-04"),
        ("15/03/2024", "2024-03-15"),  # first part > 12: a day
        ("03/15/2024", "2024-03-15"),  # second part > 12: a day
        ("11/29/2024", "2024-11-29"),
        ("05/05/2024", "2024-05-05"),  # equal parts: no ambiguity
        ("15-03-24", "2024-03-15"),
        ("31/12/99", "1999-12-31"),
        ("31/12/69", "2069-12-31"),
        ("31/12/70", "1970-12-31"),
    ],
)
def test_dates(text: object, iso: str) -> None:
    assert parse_date(text) == dt.date.fromisoformat(iso)


def test_ambiguous_numeric_dates_need_an_order() -> None:
    with pytest.raises(NormalizationError, match="ambiguous"):
        parse_date("03/04/2024")
    assert parse_date("03/04/2024", order="DMY") == dt.date(2024, 4, 3)
    assert parse_date("03/04/2024", order="MDY") == dt.date(2024, 3, 4)
    assert parse_date("12/09/2024", order="MDY") == dt.date(2024, 12, 9)
    # dots stay day-first whatever the order says
    assert parse_date("03.04.2024", order="MDY") == dt.date(2024, 4, 3)


@pytest.mark.parametrize(
    "value",
    ["31/02/2024", "2024-13-01", "30 Febtember 2024", "Q4 2023", "yesterday", "", 3.5, None],
)
def test_bad_dates_are_refused(value: object) -> None:
    with pytest.raises(NormalizationError):
        parse_date(value)


# --------------------------------------------------------------------------- text


def test_normalize_text() -> None:
    assert normalize_text("  ACME\u00a0 Corp\t") == "acme corp"
    assert normalize_text("Straße") == "strasse"  # case folding
    assert normalize_text("ﬁne") == "fine"  # NFKC


@pytest.mark.parametrize(
    ("a", "b", "distance"),
    [("", "", 0), ("abc", "", 3), ("kitten", "sitting", 3), ("flaw", "lawn", 2), ("a", "a", 0)],
)
def test_levenshtein(a: str, b: str, distance: int) -> None:
    assert levenshtein(a, b) == distance
    assert levenshtein(b, a) == distance


def test_anls() -> None:
    assert anls("Kestrel Robotics Inc.", ["Kestrel Robotics Inc."]) == 1.0
    assert anls("  kestrel ROBOTICS inc. ", ["Kestrel Robotics Inc."]) == 1.0
    # 5 edits over 21 characters: NL = 5/21 < 0.5, score 16/21
    assert anls("Kestrel Robotics", ["Kestrel Robotics Inc."]) == pytest.approx(16 / 21)
    # NL = 7/16 = 0.4375: 1 - NL
    assert anls("Acme Corp", ["ACME Corporation"]) == pytest.approx(0.5625)
    # NL >= 0.5: 0
    assert anls("Acme", ["ACME Corporation"]) == 0.0
    assert anls("abcd", ["abef"]) == 0.0  # NL = 0.5 exactly is not < 0.5
    # the best of several accepted answers
    assert anls("Kestrel Robotics", ["Kestrel Robotics Inc.", "Kestrel Robotics"]) == 1.0
    assert anls("", ["x"]) == 0.0
    assert anls("", [""]) == 1.0
    assert anls("Acme Corp", ["ACME Corporation"], threshold=0.4) == 0.0
    # a huge answer is past the threshold by its length alone (answered without the O(n*m) DP)
    assert anls("x" * 1_000_000, ["Kestrel Robotics Inc."]) == 0.0
