"""The CI gate over every bundled suite: each task's oracle scores 1.0 and its no-op 0,
through the real service, the real rollout runner and the real verifiers."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from policy_client import calls
from policy_client.client import AsyncClient, Client
from policy_client.policies.scripted import NoopPolicy, OraclePolicy
from policy_client.rollout import RolloutConfig, RolloutRunner
from tests.integration.api.conftest import Stack

pytestmark = pytest.mark.docker

TASKS = Path(__file__).resolve().parents[3] / "tasks"
SUITES = sorted(
    p.name
    for p in TASKS.iterdir()
    if p.is_dir() and not p.name.startswith(("_", ".")) and any(p.glob("*/task.toml"))
)


@pytest.mark.parametrize("suite", SUITES)
@pytest.mark.parametrize(("policy", "expected"), [("oracle", 1.0), ("noop", 0.0)])
def test_every_task(stack: Stack, suite: str, policy: str, expected: float) -> None:
    key = stack.alice.headers["authorization"].split(" ", 1)[1]
    pol = OraclePolicy(TASKS / suite) if policy == "oracle" else NoopPolicy()
    with Client(stack.url, key) as client:
        job = client.run(
            calls.create_job(suite=suite, policy={"name": pol.name, "version": pol.version})
        )

        async def go() -> list:
            async with AsyncClient(stack.url, key) as aclient:
                runner = RolloutRunner(
                    aclient,
                    pol,
                    sync_client=client,
                    config=RolloutConfig(concurrency=3, max_turns=3),
                )
                return await runner.run_job(job.id)

        outcomes = asyncio.run(go())
        final = client.run(calls.get_job(job.id))
    got = {o.record.task_id: (o.record.reward, o.record.verifier.status) for o in outcomes}
    wrong = {t: v for t, v in got.items() if v != (expected, "ok")}
    assert set(got) == set(job.task_ids), f"missing episodes: {set(job.task_ids) - set(got)}"
    assert not wrong, f"{policy} on {suite}: {wrong}"
    assert final.state == "done" and final.progress["items"]["done"] == len(job.task_ids)
