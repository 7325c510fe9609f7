"""Scheduled jobs on SQLite and PostgreSQL: domain mix, difficulty budgets, shortest expected
first, per-domain limits, degradation, long-tail timeouts, stragglers, bounded staleness."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from sqlalchemy import update

from service import rewards, scheduler, tenants
from service.db.engine import Database
from service.db.models import WorkItem
from service.errors import Conflict
from service.scheduler.hooks import Hooks
from service.scheduler.spec import Schedule
from service.tenants import Principal
from tests.integration.db.test_rewards_store import make

P = Principal("acme", "k1", frozenset())
SUITES = {"terminal": 0.5, "document": 0.3, "cad": 0.2}


@pytest.fixture
def tenant_db(db: Database) -> Database:
    with db.session() as s:
        tenants.create_tenant(s, "acme", max_sandboxes=8, max_cpus=8, max_memory_mb=1)
    return db


def _job(db: Database, tasks: list[str], schedule: dict, *, suite: str = "terminal", g: int = 2):
    return scheduler.create_job(
        db,
        P,
        suite=suite,
        task_ids=tasks,
        group_size=g,
        priority=0,
        policy={"name": "oracle"},
        max_attempts=3,
        schedule=Schedule.model_validate(schedule),
    )


def _record(db: Database, item: WorkItem, rewards_: list[float], suite: str) -> None:
    with db.session() as s:
        for i, r in enumerate(rewards_):
            rec = make(
                job_id=item.job_id,
                sample_idx=i,
                group_id=item.group_id,
                task_id=item.task_id,
                suite=suite,
                reward=r,
            )
            rewards.store(s, rec, tenant_id="acme", work_item_id=item.id)


def _finish(db: Database, item: WorkItem, rewards_: list[float], hooks: Hooks | None = None):
    _record(db, item, rewards_, item.suite or "terminal")
    kw = {"hooks": hooks} if hooks else {}
    return scheduler.complete(db, P, item.id, worker="w", ok=True, **kw)


def _mixed(db: Database, groups: int, **extra: object):
    mix = [
        {"suite": s, "weight": w, "task_ids": [f"{s}-{i}" for i in range(3)]}
        for s, w in SUITES.items()
    ]
    keys = [f"{d['suite']}/{t}" for d in mix for t in d["task_ids"]]
    return _job(db, keys, {"mix": mix, "groups": groups, **extra}, suite="mixed")


def test_mixed_job_holds_its_ratios_at_every_claim(tenant_db: Database) -> None:
    job = _mixed(tenant_db, 40)
    seen: dict[str, int] = dict.fromkeys(SUITES, 0)
    for n in range(1, 41):
        item = scheduler.claim(tenant_db, P, job.id, worker="w", lease_s=60)
        assert item is not None, n
        seen[item.suite] += 1
        # within one group of the target share at every prefix (the deficit rule)
        assert all(abs(seen[s] - w * n) < 1.0 + 1e-9 for s, w in SUITES.items()), (n, seen)
        _finish(tenant_db, item, [1.0, 0.0])
    assert scheduler.claim(tenant_db, P, job.id, worker="w", lease_s=60) is None
    assert scheduler.get_job(tenant_db, P, job.id).state == "done"
    rep = scheduler.progress(tenant_db, job.id)["schedule"]
    assert seen == {"terminal": 20, "document": 12, "cad": 8}
    assert all(d["within_tolerance"] for d in rep["domains"].values())
    assert rep["groups"] == {"generated": 40, "target": 40}


def test_adaptive_mix_up_weights_the_domain_short_of_useful_groups(tenant_db: Database) -> None:
    job = _mixed(tenant_db, 60, adaptive=True)
    seen: dict[str, int] = dict.fromkeys(SUITES, 0)
    for _ in range(60):
        item = scheduler.claim(tenant_db, P, job.id, worker="w", lease_s=60)
        seen[item.suite] += 1
        # cad's groups are useful (mixed rewards) only one time in four; the others always
        useful = item.suite != "cad" or seen["cad"] % 4 == 0
        _finish(tenant_db, item, [1.0, 0.0] if useful else [1.0, 1.0])
    # static weights would give cad 12 of 60; the adaptive rule gives it more
    assert seen["cad"] >= 20, seen
    rep = scheduler.progress(tenant_db, job.id)["schedule"]["domains"]
    useful = {s: d["useful_groups"] for s, d in rep.items()}
    total = sum(useful.values())
    assert abs(useful["cad"] / total - 0.2) < abs(3 / 60 - 0.2), useful


def test_budget_parks_solved_tasks_and_spends_extra_groups_on_uncertain_ones(
    tenant_db: Database,
) -> None:
    # history: task "easy" solved by two earlier groups, "hard" failed by two
    warm = _job(tenant_db, ["easy", "hard", "mid"], {"order": "fifo"})
    for _ in range(3):
        item = scheduler.claim(tenant_db, P, warm.id, worker="w", lease_s=60)
        _finish(
            tenant_db,
            item,
            {"easy": [1.0, 1.0], "hard": [0.0, 0.0], "mid": [1.0, 0.0]}[item.task_id],
        )
    again = _job(tenant_db, ["easy", "hard", "mid"], {"order": "fifo"})
    for _ in range(3):
        item = scheduler.claim(tenant_db, P, again.id, worker="w", lease_s=60)
        _finish(
            tenant_db,
            item,
            {"easy": [1.0, 1.0], "hard": [0.0, 0.0], "mid": [0.0, 1.0]}[item.task_id],
        )
    job = _job(tenant_db, ["easy", "hard", "mid"], {"budget": {"extra_groups": 2, "window": 2}})
    got = []
    while (item := scheduler.claim(tenant_db, P, job.id, worker="w", lease_s=60)) is not None:
        got.append(item.task_id)
        _finish(tenant_db, item, [1.0, 0.0])
    assert got == ["mid", "mid", "mid"]  # its own group, then the two extra groups
    prog = scheduler.progress(tenant_db, job.id)
    parked = {p["task_id"] for p in prog["schedule"]["parked"]}
    assert parked == {"easy", "hard"} and prog["items"]["parked"] == 2
    diff = prog["schedule"]["difficulty"]
    assert diff["terminal/easy"]["parked"] and diff["terminal/easy"]["pass_rate"] == 1.0
    assert not diff["terminal/mid"]["parked"] and 0 < diff["terminal/mid"]["pass_rate"] < 1
    assert scheduler.get_job(tenant_db, P, job.id).state == "done"
    assert prog["expected_records"] == 6


def _measure(db: Database, job_id: str, durations: dict[str, float]) -> None:
    """Mark the job's items done with these durations (what completed claims record)."""
    with db.session() as s:
        for tid, d in durations.items():
            s.execute(
                update(WorkItem)
                .where(WorkItem.job_id == job_id, WorkItem.task_id == tid)
                .values(state="done", duration_s=d)
            )


def test_shortest_expected_first_with_aging_and_warm_affinity(tenant_db: Database) -> None:
    tasks = ["slow", "mid", "fast"]
    _measure(tenant_db, _job(tenant_db, tasks, {}).id, {"slow": 500, "mid": 50, "fast": 5})
    job = _job(tenant_db, tasks, {"aging": 0.0})
    got = [scheduler.claim(tenant_db, P, job.id, worker="w", lease_s=60).task_id for _ in tasks]
    assert got == ["fast", "mid", "slow"]  # measured on the earlier job
    fifo = _job(tenant_db, tasks, {"order": "fifo"})
    got = [scheduler.claim(tenant_db, P, fifo.id, worker="w", lease_s=60).task_id for _ in tasks]
    assert got == tasks
    # a warm template wins over a cold one of the same expected length
    job3 = _job(tenant_db, ["cold", "hot"], {"warm_bonus_s": 5.0})
    hooks = Hooks(warm=lambda s, t: t == "hot")
    assert scheduler.claim(tenant_db, P, job3.id, worker="w", lease_s=60, hooks=hooks).task_id == (
        "hot"
    )
    # aging: 1 s of expected duration forgiven per second queued; slow has waited 600 s
    aged = _job(tenant_db, tasks, {"aging": 1.0})
    with tenant_db.session() as s:
        s.execute(
            update(WorkItem)
            .where(WorkItem.job_id == aged.id, WorkItem.task_id == "slow")
            .values(created_at=scheduler.core.utcnow() - timedelta(seconds=600))
        )
    assert scheduler.claim(tenant_db, P, aged.id, worker="w", lease_s=60).task_id == "slow"


def test_domain_limits_cap_concurrent_groups(tenant_db: Database) -> None:
    job = _mixed(tenant_db, 20, domain_limits={"cad": {"max_sandboxes": 2}})
    held = [scheduler.claim(tenant_db, P, job.id, worker="w", lease_s=60) for _ in range(9)]
    live_cad = [i for i in held if i is not None and i.suite == "cad"]
    assert len(live_cad) == 1  # a group is 2 sandboxes; a second would make 4 > 2
    _finish(tenant_db, live_cad[0], [1.0, 0.0])
    nxt = scheduler.claim(tenant_db, P, job.id, worker="w", lease_s=60)
    assert nxt is not None and nxt.suite == "cad"
    cpu = _mixed(tenant_db, 9, domain_limits={"document": {"max_cpus": 4}})
    hooks = Hooks(cpus=lambda s, t: 2.0)
    got = [scheduler.claim(tenant_db, P, cpu.id, worker="w", lease_s=60, hooks=hooks)]
    got += [scheduler.claim(tenant_db, P, cpu.id, worker="w", lease_s=60, hooks=hooks)]
    got += [scheduler.claim(tenant_db, P, cpu.id, worker="w", lease_s=60, hooks=hooks)]
    assert sum(1 for i in got if i and i.suite == "document") == 1  # 2 x 2 CPUs = 4


def test_k_failures_degrade_to_the_easier_task_or_park(tenant_db: Database) -> None:
    hooks = Hooks(degrades_to=lambda s, t: "hard-easy" if t == "hard" else None)
    job = _job(tenant_db, ["hard", "other"], {"order": "fifo", "degrade_after": 2})
    for _ in range(2):
        item = scheduler.claim(tenant_db, P, job.id, worker="w", lease_s=60, hooks=hooks)
        assert item.task_id == "hard"
        scheduler.complete(tenant_db, P, item.id, worker="w", ok=False, error="x", hooks=hooks)
    assert scheduler.get_item(tenant_db, P, item.id).state == "degraded"
    nxt = scheduler.claim(tenant_db, P, job.id, worker="w", lease_s=60, hooks=hooks)
    assert nxt.task_id in ("other", "hard-easy")
    order = [nxt]
    order.append(scheduler.claim(tenant_db, P, job.id, worker="w", lease_s=60, hooks=hooks))
    assert {i.task_id for i in order} == {"other", "hard-easy"}
    easy = next(i for i in order if i.task_id == "hard-easy")
    _finish(tenant_db, easy, [1.0, 1.0], hooks)
    other = next(i for i in order if i.task_id == "other")
    # "other" declares no easier variant: parked after two failures, reported
    scheduler.complete(tenant_db, P, other.id, worker="w", ok=False, error="x", hooks=hooks)
    o2 = scheduler.claim(tenant_db, P, job.id, worker="w", lease_s=60, hooks=hooks)
    scheduler.complete(tenant_db, P, o2.id, worker="w", ok=False, error="x", hooks=hooks)
    prog = scheduler.progress(tenant_db, job.id)
    assert prog["items"]["parked"] == 1 and prog["items"]["degraded"] == 1
    assert prog["schedule"]["degraded"][0]["successor"] == easy.id
    assert "no degrades_to" in prog["schedule"]["parked"][0]["reason"]
    job_row = scheduler.get_job(tenant_db, P, job.id)
    assert job_row.state == "done" and prog["expected_records"] == 2


@pytest.mark.parametrize("cycle", [{"a": "a"}, {"a": "b", "b": "a"}])
def test_a_degradation_cycle_parks_instead_of_queueing_forever(
    tenant_db: Database, cycle: dict[str, str]
) -> None:
    # Regression: a task that degrades to itself (or a -> b -> a) queued a new item after
    # every K failures, so a job whose policy always fails never ended.
    hooks = Hooks(degrades_to=lambda s, t: cycle.get(t))
    job = _job(tenant_db, ["a"], {"order": "fifo", "degrade_after": 1})
    ran = []
    for _ in range(4):
        item = scheduler.claim(tenant_db, P, job.id, worker="w", lease_s=60, hooks=hooks)
        if item is None:
            break
        ran.append(item.task_id)
        scheduler.complete(tenant_db, P, item.id, worker="w", ok=False, error="x", hooks=hooks)
    assert ran == ["a", "b"][: len(cycle)], ran
    prog = scheduler.progress(tenant_db, job.id)
    assert prog["items"]["parked"] == 1 and prog["items"]["degraded"] == len(cycle) - 1
    assert "already degraded from" in prog["schedule"]["parked"][0]["reason"]
    assert scheduler.get_job(tenant_db, P, job.id).state == "done"


def test_long_tail_timeout_requeues_with_an_attempt(tenant_db: Database) -> None:
    job = _job(
        tenant_db,
        [f"t{i}" for i in range(3)],
        {"order": "fifo", "timeout": {"factor": 2, "floor_s": 0.01, "min_samples": 2}},
    )
    for _ in range(2):
        item = scheduler.claim(tenant_db, P, job.id, worker="w", lease_s=60)
        _finish(tenant_db, item, [1.0, 0.0])
    slow = scheduler.claim(tenant_db, P, job.id, worker="w", lease_s=60)
    time.sleep(0.3)  # far past 2 x p95 of the two measured durations (milliseconds)
    assert scheduler.claim(tenant_db, P, job.id, worker="w2", lease_s=60).id == slow.id
    again = scheduler.get_item(tenant_db, P, slow.id)
    assert again.attempts == 1 and again.claimed_by == "w2"
    assert "long-tail timeout" in (again.last_error or "")
    with pytest.raises(Conflict):
        scheduler.heartbeat(tenant_db, P, slow.id, worker="w", lease_s=60)


def test_stragglers_let_a_group_complete_after_its_deadline(tenant_db: Database) -> None:
    job = _job(tenant_db, ["t"], {"straggler": {"min_samples": 2, "deadline_s": 0.2}}, g=3)
    item = scheduler.claim(tenant_db, P, job.id, worker="w", lease_s=60)
    _record(tenant_db, item, [1.0, 0.0], "terminal")
    # before the deadline a group with a missing sample is an attempt's failure
    early = scheduler.complete(tenant_db, P, item.id, worker="w", ok=True)
    assert early.state == "queued" and early.attempts == 1
    item = scheduler.claim(tenant_db, P, job.id, worker="w", lease_s=60)
    time.sleep(0.25)
    done = scheduler.complete(tenant_db, P, item.id, worker="w", ok=True)
    assert done.state == "done"
    prog = scheduler.progress(tenant_db, job.id)
    assert prog["schedule"]["stragglers"][0]["samples"] == [2]
    assert prog["expected_records"] == 2 and prog["missing"] == []
    assert scheduler.get_job(tenant_db, P, job.id).state == "done"


def test_bounded_staleness_refuses_or_flags(tenant_db: Database) -> None:
    job = _job(tenant_db, ["a", "b", "c"], {"order": "fifo", "max_staleness": 1})
    a = scheduler.claim(tenant_db, P, job.id, worker="w", lease_s=60, policy_version=5)
    assert a.policy_version == 5
    with pytest.raises(Conflict, match="max_staleness is 1"):
        scheduler.claim(tenant_db, P, job.id, worker="old", lease_s=60, policy_version=3)
    b = scheduler.claim(tenant_db, P, job.id, worker="w", lease_s=60, policy_version=4)
    assert b is not None  # one behind is within bounds
    flag = _job(tenant_db, ["a", "b"], {"order": "fifo", "max_staleness": 0, "staleness": "flag"})
    x = scheduler.claim(tenant_db, P, flag.id, worker="w", lease_s=60, policy_version=2)
    y = scheduler.claim(tenant_db, P, flag.id, worker="w", lease_s=60, policy_version=3)
    _finish(tenant_db, x, [1.0, 0.0])  # sampled at 2 while the job is at 3: flagged
    _finish(tenant_db, y, [1.0, 0.0])
    prog = scheduler.progress(tenant_db, flag.id)["schedule"]
    assert [s["task_id"] for s in prog["stale"]] == ["a"] and prog["policy_version"] == 3
