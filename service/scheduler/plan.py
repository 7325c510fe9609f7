"""The scheduled claim: which item of a job with a ``Schedule`` a claim gets, or which new
group to generate (mixed jobs and budget groups are generated at claim time).

``choose`` reads the job's items once and applies, in order: per-domain limits, the domain
mix (``ordering.pick_domain``, adaptive weights when asked), parking by difficulty
(``difficulty``), then shortest-expected-first with aging and warm affinity
(``ordering.pick_item``). It only decides; ``core.claim`` takes the item with its guarded
UPDATE.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.db.models import Job, WorkItem
from service.scheduler import difficulty, ordering
from service.scheduler.hooks import Hooks
from service.scheduler.spec import Schedule

COUNTED = ("claimed", "done", "failed")  # states of a group that was handed out
DURATION_HISTORY = 5000  # measured item durations read per claim


@dataclass(frozen=True)
class Choice:
    """``item_id``: an existing item to claim; else ``new`` (suite, task) to generate.
    ``park``: queued items to park first, with the reason."""

    item_id: str | None
    new: tuple[str, str] | None
    park: list[tuple[str, str]]


def item_suite(item: WorkItem, job: Job) -> str:
    """The item's suite (a mixed job's items carry theirs)."""
    return item.suite or job.suite


def job_tasks(job: Job, sched: Schedule) -> list[tuple[str, str]]:
    """(suite, task) pairs a job draws from: ``suite/task`` keys for a mixed job."""
    if sched.mix:
        return [tuple(k.split("/", 1)) for k in job.task_ids]  # type: ignore[misc]
    return [(job.suite, t) for t in job.task_ids]


def group_target(job: Job, sched: Schedule) -> int:
    """Groups the job generates in all (degraded replacements aside)."""
    if sched.groups is not None:
        return sched.groups
    return len(job.task_ids) + (sched.budget.extra_groups if sched.budget else 0)


def generated(items: Sequence[WorkItem]) -> int:
    """Groups generated so far (a degraded item's replacement is not a new group)."""
    return sum(1 for i in items if (i.meta or {}).get("origin") != "degraded")


def load_items(s: Session, job_id: str) -> list[WorkItem]:
    """Every item of the job."""
    return list(s.execute(select(WorkItem).where(WorkItem.job_id == job_id)).scalars())


def domain_counts(job: Job, items: Sequence[WorkItem]) -> dict[str, int]:
    """Groups handed out per suite (claimed at least once)."""
    out: dict[str, int] = {}
    for i in items:
        if i.claims > 0 or i.state in COUNTED:
            d = item_suite(i, job)
            out[d] = out.get(d, 0) + 1
    return out


def durations(s: Session, job: Job, sched: Schedule) -> dict[tuple[str, str], list[float]]:
    """Measured durations (seconds) of the tenant's finished items of the job's tasks, per
    (suite, task), over its latest ``DURATION_HISTORY`` measurements (this job's and
    earlier jobs')."""
    tasks = set(job_tasks(job, sched))
    rows = s.execute(
        select(WorkItem.suite, Job.suite, WorkItem.task_id, WorkItem.duration_s)
        .join(Job, Job.id == WorkItem.job_id)
        .where(
            Job.tenant_id == job.tenant_id,
            WorkItem.duration_s.is_not(None),
            WorkItem.task_id.in_({t for _, t in tasks}),
        )
        .order_by(WorkItem.updated_at.desc())
        .limit(DURATION_HISTORY)
    ).all()
    out: dict[tuple[str, str], list[float]] = {}
    for item_suite_, job_suite, task_id, d in rows:
        key = (item_suite_ or job_suite, task_id)
        if key in tasks:
            out.setdefault(key, []).append(d)
    return out


def _under_limits(
    job: Job, sched: Schedule, items: Sequence[WorkItem], hooks: Hooks, now: datetime
) -> set[str]:
    """Suites with room for one more claimed group under ``domain_limits``."""
    running: dict[str, list[WorkItem]] = {}
    for i in items:
        if i.state == "claimed" and i.claim_expires_at and i.claim_expires_at >= now:
            running.setdefault(item_suite(i, job), []).append(i)
    suites = {s for s, _ in job_tasks(job, sched)}
    ok = set()
    for suite in suites:
        lim = sched.domain_limits.get(suite)
        live = running.get(suite, [])
        if lim is not None:
            if lim.max_sandboxes is not None and (len(live) + 1) * job.group_size > (
                lim.max_sandboxes
            ):
                continue
            if lim.max_cpus is not None:
                cpus = sum(hooks.cpus(suite, i.task_id) * job.group_size for i in live)
                # the next group's CPUs are not known before the task is; use the largest
                # of the domain's tasks so a claim never overshoots
                nxt = max(hooks.cpus(s, t) for s, t in job_tasks(job, sched) if s == suite)
                if cpus + nxt * job.group_size > lim.max_cpus + 1e-9:
                    continue
        ok.add(suite)
    return ok


def choose(
    s: Session, job: Job, sched: Schedule, hooks: Hooks, now: datetime
) -> tuple[Choice, list[WorkItem]]:
    """Decide the claim (see the module docstring); also returns the items read."""
    items = load_items(s, job.id)
    room = _under_limits(job, sched, items, hooks, now)
    stats: dict[tuple[str, str], difficulty.TaskStats] = {}
    window = sched.budget.window if sched.budget else 0
    if sched.budget is not None or sched.adaptive:
        stats = difficulty.task_stats(s, job.tenant_id, job_tasks(job, sched), hooks.threshold)
    parked = {
        k for k, st in stats.items() if sched.budget and sched.budget.park and st.parked(window)
    }
    park: list[tuple[str, str]] = []
    cands: list[ordering.Candidate] = []
    by_task = durations(s, job, sched)
    for i in items:
        lapsed = i.state == "claimed" and i.claim_expires_at and i.claim_expires_at < now
        if not (i.state == "queued" or lapsed):
            continue
        suite = item_suite(i, job)
        if (suite, i.task_id) in parked and i.claims == 0 and i.attempts == 0:
            park.append((i.id, f"parked: the last {window} groups were all solved or all failed"))
            continue
        if suite not in room:
            continue
        cands.append(
            ordering.Candidate(
                item_id=i.id,
                suite=suite,
                task_id=i.task_id,
                priority=i.priority,
                waited_s=max(0.0, (now - i.created_at).total_seconds()),
                expected_s=ordering.expected_duration(by_task, suite, i.task_id),
                warm=hooks.warm(suite, i.task_id),
            )
        )
    can_generate = generated(items) < group_target(job, sched)
    gen_tasks = _generatable(job, sched, items, stats, parked) if can_generate else {}
    if sched.mix:
        weights = sched.weights()
        if sched.adaptive:
            weights = ordering.adaptive_weights(weights, _useful_by_domain(job, items, stats))
        # a domain generates at most ceil(w_d * groups) groups, so one held back by its
        # limits does not see its share spent by the others
        counts = domain_counts(job, items)
        quota = {d: math.ceil(w * group_target(job, sched) - 1e-9) for d, w in weights.items()}
        gen_tasks = {d: ts for d, ts in gen_tasks.items() if counts.get(d, 0) < quota.get(d, 0)}
        eligible = {c.suite for c in cands} | {d for d in gen_tasks if gen_tasks[d]}
        domain = ordering.pick_domain(weights, counts, eligible & room)
        if domain is None:
            return Choice(None, None, park), items
        cands = [c for c in cands if c.suite == domain]
        gen_tasks = {domain: gen_tasks.get(domain, [])}
    pick = ordering.pick_item(
        cands, order=sched.order, aging=sched.aging, warm_bonus_s=sched.warm_bonus_s
    )
    if pick is not None:
        return Choice(pick.item_id, None, park), items
    pool = [(d, t) for d, ts in gen_tasks.items() if d in room for t in ts]
    if not pool:
        return Choice(None, None, park), items
    return Choice(None, _next_task(job, items, pool, stats, by_task, hooks), park), items


def _generatable(
    job: Job,
    sched: Schedule,
    items: Sequence[WorkItem],
    stats: dict[tuple[str, str], difficulty.TaskStats],
    parked: set[tuple[str, str]],
) -> dict[str, list[str]]:
    """Suite -> tasks a new group may be generated for. A mixed job: every unparked task. A
    budget group (one group per task already exists): only tasks with 0 < p < 1."""
    out: dict[str, list[str]] = {}
    for suite, task in job_tasks(job, sched):
        if (suite, task) in parked:
            continue
        if not sched.mix and not (stats.get((suite, task)) or difficulty.TaskStats()).uncertain():
            continue
        out.setdefault(suite, []).append(task)
    return out


def _next_task(
    job: Job,
    items: Sequence[WorkItem],
    pool: list[tuple[str, str]],
    stats: dict[tuple[str, str], difficulty.TaskStats],
    by_task: dict[tuple[str, str], list[float]],
    hooks: Hooks,
) -> tuple[str, str]:
    """Unsampled tasks first, then uncertain ones (0 < p < 1), fewest groups, shortest."""
    n: dict[tuple[str, str], int] = {}
    for i in items:
        k = (item_suite(i, job), i.task_id)
        n[k] = n.get(k, 0) + 1

    def key(k: tuple[str, str]) -> tuple[bool, bool, int, float, bool, str, str]:
        st = stats.get(k) or difficulty.TaskStats()
        return (
            n.get(k, 0) > 0,
            not st.uncertain(),
            n.get(k, 0),
            ordering.expected_duration(by_task, *k),
            not hooks.warm(*k),
            *k,
        )

    return min(pool, key=key)


def _useful_by_domain(
    job: Job, items: Sequence[WorkItem], stats: dict[tuple[str, str], difficulty.TaskStats]
) -> dict[str, tuple[int, int]]:
    """Domain -> (useful groups, groups) over the task stats read (the tenant's records)."""
    out: dict[str, tuple[int, int]] = {}
    for (suite, _), st in stats.items():
        u, g = out.get(suite, (0, 0))
        out[suite] = (u + sum(st.useful), g + len(st.useful))
    return out
