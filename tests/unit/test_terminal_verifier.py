"""The terminal verifier's pure parts: reward parsing, JUnit gates, toolchain-tamper planning."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.runtime.base import FsChange
from service.verifiers.isolation import is_protected, plan_changes
from service.verifiers.terminal import (
    TerminalCheck,
    parse_junit,
    parse_pytest_summary,
    parse_reward,
    score,
)

CHECK = TerminalCheck(
    test_command="bash /tests/test.sh",
    tests_dir=Path("."),
    workdir="/app",
    timeout_s=60,
    expected_tests=3,
)


def junit(passed: int = 0, failed: int = 0, skipped: int = 0, xfail: int = 0) -> bytes:
    cases = [f'<testcase name="p{i}"/>' for i in range(passed)]
    cases += [f'<testcase name="f{i}"><failure message="x"/></testcase>' for i in range(failed)]
    cases += [f'<testcase name="s{i}"><skipped message="s"/></testcase>' for i in range(skipped)]
    cases += [
        f'<testcase name="x{i}"><skipped type="pytest.xfail"/></testcase>' for i in range(xfail)
    ]
    body = "".join(cases)
    return f'<testsuites><testsuite name="t">{body}</testsuite></testsuites>'.encode()


def test_parse_junit_counts() -> None:
    c = parse_junit(junit(passed=2, failed=1, skipped=1, xfail=1))
    assert (c.total, c.passed, c.failed, c.skipped) == (5, 2, 1, 2)


@pytest.mark.parametrize(
    ("txt", "js", "expected"),
    [
        (b"1\n", None, (1.0, {}, None)),
        (b"0.25", None, (0.25, {}, None)),
        (None, b'{"reward": 0.5, "style": 1}', (0.5, {"reward": 0.5, "style": 1.0}, None)),
        (None, b'{"a": 1, "b": 0}', (0.5, {"a": 1.0, "b": 0.0}, None)),
    ],
)
def test_parse_reward(txt: bytes | None, js: bytes | None, expected: tuple) -> None:
    assert parse_reward(txt, js) == expected


@pytest.mark.parametrize(
    ("txt", "js"), [(None, None), (b"yes", None), (b"nan", None), (None, b"[1]"), (None, b"{}")]
)
def test_unreadable_rewards_are_problems(txt: bytes | None, js: bytes | None) -> None:
    reward, _, problem = parse_reward(txt, js)
    assert reward is None and problem


def test_all_pass_scores_one() -> None:
    r = score(CHECK, exit_code=0, reward_txt=b"1", reward_json=None, junit=junit(passed=3))
    assert (r.status, r.reward, r.details["passed"]) == ("ok", 1.0, True)
    assert r.components == {"reward_file": 1.0, "tests_total": 3, "tests_passed": 3}


def test_failure_scores_zero_not_error() -> None:
    r = score(
        CHECK, exit_code=1, reward_txt=b"0", reward_json=None, junit=junit(passed=2, failed=1)
    )
    assert (r.status, r.reward) == ("ok", 0.0)


@pytest.mark.parametrize(
    ("report", "gate"),
    [
        (junit(passed=2), "expected 3 tests, the report has 2"),
        (junit(passed=2, skipped=1), "1 test(s) skipped or xfailed"),
        (junit(passed=2, xfail=1), "1 test(s) skipped or xfailed"),
        (junit(), "no tests were collected"),
    ],
)
def test_gates_turn_a_forged_pass_into_zero(report: bytes, gate: str) -> None:
    r = score(CHECK, exit_code=0, reward_txt=b"1", reward_json=None, junit=report)
    assert (r.status, r.reward, r.details["gate"]) == ("ok", 0.0, gate)


def test_missing_reward_or_report_is_an_error_not_zero() -> None:
    r = score(CHECK, exit_code=2, reward_txt=None, reward_json=None, junit=junit(passed=3))
    assert (r.status, r.reward) == ("error", None)
    r = score(CHECK, exit_code=0, reward_txt=b"1", reward_json=None, junit=None)
    assert (r.status, r.reward) == ("error", None)
    assert "no JUnit report" in r.details["reason"]


@pytest.mark.parametrize(
    ("line", "counts"),
    [
        ("===== 3 passed in 0.12s =====", (3, 3, 0, 0)),
        ("=== 2 passed, 1 skipped, 1 xfailed in 1.00s ===", (4, 2, 0, 2)),
        ("==== 1 failed, 2 passed, 1 error, 3 warnings in 0.5s ====", (4, 2, 1, 0)),
        ("========== 1 xpassed in 0.01s ==========", (1, 1, 0, 0)),
    ],
)
def test_pytest_summary_counts(line: str, counts: tuple[int, int, int, int]) -> None:
    c = parse_pytest_summary(f"collected\n{line}\n")
    assert (c.total, c.passed, c.failed, c.skipped) == counts


def test_summary_line_gates_like_a_report() -> None:
    out = "...\n=== 2 passed, 1 skipped in 0.1s ===\n"
    r = score(CHECK, exit_code=0, reward_txt=b"1", reward_json=None, junit=None, output=out)
    assert (r.status, r.reward, r.details["gate"]) == ("ok", 0.0, "1 test(s) skipped or xfailed")
    assert parse_pytest_summary("no summary here") is None


def test_exit_code_reward_source() -> None:
    tb1 = TerminalCheck(
        test_command="bash /tests/run-tests.sh",
        tests_dir=Path("."),
        workdir="/app",
        timeout_s=60,
        reward_source="exit_code",
    )
    assert score(tb1, exit_code=0, reward_txt=None, reward_json=None, junit=None).reward == 1.0
    assert score(tb1, exit_code=1, reward_txt=None, reward_json=None, junit=None).reward == 0.0


@pytest.mark.parametrize(
    ("path", "protected"),
    [
        ("/usr/bin/python3", True),
        ("/usr", True),
        ("/lib64/ld-linux-x86-64.so.2", True),
        ("/etc/ld.so.preload", True),
        ("/etc/python3.11/sitecustomize.py", True),
        ("/etc/profile.d/evil.sh", True),
        ("/conftest.py", True),
        ("/tests/conftest.py", True),
        ("/app/conftest.py", False),
        ("/usrx", False),
        ("/etc/nginx/nginx.conf", False),
        ("/root/.bashrc", False),
    ],
)
def test_protected_paths(path: str, protected: bool) -> None:
    assert is_protected(path) is protected


def test_plan_reduces_diff_to_leaves_and_flags_tampering() -> None:
    changes = [
        FsChange("/app", "modified"),
        FsChange("/app/out.txt", "added"),
        FsChange("/app/new", "added"),
        FsChange("/app/new/deep.txt", "added"),
        FsChange("/app/old.txt", "deleted"),
        FsChange("/usr", "modified"),
        FsChange("/usr/bin", "modified"),
        FsChange("/usr/bin/pytest", "modified"),
        FsChange("/usr/sbin", "modified"),
        FsChange("/usr/sbin/docker-init", "added"),
        FsChange("/opt", "modified"),
        FsChange("/opt/crucible", "added"),
        FsChange("/etc", "modified"),
        FsChange("/etc/motd", "modified"),
    ]
    plan = plan_changes(changes)
    assert plan.copy == ("/app/new", "/app/out.txt", "/etc/motd")
    assert plan.delete == ("/app/old.txt",)
    assert plan.tampered == ("/usr/bin/pytest",)
    assert plan_changes([FsChange("/usr/sbin/docker-init", "added")]).tampered == ()


def test_shadowing_modules_in_the_workdir_are_named() -> None:
    changes = [
        FsChange("/app", "modified"),
        FsChange("/app/pytest.py", "added"),
        FsChange("/app/json.py", "added"),
        FsChange("/app/_pytest", "added"),
        FsChange("/app/_pytest/__init__.py", "added"),
        FsChange("/app/site", "added"),
        FsChange("/app/site/index.html", "added"),
        FsChange("/app/solution.py", "added"),
        FsChange("/app/sub", "added"),
        FsChange("/app/sub/json.py", "added"),
        FsChange("/app/notes.txt", "added"),
    ]
    plan = plan_changes(changes, "/app")
    assert plan.shadowing == ("/app/_pytest", "/app/json.py", "/app/pytest.py")
    assert plan_changes(changes).shadowing == ()


@pytest.mark.parametrize(
    "planted",
    [
        "/app/pprint.pyc",
        "/app/json.cpython-311-x86_64-linux-gnu.so",
        "/app/zz-1.0.dist-info",
        "/app/zz.egg-info",
    ],
)
def test_compiled_modules_and_plugin_metadata_are_hijacks(planted: str) -> None:
    # Regression: a sourceless pprint.pyc and an entry-point plugin's dist-info scored 1.0.
    plan = plan_changes([FsChange("/app", "modified"), FsChange(planted, "added")], "/app")
    assert plan.shadowing == (planted,)


def test_ordinary_outputs_are_not_hijacks() -> None:
    changes = [
        FsChange("/app", "modified"),
        FsChange("/app/report.pyc.txt", "added"),
        FsChange("/app/solution.pyc", "added"),
        FsChange("/app/data.so.1", "added"),
    ]
    assert plan_changes(changes, "/app").shadowing == ()


def test_new_user_trial_findings_in_the_plan() -> None:
    # attrs' module in the workdir hijacks pytest 7.2; pytest's hidden root config is read;
    # a .pth file in the workdir does nothing (only site directories process them).
    plan = plan_changes(
        [
            FsChange("/app/attr.py", "added"),
            FsChange("/app/notes.pth", "added"),
            FsChange("/.pytest.ini", "added"),
        ],
        "/app",
    )
    assert plan.shadowing == ("/app/attr.py",)
    assert plan.tampered == ("/.pytest.ini",)
    assert is_protected("/.pytest.ini")


def test_type_changes_are_removed_before_the_copy() -> None:
    plan = plan_changes(
        [
            FsChange("/etc", "modified"),
            FsChange("/etc/was-file", "modified", replaced=True),
            FsChange("/etc/was-file/inside", "added"),
            FsChange("/etc/was-dir", "modified", replaced=True),
        ],
        "/app",
    )
    assert plan.delete == ("/etc/was-dir", "/etc/was-file")
    assert plan.copy == ("/etc/was-dir", "/etc/was-file/inside")
