"""A mixed-domain job over the three bundled suites through the real service: the real
rollout runner and oracle solutions, real sandboxes and verifiers; and the schedule's 4xx."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from policy_client.client import AsyncClient, Client
from policy_client.policies.base import EpisodeContext, PolicyAction, PolicyRequest
from policy_client.policies.scripted import OraclePolicy
from policy_client.rollout import RolloutConfig, RolloutRunner
from service.db.models import Job
from tests.integration.api.conftest import Stack, start_stack

pytestmark = pytest.mark.docker

TASKS = Path(__file__).resolve().parents[3] / "tasks"
WEIGHTS = {"terminal": 0.5, "document": 0.3, "cad": 0.2}
GROUPS = 10


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    yield from start_stack(tmp_path_factory.mktemp("mixed"))


class SuiteOracle:
    """The oracle of whichever bundled suite the episode's task is in."""

    name, version = "oracle", "1"

    def __init__(self) -> None:
        self.by_suite = {s: OraclePolicy(TASKS / s) for s in WEIGHTS}
        self.suite_of: dict[str, str] = {}

    def prepare(self, episode: EpisodeContext, client: Any) -> None:
        self.suite_of[episode.episode_id] = episode.suite
        self.by_suite[episode.suite].prepare(episode, client)

    def act(self, batch: list[PolicyRequest]) -> list[PolicyAction]:
        return [self.by_suite[self.suite_of[r.episode.episode_id]].act([r])[0] for r in batch]

    def end_episode(self, episode_id: str) -> None:
        self.suite_of.pop(episode_id, None)


def _key(stack: Stack) -> str:
    return stack.alice.headers["authorization"].split(" ", 1)[1]


def test_mixed_job_over_the_bundled_suites_holds_its_ratios(stack: Stack) -> None:
    # two tasks per suite keep it short; the mix draws groups from them by weight
    mix = [
        {"suite": s, "weight": w, "task_ids": sorted(stack.ctx.tasks.suite(s).ids)[:2]}
        for s, w in WEIGHTS.items()
    ]
    r = stack.alice.post(
        "/v1/jobs",
        json={
            "policy": {"name": "oracle", "version": "1"},
            "schedule": {"mix": mix, "groups": GROUPS, "tolerance": 0.1},
        },
    )
    assert r.status_code == 201, r.text
    job = r.json()
    assert job["suite"] == "terminal+document+cad" and len(job["task_ids"]) == 6
    key = _key(stack)
    policy = SuiteOracle()
    with Client(stack.url, key) as client:

        async def go() -> list:
            async with AsyncClient(stack.url, key) as aclient:
                runner = RolloutRunner(
                    aclient,
                    policy,  # type: ignore[arg-type]
                    sync_client=client,
                    config=RolloutConfig(concurrency=2, max_turns=3),
                )
                return await runner.run_job(job["id"])

        outcomes = asyncio.run(go())
    final = stack.alice.get(f"/v1/jobs/{job['id']}").json()
    assert final["state"] == "done", final["progress"]
    by_suite: dict[str, int] = {}
    for o in outcomes:
        assert (o.record.reward, o.record.verifier.status) == (1.0, "ok"), o.record.task_id
        by_suite[o.record.suite] = by_suite.get(o.record.suite, 0) + 1
    assert by_suite == {"terminal": 5, "document": 3, "cad": 2}
    domains = final["progress"]["schedule"]["domains"]
    assert all(d["within_tolerance"] for d in domains.values()), domains
    assert final["progress"]["expected_records"] == GROUPS


@pytest.mark.parametrize(
    ("schedule", "extra", "status", "field"),
    [
        ({"mix": [{"suite": "terminal", "weight": 1}]}, {}, 422, "groups"),
        ({"mix": [{"suite": "terminal", "weight": 1}], "groups": 2}, {"suite": "x"}, 400, "suite"),
        ({"mix": [{"suite": "nope", "weight": 1}], "groups": 2}, {}, 404, "schedule.mix[0].suite"),
        (
            {"domain_limits": {"terminal": {"max_sandboxes": 17}}},
            {"suite": "terminal"},
            400,
            "schedule.domain_limits.terminal.max_sandboxes",
        ),
        (
            {"domain_limits": {"cad": {"max_cpus": 1}}},
            {"suite": "terminal"},
            400,
            "schedule.domain_limits.cad",
        ),
        (
            {"straggler": {"min_samples": 3, "deadline_s": 1}},
            {"suite": "terminal", "group_size": 2},
            400,
            "schedule.straggler.min_samples",
        ),
        ({"order": "lifo"}, {"suite": "terminal"}, 422, "order"),
    ],
)
def test_bad_schedules_are_4xx_naming_the_field(
    stack: Stack, schedule: dict, extra: dict, status: int, field: str
) -> None:
    before = _jobs(stack)
    r = stack.alice.post(
        "/v1/jobs",
        json={"policy": {"name": "oracle", "version": "1"}, "schedule": schedule, **extra},
    )
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    assert field in r.text
    assert _jobs(stack) == before  # nothing stored


def _jobs(stack: Stack) -> int:
    with stack.ctx.db.read() as s:
        return s.execute(select(func.count()).select_from(Job)).scalar_one()
