"""A tiny transformers model rolls out through the real service (real HTTP, real Docker, real
verifiers): in-process with ``RolloutRunner``, and through ``crucible rollout --policy torch``
(with and without ``--ray``).

The model is random, so every reward is 0 (the honest value); what is checked is that the
records are well-formed: ids, masks and logprobs aligned, the sampled tokens' logprobs equal
to a fresh forward pass over the stored tokens, and the Parquet export carrying them intact.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch

from policy_client.client import AsyncClient, Client
from policy_client.policies.torch_policy import TorchPolicy
from policy_client.rollout import RolloutConfig, RolloutRunner
from service.rewards import RewardRecord
from tests.integration.api.conftest import Stack, start_stack
from tests.tiny_model import save_tiny_model

pytestmark = pytest.mark.docker

ROOT = Path(__file__).resolve().parents[2]
SUITE = ROOT / "tasks" / "terminal"
TASKS = ["word-frequency-top20", "access-log-top-ips"]
CRUCIBLE = str(Path(sys.executable).parent / "crucible")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    yield from start_stack(tmp_path_factory.mktemp("stack"))


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny-llama")


def _key(stack: Stack) -> str:
    return stack.alice.headers["authorization"].split(" ", 1)[1]


def _check_record(rec: RewardRecord, model: torch.nn.Module | None = None) -> None:
    """Invariants of a torch-policy record; with ``model``, logprobs against a fresh pass."""
    assert rec.verifier.status == "ok", rec.verifier.details
    assert rec.reward == 0.0
    assert rec.stop_reason in ("max_turns", "complete", "context_length"), rec.stop_reason
    assert rec.policy.name == "tiny-llama" and rec.policy.version.startswith("T=1,top_p=1")
    n = len(rec.response_ids)
    assert rec.prompt_ids and n > 0
    assert len(rec.loss_mask) == n and len(rec.rollout_logprobs) == n
    assert set(rec.loss_mask) <= {0, 1} and 1 in rec.loss_mask
    for m, lp in zip(rec.loss_mask, rec.rollout_logprobs, strict=True):
        assert (lp == 0.0) if m == 0 else (lp < 0.0 and math.isfinite(lp))
    if model is not None:
        ids = torch.tensor([rec.prompt_ids + rec.response_ids])
        with torch.no_grad():
            logp = torch.log_softmax(model(ids).logits[0].float(), dim=-1)
        p = len(rec.prompt_ids)
        fresh = logp[p - 1 : -1].gather(-1, torch.tensor(rec.response_ids)[:, None]).squeeze(-1)
        sampled = torch.tensor(rec.loss_mask, dtype=torch.bool)
        got = torch.tensor(rec.rollout_logprobs)
        assert torch.allclose(got[sampled], fresh[sampled], atol=1e-4)


def test_tiny_model_rollout_through_the_service(stack: Stack, tiny_dir: Path) -> None:
    key = _key(stack)
    policy = TorchPolicy.from_pretrained(tiny_dir, max_new_tokens=24, seed=0)
    with Client(stack.url, key) as client:
        job = client.create_job(
            suite="terminal",
            task_ids=TASKS,
            group_size=2,
            policy={"name": policy.name, "version": policy.version},
        )

        async def go() -> tuple[list, list[int]]:
            async with AsyncClient(stack.url, key) as aclient:
                runner = RolloutRunner(
                    aclient,
                    policy,
                    sync_client=client,
                    config=RolloutConfig(concurrency=2, max_turns=2, batch_wait_s=0.2),
                )
                return await runner.run_job(job.id), runner.batcher.batches

        outcomes, batches = asyncio.run(go())
        final = client.get_job(job.id)
        parquet = client.export_records(fmt="parquet", job_id=job.id)
    assert final.state == "done"
    records = [o.record for o in outcomes]
    assert sorted(r.task_id for r in records) == sorted(TASKS * 2)
    assert max(batches) > 1, f"no batching across episodes: {batches}"
    for rec in records:
        _check_record(rec, policy.model)
        assert len(rec.turns) <= 2
    assert not policy._episodes, "end_episode left state behind"

    path = stack.ctx.settings.data_dir / "export.parquet"
    path.write_bytes(parquet)
    table = pq.read_table(path).to_pylist()
    by_episode = {r.episode_id: r for r in records}
    assert len(table) == len(records)
    for row in table:
        rec = by_episode[row["episode_id"]]
        assert row["prompt_ids"] == rec.prompt_ids
        assert row["response_ids"] == rec.response_ids
        assert row["loss_mask"] == rec.loss_mask
        assert torch.allclose(
            torch.tensor(row["rollout_logprobs"]), torch.tensor(rec.rollout_logprobs), atol=1e-6
        )


def _cli(stack: Stack, tiny_dir: Path, out: Path, *extra: str) -> dict:
    env = {**os.environ, "CRUCIBLE_URL": stack.url, "CRUCIBLE_API_KEY": _key(stack)}
    proc = subprocess.run(
        [
            CRUCIBLE,
            "rollout",
            "--suite",
            str(SUITE),
            "--policy",
            "torch",
            "--model",
            str(tiny_dir),
            "--tasks",
            ",".join(TASKS),
            "--max-turns",
            "2",
            "--max-new-tokens",
            "16",
            "--out",
            str(out),
            "--json",
            *extra,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


@pytest.mark.parametrize("extra", [(), ("--ray", "2")], ids=["local", "ray"])
def test_cli_rollout_with_the_torch_policy(
    stack: Stack, tiny_dir: Path, tmp_path: Path, extra: tuple[str, ...]
) -> None:
    summary = _cli(stack, tiny_dir, tmp_path, *extra)
    assert summary["state"] == "done" and summary["episodes"] == len(TASKS)
    assert summary["errors"] == 0 and summary["mean_reward"] == 0.0
    with open(summary["records"]["jsonl"]) as fp:
        records = [RewardRecord.model_validate_json(line) for line in fp]
    assert sorted(r.task_id for r in records) == sorted(TASKS)
    for rec in records:
        _check_record(rec)
    rows = {r["record_id"]: r for r in pq.read_table(summary["records"]["parquet"]).to_pylist()}
    assert sorted(rows) == sorted(r.record_id for r in records)
    for rec in records:
        row = rows[rec.record_id]
        assert row["prompt_ids"] == rec.prompt_ids and row["response_ids"] == rec.response_ids
        assert row["loss_mask"] == rec.loss_mask
        assert len(row["rollout_logprobs"]) == len(rec.rollout_logprobs)
