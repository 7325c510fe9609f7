"""Tasks written for other harnesses run unchanged (but for their base image): a Harbor
task with no Crucible settings and no JUnit report, and a Terminal-Bench 1 task."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.tasks.loader import load_suite
from tests.integration.api.conftest import Stack
from tests.integration.api.test_sandboxes_api import run

pytestmark = pytest.mark.docker

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "tasks"
TRAJ = {"policy": {"name": "test", "version": "1"}}


@pytest.mark.parametrize(
    ("suite", "task"),
    [("good", "count-errors"), ("good", "tb1-hello")],
)
def test_foreign_task_oracle_one_noop_zero(stack: Stack, suite: str, task: str) -> None:
    loaded = load_suite(FIXTURES / suite)
    stack.ctx.tasks.add_suite(loaded)
    solution = loaded.get(task).solution_path
    rewards = {}
    for policy in ("oracle", "noop"):
        r = stack.alice.post("/v1/episodes", json={"task_id": task, "suite": suite})
        assert r.status_code == 201, r.text
        ep = r.json()["episodes"][0]
        if policy == "oracle":
            stack.alice.put(
                f"/v1/sandboxes/{ep['sandbox_id']}/files",
                params={"path": "/solution/solve.sh"},
                content=solution.read_bytes(),
            )
            out = run(stack.alice, ep["sandbox_id"], "bash /solution/solve.sh", cwd=ep["workdir"])
            assert out["exit_code"] == 0, out
        rec = stack.alice.post(f"/v1/episodes/{ep['id']}/verify", json=TRAJ).json()
        assert rec["verifier"]["status"] == "ok", rec["verifier"]
        rewards[policy] = rec["reward"]
    assert rewards == {"oracle": 1.0, "noop": 0.0}


def test_counts_survive_noise_around_the_test_run(stack: Stack, tmp_path: Path) -> None:
    """Issue 11: without a JUnit report, counts were scraped from a 32 KiB head-and-tail
    window of the output, and a 3/3 pass with noise before and after came back as
    ``status=error``. Counts now come from Crucible's own observer, whatever is printed
    (including lines that look like a pytest summary)."""
    import shutil

    suite = tmp_path / "noisy"
    shutil.copytree(FIXTURES / "good" / "count-errors", suite / "count-errors")
    test_sh = suite / "count-errors" / "tests" / "test.sh"
    noise = (
        'for i in $(seq 1 3000); do echo "noise line $i =========== 1 failed in 0.1s ===="; done\n'
    )
    body = test_sh.read_text().replace("cd /app\n", "cd /app\n" + noise)
    test_sh.write_text(body.rstrip("\n") + "\n" + noise)
    loaded = load_suite(suite)
    stack.ctx.tasks.add_suite(loaded)
    r = stack.alice.post("/v1/episodes", json={"task_id": "count-errors", "suite": "noisy"})
    assert r.status_code == 201, r.text
    ep = r.json()["episodes"][0]
    solution = loaded.get("count-errors").solution_path
    stack.alice.put(
        f"/v1/sandboxes/{ep['sandbox_id']}/files",
        params={"path": "/solution/solve.sh"},
        content=solution.read_bytes(),
    )
    assert (
        run(stack.alice, ep["sandbox_id"], "bash /solution/solve.sh", cwd="/app")["exit_code"] == 0
    )
    rec = stack.alice.post(f"/v1/episodes/{ep['id']}/verify", json=TRAJ).json()
    assert (rec["reward"], rec["verifier"]["status"]) == (1.0, "ok"), rec["verifier"]
    assert rec["reward_components"]["tests_total"] >= 1
