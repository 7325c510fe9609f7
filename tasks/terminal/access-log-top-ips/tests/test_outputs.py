"""Verifier for access-log-top-ips. Expected values were computed from the pristine logs."""

import csv
import json
import pathlib

TOP = pathlib.Path("/app/report/top_ips.csv")
STATUS = pathlib.Path("/app/report/status_classes.json")

EXPECTED_TOP = [
    ("10.3.37.234", 800),
    ("10.2.75.78", 419),
    ("192.168.7.57", 363),
    ("10.3.158.43", 305),
    ("10.1.150.252", 295),
    ("10.1.222.218", 198),
    ("192.168.4.127", 176),
    ("10.0.1.37", 169),
    ("10.0.66.172", 123),
    ("10.2.245.250", 118),
]
EXPECTED_STATUS = {"2xx": 4547, "3xx": 571, "4xx": 846, "5xx": 417}


def _rows():
    assert TOP.is_file(), f"missing {TOP}"
    with TOP.open(newline="") as f:
        return list(csv.reader(f))


def test_top_ips_header():
    rows = _rows()
    assert rows and rows[0] == ["ip", "requests"]


def test_top_ips_has_ten_rows():
    assert len(_rows()) == 11


def test_top_ips_values():
    rows = _rows()[1:]
    got = [(r[0].strip(), int(r[1])) for r in rows]
    assert got == EXPECTED_TOP


def test_status_classes_keys():
    assert STATUS.is_file(), f"missing {STATUS}"
    data = json.loads(STATUS.read_text())
    assert sorted(data) == ["2xx", "3xx", "4xx", "5xx"]
    assert all(isinstance(v, int) for v in data.values())


def test_status_classes_values():
    data = json.loads(STATUS.read_text())
    assert data == EXPECTED_STATUS
    assert sum(data.values()) == 6381
