"""Rollout jobs and their scheduling (``from service import scheduler`` keeps working).

``core``: jobs, work items, claims with heartbeats, record identity per sample, attempts.
``spec``: a job's schedule (domain mix, budgets, limits, stragglers, staleness), validated.
``ordering``: which claimable item a claim gets (pure; unit-tested).
``difficulty``: per-task pass-rate estimates and the dynamic-sampling budget rule.
``demand``: warm pools filled ahead of the groups expected to start soon.
"""

from service.scheduler.core import (  # noqa: F401  (the names callers use)
    CLAIMS_PER_ATTEMPT,
    FINAL_JOB_STATES,
    OPEN_ITEM_STATES,
    Cause,
    MissingSample,
    cancel,
    claim,
    complete,
    create_job,
    get_item,
    get_job,
    heartbeat,
    live_claim,
    maybe_finish,
    missing_samples,
    progress,
    recorded_samples,
    requeue_lapsed,
    sample_key,
)
