"""Route ``GET /v1/audit``: audit events, filterable; tenants see their own, admins all."""

from __future__ import annotations

from datetime import UTC, datetime

from fastapi import APIRouter, Query
from sqlalchemy import select

from service.api.deps import Ctx, CurrentPrincipal
from service.api.problems import error_responses
from service.db.models import AuditEvent
from service.errors import InvalidRequest
from service.schemas import AuditEventOut, AuditPage

router = APIRouter(prefix="/v1/audit", tags=["audit"])


MAX_SEQ = 2**63 - 1  # seq is a signed 64-bit column: a larger bound matches nothing storable


def _iso(t: datetime, field: str) -> str:
    """The stored ``ts`` format (UTC, microseconds); a time without zone is taken as UTC.

    Raises:
        InvalidRequest: the time is not representable in UTC (year 1 or 9999 near the edge).
    """
    try:
        t = t.replace(tzinfo=UTC) if t.tzinfo is None else t.astimezone(UTC)
    except OverflowError as e:
        raise InvalidRequest(f"{field} is out of range once converted to UTC", field=field) from e
    return t.isoformat(timespec="microseconds")


@router.get("", response_model=AuditPage, responses=error_responses(400))
def list_events(
    ctx: Ctx,
    principal: CurrentPrincipal,
    tenant: str | None = None,
    sandbox_id: str | None = None,
    action: str | None = None,
    since: datetime | None = Query(None, description="ISO 8601 lower bound on ts (inclusive)"),
    until: datetime | None = Query(None, description="ISO 8601 upper bound on ts (exclusive)"),
    after: int = Query(0, ge=0, le=MAX_SEQ, description="Only events with seq > after (paging)"),
    limit: int = Query(100, ge=1, le=1000),
) -> AuditPage:
    """Audit events in ``seq`` order."""
    q = select(AuditEvent).where(AuditEvent.seq > after)
    if not principal.is_admin:
        q = q.where(AuditEvent.tenant_id == principal.tenant_id)
    elif tenant:
        q = q.where(AuditEvent.tenant_id == tenant)
    if sandbox_id:
        q = q.where(AuditEvent.sandbox_id == sandbox_id)
    if action:
        q = q.where(AuditEvent.action == action)
    if since:
        q = q.where(AuditEvent.ts >= _iso(since, "since"))
    if until:
        q = q.where(AuditEvent.ts < _iso(until, "until"))
    with ctx.db.session() as s:
        rows = s.execute(q.order_by(AuditEvent.seq).limit(limit)).scalars().all()
    events = [
        AuditEventOut(
            seq=r.seq,
            ts=r.ts,
            tenant_id=r.tenant_id,
            key_id=r.key_id,
            action=r.action,
            sandbox_id=r.sandbox_id,
            details=r.details,
            prev_hash=r.prev_hash,
            hash=r.hash,
        )
        for r in rows
    ]
    return AuditPage(events=events, next_after=events[-1].seq if len(events) == limit else None)
