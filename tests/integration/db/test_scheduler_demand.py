"""Warm demand predicted from what is queued (``service/scheduler/demand.py``) on SQLite
and PostgreSQL: list scheduling over the job's claim slots, the mix's next groups by the
deficit rule, and the tenant's quota shared earliest start first."""

from __future__ import annotations

import pytest

from service import scheduler, tenants
from service.db.engine import Database
from service.db.models import Job, utcnow
from service.scheduler import demand
from service.scheduler.spec import Schedule
from service.tenants import Principal

P = Principal("acme", "k1", frozenset())


def _job(db: Database, schedule: dict | None, *, tasks: list[str], group_size: int = 2) -> Job:
    return scheduler.create_job(
        db,
        P,
        suite="+".join(d["suite"] for d in schedule["mix"]) if schedule else "terminal",
        task_ids=tasks,
        group_size=group_size,
        priority=0,
        policy={"name": "oracle"},
        max_attempts=3,
        schedule=Schedule.model_validate(schedule) if schedule else None,
    )


def _upcoming(db: Database, job: Job, horizon_s: float | None = None) -> list[demand.Upcoming]:
    with db.read() as s:
        return demand.upcoming(s, s.get(Job, job.id), now=utcnow(), horizon_s=horizon_s)


def test_queued_items_start_on_the_jobs_claim_slots(db: Database) -> None:
    with db.session() as s:
        tenants.create_tenant(s, "acme", max_sandboxes=8, max_cpus=8, max_memory_mb=1)
    job = _job(db, None, tasks=["a", "b", "c", "d"])
    # nobody claims yet: one slot, 60 s per group (nothing measured), the default horizon;
    # a group of two takes 4 warm sandboxes (two members, two verifiers' pristine ones)
    got = _upcoming(db, job)
    assert [(u.task_id, u.start_s, u.sandboxes) for u in got] == [
        ("a", 0.0, 4),
        ("b", 60.0, 4),
        ("c", 120.0, 4),
    ]
    # two live claims, their groups not started: both start now and hold a slot each, so
    # the next two groups are expected at 60 s
    for _ in range(2):
        scheduler.claim(db, P, job.id, worker="w", lease_s=300)
    got = _upcoming(db, job, horizon_s=60)
    assert [u.task_id for u in got] == ["a", "b", "c", "d"]
    assert [u.start_s for u in got] == pytest.approx([0, 0, 60, 60], abs=5)
    assert [u.task_id for u in _upcoming(db, job, horizon_s=1)] == ["a", "b"]
    off = _job(
        db,
        {"mix": [{"suite": "terminal", "weight": 1}], "groups": 1, "warm_ahead_s": 0},
        tasks=["terminal/a"],
    )
    assert _upcoming(db, off) == []


def test_a_mixed_job_warms_the_groups_the_deficit_rule_generates_next(db: Database) -> None:
    with db.session() as s:
        tenants.create_tenant(s, "acme", max_sandboxes=8, max_cpus=8, max_memory_mb=1)
    mix = [
        {"suite": "terminal", "weight": 5},
        {"suite": "document", "weight": 3},
        {"suite": "cad", "weight": 2},
    ]
    tasks = ["terminal/t1", "terminal/t2", "document/d1", "cad/c1"]
    job = _job(db, {"mix": mix, "groups": 10}, tasks=tasks, group_size=1)
    got = _upcoming(db, job, horizon_s=10_000)
    # every group of the job, no item generated yet; a group of one takes 2 warm sandboxes
    assert len(got) == 10 and all(u.sandboxes == 2 for u in got)
    by_suite: dict[str, int] = {}
    for u in got:
        by_suite[u.suite] = by_suite.get(u.suite, 0) + 1
    assert by_suite == {"terminal": 5, "document": 3, "cad": 2}
    assert (got[0].suite, got[0].task_id) == ("terminal", "t1")
    assert [u.task_id for u in got if u.suite == "terminal"] == ["t1", "t2", "t1", "t2", "t1"]
    # the first claim generates exactly the first predicted group
    item = scheduler.claim(db, P, job.id, worker="w", lease_s=300)
    assert (item.suite, item.task_id) == (got[0].suite, got[0].task_id)


def test_the_quota_goes_to_the_earliest_starts() -> None:
    entries = [
        demand.Upcoming(120.0, "s", "late", 1),
        demand.Upcoming(0.0, "s", "now", 2),
        demand.Upcoming(60.0, "s", "soon", 2),
        demand.Upcoming(30.0, "s", "gone", 1),
    ]

    def template(_suite: str, task: str) -> str | None:
        return None if task == "gone" else f"tpl-{task}"

    assert demand.allocate(entries, budget=3, template_of=template) == {"tpl-now": 2, "tpl-soon": 1}
    assert demand.allocate(entries, budget=0, template_of=template) == {}
    assert demand.allocate(entries, budget=99, template_of=template) == {
        "tpl-now": 2,
        "tpl-soon": 2,
        "tpl-late": 1,
    }
