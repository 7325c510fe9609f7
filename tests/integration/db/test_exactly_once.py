"""Exactly-once records (SQLite and PostgreSQL): a record per sample, attempts that only real
failures use, jobs that end done only with every record, the serve lock, idempotency keys."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest
from sqlalchemy import func, select, text, update
from sqlalchemy.exc import IntegrityError

from service import idempotency, rewards, scheduler, tenants
from service.db.engine import Database
from service.db.models import AuditEvent, IdempotencyKey, RewardRecordRow, WorkItem
from service.serverlock import AlreadyServing, ServerLock
from service.tenants import Principal
from tests.dbutil import fresh_database
from tests.integration.db.test_rewards_store import make

P = Principal("acme", "k1", frozenset())


@pytest.fixture
def tenant_db(db: Database) -> Database:
    with db.session() as s:
        tenants.create_tenant(s, "acme", max_sandboxes=1, max_cpus=1, max_memory_mb=1)
    return db


def _job(db: Database, tasks: list[str], *, group_size: int = 2, attempts: int = 2) -> str:
    return scheduler.create_job(
        db,
        P,
        suite="terminal",
        task_ids=tasks,
        group_size=group_size,
        priority=0,
        policy={"name": "oracle"},
        max_attempts=attempts,
    ).id


def _store(db: Database, item_id: str, job_id: str, idx: int, **kw: object) -> str:
    replace = bool(kw.pop("replace_error", False))
    with db.session() as s:
        row = rewards.store(
            s,
            make(job_id=job_id, sample_idx=idx, **kw),
            tenant_id="acme",
            work_item_id=item_id,
            replace_error=replace,
        )
        return row.record_id


def _records(db: Database, job_id: str) -> int:
    with db.read() as s:
        return s.execute(
            select(func.count())
            .select_from(RewardRecordRow)
            .where(RewardRecordRow.job_id == job_id)
        ).scalar_one()


def test_a_sample_has_one_record_whichever_episode_verifies_it(tenant_db: Database) -> None:
    # Regression: a retried work item reused the group id and sample numbers with new
    # episodes, and every episode's verification stored its own record (115 for 100 asked).
    job = _job(tenant_db, ["a"])
    item = scheduler.claim(tenant_db, P, job, worker="w", lease_s=60)
    first = _store(tenant_db, item.id, job, 0)
    again = _store(tenant_db, item.id, job, 0)  # another episode (a retry) of sample 0
    assert again == first and _records(tenant_db, job) == 1
    # the database itself refuses a second row for the sample, whatever the code does
    with pytest.raises(IntegrityError), tenant_db.session() as s:
        row = rewards._to_row(make(job_id=job), "acme", f"{item.id}/0")
        s.add(row)
        s.flush()
    # ad-hoc episodes: one record per episode
    with tenant_db.session() as s:
        a = rewards.store(s, make(), tenant_id="acme")
        b = rewards.store(s, make(), tenant_id="acme")
        assert a.sample_key.startswith("ep/") and a.sample_key != b.sample_key


def test_only_a_retry_replaces_an_error_record_and_ok_records_stay(tenant_db: Database) -> None:
    job = _job(tenant_db, ["a"])
    item = scheduler.claim(tenant_db, P, job, worker="w", lease_s=60)
    err = _store(tenant_db, item.id, job, 0, status="error")
    assert _store(tenant_db, item.id, job, 0) == err  # no replace: the stored one wins
    ok = _store(tenant_db, item.id, job, 0, replace_error=True)
    assert ok != err and _records(tenant_db, job) == 1
    assert _store(tenant_db, item.id, job, 0, status="error", replace_error=True) == ok


def test_lapsed_claims_and_infrastructure_failures_use_no_attempt(tenant_db: Database) -> None:
    job = _job(tenant_db, ["a"], attempts=1)
    item = scheduler.claim(tenant_db, P, job, worker="w1", lease_s=0.01)
    with tenant_db.session() as s:  # the worker died; its claim lapsed
        s.execute(update(WorkItem).values(claim_expires_at=item.created_at))
        lapsed = scheduler.requeue_lapsed(s)
    assert [x.claim_id for x in lapsed] == [item.claim_id]
    item = scheduler.claim(tenant_db, P, job, worker="w2", lease_s=60)
    assert (item.state, item.attempts, item.claims) == ("claimed", 0, 2)
    back = scheduler.complete(
        tenant_db, P, item.id, worker="w2", ok=False, error="server gone", cause="infrastructure"
    )
    assert (back.state, back.attempts) == ("queued", 0)
    item = scheduler.claim(tenant_db, P, job, worker="w2", lease_s=60)
    _store(tenant_db, item.id, job, 0)
    # ok while sample 1 has no record: a failure (of the verifier's side), the last attempt
    done = scheduler.complete(tenant_db, P, item.id, worker="w2", ok=True)
    assert (done.state, done.attempts) == ("failed", 1)
    assert "unrecorded" in done.last_error


def test_a_claim_taking_over_a_lapsed_claim_audits_the_lapse_once(tenant_db: Database) -> None:
    # Regression: a claim that took over an expired claim before any sweep requeued it left
    # no job.claim_lapsed event, so the audit showed two claims on an item with no lapse.
    job = _job(tenant_db, ["a"])
    first = scheduler.claim(tenant_db, P, job, worker="w1", lease_s=60)
    with tenant_db.session() as s:
        s.execute(update(WorkItem).values(claim_expires_at=first.created_at))
    second = scheduler.claim(tenant_db, P, job, worker="w2", lease_s=60)
    assert second.id == first.id and second.claim_id != first.claim_id
    with tenant_db.session() as s:
        assert scheduler.requeue_lapsed(s) == []  # the live claim is not lapsed
    with tenant_db.read() as s:
        events = s.execute(
            select(AuditEvent.action, AuditEvent.details).where(
                AuditEvent.action.in_(("job.claim", "job.claim_lapsed"))
            )
        ).all()
    lapses = [d for a, d in events if a == "job.claim_lapsed"]
    claims = [d for a, d in events if a == "job.claim"]
    assert len(claims) == 2 and claims[1]["reclaimed_from"] == first.claim_id
    assert [(d["claim_id"], d["worker"]) for d in lapses] == [(first.claim_id, "w1")]


def test_a_claim_racing_the_sweep_audits_the_lapse_once(tmp_path: Path) -> None:
    # Regression (three replicas through a kill -9): a claim read an item whose claim had
    # lapsed, a sweep requeued it (auditing the lapse) before the claim's UPDATE, and the
    # claim audited the same lapse again. PostgreSQL only: a plain read does not wait for
    # the sweep's row lock there, so the claim's UPDATE is what meets the sweep.
    with fresh_database("postgres", tmp_path) as db:
        with db.session() as s:
            tenants.create_tenant(s, "acme", max_sandboxes=1, max_cpus=1, max_memory_mb=1)
        job = _job(db, ["a"])
        first = scheduler.claim(db, P, job, worker="w1", lease_s=60)
        with db.session() as s:
            s.execute(update(WorkItem).values(claim_expires_at=first.created_at))
        got: list[WorkItem | None] = []
        with db.session() as s:  # the sweep: holds the item's row until it commits
            assert [x.claim_id for x in scheduler.requeue_lapsed(s)] == [first.claim_id]
            racer = threading.Thread(
                target=lambda: got.append(scheduler.claim(db, P, job, worker="w2", lease_s=60))
            )
            racer.start()
            deadline = time.monotonic() + 30
            while not _waiting_for_a_lock(db):  # the claim read 'claimed' and now waits
                assert time.monotonic() < deadline and racer.is_alive(), got
                time.sleep(0.02)
        racer.join(30)
        assert got and got[0] is not None and got[0].claim_id != first.claim_id
        with db.read() as s:
            events = s.execute(
                select(AuditEvent.action, AuditEvent.details).where(
                    AuditEvent.action.in_(("job.claim", "job.claim_lapsed"))
                )
            ).all()
        lapses = [d["claim_id"] for a, d in events if a == "job.claim_lapsed"]
        claims = [d for a, d in events if a == "job.claim"]
        assert lapses == [first.claim_id]
        assert len(claims) == 2 and claims[1]["reclaimed_from"] is None


def _waiting_for_a_lock(db: Database) -> bool:
    """Whether some other connection to ``db`` waits for a row lock now (PostgreSQL)."""
    with db.read() as s:
        return bool(
            s.execute(
                text(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                    " AND datname = current_database() AND pid <> pg_backend_pid()"
                )
            ).scalar_one()
        )


def test_a_job_is_done_only_with_every_record_else_partial_naming_the_missing(
    tenant_db: Database,
) -> None:
    # Regression: 4 items failed and one task had no record at all, yet the job ended "done".
    job = _job(tenant_db, ["a", "b"], attempts=1)
    a = scheduler.claim(tenant_db, P, job, worker="w", lease_s=60)
    b = scheduler.claim(tenant_db, P, job, worker="w", lease_s=60)
    _store(tenant_db, a.id, job, 0)
    _store(tenant_db, a.id, job, 1)
    scheduler.complete(tenant_db, P, a.id, worker="w", ok=True)
    _store(tenant_db, b.id, job, 1)
    scheduler.complete(tenant_db, P, b.id, worker="w", ok=False, error="policy crashed")
    assert scheduler.get_job(tenant_db, P, job).state == "partial"
    progress = scheduler.progress(tenant_db, job)
    assert progress["expected_records"] == 4
    assert progress["missing"] == [
        {
            "work_item_id": b.id,
            "task_id": "b",
            "sample_idx": 0,
            "item_state": "failed",
            "reason": "policy crashed",
        }
    ]
    full = _job(tenant_db, ["c"], group_size=1)
    c = scheduler.claim(tenant_db, P, full, worker="w", lease_s=60)
    _store(tenant_db, c.id, full, 0)
    scheduler.complete(tenant_db, P, c.id, worker="w", ok=True)
    assert scheduler.get_job(tenant_db, P, full).state == "done"
    assert scheduler.progress(tenant_db, full)["missing"] == []


def test_an_item_claimed_over_and_over_fails_in_the_end(tenant_db: Database) -> None:
    job = _job(tenant_db, ["a"], attempts=1)
    for _ in range(scheduler.CLAIMS_PER_ATTEMPT):
        item = scheduler.claim(tenant_db, P, job, worker="w", lease_s=60)
        scheduler.complete(tenant_db, P, item.id, worker="w", ok=False, cause="infrastructure")
    assert scheduler.claim(tenant_db, P, job, worker="w", lease_s=60) is None
    assert scheduler.get_item(tenant_db, P, item.id).state == "failed"
    assert scheduler.get_job(tenant_db, P, job).state == "failed"


def test_one_server_per_database(db: Database) -> None:
    first = ServerLock(db.url, "dep-a")
    first.acquire()
    try:
        with pytest.raises(AlreadyServing, match="another crucible serve"):
            ServerLock(db.url, "dep-a").acquire()
    finally:
        first.release()
    again = ServerLock(db.url, "dep-a")
    again.acquire()  # free once released (the kernel or PostgreSQL drops it on death too)
    again.release()


def test_idempotency_keys_replay_the_first_answer(tenant_db: Database) -> None:
    begin = idempotency.begin
    assert begin(tenant_db, "acme", "k-1", "POST /v1/x", "d1").action == "run"
    assert begin(tenant_db, "acme", "k-1", "POST /v1/x", "d1").action == "busy"
    idempotency.finish(
        tenant_db, "acme", "k-1", status=201, body=b'{"id": 1}', media_type="application/json"
    )
    replay = begin(tenant_db, "acme", "k-1", "POST /v1/x", "d1")
    assert (replay.action, replay.status, replay.body) == ("replay", 201, b'{"id": 1}')
    other = begin(tenant_db, "acme", "k-1", "POST /v1/x", "d2")
    assert (other.action, other.status) == ("answer", 422)
    assert begin(tenant_db, "umbrella", "k-1", "POST /v1/x", "d2").action == "run"  # per tenant
    # a request cut off by a crash (pending, another boot) runs again
    assert begin(tenant_db, "acme", "k-2", "POST /v1/x", "d1").action == "run"
    with tenant_db.session() as s:
        s.execute(update(IdempotencyKey).values(owner="dead-boot"))
    assert begin(tenant_db, "acme", "k-2", "POST /v1/x", "d1").action == "run"
    # only a success is kept: an error changed nothing (and a 409, 429 or 5xx may change
    # on a retry), so its key is forgotten and a retry runs again
    for status in (400, 404, 409, 422, 429, 500, 503):
        idempotency.finish(tenant_db, "acme", "k-2", status=status, body=b"{}", media_type="x")
        assert begin(tenant_db, "acme", "k-2", "POST /v1/x", "d1").action == "run", status


def test_the_serve_lock_holds_through_symlinks_and_hard_links(tmp_path: Path) -> None:
    # A crash trial started a second server through a symlink to the database file; it
    # reconciled (destroyed) the live server's containers. SQLite's lock is a file lock.
    real = tmp_path / "data" / "crucible.db"
    real.parent.mkdir()
    real.write_bytes(b"")
    alias = tmp_path / "alias.db"
    alias.symlink_to(real)
    linked = tmp_path / "elsewhere" / "linked.db"
    linked.parent.mkdir()
    os.link(real, linked)
    first = ServerLock(f"sqlite:///{real}", "dep-a")
    first.acquire()
    try:
        for other in (alias, linked):
            with pytest.raises(AlreadyServing):
                ServerLock(f"sqlite:///{other}", "dep-a").acquire()
    finally:
        first.release()
    again = ServerLock(f"sqlite:///{alias}", "dep-a")
    again.acquire()
    again.release()
