"""Which claimable work a claim gets: pure functions over plain values (no database).

Rules (``docs/architecture.md``, "Scheduling"):

- **Domain mix (deficit rule).** With target shares ``w_d`` and ``n_d`` groups claimed so
  far (``N`` in all), the next group goes to the eligible domain with the largest deficit
  ``w_d * (N + 1) - n_d`` (ties: larger weight, then name). This is smooth weighted
  round-robin (the rule nginx uses for weighted upstreams), a sequential apportionment in
  the family of Balinski & Young's quota method (1975): every prefix of the claim sequence
  keeps each domain within about one group of ``w_d * N`` while it has work.
- **Adaptive mix.** The targets apply to *useful* groups (non-zero advantage: not every
  sample's reward equal) instead of groups: a domain whose useful rate is ``u_d`` (Laplace
  smoothed, ``(useful + 1) / (groups + 2)``, floored at ``U_FLOOR``) gets the claim weight
  ``w_d / u_d`` (normalised), so its expected share of useful groups is ``w_d``. This is
  inverse-propensity weighting of the mix; it answers the same problem as DAPO's dynamic
  sampling (Yu et al. 2025: groups with zero advantage carry no gradient) at the level of
  domains, in the spirit of online data mixing (Albalak et al. 2023).
- **Shortest expected first with aging** within the highest priority level: the item with
  the smallest ``expected_s - aging * waited_s - warm_bonus_s * warm`` (expected duration
  from measured durations of the task, else its domain, else ``DEFAULT_DURATION_S``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

U_FLOOR = 0.05  # the adaptive mix boosts a domain at most 1 / U_FLOOR = 20 times
DEFAULT_DURATION_S = 60.0


@dataclass(frozen=True)
class Candidate:
    """A claimable item (or a group that could be generated: ``item_id`` None).

    ``waited_s``: seconds since it was queued; ``expected_s``: expected run time in
    seconds; ``warm``: its template has warm sandboxes now.
    """

    item_id: str | None
    suite: str
    task_id: str
    priority: int
    waited_s: float
    expected_s: float
    warm: bool = False


def pick_domain(
    weights: Mapping[str, float], claimed: Mapping[str, float], eligible: Iterable[str]
) -> str | None:
    """The eligible domain with the largest deficit ``w_d * (N + 1) - n_d`` (None when no
    domain is eligible). ``weights``: target shares; ``claimed``: groups claimed per domain."""
    pool = [d for d in eligible if weights.get(d, 0) > 0]
    if not pool:
        return None
    total = sum(claimed.values()) + 1
    return max(pool, key=lambda d: (weights[d] * total - claimed.get(d, 0), weights[d], d))


def useful_rate(useful: int, groups: int) -> float:
    """Laplace-smoothed share of a domain's groups with non-zero advantage, floored."""
    return max((useful + 1) / (groups + 2), U_FLOOR)


def adaptive_weights(
    weights: Mapping[str, float], stats: Mapping[str, tuple[int, int]]
) -> dict[str, float]:
    """Claim weights under which each domain's expected share of *useful* groups is its
    target: ``w_d / u_d`` normalised. ``stats``: domain -> (useful groups, groups)."""
    raw = {d: w / useful_rate(*stats.get(d, (0, 0))) for d, w in weights.items()}
    total = sum(raw.values()) or 1.0
    return {d: v / total for d, v in raw.items()}


def sef_score(c: Candidate, *, aging: float, warm_bonus_s: float) -> float:
    """Shortest-expected-first key (smaller first), aged and with the warm-pool bonus."""
    return c.expected_s - aging * c.waited_s - (warm_bonus_s if c.warm else 0.0)


def pick_item(
    cands: Sequence[Candidate], *, order: str, aging: float, warm_bonus_s: float
) -> Candidate | None:
    """The highest priority level first; within it ``sef`` (``sef_score``) or ``fifo``
    (longest waiting). Ties: longest waiting, then task id."""
    if not cands:
        return None
    top = max(c.priority for c in cands)
    level = [c for c in cands if c.priority == top]
    if order == "fifo":
        return max(level, key=lambda c: (c.waited_s, c.task_id))
    return min(
        level,
        key=lambda c: (
            sef_score(c, aging=aging, warm_bonus_s=warm_bonus_s),
            -c.waited_s,
            c.task_id,
        ),
    )


def median(xs: Sequence[float]) -> float | None:
    """The median (None for no values)."""
    if not xs:
        return None
    s = sorted(xs)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2


def quantile(xs: Sequence[float], q: float) -> float | None:
    """The ``q`` quantile by the nearest-rank method (None for no values)."""
    if not xs:
        return None
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


def expected_duration(
    by_task: Mapping[tuple[str, str], Sequence[float]], suite: str, task_id: str
) -> float:
    """Expected seconds for a task: the median of its measured durations, else of its
    domain's, else ``DEFAULT_DURATION_S``."""
    own = median(by_task.get((suite, task_id), ()))
    if own is not None:
        return own
    dom = median([d for (s, _), ds in by_task.items() if s == suite for d in ds])
    return dom if dom is not None else DEFAULT_DURATION_S
