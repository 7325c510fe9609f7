"""The terminal-domain verifier: run the task's tests in an isolated sandbox and read the
reward the Harbor way (``/logs/verifier/reward.txt`` or ``reward.json``), gated by the test
report.

Gates (a failed gate scores 0 with the reason in ``details``; it is the agent's outcome):
- the pytest report must show exactly ``expected_tests`` tests when the task states it;
- any skipped or xfailed test, or zero collected tests, does not pass.
Infrastructure outcomes are not scores: a verifier timeout is ``status=timeout``; a test
script that leaves no reward (Harbor) or a report missing while ``expected_tests`` is set
is ``status=error``. Both are excluded from loss.
"""

from __future__ import annotations

import io
import json
import math
import re
import tarfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from service.errors import CrucibleError, InvalidRequest, NotFound
from service.ids import new_id
from service.pool import spec_for
from service.runtime.base import ExecRequest, SandboxRuntime
from service.tasks.models import Task
from service.templates import Template
from service.verifiers.base import VerifierResult
from service.verifiers.isolation import (
    VERIFIER_ENV,
    ChangePlan,
    plan_changes,
    posix_parent,
    tests_tar,
)
from service.verifiers.registry import EndState, register

NAME = "terminal"
VERSION = "1"
MAX_REPORT_BYTES = 4 << 20


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


def _shadowed(paths: tuple[str, ...], t0: float) -> VerifierResult:
    """The agent planted modules that would hijack the test runner: a score of 0."""
    return VerifierResult(
        name=NAME,
        version=VERSION,
        status="ok",
        reward=0.0,
        components={"reward_file": 0.0},
        details={
            "gate": "the workdir shadows modules the test runner imports: " + ", ".join(paths),
            "passed": False,
            "tampered": list(paths),
        },
        duration_ms=(time.perf_counter() - t0) * 1e3,
    )


def _read_logs(runtime: SandboxRuntime, container_id: str) -> dict[str, bytes | None]:
    """The report files of ``/logs/verifier``, in one engine-side archive read."""
    out: dict[str, bytes | None] = dict.fromkeys(REPORT_FILES)
    try:
        data = b"".join(runtime.get_archive(container_id, "/logs/verifier"))
    except NotFound:
        return out
    with tarfile.open(fileobj=io.BytesIO(data)) as t:
        for member in t:
            name = member.name.split("/", 1)[-1]
            if name in out and member.isfile() and member.size <= MAX_REPORT_BYTES:
                f = t.extractfile(member)
                out[name] = f.read() if f else None
    return out


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
    snapshot_image: str,
    pristine_image: str,
    template: Template,
    deployment: str,
    dispose: Callable[[str], object] | None = None,
) -> VerifierResult:
    """Verify an episode whose end state is ``snapshot_image`` (see ``isolation``).

    ``episode_container_id`` is only diffed, never executed in. ``dispose`` removes the
    verifier's containers (default: ``runtime.destroy`` inline; the service passes a
    background destroyer). Returns a result; runtime failures become ``status=error``
    (never reward 0).
    """
    t0 = time.perf_counter()
    created: list[str] = []
    try:
        plan = plan_changes(runtime.diff(episode_container_id), check.workdir)
        if plan.shadowing:
            return _shadowed(plan.shadowing, t0)
        base = pristine_image if plan.tampered else snapshot_image
        vid = new_id("vf")
        vcid = runtime.create(spec_for(template, vid, deployment, image=base))
        created.append(vcid)
        if plan.tampered:
            _carry_over(
                runtime,
                plan,
                template=template,
                deployment=deployment,
                snapshot_image=snapshot_image,
                into=vcid,
                created=created,
            )
        # /tests and /logs are protected: untouched by the agent here, so extracting fresh
        # tests and an empty /logs/verifier is the whole set-up (no exec needed).
        runtime.put_archive(vcid, "/", tests_tar(check.tests_dir, check.extra_files))
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
        log_tail = (res.stdout[-4000:] + res.stderr[-2000:]).decode("utf-8", "replace")
        if res.timed_out:
            return VerifierResult(
                name=NAME,
                version=VERSION,
                status="timeout",
                reward=None,
                duration_ms=(time.perf_counter() - t0) * 1e3,
                details={
                    "reason": f"tests exceeded {check.timeout_s} s",
                    "log_tail": log_tail,
                    "tampered": list(plan.tampered),
                },
            )
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
        return VerifierResult(
            name=NAME,
            version=VERSION,
            status="error",
            reward=None,
            duration_ms=(time.perf_counter() - t0) * 1e3,
            details={"reason": f"verifier infrastructure failed: {e.detail}"},
        )
    finally:
        for cid in created:
            (dispose or runtime.destroy)(cid)


def _carry_over(
    runtime: SandboxRuntime,
    plan: ChangePlan,
    *,
    template: Template,
    deployment: str,
    snapshot_image: str,
    into: str,
    created: list[str],
) -> None:
    """Replay the agent's non-toolchain changes from the snapshot onto a pristine container:
    deletions first (the pristine toolchain's ``rm``), then the added and modified entries
    (engine-side archives)."""
    if plan.delete:
        runtime.exec(
            into, ExecRequest(cmd=["rm", "-rf", "--", *plan.delete], timeout_s=60, user="0")
        )
    if not plan.copy:
        return
    src = runtime.create(spec_for(template, new_id("vs"), deployment, image=snapshot_image))
    created.append(src)
    for path in plan.copy:
        tar = b"".join(runtime.get_archive(src, path))
        runtime.put_archive(into, posix_parent(path), tar)


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
    )


def verify_episode(task: Task, end: EndState) -> VerifierResult:
    """Registry entry: verify ``task``'s end state with its tests."""
    return verify(
        end.runtime,
        check_for(task),
        episode_container_id=end.episode_container_id,
        snapshot_image=end.snapshot_image,
        pristine_image=end.pristine_image,
        template=end.template,
        deployment=end.deployment,
        dispose=end.dispose,
    )


register(NAME, verify_episode)
