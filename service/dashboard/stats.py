"""Reward statistics for the rewards page, from the SQL counts of ``reward_queries``.

- Pass rate over time: records are put in equal time buckets (the smallest width in
  ``BUCKET_WIDTHS_S`` giving at most ``MAX_BUCKETS`` buckets over the span); a bucket's
  rate is ``passed / verified`` where a verified record (status ok) passes when
  ``reward >= threshold`` (``anomaly.DEFAULT_PASS_THRESHOLD``, as the anomaly monitor).
- Reward distribution: a histogram of verified rewards per domain, ``HIST_BINS`` equal bins
  over ``[min(0, lo), max(1, hi)]``.
- Group variance: per task, the mean (``math.fsum``) within-group sample std of verified
  rewards (``rewards.group_moments``) and the share of groups with zero spread (a GRPO group
  whose members all scored the same gives every member advantage 0: no learning signal).

Every figure is the one a pass over the records themselves gives: the counts are exact, and
a group's rewards are rebuilt from (reward, count) pairs before ``group_moments`` (whose
``fsum`` does not depend on order).
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime

from service.dashboard.reward_queries import Cell, GroupValue, RewardCount, StatusCount
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


def bucket_width_s(oldest: datetime | None, newest: datetime | None) -> int:
    """The bucket width (s) for records from ``oldest`` to ``newest`` (module docstring)."""
    if oldest is None or newest is None:
        return BUCKET_WIDTHS_S[0]
    span = newest.timestamp() - oldest.timestamp()
    return next((w for w in BUCKET_WIDTHS_S if span / w < MAX_BUCKETS), BUCKET_WIDTHS_S[-1])


def pass_rate_series(cells: list[Cell], *, by: str) -> dict[str, list[Bucket]]:
    """Pass rate per bucket for each key of ``by`` (``"domain"`` or ``"task_id"``), keys
    sorted, buckets oldest first."""
    acc: dict[str, dict[float, list[int]]] = defaultdict(dict)
    for c in cells:
        cell = acc[getattr(c, by)].setdefault(c.start_s, [0, 0])
        cell[0] += c.verified
        cell[1] += c.passed
    return {
        key: [Bucket(t, n, x / n) for t, (n, x) in sorted(cells.items()) if n]
        for key, cells in sorted(acc.items())
    }


@dataclass(frozen=True)
class Histogram:
    """Counts of verified rewards in equal bins from ``lo`` to ``hi``."""

    lo: float
    hi: float
    counts: list[int]


def histograms(rewards: list[RewardCount]) -> dict[str, Histogram]:
    """The reward histogram of each domain (module docstring)."""
    per: dict[str, dict[float, int]] = defaultdict(dict)
    for v in rewards:
        per[v.domain][v.reward] = v.count
    out = {}
    for domain, counted in sorted(per.items()):
        lo, hi = min(0.0, min(counted)), max(1.0, max(counted))
        counts = [0] * HIST_BINS
        for v, k in counted.items():
            counts[min(HIST_BINS - 1, int((v - lo) / (hi - lo) * HIST_BINS))] += k
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
    statuses: list[StatusCount], cells: list[Cell], groups: list[GroupValue]
) -> list[TaskSummary]:
    """Per task, sorted by task id; a task's domain is that of its newest record. The pass
    rate is the cells' passed over verified; ``groups`` holds the groups with two or more
    verified members."""
    counts: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    newest: dict[str, StatusCount] = {}
    for st in statuses:
        counts[st.task_id][st.status] += st.count
        seen = newest.get(st.task_id)
        if seen is None or (st.newest, st.domain) > (seen.newest, seen.domain):
            newest[st.task_id] = st
    tally: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for c in cells:
        tally[c.task_id][0] += c.verified
        tally[c.task_id][1] += c.passed
    members: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for v in groups:
        members[v.task_id][v.group_id] += [v.reward] * v.count
    out = []
    for task in sorted(counts):
        verified, passed = tally[task]
        stds = [group_moments(g)[1] for g in members[task].values()]
        out.append(
            TaskSummary(
                task_id=task,
                domain=newest[task].domain,
                statuses=dict(counts[task]),
                pass_rate=passed / verified if verified else None,
                groups=len(stds),
                mean_group_std=math.fsum(stds) / len(stds) if stds else None,
                flat_group_share=sum(s == 0.0 for s in stds) / len(stds) if stds else None,
            )
        )
    return out
