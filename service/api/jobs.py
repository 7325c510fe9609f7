"""Routes for rollout jobs and their work items."""

from __future__ import annotations

import contextlib
import logging
import threading

from fastapi import APIRouter, Response, status

from service import episodes, scheduler, tenants
from service.api.deps import Ctx, CurrentPrincipal
from service.api.problems import error_responses
from service.context import ServiceContext
from service.db.models import Job, WorkItem
from service.errors import CrucibleError, InvalidRequest
from service.schemas import ClaimIn, CompleteIn, JobIn, JobOut, WorkItemOut
from service.tasks import builds
from service.tasks.registry import template_name

router = APIRouter(prefix="/v1", tags=["jobs"])
log = logging.getLogger("crucible.jobs")


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
        progress=scheduler.progress(ctx.db, job.id),
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
        suite=job.suite,
        policy=job.policy,
    )


def _prepare(
    ctx: ServiceContext, job_id: str, tenant_id: str, suite: str, task_ids: list[str]
) -> None:
    """Build the job's task images and ask for two warm sandboxes per task (background): one
    for an episode, one for the pristine sandbox its verification takes. The builds are the
    job's (``builds.on_behalf_of``): cancelling the job stops those no one else wants.

    The warm sandboxes a tenant's jobs ask for, over all its jobs and templates, stay
    within the room its sandbox quota has now (``tenants.sandbox_room``): past it, tasks
    start cold. A tenant allowed 2 sandboxes makes the service keep at most 2 warm for it.
    """
    with ctx.db.read() as s:
        budget = tenants.sandbox_room(s, tenant_id)
    with builds.on_behalf_of(job_id, tenant_id=tenant_id):
        for task_id in task_ids:
            try:
                task = episodes.resolve_task(ctx, task_id, suite)
                template = episodes.ensure_template(ctx, task)
                ctx.pools.add_demand(template, 2, owner=tenant_id, budget=budget)
            except CrucibleError as e:  # BuildCancelled included: the job was cancelled
                log.warning("preparing %s/%s failed: %s", suite, task_id, e.detail)


@router.post(
    "/jobs",
    status_code=status.HTTP_201_CREATED,
    response_model=JobOut,
    responses=error_responses(404),
)
def create_job(body: JobIn, ctx: Ctx, principal: CurrentPrincipal) -> JobOut:
    """Create a job (every task of ``suite`` unless ``task_ids``); images build and warm
    pools fill in the background."""
    if body.group_size > ctx.settings.max_fork_n:
        raise InvalidRequest(
            f"group_size {body.group_size} exceeds the maximum {ctx.settings.max_fork_n}",
            field="group_size",
        )
    suite = ctx.tasks.suite(body.suite)
    task_ids = body.task_ids if body.task_ids is not None else list(suite.ids)
    for t in task_ids:
        episodes.resolve_task(ctx, t, body.suite)
    job = scheduler.create_job(
        ctx.db,
        principal,
        suite=body.suite,
        task_ids=task_ids,
        group_size=body.group_size,
        priority=body.priority,
        policy=body.policy.model_dump(),
        max_attempts=body.max_attempts,
    )
    threading.Thread(
        target=_prepare,
        args=(ctx, job.id, principal.tenant_id, body.suite, task_ids),
        daemon=True,
        name=f"prepare-{job.id}",
    ).start()
    return job_out(ctx, job)


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
    item = scheduler.claim(ctx.db, principal, job_id, worker=body.worker, lease_s=body.lease_s)
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
    for task_id in job.task_ids:
        with contextlib.suppress(CrucibleError):  # a task gone from the registry has no pool
            template = template_name(episodes.resolve_task(ctx, task_id, job.suite))
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
    )
    job = scheduler.get_job(ctx.db, principal, item.job_id)
    if item.state in ("done", "failed") and job.state in scheduler.FINAL_JOB_STATES:
        with contextlib.suppress(CrucibleError):  # a task gone from the registry has no pool
            task = episodes.resolve_task(ctx, item.task_id, job.suite)
            ctx.pools.drop_demand(template_name(task), owner=job.tenant_id)
    return item_out(item, job)
