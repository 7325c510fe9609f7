"""Bounded staleness through real HTTP with the real client: the SDK's claim and the rollout
runner send the policy version that samples the claim; the server stores it, keeps the
job's newest and applies ``max_staleness`` (refuse: a 409 and nothing claimed; flag: the
samples are run and listed as stale)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from policy_client.client import AsyncClient, Client
from policy_client.errors import ConflictError
from policy_client.policies.scripted import OraclePolicy
from policy_client.rollout import RolloutConfig, RolloutRunner
from tests.integration.api.conftest import Stack, start_stack

pytestmark = pytest.mark.docker

TASKS_DIR = Path(__file__).resolve().parents[2] / "tasks"
TASKS = ["word-frequency-top20", "access-log-top-ips"]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    yield from start_stack(tmp_path_factory.mktemp("policyversion"), pool_targets={})


def _key(stack: Stack) -> str:
    return stack.alice.headers["authorization"].split(" ", 1)[1]


def _job(stack: Stack, **schedule: object) -> str:
    r = stack.alice.post(
        "/v1/jobs",
        json={
            "suite": "terminal",
            "task_ids": TASKS,
            "policy": {"name": "oracle", "version": "1"},
            "schedule": schedule,
        },
    )
    assert r.status_code == 201, r.text
    return r.json()["id"]


def _run(stack: Stack, job_id: str, version: int) -> list:
    async def go() -> list:
        async with AsyncClient(stack.url, _key(stack)) as aclient:
            runner = RolloutRunner(
                aclient,
                OraclePolicy(TASKS_DIR / "terminal"),
                config=RolloutConfig(concurrency=1, policy_version=version),
            )
            return await runner.run_job(job_id)

    return asyncio.run(go())


def test_a_refusing_job_turns_away_stale_claims(stack: Stack) -> None:
    job_id = _job(stack, max_staleness=1, staleness="refuse")
    with Client(stack.url, _key(stack)) as client:
        first = client.claim(job_id, worker="w1", lease_s=300, policy_version=5)
        assert first is not None and first.policy_version == 5
        assert client.get_job(job_id).policy_version == 5  # the newest version seen
        with pytest.raises(ConflictError) as err:
            client.claim(job_id, worker="w2", lease_s=300, policy_version=3)
        assert err.value.status == 409
        assert "policy version 3 is 2 behind" in str(err.value)
        job = client.get_job(job_id)
        assert job.progress["items"]["queued"] == 1  # nothing was claimed
        assert job.policy_version == 5
        # the rollout runner sends its version on every claim: an old one is refused
        with pytest.raises(ConflictError, match="max_staleness is 1"):
            _run(stack, job_id, version=2)
        # one version behind is within max_staleness
        second = client.claim(job_id, worker="w2", lease_s=300, policy_version=4)
        assert second is not None and second.policy_version == 4
    assert stack.alice.post(f"/v1/jobs/{job_id}/cancel").status_code == 200


def test_a_flagging_job_runs_stale_samples_and_lists_them(stack: Stack) -> None:
    job_id = _job(stack, max_staleness=0, staleness="flag")
    with Client(stack.url, _key(stack)) as client:
        # a trainer at version 9 claimed first; its worker was lost (infrastructure)
        held = client.claim(job_id, worker="w9", lease_s=300, policy_version=9)
        assert held is not None
        client.complete(held.id, worker="w9", ok=False, error="lost", cause="infrastructure")
    outcomes = _run(stack, job_id, version=7)  # an older worker runs the whole job
    assert sorted(o.record.task_id for o in outcomes) == sorted(TASKS)
    assert all(o.record.reward == 1.0 for o in outcomes)
    job = stack.alice.get(f"/v1/jobs/{job_id}").json()
    assert job["state"] == "done", job["progress"]
    stale = job["progress"]["schedule"]["stale"]
    assert sorted(s["task_id"] for s in stale) == sorted(TASKS)
    assert {s["policy_version"] for s in stale} == {7}
    assert job["policy_version"] == job["progress"]["schedule"]["policy_version"] == 9
