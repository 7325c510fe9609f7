"""Verifier for cron-next-fire-times (expected schedule computed independently)."""

import json
import pathlib

import pytest

OUT = pathlib.Path("/app/schedule.json")
EXPECTED = [
    {
        "line": 5,
        "command": "/opt/jobs/poll-queue.sh",
        "next": ["2024-02-28T08:00", "2024-02-28T08:20", "2024-02-28T08:40", "2024-02-28T09:00", "2024-02-28T09:20"],
    },
    {
        "line": 6,
        "command": "/opt/jobs/payroll-check.sh",
        "next": ["2024-03-01T09:30", "2024-03-04T09:30", "2024-03-11T09:30", "2024-03-15T09:30", "2024-03-18T09:30"],
    },
    {
        "line": 7,
        "command": "/opt/jobs/leap-day-report.sh",
        "next": ["2024-02-29T00:00", "2028-02-29T00:00", "2032-02-29T00:00", "2036-02-29T00:00", "2040-02-29T00:00"],
    },
    {
        "line": 8,
        "command": "/opt/jobs/sunday-noon.sh",
        "next": ["2024-03-03T12:00", "2024-03-10T12:00", "2024-03-17T12:00", "2024-03-24T12:00", "2024-03-31T12:00"],
    },
    {
        "line": 10,
        "command": "/opt/jobs/month-end-31.sh",
        "next": ["2024-03-31T00:00", "2024-05-31T00:00", "2024-07-31T00:00", "2024-08-31T00:00", "2024-10-31T00:00"],
    },
    {
        "line": 11,
        "command": "/opt/jobs/rotate-keys.sh",
        "next": ["2024-03-03T00:00", "2024-03-10T00:00", "2024-03-17T00:00", "2024-03-24T00:00", "2024-03-31T00:00"],
    },
    {
        "line": 12,
        "command": "/opt/jobs/backup.sh --full",
        "next": ["2024-03-03T04:05", "2024-03-10T04:05", "2024-03-17T04:05", "2024-03-24T04:05", "2024-03-31T04:05"],
    },
    {
        "line": 13,
        "command": "/opt/jobs/even-hours.sh",
        "next": ["2024-02-28T00:23", "2024-02-28T02:23", "2024-02-28T04:23", "2024-02-28T06:23", "2024-02-28T08:23"],
    },
    {
        "line": 14,
        "command": "/opt/jobs/half-year.sh",
        "next": ["2024-07-01T00:00", "2025-01-01T00:00", "2025-07-01T00:00", "2026-01-01T00:00", "2026-07-01T00:00"],
    },
    {
        "line": 15,
        "command": "/opt/jobs/late-minutes.sh",
        "next": ["2024-02-28T23:00", "2024-02-28T23:07", "2024-02-28T23:14", "2024-02-28T23:21", "2024-02-28T23:28"],
    },
    {
        "line": 16,
        "command": "/opt/jobs/every-other-weekday-number.sh",
        "next": ["2024-02-29T00:00", "2024-03-02T00:00", "2024-03-03T00:00", "2024-03-05T00:00", "2024-03-07T00:00"],
    },
    {
        "line": 17,
        "command": '/opt/jobs/invoice.sh "March run" > /var/log/invoice.log 2>&1',
        "next": ["2024-03-01T00:00", "2024-04-01T00:00", "2024-05-01T00:00", "2024-06-01T00:00", "2024-07-01T00:00"],
    },
    {
        "line": 18,
        "command": "/opt/jobs/first-tuesday-or-first-week.sh",
        "next": ["2024-03-01T10:15", "2024-03-02T10:15", "2024-03-03T10:15", "2024-03-04T10:15", "2024-03-05T10:15"],
    },
    {
        "line": 20,
        "command": "/opt/jobs/spring-weekends.sh",
        "next": ["2024-03-02T08:00", "2024-03-03T08:00", "2024-03-09T08:00", "2024-03-10T08:00", "2024-03-16T08:00"],
    },
    {
        "line": 21,
        "command": "/opt/jobs/annual.sh",
        "next": ["2025-01-01T00:00", "2026-01-01T00:00", "2027-01-01T00:00", "2028-01-01T00:00", "2029-01-01T00:00"],
    },
]
BY_LINE = {e["line"]: e for e in EXPECTED}


@pytest.fixture(scope="module")
def got():
    assert OUT.is_file(), "missing /app/schedule.json"
    data = json.loads(OUT.read_text())
    assert isinstance(data, list)
    return data


def _next(got, line):
    for e in got:
        if e.get("line") == line:
            return e["next"]
    raise AssertionError(f"no entry for line {line}")


def test_jobs_lines_and_order(got):
    assert [e.get("line") for e in got] == [e["line"] for e in EXPECTED]
    for e in got:
        assert sorted(e) == ["command", "line", "next"]


def test_commands(got):
    assert [e["command"] for e in got] == [e["command"] for e in EXPECTED]


def test_simple_ranges_and_steps(got):
    for line in (5, 13, 15):
        assert _next(got, line) == BY_LINE[line]["next"], line


def test_names_and_sunday_as_7(got):
    for line in (8, 12, 14, 20):
        assert _next(got, line) == BY_LINE[line]["next"], line


def test_macros(got):
    for line in (11, 17, 21):
        assert _next(got, line) == BY_LINE[line]["next"], line


def test_calendar_edges(got):
    for line in (7, 10):
        assert _next(got, line) == BY_LINE[line]["next"], line


def test_day_of_month_or_day_of_week(got):
    for line in (6, 16, 18):
        assert _next(got, line) == BY_LINE[line]["next"], line


def test_everything(got):
    assert got == EXPECTED
