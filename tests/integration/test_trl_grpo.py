"""One real TRL ``GRPOTrainer`` step (TRL from PyPI, a tiny local model, CPU) whose rollouts
are Crucible episodes and whose rewards are Crucible's verifiers'
(``policy_client.integrations.trl``), through the real service (HTTP, Docker, verifiers).

Checked: the step runs; TRL's prompt repeated ``num_generations`` times became one Crucible
group (one ``group_id``, sample indexes 0..n-1, forked from one snapshot); the reward TRL
logged is the mean of the stored records' rewards; ``env_mask`` is the records' ``loss_mask``.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Iterator
from pathlib import Path

import pytest

from policy_client.client import Client
from policy_client.integrations.trl import CrucibleRollout, crucible_reward
from tests.integration.api.conftest import Stack, start_stack
from tests.tiny_model import save_tiny_model

pytestmark = [pytest.mark.docker, pytest.mark.trl]

TASKS = ["word-frequency-top20", "access-log-top-ips"]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    yield from start_stack(tmp_path_factory.mktemp("stack"))


def test_one_grpo_step_with_crucible_rewards(stack: Stack, tmp_path: Path) -> None:
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    model_dir = save_tiny_model(tmp_path / "tiny-llama")
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    tok = AutoTokenizer.from_pretrained(model_dir)
    key = stack.alice.headers["authorization"].split(" ", 1)[1]
    rollout = CrucibleRollout(
        url=stack.url, api_key=key, suite="terminal", max_turns=2, max_new_tokens=12
    )
    dataset = rollout.dataset(TASKS)
    assert dataset.column_names == ["prompt", "task_id"]

    args = GRPOConfig(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=2,
        num_generations=2,
        max_steps=1,
        max_completion_length=64,
        learning_rate=1e-3,
        logging_steps=1,
        report_to=[],
        save_strategy="no",
        use_cpu=True,
        bf16=False,
        seed=0,
    )
    trainer = GRPOTrainer(
        model=model,
        processing_class=tok,
        args=args,
        train_dataset=dataset,
        reward_funcs=crucible_reward,
        rollout_func=rollout,
    )
    trainer.train()
    assert trainer.state.global_step == 1

    records = rollout.records
    assert len(records) == 2
    assert len({r.group_id for r in records}) == 1  # the repeated prompt: one group
    assert sorted(r.sample_idx for r in records) == [0, 1]
    assert len({r.task_id for r in records}) == 1 and records[0].task_id in TASKS
    with Client(stack.url, key) as client:
        stored = {r.record_id: r for r in client.list_records(task_id=records[0].task_id).records}
    for rec in records:
        assert stored[rec.record_id].reward == rec.reward  # the verifier's, as stored
        assert rec.verifier.status == "ok" and rec.prompt_ids and rec.response_ids
        assert len(rec.loss_mask) == len(rec.response_ids) and 1 in rec.loss_mask
    logged = next(h for h in trainer.state.log_history if "rewards/crucible_reward/mean" in h)
    assert logged["rewards/crucible_reward/mean"] == pytest.approx(
        statistics.fmean(r.reward for r in records)
    )
    # env_mask from loss_mask: TRL counts only model tokens (mask 1) in completion lengths
    model_tokens = [sum(r.loss_mask) for r in records]
    assert logged["completions/mean_length"] == pytest.approx(statistics.fmean(model_tokens))
