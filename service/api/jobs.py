"""Routes for rollout jobs and their work items."""

from __future__ import annotations

import contextlib
import logging
import threading

from fastapi import APIRouter, Response, status

from service import checkpoints, episodes, scheduler
from service import replay as replay_mod
from service.api.deps import Ctx, CurrentPrincipal
from service.api.problems import error_responses
from service.api.tasks import episode_out
from service.context import ServiceContext
from service.db.models import Job, Tenant, WorkItem
from service.errors import CrucibleError, InvalidRequest, NotFound
from service.scheduler.hooks import Hooks
from service.scheduler.spec import Schedule
from service.scheduler.spec import load as load_schedule
from service.schemas import ClaimIn, CompleteIn, EpisodeOut, JobIn, JobOut, WorkItemOut
from service.tasks import builds
from service.tasks.models import Task
from service.tasks.registry import template_name

router = APIRouter(prefix="/v1", tags=["jobs"])
log = logging.getLogger("crucible.jobs")


def hooks(ctx: ServiceContext) -> Hooks:
    """What the scheduler reads from the task registry and the warm pools, for one request
    (the pool levels are read once, on first use)."""
    levels: dict[str, dict[str, int]] | None = None

    def task(suite: str, task_id: str) -> Task | None:
        try:
            return episodes.resolve_task(ctx, task_id, suite)
        except CrucibleError:
            return None

    def warm(suite: str, task_id: str) -> bool:
        nonlocal levels
        t = task(suite, task_id)
        if t is None:
            return False
        if levels is None:
            levels = ctx.pools.levels()
        return levels.get(template_name(t), {}).get("warm", 0) > 0

    def cpus(suite: str, task_id: str) -> float:
        t = task(suite, task_id)
        return t.environment.cpus if t is not None else 1.0

    def threshold(suite: str, task_id: str) -> float:
        t = task(suite, task_id)
        return t.pass_threshold if t is not None else 1.0

    def degrades_to(suite: str, task_id: str) -> str | None:
        t = task(suite, task_id)
        target = t.degrades_to if t is not None else None
        return target if target and task(suite, target) is not None else None

    return Hooks(warm=warm, cpus=cpus, threshold=threshold, degrades_to=degrades_to)


def job_tasks(job: Job) -> list[tuple[str, str]]:
    """(suite, task) pairs of a job."""
    sched = load_schedule(job.schedule)
    if sched is None:
        return [(job.suite, t) for t in job.task_ids]
    return scheduler.plan.job_tasks(job, sched)


def job_out(ctx: ServiceContext, job: Job) -> JobOut:
    """Job row -> API schema with progress."""
    return JobOut(
        id=job.id,
        suite=job.suite,
        task_ids=job.task_ids,
        group_size=job.group_size,
        priority=job.priority,
        policy=job.policy,
        max_attempts=job.max_attempts,
        state=job.state,
        created_at=job.created_at,
        finished_at=job.finished_at,
        progress=scheduler.progress(ctx.db, job.id, hooks(ctx)),
        schedule=job.schedule,
        policy_version=job.policy_version,
    )


def item_out(item: WorkItem, job: Job) -> WorkItemOut:
    """Work item row -> API schema (with what the worker needs from its job)."""
    return WorkItemOut(
        id=item.id,
        job_id=item.job_id,
        task_id=item.task_id,
        group_id=item.group_id,
        state=item.state,
        attempts=item.attempts,
        claim_expires_at=item.claim_expires_at,
        last_error=item.last_error,
        created_at=item.created_at,
        group_size=job.group_size,
        claim_id=item.claim_id,
        claims=item.claims,
        suite=item.suite or job.suite,
        policy=job.policy,
        policy_version=item.policy_version,
    )


def _prepare(
    ctx: ServiceContext, job_id: str, tenant_id: str, tasks: list[tuple[str, str]]
) -> None:
    """Build the job's task images (background). The builds are the job's
    (``builds.on_behalf_of``): cancelling the job stops those no one else wants.

    Warm sandboxes are not asked for here: the pool loop's ``scheduler.demand.Feed`` asks
    for those of the groups expected to start soon, within the tenant's quota.
    """
    with builds.on_behalf_of(job_id, tenant_id=tenant_id):
        for suite, task_id in tasks:
            try:
                task = episodes.resolve_task(ctx, task_id, suite)
                episodes.ensure_template(ctx, task)
            except CrucibleError as e:  # BuildCancelled included: the job was cancelled
                log.warning("preparing %s/%s failed: %s", suite, task_id, e.detail)


@router.post(
    "/jobs",
    status_code=status.HTTP_201_CREATED,
    response_model=JobOut,
    responses=error_responses(404),
)
def create_job(body: JobIn, ctx: Ctx, principal: CurrentPrincipal) -> JobOut:
    """Create a job (every task of ``suite`` unless ``task_ids``; a mixed job: every task of
    each ``schedule.mix`` suite unless its ``task_ids``); images build and warm pools fill
    in the background."""
    if body.group_size > ctx.settings.max_fork_n:
        raise InvalidRequest(
            f"group_size {body.group_size} exceeds the maximum {ctx.settings.max_fork_n}",
            field="group_size",
        )
    sched = body.schedule
    if sched is not None and sched.mix:
        if body.suite is not None or body.task_ids is not None:
            raise InvalidRequest(
                "a mixed job names its suites and tasks in schedule.mix, not suite/task_ids",
                field="suite",
            )
        tasks = []
        for i, d in enumerate(sched.mix):
            ids = d.task_ids if d.task_ids is not None else list(_suite(ctx, d.suite, i).ids)
            tasks += [(d.suite, t) for t in ids]
        label, task_ids = "+".join(d.suite for d in sched.mix), [f"{s}/{t}" for s, t in tasks]
    else:
        if body.suite is None:
            raise InvalidRequest("suite is required (or schedule.mix)", field="suite")
        suite = ctx.tasks.suite(body.suite)
        task_ids = body.task_ids if body.task_ids is not None else list(suite.ids)
        label, tasks = body.suite, [(body.suite, t) for t in task_ids]
    for s, t in tasks:
        episodes.resolve_task(ctx, t, s)
    if sched is not None:
        _check_schedule(ctx, principal.tenant_id, sched, body.group_size, {s for s, _ in tasks})
    job = scheduler.create_job(
        ctx.db,
        principal,
        suite=label,
        task_ids=task_ids,
        group_size=body.group_size,
        priority=body.priority,
        policy=body.policy.model_dump(),
        max_attempts=body.max_attempts,
        schedule=sched,
    )
    threading.Thread(
        target=_prepare,
        args=(ctx, job.id, principal.tenant_id, tasks),
        daemon=True,
        name=f"prepare-{job.id}",
    ).start()
    return job_out(ctx, job)


def _suite(ctx: ServiceContext, name: str, i: int) -> object:
    try:
        return ctx.tasks.suite(name)
    except NotFound as e:
        raise NotFound(e.detail, field=f"schedule.mix[{i}].suite") from None


def _check_schedule(
    ctx: ServiceContext, tenant_id: str, sched: Schedule, group_size: int, suites: set[str]
) -> None:
    """422 for a schedule that cannot hold: limits on suites the job lacks or past the
    tenant's quota, a straggler quorum larger than the group."""
    with ctx.db.read() as s:
        tenant = s.get(Tenant, tenant_id)
    for suite, lim in sched.domain_limits.items():
        field = f"schedule.domain_limits.{suite}"
        if suite not in suites:
            raise InvalidRequest(
                f"domain_limits names {suite!r}, not a suite of the job", field=field
            )
        if tenant is not None and lim.max_sandboxes and lim.max_sandboxes > tenant.max_sandboxes:
            raise InvalidRequest(
                f"max_sandboxes {lim.max_sandboxes} exceeds the tenant's quota "
                f"{tenant.max_sandboxes}",
                field=field + ".max_sandboxes",
            )
        if tenant is not None and lim.max_cpus and lim.max_cpus > tenant.max_cpus + 1e-9:
            raise InvalidRequest(
                f"max_cpus {lim.max_cpus:g} exceeds the tenant's quota {tenant.max_cpus:g}",
                field=field + ".max_cpus",
            )
        if lim.max_sandboxes is not None and lim.max_sandboxes < group_size:
            raise InvalidRequest(
                f"max_sandboxes {lim.max_sandboxes} is less than one group ({group_size})",
                field=field + ".max_sandboxes",
            )
    if sched.straggler is not None and sched.straggler.min_samples > group_size:
        raise InvalidRequest(
            f"straggler.min_samples {sched.straggler.min_samples} exceeds group_size {group_size}",
            field="schedule.straggler.min_samples",
        )


@router.get("/jobs/{job_id}", response_model=JobOut, responses=error_responses(404))
def get_job(job_id: str, ctx: Ctx, principal: CurrentPrincipal) -> JobOut:
    """A job and its progress: items by state, records by status, mean reward, expected
    records and the samples still missing (``progress.missing``: item, task, sample, why).
    A job ends ``done`` only with every sample recorded, else ``partial`` or ``failed``."""
    return job_out(ctx, scheduler.get_job(ctx.db, principal, job_id))


@router.post(
    "/jobs/{job_id}/claim",
    response_model=WorkItemOut,
    responses={204: {"description": "nothing to claim now"}, **error_responses(404, 409)},
)
def claim(job_id: str, body: ClaimIn, ctx: Ctx, principal: CurrentPrincipal) -> Response:
    """Claim the next work item (204 when none is claimable now)."""
    item = scheduler.claim(
        ctx.db,
        principal,
        job_id,
        worker=body.worker,
        lease_s=body.lease_s,
        policy_version=body.policy_version,
        hooks=hooks(ctx),
    )
    if item is None:
        return Response(status_code=status.HTTP_204_NO_CONTENT)
    job = scheduler.get_job(ctx.db, principal, job_id)
    return Response(item_out(item, job).model_dump_json(), media_type="application/json")


@router.post("/jobs/{job_id}/cancel", response_model=JobOut, responses=error_responses(404, 409))
def cancel(job_id: str, ctx: Ctx, principal: CurrentPrincipal) -> JobOut:
    """Cancel a job's queued items; its warm-pool demand is dropped and the task builds it
    started stop (those no other job or request waits for)."""
    job = scheduler.cancel(ctx.db, principal, job_id)
    ctx.tasks.builds().cancel_job(job.id)
    for suite, task_id in job_tasks(job):
        with contextlib.suppress(CrucibleError):  # a task gone from the registry has no pool
            template = template_name(episodes.resolve_task(ctx, task_id, suite))
            ctx.pools.drop_demand(template, owner=job.tenant_id)
    return job_out(ctx, job)


@router.post(
    "/work-items/{item_id}/heartbeat",
    response_model=WorkItemOut,
    responses=error_responses(404, 409),
)
def heartbeat(item_id: str, body: ClaimIn, ctx: Ctx, principal: CurrentPrincipal) -> WorkItemOut:
    """Renew a claim to now + ``lease_s`` (409 once it lapsed: the item was re-queued and
    the claim's episodes abandoned)."""
    item = scheduler.heartbeat(ctx.db, principal, item_id, worker=body.worker, lease_s=body.lease_s)
    return item_out(item, scheduler.get_job(ctx.db, principal, item.job_id))


@router.post(
    "/work-items/{item_id}/complete",
    response_model=WorkItemOut,
    responses=error_responses(404, 409),
)
def complete(item_id: str, body: CompleteIn, ctx: Ctx, principal: CurrentPrincipal) -> WorkItemOut:
    """Finish an attempt: done (every sample recorded), or back to the queue, or failed;
    only ``cause`` policy or verifier uses an attempt."""
    item = scheduler.complete(
        ctx.db,
        principal,
        item_id,
        worker=body.worker,
        ok=body.ok,
        error=body.error,
        cause=body.cause,
        hooks=hooks(ctx),
    )
    job = scheduler.get_job(ctx.db, principal, item.job_id)
    if item.state not in scheduler.OPEN_ITEM_STATES:  # nothing left to resume
        checkpoints.drop_item(ctx, principal, item.id)
    if item.state in ("done", "failed") and job.state in scheduler.FINAL_JOB_STATES:
        with contextlib.suppress(CrucibleError):  # a task gone from the registry has no pool
            task = episodes.resolve_task(ctx, item.task_id, item.suite or job.suite)
            ctx.pools.drop_demand(template_name(task), owner=job.tenant_id)
    return item_out(item, job)


@router.post(
    "/episodes/{episode_id}/replay",
    response_model=replay_mod.ReplayReport,
    responses=error_responses(404, 409, 429),
)
def replay(episode_id: str, ctx: Ctx, principal: CurrentPrincipal) -> replay_mod.ReplayReport:
    """Re-run a verified episode's recorded actions in a new sandbox of the same task version
    and image digest; compare each turn's exit code and output and the final reward.
    ``divergences`` lists what differed; ``nondeterministic`` says the task itself did (same
    version and digest). Nothing is recorded; the replay's sandbox is released."""
    return replay_mod.replay(ctx, principal, episode_id)


@router.post(
    "/episodes/{episode_id}/checkpoints",
    status_code=status.HTTP_201_CREATED,
    response_model=checkpoints.CheckpointOut,
    responses=error_responses(400, 404, 409, 429),
)
def checkpoint(
    episode_id: str, body: checkpoints.CheckpointIn, ctx: Ctx, principal: CurrentPrincipal
) -> checkpoints.CheckpointOut:
    """Checkpoint a job's running episode: its sandbox's snapshot plus ``state`` (the
    trajectory so far, token ids included) after ``turn`` turns; replaces the sample's
    previous checkpoint."""
    return checkpoints.out(checkpoints.save(ctx, principal, episode_id, body))


@router.get(
    "/work-items/{item_id}/checkpoints",
    response_model=list[checkpoints.CheckpointOut],
    responses=error_responses(404),
)
def item_checkpoints(
    item_id: str, ctx: Ctx, principal: CurrentPrincipal
) -> list[checkpoints.CheckpointOut]:
    """The item's checkpoints (one per sample that has one), with their ``state``."""
    rows = checkpoints.of_item(ctx, principal, item_id)
    return [checkpoints.out(r, with_state=True) for r in rows]


@router.post(
    "/work-items/{item_id}/resume",
    response_model=EpisodeOut,
    responses=error_responses(404, 409, 429),
)
def resume(
    item_id: str, body: checkpoints.ResumeIn, ctx: Ctx, principal: CurrentPrincipal
) -> EpisodeOut:
    """Resume a sample from its checkpoint under the item's live claim: a new episode in a
    sandbox forked from the checkpoint's snapshot; its record names the checkpoint
    (``resumed_from``). A later ``POST /v1/episodes`` for the item reuses it."""
    started = checkpoints.resume(ctx, principal, item_id, body.sample_idx)
    return episode_out(started.episode, started.task)
