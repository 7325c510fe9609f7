"""``Batcher``: an episode cancelled while its request is in a running batch (a straggler cut)
does not fail the other episodes of that batch."""

from __future__ import annotations

import asyncio
import time

from policy_client.policies.base import EpisodeContext, PolicyAction, PolicyRequest
from policy_client.rollout import Batcher


class SlowEcho:
    """Answers each request with its episode id, after 0.3 s per batch."""

    name, version = "echo", "1"

    def act(self, batch: list[PolicyRequest]) -> list[PolicyAction]:
        time.sleep(0.3)
        return [PolicyAction(text=r.episode.episode_id) for r in batch]


def _request(i: int) -> PolicyRequest:
    ctx = EpisodeContext(
        episode_id=f"ep{i}", sandbox_id="sb", task_id="t", suite="s", instruction="", workdir="/"
    )
    return PolicyRequest(episode=ctx, messages=[], turn=0)


def test_a_cancelled_request_leaves_the_rest_of_its_batch_answered() -> None:
    async def go() -> list[str]:
        batcher = Batcher(SlowEcho(), batch_size=3, wait_s=0.05)  # type: ignore[arg-type]
        tasks = [asyncio.create_task(batcher.act(_request(i))) for i in range(3)]
        await asyncio.sleep(0.15)  # the batch of three is in the policy's thread now
        tasks[0].cancel()
        done = await asyncio.gather(*tasks[1:])
        await batcher.close()
        assert batcher.batches == [3]
        return [a.text for a in done]

    assert asyncio.run(go()) == ["ep1", "ep2"]
