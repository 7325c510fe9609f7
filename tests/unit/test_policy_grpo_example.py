"""examples/grpo_step.py on records made by the tiny model: the recomputed logprobs equal the
rollout's before the step, and one PPO-clip step moves the parameters and lowers the loss.

The rewards are synthetic (1 and 0 within each group, stated here): a random model scores 0
everywhere, which gives all-zero advantages and no gradient (also checked)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from policy_client.policies.torch_policy import TorchPolicy
from service.rewards import RewardRecord, export_parquet
from tests.tiny_model import save_tiny_model
from tests.unit.test_policy_torch import _episodes

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "grpo_step.py"


def _example():  # noqa: ANN202
    spec = importlib.util.spec_from_file_location("grpo_step", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules["grpo_step"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _records(model_dir: Path, rewards: list[float]) -> list[RewardRecord]:
    policy = TorchPolicy.from_pretrained(model_dir, max_new_tokens=8, temperature=0.8, seed=5)
    trajs = _episodes(policy, turns=2, episodes=list(range(len(rewards))))
    out = []
    for i, traj in trajs.items():
        body = traj.payload(policy, "max_turns", 0.0)
        out.append(
            RewardRecord(
                episode_id=f"ep{i}",
                group_id=f"g{i // 2}",
                sample_idx=i % 2,
                task_id=f"t{i // 2}",
                task_version="1",
                suite="s",
                domain="terminal",
                template="terminal",
                image_digest="sha256:x",
                policy=body["policy"],
                reward=rewards[i],
                verifier={"name": "terminal", "version": "1", "status": "ok"},
                stop_reason="max_turns",
                prompt_ids=body["prompt_ids"],
                response_ids=body["response_ids"],
                loss_mask=body["loss_mask"],
                rollout_logprobs=body["rollout_logprobs"],
                sandbox_id="sb",
            )
        )
    return out


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny")


def test_one_grpo_step_from_parquet_records(
    model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    path = tmp_path / "records.parquet"
    export_parquet(_records(model_dir, [1.0, 0.0, 0.0, 1.0]), path)
    figures = _example().main([str(path), "--model", str(model_dir), "--lr", "0.05"])
    out = capsys.readouterr().out
    assert "T=0.8" in out and "parameters changed: True" in out
    assert figures["drift"] < 1e-4  # same logprob definition as the rollout
    assert figures["delta"] > 0 and figures["changed"] > 0
    assert figures["loss_after"] < figures["loss"]


def test_equal_rewards_give_no_step(
    model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    path = tmp_path / "zeros.parquet"
    export_parquet(_records(model_dir, [0.0, 0.0]), path)
    figures = _example().main([str(path), "--model", str(model_dir)])
    assert figures["delta"] == 0.0 and "no gradient" in capsys.readouterr().out
