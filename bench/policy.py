"""TorchPolicy throughput: batched sampling against one-at-a-time ``generate``, and KV reuse
across an episode's turns against recomputation, both measured in the same run.

    .venv/bin/python bench/policy.py [--repeats 3] [--batch 16] [--turns 8] [--json]

The model is ``tests/tiny_model.py``'s ``BENCH`` size (a random 4-layer Llama, hidden 512,
~12 M parameters) saved to a temporary folder and loaded with ``TorchPolicy.from_pretrained``;
on CPU (float32, torch's default threads) a forward pass there costs more than the Python
around it, so the comparisons measure the model work, not interpreter overhead.

- Batching: ``--batch`` episodes' first turns, greedy, ``--max-new-tokens`` each, in one
  ``TorchPolicy.act`` call, against ``model.generate`` (greedy, same new-token limit) called
  once per prompt, one after the other. Figures are sampled tokens per second; the greedy
  tokens of both are compared (a sanity check: they must agree).
  Target (issue 4): >= 4x at batch 16 on CPU.
- KV reuse: ``--kv-episodes`` (2) episodes batched together for ``--turns`` (8) turns of
  ``--kv-new-tokens`` (24) sampled tokens, each later turn appending a shell-like
  observation of ``--obs-lines`` (12) lines (~470 tokens with this small tokenizer);
  ``TorchPolicy`` keeping each episode's KV cache (feeds only the new tokens) against the
  same policy with ``reuse_kv=False`` (re-feeds the whole history every turn). Figures:
  wall time of all the turns; the greedy tokens must agree. Target (issue 4): >= 2x over 8
  turns. KV reuse saves prefill only: the sampled tokens cost the same either way, so the
  ratio grows with the observation length and the batch (decode steps are shared by the
  batch, prefill is not) and shrinks with longer replies; one episode alone gives ~2x here.

Each measurement is repeated ``--repeats`` times, the policy and its baseline alternating.
The table shows the best (minimum) and the median wall time of each; the speed-up compared
with the target is ``baseline best / policy best`` (on a shared machine the minimum is the
least disturbed figure, as ``timeit`` advises), the median one is shown beside it.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from harness import Series  # noqa: E402

from policy_client.policies.base import EpisodeContext, PolicyRequest  # noqa: E402
from policy_client.policies.torch_policy import TorchPolicy  # noqa: E402
from policy_client.prompt import initial_messages  # noqa: E402
from tests.tiny_model import BENCH, save_tiny_model  # noqa: E402

TASKS = [
    "List the files in /app and count the Python ones.",
    "Find the ten most frequent words in /data/book.txt.",
    "Repair the INI file so that configparser reads it.",
    "Migrate the sqlite schema to version 3 without losing rows.",
]


def _ctx(i: int) -> EpisodeContext:
    return EpisodeContext(
        episode_id=f"ep{i}", sandbox_id="sb", task_id="t", suite="s", instruction="", workdir="/"
    )


def _requests(n: int) -> list[PolicyRequest]:
    return [
        PolicyRequest(episode=_ctx(i), messages=initial_messages(f"{TASKS[i % 4]} (#{i})"), turn=0)
        for i in range(n)
    ]


def _observation(turn: int, lines: int) -> str:
    rows = [
        f"-rw-r--r-- 1 root root {1000 + 37 * k} Jan {turn + 1:2d} file_{turn}_{k}.py"
        for k in range(lines)
    ]
    return "[exit code 0]\n" + "\n".join(rows)


def bench_batching(
    policy: TorchPolicy, *, batch: int, repeats: int
) -> tuple[Series, Series, dict[str, float | bool]]:
    """Seconds per run (as ms Series) of one batched ``act`` and of ``batch`` sequential
    ``generate`` calls, plus token counts and whether the greedy tokens agree."""
    reqs = _requests(batch)
    model, tok = policy.model, policy.tokenizer
    policy.act(reqs[:2])  # warm up kernels and allocator
    for r in reqs:
        policy.end_episode(r.episode.episode_id)
    ours, base = [], []
    tokens_ours = tokens_base = 0
    agree = True
    for _ in range(repeats):
        t0 = time.perf_counter()
        actions = policy.act(reqs)
        ours.append((time.perf_counter() - t0) * 1e3)
        tokens_ours = sum(len(a.response_ids) for a in actions)
        for r in reqs:
            policy.end_episode(r.episode.episode_id)
        t0 = time.perf_counter()
        outs = []
        with torch.inference_mode():
            for a in actions:
                ids = torch.tensor([a.prompt_ids], device=policy.device)
                out = model.generate(
                    ids,
                    attention_mask=torch.ones_like(ids),
                    max_new_tokens=policy.max_new_tokens,
                    do_sample=False,
                    pad_token_id=tok.pad_token_id,
                )
                outs.append(out[0, ids.shape[1] :].tolist())
        base.append((time.perf_counter() - t0) * 1e3)
        tokens_base = sum(map(len, outs))
        # generate stops only at EOS; the policy also stops at a complete command block
        agree &= all(
            o[: len(a.response_ids)] == a.response_ids for o, a in zip(outs, actions, strict=True)
        )
    facts = {"tokens_policy": tokens_ours, "tokens_generate": tokens_base, "greedy_agree": agree}
    return (
        Series(f"TorchPolicy.act, batch of {batch}", ours),
        Series(f"generate x {batch}, one at a time", base),
        facts,
    )


def _episode_run(policy: TorchPolicy, *, episodes: int, turns: int, lines: int) -> list[list]:
    """Drive ``episodes`` episodes for ``turns`` turns; each episode's sampled ids per turn."""
    messages = {i: initial_messages(TASKS[i % 4]) for i in range(episodes)}
    sampled: dict[int, list] = {i: [] for i in range(episodes)}
    for turn in range(turns):
        reqs = [
            PolicyRequest(episode=_ctx(i), messages=list(messages[i]), turn=turn)
            for i in range(episodes)
        ]
        for i, a in enumerate(policy.act(reqs)):
            sampled[i].append(a.response_ids)
            messages[i] += [
                {"role": "assistant", "content": a.text},
                {"role": "user", "content": _observation(turn, lines)},
            ]
    for i in range(episodes):
        policy.end_episode(f"ep{i}")
    return list(sampled.values())


def bench_kv(
    reuse: TorchPolicy,
    recompute: TorchPolicy,
    *,
    episodes: int,
    turns: int,
    lines: int,
    repeats: int,
) -> tuple[Series, Series, dict[str, float | bool]]:
    """Wall time (ms) of ``turns`` turns with and without KV reuse; context size; agreement."""
    _episode_run(reuse, episodes=episodes, turns=2, lines=lines)  # warm-up
    ours, base = [], []
    agree = True
    for _ in range(repeats):
        t0 = time.perf_counter()
        a = _episode_run(reuse, episodes=episodes, turns=turns, lines=lines)
        ours.append((time.perf_counter() - t0) * 1e3)
        t0 = time.perf_counter()
        b = _episode_run(recompute, episodes=episodes, turns=turns, lines=lines)
        base.append((time.perf_counter() - t0) * 1e3)
        agree &= a == b
    probe = initial_messages(TASKS[0])
    obs_tokens = len(reuse._encode(_observation(0, lines)))
    prompt_tokens = len(reuse._encode(reuse._render(probe, add_generation_prompt=True)))
    facts = {
        "greedy_agree": agree,
        "prompt_tokens": prompt_tokens,
        "observation_tokens_per_turn": obs_tokens,
        "max_new_tokens": reuse.max_new_tokens,
    }
    return (
        Series(f"{turns} turns, KV reuse", ours),
        Series(f"{turns} turns, recomputation", base),
        facts,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", "--n", type=int, default=3, help="samples per measurement")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--kv-episodes", type=int, default=2)
    ap.add_argument("--kv-new-tokens", type=int, default=24)
    ap.add_argument("--obs-lines", type=int, default=12)
    ap.add_argument("--json", action="store_true", help="machine-readable output")
    args = ap.parse_args()
    console = Console(stderr=args.json)

    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    with tempfile.TemporaryDirectory(prefix="crucible-bench-model-") as tmp:
        path = save_tiny_model(Path(tmp) / "bench-llama", BENCH)
        params = sum(
            p.numel()
            for p in TorchPolicy.from_pretrained(path, max_new_tokens=1).model.parameters()
        )
        batched = TorchPolicy.from_pretrained(
            path, max_new_tokens=args.max_new_tokens, temperature=0
        )
        reuse = TorchPolicy.from_pretrained(path, max_new_tokens=args.kv_new_tokens, temperature=0)
        recompute = TorchPolicy.from_pretrained(
            path, max_new_tokens=args.kv_new_tokens, temperature=0, reuse_kv=False
        )
        with console.status("batched sampling vs one-at-a-time generate"):
            b_ours, b_base, b_facts = bench_batching(
                batched, batch=args.batch, repeats=args.repeats
            )
        with console.status("KV reuse vs recomputation"):
            k_ours, k_base, k_facts = bench_kv(
                reuse,
                recompute,
                episodes=args.kv_episodes,
                turns=args.turns,
                lines=args.obs_lines,
                repeats=args.repeats,
            )

    tok_s_ours = b_facts["tokens_policy"] / (min(b_ours.ms) / 1e3)
    tok_s_base = b_facts["tokens_generate"] / (min(b_base.ms) / 1e3)
    batch_speedup = tok_s_ours / tok_s_base
    batch_speedup_p50 = (b_facts["tokens_policy"] / b_ours.p50) / (
        b_facts["tokens_generate"] / b_base.p50
    )
    kv_speedup = min(k_base.ms) / min(k_ours.ms)
    kv_speedup_p50 = k_base.p50 / k_ours.p50
    result = {
        "device": str(batched.device),
        "torch_threads": torch.get_num_threads(),
        "model_parameters": params,
        "batching": {
            "batch": args.batch,
            "max_new_tokens": args.max_new_tokens,
            "policy": {**b_ours.summary(), "min_ms": round(min(b_ours.ms), 3)},
            "generate": {**b_base.summary(), "min_ms": round(min(b_base.ms), 3)},
            "tokens_per_s_policy": round(tok_s_ours, 1),
            "tokens_per_s_generate": round(tok_s_base, 1),
            "speedup": round(batch_speedup, 2),
            "speedup_p50": round(batch_speedup_p50, 2),
            "target": 4.0,
            **b_facts,
        },
        "kv_reuse": {
            "turns": args.turns,
            "episodes": args.kv_episodes,
            "reuse": {**k_ours.summary(), "min_ms": round(min(k_ours.ms), 3)},
            "recompute": {**k_base.summary(), "min_ms": round(min(k_base.ms), 3)},
            "speedup": round(kv_speedup, 2),
            "speedup_p50": round(kv_speedup_p50, 2),
            "target": 2.0,
            **k_facts,
        },
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return
    table = Table(
        title=f"TorchPolicy on {result['device']} ({params / 1e6:.1f} M parameters, "
        f"{result['torch_threads']} threads)"
    )
    for col in ("operation", "n", "best ms", "p50 ms", "tokens/s (best)"):
        table.add_column(col, justify="left" if col == "operation" else "right")
    for series, tokens in (
        (b_ours, b_facts["tokens_policy"]),
        (b_base, b_facts["tokens_generate"]),
        (k_ours, None),
        (k_base, None),
    ):
        rate = f"{tokens / (min(series.ms) / 1e3):.0f}" if tokens else "-"
        table.add_row(
            series.name, str(len(series.ms)), f"{min(series.ms):.0f}", f"{series.p50:.0f}", rate
        )
    console.print(table)
    for what, speedup, p50, target in (
        ("batched sampling vs one-at-a-time generate", batch_speedup, batch_speedup_p50, 4.0),
        (f"KV reuse vs recomputation over {args.turns} turns", kv_speedup, kv_speedup_p50, 2.0),
    ):
        verdict = "[green]met[/]" if speedup >= target else "[red]missed[/]"
        console.print(
            f"{what}: [bold]{speedup:.2f}x[/] (p50 {p50:.2f}x); target >= {target:g}x {verdict}"
        )
    console.print(
        f"batching: {args.batch} prompts x {args.max_new_tokens} new tokens, greedy tokens "
        f"agree: {b_facts['greedy_agree']}. KV: {args.kv_episodes} episode(s), prompt "
        f"{k_facts['prompt_tokens']} tokens + {args.turns - 1} observations of "
        f"{k_facts['observation_tokens_per_turn']}, {args.kv_new_tokens} new tokens a turn, "
        f"greedy tokens agree: {k_facts['greedy_agree']}."
    )


if __name__ == "__main__":
    main()
