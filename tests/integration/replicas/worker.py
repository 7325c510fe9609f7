"""A rollout worker for the replica tests: the oracle policy on one job through one replica,
with a short claim lease (``python -m tests.integration.replicas.worker URL KEY JOB``)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from policy_client.client import AsyncClient, Client
from policy_client.policies.scripted import OraclePolicy
from policy_client.rollout import RolloutConfig, RolloutRunner

SUITE = Path(__file__).resolve().parents[3] / "tasks" / "terminal"
CLAIM_LEASE_S = 6.0


async def _run(url: str, key: str, job_id: str) -> int:
    with Client(url, key) as sync:
        async with AsyncClient(url, key) as client:
            runner = RolloutRunner(
                client,
                OraclePolicy(SUITE),
                sync_client=sync,
                config=RolloutConfig(concurrency=2, claim_lease_s=CLAIM_LEASE_S),
            )
            outcomes = await runner.run_job(job_id)
    print(len(outcomes), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(_run(*sys.argv[1:4])))
