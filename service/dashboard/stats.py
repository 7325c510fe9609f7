"""Reward statistics for the rewards page, computed from ``queries.RewardPoint`` rows.

- Pass rate over time: records are put in equal time buckets (the smallest width in
  ``BUCKET_WIDTHS_S`` giving at most ``MAX_BUCKETS`` buckets over the span); a bucket's
  rate is ``passed / verified`` where a verified record (status ok) passes when
  ``reward >= threshold`` (``anomaly.DEFAULT_PASS_THRESHOLD``, as the anomaly monitor).
- Reward distribution: a histogram of verified rewards per domain, ``HIST_BINS`` equal bins
  over ``[min(0, lo), max(1, hi)]``.
- Group variance: per task, the mean within-group sample std of verified rewards
  (``rewards.group_moments``) and the share of groups with zero spread (a GRPO group whose
  members all scored the same gives every member advantage 0: no learning signal).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from service.anomaly import DEFAULT_PASS_THRESHOLD
from service.dashboard.queries import RewardPoint
from service.rewards import group_moments

MAX_BUCKETS = 30
BUCKET_WIDTHS_S = (60, 300, 900, 3600, 6 * 3600, 86400, 7 * 86400, 30 * 86400)
HIST_BINS = 10


@dataclass(frozen=True)
class Bucket:
    """One time bucket: start (unix s), verified records in it, the share that passed."""

    start_s: float
    n: int
    rate: float


def bucket_width_s(points: list[RewardPoint]) -> int:
    """The bucket width (s) for these points (module docstring)."""
    if not points:
        return BUCKET_WIDTHS_S[0]
    span = points[-1].created_at.timestamp() - points[0].created_at.timestamp()
    return next((w for w in BUCKET_WIDTHS_S if span / w < MAX_BUCKETS), BUCKET_WIDTHS_S[-1])


def pass_rate_series(
    points: list[RewardPoint], *, by: str, threshold: float = DEFAULT_PASS_THRESHOLD
) -> dict[str, list[Bucket]]:
    """Pass rate per bucket for each key of ``by`` (``"domain"`` or ``"task_id"``)."""
    width = bucket_width_s(points)
    acc: dict[str, dict[float, list[int]]] = defaultdict(dict)
    for p in points:
        if p.status != "ok" or p.reward is None:
            continue
        start = p.created_at.timestamp() // width * width
        cell = acc[getattr(p, by)].setdefault(start, [0, 0])
        cell[0] += 1
        cell[1] += p.reward >= threshold
    return {
        key: [Bucket(t, n, x / n) for t, (n, x) in sorted(cells.items())]
        for key, cells in sorted(acc.items())
    }


@dataclass(frozen=True)
class Histogram:
    """Counts of verified rewards in equal bins from ``lo`` to ``hi``."""

    lo: float
    hi: float
    counts: list[int]


def histograms(points: list[RewardPoint]) -> dict[str, Histogram]:
    """The reward histogram of each domain (module docstring)."""
    per: dict[str, list[float]] = defaultdict(list)
    for p in points:
        if p.status == "ok" and p.reward is not None:
            per[p.domain].append(p.reward)
    out = {}
    for domain, values in sorted(per.items()):
        lo, hi = min(0.0, min(values)), max(1.0, max(values))
        counts = [0] * HIST_BINS
        for v in values:
            counts[min(HIST_BINS - 1, int((v - lo) / (hi - lo) * HIST_BINS))] += 1
        out[domain] = Histogram(lo, hi, counts)
    return out


@dataclass(frozen=True)
class TaskSummary:
    """One task's records: counts by verifier status, verified pass rate, groups with two or
    more verified members, their mean within-group std, and the share with zero spread."""

    task_id: str
    domain: str
    statuses: dict[str, int]
    pass_rate: float | None
    groups: int
    mean_group_std: float | None
    flat_group_share: float | None


def task_summaries(
    points: list[RewardPoint], *, threshold: float = DEFAULT_PASS_THRESHOLD
) -> list[TaskSummary]:
    """Per task, sorted by task id (module docstring)."""
    statuses: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    groups: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    domain: dict[str, str] = {}
    for p in points:
        statuses[p.task_id][p.status] += 1
        domain[p.task_id] = p.domain
        if p.status == "ok" and p.reward is not None:
            groups[p.task_id][p.group_id].append(p.reward)
    out = []
    for task in sorted(statuses):
        verified = [r for g in groups[task].values() for r in g]
        stds = [group_moments(g)[1] for g in groups[task].values() if len(g) >= 2]
        out.append(
            TaskSummary(
                task_id=task,
                domain=domain[task],
                statuses=dict(statuses[task]),
                pass_rate=sum(r >= threshold for r in verified) / len(verified)
                if verified
                else None,
                groups=len(stds),
                mean_group_std=sum(stds) / len(stds) if stds else None,
                flat_group_share=sum(s == 0.0 for s in stds) / len(stds) if stds else None,
            )
        )
    return out
