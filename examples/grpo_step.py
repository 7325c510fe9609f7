"""One GRPO policy-gradient step from Crucible reward records (Parquet), on the model that
produced them.

    .venv/bin/python examples/grpo_step.py records/job_....parquet --model ckpt/ [--lr 1e-5]

1. Reads the records' ``group_id``, ``reward``, ``verifier.status``, ``exclude_from_loss``,
   ``prompt_ids``, ``response_ids``, ``loss_mask``, ``rollout_logprobs`` and ``policy``.
2. Advantages per group with ``service.rewards.grpo_advantages`` (``(r - mean) / (std + eps)``,
   sample std; ``--normalize mean`` for Dr. GRPO's ``r - mean``). Records that are not valid
   (verifier error/timeout, excluded) and records without tokens or logprobs are dropped.
3. Recomputes each response token's logprob with the current weights, **with the same
   definition the rollout used** (``TorchPolicy``: ``log_softmax(logits / T)`` of the sampled
   token, before top-p; ``T`` is read from the record's ``policy.version``, ``T=<t>,...``,
   unless ``--temperature`` says otherwise). Before the update the weights are the rollout's,
   so ``new - old`` is ~0 on every sampled token (printed: it checks the definitions match).
4. PPO-clip surrogate per token, ``ratio = exp(new - old)``:
   ``-min(ratio * A, clip(ratio, 1 - eps, 1 + eps) * A)``, averaged over the tokens with
   ``loss_mask = 1`` of the whole batch (observation tokens carry no loss), one optimizer step.
5. Prints the loss, the ratio statistics, and how much the parameters moved.

A batch whose groups all have equal rewards (e.g. every reward 0) has all-zero advantages and
hence no gradient: the script says so and leaves the weights alone.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq
import torch

from service.rewards import DEFAULT_EPS, grpo_advantages, mean_advantages

COLUMNS = [
    "record_id",
    "group_id",
    "reward",
    "verifier",
    "exclude_from_loss",
    "policy",
    "prompt_ids",
    "response_ids",
    "loss_mask",
    "rollout_logprobs",
]


@dataclass
class Sample:
    """One trajectory ready for the loss. Shapes: ``prompt_ids`` (P,); ``response_ids``,
    ``loss_mask``, ``old_logprobs`` (R,)."""

    record_id: str
    group_id: str
    reward: float | None
    prompt_ids: list[int]
    response_ids: list[int]
    loss_mask: list[int]
    old_logprobs: list[float]
    policy_version: str
    advantage: float | None = None


def load(path: str | Path) -> list[Sample]:
    """The records of a Crucible Parquet export, invalid ones with ``reward = None``."""
    rows = pq.read_table(path, columns=COLUMNS).to_pylist()
    return [
        Sample(
            record_id=r["record_id"],
            group_id=r["group_id"],
            reward=r["reward"]
            if r["verifier"]["status"] == "ok" and not r["exclude_from_loss"]
            else None,
            prompt_ids=r["prompt_ids"],
            response_ids=r["response_ids"],
            loss_mask=r["loss_mask"],
            old_logprobs=r["rollout_logprobs"],
            policy_version=r["policy"]["version"],
        )
        for r in rows
    ]


def with_advantages(samples: list[Sample], *, normalize: str, eps: float) -> list[Sample]:
    """Set each sample's group advantage; return the samples that can enter the loss."""
    groups: dict[str, list[Sample]] = {}
    for s in samples:
        groups.setdefault(s.group_id, []).append(s)
    for members in groups.values():
        rewards = [m.reward for m in members]
        advs = (
            grpo_advantages(rewards, eps=eps) if normalize == "grpo" else mean_advantages(rewards)
        )
        for m, a in zip(members, advs, strict=True):
            m.advantage = a
    return [
        s
        for s in samples
        if s.advantage is not None
        and s.response_ids
        and len(s.old_logprobs) == len(s.response_ids)
        and any(s.loss_mask)
    ]


def rollout_temperature(samples: list[Sample]) -> float:
    """``T`` from the records' ``policy.version`` (``T=<t>,top_p=<p>+prompt1``)."""
    found = {
        m.group(1) for s in samples if (m := re.search(r"\bT=([0-9.eE+-]+)", s.policy_version))
    }
    if len(found) != 1:
        raise SystemExit(
            f"cannot tell the rollout temperature from policy versions {found or '{}'}: "
            "pass --temperature"
        )
    t = float(found.pop())
    return t if t > 0 else 1.0  # greedy rollouts report raw (T = 1) logprobs


def token_logprobs(model: torch.nn.Module, samples: list[Sample], temperature: float) -> tuple:
    """Per response token: new logprob ``log_softmax(logits / T)[token]``, old logprob,
    loss mask, advantage; each (B, R) right-padded (mask 0 on padding)."""
    device = next(model.parameters()).device
    seqs = [s.prompt_ids + s.response_ids for s in samples]
    length = max(map(len, seqs))
    r_max = max(len(s.response_ids) for s in samples)
    ids = torch.zeros((len(samples), length), dtype=torch.long, device=device)
    attention = torch.zeros_like(ids)
    for i, seq in enumerate(seqs):
        ids[i, : len(seq)] = torch.tensor(seq)
        attention[i, : len(seq)] = 1
    logits = model(input_ids=ids, attention_mask=attention).logits.float()
    logp = torch.log_softmax(logits / temperature, dim=-1)
    new = torch.zeros((len(samples), r_max), device=device)
    old = torch.zeros_like(new)
    mask = torch.zeros_like(new)
    for i, s in enumerate(samples):
        p, r = len(s.prompt_ids), len(s.response_ids)
        targets = torch.tensor(s.response_ids, device=device)
        new[i, :r] = logp[i, p - 1 : p - 1 + r].gather(-1, targets[:, None]).squeeze(-1)
        old[i, :r] = torch.tensor(s.old_logprobs, device=device)
        mask[i, :r] = torch.tensor(s.loss_mask, dtype=torch.float32, device=device)
    adv = torch.tensor([s.advantage for s in samples], device=device)[:, None].expand_as(new)
    return new, old, mask, adv


def ppo_clip_loss(
    new: torch.Tensor, old: torch.Tensor, mask: torch.Tensor, adv: torch.Tensor, clip_eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-mean PPO-clip surrogate over ``mask`` and the importance ratios (B, R)."""
    ratio = torch.exp(new - old)
    surrogate = torch.minimum(ratio * adv, torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps) * adv)
    return -(surrogate * mask).sum() / mask.sum().clamp(min=1), ratio


def main(argv: list[str] | None = None) -> dict[str, float]:
    """Run the step; return the printed figures (for tests)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("records", help="a Crucible Parquet export")
    ap.add_argument("--model", required=True, help="the model folder the rollout used")
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--clip-eps", type=float, default=0.2)
    ap.add_argument("--normalize", choices=("grpo", "mean"), default="grpo")
    ap.add_argument("--eps", type=float, default=DEFAULT_EPS)
    ap.add_argument("--temperature", type=float, help="default: from the records' policy")
    args = ap.parse_args(argv)

    from transformers import AutoModelForCausalLM

    samples = with_advantages(load(args.records), normalize=args.normalize, eps=args.eps)
    if not samples:
        raise SystemExit("no record with tokens, logprobs and a valid reward")
    temperature = args.temperature or rollout_temperature(samples)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    model.eval()  # no dropout: the logprobs must be the rollout's; gradients still flow
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    new, old, mask, adv = token_logprobs(model, samples, temperature)
    drift = ((new - old).abs() * mask).max().item()
    loss, ratio = ppo_clip_loss(new, old, mask, adv, args.clip_eps)
    print(
        f"{len(samples)} trajectories, {int(mask.sum())} sampled tokens, T={temperature:g}, "
        f"advantages {adv[:, 0].min().item():+.4f}..{adv[:, 0].max().item():+.4f}"
    )
    print(f"max |logprob_new - logprob_rollout| before the step: {drift:.2e}")
    masked = ratio[mask.bool()]
    print(f"loss {loss.item():+.6f}; ratio mean {masked.mean().item():.6f}")
    if not adv.abs().any():
        print("every advantage is 0 (each group's rewards are equal): no gradient, no step")
        return {"loss": loss.item(), "drift": drift, "delta": 0.0}
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    optimizer.zero_grad()
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf")).item()
    optimizer.step()
    delta = (
        sum((p.detach() - before[n]).pow(2).sum().item() for n, p in model.named_parameters())
        ** 0.5
    )
    changed = sum(1 for n, p in model.named_parameters() if not torch.equal(p, before[n]))
    print(
        f"grad norm {grad_norm:.4e}; parameters changed: {changed > 0} "
        f"({changed} tensors, L2 distance {delta:.4e})"
    )
    with torch.no_grad():
        after, _, _, _ = token_logprobs(model, samples, temperature)
        new_loss, _ = ppo_clip_loss(after, old, mask, adv, args.clip_eps)
    print(f"loss after the step {new_loss.item():+.6f}")
    return {
        "loss": loss.item(),
        "loss_after": new_loss.item(),
        "drift": drift,
        "delta": delta,
        "changed": float(changed),
    }


if __name__ == "__main__":
    main()
    sys.exit(0)
