"""Crucible episodes as TRL's ``GRPOTrainer`` rollouts (``rollout_func``), rewards from
Crucible's verifiers.

    rollout = CrucibleRollout(url=..., api_key=..., suite="terminal", max_turns=4)
    dataset = rollout.dataset(["word-frequency-top20", "access-log-top-ips"])
    trainer = GRPOTrainer(model=model, processing_class=tok, args=GRPOConfig(...),
                          train_dataset=dataset, reward_funcs=crucible_reward,
                          rollout_func=rollout)

TRL's contract (trl 1.16, ``GRPOTrainer._generate``): ``rollout_func(prompts, trainer)`` gets
the process's slice of the generation batch, in which TRL's ``RepeatSampler`` already
repeated each prompt ``num_generations`` times in a row, and returns one completion per entry:
``prompt_ids``, ``completion_ids``, ``logprobs`` (lists per entry), and optionally
``env_mask`` (1 on tokens the model generated, 0 on tokens the environment inserted: TRL
keeps 0 out of the loss); every other key reaches the reward functions as a keyword.

Here each run of ``num_generations`` equal prompts becomes **one Crucible group**: one
``start_episodes`` call forks ``num_generations`` sandboxes from one prepared snapshot, the
trainer's current model acts in all of them at once (``TorchPolicy`` over ``trainer.model``,
batched across episodes by ``RolloutRunner``), and each episode is verified into a record.
From the record: ``prompt_ids`` -> ``prompt_ids``, ``response_ids`` -> ``completion_ids``,
``rollout_logprobs`` -> ``logprobs``, ``loss_mask`` -> ``env_mask``, ``reward`` ->
``crucible_reward`` (``None`` for a record excluded from the loss: TRL leaves it out of the
group's statistics). A record without tokens (an episode that failed before the model spoke)
becomes the rendered prompt with one end-of-sequence token masked out (``env_mask`` 0).

A prompt names its task by its instruction: use ``dataset()`` (rows ``prompt`` = the chat
Crucible starts an episode with, ``task_id``), or give ``tasks`` (instruction -> task id).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from policy_client.client import AsyncClient, Client
from policy_client.prompt import initial_messages
from policy_client.rollout import RolloutConfig, RolloutRunner


def crucible_reward(completions: list[Any], crucible_reward: list[float | None], **_: Any) -> list:
    """TRL reward function: the verifier's reward of each completion's Crucible record
    (``None`` when the record is excluded from the loss)."""
    return list(crucible_reward)


def _instruction(prompt: Any) -> str:
    """The task instruction of a TRL prompt: a chat (the first user message) or a string."""
    if isinstance(prompt, str):
        return prompt
    for m in prompt:
        if m.get("role") == "user":
            content = m.get("content")
            return content if isinstance(content, str) else str(content)
    raise ValueError("a prompt without a user message names no task")


class CrucibleRollout:
    """A TRL ``rollout_func`` that runs Crucible episodes (see the module docstring).

    ``suite``: the suite of the tasks. ``max_turns``, ``max_new_tokens``, ``temperature``:
    per episode and per turn. ``tasks``: instruction -> task id (``dataset()`` fills it).
    ``records``: every record of the last call, in order (for logging).
    """

    def __init__(
        self,
        *,
        suite: str,
        url: str | None = None,
        api_key: str | None = None,
        max_turns: int = 4,
        max_new_tokens: int = 64,
        temperature: float = 1.0,
        tasks: dict[str, str] | None = None,
        config: RolloutConfig | None = None,
    ) -> None:
        self.suite, self.url, self.api_key = suite, url, api_key
        self.max_new_tokens, self.temperature = max_new_tokens, temperature
        self.config = config or RolloutConfig(max_turns=max_turns, concurrency=4)
        self.tasks: dict[str, str] = dict(tasks or {})
        self.records: list[Any] = []

    def dataset(self, task_ids: Sequence[str]) -> Any:
        """A ``datasets.Dataset`` of the tasks: ``prompt`` (the episode's opening chat) and
        ``task_id``; remembers each instruction's task."""
        from datasets import Dataset

        rows = []
        with Client(self.url, self.api_key) as client:
            for task_id in task_ids:
                task = client.get_task(self.suite, task_id)
                self.tasks[task.instruction] = task_id
                rows.append({"prompt": initial_messages(task.instruction), "task_id": task_id})
        return Dataset.from_list(rows)

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, list]:
        """Run the groups of ``prompts`` (runs of ``trainer.num_generations`` equal prompts)
        and return TRL's rollout fields, one entry per prompt, in order.

        Raises:
            ValueError: a prompt names no known task, or the prompts do not come in runs of
                ``num_generations``.
        """
        n = trainer.num_generations if trainer.model.training else trainer.num_generations_eval
        if len(prompts) % n:
            raise ValueError(f"{len(prompts)} prompts are not groups of {n}")
        groups = []
        for start in range(0, len(prompts), n):
            instructions = {_instruction(p) for p in prompts[start : start + n]}
            if len(instructions) != 1:
                raise ValueError(f"prompts {start}..{start + n - 1} are not one prompt repeated")
            instruction = instructions.pop()
            if instruction not in self.tasks:
                raise ValueError(f"no task for the prompt {instruction[:80]!r}")
            groups.append(self.tasks[instruction])
        records = asyncio.run(self._run(groups, n, trainer))
        self.records = records
        tok = trainer.processing_class
        out: dict[str, list] = {
            k: []
            for k in (
                "prompt_ids",
                "completion_ids",
                "logprobs",
                "env_mask",
                "crucible_reward",
                "record_id",
            )
        }
        for rec in records:
            if rec.prompt_ids and rec.response_ids:
                prompt, completion = list(rec.prompt_ids), list(rec.response_ids)
                mask = list(rec.loss_mask)
                logprobs = list(rec.rollout_logprobs) or [0.0] * len(completion)
            else:  # no tokens: nothing to learn from, but TRL needs a row
                messages = [m.model_dump() for m in rec.prompt_messages] or initial_messages(
                    rec.instruction
                )
                prompt = tok.apply_chat_template(
                    messages, add_generation_prompt=True, tokenize=False
                )
                prompt = tok.encode(prompt, add_special_tokens=False)
                completion, mask, logprobs = [tok.eos_token_id], [0], [0.0]
            out["prompt_ids"].append(prompt)
            out["completion_ids"].append(completion)
            out["logprobs"].append(logprobs)
            out["env_mask"].append(mask)
            out["crucible_reward"].append(rec.reward if rec.is_valid else None)
            out["record_id"].append(rec.record_id)
        return out

    async def _run(self, task_ids: list[str], n: int, trainer: Any) -> list[Any]:
        from policy_client.policies.torch_policy import TorchPolicy

        model = trainer.model
        was_training = model.training
        policy = TorchPolicy(
            model,
            trainer.processing_class,
            max_new_tokens=self.max_new_tokens,
            temperature=self.temperature,
            name=getattr(model.config, "_name_or_path", None) or "trl-model",
        )
        model.eval()
        try:
            with Client(self.url, self.api_key) as client:
                async with AsyncClient(self.url, self.api_key) as aclient:
                    runner = RolloutRunner(aclient, policy, sync_client=client, config=self.config)

                    async def group(task_id: str) -> list[Any]:
                        started = await aclient.start_episodes(
                            task_id, suite=self.suite, group_size=n
                        )
                        eps = sorted(started.episodes, key=lambda e: e.sample_idx)
                        outcomes = await asyncio.gather(
                            *(runner.run_episode(ep, queue_ms=0.0) for ep in eps)
                        )
                        return [o.record for o in outcomes]

                    try:
                        per_group = await asyncio.gather(*(group(t) for t in task_ids))
                    finally:
                        await runner.batcher.close()
        finally:
            model.train(was_training)
        return [rec for g in per_group for rec in g]
