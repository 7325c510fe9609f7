"""``crucible replay``: every bundled oracle episode replays without divergence (real
service, sandboxes and verifiers), and a nondeterministic episode is caught and flagged."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from policy_client import calls
from policy_client.client import AsyncClient, Client
from policy_client.policies.scripted import OraclePolicy
from policy_client.rollout import RolloutConfig, RolloutRunner
from tests.integration.api.conftest import Stack, start_stack

pytestmark = pytest.mark.docker

TASKS = Path(__file__).resolve().parents[2] / "tasks"
SUITES = ("terminal", "document", "cad")
CRUCIBLE = str(Path(sys.executable).parent / "crucible")
SAMPLE_EVERY = 4
# Oracle episodes whose *output* differs run to run on the same image and task version; their
# exit codes and rewards do not. Replay reports them and flags the task nondeterministic.
# (``git-recover-dropped-commit`` was one until its oracle fixed the committer date: the
# hashes ``git cherry-pick`` prints depended on the time.) None is left.
NONDETERMINISTIC_OUTPUT: set[str] = set()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    yield from start_stack(tmp_path_factory.mktemp("replay"))


def _key(stack: Stack) -> str:
    return stack.alice.headers["authorization"].split(" ", 1)[1]


def _sample(stack: Stack, suite: str, every: int) -> list[str]:
    """Every ``every``-th task of the suite (sorted by id)."""
    return sorted(stack.ctx.tasks.suite(suite).ids)[::every]


# Sampled (every SAMPLE_EVERY-th task) by default; every oracle of every suite under the
# ``slow`` marker: the three suites in full take about 7 minutes here.
CASES = [pytest.param(s, SAMPLE_EVERY, id=f"{s}-sampled") for s in SUITES] + [
    pytest.param(s, 1, id=f"{s}-all", marks=pytest.mark.slow) for s in SUITES
]


@pytest.mark.parametrize(("suite", "every"), CASES)
def test_every_oracle_episode_replays_without_divergence(
    stack: Stack, suite: str, every: int
) -> None:
    key = _key(stack)
    pol = OraclePolicy(TASKS / suite)
    with Client(stack.url, key) as client:
        job = client.run(
            calls.create_job(
                suite=suite,
                task_ids=_sample(stack, suite, every),
                policy={"name": "oracle", "version": "1"},
            )
        )

        async def go() -> list:
            async with AsyncClient(stack.url, key) as aclient:
                runner = RolloutRunner(
                    aclient, pol, sync_client=client, config=RolloutConfig(concurrency=3)
                )
                return await runner.run_job(job.id)

        outcomes = asyncio.run(go())
    assert {o.record.task_id for o in outcomes} == set(job.task_ids)
    diverged = {}
    for o in outcomes:
        # an admin's replay re-does the oracle's preparation (the solution upload)
        r = stack.admin.post(f"/v1/episodes/{o.record.episode_id}/replay")
        assert r.status_code == 200, r.text
        rep = r.json()
        assert rep["replayed_reward"] == o.record.reward == 1.0
        assert rep["image_digest"] == o.record.image_digest
        assert len(rep["turns"]) == sum(1 for t in o.record.turns if t.exit_code is not None)
        if rep["divergences"]:
            diverged[o.record.task_id] = rep
    known = {t for t in diverged if t in NONDETERMINISTIC_OUTPUT}
    for t in known:  # only output differs there, and the task is flagged for it
        assert {d["kind"] for d in diverged[t]["divergences"]} == {"output"}, diverged[t]
        assert diverged[t]["nondeterministic"]
    unexpected = {t: r["divergences"] for t, r in diverged.items() if t not in known}
    assert not unexpected, unexpected


def test_cli_reports_a_nondeterministic_episode(stack: Stack) -> None:
    """An episode whose command prints the time diverges on output and is flagged; the
    CLI exits 2 and names the divergence."""
    key = _key(stack)
    with Client(stack.url, key) as client:
        started = client.run(calls.start_episodes(task_id="word-frequency-top20", suite="terminal"))
        ep = started.episodes[0]
        res = client.run(calls.exec_(ep.sandbox_id, "date +%s%N; true", cwd=ep.workdir))
        assert res.exit_code == 0
        rec = client.run(
            calls.verify(
                ep.id,
                {
                    "policy": {"name": "scripted", "version": "1"},
                    "stop_reason": "complete",
                    "turns": [{"action": "date +%s%N; true", "exit_code": 0}],
                },
            )
        )
    assert rec.reward == 0.0
    env = {**os.environ, "CRUCIBLE_URL": stack.url, "CRUCIBLE_API_KEY": key}
    out = subprocess.run(
        [CRUCIBLE, "replay", ep.id], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 2, out.stdout + out.stderr
    assert "divergence output at turn 0" in out.stdout
    assert "nondeterministic" in out.stdout
    # unknown episode: a 404 naming it, exit 1
    bad = subprocess.run(
        [CRUCIBLE, "replay", "ep_nope"], env=env, capture_output=True, text=True, timeout=60
    )
    assert bad.returncode == 1 and "ep_nope" in bad.stdout + bad.stderr


def test_a_tenants_replay_never_hands_out_the_solution_nor_a_verifiable_episode(
    stack: Stack,
) -> None:
    """Trial finding: the replay uploaded the task's solution whenever the record's policy
    was named ``oracle`` (a name the runner sends), into a sandbox leased to the tenant,
    and the replay episode was verifiable: 1.0 on unsolved tasks, and the solution read."""
    probe = "test -f /solution/solve.sh && echo leaked; sleep 4; true"
    key = _key(stack)
    with Client(stack.url, key) as client:
        ep = client.run(calls.start_episodes(task_id="word-frequency-top20", suite="terminal"))
        ep = ep.episodes[0]
        assert client.run(calls.exec_(ep.sandbox_id, probe, cwd=ep.workdir)).exit_code == 0
        traj = {"policy": {"name": "oracle", "version": "1"}, "stop_reason": "complete"}
        traj["turns"] = [{"action": probe, "exit_code": 0}]
        assert client.run(calls.verify(ep.id, traj)).reward == 0.0
    before = {sb["id"] for sb in stack.alice.get("/v1/sandboxes").json()["sandboxes"]}
    result: dict = {}
    replay = threading.Thread(
        target=lambda: result.update(r=stack.alice.post(f"/v1/episodes/{ep.id}/replay"))
    )
    replay.start()
    try:
        new: set = set()
        stack.wait_for(
            lambda: bool(
                new.update(
                    {sb["id"] for sb in stack.alice.get("/v1/sandboxes").json()["sandboxes"]}
                    - before
                )
                or new
            ),
            timeout_s=60,
        )
        (sid,) = new
        events: list = []

        def started() -> bool:  # the lease commits before the episode row
            params = {"action": "episode.start", "sandbox_id": sid}
            events[:] = stack.alice.get("/v1/audit", params=params).json()["events"]
            return bool(events)

        stack.wait_for(started, timeout_s=30)
        replay_ep = events[0]["details"]["episode_id"]
        r = stack.alice.post(f"/v1/episodes/{replay_ep}/verify", json=traj)
        assert r.status_code == 409, r.text  # a replay is not a sample
    finally:
        replay.join(timeout=120)
    rep = result["r"].json()
    assert result["r"].status_code == 200, rep
    # no /solution in the replay's sandbox: the probe printed nothing there either
    assert rep["divergences"] == [] and rep["replayed_reward"] == 0.0, rep
    assert rep["turns"][0]["replayed_output"] == rep["turns"][0]["recorded_output"], rep
