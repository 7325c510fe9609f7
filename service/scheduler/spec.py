"""A job's schedule: what ``POST /v1/jobs`` may ask of the scheduler beyond FIFO.

Stored as JSON on ``jobs.schedule`` (``Schedule.model_dump()``); a job without one keeps the
original order (priority, then age) and one group per task. Every field is optional and the
defaults are what ``docs/architecture.md`` ("Scheduling") states.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid")


class DomainShare(_Spec):
    """One domain of a mixed job: a suite, its target share ``weight`` (normalised over the
    mix) and the tasks to draw from (all of the suite's when omitted)."""

    suite: str = Field(min_length=1, max_length=200)
    weight: float = Field(gt=0, le=1e6)
    task_ids: list[str] | None = Field(None, min_length=1, max_length=10000)


class DomainLimit(_Spec):
    """Per-domain caps on a job's claimed groups: sandboxes (``group_size`` per group) and
    CPUs (``group_size x`` the task's CPUs); both must fit the tenant's quota."""

    max_sandboxes: int | None = Field(None, ge=1, le=100000)
    max_cpus: float | None = Field(None, gt=0, le=100000)


class Budget(_Spec):
    """Difficulty-aware budget (dynamic sampling, Yu et al. 2025, DAPO section 3.2).

    ``extra_groups``: groups beyond one per task, spent on tasks whose pass rate is strictly
    between 0 and 1. ``window``: a task whose last ``window`` groups (this tenant's records
    of the task) were all solved or all failed is parked (no more groups; reported).
    """

    extra_groups: int = Field(0, ge=0, le=100000)
    window: int = Field(2, ge=1, le=50)
    park: bool = True


class Straggler(_Spec):
    """A group completes when ``min_samples`` of its samples have records and the claim is
    ``deadline_s`` old; the rest are marked stragglers (not expected, listed in progress)."""

    min_samples: int = Field(ge=1, le=10000)
    deadline_s: float = Field(gt=0, le=7 * 24 * 3600)


class LongTailTimeout(_Spec):
    """A claim older than ``max(floor_s, factor x p95)`` of the domain's measured item
    durations (once ``min_samples`` are measured) is timed out: an attempt is used and the
    item re-queued (its episodes are abandoned like a lapsed claim's)."""

    factor: float = Field(3.0, ge=1.0, le=100.0)
    floor_s: float = Field(60.0, gt=0, le=7 * 24 * 3600)
    min_samples: int = Field(5, ge=1, le=10000)


class Schedule(_Spec):
    """How the scheduler serves a job's claims.

    ``mix`` makes a mixed-domain job of ``groups`` groups; realized shares stay within
    ``tolerance`` of the targets (the deficit rule keeps every domain within one group of
    its target at every claim while it has tasks; see ``ordering.pick_domain``).
    ``adaptive`` applies the targets to *useful* groups (non-zero advantage) instead of all
    groups. ``order``: ``sef`` (shortest expected first within a priority level, aged by
    ``aging`` seconds of expected duration per second queued, ``warm_bonus_s`` off for a
    template with warm sandboxes) or ``fifo``. ``warm_ahead_s``: warm pools are filled for
    the groups expected to start within this many seconds (``demand``; 0: not at all).
    """

    mix: list[DomainShare] | None = Field(None, min_length=1, max_length=1000)
    groups: int | None = Field(None, ge=1, le=1000000)
    tolerance: float = Field(0.05, gt=0, le=1)
    adaptive: bool = False
    order: Literal["sef", "fifo"] = "sef"
    aging: float = Field(1.0, ge=0, le=1e6)
    warm_bonus_s: float = Field(5.0, ge=0, le=1e6)
    warm_ahead_s: float = Field(120.0, ge=0, le=24 * 3600)
    domain_limits: dict[str, DomainLimit] = Field(default_factory=dict, max_length=1000)
    budget: Budget | None = None
    degrade_after: int | None = Field(None, ge=1, le=20)
    timeout: LongTailTimeout | None = None
    straggler: Straggler | None = None
    max_staleness: int | None = Field(None, ge=0, le=1000000)
    staleness: Literal["refuse", "flag"] = "refuse"

    @model_validator(mode="after")
    def _consistent(self) -> Schedule:
        if self.mix is not None:
            suites = [d.suite for d in self.mix]
            if len(set(suites)) != len(suites):
                raise ValueError("mix names a suite twice")
            if self.groups is None:
                raise ValueError("a mixed job needs groups (how many groups in all)")
        return self

    def weights(self) -> dict[str, float]:
        """Suite -> target share (sums to 1); empty without a mix."""
        if not self.mix:
            return {}
        total = sum(d.weight for d in self.mix)
        return {d.suite: d.weight / total for d in self.mix}


def load(raw: dict[str, Any] | None) -> Schedule | None:
    """The stored schedule (None: the job has none)."""
    return Schedule.model_validate(raw) if raw is not None else None
