"""Verifier for nested-archive-extraction."""

import hashlib
import pathlib

COMBINED = pathlib.Path("/app/combined.csv")
PARTS = pathlib.Path("/app/parts.txt")

EXPECTED_SHA256 = "941361661a1ee28e9978ff86844bbf0ab85258bf3afc7676e15ebc823e359f80"
EXPECTED_FIRST = ["1117,east,33.19", "1736,south,336.29", "1972,west,275.74"]
EXPECTED_LAST = ["99735,west,68.93", "99815,west,697.54", "99855,east,107.40"]
EXPECTED_PARTS = "part1.csv 70\npart2.csv 50\npart3.csv 70\npart4.csv 70\npart5.csv 40\n"


def _data():
    assert COMBINED.is_file(), "missing /app/combined.csv"
    return COMBINED.read_bytes()


def test_unix_newlines_and_single_header():
    data = _data()
    assert b"\r" not in data
    assert data.endswith(b"\n")
    lines = data.decode().splitlines()
    assert lines[0] == "id,region,amount"
    assert lines.count("id,region,amount") == 1


def test_row_count():
    assert len(_data().decode().splitlines()) == 301


def test_sorted_numerically_by_id():
    ids = [int(l.split(",")[0]) for l in _data().decode().splitlines()[1:]]
    assert ids == sorted(ids)
    assert len(set(ids)) == len(ids)


def test_first_and_last_rows():
    lines = _data().decode().splitlines()
    assert lines[1:4] == EXPECTED_FIRST
    assert lines[-3:] == EXPECTED_LAST


def test_combined_exact():
    assert hashlib.sha256(_data()).hexdigest() == EXPECTED_SHA256


def test_parts_listing():
    assert PARTS.is_file(), "missing /app/parts.txt"
    assert PARTS.read_text() == EXPECTED_PARTS


def test_delivery_still_present():
    assert pathlib.Path("/app/incoming/delivery.tar.gz").is_file()
