"""Routes for templates and warm pools.

What a non-admin sees says nothing about other tenants: the templates of tasks (``task-...``,
made when someone runs that task) appear only while the caller holds a sandbox of one, and
``leased`` counts the caller's own sandboxes. Warm, starting and target levels are the
shared pool's. Admins see everything.
"""

from __future__ import annotations

from collections import Counter

from fastapi import APIRouter

from service import sandboxes
from service.api.deps import AdminPrincipal, Ctx, CurrentPrincipal
from service.api.problems import error_responses
from service.context import ServiceContext
from service.errors import NotFound
from service.schemas import PoolIn, PoolOut, TemplateOut
from service.tenants import Principal

router = APIRouter(prefix="/v1", tags=["templates and pools"])

TASK_TEMPLATE_PREFIX = "task-"  # see service.tasks.registry.template_name


def _visible(ctx: ServiceContext, principal: Principal) -> tuple[set[str] | None, Counter[str]]:
    """(template names the caller may see, None for all; its own live sandboxes per template)."""
    own = Counter(r.template for r in sandboxes.list_sandboxes(ctx, principal))
    if principal.is_admin:
        return None, own
    names = {t.name for t in ctx.templates.all() if not t.name.startswith(TASK_TEMPLATE_PREFIX)}
    return names | set(own), own


def _pools(ctx: ServiceContext, principal: Principal) -> dict[str, PoolOut]:
    names, own = _visible(ctx, principal)
    out = {}
    for template, lv in sorted(ctx.pools.levels().items()):
        if names is not None and template not in names:
            continue
        if names is not None:
            lv = {**lv, "leased": own.get(template, 0)}
        out[template] = PoolOut(template=template, **lv)
    return out


@router.get("/templates", response_model=list[TemplateOut])
def templates(ctx: Ctx, principal: CurrentPrincipal) -> list[TemplateOut]:
    """Every template this deployment can lease (for non-admins: no other tenant's tasks)."""
    names, _ = _visible(ctx, principal)
    return [
        TemplateOut(**t.model_dump(exclude={"env", "cap_add"}))
        for t in ctx.templates.all()
        if names is None or t.name in names
    ]


@router.get("/pools", response_model=list[PoolOut])
def pools(ctx: Ctx, principal: CurrentPrincipal) -> list[PoolOut]:
    """Warm-pool levels; a non-admin's ``leased`` counts only its own sandboxes."""
    return list(_pools(ctx, principal).values())


@router.get("/pools/{template}", response_model=PoolOut, responses=error_responses(404))
def pool(template: str, ctx: Ctx, principal: CurrentPrincipal) -> PoolOut:
    """Warm-pool level of one template (404 for a task template the caller holds none of)."""
    names, _ = _visible(ctx, principal)
    if names is not None and template not in names:
        raise NotFound(f"unknown template {template!r}", field="template")
    ctx.templates.get(template)
    found = _pools(ctx, principal).get(template)
    return found or PoolOut(template=template, target=0, warm=0, starting=0, leased=0)


@router.put("/pools/{template}", response_model=PoolOut, responses=error_responses(404))
def set_pool(template: str, body: PoolIn, ctx: Ctx, admin: AdminPrincipal) -> PoolOut:
    """Set the warm-pool target size (admin); the refill loop acts at once."""
    ctx.pools.set_target(template, body.target_size, tenant_id=admin.tenant_id, key_id=admin.key_id)
    return PoolOut(template=template, **ctx.pools.levels()[template])
