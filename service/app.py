"""FastAPI application factory and lifespan (serve lock, runtime readiness, reconcile and
recovery, pools start/stop)."""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service import dashboard, idempotency, logs, recovery, tenants, tracing
from service.api import (
    audit,
    builds,
    edge,
    events,
    fastlane,
    health,
    jobs,
    keys,
    limits,
    problems,
    processes,
    rewards,
    sandboxes,
    sessions,
    snapshots,
    tasks,
    templates_pools,
)
from service.config import Settings, get_settings
from service.context import ServiceContext
from service.idempotency import IdempotencyMiddleware
from service.metrics import HTTP_LATENCY, HTTP_REQUESTS
from service.sandboxes import expire_snapshots
from service.scheduler import demand
from service.serverlock import ServerLock

log = logging.getLogger("crucible")


class MetricsMiddleware:
    """Counts requests and latency per route template (pure ASGI: no body buffering)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        status: dict[str, int | None] = {"code": None}

        async def _send(message: Message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, _send)
        except BaseException:
            status["code"] = status["code"] or 500
            raise
        finally:
            status["code"] = logs.unanswered_status(scope, status["code"])
            route = scope.get("route")
            path = getattr(route, "path", "unmatched")
            HTTP_REQUESTS.labels(scope["method"], path, str(status["code"])).inc()
            HTTP_LATENCY.labels(scope["method"], path).observe(time.perf_counter() - t0)


def _request_limits(scope: Scope) -> tuple[int, int]:
    """(max_body_bytes, max_json_depth) of the app serving ``scope``."""
    settings = scope["app"].state.ctx.settings
    return settings.max_body_bytes, settings.max_json_depth


def _body_idle_timeout_s(scope: Scope) -> float:
    """``body_idle_timeout_s`` of the app serving ``scope``."""
    return scope["app"].state.ctx.settings.body_idle_timeout_s


def bootstrap(ctx: ServiceContext) -> None:
    """Create the configured admin key (idempotent), reconcile with the engine."""
    s_ = ctx.settings
    if s_.bootstrap_admin_key:
        with ctx.db.session() as s:
            tenants.create_tenant(
                s,
                "admin",
                max_sandboxes=s_.default_quota_sandboxes,
                max_cpus=s_.default_quota_cpus,
                max_memory_mb=s_.default_quota_memory_mb,
            )
            tenants.create_key(
                s, "admin", scopes={"admin"}, name="bootstrap", secret=s_.bootstrap_admin_key
            )
    ctx.runtime.ensure_ready()
    counts = ctx.pools.reconcile()
    recovered = recovery.recover_on_start(ctx)
    ctx.pools.add_maintenance(lambda: recovery.reclaim(ctx))
    ctx.pools.add_maintenance(recovery.DeadReplicaWork(ctx))  # replicas: what a dead one left
    ctx.pools.add_maintenance(lambda: expire_snapshots(ctx))
    ctx.pools.add_maintenance(lambda: idempotency.prune(ctx.db))
    ctx.pools.add_maintenance(demand.Feed(ctx))  # warm pools ahead of what is queued
    log.info("reconciled deployment %s: %s; recovered %s", s_.deployment, counts, recovered)


def create_app(
    settings: Settings | None = None,
    *,
    ctx: ServiceContext | None = None,
    maintain_pools: bool = True,
) -> FastAPI:
    """Build the app. With ``ctx`` given (tests), it is used as is; else one is built at start-up.

    ``maintain_pools=False`` skips the background refill/reaper loop (tests drive ``tick``).
    """

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        lock = None
        s_ = ctx.settings if ctx is not None else settings or get_settings()
        if ctx is None and not s_.replica:  # before anything is touched: one per deployment
            lock = ServerLock(s_.sqlalchemy_url, s_.deployment)
            lock.acquire()
        try:
            c = ctx or await run_in_threadpool(ServiceContext.build, s_)
            app.state.ctx = c
            await run_in_threadpool(bootstrap, c)
            if maintain_pools:
                c.pools.start()
            # What start-up made (modules, settings, templates, tasks) lives as long as the
            # process: gc.freeze leaves it out of every later collection, so a full
            # collection's pause scales with what requests hold, not with all that is
            # loaded (the admin rewards page at size: slowest of 30 renders 271 -> ~150 ms).
            gc.freeze()
            try:
                yield
            finally:
                c.tasks.builds().cancel_all()  # shutdown never waits for a task build
                await run_in_threadpool(c.pools.stop, drain_warm=True)
        finally:
            if lock is not None:
                lock.release()

    app = FastAPI(
        title="Crucible",
        version="0.1.0",
        description="Sandboxed agent environments for RL post-training: warm-pooled Docker "
        "sandboxes, exec, files, snapshots, forks, quotas and an audit log.",
        lifespan=lifespan,
    )
    problems.install(app)
    routers = [
        r.router
        for r in (
            health,
            sandboxes,
            processes,
            sessions,
            snapshots,
            templates_pools,
            tasks,
            builds,
            jobs,
            rewards,
            audit,
            keys,
            events,
        )
    ]
    for router in routers:
        app.include_router(router)
    problems.install_openapi(app, routers)
    dashboard.install(app)  # /dashboard: server-rendered HTML, not in the OpenAPI schema
    app.add_middleware(IdempotencyMiddleware)  # inside the limits: it reads bounded bodies
    app.add_middleware(limits.RequestLimitsMiddleware, limits=_request_limits)
    app.add_middleware(MetricsMiddleware)
    app.add_middleware(tracing.TracingMiddleware)  # a pass-through unless tracing is on
    app.add_middleware(logs.RequestIdMiddleware)  # every answer carries its id
    app.add_middleware(fastlane.FastLane)  # one-shot execs, leases; the rest passed on
    # outermost: a control character in the path, a body that stops arriving
    app.add_middleware(edge.EdgeMiddleware, idle_timeout_s=_body_idle_timeout_s)
    return app
