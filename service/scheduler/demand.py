"""Warm pools filled ahead of demand from what is queued.

Per open job, ``upcoming`` predicts which groups start within ``warm_ahead_s`` seconds and
when: the job's queued (and lapsed) items in the order claims would take them, then, for a
mixed job, the groups the deficit rule would generate next. The prediction is list
scheduling on the job's claim slots: as many slots as the job has live claims (at least
one, so a job nobody claims yet warms its first groups), each running claim freeing its
slot at its ``claimed_at`` plus its task's expected duration (``ordering.expected_duration``
of measured durations), each next group taking the earliest free slot.

``allocate`` turns a tenant's predicted starts, over all its jobs, into warm sandboxes per
template, earliest start first, within the room the tenant's sandbox quota has now
(``tenants.sandbox_room``): a tenant allowed 2 sandboxes keeps at most 2 warm, and those
are for the groups about to start, not for the first tasks in a job's listing. ``feed``
runs on the pool loop (``PoolManager.add_maintenance``) and hands the result to
``PoolManager.set_demands``, which replaces the tenant's previous demand through the
coordination seam (so every replica's pool loop sees it).

A group takes ``pool_sandboxes(group_size)`` warm sandboxes: one per sample (every member
starts from the task image: ``episodes._lease_members``) and one per sample for the pristine
sandbox its verification takes (``episodes._fresh_sandbox``).
"""

from __future__ import annotations

import heapq
import logging
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from sqlalchemy import select
from sqlalchemy.orm import Session

from service import tenants
from service.db.models import Episode, Job, WorkItem, utcnow
from service.errors import CrucibleError
from service.scheduler import ordering, plan
from service.scheduler.spec import Schedule
from service.scheduler.spec import load as load_schedule

if TYPE_CHECKING:
    from service.context import ServiceContext

log = logging.getLogger("crucible.scheduler.demand")

WARM_AHEAD_S = 120.0  # horizon of a job without a schedule (``Schedule.warm_ahead_s``)
MAX_LOOKAHEAD = 256  # groups predicted per job at most (a bound on the work per tick)
FEED_EVERY_S = 2.0  # the pool loop recomputes demand at most this often
OPEN_JOB_STATES = ("queued", "running")


@dataclass(frozen=True, order=True)
class Upcoming:
    """A group predicted to start ``start_s`` seconds from now, of ``task_id`` in
    ``suite``, taking ``sandboxes`` warm sandboxes."""

    start_s: float
    suite: str
    task_id: str
    sandboxes: int


def pool_sandboxes(group_size: int) -> int:
    """Warm sandboxes one group takes from its task's pool (see the module docstring)."""
    return 2 * group_size


def _order_key(
    item: WorkItem, job: Job, sched: Schedule | None, expected_s: float, now: datetime
) -> tuple:
    """The claim order of queued items: ``plan.choose``'s (``pick_item``) without the warm
    bonus, or priority then age for a job without a schedule."""
    waited = max(0.0, (now - item.created_at).total_seconds())
    if sched is None or sched.order == "fifo":
        return (-item.priority, -waited, item.task_id)
    score = ordering.sef_score(
        ordering.Candidate(
            item_id=item.id,
            suite=plan.item_suite(item, job),
            task_id=item.task_id,
            priority=item.priority,
            waited_s=waited,
            expected_s=expected_s,
        ),
        aging=sched.aging,
        warm_bonus_s=0.0,
    )
    return (-item.priority, score, -waited, item.task_id)


def _next_groups(
    job: Job,
    sched: Schedule,
    items: Sequence[WorkItem],
    queued: Sequence[tuple[str, str]],
    by_task: Mapping[tuple[str, str], Sequence[float]],
) -> Iterable[tuple[str, str]]:
    """(suite, task) of the groups a job would hand out next, in order: queued items, and
    for a mixed job the groups the deficit rule generates (``plan.choose`` without limits,
    parking or adaptive weights)."""
    if not sched.mix:
        yield from queued
        return
    weights = sched.weights()
    counts = dict(plan.domain_counts(job, items))
    target = plan.group_target(job, sched)
    quota = {d: math.ceil(w * target - 1e-9) for d, w in weights.items()}
    left = max(0, target - plan.generated(items))
    pending: dict[str, list[tuple[str, str]]] = {}
    for k in queued:
        pending.setdefault(k[0], []).append(k)
    tasks: dict[str, list[str]] = {}
    for suite, task in plan.job_tasks(job, sched):
        tasks.setdefault(suite, []).append(task)
    n: dict[tuple[str, str], int] = {}
    for i in items:
        k = (plan.item_suite(i, job), i.task_id)
        n[k] = n.get(k, 0) + 1
    while True:
        can_gen = {d for d in tasks if left > 0 and counts.get(d, 0) < quota.get(d, 0)}
        domain = ordering.pick_domain(weights, counts, {d for d in pending if pending[d]} | can_gen)
        if domain is None:
            return
        if pending.get(domain):
            k = pending[domain].pop(0)
        else:
            k = min(
                ((domain, t) for t in tasks[domain]),
                key=lambda k: (n.get(k, 0), ordering.expected_duration(by_task, *k), k),
            )
            n[k] = n.get(k, 0) + 1
            left -= 1
        counts[domain] = counts.get(domain, 0) + 1
        yield k


def upcoming(
    s: Session, job: Job, *, now: datetime, horizon_s: float | None = None
) -> list[Upcoming]:
    """The job's groups predicted to start within ``horizon_s`` seconds (default: the
    schedule's ``warm_ahead_s``, else ``WARM_AHEAD_S``; 0 turns warming ahead off),
    earliest first (see the module docstring for the model)."""
    sched = load_schedule(job.schedule)
    horizon = (
        horizon_s
        if horizon_s is not None
        else (sched.warm_ahead_s if sched is not None else WARM_AHEAD_S)
    )
    if horizon <= 0:  # warming ahead is off for this job
        return []
    items = plan.load_items(s, job.id)
    by_task = plan.durations(s, job, sched or Schedule())

    def expected(k: tuple[str, str]) -> float:
        return ordering.expected_duration(by_task, *k)

    per_group = pool_sandboxes(job.group_size)
    live = [
        i
        for i in items
        if i.state == "claimed" and i.claim_expires_at and i.claim_expires_at >= now
    ]
    started = _started_claims(s, [i.claim_id for i in live if i.claim_id])
    out: list[Upcoming] = []
    slots: list[float] = []
    for i in live:
        k = (plan.item_suite(i, job), i.task_id)
        ran = (now - (i.claimed_at or now)).total_seconds()
        slots.append(max(0.0, expected(k) - ran))
        if i.claim_id not in started:  # claimed, group not started: it starts now
            out.append(Upcoming(0.0, k[0], k[1], per_group))
    queued: list[tuple[tuple, tuple[str, str]]] = []
    for i in items:
        if i.state == "queued" or (i.state == "claimed" and i not in live):  # lapsed too
            k = (plan.item_suite(i, job), i.task_id)
            queued.append((_order_key(i, job, sched, expected(k), now), k))
    queued.sort()
    heapq.heapify(slots)
    if not slots:
        slots = [0.0]
    for k in _next_groups(job, sched or Schedule(), items, [k for _, k in queued], by_task):
        start = heapq.heappop(slots)
        if start > horizon or len(out) >= MAX_LOOKAHEAD:  # the rest start later
            break
        out.append(Upcoming(start, k[0], k[1], per_group))
        heapq.heappush(slots, start + expected(k))
    return out


def _started_claims(s: Session, claim_ids: Sequence[str]) -> set[str]:
    """The claims among ``claim_ids`` that have started episodes."""
    if not claim_ids:
        return set()
    rows = s.execute(
        select(Episode.claim_id).where(Episode.claim_id.in_(claim_ids)).distinct()
    ).scalars()
    return set(rows)


def allocate(
    entries: Iterable[Upcoming], *, budget: int, template_of: Callable[[str, str], str | None]
) -> dict[str, int]:
    """Warm sandboxes per template for one tenant: predicted groups earliest first, each
    granted its sandboxes while ``budget`` lasts (a group only partly covered gets what is
    left). ``template_of(suite, task)`` names the task's template (None: skipped)."""
    out: dict[str, int] = {}
    left = max(0, budget)
    for e in sorted(entries):
        if left <= 0:
            break
        name = template_of(e.suite, e.task_id)
        if name is None:
            continue
        got = min(e.sandboxes, left)
        out[name] = out.get(name, 0) + got
        left -= got
    return out


def tenant_demands(
    s: Session, *, now: datetime, template_of: Callable[[str, str], str | None]
) -> dict[str, dict[str, int]]:
    """Tenant id -> template -> warm sandboxes wanted, over the tenant's open jobs, within
    its quota's room now (tenants with nothing predicted are absent)."""
    jobs = s.execute(select(Job).where(Job.state.in_(OPEN_JOB_STATES))).scalars().all()
    by_tenant: dict[str, list[Upcoming]] = {}
    for job in jobs:
        try:
            ahead = upcoming(s, job, now=now)
        except Exception:  # noqa: BLE001 - one job's bad state must not stop the pool loop
            log.exception("warm demand of job %s could not be predicted; it gets none", job.id)
            continue
        by_tenant.setdefault(job.tenant_id, []).extend(ahead)
    out = {}
    for tenant_id, entries in by_tenant.items():
        budget = tenants.sandbox_room(s, tenant_id)
        wanted = allocate(entries, budget=budget, template_of=template_of)
        if wanted:
            out[tenant_id] = wanted
    return out


class Feed:
    """The pool-loop hook: recompute every tenant's warm demand (at most every
    ``every_s`` seconds) and hand it to ``ctx.pools.set_demands``."""

    def __init__(self, ctx: ServiceContext, *, every_s: float = FEED_EVERY_S) -> None:
        self.ctx, self.every_s = ctx, every_s
        self._at = -math.inf

    def _template_of(self, suite: str, task_id: str) -> str | None:
        from service.tasks.registry import template_name  # noqa: PLC0415 - import cycle

        try:
            return template_name(self.ctx.tasks.get(task_id, suite))
        except CrucibleError:
            return None  # a task gone from the registry has no pool

    def __call__(self, *, force: bool = False) -> dict[str, dict[str, int]] | None:
        """Feed the pools now if ``every_s`` passed (or ``force``); return what was fed."""
        t = time.monotonic()
        if not force and t - self._at < self.every_s:
            return None
        self._at = t
        with self.ctx.db.read() as s:
            wanted = tenant_demands(s, now=utcnow(), template_of=self._template_of)
        self.ctx.pools.set_demands(wanted)
        return wanted
