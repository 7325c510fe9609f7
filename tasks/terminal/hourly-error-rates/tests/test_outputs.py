"""Verifier for hourly-error-rates (expected values computed from the pristine logs)."""

import csv
import pathlib

import pytest

OUT = pathlib.Path("/app/error_rates.csv")
MALFORMED = pathlib.Path("/app/malformed.txt")
EXPECTED = [
    ["2024-09-14T20:00Z", "211", "10", "0.0474"],
    ["2024-09-14T21:00Z", "316", "16", "0.0506"],
    ["2024-09-14T22:00Z", "292", "17", "0.0582"],
    ["2024-09-14T23:00Z", "303", "67", "0.2211"],
    ["2024-09-15T00:00Z", "305", "78", "0.2557"],
    ["2024-09-15T01:00Z", "231", "6", "0.0260"],
    ["2024-09-15T02:00Z", "0", "0", "0.0000"],
    ["2024-09-15T03:00Z", "174", "7", "0.0402"],
    ["2024-09-15T04:00Z", "6", "0", "0.0000"],
]
EXPECTED_MALFORMED = 13


@pytest.fixture(scope="module")
def rows():
    assert OUT.is_file(), f"missing {OUT}"
    with OUT.open(newline="") as f:
        return list(csv.reader(f))


def test_header(rows):
    assert rows[0] == ["hour", "total", "errors", "error_rate"]


def test_hours_cover_full_range_in_utc(rows):
    assert [r[0] for r in rows[1:]] == [e[0] for e in EXPECTED]


def test_totals(rows):
    assert [int(r[1]) for r in rows[1:]] == [int(e[1]) for e in EXPECTED]


def test_errors(rows):
    assert [int(r[2]) for r in rows[1:]] == [int(e[2]) for e in EXPECTED]


def test_error_rate_format_and_value(rows):
    for got, exp in zip(rows[1:], EXPECTED):
        rate = got[3]
        assert len(rate.split(".")[-1]) == 4 and "." in rate, rate
        assert abs(float(rate) - float(exp[3])) <= 0.00011, (got, exp)


def test_malformed_count():
    assert MALFORMED.is_file(), f"missing {MALFORMED}"
    assert MALFORMED.read_text().strip() == str(EXPECTED_MALFORMED)
