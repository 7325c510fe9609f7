"""Episode checkpoints: a worker killed (SIGKILL) mid-episode; the next claim resumes the
episode from its checkpoint in a new sandbox at the next turn, with the sandbox's state and
the trajectory (token ids included) carried over; the record says it was resumed. Then the
same with the control plane killed (SIGKILL) with the worker and started again."""

from __future__ import annotations

import asyncio
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from policy_client import calls
from policy_client.client import AsyncClient, Client
from policy_client.policies.base import EpisodeContext, PolicyAction, PolicyRequest
from policy_client.prompt import DONE_MARKER
from policy_client.rollout import RolloutConfig, RolloutRunner
from service import tenants
from service.db.models import Checkpoint, Sandbox
from tests.dbutil import fresh_database
from tests.integration.api.conftest import Stack, _cleanup, _free_port, start_stack
from tests.integration.chaos.test_crash_recovery import Server

pytestmark = pytest.mark.docker

PROGRESS = "/tmp/ckpt-progress"
COMMANDS = [
    f"echo one > {PROGRESS}",
    # succeeds only in a sandbox that holds what turn 0 wrote: the checkpoint's snapshot
    f"grep -qx one {PROGRESS} && echo two >> {PROGRESS}",
    f"test $(wc -l < {PROGRESS}) -eq 2",
]
LEASE_S = 3.0


class StepPolicy:
    """Turn t runs ``COMMANDS[t]`` (then done), with token ids [t+1, t+1]; with
    ``hang_at`` it blocks at that turn (a worker that will be killed there)."""

    name, version = "steps", "1"

    def __init__(self, hang_at: int | None = None) -> None:
        self.hang_at = hang_at

    def prepare(self, episode: EpisodeContext, client: Any) -> None:
        pass

    def act(self, batch: list[PolicyRequest]) -> list[PolicyAction]:
        out = []
        for r in batch:
            if r.turn == self.hang_at:
                time.sleep(3600)
            text = f"```bash\n{COMMANDS[r.turn]}\n```" if r.turn < len(COMMANDS) else DONE_MARKER
            out.append(
                PolicyAction(
                    text=text,
                    prompt_ids=[7] if r.turn == 0 else [],
                    observation_ids=[] if r.turn == 0 else [0],
                    response_ids=[r.turn + 1, r.turn + 1],
                    logprobs=[-0.5, -0.5],
                )
            )
        return out

    def end_episode(self, episode_id: str) -> None:
        pass


def _run(url: str, key: str, job_id: str, policy: StepPolicy) -> list:
    cfg = RolloutConfig(concurrency=1, claim_lease_s=LEASE_S, checkpoint_every=1)

    async def go() -> list:
        async with AsyncClient(url, key) as aclient:
            with Client(url, key) as client:
                runner = RolloutRunner(aclient, policy, sync_client=client, config=cfg)
                return await runner.run_job(job_id)

    return asyncio.run(go())


def _doomed_worker(url: str, key: str, job_id: str) -> None:
    """The worker the test kills: it hangs at turn 1, after the checkpoint before it."""
    _run(url, key, job_id, StepPolicy(hang_at=1))


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    yield from start_stack(tmp_path_factory.mktemp("ckpt"))


def _checkpoints(stack: Stack) -> list[Checkpoint]:
    with stack.ctx.db.read() as s:
        return list(s.execute(select(Checkpoint)).scalars())


def test_worker_killed_mid_episode_resumes_from_its_checkpoint(stack: Stack) -> None:
    key = stack.alice.headers["authorization"].split(" ", 1)[1]
    with Client(stack.url, key) as client:
        job = client.run(
            calls.create_job(
                suite="terminal",
                task_ids=["word-frequency-top20"],
                policy={"name": "steps", "version": "1"},
            )
        )
    code = (
        "import sys; from tests.integration.test_checkpoints import _doomed_worker; "
        "_doomed_worker(*sys.argv[1:])"
    )
    proc = subprocess.Popen([sys.executable, "-c", code, stack.url, key, job.id])
    try:
        stack.wait_for(lambda: len(_checkpoints(stack)) == 1, timeout_s=180)
        time.sleep(1.0)  # it is now blocked in turn 1's policy call
        first = _checkpoints(stack)[0]
        assert first.turn == 1 and first.state["trajectory"]["response_ids"] == [1, 1]
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    outcomes = _run(stack.url, key, job.id, StepPolicy())  # claims once the lease lapses
    assert len(outcomes) == 1
    rec = outcomes[0].record
    assert rec.resumed_from == first.id
    assert rec.episode_id != first.episode_id  # a new episode, in a new sandbox
    assert [t.exit_code for t in rec.turns] == [0, 0, 0], rec.turns
    assert [t.action for t in rec.turns] == COMMANDS
    # the trajectory before the kill (turn 0's tokens) and after it, in order
    assert rec.prompt_ids == [7]
    assert rec.response_ids == [1, 1, 0, 2, 2, 0, 3, 3, 0, 4, 4]
    assert rec.loss_mask == [1, 1, 0, 1, 1, 0, 1, 1, 0, 1, 1]
    final = stack.alice.get(f"/v1/jobs/{job.id}").json()
    assert final["state"] == "done" and final["progress"]["records"] == {"ok": 1}
    # the item ended: its checkpoints and their snapshots are gone
    assert _checkpoints(stack) == []
    with stack.ctx.db.read() as s:
        live = s.execute(
            select(func.count()).select_from(Sandbox).where(Sandbox.state == "leased")
        ).scalar_one()
    assert live == 0


def test_a_restarted_control_plane_resumes_the_episode_from_its_checkpoint(
    tmp_path: Path,
) -> None:
    # issue 16: "after a lost worker, a timeout or a restart": the node dies (its control
    # plane and its worker); a new control plane on the same database and data dir finds the
    # checkpoint, and the next claim resumes the episode from it
    deployment = f"ckpt-{secrets.token_hex(4)}"
    with fresh_database("sqlite", tmp_path) as db:
        with db.session() as s:
            tenants.create_tenant(s, "ck", max_sandboxes=8, max_cpus=8, max_memory_mb=1 << 14)
            key = tenants.create_key(s, "ck", scopes=set())
        env = {k: v for k, v in os.environ.items() if not k.startswith("CRUCIBLE_")}
        env.update(
            CRUCIBLE_DATABASE_URL=db.url,
            CRUCIBLE_DATA_DIR=str(tmp_path / "data"),
            CRUCIBLE_DEPLOYMENT=deployment,
            CRUCIBLE_POOL_TARGETS="{}",
            CRUCIBLE_POOL_INTERVAL_S="0.2",
        )
        srv = Server(env, _free_port(), tmp_path / "serve.log")

        def checkpoints() -> list[Checkpoint]:
            with db.read() as s:
                return list(s.execute(select(Checkpoint)).scalars())

        try:
            srv.start()
            with Client(srv.url, key) as client:
                job = client.run(
                    calls.create_job(
                        suite="terminal",
                        task_ids=["word-frequency-top20"],
                        policy={"name": "steps", "version": "1"},
                    )
                )
            code = (
                "import sys; from tests.integration.test_checkpoints import _doomed_worker; "
                "_doomed_worker(*sys.argv[1:])"
            )
            proc = subprocess.Popen([sys.executable, "-c", code, srv.url, key, job.id])
            try:
                deadline = time.monotonic() + 180
                while len(checkpoints()) != 1:
                    assert proc.poll() is None, "the worker ended before its checkpoint"
                    assert time.monotonic() < deadline, "no checkpoint within 180 s"
                    time.sleep(0.1)
                time.sleep(1.0)  # it is now blocked in turn 1's policy call
                (first,) = checkpoints()
                assert first.turn == 1
            finally:
                srv.kill9()
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
            srv.start()
            outcomes = _run(srv.url, key, job.id, StepPolicy())  # once the claim lapses
            assert len(outcomes) == 1
            rec = outcomes[0].record
            assert rec.resumed_from == first.id and rec.episode_id != first.episode_id
            assert [t.exit_code for t in rec.turns] == [0, 0, 0], rec.turns
            assert rec.response_ids == [1, 1, 0, 2, 2, 0, 3, 3, 0, 4, 4]
            with Client(srv.url, key) as client:
                final = client.get_job(job.id)
            assert final.state == "done", final
            assert checkpoints() == []
        finally:
            srv.stop()
            _cleanup(deployment)


def test_checkpoint_refusals(stack: Stack) -> None:
    """An ad-hoc episode cannot be checkpointed (400); unknown ones are 404; resuming a
    sample without a checkpoint is 404 naming sample_idx; bad bodies are 422."""
    key = stack.alice.headers["authorization"].split(" ", 1)[1]
    with Client(stack.url, key) as client:
        ep = client.run(calls.start_episodes(task_id="word-frequency-top20", suite="terminal"))
    eid = ep.episodes[0].id
    r = stack.alice.post(f"/v1/episodes/{eid}/checkpoints", json={"turn": 1, "state": {}})
    assert r.status_code == 400 and "episode_id" in r.text
    r = stack.alice.post("/v1/episodes/ep_nope/checkpoints", json={"turn": 1, "state": {}})
    assert r.status_code == 404
    r = stack.alice.post(f"/v1/episodes/{eid}/checkpoints", json={"turn": -1, "state": {}})
    assert r.status_code == 422 and "turn" in r.text
    r = stack.bob.post(f"/v1/episodes/{eid}/checkpoints", json={"turn": 1, "state": {}})
    assert r.status_code == 404  # another tenant's episode does not exist for bob
    with Client(stack.url, key) as client:
        job = client.run(
            calls.create_job(
                suite="terminal",
                task_ids=["word-frequency-top20"],
                policy={"name": "x", "version": "1"},
            )
        )
        item = client.run(calls.claim(job.id, worker="w", lease_s=60))
    r = stack.alice.post(f"/v1/work-items/{item.id}/resume", json={"sample_idx": 0})
    assert r.status_code == 404 and "sample_idx" in r.text
    assert _checkpoints(stack) == []
    stack.alice.post(f"/v1/episodes/{eid}/verify", json={"policy": {"name": "x", "version": "1"}})
