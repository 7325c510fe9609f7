"""Routes for task image builds: list, one build, one attempt's log from an offset.

Who sees what: an admin sees every build; a tenant sees the builds it asked for (an episode
it started or a job of its own needed the image, including a build whose remembered failure
answered its request) and, in ``jobs``, only its own job ids. A build of another tenant's
request is a 404, as other tenants' objects are everywhere in this API.

A log is read from its file on disk, so it can be followed while the attempt runs: ask from
``offset`` 0, then from the ``X-Next-Offset`` the answer carries, until
``X-Attempt-Outcome`` is no longer ``running`` and an answer comes back empty.
"""

from __future__ import annotations

import contextlib
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Path, Query
from fastapi.responses import Response
from pydantic import BaseModel, Field

from service import scheduler
from service.api.deps import Ctx, CurrentPrincipal
from service.api.problems import error_responses
from service.context import ServiceContext
from service.errors import CrucibleError, NotFound
from service.tasks import builds
from service.tenants import Principal

router = APIRouter(prefix="/v1", tags=["builds"])

MAX_OFFSET = 1 << 62  # a file offset the OS can seek to; larger is a 422, never a 500
BUILD_ID = r"^bld_[A-Za-z0-9]{1,64}$"


class AttemptOut(BaseModel):
    """One attempt of a build: ``n`` from 1; times ISO 8601 UTC; ``failure`` and ``reason``
    once it failed (``network`` is retried, ``tls`` and ``deterministic`` are not)."""

    n: int
    outcome: Literal["running", "built", "failed", "cancelled"]
    failure: Literal["network", "tls", "deterministic", "cancelled"] | None = None
    reason: str | None = None
    started_at: str
    ended_at: str | None = None


class BuildOut(BaseModel):
    """A task image build (``GET /v1/builds``, ``GET /v1/builds/{id}``).

    ``started_at``: when the build was asked for; ``ended_at``: when its last attempt ended
    (None while running); ``tag``: the image once built; ``error``: the last failure's
    output tail; ``jobs``: the jobs that want it (the caller's own unless admin).
    """

    id: str
    task: str
    state: Literal["running", "built", "failed", "cancelled"]
    attempts: list[AttemptOut]
    started_at: str
    ended_at: str | None = None
    tag: str | None = None
    error: str | None = None
    jobs: list[str] = Field(default_factory=list)


class BuildList(BaseModel):
    """``GET /v1/builds``: newest first."""

    builds: list[BuildOut]


def _may_see(principal: Principal, data: dict[str, Any]) -> bool:
    tenants = data.get("tenants") or []
    return principal.is_admin or principal.tenant_id in tenants


def _own_jobs(ctx: ServiceContext, principal: Principal, data: dict[str, Any]) -> list[str]:
    jobs = [j for j in data.get("requesters") or [] if isinstance(j, str)]
    if principal.is_admin:
        return jobs
    mine = []
    for job_id in jobs:
        with contextlib.suppress(CrucibleError):  # another tenant's job: not shown
            scheduler.get_job(ctx.db, principal, job_id)
            mine.append(job_id)
    return mine


def build_out(ctx: ServiceContext, principal: Principal, data: dict[str, Any]) -> BuildOut:
    """A build's stored view (``Build.public()`` or its ``build.json``) -> API schema."""
    attempts = [
        AttemptOut(
            n=a["n"],
            outcome=a["outcome"],
            failure=a.get("failure"),
            reason=a.get("reason"),
            started_at=a["started_at"],
            ended_at=a.get("ended_at"),
        )
        for a in data.get("attempts") or []
    ]
    state = data.get("state", "running")
    return BuildOut(
        id=data["id"],
        task=data["task"],
        state=state,
        attempts=attempts,
        started_at=data["created_at"],
        ended_at=attempts[-1].ended_at if attempts and state != "running" else None,
        tag=data.get("tag"),
        error=data.get("error"),
        jobs=_own_jobs(ctx, principal, data),
    )


def visible_build(
    ctx: Ctx,
    principal: CurrentPrincipal,
    build_id: Annotated[str, Path(pattern=BUILD_ID)],
) -> dict[str, Any]:
    """The build ``build_id`` as this process knows it (or as an earlier process left it on
    disk), if the caller may see it; ``NotFound`` (field ``build_id``) otherwise."""
    tracker = ctx.tasks.builds()
    try:
        data = tracker.get(build_id).public()
    except NotFound:
        data = builds.load_build(tracker.logs_dir, build_id)
    if not _may_see(principal, data):
        raise NotFound(f"unknown build {build_id!r}", field="build_id")
    return data


VisibleBuild = Annotated[dict[str, Any], Depends(visible_build)]


@router.get("/builds", response_model=BuildList)
def list_builds(ctx: Ctx, principal: CurrentPrincipal) -> BuildList:
    """The task image builds of this server process the caller may see, newest first."""
    seen = [b.public() for b in ctx.tasks.builds().list()]
    return BuildList(builds=[build_out(ctx, principal, d) for d in seen if _may_see(principal, d)])


@router.get(
    "/builds/{build_id}",
    response_model=BuildOut,
    responses=error_responses(404, 422),  # 422: build_id is checked in its dependency
)
def get_build(build: VisibleBuild, ctx: Ctx, principal: CurrentPrincipal) -> BuildOut:
    """One build and its attempts."""
    return build_out(ctx, principal, build)


LOG_HEADERS = {
    "X-Next-Offset": {
        "description": "The offset to ask from next (this offset plus the bytes returned).",
        "schema": {"type": "integer"},
    },
    "X-Attempt-Outcome": {
        "description": "running, built, failed or cancelled: stop following once it is not "
        "running and an answer is empty.",
        "schema": {"type": "string"},
    },
}


@router.get(
    "/builds/{build_id}/attempts/{n}/log",
    response_class=Response,
    responses={
        200: {
            "description": "The log's bytes from ``offset`` (at most 4 MiB; empty at the end).",
            "content": {"text/plain": {"schema": {"type": "string"}}},
            "headers": LOG_HEADERS,
        },
        **error_responses(404),
    },
)
def attempt_log(
    build: VisibleBuild,
    ctx: Ctx,
    n: Annotated[int, Path(ge=1, le=1000, description="The attempt, from 1.")],
    offset: Annotated[int, Query(ge=0, le=MAX_OFFSET, description="Byte offset to read from.")] = 0,
) -> Response:
    """One attempt's build log from ``offset`` (bytes), readable while the attempt runs."""
    data, next_offset = builds.read_log(ctx.tasks.builds().logs_dir, build["id"], n, offset=offset)
    attempts = build.get("attempts") or []
    outcome = attempts[n - 1]["outcome"] if n <= len(attempts) else "running"
    return Response(
        data,
        media_type="text/plain; charset=utf-8",
        headers={"X-Next-Offset": str(next_offset), "X-Attempt-Outcome": outcome},
    )
