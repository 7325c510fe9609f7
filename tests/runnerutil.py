"""Running a job through the bundled ``RolloutRunner`` over real HTTP, as tests of the
runner need it (policies are the tests' own)."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from policy_client.client import AsyncClient, Client
from policy_client.rollout import RolloutConfig, RolloutRunner


def key_of(client: httpx.Client) -> str:
    """The API key a test client sends (its bearer token)."""
    return client.headers["authorization"].split(" ", 1)[1]


def run_job(
    url: str,
    key: str,
    job_id: str,
    policy: Any,
    *,
    timeout_s: float,
    client: dict[str, Any] | None = None,
    **config: Any,
) -> RolloutRunner:
    """Run ``job_id`` to its end with ``policy`` on the server at ``url`` as ``key``'s
    tenant; returns the runner (its ``outcomes``, ``stragglers``). ``config``: the
    ``RolloutConfig`` fields (``batch_wait_s`` 0.01 unless given); ``client``: options of
    both clients (``timeout_s``, ``retry_deadline_s``, ...). Raises ``TimeoutError`` past
    ``timeout_s`` seconds, and whatever ``run_job`` raises."""
    config = {"batch_wait_s": 0.01, **config}

    async def go() -> RolloutRunner:
        async with AsyncClient(url, key, **(client or {})) as aclient:
            with Client(url, key, **(client or {})) as sync_client:
                runner = RolloutRunner(
                    aclient, policy, sync_client=sync_client, config=RolloutConfig(**config)
                )
                await asyncio.wait_for(runner.run_job(job_id), timeout_s)
                return runner

    return asyncio.run(go())
