"""Liveness, readiness and Prometheus metrics (no auth, as scrapers and probes expect)."""

from __future__ import annotations

from fastapi import APIRouter, Response
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from service import anomaly
from service.api.deps import Ctx
from service.metrics import (
    COORDINATION_UP,
    POOL_LEVEL,
    POOL_TARGET,
    REGISTRY,
)

router = APIRouter(tags=["health"])


@router.get("/healthz")
def healthz() -> dict[str, str]:
    """The process is up."""
    return {"status": "ok"}


@router.get(
    "/readyz",
    responses={
        503: {
            "description": "The database or the engine does not answer",
            "content": {"application/json": {}},
        }
    },
)
def readyz(ctx: Ctx) -> JSONResponse:
    """Ready when the database and the Docker engine answer (503 otherwise).

    ``coordination`` reports the replicas' shared state (``service.coordination``): with
    Redis unreachable the status is ``degraded`` (still 200: leasing rests on the database;
    refill falls back to one replica on an advisory lock).
    """
    checks = {"database": ctx.db.ping(), "docker": ctx.runtime.ping()}
    coordination = ctx.pools.coord.health()
    ok = all(checks.values())
    status = "unavailable" if not ok else "ok" if coordination["ok"] else "degraded"
    return JSONResponse(
        {"status": status, "checks": checks, "coordination": coordination},
        status_code=200 if ok else 503,
    )


@router.get("/metrics", response_class=PlainTextResponse)
def metrics(ctx: Ctx) -> Response:
    """Prometheus text exposition (pool levels, coordination health and verifier anomalies
    refreshed per scrape)."""
    anomaly.refresh(ctx.db)
    health = ctx.pools.coord.health()
    COORDINATION_UP.labels(str(health["backend"])).set(1 if health["ok"] else 0)
    for template, lv in ctx.pools.levels().items():
        POOL_TARGET.labels(template).set(lv["target"])
        for state in ("warm", "starting", "leased"):
            POOL_LEVEL.labels(template, state).set(lv[state])
    return Response(generate_latest(REGISTRY), media_type=CONTENT_TYPE_LATEST)
