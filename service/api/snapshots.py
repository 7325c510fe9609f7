"""Routes under /v1/snapshots: get, fork, delete."""

from __future__ import annotations

from fastapi import APIRouter, Response, status

from service import sandboxes
from service.api.deps import Ctx, CurrentPrincipal
from service.api.problems import error_responses
from service.api.sandboxes import sandbox_out, snapshot_out
from service.schemas import ForkIn, ForkOut, SnapshotOut

router = APIRouter(prefix="/v1/snapshots", tags=["snapshots"])


@router.get("/{snapshot_id}", response_model=SnapshotOut, responses=error_responses(404))
def get(snapshot_id: str, ctx: Ctx, principal: CurrentPrincipal) -> SnapshotOut:
    """One snapshot of the caller's."""
    return snapshot_out(sandboxes.get_snapshot(ctx, principal, snapshot_id))


@router.post(
    "/{snapshot_id}/fork",
    status_code=status.HTTP_201_CREATED,
    response_model=ForkOut,
    responses=error_responses(404, 409, 429, 502, 503),
)
def fork(snapshot_id: str, body: ForkIn, ctx: Ctx, principal: CurrentPrincipal) -> ForkOut:
    """Start ``n`` leased sandboxes from the snapshot (all or nothing)."""
    rows = sandboxes.fork(
        ctx, principal, snapshot_id, n=body.n, ttl_s=body.ttl_s, metadata=body.metadata
    )
    return ForkOut(snapshot_id=snapshot_id, sandboxes=[sandbox_out(r) for r in rows])


@router.delete(
    "/{snapshot_id}", status_code=status.HTTP_204_NO_CONTENT, responses=error_responses(404)
)
def delete(snapshot_id: str, ctx: Ctx, principal: CurrentPrincipal) -> Response:
    """Delete the snapshot's image; sandboxes forked from it keep running."""
    sandboxes.delete_snapshot(ctx, principal, snapshot_id)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
