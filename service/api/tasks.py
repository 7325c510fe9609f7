"""Routes for tasks and episodes: list tasks, start an episode group, verify an episode."""

from __future__ import annotations

from fastapi import APIRouter, status

from service import episodes, rewards
from service.api.deps import Ctx, CurrentPrincipal
from service.api.problems import error_responses
from service.db.models import Episode
from service.rewards import RewardRecord
from service.schemas import EpisodeGroupOut, EpisodeIn, EpisodeOut, TaskList, TaskOut, VerifyIn
from service.tasks.models import Task

router = APIRouter(prefix="/v1", tags=["tasks and episodes"])


def task_out(t: Task) -> TaskOut:
    """Task -> API schema (never the tests or the solution)."""
    return TaskOut(
        id=t.id,
        suite=t.suite,
        domain=t.domain,
        version=t.version,
        format=t.format,
        instruction=t.instruction,
        agent_timeout_s=t.agent_timeout_s,
        verifier_timeout_s=t.verifier_timeout_s,
        workdir=t.environment.workdir,
        metadata=dict(t.metadata),
    )


def episode_out(ep: Episode, task: Task) -> EpisodeOut:
    """Episode row -> API schema."""
    return EpisodeOut(
        id=ep.id,
        group_id=ep.group_id,
        sample_idx=ep.sample_idx,
        task_id=ep.task_id,
        suite=ep.suite,
        domain=ep.domain,
        task_version=ep.task_version,
        sandbox_id=ep.sandbox_id,
        state=ep.state,
        instruction=task.instruction,
        workdir=task.environment.workdir,
        agent_timeout_s=task.agent_timeout_s,
        job_id=ep.job_id,
    )


@router.get("/tasks", response_model=TaskList, responses=error_responses(400, 404))
def list_tasks(
    ctx: Ctx, _: CurrentPrincipal, suite: str | None = None, domain: str | None = None
) -> TaskList:
    """Tasks of every suite the server loaded (filter by ``suite``, ``domain``)."""
    errors = [
        e.detail for s in ctx.tasks.suites() for e in s.errors if suite is None or s.name == suite
    ]
    return TaskList(
        tasks=[task_out(t) for t in ctx.tasks.list(suite=suite, domain=domain)], errors=errors
    )


@router.get("/tasks/{suite}/{task_id}", response_model=TaskOut, responses=error_responses(404))
def get_task(suite: str, task_id: str, ctx: Ctx, _: CurrentPrincipal) -> TaskOut:
    """One task."""
    return task_out(episodes.resolve_task(ctx, task_id, suite))


@router.post(
    "/episodes",
    status_code=status.HTTP_201_CREATED,
    response_model=EpisodeGroupOut,
    responses=error_responses(404, 409, 429, 502, 503),
)
def start_episodes(body: EpisodeIn, ctx: Ctx, principal: CurrentPrincipal) -> EpisodeGroupOut:
    """Lease and set up ``group_size`` episodes of a task from one identical state."""
    started = episodes.start(
        ctx,
        principal,
        task_id=body.task_id,
        suite=body.suite,
        group_size=body.group_size,
        ttl_s=body.ttl_s,
        job_id=body.job_id,
        work_item_id=body.work_item_id,
        group_id=body.group_id,
    )
    return EpisodeGroupOut(
        group_id=started[0].episode.group_id,
        episodes=[episode_out(s.episode, s.task) for s in started],
    )


@router.get("/episodes/{episode_id}", response_model=EpisodeOut, responses=error_responses(404))
def get_episode(episode_id: str, ctx: Ctx, principal: CurrentPrincipal) -> EpisodeOut:
    """One episode."""
    ep = episodes.get(ctx, principal, episode_id)
    return episode_out(ep, episodes.resolve_task(ctx, ep.task_id, ep.suite))


@router.post(
    "/episodes/{episode_id}/verify",
    response_model=RewardRecord,
    responses=error_responses(404, 409, 502),
)
def verify(episode_id: str, body: VerifyIn, ctx: Ctx, principal: CurrentPrincipal) -> RewardRecord:
    """Verify the episode in an isolated sandbox and store its reward record. The answer is
    the tenant's view (``verifier.details.private`` removed; admins read it with
    ``GET /v1/rewards?private=true``)."""
    return rewards.redact(episodes.verify(ctx, principal, episode_id, trajectory=body.model_dump()))
