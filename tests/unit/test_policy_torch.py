"""``TorchPolicy`` on a tiny random Llama saved to disk and loaded through ``from_pretrained``:
logprobs against a fresh forward pass, KV reuse against recomputation, batched against one at
a time, token accounting (chat template and the plain one), stops, context limits, and the
ids/masks/logprobs round trip through Parquet."""

from __future__ import annotations

import io
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch

from policy_client.policies.base import EpisodeContext, PolicyAction, PolicyRequest
from policy_client.policies.torch_policy import PLAIN_CHAT_TEMPLATE, TorchPolicy
from policy_client.prompt import initial_messages
from policy_client.rollout import _Trajectory
from service.rewards import RewardRecord, export_parquet
from tests.tiny_model import save_tiny_model

INSTRUCTIONS = [
    "List the files.",
    "Count the lines of main.py and write the number to out.txt, then say done.",
    "Fix git",
]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny")


@pytest.fixture(scope="module")
def plain_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("plain") / "plain", chat_template=False)


def _ctx(i: int) -> EpisodeContext:
    return EpisodeContext(
        episode_id=f"ep{i}", sandbox_id="sb", task_id="t", suite="s", instruction="", workdir="/"
    )


def _observation(turn: int, i: int) -> str:
    return f"[exit code {turn}]\n" + f"line {i} of the output\n" * (turn + i + 1)


def _episodes(
    policy: TorchPolicy, *, turns: int, episodes: list[int], one_at_a_time: bool = False
) -> dict[int, _Trajectory]:
    """Drive ``episodes`` for ``turns`` turns as a runner would; trajectories per episode."""
    messages = {i: initial_messages(INSTRUCTIONS[i % len(INSTRUCTIONS)]) for i in episodes}
    trajs = {i: _Trajectory() for i in episodes}
    for turn in range(turns):
        reqs = [
            PolicyRequest(episode=_ctx(i), messages=list(messages[i]), turn=turn) for i in episodes
        ]
        acts = [policy.act([r])[0] for r in reqs] if one_at_a_time else policy.act(reqs)
        for i, a in zip(episodes, acts, strict=True):
            trajs[i].add_tokens(a)
            messages[i] += [
                {"role": "assistant", "content": a.text},
                {"role": "user", "content": _observation(turn, i)},
            ]
    return trajs


def _fresh_logprobs(policy: TorchPolicy, traj: _Trajectory, temperature: float) -> torch.Tensor:
    """log_softmax(logits / T) of each response token from one forward pass, no cache."""
    ids = torch.tensor([traj.prompt_ids + traj.response_ids])
    with torch.no_grad():
        logits = policy.model(ids).logits[0].float()
    logp = torch.log_softmax(logits / temperature, dim=-1)
    p = len(traj.prompt_ids)
    return logp[p - 1 : -1].gather(-1, torch.tensor(traj.response_ids)[:, None]).squeeze(-1)


@pytest.mark.parametrize(("temperature", "top_p"), [(1.0, 1.0), (0.7, 0.9)])
def test_logprobs_equal_a_fresh_forward_pass(
    tiny_dir: Path, temperature: float, top_p: float
) -> None:
    policy = TorchPolicy.from_pretrained(
        tiny_dir, max_new_tokens=12, temperature=temperature, top_p=top_p, seed=3
    )
    for traj in _episodes(policy, turns=3, episodes=[0, 1, 2]).values():
        mask = torch.tensor(traj.loss_mask, dtype=torch.bool)
        assert mask.sum() > 0 and (~mask).sum() > 0
        fresh = _fresh_logprobs(policy, traj, temperature)
        got = torch.tensor(traj.logprobs)
        assert torch.allclose(got[mask], fresh[mask], atol=1e-4), (got[mask] - fresh[mask]).abs()
        assert torch.all(got[~mask] == 0.0)


def test_kv_reuse_equals_recomputation_under_greedy(tiny_dir: Path) -> None:
    reuse = TorchPolicy.from_pretrained(tiny_dir, max_new_tokens=10, temperature=0)
    again = TorchPolicy.from_pretrained(tiny_dir, max_new_tokens=10, temperature=0, reuse_kv=False)
    a = _episodes(reuse, turns=4, episodes=[0, 1, 2])
    b = _episodes(again, turns=4, episodes=[0, 1, 2])
    for i in a:
        assert a[i].prompt_ids == b[i].prompt_ids
        assert a[i].response_ids == b[i].response_ids
        assert a[i].loss_mask == b[i].loss_mask
        assert torch.allclose(torch.tensor(a[i].logprobs), torch.tensor(b[i].logprobs), atol=1e-4)
    # turn k fed only the new tokens: the cache covers everything but the last sampled token
    state = reuse._episodes["ep1"]
    assert state.cached == len(state.ids) - 1 == len(a[1].prompt_ids + a[1].response_ids) - 1
    assert state.cache[0][0].shape[2] == state.cached


def test_evicted_caches_recompute_the_same_tokens(tiny_dir: Path) -> None:
    full = TorchPolicy.from_pretrained(tiny_dir, max_new_tokens=8, temperature=0)
    bounded = TorchPolicy.from_pretrained(
        tiny_dir, max_new_tokens=8, temperature=0, max_cached_tokens=150
    )
    a = _episodes(full, turns=3, episodes=[0, 1, 2])
    b = _episodes(bounded, turns=3, episodes=[0, 1, 2])
    assert all(a[i].response_ids == b[i].response_ids for i in a)
    held = [s.cached for s in bounded._episodes.values()]
    assert sum(held) <= 150 and 0 in held  # the least recently used were dropped


def test_batched_left_padded_equals_one_at_a_time_under_greedy(tiny_dir: Path) -> None:
    batched = TorchPolicy.from_pretrained(tiny_dir, max_new_tokens=10, temperature=0)
    single = TorchPolicy.from_pretrained(tiny_dir, max_new_tokens=10, temperature=0)
    a = _episodes(batched, turns=2, episodes=[0, 1, 2])
    b = _episodes(single, turns=2, episodes=[0, 1, 2], one_at_a_time=True)
    assert len({len(t.prompt_ids) for t in a.values()}) == 3  # padding was needed
    for i in a:
        assert a[i].response_ids == b[i].response_ids
        assert torch.allclose(torch.tensor(a[i].logprobs), torch.tensor(b[i].logprobs), atol=1e-4)


def test_token_accounting_with_the_chat_template(tiny_dir: Path) -> None:
    policy = TorchPolicy.from_pretrained(tiny_dir, max_new_tokens=6, temperature=0)
    tok = policy.tokenizer
    messages = initial_messages("List the files.")
    first = policy.act([PolicyRequest(episode=_ctx(0), messages=messages, turn=0)])[0]
    rendered = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert tok.decode(first.prompt_ids) == rendered
    assert not first.observation_ids and len(first.response_ids) == len(first.logprobs) == 6
    messages += [
        {"role": "assistant", "content": first.text},
        {"role": "user", "content": "[exit code 0]\nREADME.md"},
    ]
    second = policy.act([PolicyRequest(episode=_ctx(0), messages=messages, turn=1)])[0]
    assert not second.prompt_ids
    assert tok.decode(second.observation_ids) == (
        "<|im_end|>\n<|im_start|>user\n[exit code 0]\nREADME.md<|im_end|>\n<|im_start|>assistant\n"
    )
    assert second.info["cached_tokens"] == len(first.prompt_ids) + len(first.response_ids) - 1
    # a reply that ended with the end-of-turn token is not closed a second time
    state = policy._episodes["ep0"]
    state.ids[-1], state.ended_with_eos = tok.eos_token_id, True
    tail = policy._continuation(state, [{"role": "assistant", "content": "x"}, messages[-1]])
    assert tail.startswith("\n<|im_start|>user\n")


def test_plain_template_for_a_tokenizer_without_one(plain_dir: Path) -> None:
    policy = TorchPolicy.from_pretrained(plain_dir, max_new_tokens=4, temperature=0)
    assert policy.tokenizer.chat_template == PLAIN_CHAT_TEMPLATE
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
    a = policy.act([PolicyRequest(episode=_ctx(0), messages=messages, turn=0)])[0]
    assert (
        policy.tokenizer.decode(a.prompt_ids) == "### System\nS\n\n### User\nU\n\n### Assistant\n"
    )
    messages += [{"role": "assistant", "content": a.text}, {"role": "user", "content": "O"}]
    b = policy.act([PolicyRequest(episode=_ctx(0), messages=messages, turn=1)])[0]
    assert policy.tokenizer.decode(b.observation_ids) == "\n\n### User\nO\n\n### Assistant\n"


def test_stops_at_a_fenced_block_the_done_marker_or_eos(tiny_dir: Path) -> None:
    policy = TorchPolicy.from_pretrained(tiny_dir, max_new_tokens=4)
    enc = policy._encode
    assert policy._complete(enc("```bash\nls -la\n```"))
    assert not policy._complete(enc("```bash\nls -la\n"))
    assert policy._complete(enc("I am finished <done/>"))
    assert not policy._complete(enc("cat README.md"))
    assert policy.tokenizer.eos_token_id in policy.eos_ids


def test_context_limit(tiny_dir: Path) -> None:
    messages = initial_messages("List the files.")
    probe = TorchPolicy.from_pretrained(tiny_dir, max_new_tokens=4, temperature=0)
    n_prompt = len(probe._encode(probe._render(messages, add_generation_prompt=True)))
    # the prompt does not fit: nothing is fed or sampled
    small = TorchPolicy.from_pretrained(
        tiny_dir, max_new_tokens=4, temperature=0, max_context_tokens=n_prompt
    )
    a = small.act([PolicyRequest(episode=_ctx(0), messages=messages, turn=0)])[0]
    assert a.context_exhausted and not a.prompt_ids and not a.response_ids
    # room for 2 tokens only: the reply is cut there and the episode must stop
    two = TorchPolicy.from_pretrained(
        tiny_dir, max_new_tokens=50, temperature=0, max_context_tokens=n_prompt + 2
    )
    b = two.act([PolicyRequest(episode=_ctx(0), messages=messages, turn=0)])[0]
    if b.response_ids[-1] not in two.eos_ids:
        assert b.context_exhausted and len(b.response_ids) == 2
    two.end_episode("ep0")
    assert "ep0" not in two._episodes


def test_ids_masks_and_logprobs_round_trip_through_parquet(tiny_dir: Path) -> None:
    policy = TorchPolicy.from_pretrained(tiny_dir, max_new_tokens=8, seed=0)
    trajs = _episodes(policy, turns=2, episodes=[0, 1])
    records = []
    for i, traj in trajs.items():
        body = traj.payload(policy, "max_turns", 0.0)
        records.append(
            RewardRecord(
                episode_id=f"ep{i}",
                group_id="g",
                sample_idx=i,
                task_id="t",
                task_version="1",
                suite="s",
                domain="terminal",
                template="terminal",
                image_digest="sha256:x",
                policy=body["policy"],
                reward=0.0,
                verifier={"name": "terminal", "version": "1", "status": "ok"},
                stop_reason=body["stop_reason"],
                prompt_ids=body["prompt_ids"],
                response_ids=body["response_ids"],
                loss_mask=body["loss_mask"],
                rollout_logprobs=body["rollout_logprobs"],
                sandbox_id="sb",
            )
        )
    buf = io.BytesIO()
    export_parquet(records, buf)
    rows = pq.read_table(io.BytesIO(buf.getvalue())).to_pylist()
    for rec, row in zip(records, rows, strict=True):
        assert row["prompt_ids"] == rec.prompt_ids and row["response_ids"] == rec.response_ids
        assert row["loss_mask"] == rec.loss_mask
        f32 = torch.tensor(rec.rollout_logprobs, dtype=torch.float32).tolist()
        assert row["rollout_logprobs"] == f32
        assert len(row["loss_mask"]) == len(row["response_ids"]) == len(row["rollout_logprobs"])


def test_text_only_turns_leave_no_tokens() -> None:
    traj = _Trajectory()
    traj.add_tokens(PolicyAction(text="a", prompt_ids=[1, 2], response_ids=[3], logprobs=[-1.0]))
    traj.add_tokens(PolicyAction(text="b"))  # a turn without tokens: the sequence has a hole
    body = traj.payload(type("P", (), {"name": "p", "version": "1"})(), "max_turns", 0.0)
    assert body["prompt_ids"] == body["response_ids"] == body["loss_mask"] == []
    assert body["rollout_logprobs"] == []
