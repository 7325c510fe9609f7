"""Rollout jobs and their work items: priorities, heartbeat-renewed claims, bounded retries.

A job is tasks x group size for one policy; each task becomes one work item (one group of
``group_size`` samples). Workers claim the highest-priority queued item (ties: oldest first).
A claim has an id (``claim_id``) and holds for ``lease_s`` seconds (default 60); the worker
renews it with heartbeats. Episodes started for an item belong to its current claim; when a
claim lapses (``service.recovery.reclaim`` sweeps every tick, and a claim call reclaims an
expired item itself) its unfinished episodes are abandoned, their sandboxes released, and the
item goes back to the queue *without* using an attempt: attempts count only failures of the
policy or the verifier (``complete(ok=False, cause="policy" | "verifier")``). After
``max_attempts`` such failures the item is ``failed``; after ``max_attempts * 10`` claims of
any outcome too (a worker that keeps dying on one item).

A sample's identity is (job, work item, sample index): ``service.rewards`` stores at most one
record per sample, so a retried item re-runs only samples without a final record. A job ends
``done`` only when every sample has a record; otherwise ``partial`` (some records) or
``failed`` (none), and ``progress(...)["missing"]`` lists the missing samples and why.
Every claim, renewal and completion is one guarded UPDATE, so two workers (or two
control-plane replicas) never hold the same item.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from sqlalchemy import and_, func, or_, select, update
from sqlalchemy.orm import Session

from service import audit
from service.db.engine import Database
from service.db.models import Job, RewardRecordRow, WorkItem, utcnow
from service.errors import Conflict, InvalidRequest, NotFound
from service.ids import new_id
from service.scheduler import ordering, plan, report
from service.scheduler.hooks import DEFAULT, Hooks
from service.scheduler.spec import Schedule
from service.scheduler.spec import load as load_schedule
from service.tenants import Principal

OPEN_ITEM_STATES = ("queued", "claimed")
# items that deliver nothing and are not expected to: parked by difficulty or after K
# failures, or degraded (replaced by an item of the easier task)
RETIRED_ITEM_STATES = ("parked", "degraded")
ITEM_STATES = ("queued", "claimed", "done", "failed", "cancelled", *RETIRED_ITEM_STATES)
FINAL_JOB_STATES = ("done", "partial", "failed", "cancelled")
CLAIMS_PER_ATTEMPT = 10  # claims allowed per attempt before an item fails for good
Cause = Literal["policy", "verifier", "infrastructure"]


def _with(meta: dict[str, Any] | None, **changes: Any) -> dict[str, Any]:
    """A copy of an item's ``meta`` with ``changes`` (a new dict, so the JSON is rewritten)."""
    return {**(meta or {}), **changes}


def sample_key(work_item_id: str, sample_idx: int) -> str:
    """The identity of a job's sample in ``reward_records.sample_key``."""
    return f"{work_item_id}/{sample_idx}"


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
    schedule: Schedule | None = None,
) -> Job:
    """Create a job and one queued work item per task (in the given order).

    A mixed job (``schedule.mix``) has ``task_ids`` as ``suite/task`` keys and no items yet:
    its ``schedule.groups`` groups are generated claim by claim (``plan.choose``).
    """
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
        schedule=schedule.model_dump() if schedule is not None else None,
    )
    now = utcnow()
    with db.session() as s:
        s.add(job)
        for i, task_id in enumerate(() if schedule and schedule.mix else task_ids):
            s.add(
                WorkItem(
                    id=new_id("wi"),
                    job_id=job.id,
                    task_id=task_id,
                    group_id=new_id("grp"),
                    priority=priority,
                    state="queued",
                    attempts=0,
                    claims=0,
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
                "mix": schedule.weights() if schedule else None,
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


def _claimable(job_id: str, now: datetime) -> Any:
    return and_(
        WorkItem.job_id == job_id,
        or_(
            WorkItem.state == "queued",
            and_(WorkItem.state == "claimed", WorkItem.claim_expires_at < now),
        ),
    )


def _staleness(job: Job, sched: Schedule | None, version: int | None) -> bool:
    """Whether a claim at ``version`` is stale (more than ``max_staleness`` behind the
    newest version the job has seen); ``Conflict`` when the job refuses stale claims."""
    if sched is None or sched.max_staleness is None or version is None:
        return False
    newest = max(job.policy_version or version, version)
    if newest - version <= sched.max_staleness:
        return False
    if sched.staleness == "refuse":
        raise Conflict(
            f"policy version {version} is {newest - version} behind the job's newest "
            f"({newest}); max_staleness is {sched.max_staleness}"
        )
    return True


def _advance_version(s: Session, job_id: str, version: int | None) -> None:
    if version is None:
        return
    s.execute(
        update(Job)
        .where(Job.id == job_id, or_(Job.policy_version.is_(None), Job.policy_version < version))
        .values(policy_version=version)
        .execution_options(synchronize_session=False)
    )


def _time_out_long_tail(s: Session, job: Job, sched: Schedule, now: datetime) -> None:
    """Expire claims past the long-tail timeout (an attempt used; see ``LongTailTimeout``)."""
    if sched.timeout is None:
        return
    items = plan.load_items(s, job.id)
    by_suite: dict[str, list[float]] = {}
    for (suite, _), ds in plan.durations(s, job, sched).items():
        by_suite.setdefault(suite, []).extend(ds)
    for i in items:
        ds = by_suite.get(plan.item_suite(i, job), [])
        if i.state != "claimed" or i.claimed_at is None or len(ds) < sched.timeout.min_samples:
            continue
        limit = max(sched.timeout.floor_s, sched.timeout.factor * (ordering.quantile(ds, 0.95)))
        if (now - i.claimed_at).total_seconds() <= limit:
            continue
        attempts = i.attempts + 1
        s.execute(
            update(WorkItem)
            .where(WorkItem.id == i.id, WorkItem.claim_id == i.claim_id)
            .values(
                state="queued" if attempts < job.max_attempts else "failed",
                attempts=attempts,
                claim_expires_at=now,
                last_error=f"long-tail timeout: claimed over {limit:.0f} s "
                f"({sched.timeout.factor:g} x p95 of the domain's durations)",
                updated_at=now,
            )
            .execution_options(synchronize_session=False)
        )
        audit.record(
            s,
            "job.item_timeout",
            details={"job_id": job.id, "work_item_id": i.id, "claim_id": i.claim_id},
        )


def _scheduled_pick(
    s: Session, job: Job, sched: Schedule, hooks: Hooks, now: datetime
) -> WorkItem | None:
    """The item ``plan.choose`` picks (a generated group is inserted here first)."""
    choice, _ = plan.choose(s, job, sched, hooks, now)
    for item_id, reason in choice.park:
        s.execute(
            update(WorkItem)
            .where(WorkItem.id == item_id, WorkItem.state == "queued")
            .values(state="parked", last_error=reason, updated_at=now)
            .execution_options(synchronize_session=False)
        )
        audit.record(s, "job.item_parked", details={"job_id": job.id, "work_item_id": item_id})
    if choice.item_id is not None:
        return s.get(WorkItem, choice.item_id)
    if choice.new is None:
        return None
    suite, task_id = choice.new
    item = WorkItem(
        id=new_id("wi"),
        job_id=job.id,
        task_id=task_id,
        suite=suite,
        group_id=new_id("grp"),
        priority=job.priority,
        state="queued",
        attempts=0,
        claims=0,
        created_at=now,
        updated_at=now,
        meta={"origin": "mix" if sched.mix else "budget"},
    )
    s.add(item)
    s.flush()
    return item


def claim(
    db: Database,
    principal: Principal,
    job_id: str,
    *,
    worker: str,
    lease_s: float,
    policy_version: int | None = None,
    hooks: Hooks = DEFAULT,
) -> WorkItem | None:
    """Claim the next item of ``job_id`` for ``worker`` for ``lease_s`` seconds; None when
    nothing is claimable now (all final, or held by live claims).

    An item whose previous claim lapsed is taken over here at no attempt's cost, and the
    lapse is audited (``job.claim_lapsed``) as the sweep would have; the old claim's
    unfinished episodes are abandoned by ``service.recovery.reclaim`` (an episode lives
    only while its claim is its item's live claim). A job with a schedule picks by
    ``plan.choose``; one without, by priority then age. ``policy_version`` is the version
    the claim samples with (bounded staleness).

    Raises:
        NotFound: unknown job. Conflict: the job is cancelled or finished, or the claim's
        policy version is too stale for a job that refuses stale samples.
    """
    job = get_job(db, principal, job_id)
    if job.state == "cancelled":
        raise Conflict(f"job {job_id} is cancelled")
    sched = load_schedule(job.schedule)
    stale = _staleness(job, sched, policy_version)
    for _ in range(10):
        now = utcnow()
        with db.session() as s:
            _advance_version(s, job_id, policy_version)
            if sched is not None:
                _time_out_long_tail(s, job, sched, now)
                item = _scheduled_pick(s, job, sched, hooks, now)
            else:
                item = s.execute(
                    select(WorkItem)
                    .where(_claimable(job_id, now))
                    .order_by(WorkItem.priority.desc(), WorkItem.created_at)
                    .limit(1)
                ).scalar()
            if item is None:
                if sched is not None:
                    maybe_finish(s, job_id, hooks)
                return None
            lapsed = item.claim_id if item.state == "claimed" else None
            if item.claims >= job.max_attempts * CLAIMS_PER_ATTEMPT:
                _fail_item(s, item, f"claimed {item.claims} times without finishing")
                continue
            new_claim = new_id("clm")
            # Compare and swap on what was read: a sweep (or another replica's claim) that
            # requeued or took the item meanwhile makes this match nothing, and the next
            # round reads it afresh, so a lapse is audited once, by whoever ended it.
            seen = (
                WorkItem.claim_id.is_(None)
                if item.claim_id is None
                else WorkItem.claim_id == item.claim_id
            )
            got = s.execute(
                update(WorkItem)
                .where(
                    WorkItem.id == item.id,
                    WorkItem.state == item.state,
                    seen,
                    _claimable(job_id, now),
                )
                .values(
                    state="claimed",
                    claimed_by=worker,
                    claim_id=new_claim,
                    claims=WorkItem.claims + 1,
                    claim_expires_at=now + timedelta(seconds=lease_s),
                    claimed_at=now,
                    policy_version=policy_version,
                    meta=_with(item.meta, stale=True) if stale else item.meta,
                    updated_at=now,
                )
                .execution_options(synchronize_session=False)
            ).rowcount
            if not got:
                continue
            if lapsed is not None:  # taken over here, before any sweep requeued it
                audit.record(
                    s,
                    "job.claim_lapsed",
                    details={
                        "job_id": job_id,
                        "work_item_id": item.id,
                        "worker": item.claimed_by,
                        "claim_id": lapsed,
                    },
                )
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
                    "claim_id": new_claim,
                    "attempts": item.attempts,
                    "reclaimed_from": lapsed,
                    "suite": item.suite or job.suite,
                    "policy_version": policy_version,
                },
            )
            return s.get(WorkItem, item.id, populate_existing=True)
    return None


def heartbeat(
    db: Database, principal: Principal, item_id: str, *, worker: str, lease_s: float
) -> WorkItem:
    """Renew a claim held by ``worker`` to now + ``lease_s``; ``Conflict`` when it no longer
    holds it (the claim lapsed and was reclaimed, or the item finished)."""
    item = get_item(db, principal, item_id)
    now = utcnow()
    with db.session() as s:
        got = s.execute(
            update(WorkItem)
            .where(
                WorkItem.id == item_id,
                WorkItem.state == "claimed",
                WorkItem.claimed_by == worker,
                WorkItem.claim_expires_at >= now,
            )
            .values(claim_expires_at=now + timedelta(seconds=lease_s))
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


def live_claim(db: Database, item_id: str) -> str | None:
    """The item's current claim id when it is claimed and unexpired, else None."""
    with db.read() as s:
        item = s.get(WorkItem, item_id)
    if item is None or item.state != "claimed" or item.claim_expires_at is None:
        return None
    return item.claim_id if item.claim_expires_at >= utcnow() else None


def recorded_samples(s: Session, item_id: str) -> dict[int, str]:
    """Sample index -> record status of the item's stored records."""
    prefix = f"{item_id}/"
    rows = s.execute(
        select(RewardRecordRow.sample_key, RewardRecordRow.status).where(
            RewardRecordRow.sample_key.like(prefix.replace("_", r"\_") + "%", escape="\\")
        )
    ).all()
    return {int(key[len(prefix) :]): status for key, status in rows}


def complete(
    db: Database,
    principal: Principal,
    item_id: str,
    *,
    worker: str,
    ok: bool,
    error: str | None = None,
    cause: Cause = "policy",
    hooks: Hooks = DEFAULT,
) -> WorkItem:
    """Finish an attempt. ``ok`` with every sample recorded: ``done``. A failure of the
    policy or the verifier uses an attempt (``failed`` after ``max_attempts``, else back to
    the queue); ``cause="infrastructure"`` re-queues without using one. ``ok`` while samples
    lack records counts as a verifier failure (the records are what a job delivers), unless
    the job's straggler policy lets the group complete (``min_samples`` recorded and the
    claim ``deadline_s`` old: the rest are marked stragglers). With ``degrade_after = K``,
    the K-th failure in a row retires the item: ``degraded`` (a new item runs the task's
    ``degrades_to``) or ``parked`` when it declares none.

    Raises:
        NotFound: unknown item. Conflict: ``worker`` no longer holds the claim.
    """
    item = get_item(db, principal, item_id)
    now = utcnow()
    with db.session() as s:
        job = s.get(Job, item.job_id)
        sched = load_schedule(job.schedule)
        have = recorded_samples(s, item_id)
        missing = [i for i in range(job.group_size) if i not in have]
        meta = item.meta
        age = (now - item.claimed_at).total_seconds() if item.claimed_at else 0.0
        if ok and missing and _stragglers_allowed(sched, len(have), age):
            meta = _with(meta, stragglers=missing)
        elif ok and missing:
            ok, cause = False, "verifier"
            error = f"completed with samples {missing} unrecorded"
        if _staleness_flag(job, sched, item.policy_version):
            meta = _with(meta, stale=True)
        attempts = item.attempts + (0 if ok or cause == "infrastructure" else 1)
        successor: str | None = None
        if ok:
            new_state = "done"
        elif (
            sched is not None
            and sched.degrade_after is not None
            and cause != "infrastructure"
            and attempts >= sched.degrade_after
        ):
            suite = plan.item_suite(item, job)
            successor = hooks.degrades_to(suite, item.task_id)
            why = "; parked (no degrades_to)"
            if successor is not None and successor in degraded_chain(item):
                # a task degrading to itself, or a cycle (a -> b -> a), would queue a new
                # item after every K failures and the job would never end
                why = f"; parked (degrades_to {successor!r} was already degraded from)"
                successor = None
            new_state = "degraded" if successor else "parked"
            error = f"failed {attempts} times in a row" + (
                f"; degraded to {successor}" if successor else why
            )
        else:
            new_state = "queued" if attempts < job.max_attempts else "failed"
        got = s.execute(
            update(WorkItem)
            .where(
                WorkItem.id == item_id,
                WorkItem.state == "claimed",
                WorkItem.claimed_by == worker,
                WorkItem.claim_id == item.claim_id,
            )
            .values(
                state=new_state,
                attempts=attempts,
                last_error=(error or None) and error[:2000],
                claim_expires_at=None,
                duration_s=age if new_state == "done" and item.claimed_at else item.duration_s,
                meta=meta,
                updated_at=now,
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
                "claim_id": item.claim_id,
                "state": new_state,
                "cause": None if ok else cause,
                "attempts": attempts,
                "error": (error or "")[:500],
            },
        )
        if successor:
            _add_successor(s, job, item, successor, now)
        maybe_finish(s, item.job_id, hooks)
    return get_item(db, principal, item_id)


def _stragglers_allowed(sched: Schedule | None, recorded: int, age_s: float) -> bool:
    st = sched.straggler if sched else None
    return st is not None and recorded >= st.min_samples and age_s >= st.deadline_s


def _staleness_flag(job: Job, sched: Schedule | None, version: int | None) -> bool:
    """The item's samples are older than ``max_staleness`` allows (flagged, not refused:
    its records are stored by then)."""
    if sched is None or sched.max_staleness is None or version is None:
        return False
    return (job.policy_version or version) - version > sched.max_staleness


def degraded_chain(item: WorkItem) -> list[str]:
    """The tasks ``item`` descends from by degradation, oldest first, and its own task last
    (``meta.chain`` of a successor; a task no item was degraded from is its own chain)."""
    chain = (item.meta or {}).get("chain")
    return [*(chain if isinstance(chain, list) else []), item.task_id]


def _add_successor(s: Session, job: Job, item: WorkItem, task_id: str, now: datetime) -> None:
    """Queue the degraded item's easier task (same suite, a new group)."""
    new = WorkItem(
        id=new_id("wi"),
        job_id=job.id,
        task_id=task_id,
        suite=plan.item_suite(item, job),
        group_id=new_id("grp"),
        priority=item.priority,
        state="queued",
        attempts=0,
        claims=0,
        created_at=now,
        updated_at=now,
        meta={
            "origin": "degraded",
            "degraded_from": item.id,
            "task": item.task_id,
            "chain": degraded_chain(item),
        },
    )
    s.add(new)
    s.flush()
    audit.record(
        s,
        "job.item_degraded",
        details={"job_id": job.id, "work_item_id": item.id, "successor": new.id, "task": task_id},
    )


def requeue_lapsed(s: Session, *, now: datetime | None = None) -> list[WorkItem]:
    """Put every claimed item whose claim expired back to ``queued`` (no attempt used), in
    ``s``'s transaction; returns the items as they were (``claim_id``: the lapsed claim)."""
    now = now or utcnow()
    rows = (
        s.execute(
            select(WorkItem).where(WorkItem.state == "claimed", WorkItem.claim_expires_at < now)
        )
        .scalars()
        .all()
    )
    lapsed = []
    for row in rows:
        got = s.execute(
            update(WorkItem)
            .where(
                WorkItem.id == row.id,
                WorkItem.state == "claimed",
                WorkItem.claim_id == row.claim_id,
                WorkItem.claim_expires_at < now,
            )
            .values(state="queued", claim_expires_at=None, updated_at=now)
            .execution_options(synchronize_session=False)
        ).rowcount
        if got:
            audit.record(
                s,
                "job.claim_lapsed",
                details={
                    "job_id": row.job_id,
                    "work_item_id": row.id,
                    "worker": row.claimed_by,
                    "claim_id": row.claim_id,
                },
            )
            lapsed.append(row)
    return lapsed


def _fail_item(s: Session, item: WorkItem, reason: str) -> None:
    s.execute(
        update(WorkItem)
        .where(WorkItem.id == item.id, WorkItem.state.in_(OPEN_ITEM_STATES))
        .values(state="failed", last_error=reason, claim_expires_at=None, updated_at=utcnow())
        .execution_options(synchronize_session=False)
    )
    audit.record(
        s,
        "job.item_failed",
        details={"job_id": item.job_id, "work_item_id": item.id, "reason": reason},
    )
    maybe_finish(s, item.job_id)


def maybe_finish(s: Session, job_id: str, hooks: Hooks = DEFAULT) -> None:
    """End the job when no item is open (and a scheduled job can generate no more groups):
    ``done`` with every expected sample recorded, ``partial`` with some, ``failed`` with
    none. Parked and degraded items and stragglers are not expected."""
    open_items = s.execute(
        select(func.count())
        .select_from(WorkItem)
        .where(WorkItem.job_id == job_id, WorkItem.state.in_(OPEN_ITEM_STATES))
    ).scalar_one()
    if open_items:
        return
    job = s.get(Job, job_id)
    sched = load_schedule(job.schedule)
    if sched is None:
        expected = len(job.task_ids) * job.group_size
    else:
        choice, items = plan.choose(s, job, sched, hooks, utcnow())
        if choice.new is not None:
            return
        expected = _expected(job, items)
    recorded = _record_count(s, job_id)
    state = "done" if recorded >= expected else "partial" if recorded else "failed"
    s.execute(
        update(Job)
        .where(Job.id == job_id, Job.state.in_(("queued", "running")))
        .values(state=state, finished_at=utcnow())
        .execution_options(synchronize_session=False)
    )


def _expected(job: Job, items: Sequence[WorkItem]) -> int:
    """Samples the job's items are expected to record (retired items and stragglers aside)."""
    return sum(
        job.group_size - len((i.meta or {}).get("stragglers", []))
        for i in items
        if i.state not in RETIRED_ITEM_STATES
    )


def _record_count(s: Session, job_id: str) -> int:
    return s.execute(
        select(func.count())
        .select_from(RewardRecordRow)
        .where(RewardRecordRow.job_id == job_id, RewardRecordRow.sample_key.not_like("dup/%"))
    ).scalar_one()


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


@dataclass(frozen=True)
class MissingSample:
    """A sample of a job without a record, and why (its item's state and last error)."""

    work_item_id: str
    task_id: str
    sample_idx: int
    item_state: str
    reason: str


def missing_samples(s: Session, job: Job, items: Sequence[WorkItem]) -> list[MissingSample]:
    """The job's samples that have no record yet."""
    keys = set(
        s.execute(select(RewardRecordRow.sample_key).where(RewardRecordRow.job_id == job.id))
        .scalars()
        .all()
    )
    out = []
    for item in items:
        if item.state in RETIRED_ITEM_STATES:
            continue
        stragglers = set((item.meta or {}).get("stragglers", []))
        for i in range(job.group_size):
            if sample_key(item.id, i) in keys or i in stragglers:
                continue
            reason = item.last_error or {
                "queued": "not run yet",
                "claimed": "running",
                "cancelled": "job cancelled",
            }.get(item.state, item.state)
            out.append(MissingSample(item.id, item.task_id, i, item.state, reason))
    return out


def progress(db: Database, job_id: str, hooks: Hooks = DEFAULT) -> dict[str, Any]:
    """Item counts by state, records by status, the mean reward of ok records, episodes
    that failed on the policy's side (``failed_episodes``: records with stop reason
    ``error``), expected and recorded sample counts, and the samples still missing (with
    why). A scheduled job adds ``schedule`` (``report.schedule_report``)."""
    with db.read() as s:
        job = s.get(Job, job_id)
        items = s.execute(select(WorkItem).where(WorkItem.job_id == job_id)).scalars().all()
        rec = s.execute(
            select(RewardRecordRow.status, func.count(), func.avg(RewardRecordRow.reward))
            .where(RewardRecordRow.job_id == job_id)
            .group_by(RewardRecordRow.status)
        ).all()
        missing = missing_samples(s, job, items) if job is not None else []
        # episodes the policy or its endpoint failed (stop_reason "error"): verified, but
        # no trajectory to learn from; the CLI fails a job whose every episode is one
        failed_episodes = s.execute(
            select(func.count())
            .select_from(RewardRecordRow)
            .where(
                RewardRecordRow.job_id == job_id,
                RewardRecordRow.record["stop_reason"].as_string() == "error",
            )
        ).scalar_one()
        sched = load_schedule(job.schedule) if job is not None else None
        extra = report.schedule_report(s, job, sched, items, hooks) if sched else None
    by_state: dict[str, int] = {}
    for item in items:
        by_state[item.state] = by_state.get(item.state, 0) + 1
    records = {status: n for status, n, _ in rec}
    mean = next((avg for status, _, avg in rec if status == "ok"), None)
    out = {
        "items": {k: by_state.get(k, 0) for k in (ITEM_STATES if sched else ITEM_STATES[:5])},
        "records": records,
        "mean_reward": mean,
        "failed_episodes": failed_episodes,
        "expected_records": (
            _expected(job, items) if sched else len(items) * (job.group_size if job else 0)
        ),
        "missing": [m.__dict__ for m in missing[:1000]],
    }
    if extra is not None:
        out["schedule"] = extra
    return out
