"""Dashboard pages under ``/dashboard``: thin handlers from HTTP to service calls and back.

Tenants see their own rows; admins see every tenant's (``Viewer.scope``). Something that
does not exist and something that belongs to another tenant are the same 404.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from starlette.concurrency import run_in_threadpool

from service import anomaly, audit, episodes, rewards, sandboxes, scheduler, tenants
from service.api.audit import MAX_SEQ, _iso
from service.api.deps import Ctx
from service.api.templates_pools import _pools
from service.context import ServiceContext
from service.dashboard import charts, queries, reward_queries, stats
from service.dashboard.auth import (
    CurrentViewer,
    PageNotFound,
    SignInRequired,
    Viewer,
    check_csrf,
    get_viewer,
    read_form,
    signer,
)
from service.dashboard.catalog import catalog
from service.dashboard.monitor import MAX_AGE_REFRESHES, MonitorCache, MonitorView
from service.dashboard.render import SECURITY_HEADERS, page
from service.dashboard.session import LOGIN_COOKIE, LOGIN_TTL_S, SESSION_COOKIE
from service.db.models import Sandbox, utcnow
from service.errors import AuthError, Forbidden, InvalidRequest, NotFound
from service.metrics import AUTH_FAILURES

router = APIRouter(prefix="/dashboard", include_in_schema=False)

T = TypeVar("T")

PAGE = 50
"""Rows per page of the audit search, the episode and the job lists."""
TIMELINE_PAGE = 500
"""Events per page of a sandbox's timeline."""
MAX_ACTION_CHARS = 2000
"""Characters of a turn's action shown before it is cut."""


def owned(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)``, a service lookup that raises ``NotFound`` for foreign or unknown ids."""
    try:
        return fn(*args)
    except NotFound as e:
        raise PageNotFound(e.detail) from e


def _cookie_kw(request: Request) -> dict[str, Any]:
    return {"httponly": True, "samesite": "strict", "secure": request.url.scheme == "https"}


def _redirect(url: str) -> RedirectResponse:
    return RedirectResponse(url, status_code=303, headers=SECURITY_HEADERS)


def _safe_next(path: str | None) -> str:
    """Only a dashboard path of this origin (no scheme, no ``//host``, no backslash)."""
    if path and path.startswith("/dashboard") and "//" not in path and "\\" not in path:
        return path
    return "/dashboard"


# --------------------------------------------------------------------------- sign-in


@router.get("/login", response_class=HTMLResponse)
def login_form(request: Request, next: str | None = None, error: str | None = None) -> Response:
    """The sign-in form; sets the pre-session cookie its CSRF token is bound to."""
    nonce = secrets.token_hex(16)
    resp = page(
        request,
        "login.html",
        status=401 if error else 200,
        csrf=signer(request).csrf(nonce, purpose="login"),
        next=_safe_next(next),
        error=error,
        viewer=None,
    )
    resp.set_cookie(
        LOGIN_COOKIE, nonce, max_age=LOGIN_TTL_S, path="/dashboard", **_cookie_kw(request)
    )
    return resp


@router.post("/login")
async def login(request: Request, ctx: Ctx) -> Response:
    """Exchange an API key for a session cookie (HttpOnly, SameSite=Strict, expiring)."""
    form = await read_form(request)
    sign = signer(request)
    if not sign.csrf_ok(request.cookies.get(LOGIN_COOKIE), form.get("csrf"), purpose="login"):
        raise Forbidden("missing or invalid CSRF token: reload the sign-in page", field="csrf")
    raw = form.get("key", "").strip()
    try:
        principal = await run_in_threadpool(_authenticate, ctx, raw, request)
    except AuthError as e:
        return login_form(request, next=form.get("next"), error=e.detail)
    resp = _redirect(_safe_next(form.get("next")))
    ttl = ctx.settings.dashboard_session_ttl_s
    resp.set_cookie(
        SESSION_COOKIE,
        sign.issue(principal.key_id, ttl_s=ttl),
        max_age=ttl,
        path="/dashboard",
        **_cookie_kw(request),
    )
    resp.delete_cookie(LOGIN_COOKIE, path="/dashboard")
    return resp


def _authenticate(ctx: ServiceContext, raw: str, request: Request) -> tenants.Principal:
    """The key's principal; a failure is audited (``auth.failed``) like the API's."""
    try:
        with ctx.db.read() as s:
            principal = tenants.authenticate(s, raw)
    except AuthError as e:
        AUTH_FAILURES.inc()
        with ctx.db.session() as s:
            audit.record(
                s,
                "auth.failed",
                details={
                    "method": "POST",
                    "path": "/dashboard/login",
                    "reason": e.detail,
                    "key_id": raw.split("_")[1][:32] if raw.count("_") >= 2 else None,
                    "client": request.client.host if request.client else None,
                },
            )
        raise
    with ctx.db.session() as s:
        audit.record(s, "dashboard.sign_in", tenant_id=principal.tenant_id, key_id=principal.key_id)
    return principal


@router.post("/logout")
async def logout(request: Request, ctx: Ctx) -> Response:
    """End the session (the cookie is cleared); needs the session's CSRF token."""
    viewer = get_viewer(request, ctx)
    check_csrf(request, viewer, await read_form(request))
    resp = _redirect("/dashboard/login")
    resp.delete_cookie(SESSION_COOKIE, path="/dashboard")
    return resp


# --------------------------------------------------------------------------- overview


@dataclass(frozen=True)
class PoolRow:
    """One template's pool levels, with its sandboxes that failed in the last day."""

    template: str
    target: int
    warm: int
    starting: int
    leased: int
    failed: int


def _monitor(request: Request, ctx: ServiceContext, viewer: Viewer) -> MonitorView:
    """The anomaly monitor's checks and outcome rates of the viewer's scope, computed at most
    once per refresh interval and only when its records changed (``monitor.MonitorCache``,
    one per app)."""
    state = request.app.state
    if getattr(state, "dashboard_monitor", None) is None:
        every = ctx.settings.dashboard_refresh_s
        state.dashboard_monitor = MonitorCache(every, MAX_AGE_REFRESHES * every)
    return state.dashboard_monitor.get(ctx.db, viewer.scope)


def _overview(request: Request, ctx: ServiceContext, viewer: Viewer) -> dict[str, Any]:
    """Everything the live panel shows (one read of each source)."""
    failed = queries.failed_by_template(
        ctx.db, deployment=ctx.settings.deployment, tenant=viewer.scope
    )
    pools = [
        PoolRow(p.template, p.target, p.warm, p.starting, p.leased, failed.get(p.template, 0))
        for p in _pools(ctx, viewer.principal).values()
    ]
    monitor = _monitor(request, ctx, viewer)
    flags = [a for a in monitor.anomalies if a.flagged]
    rates = [r for r in monitor.rates if r.dodge_rate > 0 or r.error_rate > 0]
    return {
        "pools": pools,
        "live": queries.live_sandboxes(ctx.db, tenant=viewer.scope),
        "quotas": queries.quota_use(ctx.db, tenant=viewer.scope),
        "errors": queries.recent_events(ctx.db, tenant=viewer.scope, actions=catalog().errors),
        "flags": flags,
        "rates": sorted(rates, key=lambda r: -r.dodge_rate)[:10],
        "refreshed": utcnow(),
        "refresh_ms": int(ctx.settings.dashboard_refresh_s * 1000),
    }


@router.get("", response_class=HTMLResponse)
def overview(request: Request, ctx: Ctx, viewer: CurrentViewer) -> Response:
    """Pools, live sandboxes, quota use, recent errors and anomaly flags (live refresh)."""
    return page(
        request, "overview.html", viewer=viewer, nav="overview", **_overview(request, ctx, viewer)
    )


@router.get("/live/overview", response_class=HTMLResponse)
def overview_live(request: Request, ctx: Ctx, viewer: CurrentViewer) -> Response:
    """The overview's live panel alone (what the page's script polls)."""
    return page(request, "_overview_live.html", viewer=viewer, **_overview(request, ctx, viewer))


# --------------------------------------------------------------------------- sandboxes


@router.get("/sandboxes/{sandbox_id}", response_class=HTMLResponse)
def sandbox_page(
    request: Request,
    sandbox_id: str,
    ctx: Ctx,
    viewer: CurrentViewer,
    after: int = Query(0, ge=0, le=MAX_SEQ),
) -> Response:
    """A sandbox's state, limits, episode, snapshots and forks, and its audit timeline."""
    row: Sandbox = owned(sandboxes.get_owned, ctx, viewer.principal, sandbox_id)
    events, next_after = queries.sandbox_events(
        ctx.db, row.id, tenant=viewer.scope, after=after, limit=TIMELINE_PAGE
    )
    template = next((t for t in ctx.templates.all() if t.name == row.template), None)
    return page(
        request,
        "sandbox.html",
        viewer=viewer,
        nav="",
        sb=row,
        template=template,
        rel=queries.sandbox_relations(ctx.db, row),
        events=events,
        next_after=next_after,
        label=catalog().label,
    )


# --------------------------------------------------------------------------- audit


def _when(text: str, field: str) -> datetime:
    """An ISO 8601 time from a form field (``datetime-local`` sends one without zone).

    Raises:
        InvalidRequest: not a time (names ``field``).
    """
    try:
        return datetime.fromisoformat(text)
    except ValueError as e:
        raise InvalidRequest(f"{field} must be an ISO 8601 time", field=field) from e


def _chain(request: Request) -> dict[str, Any] | None:
    return getattr(request.app.state, "dashboard_chain", None)


@router.get("/audit", response_class=HTMLResponse)
def audit_page(
    request: Request,
    ctx: Ctx,
    viewer: CurrentViewer,
    tenant: str | None = Query(None, max_length=64),
    sandbox_id: str | None = Query(None, max_length=40),
    action: str | None = Query(None, max_length=64),
    since: str | None = Query(None, max_length=40, description="ISO 8601; no zone: UTC"),
    until: str | None = Query(None, max_length=40, description="ISO 8601; no zone: UTC"),
    q: str | None = Query(None, max_length=200),
    before: int | None = Query(None, ge=1, le=MAX_SEQ),
    limit: int = Query(PAGE, ge=1, le=queries.MAX_PAGE),
) -> Response:
    """Audit search (newest first, keyset pages) and the chain's last verification."""
    f = queries.AuditFilter(
        tenant=tenant or None,
        sandbox_id=sandbox_id or None,
        action=action or None,
        since=_iso(_when(since, "since"), "since") if since else None,
        until=_iso(_when(until, "until"), "until") if until else None,
        text=q or None,
    )
    found = queries.audit_page(ctx.db, f, scope=viewer.scope, before=before, limit=limit)
    params = {
        k: v
        for k, v in {
            "tenant": tenant if viewer.is_admin else None,
            "sandbox_id": sandbox_id,
            "action": action,
            "since": since,
            "until": until,
            "q": q,
            "limit": limit if limit != PAGE else None,
        }.items()
        if v
    }
    return page(
        request,
        "audit.html",
        viewer=viewer,
        nav="audit",
        rows=found.rows,
        next_before=found.next_before,
        searched_from=found.searched_from,
        text_window=queries.TEXT_WINDOW,
        params=params,
        actions=catalog().known,
        chain=_chain(request),
    )


@router.post("/audit/verify")
async def verify_chain(request: Request, ctx: Ctx) -> Response:
    """Re-verify the whole hash chain (admins; CSRF-checked); the result shows on the page."""
    viewer = get_viewer(request, ctx)
    check_csrf(request, viewer, await read_form(request))
    if not viewer.is_admin:
        raise Forbidden("verifying the whole audit chain needs the admin scope")
    t0 = time.perf_counter()
    result = await run_in_threadpool(audit.verify_chain, ctx.db)
    request.app.state.dashboard_chain = {
        "result": result,
        "checked_at": time.time(),
        "duration_ms": (time.perf_counter() - t0) * 1e3,
    }
    return _redirect("/dashboard/audit")


# --------------------------------------------------------------------------- episodes


@router.get("/episodes", response_class=HTMLResponse)
def episodes_page(
    request: Request,
    ctx: Ctx,
    viewer: CurrentViewer,
    job_id: str | None = Query(None, max_length=40),
    task_id: str | None = Query(None, max_length=200),
    state: str | None = Query(None, max_length=16),
    before: str | None = Query(None, max_length=120),
) -> Response:
    """Episodes, newest first, filterable by job, task and state."""
    rows, next_before = queries.episodes_page(
        ctx.db,
        tenant=viewer.scope,
        job_id=job_id or None,
        task_id=task_id or None,
        state=state or None,
        before=before or None,
        limit=PAGE,
    )
    params = {k: v for k, v in {"job_id": job_id, "task_id": task_id, "state": state}.items() if v}
    return page(
        request,
        "episodes.html",
        viewer=viewer,
        nav="episodes",
        rows=rows,
        next_before=next_before,
        params=params,
    )


@router.get("/episodes/{episode_id}", response_class=HTMLResponse)
def episode_page(request: Request, episode_id: str, ctx: Ctx, viewer: CurrentViewer) -> Response:
    """An episode's trajectory (turns, timings) and its reward record (private details only
    for admins, ``rewards.view``)."""
    ep = owned(episodes.get, ctx, viewer.principal, episode_id)
    record = rewards.by_episode(ctx.db, ep.id)
    if record is not None:
        record = rewards.view(record, private=viewer.is_admin)
    return page(
        request,
        "episode.html",
        viewer=viewer,
        nav="episodes",
        ep=ep,
        record=record,
        max_action=MAX_ACTION_CHARS,
    )


# --------------------------------------------------------------------------- rewards, jobs


@router.get("/rewards", response_class=HTMLResponse)
def rewards_page(
    request: Request,
    ctx: Ctx,
    viewer: CurrentViewer,
    domain: str | None = Query(None, max_length=32),
) -> Response:
    """Pass rate per domain and task over time, reward histograms, group variance, verifier
    status, dodge rates and the anomaly monitor's checks (newest 10,000 records)."""
    agg = reward_queries.aggregates(
        ctx.db,
        tenant=viewer.scope,
        domain=domain or None,
        bucket_width=stats.bucket_width_s,
        threshold=anomaly.DEFAULT_PASS_THRESHOLD,
    )
    by_domain = stats.pass_rate_series(agg.cells, by="domain")
    by_task = stats.pass_rate_series(agg.cells, by="task_id")
    busiest = sorted(by_task, key=lambda k: -sum(b.n for b in by_task[k]))[: charts.PALETTE]
    monitor = _monitor(request, ctx, viewer)
    rates = {r.task_id: r for r in monitor.rates}
    return page(
        request,
        "rewards.html",
        viewer=viewer,
        nav="rewards",
        n=agg.n,
        limit=reward_queries.LIMIT,
        domain=domain or "",
        domains=sorted({st.domain for st in agg.statuses} | ({domain} if domain else set())),
        domain_chart=charts.line_chart(by_domain, title="pass rate per domain"),
        task_chart=charts.line_chart(
            {k: by_task[k] for k in sorted(busiest)}, title="pass rate per task (busiest)"
        ),
        bucket_s=agg.bucket_s,
        hists={d: charts.histogram(h, title=d) for d, h in stats.histograms(agg.rewards).items()},
        tasks=stats.task_summaries(agg.statuses, agg.cells, agg.groups),
        rates=rates,
        checks=sorted(monitor.anomalies, key=lambda a: (not a.flagged, a.scope, a.key))[:100],
        bar=charts.stacked_bar,
    )


@router.get("/jobs", response_class=HTMLResponse)
def jobs_page(
    request: Request,
    ctx: Ctx,
    viewer: CurrentViewer,
    before: str | None = Query(None, max_length=120),
) -> Response:
    """Jobs, newest first, with their progress."""
    rows, next_before = queries.jobs_page(
        ctx.db, tenant=viewer.scope, before=before or None, limit=PAGE
    )
    return page(
        request,
        "jobs.html",
        viewer=viewer,
        nav="jobs",
        rows=rows,
        next_before=next_before,
        bar=charts.stacked_bar,
    )


@router.get("/jobs/{job_id}", response_class=HTMLResponse)
def job_page(request: Request, job_id: str, ctx: Ctx, viewer: CurrentViewer) -> Response:
    """One job: its settings and ``scheduler.progress``."""
    job = owned(scheduler.get_job, ctx.db, viewer.principal, job_id)
    return page(
        request,
        "job.html",
        viewer=viewer,
        nav="jobs",
        job=job,
        progress=scheduler.progress(ctx.db, job.id),
        bar=charts.stacked_bar,
    )


__all__ = ["router", "SignInRequired", "PageNotFound"]
