"""The terminal verifier's pure parts: reward parsing, the observation's verdict, scoring,
the toolchain scan and change planning."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from service.runtime.base import FsChange
from service.verifiers.isolation import MAX_CHANGED_ENTRIES, is_protected, plan_changes
from service.verifiers.observe import Observation, Secret, judge
from service.verifiers.terminal import TerminalCheck, parse_reward, score
from service.verifiers.toolchain import parse_scan

CHECK = TerminalCheck(
    test_command="bash /tests/test.sh",
    tests_dir=Path("."),
    workdir="/app",
    timeout_s=60,
    expected_tests=3,
)
SECRET = Secret.new()


def line(event: str, s: int = 0, nonce: str | None = None, **fields: object) -> bytes:
    rec = {"k": SECRET.nonce if nonce is None else nonce, "s": s, "e": event, "p": 7, **fields}
    return json.dumps(SECRET.sign(rec)).encode() + b"\n"


def session(
    *outcomes: str,
    pass_canary: str = "passed",
    fail_canary: str = "failed",
    s: int = 0,
    end: bool = True,
) -> bytes:
    out = line("start", s)
    for i, o in enumerate(outcomes):
        out += line("test", s, id=f"t.py::test_{i}", o=o)
    if outcomes:
        out += line("test", s, id="t.py::test_0_edge3", o=pass_canary, c="pass")
        out += line("test", s, id="t.py::test_1_case2", o=fail_canary, c="fail")
    return out + (line("end", s, exitstatus=0) if end else b"")


def observed(*outcomes: str) -> Observation:
    return judge(session(*outcomes), SECRET)


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
    ("txt", "js"),
    [
        (None, None),
        (b"yes", None),
        (b"nan", None),
        (b"1e308", None),  # stored as a reward once (issue 9): out of [0, 1]
        (b"-0.5", None),
        (None, b"[1]"),
        (None, b"{}"),
        (None, b'{"reward": NaN}'),
        (None, b'{"reward": 1, "x": "str"}'),
        (None, b'{"reward": true}'),
        (None, b'{"reward": {"nested": 1}}'),
        (None, b"[" * 100_000 + b"]" * 100_000),
        (None, json.dumps({f"k{i}": 1 for i in range(40)}).encode()),
        (None, json.dumps({"x" * 65: 1}).encode()),
        # a component name that would make the record unstorable (verify answered 400 on
        # every retry, blaming the worker's trajectory: issue 9)
        (None, b'{"reward": 1, "\\ud800": 1}'),
        (None, b'{"reward": 1, "a\\nb": 1}'),
    ],
)
def test_unusable_reward_files_are_problems(txt: bytes | None, js: bytes | None) -> None:
    reward, _, problem = parse_reward(txt, js)
    assert reward is None and problem


def test_all_pass_scores_one() -> None:
    r = score(
        CHECK,
        observed("passed", "passed", "passed"),
        exit_code=0,
        reward_txt=b"1",
        reward_json=None,
    )
    assert (r.status, r.reward, r.details["passed"]) == ("ok", 1.0, True)
    assert r.components["tests_total"] == 3 and r.components["observed_cap"] == 1.0


def test_a_reward_file_never_beats_the_observed_outcome() -> None:
    # issue 9, class 1: code the tests ran wrote {"reward": 1.0} while tests failed
    obs = observed("passed", "failed", "failed")
    r = score(CHECK, obs, exit_code=1, reward_txt=None, reward_json=b'{"reward": 1.0}')
    assert (r.status, r.reward) == ("ok", 0.0)
    assert r.details["private"]["reward_file_above_observed"] is True
    partial = TerminalCheck(**{**CHECK.__dict__, "partial_credit": True})
    r = score(partial, obs, exit_code=1, reward_txt=b"1", reward_json=None)
    assert r.reward == pytest.approx(1 / 3)
    r = score(
        CHECK,
        observed("passed", "passed", "passed"),
        exit_code=0,
        reward_txt=b"0.5",
        reward_json=None,
    )
    assert r.reward == 0.5  # the task's own rubric may still lower it


@pytest.mark.parametrize(
    ("raw", "dodge"),
    [
        (session("passed", "passed", "passed", fail_canary="passed"), "tampered"),
        (session("passed", "passed", "passed", pass_canary="failed"), "tampered"),
        (session("passed", "passed", "passed", end=False), "tampered"),  # exited early
        (session("passed", "passed", "passed") + line("test", id="x", o="passed"), "tampered"),
        (session("passed", "passed", "passed", fail_canary="xfailed"), "tampered"),
        (line("test", nonce="guess", id="x", o="passed") + session("passed"), "tampered"),
        (b"not json\n" + session("passed", "passed", "passed"), "tampered"),
        (b"", "no_tests_observed"),
        (session(), "no_tests"),
        (session("passed", "passed"), "test_count"),
    ],
    ids=[
        "must-fail-passed",
        "must-pass-failed",
        "no-end",
        "after-end",
        "xfail-canary",
        "foreign-line",
        "garbage",
        "nothing",
        "none-collected",
        "wrong-count",
    ],
)
def test_bent_or_missing_reports_score_zero(raw: bytes, dodge: str) -> None:
    r = score(CHECK, judge(raw, SECRET), exit_code=0, reward_txt=b"1", reward_json=None)
    assert (r.status, r.reward, r.details["dodge"]) == ("ok", 0.0, dodge)


def test_lines_need_a_session_key() -> None:
    # Red-team trial finding: a script the tests ran opened the shell's fd 3 through /proc,
    # read the secret from the shell's environment, closed the real session with a forged
    # "end" and started a passing one under the same pid. Now every line is signed with a
    # session key the shell never had, and a key starts one session only.
    good = session("passed", "passed", "passed")
    forged = {"k": SECRET.nonce, "s": 0, "e": "end", "p": 7, "m": "0" * 64}
    assert judge(good + json.dumps(forged).encode(), SECRET).tampered
    other = Secret.new()
    resigned = good.replace(SECRET.nonce.encode(), other.nonce.encode())
    assert judge(resigned, SECRET).tampered
    restarted = session("passed", "failed", "failed", end=False) + line("end") + good
    assert judge(restarted, SECRET).tampered == "a test session started twice"
    # a fake extra session cannot hide a real failure
    extra = session("passed", "failed", "passed", s=0) + session("passed", "passed", "passed", s=1)
    obs = judge(extra, SECRET)
    assert (obs.tampered, obs.passed, obs.total) == (None, 2, 3)


def test_two_sessions_pass_only_when_both_do() -> None:
    raw = session("passed", "passed", "passed", s=0) + session("passed", "failed", "passed", s=1)
    obs = judge(raw, SECRET)
    assert (obs.tampered, obs.sessions, obs.total, obs.passed) == (None, 2, 3, 2)
    assert judge(b"x" * 10, SECRET, truncated=True).tampered


def test_exit_code_reward_source() -> None:
    tb1 = TerminalCheck(
        test_command="bash /tests/run-tests.sh",
        tests_dir=Path("."),
        workdir="/app",
        timeout_s=60,
        reward_source="exit_code",
    )
    ok = observed("passed")
    assert score(tb1, ok, exit_code=0, reward_txt=None, reward_json=None).reward == 1.0
    assert score(tb1, ok, exit_code=1, reward_txt=None, reward_json=None).reward == 0.0
    bad = observed("failed")
    assert score(tb1, bad, exit_code=0, reward_txt=None, reward_json=None).reward == 0.0


def test_toolchain_scan_finds_venvs_sites_and_path_but_never_the_workdir() -> None:
    out = "\n".join(
        [
            "/opt/verifier-venv/pyvenv.cfg",
            "/opt/verifier-venv/lib/python3.11/site-packages",
            "/usr/lib/python3/dist-packages",
            "/app/.venv/pyvenv.cfg",
            "/srv/tools/site-packages",
            "PATH=/opt/verifier-venv/bin:/usr/local/bin:/app/bin:/app:/:.:/home/x/bin",
            "LD_LIBRARY_PATH=/opt/lib",
        ]
    )
    tc = parse_scan(out, "/app")
    assert tc.protected == (
        "/app/.venv",
        "/home/x/bin",
        "/opt/lib",
        "/opt/verifier-venv",
        "/opt/verifier-venv/bin",
        "/opt/verifier-venv/lib/python3.11/site-packages",
        "/srv/tools/site-packages",
        "/usr/lib/python3/dist-packages",
        "/usr/local/bin",
    )
    assert "/srv/tools/site-packages" in tc.site_dirs
    assert is_protected("/opt/verifier-venv/bin/python3", tc.protected)
    assert not is_protected("/app/bin/run", tc.protected)


def test_huge_or_deep_end_states_are_not_replayed() -> None:
    many = [FsChange(f"/app/f{i}", "added") for i in range(MAX_CHANGED_ENTRIES + 1)]
    assert "changed entries" in (plan_changes(many).too_big or "")
    deep = [FsChange("/app/" + "d/" * 2000 + "f", "added")]
    assert "longer than" in (plan_changes(deep).too_big or "")
    assert plan_changes(many[:10]).too_big is None


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


def test_type_changes_are_removed_before_the_copy() -> None:
    plan = plan_changes(
        [
            FsChange("/etc", "modified"),
            FsChange("/etc/was-file", "modified", replaced=True),
            FsChange("/etc/was-file/inside", "added"),
            FsChange("/etc/was-dir", "modified", replaced=True),
        ],
    )
    assert plan.delete == ("/etc/was-dir", "/etc/was-file")
    assert plan.copy == ("/etc/was-dir", "/etc/was-file/inside")


def test_an_outcome_from_a_process_that_ran_agent_code_is_not_evidence() -> None:
    """``agent_code`` lines (sent before the agent's code runs, even before ``start``)
    make every outcome of the run the agent's word: 0 by default, whatever was reported."""
    raw = line("agent_code", path="/app/pkg/__init__.py", how="exec") + session(
        "passed", "passed", "passed"
    )
    obs = judge(raw, SECRET)
    assert obs.agent_code == ["/app/pkg/__init__.py"] and obs.tampered is None
    r = score(CHECK, obs, exit_code=0, reward_txt=b"1", reward_json=None)
    assert (r.status, r.reward, r.details["dodge"]) == ("ok", 0.0, "agent_code_in_judge")
    assert r.details["agent_code_in_judge"] == ["/app/pkg/__init__.py"]
    # a task that must import the agent's code opts in: scored, and marked untrusted
    allow = TerminalCheck(**{**CHECK.__dict__, "agent_code_in_judge": "allow"})
    r = score(allow, obs, exit_code=0, reward_txt=b"1", reward_json=None)
    assert (r.reward, r.details["trusted"]) == (1.0, False)
    # the line counts wherever it comes, and an unsigned one is tampering, not a pass
    late = session("passed", "passed", "passed")
    late += line("agent_code", path="/app/x.py", how="exec")
    assert judge(late, SECRET).agent_code == ["/app/x.py"]
    forged = session("passed", "passed", "passed") + line(
        "agent_code", nonce="n0", path="/app/x.py", how="exec"
    )
    assert judge(forged, SECRET).tampered


def test_an_interrupted_session_is_tampered() -> None:
    """A trial's child process sent SIGINT to the judge once its forgery was in place;
    pytest then ended the session "cleanly" with exit status 2."""
    raw = line("start") + line("test", id="t.py::test_0", o="passed")
    raw += line("test", id="t.py::test_0_edge3", o="passed", c="pass")
    raw += line("test", id="t.py::test_1_case2", o="failed", c="fail")
    raw += line("end", exitstatus=2)
    assert judge(raw, SECRET).tampered == "the test session was interrupted"


def test_configuration_that_loads_native_code_is_the_images() -> None:
    """A trial loaded its own library into the test command's bash through
    ``nsswitch.conf`` (a service name may be a path) and into the judge through
    ``openssl.cnf``: the loaders' configuration is toolchain, never replayed, and so is any
    ancestor of it that the agent replaced; the data they read stays the agent's."""
    plan = plan_changes(
        [
            FsChange("/etc", "modified"),
            FsChange("/etc/nsswitch.conf", "modified"),
            FsChange("/etc/passwd", "modified"),
            FsChange("/etc/pam.d", "modified"),
            FsChange("/etc/pam.d/common-session", "modified"),
            FsChange("/etc/ssl", "modified", replaced=True),
            FsChange("/etc/pkcs11", "added"),
        ],
    )
    assert plan.copy == ("/etc/passwd",)
    assert set(plan.tampered) == {
        "/etc/nsswitch.conf",
        "/etc/pam.d/common-session",
        "/etc/ssl",
        "/etc/pkcs11",
    }
    # a modified ancestor the engine cannot say was replaced (no children listed) is a
    # leaf: not carried over either
    assert plan_changes([FsChange("/etc/ssl", "modified")]).tampered == ("/etc/ssl",)


@pytest.mark.parametrize(
    ("txt", "js"),
    [
        (b"test_hidden_dataset_a,test_hidden_b|- Old Town\t607904.45", None),
        (None, b'{"test_hidden_dataset_a": "x"}'),
        (None, b'{"test_hidden_dataset_a": Infinity}'),
    ],
)
def test_a_reward_files_problem_never_quotes_it(txt: bytes | None, js: bytes | None) -> None:
    # A fifth trial: a daemon the tests' child left copied the JUnit report (hidden test
    # names, the expected output in an assertion diff) into reward.txt, and the public
    # reason quoted its first 80 bytes.
    reward, _, problem = parse_reward(txt, js)
    assert reward is None and problem is not None
    assert "hidden" not in problem and "Old Town" not in problem, problem


@pytest.mark.parametrize(
    ("txt", "js"),
    [
        (b"6079044560542309", None),  # digits of the hidden expected report, out of range
        (b"0.6079044560542309", None),  # the same digits as a valid reward file
        (None, b'{"reward": 0.6079044560542309, "x": 0.605423}'),
        (None, b'{"reward": 60790445605}'),
        (None, b'{"reward": 1, "6079044560542309": 1'),  # a parse error's position
        (b"x" * 60790, None),  # a length
    ],
)
def test_what_a_failed_run_shows_of_its_reward_file_is_fixed(
    txt: bytes | None, js: bytes | None
) -> None:
    """A fifth trial's daemon wrote hidden expected output into ``reward.txt`` as a number:
    its value reached the public ``reward_file`` component and the out-of-range reason.
    Without every observed test passed, nothing read from the file is public."""
    obs = observed("passed", "failed", "failed")
    r = score(CHECK, obs, exit_code=1, reward_txt=txt, reward_json=js)
    assert (r.status, r.reward) == ("ok", 0.0)
    public = {k: v for k, v in r.details.items() if k != "private"}
    shown = json.dumps([public, r.components])
    assert "6079" not in shown and "60790" not in shown and "6054" not in shown, shown
    assert set(r.components) <= {"reward_file", "observed_cap", "tests_total", "tests_passed"}
    assert r.components.get("reward_file", 0.0) == 0.0
    assert "test_exit_code" not in public


def test_a_reward_files_names_and_problems_are_never_public() -> None:
    """A sixth trial wrote the hidden test file into reward.json's names (31 keys of 64
    characters) on a run whose tests all passed, and told digits apart by which reward file
    problem the record named. The names and the problem are private; the value is public
    only when every observed test passed."""
    r = score(
        CHECK,
        observed("passed", "passed", "passed"),
        exit_code=0,
        reward_txt=None,
        reward_json=b'{"reward": 0.75, "def test_hidden(): assert x == 607904": 0.5}',
    )
    assert r.reward == 0.75
    assert r.components == {
        "observed_cap": 1.0,
        "tests_total": 3.0,
        "tests_passed": 3.0,
        "reward_file": 0.75,
    }
    assert "607904" not in json.dumps({k: v for k, v in r.details.items() if k != "private"})
    assert r.details["private"]["reward_file_components"] == {
        "file.reward": 0.75,
        "file.def test_hidden(): assert x == 607904": 0.5,
    }
    reasons = set()
    for txt in (b"x", b"7", b"nan", None):
        z = score(
            CHECK,
            observed("passed", "failed", "failed"),
            exit_code=1,
            reward_txt=txt,
            reward_json=None,
        )
        reasons.add(z.details["reason"])
        assert z.details["private"]["reward_file_problem"]
    assert len(reasons) == 1, reasons


def test_a_task_whose_children_keep_their_capabilities_is_not_evidence() -> None:
    """A sixth trial's root login shell (``runuser -l`` of a uid-0 alias in the end state's
    passwd, on a task that keeps its children's capabilities) read the tests and wrote the
    reward: such a run's records say ``trusted = false``."""
    privileged = TerminalCheck(**{**CHECK.__dict__, "children_privileged": True})
    obs = observed("passed", "passed", "passed")
    r = score(privileged, obs, exit_code=0, reward_txt=b"1", reward_json=None)
    assert (r.reward, r.details["trusted"]) == (1.0, False)
    assert (
        "trusted" not in score(CHECK, obs, exit_code=0, reward_txt=b"1", reward_json=None).details
    )


def test_a_file_that_reads_short_in_the_replay_is_the_end_states() -> None:
    # Trial 24: a file that reads shorter than its entry's size made tarfile raise OSError
    # in the replay (a verifier error, out of the loss); a failed read likewise.
    import io
    import tarfile

    from service.runtime.base import EndStateUnreadable
    from service.verifiers.terminal import _EndStateFile

    class Failing(io.BytesIO):
        def read(self, n: int = -1) -> bytes:
            raise OSError(5, "Input/output error")

    for reader in (io.BytesIO(b"x" * 5), Failing()):
        info = tarfile.TarInfo("app/out.txt")
        info.size = 10
        with (
            tarfile.open(fileobj=io.BytesIO(), mode="w") as t,
            pytest.raises(EndStateUnreadable, match="app/out.txt"),
        ):
            t.addfile(info, _EndStateFile(reader, info))
    info = tarfile.TarInfo("app/whole.txt")
    info.size = 70_000  # more than one of tarfile's blocks
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        t.addfile(info, _EndStateFile(io.BytesIO(b"y" * 70_000), info))
    buf.seek(0)
    with tarfile.open(fileobj=buf) as t:
        assert t.extractfile("app/whole.txt").read() == b"y" * 70_000
