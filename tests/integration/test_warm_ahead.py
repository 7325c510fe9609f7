"""Warm pools filled ahead of demand from what is queued (``service/scheduler/demand.py``),
through the real service: a job's queued items warm their templates' pools before any
claim, in queue order and only as far as the horizon reaches; claims move the horizon on
to the items behind them; a cancelled job's demand is gone."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from policy_client.client import Client
from service.tasks.registry import template_name
from tests.integration.api.conftest import Stack, start_stack

pytestmark = pytest.mark.docker

TASKS = ["word-frequency-top20", "access-log-top-ips", "hourly-error-rates", "repair-ini-config"]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    yield from start_stack(tmp_path_factory.mktemp("warmahead"), pool_targets={})


def _levels(stack: Stack) -> dict[str, dict[str, int]]:
    names = {t: template_name(stack.ctx.tasks.get(t, "terminal")) for t in TASKS}
    lv = stack.ctx.pools.levels()
    return {t: lv.get(n, {"target": 0, "warm": 0}) for t, n in names.items()}


def _items(stack: Stack, job_id: str) -> dict[str, int]:
    return stack.alice.get(f"/v1/jobs/{job_id}").json()["progress"]["items"]


def test_queued_items_warm_their_pools_before_claims_arrive(stack: Stack) -> None:
    # No measured durations yet: each group is expected to take 60 s. One claim slot before
    # any claim, a 90 s horizon: the first two queued groups (starting at 0 s and 60 s) are
    # warmed, the two behind them (120 s, 180 s) are not.
    r = stack.alice.post(
        "/v1/jobs",
        json={
            "suite": "terminal",
            "task_ids": TASKS,
            "group_size": 2,
            "policy": {"name": "p"},
            "schedule": {"order": "fifo", "warm_ahead_s": 90},
        },
    )
    assert r.status_code == 201, r.text
    job_id = r.json()["id"]

    def warmed(want: set[str]) -> bool:
        lv = _levels(stack)
        return all(lv[t]["warm"] >= 1 for t in want)

    stack.wait_for(lambda: warmed({TASKS[0], TASKS[1]}), 300)
    lv = _levels(stack)
    # a group of two takes 4: its two members and their verifiers' pristine sandboxes
    assert [lv[t]["target"] for t in TASKS] == [4, 4, 0, 0], lv
    assert _items(stack, job_id)["queued"] == 4  # nobody has claimed yet
    assert lv[TASKS[2]]["warm"] == lv[TASKS[3]]["warm"] == 0, lv

    # Two workers claim the first two groups (their episodes not started yet): those
    # still need their warm sandboxes, and with two slots the next two groups are now
    # expected at 60 s, inside the horizon: their pools fill while they are still queued.
    key = stack.alice.headers["authorization"].split(" ", 1)[1]
    with Client(stack.url, key) as client:
        got = [client.claim(job_id, worker=f"w{i}", lease_s=300) for i in range(2)]
    assert [g.task_id for g in got if g] == TASKS[:2]
    stack.wait_for(lambda: warmed(set(TASKS)), 300)
    assert [lv["target"] for lv in _levels(stack).values()] == [4, 4, 4, 4]
    assert _items(stack, job_id)["queued"] == 2

    assert stack.alice.post(f"/v1/jobs/{job_id}/cancel").status_code == 200
    stack.wait_for(lambda: all(v["target"] == 0 for v in _levels(stack).values()), 30)


def test_claims_prefer_tasks_whose_template_has_warm_sandboxes(stack: Stack) -> None:
    # Affinity: with equal expected durations (none measured) the last-listed task, whose
    # template alone has a warm sandbox, is claimed first; the same queue with no warm
    # bonus is claimed oldest first. Warming ahead is off (warm_ahead_s 0), so the only
    # warm pool is the one the admin asked for.
    tasks = ["cron-next-fire-times", "fixed-width-to-csv", "jsonl-order-summary"]
    hot = template_name(stack.ctx.tasks.get(tasks[-1], "terminal"))
    r = stack.admin.put(f"/v1/pools/{hot}", json={"target_size": 1})
    assert r.status_code == 200, r.text
    stack.wait_for(lambda: stack.ctx.pools.levels()[hot]["warm"] >= 1, 300)

    def job(bonus: float) -> str:
        body = {
            "suite": "terminal",
            "task_ids": tasks,
            "policy": {"name": "p"},
            "schedule": {"order": "sef", "warm_ahead_s": 0, "warm_bonus_s": bonus},
        }
        r = stack.alice.post("/v1/jobs", json=body)
        assert r.status_code == 201, r.text
        return r.json()["id"]

    key = stack.alice.headers["authorization"].split(" ", 1)[1]
    affine, plain = job(5.0), job(0.0)
    with Client(stack.url, key) as client:
        first = [client.claim(affine, worker="w", lease_s=300) for _ in range(2)]
        control = client.claim(plain, worker="w", lease_s=300)
    assert [f.task_id for f in first if f] == [tasks[2], tasks[0]]
    assert control is not None and control.task_id == tasks[0]
    for j in (affine, plain):
        assert stack.alice.post(f"/v1/jobs/{j}/cancel").status_code == 200
    assert stack.admin.put(f"/v1/pools/{hot}", json={"target_size": 0}).status_code == 200
