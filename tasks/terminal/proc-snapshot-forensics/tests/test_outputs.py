"""Verifier for proc-snapshot-forensics (answers derived from the generated snapshot)."""

import json
import pathlib

import pytest

ANSWERS = pathlib.Path("/app/answers.json")
KEYS = [
    "cpu_hog_ancestry",
    "cpu_hog_cmdline",
    "cpu_hog_pid",
    "cpu_hog_seconds",
    "listener_8080_pid",
    "oldest_python3_pid",
    "rss_kb_uid_1001",
    "zombie_parent_name",
    "zombie_pids",
]


@pytest.fixture(scope="module")
def ans():
    assert ANSWERS.is_file(), "missing /app/answers.json"
    return json.loads(ANSWERS.read_text())


def test_keys(ans):
    assert sorted(ans) == KEYS


def test_cpu_hog(ans):
    assert ans["cpu_hog_pid"] == 31
    assert abs(float(ans["cpu_hog_seconds"]) - 2244.0) < 0.01


def test_cpu_hog_cmdline(ans):
    assert (
        ans["cpu_hog_cmdline"] == "/opt/jobs/bin/data (sync) worker --full --since=2024-01-01 --target s3://bucket/a b"
    )


def test_cpu_hog_ancestry(ans):
    assert ans["cpu_hog_ancestry"] == [1, 13, 30, 31]


def test_listener(ans):
    assert ans["listener_8080_pid"] == 20


def test_zombies(ans):
    assert ans["zombie_pids"] == [41, 43, 47]
    assert ans["zombie_parent_name"] == "jobrunner"


def test_oldest_python3(ans):
    assert ans["oldest_python3_pid"] == 63


def test_rss_sum(ans):
    assert ans["rss_kb_uid_1001"] == 1106421
