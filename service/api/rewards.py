"""Routes for reward records: list, export (JSONL, Parquet), anomalies."""

from __future__ import annotations

import io
import tempfile
from collections.abc import Iterator
from datetime import datetime
from typing import Literal

from fastapi import APIRouter, Query
from fastapi.responses import StreamingResponse
from pydantic import BaseModel

from service import anomaly, rewards
from service.api.deps import Ctx, CurrentPrincipal
from service.api.problems import error_responses
from service.errors import Forbidden
from service.tenants import Principal

router = APIRouter(prefix="/v1", tags=["rewards"])

PRIVATE_HELP = (
    "include verifier.details.private (expected values, reference geometry): admins only, "
    "403 otherwise; without it every caller gets the redacted records"
)


def _may_see_private(principal: Principal, private: bool) -> bool:
    """``private`` when the caller is an admin; a tenant asking for it is a 403."""
    if private and not principal.is_admin:
        raise Forbidden("private=true needs an API key with the admin scope")
    return private


class RewardPage(BaseModel):
    """A page of records; pass ``next_after`` as ``after`` for the next one."""

    records: list[rewards.RewardRecord]
    next_after: str | None


class AnomalyList(BaseModel):
    """Pass-rate anomalies per task and domain (``flagged``: verifier possibly gamed), and
    per task how its newest records ended (dodge, tamper and error rates)."""

    anomalies: list[anomaly.Anomaly]
    outcomes: list[anomaly.OutcomeRates] = []


@router.get("/rewards", response_model=RewardPage, responses=error_responses(400, 403))
def list_rewards(
    ctx: Ctx,
    principal: CurrentPrincipal,
    job_id: str | None = None,
    suite: str | None = None,
    domain: str | None = None,
    task_id: str | None = None,
    status: Literal["ok", "error", "timeout"] | None = None,
    since: datetime | None = None,
    after: str | None = None,
    limit: int = Query(100, ge=1, le=1000),
    private: bool = Query(False, description=PRIVATE_HELP),
) -> RewardPage:
    """The caller's reward records, oldest first (redacted unless an admin asks ``private``)."""
    show = _may_see_private(principal, private)
    page = rewards.query(
        ctx.db,
        tenant_id=principal.tenant_id,
        job_id=job_id,
        suite=suite,
        domain=domain,
        task_id=task_id,
        status=status,
        since=since,
        limit=limit,
        after=after,
    )
    return RewardPage(
        records=[rewards.view(r, private=show) for r in page],
        next_after=page[-1].record_id if len(page) == limit else None,
    )


@router.get(
    "/rewards/export",
    responses={
        200: {"content": {"application/x-ndjson": {}, "application/vnd.apache.parquet": {}}},
        **error_responses(400, 403),
    },
)
def export(
    ctx: Ctx,
    principal: CurrentPrincipal,
    format: Literal["jsonl", "parquet"] = "jsonl",
    normalize: Literal["none", "grpo", "mean", "domain_z"] = "none",
    job_id: str | None = None,
    suite: str | None = None,
    domain: str | None = None,
    task_id: str | None = None,
    private: bool = Query(False, description=PRIVATE_HELP),
) -> StreamingResponse:
    """Every matching record as JSONL or Parquet, optionally with an ``advantage`` column
    (redacted unless an admin asks ``private``)."""
    records = rewards.StoredRecords(
        ctx.db,
        tenant_id=principal.tenant_id,
        private=_may_see_private(principal, private),
        job_id=job_id,
        suite=suite,
        domain=domain,
        task_id=task_id,
    )
    if format == "jsonl":
        buf = io.StringIO()
        rewards.export_jsonl(records, buf, normalize=normalize)
        data = buf.getvalue().encode()
        return StreamingResponse(
            iter([data]),
            media_type="application/x-ndjson",
            headers={"Content-Disposition": "attachment; filename=rewards.jsonl"},
        )
    spool = tempfile.SpooledTemporaryFile(max_size=32 << 20)  # noqa: SIM115 - closed by _chunks
    rewards.export_parquet(records, spool, normalize=normalize)
    spool.seek(0)

    def _chunks() -> Iterator[bytes]:
        with spool:
            while chunk := spool.read(1 << 16):
                yield chunk

    return StreamingResponse(
        _chunks(),
        media_type="application/vnd.apache.parquet",
        headers={"Content-Disposition": "attachment; filename=rewards.parquet"},
    )


@router.get("/anomalies", response_model=AnomalyList)
def anomalies(
    ctx: Ctx,
    principal: CurrentPrincipal,
    window: int = Query(50, ge=5, le=10000),
    min_history: int = Query(100, ge=5),
) -> AnomalyList:
    """Per-task and per-domain pass-rate jumps against history (admins see every tenant)."""
    found = anomaly.compute_anomalies(
        ctx.db,
        tenant_id=None if principal.is_admin else principal.tenant_id,
        window=window,
        min_history=min_history,
    )
    rates = anomaly.outcome_rates(
        ctx.db, tenant_id=None if principal.is_admin else principal.tenant_id, window=window
    )
    if principal.is_admin:
        anomaly.update_gauge(found)
        anomaly.update_rate_gauges(rates)
    return AnomalyList(anomalies=found, outcomes=rates)
