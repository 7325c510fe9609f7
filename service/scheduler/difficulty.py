"""Per-task pass-rate estimates from the stored records, and the dynamic-sampling rule.

A *group* is the ``ok`` records sharing a ``group_id``. It is ``solved`` when every reward
is at or above the task's pass threshold, ``failed`` when every reward is below it, else
``mixed``; it is *useful* when its rewards are not all equal (a non-zero group advantage,
the only groups GRPO-style updates learn from). The rule (DAPO's dynamic sampling, Yu et
al. 2025, section 3.2, applied before sampling rather than after): a task whose last
``window`` groups were all solved or all failed is *parked*; groups beyond one per task go
to tasks whose pass rate is strictly between 0 and 1, fewest groups first.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from sqlalchemy import select, tuple_
from sqlalchemy.orm import Session

from service.db.models import RewardRecordRow

TaskKey = tuple[str, str]  # (suite, task id)


@dataclass
class TaskStats:
    """One task's groups (oldest first): outcome per group and whether it was useful."""

    outcomes: list[str] = field(default_factory=list)
    useful: list[bool] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)

    @property
    def pass_rate(self) -> float | None:
        """Share of samples at or above the threshold (None without samples)."""
        return None if not self.rewards else sum(self.rewards) / len(self.rewards)

    def parked(self, window: int) -> bool:
        """The last ``window`` groups were all solved or all failed."""
        recent = self.outcomes[-window:]
        return len(recent) >= window and (
            all(o == "solved" for o in recent) or all(o == "failed" for o in recent)
        )

    def uncertain(self) -> bool:
        """Pass rate strictly between 0 and 1."""
        p = self.pass_rate
        return p is not None and 0.0 < p < 1.0


def task_stats(
    s: Session,
    tenant_id: str,
    keys: Iterable[TaskKey],
    threshold: Callable[[str, str], float],
) -> dict[TaskKey, TaskStats]:
    """Stats of the tenant's ``ok`` records for ``keys`` (every job and ad-hoc group).

    ``rewards`` holds 1.0/0.0 per sample (passed or not), so ``pass_rate`` is a pass rate.
    """
    wanted = list(set(keys))
    out: dict[TaskKey, TaskStats] = {k: TaskStats() for k in wanted}
    if not wanted:
        return out
    R = RewardRecordRow
    rows = s.execute(
        select(R.suite, R.task_id, R.group_id, R.reward, R.created_at)
        .where(
            R.tenant_id == tenant_id,
            R.status == "ok",
            R.reward.is_not(None),
            tuple_(R.suite, R.task_id).in_(wanted),
        )
        .order_by(R.created_at)
    ).all()
    groups: dict[tuple[str, str, str], list[float]] = {}
    for suite, task_id, group_id, reward, _ in rows:
        groups.setdefault((suite, task_id, group_id), []).append(reward)
    for (suite, task_id, _), rewards in groups.items():
        st = out[(suite, task_id)]
        th = threshold(suite, task_id)
        passed = [r >= th for r in rewards]
        st.outcomes.append("solved" if all(passed) else "failed" if not any(passed) else "mixed")
        st.useful.append(max(rewards) - min(rewards) > 1e-9)
        st.rewards.extend(1.0 if p else 0.0 for p in passed)
    return out


def report(stats: dict[TaskKey, TaskStats], window: int) -> dict[str, dict[str, object]]:
    """Per task (``suite/task``): groups, useful groups, pass rate, parked."""
    return {
        f"{suite}/{task}": {
            "groups": len(st.outcomes),
            "useful_groups": sum(st.useful),
            "pass_rate": st.pass_rate,
            "parked": st.parked(window),
        }
        for (suite, task), st in sorted(stats.items())
    }
