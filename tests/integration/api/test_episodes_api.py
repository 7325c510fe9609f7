"""Episodes end to end: a real task image, the oracle and a no-op, isolation against
reward hacking, GRPO groups, verifier timeouts, reward export."""

from __future__ import annotations

import io
import json
import tarfile
import textwrap
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from service.tasks.loader import load_suite
from tests.integration.api.conftest import Stack
from tests.integration.api.test_sandboxes_api import assert_problem, run

pytestmark = pytest.mark.docker

TASKS = Path(__file__).resolve().parents[3] / "tasks" / "terminal"
TASK = "word-frequency-top20"
TRAJ = {"policy": {"name": "test", "version": "1"}}


def start(stack: Stack, task: str = TASK, **body: Any) -> dict[str, Any]:
    r = stack.alice.post("/v1/episodes", json={"task_id": task, "suite": "terminal", **body})
    assert r.status_code == 201, r.text
    return r.json()


def run_oracle(stack: Stack, ep: dict[str, Any], task: str = TASK) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        t.add(str(TASKS / task / "solution"), arcname=".")
    r = stack.alice.put(
        f"/v1/sandboxes/{ep['sandbox_id']}/files",
        params={"path": "/solution"},
        content=buf.getvalue(),
        headers={"content-type": "application/x-tar"},
    )
    assert r.status_code == 200, r.text
    out = run(stack.alice, ep["sandbox_id"], "bash /solution/solve.sh", cwd=ep["workdir"])
    assert out["exit_code"] == 0, (out["stdout"], out["stderr"])


def verify(stack: Stack, ep: dict[str, Any], **traj: Any) -> dict[str, Any]:
    r = stack.alice.post(f"/v1/episodes/{ep['id']}/verify", json={**TRAJ, **traj})
    assert r.status_code == 200, r.text
    return r.json()


def test_tasks_are_listed_without_tests_or_solutions(stack: Stack) -> None:
    body = stack.alice.get("/v1/tasks", params={"suite": "terminal"}).json()
    assert len(body["tasks"]) >= 20 and body["errors"] == []
    t = next(t for t in body["tasks"] if t["id"] == TASK)
    assert t["workdir"] == "/app" and "solve" not in json.dumps(t).lower()


def test_oracle_scores_one_and_noop_zero(stack: Stack) -> None:
    ep = start(stack)["episodes"][0]
    run_oracle(stack, ep)
    rec = verify(stack, ep, turns=[{"action": "bash /solution/solve.sh", "exit_code": 0}])
    assert (rec["reward"], rec["verifier"]["status"], rec["exclude_from_loss"]) == (
        1.0,
        "ok",
        False,
    )
    assert rec["reward_components"]["tests_total"] == 5 and rec["task_id"] == TASK
    assert rec["verifier"]["details"]["tampered"] == []
    assert rec["timing"]["verify_ms"] > 0 and rec["timing"]["lease_ms"] > 0
    # the agent's sandbox is released once verified; a repeat returns the same record
    assert stack.alice.get(f"/v1/sandboxes/{ep['sandbox_id']}").json()["state"] == "released"
    assert verify(stack, ep)["record_id"] == rec["record_id"]
    noop = start(stack)["episodes"][0]
    rec0 = verify(stack, noop, stop_reason="complete")
    assert (rec0["reward"], rec0["verifier"]["status"]) == (0.0, "ok")


HACKS = {
    # a pytest shadow in the workdir
    "shadow": "mkdir -p /app/_pytest && printf 'import sys; sys.exit(0)\\n' > /app/pytest.py",
    # a root conftest that turns every failure into a pass
    "conftest": "printf 'import pytest\\n@pytest.hookimpl(hookwrapper=True)\\n"
    "def pytest_runtest_makereport(item, call):\\n    o = yield\\n    r = o.get_result()\\n"
    '    r.outcome = "passed"\\n\' > /conftest.py',
    # patch the toolchain: python3 now writes a pass and exits
    "toolchain": "mv /usr/bin/python3 /usr/bin/python3.real && printf '#!/bin/sh\\n"
    "mkdir -p /logs/verifier; echo 1 > /logs/verifier/reward.txt\\n' > /usr/bin/python3 "
    "&& chmod +x /usr/bin/python3",
    # pre-plant the reward and a forged report
    "planted": "mkdir -p /logs/verifier && echo 1 > /logs/verifier/reward.txt",
    # a sourceless module that shadows the stdlib's pprint (imported by pytest)
    "pyc": "python3 -c \"import py_compile, pathlib; pathlib.Path('/tmp/pprint.py')"
    ".write_text('import sys'); py_compile.compile('/tmp/pprint.py', cfile='/app/pprint.pyc')\"",
    # an entry-point pytest plugin registered through distribution metadata in the workdir
    "plugin": "mkdir -p /app/zz-1.0.dist-info && printf 'Metadata-Version: 2.1\\nName: zz\\n"
    "Version: 1.0\\n' > /app/zz-1.0.dist-info/METADATA && printf '[pytest11]\\nzz = zz_plugin\\n' "
    "> /app/zz-1.0.dist-info/entry_points.txt && echo 'x = 1' > /app/zz_plugin.py",
    # a start-up file that a login shell would run
    "profile": "echo 'echo 1 > /logs/verifier/reward.txt; exit 0' > /etc/profile.d/zz.sh",
    # pytest's hidden root config loading a workdir plugin (found by a new-user trial)
    "dot-pytest-ini": "printf '[pytest]\\naddopts = -p evilplug\\n' > /.pytest.ini && printf "
    "'import pytest\\n@pytest.hookimpl(hookwrapper=True)\\ndef pytest_runtest_makereport(item, "
    'call):\\n    o = yield\\n    o.get_result().outcome = "passed"\\n\' > /app/evilplug.py',
    # attrs' module in the workdir: pytest 7.2 imports it at start-up (new-user trial)
    "attr": 'printf \'import os\\nos.environ["PYTEST_PLUGINS"] = "evilplug"\\n\' > /app/attr.py',
    # sparse files far beyond the task's storage limit (2048 MiB) in total: no 3 GiB copy
    # is made (each stays under the per-file size limit the disk budget sets at write time)
    "sparse": "truncate -s 1500M /app/big1 && truncate -s 1500M /app/big2",
    # no workdir at all: the agent's outcome (0), not a verifier error
    "no-workdir": "rm -rf /app",
}
DODGES = {"sparse": "too_big", "no-workdir": "workdir_gone"}


@pytest.mark.parametrize("hack", sorted(HACKS))
def test_reward_hacks_score_zero(stack: Stack, hack: str) -> None:
    ep = start(stack)["episodes"][0]
    out = run(stack.alice, ep["sandbox_id"], HACKS[hack])
    assert out["exit_code"] == 0, (out["stdout"], out["stderr"])
    t0 = time.monotonic()
    rec = verify(stack, ep)
    assert (rec["reward"], rec["verifier"]["status"]) == (0.0, "ok"), rec["verifier"]
    details = rec["verifier"]["details"]
    if hack in ("conftest", "toolchain", "planted", "profile", "dot-pytest-ini"):
        assert details["tampered"], details
    if hack in DODGES:
        assert details["dodge"] == DODGES[hack], details
    assert time.monotonic() - t0 < 30  # the sparse file is refused, not copied


def test_oracle_still_passes_after_a_harmless_toolchain_touch(stack: Stack) -> None:
    ep = start(stack)["episodes"][0]
    run_oracle(stack, ep)
    run(stack.alice, ep["sandbox_id"], "touch /usr/bin/zz-agent-tool; rm -f /app/corpus/.keep")
    rec = verify(stack, ep)
    assert rec["verifier"]["details"]["tampered"] == ["/usr/bin/zz-agent-tool"]
    assert rec["reward"] == 1.0  # the work outside the toolchain was carried over


def test_group_members_start_identical_from_the_task_image(stack: Stack) -> None:
    # Trial finding: groups forked from a snapshot of a prepared sandbox, which a tenant
    # could exec into before it was snapshotted; what it planted became the image the
    # verifier took as pristine (1.0 on six tasks unsolved). Every member and every
    # verification now start from the task image itself.
    listed_before = {sb["id"] for sb in stack.alice.get("/v1/sandboxes").json()["sandboxes"]}
    group = start(stack, group_size=3)
    eps = group["episodes"]
    listed = {sb["id"] for sb in stack.alice.get("/v1/sandboxes").json()["sandboxes"]}
    assert listed - listed_before == {e["sandbox_id"] for e in eps}  # nothing else was made
    assert [e["sample_idx"] for e in eps] == [0, 1, 2]
    assert len({e["sandbox_id"] for e in eps}) == 3 and {e["group_id"] for e in eps} == {
        group["group_id"]
    }
    sums = [
        run(stack.alice, e["sandbox_id"], "cat /app/corpus/*.txt | md5sum")["stdout"] for e in eps
    ]
    assert len(set(sums)) == 1
    run_oracle(stack, eps[1])
    recs = [verify(stack, e) for e in eps]
    assert [r["reward"] for r in recs] == [0.0, 1.0, 0.0]
    assert {r["group_id"] for r in recs} == {group["group_id"]}
    template = next(t for t in stack.ctx.templates.all() if t.name.endswith(TASK))
    assert {r["image_digest"] for r in recs} == {stack.ctx.runtime.image_digest(template.image)}
    r = stack.alice.get("/v1/rewards/export", params={"format": "parquet", "normalize": "grpo"})
    table = pq.read_table(io.BytesIO(r.content)).to_pylist()
    adv = {
        row["sample_idx"]: row["advantage"] for row in table if row["group_id"] == group["group_id"]
    }
    assert adv[1] > 0 > adv[0] and adv[0] == pytest.approx(adv[2])


def test_invalid_trajectory_names_field_and_episode_stays_verifiable(stack: Stack) -> None:
    ep = start(stack)["episodes"][0]
    r = stack.alice.post(
        f"/v1/episodes/{ep['id']}/verify",
        json={**TRAJ, "response_ids": [1, 2, 3], "loss_mask": [1]},
    )
    assert_problem(r, 400, "loss_mask")
    assert verify(stack, ep, response_ids=[1, 2], loss_mask=[1, 0])["reward"] == 0.0
    assert_problem(stack.bob.post(f"/v1/episodes/{ep['id']}/verify", json=TRAJ), 404)


def test_unencodable_trajectory_text_is_refused_and_exports_keep_working(stack: Stack) -> None:
    # Regression: a lone surrogate in a turn was stored, then every export of the tenant 500ed.
    ep = start(stack)["episodes"][0]
    body = b'{"policy": {"name": "x"}, "turns": [{"action": "\\ud800"}]}'
    r = stack.alice.post(
        f"/v1/episodes/{ep['id']}/verify",
        content=body,
        headers={"content-type": "application/json"},
    )
    assert_problem(r, 422, "turns.0.action")
    assert verify(stack, ep)["reward"] == 0.0
    for fmt in ("jsonl", "parquet"):
        assert stack.alice.get("/v1/rewards/export", params={"format": fmt}).status_code == 200


def _tiny_task(root: Path, name: str, test_sh: str, *, timeout_s: float = 30.0) -> Path:
    task = root / name
    (task / "environment").mkdir(parents=True)
    (task / "tests").mkdir()
    (task / "environment" / "Dockerfile").write_text(
        "ARG BASE_IMAGE=crucible/terminal:latest\nFROM ${BASE_IMAGE}\nWORKDIR /app\n"
    )
    (task / "instruction.md").write_text("Do nothing.\n")
    (task / "tests" / "test.sh").write_text(test_sh)
    (task / "task.toml").write_text(
        textwrap.dedent(f"""\
        version = "1.0"
        [verifier]
        timeout_sec = {timeout_s}
        [agent]
        timeout_sec = 60.0
        [environment]
        allow_internet = false
        workdir = "/app"
        """)
    )
    return task


def test_a_killed_test_run_scores_zero_not_its_forged_report(stack: Stack, tmp_path: Path) -> None:
    # Found by a new-user trial: code the tests run (a git fsmonitor hook) wrote a passing
    # report, then killed the run before the real verdict was written; it scored 1.0.
    forged = "mkdir -p /logs/verifier && echo 1 > /logs/verifier/reward.txt\n"
    _tiny_task(tmp_path / "killed", "self-kill", f"#!/bin/bash\n{forged}kill -9 $$\n")
    _tiny_task(
        tmp_path / "killed", "pass-on", f"#!/bin/bash\n{forged}bash -c 'kill -9 $$'\nexit $?\n"
    )
    stack.ctx.tasks.add_suite(load_suite(tmp_path / "killed"))
    for name in ("self-kill", "pass-on"):
        r = stack.alice.post("/v1/episodes", json={"task_id": name, "suite": "killed"})
        assert r.status_code == 201, r.text
        ep = r.json()["episodes"][0]
        rec = stack.alice.post(f"/v1/episodes/{ep['id']}/verify", json=TRAJ).json()
        assert (rec["reward"], rec["verifier"]["status"]) == (0.0, "ok"), rec["verifier"]
        assert rec["verifier"]["details"]["dodge"] in ("killed", "no_tests_observed")


def test_tests_that_hang_score_zero(stack: Stack, tmp_path: Path) -> None:
    # Issue 9: an end state that makes the tests hang is the agent's outcome (0, status
    # ok), not a timeout excluded from loss (a policy would learn to dodge its zeros).
    task = tmp_path / "slow" / "sleepy"
    (task / "environment").mkdir(parents=True)
    (task / "tests").mkdir()
    (task / "environment" / "Dockerfile").write_text(
        "ARG BASE_IMAGE=crucible/terminal:latest\nFROM ${BASE_IMAGE}\nWORKDIR /app\n"
    )
    (task / "instruction.md").write_text("Do nothing.\n")
    (task / "tests" / "test.sh").write_text("#!/bin/bash\nsleep 60\n")
    (task / "task.toml").write_text(
        textwrap.dedent("""\
        version = "1.0"
        [verifier]
        timeout_sec = 1.5
        [agent]
        timeout_sec = 60.0
        [environment]
        allow_internet = false
        workdir = "/app"
        """)
    )
    stack.ctx.tasks.add_suite(load_suite(tmp_path / "slow"))
    r = stack.alice.post("/v1/episodes", json={"task_id": "sleepy", "suite": "slow"})
    assert r.status_code == 201, r.text
    ep = r.json()["episodes"][0]
    rec = stack.alice.post(f"/v1/episodes/{ep['id']}/verify", json=TRAJ).json()
    assert (rec["reward"], rec["verifier"]["status"], rec["exclude_from_loss"]) == (
        0.0,
        "ok",
        False,
    )
    assert rec["verifier"]["details"]["dodge"] == "timeout"


def test_episode_survives_a_control_plane_restart(stack: Stack) -> None:
    # Regression: after a restart, task templates were unknown ("unknown template") and an
    # episode killed mid-verification stayed "verifying" forever.
    from sqlalchemy import update

    from service import recovery
    from service.db.models import Episode

    ep = start(stack)["episodes"][0]
    run_oracle(stack, ep)
    template = stack.alice.get(f"/v1/sandboxes/{ep['sandbox_id']}").json()["template"]
    with stack.ctx.templates._lock:  # what a new process knows: only the built-in templates
        stack.ctx.templates._templates.pop(template)
    with stack.ctx.db.session() as s:
        s.execute(update(Episode).where(Episode.id == ep["id"]).values(state="verifying"))
    assert_problem(stack.alice.post(f"/v1/episodes/{ep['id']}/verify", json=TRAJ), 409)
    assert recovery.recover_on_start(stack.ctx)["reverify"] == 1
    assert run(stack.alice, ep["sandbox_id"], "cat /app/top_words.tsv | wc -l")["stdout"] == "20\n"
    assert verify(stack, ep)["reward"] == 1.0


def test_jobs_belong_to_their_tenant_and_group_size_is_bounded(stack: Stack) -> None:
    # Regression: another tenant could attach episodes (and records) to a job it did not own.
    job = stack.alice.post(
        "/v1/jobs", json={"suite": "terminal", "task_ids": [TASK], "policy": {"name": "t"}}
    ).json()
    r = stack.bob.post(
        "/v1/episodes", json={"task_id": TASK, "suite": "terminal", "job_id": job["id"]}
    )
    assert_problem(r, 404, "job_id")
    r = stack.alice.post(
        "/v1/jobs",
        json={
            "suite": "terminal",
            "task_ids": [TASK],
            "group_size": 10**6,
            "policy": {"name": "t"},
        },
    )
    assert_problem(r, 400, "group_size")
    cancelled = stack.alice.post(f"/v1/jobs/{job['id']}/cancel").json()
    assert cancelled["state"] == "cancelled"


def test_untagged_snapshot_images_are_pruned_once_unused(stack: Stack) -> None:
    # Regression: a forked snapshot (then a group's prepared one) stayed on disk, untagged,
    # forever, once deleted while its forks still ran.
    import docker

    engine = docker.from_env()
    label = f"crucible.deployment={stack.ctx.settings.deployment}"

    def dangling() -> list:
        return engine.images.list(filters={"dangling": True, "label": label})

    source = start(stack)["episodes"][0]["sandbox_id"]
    snap = stack.alice.post(f"/v1/sandboxes/{source}/snapshots")
    assert snap.status_code == 201, snap.text
    forked = stack.alice.post(f"/v1/snapshots/{snap.json()['id']}/fork", json={"n": 2})
    assert forked.status_code in (200, 201), forked.text
    assert stack.alice.delete(f"/v1/snapshots/{snap.json()['id']}").status_code == 204
    ids = {sb["id"] for sb in forked.json()["sandboxes"]} | {source}
    for sid in ids:
        assert stack.alice.delete(f"/v1/sandboxes/{sid}").status_code == 200
    stack.wait_for(
        lambda: (
            not ids
            & {
                c.sandbox_id
                for c in stack.ctx.runtime.list(deployment=stack.ctx.settings.deployment)
            }
        )
    )

    def pruned() -> bool:
        # Each call is one maintenance tick with the prune due (it runs once a minute);
        # images other tests' containers still use are pruned by a later tick.
        stack.ctx.pools._pruned_at = 0.0
        stack.ctx.pools.tick()
        time.sleep(0.5)
        return dangling() == []

    stack.wait_for(pruned, timeout_s=60)


def test_verification_takes_a_warm_pristine_sandbox_from_the_pool(stack: Stack) -> None:
    from sqlalchemy import select

    from service.db.models import Sandbox

    ep = start(stack)["episodes"][0]
    template = next(t.name for t in stack.ctx.templates.all() if t.name.endswith(TASK))
    r = stack.admin.put(f"/v1/pools/{template}", json={"target_size": 1})
    assert r.status_code == 200, r.text
    try:
        stack.wait_for(
            lambda: stack.admin.get(f"/v1/pools/{template}").json()["warm"] == 1, timeout_s=60
        )
        run_oracle(stack, ep)
        rec = verify(stack, ep)
        assert rec["reward"] == 1.0
        with stack.ctx.db.read() as s:
            taken = [
                row
                for row in s.execute(select(Sandbox).where(Sandbox.template == template)).scalars()
                if row.metadata_.get("verifier_of") == ep["id"]
            ]
        # The warm sandbox left the pool for good: ended, owned by no tenant, charged nothing.
        assert [(row.state, row.tenant_id) for row in taken] == [("released", None)]
        stack.wait_for(
            lambda: stack.admin.get(f"/v1/pools/{template}").json()["warm"] == 1, timeout_s=60
        )
    finally:
        stack.admin.put(f"/v1/pools/{template}", json={"target_size": 0})


def test_end_state_snapshot_is_kept_only_when_asked(stack: Stack) -> None:
    ep = start(stack)["episodes"][0]
    run_oracle(stack, ep)
    assert verify(stack, ep)["snapshot_id"] is None  # the default: nothing committed
    stack.ctx.settings.keep_episode_snapshots = True
    try:
        ep = start(stack)["episodes"][0]
        run_oracle(stack, ep)
        rec = verify(stack, ep)
    finally:
        stack.ctx.settings.keep_episode_snapshots = False
    assert rec["reward"] == 1.0 and rec["snapshot_id"]
    # The kept snapshot is the end state (committed while the sandbox was frozen).
    r = stack.alice.post(f"/v1/snapshots/{rec['snapshot_id']}/fork", json={"n": 1})
    assert r.status_code == 201, r.text
    fork = r.json()["sandboxes"][0]["id"]
    assert run(stack.alice, fork, "wc -l < /app/top_words.tsv")["stdout"] == "20\n"
    assert stack.alice.delete(f"/v1/sandboxes/{fork}").status_code == 200
    assert stack.alice.delete(f"/v1/snapshots/{rec['snapshot_id']}").status_code == 204
