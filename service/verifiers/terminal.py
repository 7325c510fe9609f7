"""The terminal-domain verifier: run the task's tests in an isolated sandbox and score what
Crucible itself observed of them.

Who writes the reward: Crucible. The tests run under Crucible's pytest plugin, which reports
every test's outcome over a pipe that the supervisor (not the tests' filesystem) carries
back (``observe``), with two canaries per session. The task's ``reward.txt`` /
``reward.json`` (Harbor) or exit code (Terminal-Bench 1) counts only within what was
observed: ``reward = min(reward file, cap)``, where ``cap`` is 1 when every observed test
passed, else 0 (or the pass fraction for tasks that declare partial credit). A reward file
that is not a finite number in [0, 1] scores 0 with the reason.

Who owns the toolchain: the task image (``isolation``, ``toolchain``): the agent's changes
under the image's interpreters, virtualenvs, site-packages and ``PATH`` are never replayed,
and ``crucible_guard`` gives pristine modules precedence over agent-written ones.

Everything the end state causes is a score (``status=ok``), 0 with the cause in
``details["dodge"]``: a tampered or missing observation, tests that hang, crash or run out
of memory, an end state too big or unreadable, a workdir that is gone, and an outcome
reported by a test process in which agent-written code ran (``agent_code_in_judge``:
code with the reporter's rights can make it say anything; tasks whose tests must import
the agent's code declare ``[crucible] agent_code_in_judge = "allow"`` and their records
say ``details.trusted = false``). ``status=error`` is
only for failures outside the end state (the engine, Crucible's own infrastructure).
Tenants see what the observer saw (counts) and fixed reasons; whatever the tests' children
could set (test names and output, the reward file's values unless every test passed, the
exit code, a signal's number, the duration) is under ``details["private"]``.
"""

from __future__ import annotations

import json
import math
import os
import tarfile
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from service.errors import Conflict, CrucibleError, InvalidRequest, PayloadTooLarge, SandboxError
from service.runtime.base import ROOT, EndStateUnreadable, ExecRequest, SandboxRuntime
from service.tasks.builds import classify
from service.tasks.models import Task
from service.verifiers import toolchain
from service.verifiers.base import VerifierResult
from service.verifiers.isolation import (
    MAX_CHANGED_ENTRIES,
    VERIFIER_ENV,
    ChangePlan,
    add_tests,
    plan_changes,
)
from service.verifiers.observe import OBSERVE_BYTES, SECRET_PATH, Observation, Secret, judge
from service.verifiers.registry import EndState, register

NAME = "terminal"
VERSION = "2"
MAX_REPORT_BYTES = 1 << 20
MAX_COMPONENTS = 32
REWARD_FILE_PROBLEM = "the reward file is missing or not a finite number in [0, 1]"
JSON_PROBLEM = (
    f"reward.json is not a flat object of 1 to {MAX_COMPONENTS} finite numbers with names "
    "of 1 to 64 printable characters"
)
# changes read of an end state: past the replay's limit plus the engine's own entries, so an
# end state over the limit is seen as one, and millions of entries are never held whole
DIFF_READ_ENTRIES = 2 * MAX_CHANGED_ENTRIES
SPOOL_BYTES = 64 << 20  # the replay archive stays in memory up to this size, then on disk
#: Largest replay archive the verifier sandbox's own tar extracts (sent as its command's
#: stdin, whole, in memory); above it the engine extracts it from the spool.
PRISTINE_TAR_BYTES = 16 << 20
OBSERVER_PATH = "/opt/crucible/py"
AUDIT_LIBRARY = f"{OBSERVER_PATH}/crucible-audit.so"  # rtld-audit: supervisor/crucible-audit.c


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
    partial_credit: bool = False
    fetches_tools: bool = False  # [verifier] network = true: test.sh installs its tools
    extra_files: tuple[Path, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    max_end_state_bytes: int | None = None  # the task's storage limit
    agent_code_in_judge: str = "zero"  # [crucible] agent_code_in_judge: "zero" | "allow"
    children_privileged: bool = False  # [crucible] children_privileged


def parse_reward(
    txt: bytes | None, js: bytes | None
) -> tuple[float | None, dict[str, float], str | None]:
    """(reward, components, problem) from ``reward.txt`` / ``reward.json`` contents.

    A problem is one of a few fixed texts: it never quotes the files, their length or a
    value read from them (the tests' children can write them: a trial copied hidden test
    names into ``reward.txt``, then wrote them as digits of an out-of-range number).

    ``reward.json`` is a flat object of at most ``MAX_COMPONENTS`` finite numbers with short
    names; its ``reward`` key is the reward, else their mean. The reward must lie in
    [0, 1]. Any other content is a problem (the caller scores it 0).
    """
    if js is not None:
        try:
            data = json.loads(js)
            if not isinstance(data, dict) or not 0 < len(data) <= MAX_COMPONENTS:
                raise ValueError(f"an object of 1 to {MAX_COMPONENTS} numbers")
            comps = {}
            for k, v in data.items():
                if not (isinstance(k, str) and 0 < len(k) <= 64 and k.isprintable()):
                    raise ValueError("names of 1 to 64 printable characters")
                k.encode("utf-8")  # a lone surrogate would make the record unstorable
                if isinstance(v, bool) or not isinstance(v, int | float):
                    raise ValueError("a value is not a number")
                comps[k] = float(v)
                if not math.isfinite(comps[k]):
                    raise ValueError("a value is not finite")
        except (ValueError, TypeError, RecursionError, UnicodeError):
            return None, {}, JSON_PROBLEM
        value = comps.get("reward", sum(comps.values()) / len(comps))
    elif txt is not None:
        try:
            value, comps = float(txt.decode().strip()), {}
        except (ValueError, UnicodeDecodeError):
            return None, {}, "reward.txt is not a number"
    else:
        return None, {}, "the test script wrote no /logs/verifier/reward.txt or reward.json"
    if not math.isfinite(value) or not 0.0 <= value <= 1.0:
        return None, {}, "the reward file's reward is not a finite number in [0, 1]"
    return value, {k: max(-1e12, min(1e12, v)) for k, v in comps.items()}, None


REPORT_FILES = ("reward.txt", "reward.json")


def _result(status: str, reward: float | None, t0: float | None, **kw: Any) -> VerifierResult:
    return VerifierResult(
        name=NAME,
        version=VERSION,
        status=status,  # type: ignore[arg-type]
        reward=reward,
        components=kw.pop("components", {}),
        details=kw.pop("details", {}),
        duration_ms=(time.perf_counter() - t0) * 1e3 if t0 is not None else 0.0,
    )


def _unscored(reason: str, t0: float, **details: Any) -> VerifierResult:
    """Crucible could not produce a verdict (its own failure): no reward, excluded from loss."""
    return _result("error", None, t0, details={"reason": reason, **details})


def _zero(dodge: str, reason: str, t0: float | None, **details: Any) -> VerifierResult:
    """The end state earns nothing (the agent's outcome): a score of 0 with its cause."""
    return _result(
        "ok",
        0.0,
        t0,
        components={"reward_file": 0.0},
        details={"dodge": dodge, "reason": reason, "passed": False, **details},
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
    obs: Observation,
    *,
    exit_code: int,
    reward_txt: bytes | None,
    reward_json: bytes | None,
) -> VerifierResult:
    """Turn what was observed and the task's reward file into a result (pure; unit-tested
    directly). See the module docstring for the rule.

    What a tenant sees is built from what the observer saw (counts, a fixed reason): the
    test command's exit code, the reward file's value (unless every observed test passed),
    its problem and its named components, and every agent-written path but the first are
    in ``details["private"]``, since the tests' children can set them to anything they
    read in the run (a trial leaked the hidden expected output as digits of the reward
    file's value, another the hidden tests as reward.json's names). A task whose children
    keep their capabilities (``children_privileged``) is scored with ``trusted = false``.
    """
    private: dict[str, Any] = {"test_exit_code": exit_code}
    details: dict[str, Any] = {"tests": obs.summary(), "private": private}
    if obs.agent_code:
        # The reporting process ran the agent's code: whatever it reported is the agent's word.
        details["agent_code_in_judge"] = list(obs.agent_code[:1])
        private["agent_code_in_judge"] = list(obs.agent_code)
        if check.agent_code_in_judge != "allow":
            reason = (
                "agent-written code ran inside the test process that reports the outcome "
                f"({obs.agent_code[0]}), so the outcome is not evidence; run the code under "
                'test in a subprocess, or declare [crucible] agent_code_in_judge = "allow"'
            )
            return _zero("agent_code_in_judge", reason, None, **details)
        details["trusted"] = False
    if obs.tampered:
        return _zero(
            "tampered",
            f"the test report was tampered with: {obs.tampered}",
            None,
            tampered_report=obs.tampered,
            **details,
        )
    if obs.sessions == 0:
        reason = "no test outcome was observed (pytest did not run, or ended before it began)"
        return _zero("no_tests_observed", reason, None, **details)
    if obs.total == 0:
        return _zero("no_tests", "no tests were collected", None, **details)
    if check.expected_tests is not None and obs.total != check.expected_tests:
        reason = f"expected {check.expected_tests} tests, {obs.total} ran"
        return _zero("test_count", reason, None, **details)
    all_passed = obs.passed == obs.total
    cap = 1.0 if all_passed else (obs.passed / obs.total if check.partial_credit else 0.0)
    if check.reward_source == "exit_code":
        file_reward, comps, problem = (1.0 if exit_code == 0 else 0.0), {}, None
    else:
        file_reward, comps, problem = parse_reward(reward_txt, reward_json)
    if problem or file_reward is None:
        # one public text for every problem: which one it was is the children's to choose
        private["reward_file_problem"] = problem or "no reward"
        return _zero("reward_file", REWARD_FILE_PROBLEM, None, **details)
    reward = min(file_reward, cap)
    # reward.json's names are free text the children may write: never public
    private["reward_file_components"] = {f"file.{k}": v for k, v in comps.items()}
    from_file = {"reward_file": file_reward}
    if check.children_privileged:
        # the tests' children kept every capability: they could read the tests and the
        # keys, so the outcome is theirs to say (a trial's root login shell did)
        details["trusted"] = False
    if file_reward > cap + 1e-9:
        private["reward_file_above_observed"] = True
    components = {
        "observed_cap": cap,
        "tests_total": float(obs.total),
        "tests_passed": float(obs.passed),
    }
    if all_passed:
        components.update(from_file)  # the run earned its reward file: the task's rubric
    else:
        private["reward_file"] = from_file
    details["passed"] = reward >= check.pass_threshold
    return _result("ok", float(reward), None, components=components, details=details)


def verify(
    runtime: SandboxRuntime,
    check: TerminalCheck,
    *,
    episode_container_id: str,
    fresh_sandbox: Callable[[], str],
    dispose: Callable[[str], object] | None = None,
    image: str = "",
    pristine_image: str | None = None,
) -> VerifierResult:
    """Verify the end state of the frozen ``episode_container_id`` (see ``isolation``).

    The episode's container is only diffed and read, never executed in. ``fresh_sandbox()``
    gives the verifier's sandbox (a started, untouched container of the episode's pristine
    image, ``image`` naming it for the toolchain cache); the agent's changes since
    ``pristine_image`` (default: the container's own image) and the tests are replayed onto
    it and the tests run there under Crucible's observer. ``dispose``
    removes it (default: ``runtime.destroy`` inline; the service passes a background
    destroyer). Never raises: Crucible's own failures are ``status=error``.
    """
    t0 = time.perf_counter()
    created: list[str] = []
    marks: dict[str, float] = {}  # each step's wall time in ms, in order (private)
    last = [t0]

    def lap(step: str) -> None:
        now = time.perf_counter()
        marks[step] = round((now - last[0]) * 1e3, 2)
        last[0] = now

    try:
        try:
            # against the pristine image: a sandbox resumed from a checkpoint holds the
            # agent's earlier work in its image's layers, not in its own writable layer
            changes = runtime.diff(
                episode_container_id, base_image=pristine_image, max_entries=DIFF_READ_ENTRIES
            )
        except EndStateUnreadable as e:
            return _zero("unreadable", f"the end state cannot be read: {e.detail}", t0)
        lap("diff")
        vcid = fresh_sandbox()
        created.append(vcid)
        lap("sandbox")
        tools = toolchain.scan(runtime, vcid, image=image or vcid, workdir=check.workdir)
        lap("toolchain")
        plan = plan_changes(changes, protected=tools.protected)
        tampered = {"tampered": list(plan.tampered)}
        if plan.too_big:
            return _zero("too_big", f"the end state is too big to verify: {plan.too_big}", t0)
        pristine_before = time.time_ns()
        secret = Secret.new()
        try:
            _replay(
                runtime,
                plan,
                check,
                source=episode_container_id,
                into=vcid,
                site_dirs=tools.site_dirs,
                private_files=((SECRET_PATH, secret.file_bytes()),),
                base_image=pristine_image,
            )
        except PayloadTooLarge as e:
            limit_mib = (check.max_end_state_bytes or 0) >> 20
            reason = f"the end state exceeds the task's storage limit ({limit_mib} MiB): {e.detail}"
            return _zero("too_big", reason, t0, **tampered)
        except EndStateUnreadable as e:
            return _zero("unreadable", f"the end state cannot be read: {e.detail}", t0, **tampered)
        lap("replay")
        env = verifier_env(check, pristine_before, time.time_ns())
        try:
            res = runtime.exec(
                vcid,
                ExecRequest(
                    cmd=["/bin/bash", "--noprofile", "--norc", "-c", check.test_command],
                    cwd=check.workdir,
                    timeout_s=check.timeout_s,
                    user=ROOT,
                    max_output_bytes=32 << 10,
                    env={k: v.encode() for k, v in env.items()},
                    observe_bytes=OBSERVE_BYTES,
                ),
            )
        except InvalidRequest as e:
            # Crucible wrote this request, so what refuses it is the end state (its workdir,
            # the files the supervisor reads to start the command): the agent's 0.
            if e.field == "cwd":
                reason = f"the workdir {check.workdir} is not a directory in the end state"
                return _zero("workdir_gone", reason, t0, **tampered)
            reason = f"the end state refused the test command ({e.field}): {e.detail}"
            return _zero("exec_refused", reason, t0, **tampered)
        except SandboxError as e:
            if not runtime.ping():
                raise  # the engine is gone: Crucible's failure, not the end state's
            # The engine answers, but the command's handler went away mid-run: something
            # the tests ran killed it (a trial's child killed its crucible-exec).
            reason = f"the test command's supervisor was lost while the tests ran: {e.detail}"
            return _zero("supervisor_lost", reason, t0, **tampered)
        if res.handler_lost:  # the same, told by the runtime as the command's result
            reason = "the test command's supervisor was lost while the tests ran"
            return _zero("supervisor_lost", reason, t0, **tampered)
        lap("tests")
        log_tail = (res.stdout[-4000:] + res.stderr[-2000:]).decode("utf-8", "replace")
        private: dict[str, Any] = {"log_tail": log_tail, "timing_ms": marks}
        if res.timed_out:
            reason = f"the tests exceeded their {check.timeout_s} s limit"
            return _zero("timeout", reason, t0, private=private, **tampered)
        if res.signal or res.oom_killed or res.exit_code in (128 + 9, 128 + 15):
            oom = " (out of memory)" if res.oom_killed else ""
            # the signal's number stays private: the tests' children choose it (a trial
            # sent SIGRTMIN+d to the test command to show a digit of the hidden output)
            private.update(signal=res.signal, exit_code=res.exit_code)
            reason = f"the test command was killed{oom}"
            return _zero("killed", reason, t0, private=private, **tampered)
        try:
            files = _read_logs(runtime, vcid)
        except CrucibleError as e:
            if not runtime.ping():
                raise
            # what the tests' run did to /logs/verifier (a trial made it a symlink loop)
            reason = f"the test report directory cannot be read: {e.detail}"
            return _zero("report_unreadable", reason, t0, private=private, **tampered)
        lap("report")
        obs = judge(res.observed, secret, truncated=res.observed_truncated)
        private["tests"] = dict(list(obs.tests.items())[:2000])
        private["tests_ms"] = round(res.duration_ms, 3)  # the children can stretch it
        private["leftovers_killed"] = obs.leftovers
        result = score(
            check,
            obs,
            exit_code=res.exit_code,
            reward_txt=files["reward.txt"],
            reward_json=files["reward.json"],
        )
        if check.fetches_tools and result.details.get("dodge") == "no_tests_observed":
            # Only for a task that declares it installs its tools at verify time: anywhere
            # else, output that looks like a network failure is the end state's to print,
            # and would turn its 0 into an error excluded from loss.
            offline = offline_reason(res.stdout + b"\n" + res.stderr)
            if offline is not None:  # the tests could not fetch their tools: not a score
                return _unscored(offline, t0, offline=True, private=private, **tampered)
        details = {
            **result.details,
            **tampered,
            "toolchain_scanned": tools.complete,
            "private": {**private, **result.details.get("private", {})},
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
        return _unscored(f"verifier infrastructure failed: {e.detail}", t0)
    finally:
        for cid in created:
            (dispose or runtime.destroy)(cid)


def offline_reason(output: bytes) -> str | None:
    """Why tests that never ran could not: their output shows a network (or certificate)
    failure, as a ``test.sh`` that installs its tools at verify time does where the verifier
    has no network (``service.tasks.verifier_network``). None otherwise."""
    kind = classify(output[-(1 << 20) :].decode("utf-8", "replace"))
    if kind == "network":
        return (
            "verifier_offline: the tests failed to reach the network before any test ran "
            "(installing their tools?); the verifier has no network unless the install sets "
            "CRUCIBLE_VERIFIER_NETWORK and the task asks ([verifier] network = true)"
        )
    if kind == "tls":
        return (
            "verifier_tls: the tests could not verify a certificate before any test ran; "
            "set CRUCIBLE_VERIFIER_CA_BUNDLE"
        )
    return None


def verifier_env(check: TerminalCheck, pristine_before: int, agent_until: int) -> dict[str, str]:
    """The test command's environment: the task's, then Crucible's (which wins): no user
    site, plugin autoload off (restored for nested runs unless the task set it), the
    observer plugin, and the window of change times that mark the end state's files (from
    before the replay to the test command's start: ``crucible_guard``), and the loader's
    audit library (``LD_AUDIT``: no agent-written shared object loads, and no agent-written
    program keeps its capabilities, in a process holding ``CAP_DAC_OVERRIDE``; left out
    when the task declares ``agent_code_in_judge = "allow"`` or ``children_privileged``),
    and ``HOME`` (the task's, else ``/root``; never the end state's passwd). No secret: the
    session keys travel in a file the plugin consumes (``observe.SECRET_PATH``)."""
    env = {**check.env, **VERIFIER_ENV, "HOME": check.env.get("HOME", "/root")}
    plugins = [p for p in check.env.get("PYTEST_PLUGINS", "").split(",") if p.strip()]
    env["PYTEST_PLUGINS"] = ",".join(["crucible_observer", *plugins])
    env["CRUCIBLE_CHILDREN_PRIVILEGED"] = "1" if check.children_privileged else "0"
    if "PYTEST_DISABLE_PLUGIN_AUTOLOAD" not in check.env:
        env["CRUCIBLE_RESTORE_AUTOLOAD"] = "1"
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    path = check.env.get("PYTHONPATH", "")
    env["PYTHONPATH"] = f"{path}:{OBSERVER_PATH}" if path else OBSERVER_PATH
    if check.agent_code_in_judge != "allow" and not check.children_privileged:
        # no agent-written native code in a process with the verifier's rights (a task
        # that trusts the agent's code in those processes has declared it)
        audit = check.env.get("LD_AUDIT", "")
        env["LD_AUDIT"] = f"{AUDIT_LIBRARY}:{audit}" if audit else AUDIT_LIBRARY
    env["CRUCIBLE_PRISTINE_BEFORE"] = str(pristine_before)
    env["CRUCIBLE_AGENT_WRITTEN_UNTIL"] = str(agent_until)
    return env


def _replay(
    runtime: SandboxRuntime,
    plan: ChangePlan,
    check: TerminalCheck,
    *,
    source: str,
    into: str,
    site_dirs: tuple[str, ...] = (),
    private_files: tuple[tuple[str, bytes], ...] = (),
    base_image: str | None = None,
) -> None:
    """Make ``into`` hold the episode's end state (outside protected paths) plus the tests:
    removals first (the pristine toolchain's ``rm``, paths NUL-separated on stdin), then one
    archive with the changed entries read from ``source`` (as diffed against
    ``base_image``), the tests and the verifier's ``.pth`` in ``site_dirs``.

    Raises ``PayloadTooLarge`` (the changed files exceed ``check.max_end_state_bytes``),
    ``EndStateUnreadable``, or another ``CrucibleError`` (the removal failed, the engine
    refused the archive).
    """
    if plan.delete:
        res = runtime.exec(
            into,
            ExecRequest(
                cmd=["xargs", "-0", "-r", "rm", "-rf", "--"],
                stdin=b"\0".join(os.fsencode(p) for p in plan.delete) + b"\0",
                timeout_s=60,
                user=ROOT,
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
            entries = runtime.export_entries(
                source, plan.copy, max_bytes=check.max_end_state_bytes, base_image=base_image
            )
            for info, reader in entries:
                t.addfile(info, _EndStateFile(reader, info) if reader is not None else None)
            # /tests and /logs are protected (never replayed): fresh tests and an empty
            # /logs/verifier go in last.
            add_tests(t, check.tests_dir, check.extra_files, site_dirs, private_files)
        # nothing but Crucible touched the sandbox, so its own tar may extract a small
        # archive (sent whole, over the exec channel) when the diff marked type changes
        # (removed above: GNU tar, unlike the engine, will not put a file over a
        # directory); a larger one, or an unmarked diff, goes to the engine (trial 25)
        small = buf.tell() <= PRISTINE_TAR_BYTES and runtime.marks_type_changes(source)
        buf.seek(0)
        try:
            runtime.put_archive(into, "/", buf, pristine_tar=small)
        except (Conflict, InvalidRequest) as e:
            # The archive holds the end state's entries, and the pristine filesystem refuses
            # them (a directory where the image has a file, which the engine's own diff in
            # a deployment without the host's layers cannot mark): the end state's doing.
            raise EndStateUnreadable(
                f"the end state cannot be replayed onto the task image: {e.detail}"
            ) from e


class _EndStateFile:
    """A file of the frozen end state as the replay's archive reads it: a read that fails,
    or that ends before the size its entry recorded (trial 24: a file that reads shorter
    made ``tarfile`` raise ``OSError``, a verifier error), is the end state's
    (``EndStateUnreadable``); failures writing the archive stay Crucible's."""

    def __init__(self, inner: Any, info: tarfile.TarInfo) -> None:
        self._inner, self._info, self._left = inner, info, info.size

    def read(self, n: int = -1) -> bytes:
        """Up to ``n`` bytes; raises ``EndStateUnreadable`` as above."""
        try:
            data = self._inner.read(n)
        except OSError as e:
            raise EndStateUnreadable(f"reading {self._info.name} failed: {e}") from e
        wanted = min(n, self._left) if n >= 0 else self._left
        self._left -= len(data)
        if len(data) < wanted:
            raise EndStateUnreadable(f"{self._info.name} changed while it was read")
        return data


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
        fetches_tools=task.verifier_network,
        agent_code_in_judge=task.agent_code_in_judge,
        children_privileged=task.children_privileged,
    )


def verify_episode(task: Task, end: EndState) -> VerifierResult:
    """Registry entry: verify ``task``'s end state with its tests."""
    return verify(
        end.runtime,
        check_for(task),
        episode_container_id=end.episode_container_id,
        fresh_sandbox=end.fresh_sandbox,
        dispose=end.dispose,
        image=end.template.image,
        pristine_image=end.pristine_image,
    )


register(NAME, verify_episode)
