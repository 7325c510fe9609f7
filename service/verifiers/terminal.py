"""The terminal-domain verifier: run the task's tests in an isolated sandbox and read the
reward the Harbor way (``/logs/verifier/reward.txt`` or ``reward.json``), gated by the test
report.

Gates (a failed gate scores 0 with the reason in ``details``; it is the agent's outcome):
- modules planted in the workdir that would hijack the test runner (``isolation``);
- an end state whose changed files exceed the task's storage limit (``storage_mb``);
- a workdir that is gone or no longer a directory;
- the pytest report must show exactly ``expected_tests`` tests when the task states it;
- any skipped or xfailed test, or zero collected tests, does not pass.
Infrastructure outcomes are not scores: a verifier timeout is ``status=timeout``; a test
script that leaves no reward (Harbor) or a report missing while ``expected_tests`` is set,
or a test command killed by a signal (its report cannot be trusted), is ``status=error``.
All are excluded from loss.
"""

from __future__ import annotations

import json
import math
import re
import tarfile
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from service.errors import CrucibleError, InvalidRequest, PayloadTooLarge, SandboxError
from service.runtime.base import ExecRequest, SandboxRuntime
from service.tasks.models import Task
from service.verifiers.base import VerifierResult
from service.verifiers.isolation import VERIFIER_ENV, ChangePlan, add_tests, plan_changes
from service.verifiers.registry import EndState, register

NAME = "terminal"
VERSION = "1"
MAX_REPORT_BYTES = 4 << 20
KILLED_EXIT_CODES = (128 + 9, 128 + 15)  # SIGKILL / SIGTERM, passed on by the test script
SPOOL_BYTES = 64 << 20  # the replay archive stays in memory up to this size, then on disk


@dataclass(frozen=True, kw_only=True)
class TestCounts:
    """Counts from a JUnit XML report (pytest's ``--junitxml``)."""

    total: int
    passed: int
    failed: int
    errors: int
    skipped: int  # includes xfail (pytest writes xfail as skipped)


@dataclass(frozen=True, kw_only=True)
class TerminalCheck:
    """What one task asks of the verifier."""

    test_command: str
    tests_dir: Path | None
    workdir: str
    timeout_s: float
    expected_tests: int | None = None
    pass_threshold: float = 1.0
    reward_source: str = "file"  # "file" (Harbor) | "exit_code" (Terminal-Bench 1)
    extra_files: tuple[Path, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    max_end_state_bytes: int | None = None  # the task's storage limit


def parse_junit(xml_bytes: bytes) -> TestCounts:
    """Count tests in a JUnit XML document (``<testsuites>`` or one ``<testsuite>``).

    Raises:
        ValueError: not JUnit XML.
    """
    root = ET.fromstring(xml_bytes)
    cases = list(root.iter("testcase"))
    if root.tag not in ("testsuites", "testsuite"):
        raise ValueError(f"not a JUnit report (root <{root.tag}>)")
    failed = sum(1 for c in cases if c.find("failure") is not None)
    errors = sum(1 for c in cases if c.find("error") is not None)
    skipped = sum(1 for c in cases if c.find("skipped") is not None)
    total = len(cases)
    return TestCounts(
        total=total,
        passed=total - failed - errors - skipped,
        failed=failed,
        errors=errors,
        skipped=skipped,
    )


_SUMMARY = re.compile(
    r"^=+ (?P<body>.*?\d+ (?:passed|failed|error|errors|skipped|xfailed|"
    r"xpassed|deselected|warnings?|no tests ran).*?) in [\d.]+s.*=+\s*$",
    re.MULTILINE,
)
_COUNT = re.compile(r"(\d+) (passed|failed|errors?|skipped|xfailed|xpassed)")


def parse_pytest_summary(output: str) -> TestCounts | None:
    """Counts from pytest's last ``=== 3 passed, 1 skipped in 0.12s ===`` line, or None.

    ``xfailed`` counts as skipped (it does not pass), ``xpassed`` as passed.
    """
    lines = _SUMMARY.findall(output)
    if not lines:
        return None
    found = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0}
    for n, kind in _COUNT.findall(lines[-1]):
        key = {"error": "errors", "xfailed": "skipped", "xpassed": "passed"}.get(kind, kind)
        found[key] += int(n)
    return TestCounts(total=sum(found.values()), **found)


def parse_reward(
    txt: bytes | None, js: bytes | None
) -> tuple[float | None, dict[str, float], str | None]:
    """(reward, components, problem) from ``reward.txt`` / ``reward.json`` contents.

    ``reward.json`` is a dict of floats; its ``reward`` key is the reward, else their mean.
    """
    if js is not None:
        try:
            data = json.loads(js)
            comps = {str(k): float(v) for k, v in data.items()}
        except (ValueError, TypeError, AttributeError) as e:
            return None, {}, f"reward.json is not a dict of numbers: {e}"
        if not comps:
            return None, {}, "reward.json is empty"
        value = comps.get("reward", sum(comps.values()) / len(comps))
    elif txt is not None:
        try:
            value, comps = float(txt.decode().strip()), {}
        except (ValueError, UnicodeDecodeError):
            return None, {}, f"reward.txt is not a number: {txt[:80]!r}"
    else:
        return None, {}, "the test script wrote no /logs/verifier/reward.txt or reward.json"
    if not math.isfinite(value):
        return None, {}, f"reward {value} is not finite"
    return value, comps, None


REPORT_FILES = ("reward.txt", "reward.json", "junit.xml")


def _unscored(
    status: Literal["error", "timeout"], reason: str, t0: float, **details: Any
) -> VerifierResult:
    """The verifier could not produce a verdict: no reward, excluded from loss."""
    return VerifierResult(
        name=NAME,
        version=VERSION,
        status=status,
        reward=None,
        details={"reason": reason, **details},
        duration_ms=(time.perf_counter() - t0) * 1e3,
    )


def _gated(gate: str, t0: float, **details: Any) -> VerifierResult:
    """The end state fails before any test runs (the agent's outcome): a score of 0."""
    return VerifierResult(
        name=NAME,
        version=VERSION,
        status="ok",
        reward=0.0,
        components={"reward_file": 0.0},
        details={"gate": gate, "passed": False, **details},
        duration_ms=(time.perf_counter() - t0) * 1e3,
    )


def _read_logs(runtime: SandboxRuntime, container_id: str) -> dict[str, bytes | None]:
    """The report files of ``/logs/verifier``, read engine-side from the frozen verifier
    sandbox (nothing a test left running can swap them while they are read)."""
    runtime.freeze(container_id)
    return runtime.read_files(
        container_id, "/logs/verifier", REPORT_FILES, max_bytes=MAX_REPORT_BYTES
    )


def score(
    check: TerminalCheck,
    *,
    exit_code: int,
    reward_txt: bytes | None,
    reward_json: bytes | None,
    junit: bytes | None,
    output: str = "",
) -> VerifierResult:
    """Turn what the test run left behind into a result (pure; unit-tested directly).

    Test counts come from the JUnit report, else from pytest's closing summary line in
    ``output`` (tasks whose test script writes no report).
    """
    details: dict[str, Any] = {"test_exit_code": exit_code}
    counts = None
    if junit is not None:
        try:
            counts = parse_junit(junit)
        except (ET.ParseError, ValueError) as e:
            details["junit_problem"] = str(e)
    if counts is None:
        counts = parse_pytest_summary(output)
    if counts is not None:
        details["tests"] = counts.__dict__
    if check.reward_source == "exit_code":
        reward, comps, problem = (1.0 if exit_code == 0 else 0.0), {}, None
    else:
        reward, comps, problem = parse_reward(reward_txt, reward_json)
    if problem:
        return VerifierResult(
            name=NAME,
            version=VERSION,
            status="error",
            reward=None,
            details={**details, "reason": problem},
        )
    if check.expected_tests is not None and counts is None:
        return VerifierResult(
            name=NAME,
            version=VERSION,
            status="error",
            reward=None,
            details={
                **details,
                "reason": f"expected {check.expected_tests} tests but found no JUnit report "
                "and no pytest summary",
            },
        )
    components = {**comps, "reward_file": float(reward)}
    gate = None
    if counts is not None:
        components.update(tests_total=counts.total, tests_passed=counts.passed)
        if counts.total == 0:
            gate = "no tests were collected"
        elif check.expected_tests is not None and counts.total != check.expected_tests:
            gate = f"expected {check.expected_tests} tests, the report has {counts.total}"
        elif counts.skipped:
            gate = f"{counts.skipped} test(s) skipped or xfailed"
    if gate:
        details["gate"] = gate
        reward = 0.0
    details["passed"] = reward >= check.pass_threshold
    return VerifierResult(
        name=NAME,
        version=VERSION,
        status="ok",
        reward=float(reward),
        components=components,
        details=details,
    )


def verify(
    runtime: SandboxRuntime,
    check: TerminalCheck,
    *,
    episode_container_id: str,
    fresh_sandbox: Callable[[], str],
    dispose: Callable[[str], object] | None = None,
) -> VerifierResult:
    """Verify the end state of the frozen ``episode_container_id`` (see ``isolation``).

    The episode's container is only diffed and read, never executed in. ``fresh_sandbox()``
    gives the verifier's sandbox (a started, untouched container of the episode's pristine
    image); the agent's changes and the tests are replayed onto it and the tests run there.
    ``dispose`` removes it (default: ``runtime.destroy`` inline; the service passes a
    background destroyer). Returns a result; runtime failures become ``status=error``
    (never reward 0).
    """
    t0 = time.perf_counter()
    created: list[str] = []
    try:
        plan = plan_changes(runtime.diff(episode_container_id), check.workdir)
        if plan.shadowing:
            gate = "the workdir shadows modules the test runner imports: "
            return _gated(gate + ", ".join(plan.shadowing), t0, tampered=list(plan.shadowing))
        vcid = fresh_sandbox()
        created.append(vcid)
        try:
            _replay(runtime, plan, check, source=episode_container_id, into=vcid)
        except PayloadTooLarge as e:
            limit_mib = (check.max_end_state_bytes or 0) >> 20
            gate = f"the end state exceeds the task's storage limit of {limit_mib} MiB: {e.detail}"
            return _gated(gate, t0, tampered=list(plan.tampered))
        try:
            res = runtime.exec(
                vcid,
                ExecRequest(
                    cmd=["/bin/bash", "--noprofile", "--norc", "-c", check.test_command],
                    cwd=check.workdir,
                    timeout_s=check.timeout_s,
                    user="0",
                    max_output_bytes=32 << 10,
                    env={k: v.encode() for k, v in {**check.env, **VERIFIER_ENV}.items()},
                ),
            )
        except InvalidRequest as e:
            if e.field != "cwd":
                raise
            gate = f"the workdir {check.workdir} is not a directory in the end state"
            return _gated(gate, t0, tampered=list(plan.tampered))
        log_tail = (res.stdout[-4000:] + res.stderr[-2000:]).decode("utf-8", "replace")
        context = {"log_tail": log_tail, "tampered": list(plan.tampered)}
        if res.timed_out:
            return _unscored("timeout", f"tests exceeded {check.timeout_s} s", t0, **context)
        if res.signal or res.exit_code in KILLED_EXIT_CODES:
            # Something killed the test command (or the run it reports): whatever report it
            # left is not the tests' verdict (code the tests ran can write one, then kill).
            oom = " (out of memory)" if res.oom_killed else ""
            reason = (
                f"the test command was killed (signal {res.signal}, exit code "
                f"{res.exit_code}){oom}; its report is not trusted"
            )
            return _unscored("error", reason, t0, **context)
        files = _read_logs(runtime, vcid)
        result = score(
            check,
            exit_code=res.exit_code,
            reward_txt=files["reward.txt"],
            reward_json=files["reward.json"],
            junit=files["junit.xml"],
            output=(res.stdout + b"\n" + res.stderr).decode("utf-8", "replace"),
        )
        details = {
            **result.details,
            "tampered": list(plan.tampered),
            "log_tail": log_tail,
            "tests_ms": round(res.duration_ms, 3),
        }
        return VerifierResult(
            name=NAME,
            version=VERSION,
            status=result.status,
            reward=result.reward,
            components=result.components,
            details=details,
            duration_ms=(time.perf_counter() - t0) * 1e3,
        )
    except CrucibleError as e:
        return _unscored("error", f"verifier infrastructure failed: {e.detail}", t0)
    finally:
        for cid in created:
            (dispose or runtime.destroy)(cid)


def _replay(
    runtime: SandboxRuntime, plan: ChangePlan, check: TerminalCheck, *, source: str, into: str
) -> None:
    """Make ``into`` hold the episode's end state (outside protected paths) plus the tests:
    removals first (the pristine toolchain's ``rm``, paths NUL-separated on stdin), then one
    archive with the changed entries read from ``source`` and the tests.

    Raises ``PayloadTooLarge`` (the changed files exceed ``check.max_end_state_bytes``) or
    another ``CrucibleError`` (the removal failed, the engine refused the archive).
    """
    if plan.delete:
        res = runtime.exec(
            into,
            ExecRequest(
                cmd=["xargs", "-0", "-r", "rm", "-rf", "--"],
                stdin=b"\0".join(p.encode() for p in plan.delete) + b"\0",
                timeout_s=60,
                user="0",
                max_output_bytes=8 << 10,
            ),
        )
        if res.exit_code != 0:
            raise SandboxError(
                "removing the agent's deletions in the verifier sandbox failed: "
                + res.stderr.decode("utf-8", "replace")[-500:]
            )
    with tempfile.SpooledTemporaryFile(max_size=SPOOL_BYTES) as buf:
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as t:
            entries = runtime.export_entries(source, plan.copy, max_bytes=check.max_end_state_bytes)
            for info, reader in entries:
                t.addfile(info, reader)
            # /tests and /logs are protected (never replayed): fresh tests and an empty
            # /logs/verifier go in last.
            add_tests(t, check.tests_dir, check.extra_files)
        buf.seek(0)
        runtime.put_archive(into, "/", buf)


def check_for(task: Task) -> TerminalCheck:
    """What the terminal verifier must run for ``task``."""
    if task.test_command is None or (task.tests_dir is None and task.test_script is None):
        raise InvalidRequest(f"task {task.key} has no tests to verify with", field="task_id")
    return TerminalCheck(
        test_command=task.test_command,
        tests_dir=task.tests_dir,
        extra_files=(task.test_script,) if task.test_script else (),
        workdir=task.environment.workdir,
        timeout_s=task.verifier_timeout_s,
        expected_tests=task.expected_tests,
        pass_threshold=task.pass_threshold,
        reward_source="exit_code" if task.reward_source == "exit_code" else "file",
        env=dict(task.test_env),
        max_end_state_bytes=task.environment.storage_mb << 20,
    )


def verify_episode(task: Task, end: EndState) -> VerifierResult:
    """Registry entry: verify ``task``'s end state with its tests."""
    return verify(
        end.runtime,
        check_for(task),
        episode_container_id=end.episode_container_id,
        fresh_sandbox=end.fresh_sandbox,
        dispose=end.dispose,
    )


register(NAME, verify_episode)
