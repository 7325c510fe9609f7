"""Rollout jobs: claim order, leases that expire back to the queue, bounded retries."""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import update

from service import rewards, scheduler, tenants
from service.db.engine import Database
from service.db.models import WorkItem
from service.errors import Conflict, InvalidRequest
from service.tenants import Principal
from tests.integration.db.test_rewards_store import make

P = Principal("acme", "k1", frozenset())


@pytest.fixture
def tenant_db(db: Database) -> Database:
    with db.session() as s:
        tenants.create_tenant(s, "acme", max_sandboxes=1, max_cpus=1, max_memory_mb=1)
    return db


def _job(db: Database, tasks: list[str], *, priority: int = 0, attempts: int = 2) -> str:
    return scheduler.create_job(
        db,
        P,
        suite="terminal",
        task_ids=tasks,
        group_size=2,
        priority=priority,
        policy={"name": "oracle"},
        max_attempts=attempts,
    ).id


def record_samples(db: Database, item_id: str, job_id: str, n: int = 2) -> None:
    """Store a record for samples 0..n-1 of the item (what verification does)."""
    with db.session() as s:
        for i in range(n):
            rec = make(job_id=job_id, sample_idx=i)
            rewards.store(s, rec, tenant_id="acme", work_item_id=item_id)


def test_items_are_claimed_in_order_then_exhausted(tenant_db: Database) -> None:
    job = _job(tenant_db, ["a", "b", "c"])
    got = [scheduler.claim(tenant_db, P, job, worker="w", lease_s=60) for _ in range(4)]
    assert [g.task_id if g else None for g in got] == ["a", "b", "c", None]
    assert len({g.group_id for g in got if g}) == 3
    for g in got[:3]:
        record_samples(tenant_db, g.id, job)
        scheduler.complete(tenant_db, P, g.id, worker="w", ok=True)
    assert scheduler.get_job(tenant_db, P, job).state == "done"
    assert scheduler.progress(tenant_db, job)["items"]["done"] == 3


def test_expired_claim_returns_to_queue_and_old_worker_is_refused(tenant_db: Database) -> None:
    job = _job(tenant_db, ["a"])
    first = scheduler.claim(tenant_db, P, job, worker="w1", lease_s=60)
    assert scheduler.claim(tenant_db, P, job, worker="w2", lease_s=60) is None
    with tenant_db.session() as s:  # the lease ends (a 50 ms lease ended early on a busy CI)
        s.execute(update(WorkItem).values(claim_expires_at=first.created_at))
    again = scheduler.claim(tenant_db, P, job, worker="w2", lease_s=60)
    # a lapsed claim costs no attempt (the worker died, not the policy or the verifier)
    assert again is not None and again.id == first.id
    assert (again.attempts, again.claims) == (0, 2) and again.claim_id != first.claim_id
    with pytest.raises(Conflict):
        scheduler.complete(tenant_db, P, first.id, worker="w1", ok=True)
    record_samples(tenant_db, again.id, job)
    assert scheduler.complete(tenant_db, P, again.id, worker="w2", ok=True).state == "done"


def test_failures_retry_until_max_attempts(tenant_db: Database) -> None:
    job = _job(tenant_db, ["a"], attempts=2)
    item = scheduler.claim(tenant_db, P, job, worker="w", lease_s=60)
    assert (
        scheduler.complete(tenant_db, P, item.id, worker="w", ok=False, error="sandbox died").state
        == "queued"
    )
    item = scheduler.claim(tenant_db, P, job, worker="w", lease_s=60)
    done = scheduler.complete(tenant_db, P, item.id, worker="w", ok=False, error="again")
    assert (done.state, done.attempts, done.last_error) == ("failed", 2, "again")
    # no records at all: the job failed (never "done" with samples missing)
    assert scheduler.get_job(tenant_db, P, job).state == "failed"


def test_higher_priority_items_first(tenant_db: Database) -> None:
    low = _job(tenant_db, ["x"], priority=0)
    high = _job(tenant_db, ["y"], priority=5)
    assert scheduler.claim(tenant_db, P, high, worker="w", lease_s=60).priority == 5
    assert scheduler.claim(tenant_db, P, low, worker="w", lease_s=60).priority == 0


def test_concurrent_workers_never_share_an_item(tenant_db: Database) -> None:
    job = _job(tenant_db, [f"t{i}" for i in range(12)])
    seen: list[str] = []
    lock = threading.Lock()

    def worker(name: str) -> None:
        while (item := scheduler.claim(tenant_db, P, job, worker=name, lease_s=60)) is not None:
            with lock:
                seen.append(item.id)

    threads = [threading.Thread(target=worker, args=(f"w{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(seen) == 12 and len(set(seen)) == 12


def test_bad_jobs_are_refused(tenant_db: Database) -> None:
    with pytest.raises(InvalidRequest):
        _job(tenant_db, [])
    with pytest.raises(InvalidRequest):
        _job(tenant_db, ["a", "a"])
