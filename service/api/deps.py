"""Dependencies shared by routers: the service context and the authenticated principal."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from starlette.concurrency import run_in_threadpool

from service import audit
from service.context import ServiceContext
from service.errors import AuthError, Forbidden
from service.metrics import AUTH_FAILURES
from service.tenants import Principal


async def get_ctx(request: Request) -> ServiceContext:
    """The process's ``ServiceContext`` (set by the app's lifespan)."""
    return request.app.state.ctx


Ctx = Annotated[ServiceContext, Depends(get_ctx)]


async def get_principal(request: Request, ctx: Ctx) -> Principal:
    """Authenticate ``Authorization: Bearer <key>`` (a failure is audited and is a 401),
    then count the request against the tenant's rate limit (429 with ``Retry-After``).

    Runs on the event loop (no thread hop per request): a cached key is answered from
    memory; a miss (once per ``key_cache_ttl_s``) is one indexed read; the failure's audit
    write goes to a worker thread."""
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    raw = token.strip() if scheme.lower() == "bearer" else None
    try:
        principal = ctx.keys.authenticate(raw)  # cached; a revoke reaches every replica
    except AuthError as e:
        AUTH_FAILURES.inc()
        await run_in_threadpool(_audit_failure, request, ctx, raw, e)
        raise
    if ctx.limiter.enabled:  # 429 over the tenant's rate (a Redis round trip: off the loop)
        await run_in_threadpool(ctx.limiter.check, principal.tenant_id)
    return principal


def _audit_failure(request: Request, ctx: ServiceContext, raw: str | None, e: AuthError) -> None:
    """Audit a refused key (on a worker thread: a write)."""
    with ctx.db.session() as s:
        audit.record(
            s,
            "auth.failed",
            details={
                "method": request.method,
                "path": request.url.path[:200],
                "reason": e.detail,
                # a bounded key id only: never the secret, never unbounded client text
                "key_id": raw.split("_")[1][:32] if raw and raw.count("_") >= 2 else None,
                "client": request.client.host if request.client else None,
            },
        )


CurrentPrincipal = Annotated[Principal, Depends(get_principal)]


def get_admin(principal: CurrentPrincipal) -> Principal:
    """The principal, which must hold the ``admin`` scope (403 otherwise)."""
    if not principal.is_admin:
        raise Forbidden("this route needs an API key with the admin scope")
    return principal


AdminPrincipal = Annotated[Principal, Depends(get_admin)]
