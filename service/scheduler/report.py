"""What ``GET /v1/jobs/{id}`` says about a scheduled job (``progress.schedule``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy.orm import Session

from service.db.models import Job, WorkItem
from service.scheduler import difficulty, plan
from service.scheduler.hooks import Hooks
from service.scheduler.spec import Schedule


def schedule_report(
    s: Session, job: Job, sched: Schedule, items: Sequence[WorkItem], hooks: Hooks
) -> dict[str, Any]:
    """Domains (target and realized share of groups handed out, useful groups, within
    tolerance), per-task difficulty (when a budget is set), and the parked, degraded,
    straggling and stale items, with the newest policy version the job has seen."""
    counts = plan.domain_counts(job, items)
    total = sum(counts.values())
    weights = sched.weights() or {job.suite: 1.0}
    stats = difficulty.task_stats(s, job.tenant_id, plan.job_tasks(job, sched), hooks.threshold)
    domains = {}
    for suite, w in weights.items():
        st = [v for (su, _), v in stats.items() if su == suite]
        share = counts.get(suite, 0) / total if total else None
        domains[suite] = {
            "target": w,
            "groups": counts.get(suite, 0),
            "share": share,
            "useful_groups": sum(sum(v.useful) for v in st),
            "within_tolerance": share is None or abs(share - w) <= max(sched.tolerance, 1 / total),
        }
    window = sched.budget.window if sched.budget else 1
    return {
        "domains": domains,
        "tolerance": sched.tolerance,
        "groups": {"generated": plan.generated(items), "target": plan.group_target(job, sched)},
        "difficulty": difficulty.report(stats, window) if sched.budget else None,
        "parked": [_brief(i, job) for i in items if i.state == "parked"],
        "degraded": [
            {**_brief(i, job), "successor": _successor(i, items)}
            for i in items
            if i.state == "degraded"
        ],
        "stragglers": [
            {**_brief(i, job), "samples": (i.meta or {})["stragglers"]}
            for i in items
            if (i.meta or {}).get("stragglers")
        ],
        "stale": [
            _brief(i, job) | {"policy_version": i.policy_version}
            for i in items
            if (i.meta or {}).get("stale")
        ],
        "policy_version": job.policy_version,
    }


def _brief(i: WorkItem, job: Job) -> dict[str, Any]:
    return {
        "work_item_id": i.id,
        "suite": plan.item_suite(i, job),
        "task_id": i.task_id,
        "reason": i.last_error,
    }


def _successor(item: WorkItem, items: Sequence[WorkItem]) -> str | None:
    return next((i.id for i in items if (i.meta or {}).get("degraded_from") == item.id), None)
