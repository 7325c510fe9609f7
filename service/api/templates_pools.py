"""Routes for templates and warm pools."""

from __future__ import annotations

from fastapi import APIRouter

from service.api.deps import AdminPrincipal, Ctx, CurrentPrincipal
from service.api.problems import error_responses
from service.schemas import PoolIn, PoolOut, TemplateOut

router = APIRouter(prefix="/v1", tags=["templates and pools"])


@router.get("/templates", response_model=list[TemplateOut])
def templates(ctx: Ctx, _: CurrentPrincipal) -> list[TemplateOut]:
    """Every template this deployment can lease."""
    return [
        TemplateOut(**t.model_dump(exclude={"uid", "gid", "env", "cap_add"}))
        for t in ctx.templates.all()
    ]


@router.get("/pools", response_model=list[PoolOut])
def pools(ctx: Ctx, _: CurrentPrincipal) -> list[PoolOut]:
    """Warm-pool levels of every template."""
    return [PoolOut(template=k, **v) for k, v in sorted(ctx.pools.levels().items())]


@router.get("/pools/{template}", response_model=PoolOut, responses=error_responses(404))
def pool(template: str, ctx: Ctx, _: CurrentPrincipal) -> PoolOut:
    """Warm-pool level of one template."""
    ctx.templates.get(template)
    lv = ctx.pools.levels().get(template, {"target": 0, "warm": 0, "starting": 0, "leased": 0})
    return PoolOut(template=template, **lv)


@router.put("/pools/{template}", response_model=PoolOut, responses=error_responses(404))
def set_pool(template: str, body: PoolIn, ctx: Ctx, admin: AdminPrincipal) -> PoolOut:
    """Set the warm-pool target size (admin); the refill loop acts at once."""
    ctx.pools.set_target(template, body.target_size, tenant_id=admin.tenant_id, key_id=admin.key_id)
    return PoolOut(template=template, **ctx.pools.levels()[template])
