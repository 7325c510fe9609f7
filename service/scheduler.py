"""Rollout jobs and their work items: priorities, claims with leases, bounded retries.

A job is tasks x group size for one policy; each task becomes one work item (one group).
Workers claim the highest-priority queued item (ties: oldest first). A claim holds for
``lease_s`` seconds; an item whose worker vanished (claim expired without completion) is
claimable again. A failed attempt goes back to the queue until ``max_attempts``; then the
item is ``failed``. Every claim and completion is one guarded UPDATE, so two workers (or two
control-plane replicas) never hold the same item.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from sqlalchemy import and_, func, or_, select, update
from sqlalchemy.orm import Session

from service import audit
from service.db.engine import Database
from service.db.models import Job, RewardRecordRow, WorkItem, utcnow
from service.errors import Conflict, InvalidRequest, NotFound
from service.ids import new_id
from service.tenants import Principal


def create_job(
    db: Database,
    principal: Principal,
    *,
    suite: str,
    task_ids: list[str],
    group_size: int,
    priority: int,
    policy: dict[str, Any],
    max_attempts: int,
) -> Job:
    """Create a job and one queued work item per task (in the given order)."""
    if not task_ids:
        raise InvalidRequest("a job needs at least one task", field="task_ids")
    if len(set(task_ids)) != len(task_ids):
        raise InvalidRequest(
            "task_ids has duplicates; use group_size for repeats", field="task_ids"
        )
    job = Job(
        id=new_id("job"),
        tenant_id=principal.tenant_id,
        suite=suite,
        task_ids=task_ids,
        group_size=group_size,
        priority=priority,
        policy=policy,
        max_attempts=max_attempts,
        state="queued",
    )
    now = utcnow()
    with db.session() as s:
        s.add(job)
        for i, task_id in enumerate(task_ids):
            s.add(
                WorkItem(
                    id=new_id("wi"),
                    job_id=job.id,
                    task_id=task_id,
                    group_id=new_id("grp"),
                    priority=priority,
                    state="queued",
                    attempts=0,
                    created_at=now + timedelta(microseconds=i),
                    updated_at=now,
                )
            )
        audit.record(
            s,
            "job.create",
            tenant_id=principal.tenant_id,
            key_id=principal.key_id,
            details={
                "job_id": job.id,
                "suite": suite,
                "tasks": len(task_ids),
                "group_size": group_size,
                "priority": priority,
            },
        )
    return job


def get_job(db: Database, principal: Principal, job_id: str) -> Job:
    """The tenant's job (``NotFound`` otherwise)."""
    with db.read() as s:
        job = s.get(Job, job_id)
    if job is None or (job.tenant_id != principal.tenant_id and not principal.is_admin):
        raise NotFound(f"no job {job_id!r}", field="job_id")
    return job


def claim(
    db: Database, principal: Principal, job_id: str, *, worker: str, lease_s: float
) -> WorkItem | None:
    """Claim the next item of ``job_id`` for ``worker`` for ``lease_s`` seconds; None when
    nothing is claimable now (all done, failed, or held by live claims)."""
    job = get_job(db, principal, job_id)
    if job.state == "cancelled":
        raise Conflict(f"job {job_id} is cancelled")
    for _ in range(10):
        now = utcnow()
        with db.session() as s:
            claimable = and_(
                WorkItem.job_id == job_id,
                or_(
                    WorkItem.state == "queued",
                    and_(WorkItem.state == "claimed", WorkItem.claim_expires_at < now),
                ),
            )
            item = s.execute(
                select(WorkItem)
                .where(claimable)
                .order_by(WorkItem.priority.desc(), WorkItem.created_at)
                .limit(1)
            ).scalar()
            if item is None:
                return None
            expired = item.state == "claimed"
            got = s.execute(
                update(WorkItem)
                .where(WorkItem.id == item.id, claimable)
                .values(
                    state="claimed",
                    claimed_by=worker,
                    attempts=WorkItem.attempts + 1,
                    claim_expires_at=now + timedelta(seconds=lease_s),
                    updated_at=now,
                )
                .execution_options(synchronize_session=False)
            ).rowcount
            if not got:
                continue
            if expired and item.attempts >= job.max_attempts:
                # the previous holder vanished on its last allowed attempt
                s.execute(
                    update(WorkItem)
                    .where(WorkItem.id == item.id)
                    .values(state="failed", last_error="claim expired on the last attempt")
                    .execution_options(synchronize_session=False)
                )
                _maybe_finish(s, job_id)
                continue
            s.execute(
                update(Job)
                .where(Job.id == job_id, Job.state == "queued")
                .values(state="running")
                .execution_options(synchronize_session=False)
            )
            audit.record(
                s,
                "job.claim",
                tenant_id=principal.tenant_id,
                key_id=principal.key_id,
                details={
                    "job_id": job_id,
                    "work_item_id": item.id,
                    "worker": worker,
                    "attempt": item.attempts + 1,
                    "reclaimed": expired,
                },
            )
            return s.get(WorkItem, item.id, populate_existing=True)
    return None


def heartbeat(
    db: Database, principal: Principal, item_id: str, *, worker: str, lease_s: float
) -> WorkItem:
    """Extend a claim held by ``worker``; ``Conflict`` when it no longer holds it."""
    item = get_item(db, principal, item_id)
    with db.session() as s:
        got = s.execute(
            update(WorkItem)
            .where(
                WorkItem.id == item_id, WorkItem.state == "claimed", WorkItem.claimed_by == worker
            )
            .values(claim_expires_at=utcnow() + timedelta(seconds=lease_s))
            .execution_options(synchronize_session=False)
        ).rowcount
    if not got:
        raise Conflict(f"work item {item_id} is not claimed by {worker!r} (state {item.state})")
    return get_item(db, principal, item_id)


def get_item(db: Database, principal: Principal, item_id: str) -> WorkItem:
    """The tenant's work item (``NotFound`` otherwise)."""
    with db.read() as s:
        item = s.get(WorkItem, item_id)
        job = s.get(Job, item.job_id) if item else None
    if (
        item is None
        or job is None
        or (job.tenant_id != principal.tenant_id and not principal.is_admin)
    ):
        raise NotFound(f"no work item {item_id!r}", field="work_item_id")
    return item


def complete(
    db: Database,
    principal: Principal,
    item_id: str,
    *,
    worker: str,
    ok: bool,
    error: str | None = None,
) -> WorkItem:
    """Finish an attempt: ``done`` on success; on failure back to ``queued`` while attempts
    remain, else ``failed``. ``Conflict`` when ``worker`` no longer holds the claim."""
    item = get_item(db, principal, item_id)
    with db.session() as s:
        job = s.get(Job, item.job_id)
        if ok:
            new_state = "done"
        else:
            new_state = "queued" if item.attempts < job.max_attempts else "failed"
        got = s.execute(
            update(WorkItem)
            .where(
                WorkItem.id == item_id, WorkItem.state == "claimed", WorkItem.claimed_by == worker
            )
            .values(
                state=new_state,
                last_error=(error or None) and error[:2000],
                claim_expires_at=None,
                updated_at=utcnow(),
            )
            .execution_options(synchronize_session=False)
        ).rowcount
        if not got:
            raise Conflict(f"work item {item_id} is not claimed by {worker!r}")
        audit.record(
            s,
            "job.complete",
            tenant_id=principal.tenant_id,
            key_id=principal.key_id,
            details={
                "job_id": item.job_id,
                "work_item_id": item_id,
                "worker": worker,
                "state": new_state,
                "error": (error or "")[:500],
            },
        )
        _maybe_finish(s, item.job_id)
    return get_item(db, principal, item_id)


def _maybe_finish(s: Session, job_id: str) -> None:
    open_items = s.execute(
        select(func.count())
        .select_from(WorkItem)
        .where(WorkItem.job_id == job_id, WorkItem.state.in_(("queued", "claimed")))
    ).scalar_one()
    if open_items == 0:
        s.execute(
            update(Job)
            .where(Job.id == job_id, Job.state.in_(("queued", "running")))
            .values(state="done", finished_at=utcnow())
            .execution_options(synchronize_session=False)
        )


def cancel(db: Database, principal: Principal, job_id: str) -> Job:
    """Cancel a job: queued items become ``cancelled``; running claims finish or expire."""
    get_job(db, principal, job_id)
    with db.session() as s:
        s.execute(
            update(Job)
            .where(Job.id == job_id, Job.state.in_(("queued", "running")))
            .values(state="cancelled", finished_at=utcnow())
            .execution_options(synchronize_session=False)
        )
        s.execute(
            update(WorkItem)
            .where(WorkItem.job_id == job_id, WorkItem.state == "queued")
            .values(state="cancelled", updated_at=utcnow())
            .execution_options(synchronize_session=False)
        )
        audit.record(
            s,
            "job.cancel",
            tenant_id=principal.tenant_id,
            key_id=principal.key_id,
            details={"job_id": job_id},
        )
    return get_job(db, principal, job_id)


def progress(db: Database, job_id: str) -> dict[str, Any]:
    """Item counts by state, records written, and the mean reward of ok records."""
    with db.read() as s:
        by_state = dict(
            s.execute(
                select(WorkItem.state, func.count())
                .where(WorkItem.job_id == job_id)
                .group_by(WorkItem.state)
            ).all()
        )
        rec = s.execute(
            select(RewardRecordRow.status, func.count(), func.avg(RewardRecordRow.reward))
            .where(RewardRecordRow.job_id == job_id)
            .group_by(RewardRecordRow.status)
        ).all()
    records = {status: n for status, n, _ in rec}
    mean = next((avg for status, _, avg in rec if status == "ok"), None)
    return {
        "items": {
            k: by_state.get(k, 0) for k in ("queued", "claimed", "done", "failed", "cancelled")
        },
        "records": records,
        "mean_reward": mean,
    }
