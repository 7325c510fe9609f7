"""``RolloutRunner.run_episode`` and ``Batcher`` against a MockTransport server: batching across
episodes, the token layout of a record, and every stop reason."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import Any

import httpx

from policy_client.client import AsyncClient, Client
from policy_client.policies.base import EpisodeContext, PolicyAction, PolicyRequest
from policy_client.rollout import RolloutConfig, RolloutRunner
from service.schemas import EpisodeOut

COMMAND = "```bash\nls\n```"


class ScriptedTokens:
    """A fake token policy: prompt ids [1, 2], observation ids [7] per later turn, two sampled
    ids per turn with logprobs -0.5, -0.25. ``exhaust_at`` / ``fail_at``: the turn at which it
    reports a full context / raises; ``sleep_s`` per batch."""

    name, version = "scripted-tokens", "1"

    def __init__(
        self, *, exhaust_at: int | None = None, fail_at: int | None = None, sleep_s: float = 0.0
    ):
        self.exhaust_at, self.fail_at, self.sleep_s = exhaust_at, fail_at, sleep_s
        self.batches: list[int] = []
        self.ended: list[str] = []
        self.lock = threading.Lock()

    def act(self, batch: list[PolicyRequest]) -> list[PolicyAction]:
        with self.lock:
            self.batches.append(len(batch))
        time.sleep(self.sleep_s)
        out = []
        for r in batch:
            if r.turn == self.fail_at:
                raise RuntimeError("CUDA out of memory")
            if r.turn == self.exhaust_at:
                out.append(PolicyAction(text="", context_exhausted=True))
                continue
            out.append(
                PolicyAction(
                    text=COMMAND,
                    prompt_ids=[1, 2] if r.turn == 0 else [],
                    observation_ids=[7] if r.turn else [],
                    response_ids=[10 + r.turn, 20 + r.turn],
                    logprobs=[-0.5, -0.25],
                )
            )
        return out

    def prepare(self, episode: EpisodeContext, client: Any) -> None:
        pass

    def end_episode(self, episode_id: str) -> None:
        self.ended.append(episode_id)


def _record_from(episode_id: str, body: dict[str, Any]) -> dict[str, Any]:
    return {
        "episode_id": episode_id,
        "group_id": "g",
        "sample_idx": 0,
        "task_id": "t",
        "task_version": "1",
        "suite": "s",
        "domain": "terminal",
        "template": "terminal",
        "image_digest": "sha256:x",
        "reward": 0.0,
        "verifier": {"name": "terminal", "version": "1", "status": "ok"},
        "sandbox_id": "sb",
        "exclude_from_loss": body["exclude_from_loss"],
        **{
            k: body[k]
            for k in (
                "policy",
                "stop_reason",
                "turns",
                "prompt_ids",
                "response_ids",
                "loss_mask",
                "rollout_logprobs",
                "timing",
            )
        },
    }


def _handler(exec_s: float = 0.0):  # noqa: ANN202
    execs: list[dict] = []

    async def handle(request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path.endswith("/exec"):
            execs.append(json.loads(request.content))
            await asyncio.sleep(exec_s)
            return httpx.Response(
                200,
                json={
                    "exit_code": 0,
                    "signal": None,
                    "timed_out": False,
                    "oom_killed": False,
                    "stdout": "a\nb\n",
                    "stderr": "",
                    "stdout_bytes": 4,
                    "stderr_bytes": 0,
                    "stdout_truncated": False,
                    "stderr_truncated": False,
                    "duration_ms": 1.5,
                },
            )
        if path.endswith("/verify"):
            episode_id = path.split("/")[3]
            return httpx.Response(200, json=_record_from(episode_id, json.loads(request.content)))
        return httpx.Response(404, json={"title": "Not found", "detail": path})

    return handle, execs


def _episode(i: int, *, timeout_s: float = 600.0) -> EpisodeOut:
    return EpisodeOut(
        id=f"ep{i}",
        group_id="g",
        sample_idx=i,
        task_id="t",
        suite="s",
        domain="terminal",
        task_version="1",
        sandbox_id=f"sb{i}",
        state="running",
        instruction="do it",
        workdir="/app",
        agent_timeout_s=timeout_s,
    )


def _run(policy: Any, episodes: list[EpisodeOut], *, exec_s: float = 0.0, **config: Any):  # noqa: ANN202
    handle, execs = _handler(exec_s)

    async def go() -> list:
        async with AsyncClient("http://x", transport=httpx.MockTransport(handle)) as client:
            runner = RolloutRunner(
                client,
                policy,
                sync_client=Client("http://x"),
                config=RolloutConfig(**config),
            )
            try:
                return await asyncio.gather(
                    *(runner.run_episode(e, queue_ms=1.0) for e in episodes)
                )
            finally:
                await runner.batcher.close()

    return [o.record for o in asyncio.run(go())], execs


def test_batches_across_episodes_and_lays_out_tokens() -> None:
    policy = ScriptedTokens(sleep_s=0.05)
    records, execs = _run(
        policy, [_episode(i) for i in range(6)], max_turns=3, batch_size=4, batch_wait_s=0.05
    )
    assert max(policy.batches) == 4 and sum(policy.batches) == 18
    assert sorted(policy.ended) == [f"ep{i}" for i in range(6)]
    assert len(execs) == 18 and execs[0]["cwd"] == "/app" and execs[0]["cmd"] == "ls"
    for rec in records:
        assert rec.stop_reason == "max_turns" and len(rec.turns) == 3
        assert rec.prompt_ids == [1, 2]
        assert rec.response_ids == [10, 20, 7, 11, 21, 7, 12, 22]
        assert rec.loss_mask == [1, 1, 0, 1, 1, 0, 1, 1]
        assert rec.rollout_logprobs == [-0.5, -0.25, 0.0, -0.5, -0.25, 0.0, -0.5, -0.25]
        assert rec.policy.version == "1+prompt1" and rec.timing.policy_ms > 0


def test_a_full_context_stops_with_context_length() -> None:
    records, _ = _run(ScriptedTokens(exhaust_at=2), [_episode(0)], max_turns=5)
    rec = records[0]
    assert rec.stop_reason == "context_length" and len(rec.turns) == 2
    assert rec.response_ids == [10, 20, 7, 11, 21] and rec.loss_mask == [1, 1, 0, 1, 1]


def test_the_agent_timeout_stops_the_episode() -> None:
    records, execs = _run(ScriptedTokens(), [_episode(0, timeout_s=0.3)], exec_s=0.2, max_turns=50)
    assert records[0].stop_reason == "agent_timeout"
    assert 1 <= len(execs) <= 3
    assert execs[0]["timeout_s"] <= 0.3


def test_a_policy_failure_is_an_error_excluded_from_the_loss() -> None:
    records, _ = _run(ScriptedTokens(fail_at=1), [_episode(0)], max_turns=5)
    assert records[0].stop_reason == "error" and records[0].exclude_from_loss
