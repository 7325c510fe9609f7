"""Sandbox operations on behalf of a tenant: lease, exec, heartbeat, snapshot, fork, release.

Routers call these; these call the pool manager and the runtime. Ownership is checked
once, in ``get_owned``: another tenant's sandbox is ``NotFound``, never ``Forbidden``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from sqlalchemy import or_, select, update
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from service import audit, tenants, tracing
from service.context import ServiceContext
from service.db.models import Sandbox, Snapshot, utcnow
from service.errors import (
    Conflict,
    CrucibleError,
    InvalidRequest,
    NotFound,
    QuotaExceeded,
    QuotaNeverFits,
    SandboxError,
)
from service.ids import new_id
from service.leasecache import LeaseView
from service.metrics import LEASE_LATENCY, LEASES, QUOTA_REFUSALS
from service.pool import lease_expiry
from service.runtime.base import ExecChunk, ExecRequest, ExecResult, ExecStream
from service.templates import Template
from service.tenants import Principal, Resources


def _ttl(ctx: ServiceContext, ttl_s: int | None) -> int:
    ttl = ttl_s if ttl_s is not None else ctx.settings.default_ttl_s
    if ttl > ctx.settings.max_ttl_s:
        raise InvalidRequest(
            f"ttl_s {ttl} exceeds the maximum {ctx.settings.max_ttl_s}", field="ttl_s"
        )
    return ttl


MIN_CPUS = 0.01  # the engine refuses NanoCpus below 10^7 (0.01 CPU)


def check_cpus(ctx: ServiceContext, cpus: float, *, field: str, host: int | None = None) -> None:
    """Refuse, before anything is reserved or started, CPUs the engine would refuse: below
    its minimum of 0.01 or more than its host has (``host``, its CPU count, when the caller
    knows it; else the engine is asked: ``runtime.host_cpus``).

    Raises:
        InvalidRequest: names ``field``. SandboxError: the engine could not be asked.
    """
    if host is None:
        host = ctx.runtime.host_cpus()
    if not MIN_CPUS <= cpus <= host:
        raise InvalidRequest(
            f"{field} {cpus:g} is outside what the engine accepts: {MIN_CPUS} to {host} "
            "(its host's CPU count)",
            field=field,
        )


def get_owned(ctx: ServiceContext, principal: Principal, sandbox_id: str) -> Sandbox:
    """The tenant's sandbox (admins see all). ``NotFound`` for unknown or foreign ids."""
    with ctx.db.read() as s:
        row = s.get(Sandbox, sandbox_id)
    if (
        row is None
        or row.tenant_id is None
        or (row.tenant_id != principal.tenant_id and not principal.is_admin)
    ):
        raise NotFound(f"no sandbox {sandbox_id!r}", field="sandbox_id")
    return row


def get_live(ctx: ServiceContext, principal: Principal, sandbox_id: str) -> Sandbox:
    """The tenant's sandbox, which must be leased and unexpired (``Conflict`` otherwise)."""
    row = get_owned(ctx, principal, sandbox_id)
    if row.state == "leased" and row.expires_at is not None and row.expires_at <= utcnow():
        raise Conflict(f"sandbox {sandbox_id} lease expired at {row.expires_at.isoformat()}")
    if row.state != "leased":
        raise Conflict(f"sandbox {sandbox_id} is {row.state}, not leased")
    if not row.container_id:
        raise Conflict(f"sandbox {sandbox_id} has no container yet")
    return row


# How long a verification waits for the tenant's engine work on its sandbox to end.
TENANT_WORK_SETTLE_S = 10.0


def _tenant_work_item(sandbox_id: str) -> str:
    return f"tenant:{sandbox_id}"


def tenant_engine_work(ctx: ServiceContext, sandbox_id: str) -> contextlib.AbstractContextManager:
    """Mark a tenant's call on ``sandbox_id`` as inside the engine while the context runs
    (on every replica's view: ``Coordinator.track``). A files ``PUT`` or ``GET`` is the
    tenant's work in the engine: the engine holds the container's lock until it ends, and
    its length is the tenant's to choose (a trial extracted a 2 MB tar of 4,000 members
    through a chain of long symlinks for minutes), so a verification must not mistake the
    freeze it blocks for Crucible's failure (``episodes.run_verifier``). Enter it before
    the sandbox's lease is checked for the last time, so a verification that takes the
    sandbox after that check sees the work."""
    return ctx.pools.coord.track(_tenant_work_item(sandbox_id))


def tenant_engine_busy(ctx: ServiceContext, sandbox_id: str) -> bool | None:
    """True while a tenant's call on ``sandbox_id`` is inside the engine on any live
    replica (``tenant_engine_work``); None when the coordinator cannot tell."""
    busy = ctx.pools.coord.in_flight()
    return None if busy is None else _tenant_work_item(sandbox_id) in busy


def settle_tenant_work(ctx: ServiceContext, sandbox_id: str) -> bool:
    """Wait up to ``TENANT_WORK_SETTLE_S`` for the tenant's engine work on ``sandbox_id``
    to end. False when it is still running then; True when it ended or none was known
    (the coordinator unreachable: the freeze decides)."""
    deadline = time.monotonic() + TENANT_WORK_SETTLE_S
    while tenant_engine_busy(ctx, sandbox_id):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


def take_for_verification(ctx: ServiceContext, principal: Principal, sandbox_id: str) -> Sandbox:
    """Take the tenant's leased sandbox for the verification of its episode: ``leased`` to
    ``verifying`` in one statement. Every tenant call on it (exec, files, processes,
    sessions, snapshots, forks, limits, heartbeat, release) is then refused as for any
    sandbox not ``leased``, until the verdict releases it (a trial wrote into the frozen end
    state through the files API between the verifier's diff and its read of the changes,
    which turned its 0 into an error). The lease no longer runs out under the verifier.

    A sandbox already ``verifying`` is one whose verification a crash cut off (recovery
    keeps it so, frozen, and puts its episode back to ``running``:
    ``pool.keep_for_verification``):
    the caller, which has just moved the episode from ``running`` to ``verifying`` (one call
    at a time), takes it as it is, so the verdict is of the end state first submitted.

    Raises:
        NotFound: not the tenant's. Conflict: not leased, the lease expired, no container.
    """
    row = get_owned(ctx, principal, sandbox_id)
    if row.state != "verifying":
        row = get_live(ctx, principal, sandbox_id)
    elif not row.container_id:
        raise Conflict(f"sandbox {sandbox_id} has no container")
    now = utcnow()
    with ctx.db.session() as s:
        got = s.execute(
            update(Sandbox)
            .where(
                Sandbox.id == sandbox_id,
                Sandbox.state.in_(("leased", "verifying")),
                or_(Sandbox.expires_at.is_(None), Sandbox.expires_at > now),
            )
            .values(state="verifying")
            .execution_options(synchronize_session=False)
        ).rowcount
        if not got:
            raise Conflict(f"sandbox {sandbox_id} is no longer leased")
        return s.get(Sandbox, sandbox_id, populate_existing=True) or row


def hand_back(s: Session, sandbox_ids: Iterable[str]) -> None:
    """``verifying`` sandboxes back to ``leased`` in ``s``'s transaction (their episodes run
    again: a refused trajectory, a verification a crash cut off)."""
    ids = list(sandbox_ids)
    if ids:
        s.execute(
            update(Sandbox)
            .where(Sandbox.id.in_(ids), Sandbox.state == "verifying")
            .values(state="leased")
            .execution_options(synchronize_session=False)
        )


def live_view(ctx: ServiceContext, principal: Principal, sandbox_id: str) -> LeaseView:
    """``get_live``'s checks on the exec path: the sandbox's view from the lease cache
    (``service.leasecache``: cleared by every write of a sandbox row), else one primary-key
    SELECT of the five columns checked. Same errors as ``get_live``."""
    view = ctx.leases.get(sandbox_id)
    if view is None:
        generation = ctx.leases.generation
        with ctx.db.read() as s:
            r = s.execute(
                select(
                    Sandbox.id,
                    Sandbox.tenant_id,
                    Sandbox.state,
                    Sandbox.expires_at,
                    Sandbox.container_id,
                    Sandbox.template,
                ).where(Sandbox.id == sandbox_id)
            ).first()
        view = LeaseView(*r) if r is not None else None
        if view is not None and view.state == "leased":
            ctx.leases.put(view, generation)
    if (
        view is None
        or view.tenant_id is None
        or (view.tenant_id != principal.tenant_id and not principal.is_admin)
    ):
        raise NotFound(f"no sandbox {sandbox_id!r}", field="sandbox_id")
    if view.state == "leased" and view.expires_at is not None and view.expires_at <= utcnow():
        raise Conflict(f"sandbox {sandbox_id} lease expired at {view.expires_at.isoformat()}")
    if view.state != "leased":
        raise Conflict(f"sandbox {sandbox_id} is {view.state}, not leased")
    if not view.container_id:
        raise Conflict(f"sandbox {sandbox_id} has no container yet")
    return view


def list_sandboxes(
    ctx: ServiceContext, principal: Principal, *, include_ended: bool = False
) -> list[Sandbox]:
    """The tenant's sandboxes, newest first (ended ones only when asked, last 500)."""
    with ctx.db.read() as s:
        q = select(Sandbox).where(Sandbox.tenant_id == principal.tenant_id)
        if not include_ended:
            q = q.where(Sandbox.state.in_(tenants.LIVE_STATES))
        return list(s.execute(q.order_by(Sandbox.created_at.desc()).limit(500)).scalars())


@dataclass
class _LeasePlan:
    """A lease worked out before its transaction: the template with the lease's limits,
    the quota it needs, and the unit of work that claims it (for ``ctx.commits``)."""

    t0: float
    template: str
    base: Template
    tpl: Template
    ttl: int
    need: Resources
    sid: str
    claim: Callable[[Session], Sandbox | None]


def _plan_lease(
    ctx: ServiceContext,
    principal: Principal,
    *,
    template: str,
    ttl_s: int | None,
    metadata: dict[str, Any],
    cpus: float | None,
    memory_mb: int | None,
    t0: float | None = None,
    base: Template | None = None,
    host_cpus: int | None = None,
) -> _LeasePlan:
    """The lease worked out before its transaction (``_LeasePlan``). ``base``: the template
    when the caller has it, and ``host_cpus``: the host's CPU count when known; with both
    nothing here blocks (``lease_async`` plans on the event loop then). ``t0``: when the
    lease began (``perf_counter``), for its latency metric.

    Raises:
        NotFound: unknown template. InvalidRequest: TTL or CPUs out of range.
        SandboxError: the engine could not be asked its CPU count.
    """
    t0 = time.perf_counter() if t0 is None else t0
    if base is None:
        base = ctx.templates.get(template)
    tpl = (
        base.model_copy(
            update={k: v for k, v in (("cpus", cpus), ("memory_mb", memory_mb)) if v is not None}
        )
        if cpus is not None or memory_mb is not None
        else base
    )
    ttl = _ttl(ctx, ttl_s)
    check_cpus(
        ctx, tpl.cpus, field="limits.cpus" if cpus is not None else "template", host=host_cpus
    )
    need = Resources(1, tpl.cpus, tpl.memory_mb)
    sid = new_id("sb")

    def claim(s: Session) -> Sandbox | None:
        tenants.reserve(s, principal.tenant_id, need)
        warm = ctx.pools.claim(
            s,
            template=template,
            tenant_id=principal.tenant_id,
            expires_at=lease_expiry(ttl),
            ttl_s=ttl,
            metadata=metadata,
            cpus=tpl.cpus,
            memory_mb=tpl.memory_mb,
        )
        if warm is not None:
            audit.record(
                s,
                "sandbox.lease",
                tenant_id=principal.tenant_id,
                key_id=principal.key_id,
                sandbox_id=warm.id,
                details={"template": template, "ttl_s": ttl, "warm": True},
            )
        else:
            s.add(
                Sandbox(
                    id=sid,
                    deployment=ctx.settings.deployment,
                    template=template,
                    image=tpl.image,
                    state="starting",
                    tenant_id=principal.tenant_id,
                    cpus=tpl.cpus,
                    memory_mb=tpl.memory_mb,
                    ttl_s=ttl,
                    metadata_=metadata,
                )
            )
        return warm

    return _LeasePlan(t0, template, base, tpl, ttl, need, sid, claim)


def _refused(ctx: ServiceContext, principal: Principal, plan: _LeasePlan, e: CrucibleError) -> None:
    QUOTA_REFUSALS.inc()
    _audit_refusal(ctx, principal, plan.need, e, template=plan.template)


def _lease_done(
    ctx: ServiceContext, principal: Principal, plan: _LeasePlan, warm: Sandbox | None
) -> Sandbox:
    """After the claim's commit: the lease's own limits applied to a warm sandbox, or the
    cold start (both blocking: a worker thread)."""
    ctx.pools.wake()  # after commit: the refill loop must not contend with this transaction
    template, tpl, base = plan.template, plan.tpl, plan.base
    LEASES.labels(template, "warm" if warm is not None else "cold").inc()
    if warm is not None:
        if (tpl.cpus, tpl.memory_mb) != (base.cpus, base.memory_mb):
            _apply_limits(ctx, principal, warm, tpl)
        LEASE_LATENCY.labels("warm").observe(time.perf_counter() - plan.t0)
        tracing.set_attributes(template=template, source="warm", sandbox_id=warm.id)
        return warm
    sid = plan.sid
    row = _finish_cold_start(
        ctx, principal, sid, tpl, ttl=plan.ttl, image=None, action="sandbox.lease"
    )
    LEASE_LATENCY.labels("cold").observe(time.perf_counter() - plan.t0)
    tracing.set_attributes(template=template, source="cold", sandbox_id=sid)
    return row


@tracing.traced("sandbox.lease")
def lease(
    ctx: ServiceContext,
    principal: Principal,
    *,
    template: str,
    ttl_s: int | None,
    metadata: dict[str, Any],
    cpus: float | None = None,
    memory_mb: int | None = None,
) -> Sandbox:
    """Lease one sandbox of ``template``: a warm one, or a cold start when the pool is empty.

    ``cpus`` / ``memory_mb`` override the template's limits for this lease (the quota is
    charged what is asked); a warm sandbox gets them applied before it is handed out.

    Quota reservation, the warm claim (or the cold row) and the audit event commit in one
    transaction, group-committed with concurrent leases and execs (``ctx.commits``): this
    returns only once that commit is durable.

    Raises:
        NotFound: unknown template. QuotaExceeded: over quota (audited).
        SandboxError: a cold start failed (quota given back).
    """
    plan = _plan_lease(
        ctx,
        principal,
        template=template,
        ttl_s=ttl_s,
        metadata=metadata,
        cpus=cpus,
        memory_mb=memory_mb,
    )
    try:
        warm = ctx.commits.run(plan.claim)
    except (QuotaExceeded, QuotaNeverFits) as e:
        _refused(ctx, principal, plan, e)
        raise
    return _lease_done(ctx, principal, plan, warm)


async def lease_async(
    ctx: ServiceContext,
    principal: Principal,
    *,
    template: str,
    ttl_s: int | None,
    metadata: dict[str, Any],
    cpus: float | None = None,
    memory_mb: int | None = None,
) -> Sandbox:
    """``lease`` for the event loop, same results and errors: the plan on the loop when it
    needs no I/O (the template in the registry's memory, the host's CPU count known), else
    on a worker thread (a task's template may be made, the engine asked); the claim's group
    commit awaited without holding a thread (a burst's leases all join one batch); what
    blocks after it (limits to apply, a cold start) on a worker thread."""
    t0 = time.perf_counter()
    with tracing.span("sandbox.lease"):
        plan_with = functools.partial(
            _plan_lease,
            ctx,
            principal,
            template=template,
            ttl_s=ttl_s,
            metadata=metadata,
            cpus=cpus,
            memory_mb=memory_mb,
            t0=t0,
        )
        base, host = ctx.templates.peek(template), ctx.runtime.known_host_cpus()
        if base is not None and host is not None:
            plan = plan_with(base=base, host_cpus=host)  # no I/O: no thread hop
        else:
            plan = await run_in_threadpool(plan_with)
        try:
            warm = await ctx.commits.run_async(plan.claim)
        except (QuotaExceeded, QuotaNeverFits) as e:
            await run_in_threadpool(_refused, ctx, principal, plan, e)
            raise
        same_limits = (plan.tpl.cpus, plan.tpl.memory_mb) == (plan.base.cpus, plan.base.memory_mb)
        if warm is not None and same_limits:
            return _lease_done(ctx, principal, plan, warm)  # nothing blocks: metrics only
        return await run_in_threadpool(_lease_done, ctx, principal, plan, warm)


def _apply_limits(ctx: ServiceContext, principal: Principal, row: Sandbox, tpl: Any) -> None:
    """Give a warm sandbox the lease's own limits; on failure the lease is undone."""
    try:
        ctx.runtime.update_limits(
            row.container_id, cpus=tpl.cpus, memory_bytes=tpl.memory_mb * 1024 * 1024
        )
    except CrucibleError as e:
        release(ctx, principal, row.id)
        raise SandboxError(f"could not apply the requested limits: {e.detail}") from e


def _audit_refusal(
    ctx: ServiceContext, principal: Principal, need: Resources, e: CrucibleError, **details: Any
) -> None:
    with ctx.db.session() as s:
        audit.record(
            s,
            "quota.refused",
            tenant_id=principal.tenant_id,
            key_id=principal.key_id,
            details={
                **details,
                "sandboxes": need.sandboxes,
                "cpus": need.cpus,
                "memory_mb": need.memory_mb,
                "reason": e.detail,
            },
        )


def _finish_cold_start(
    ctx: ServiceContext,
    principal: Principal,
    sid: str,
    tpl: Any,
    *,
    ttl: int,
    image: str | None,
    action: str,
    extra: dict[str, Any] | None = None,
) -> Sandbox:
    try:
        ctx.pools.start_container(sid, tpl, image)
    except CrucibleError as e:
        ctx.pools.mark_failed(sid, f"cold start failed: {e.detail}")
        raise SandboxError(f"could not start a {tpl.name} sandbox: {e.detail}") from e
    with ctx.db.session() as s:
        now = utcnow()
        ok = s.execute(
            update(Sandbox)
            .where(Sandbox.id == sid, Sandbox.state == "starting")
            .values(state="leased", leased_at=now, expires_at=now + timedelta(seconds=ttl))
            .execution_options(synchronize_session=False)
        ).rowcount
        if not ok:
            raise Conflict(f"sandbox {sid} changed state while starting")
        audit.record(
            s,
            action,
            tenant_id=principal.tenant_id,
            key_id=principal.key_id,
            sandbox_id=sid,
            details={"template": tpl.name, "ttl_s": ttl, "warm": False, **(extra or {})},
        )
        return s.get(Sandbox, sid, populate_existing=True)


def heartbeat(
    ctx: ServiceContext, principal: Principal, sandbox_id: str, *, ttl_s: int | None
) -> Sandbox:
    """Extend the lease to now + ``ttl_s`` (default: the lease's own TTL)."""
    row = get_live(ctx, principal, sandbox_id)
    ttl = _ttl(ctx, ttl_s if ttl_s is not None else row.ttl_s)
    with ctx.db.session() as s:
        ok = s.execute(
            update(Sandbox)
            .where(Sandbox.id == sandbox_id, Sandbox.state == "leased")
            .values(expires_at=lease_expiry(ttl), ttl_s=ttl)
            .execution_options(synchronize_session=False)
        ).rowcount
        if not ok:
            raise Conflict(f"sandbox {sandbox_id} is no longer leased")
        audit.record(
            s,
            "sandbox.heartbeat",
            tenant_id=principal.tenant_id,
            key_id=principal.key_id,
            sandbox_id=sandbox_id,
            details={"ttl_s": ttl},
        )
        return s.get(Sandbox, sandbox_id, populate_existing=True)


def release(
    ctx: ServiceContext, principal: Principal, sandbox_id: str, *, verified: bool = False
) -> Sandbox:
    """End the lease and destroy the sandbox (in the background). Idempotent on ended ones.
    ``verified``: the verdict's release, which alone may end a ``verifying`` sandbox.

    Raises:
        NotFound: not the tenant's. Conflict: the sandbox is snapshotting or verifying.
    """
    row = get_owned(ctx, principal, sandbox_id)
    states = ("leased", "starting", "verifying") if verified else ("leased", "starting")
    if row.state in ("released", "expired", "failed"):
        return row
    with ctx.db.session() as s:
        ok = s.execute(
            update(Sandbox)
            .where(Sandbox.id == sandbox_id, Sandbox.state.in_(states))
            .values(state="released", ended_at=utcnow())
            .execution_options(synchronize_session=False)
        ).rowcount
        if not ok:
            raise Conflict(f"sandbox {sandbox_id} is {row.state}; retry when it settles")
        tenants.release(s, row.tenant_id, Resources(1, row.cpus, row.memory_mb))
        audit.record(
            s,
            "sandbox.release",
            tenant_id=principal.tenant_id,
            key_id=principal.key_id,
            sandbox_id=sandbox_id,
        )
        out = s.get(Sandbox, sandbox_id, populate_existing=True)
    ctx.pools.destroy_async(sandbox_id)
    return out


# -- exec -------------------------------------------------------------------------------


def build_exec_request(
    ctx: ServiceContext,
    *,
    cmd: str | list[str],
    timeout_s: float,
    cwd: str | None,
    env: dict[str, bytes],
    stdin: bytes,
    max_output_bytes: int | None,
) -> ExecRequest:
    """Validate limits against settings and build the runtime request."""
    if timeout_s > ctx.settings.max_exec_timeout_s:
        raise InvalidRequest(
            f"timeout_s {timeout_s} exceeds the maximum {ctx.settings.max_exec_timeout_s}",
            field="timeout_s",
        )
    cap = ctx.settings.default_max_output_bytes if max_output_bytes is None else max_output_bytes
    if cap > ctx.settings.max_output_bytes_limit:
        raise InvalidRequest(
            f"max_output_bytes {cap} exceeds the maximum {ctx.settings.max_output_bytes_limit}",
            field="max_output_bytes",
        )
    if isinstance(cmd, list) and (not cmd or any("\0" in a for a in cmd)):
        raise InvalidRequest("cmd must be a non-empty list of strings without NUL", field="cmd")
    if isinstance(cmd, str) and ("\0" in cmd or not cmd.strip()):
        raise InvalidRequest("cmd must be a non-empty string without NUL", field="cmd")
    for k, v in env.items():
        if not k or "=" in k or "\0" in k or b"\0" in v:
            raise InvalidRequest(
                f"invalid env entry {k!r}: names need no '=' or NUL, values no NUL", field="env"
            )
    if cwd is not None and "\0" in cwd:
        raise InvalidRequest("cwd must not contain NUL", field="cwd")
    return ExecRequest(
        cmd=cmd, timeout_s=timeout_s, cwd=cwd, env=env, stdin=stdin, max_output_bytes=cap
    )


def _exec_context(req: ExecRequest) -> dict[str, Any]:
    """What an exec event records beyond its command line (trial 27: an exec as uid 0 whose
    payload travelled in ``env`` was audited as ``eval "$X"`` alone): the identity asked
    for (``user``; None: the template's), ``cwd``, each ``env`` name with the SHA-256 of
    its value (values may be secrets; the digest still ties an event to a known payload),
    the SHA-256 of ``stdin``, and an argv list as a list (joined with spaces in ``cmd``,
    ``["sh", "-c", "a b"]`` read as ``sh -c a b``; at most 64 items of 1,024 characters)."""
    out: dict[str, Any] = {
        "user": req.user,
        "cwd": req.cwd,
        "env_sha256": {k[:256]: hashlib.sha256(v).hexdigest() for k, v in sorted(req.env.items())},
        "stdin_sha256": hashlib.sha256(req.stdin).hexdigest() if req.stdin else None,
    }
    if not isinstance(req.cmd, str):
        out["argv"] = [a[:1024] for a in req.cmd[:64]]
        out["argv_truncated"] = len(req.cmd) > 64 or any(len(a) > 1024 for a in req.cmd)
    return out


def _exec_event(
    principal: Principal,
    sandbox_id: str,
    req: ExecRequest,
    res: ExecResult | None,
    error: str | None = None,
    *,
    cancelled: bool = False,
) -> Callable[[Session], audit.Appended]:
    """The unit of work that appends one ``sandbox.exec`` event (for ``ctx.commits``)."""
    cmd = req.cmd if isinstance(req.cmd, str) else " ".join(req.cmd)
    details: dict[str, Any] = {
        "cmd": cmd[:4096],
        "cmd_truncated": len(cmd) > 4096,
        "timeout_s": req.timeout_s,
        "stdin_bytes": len(req.stdin),
        **_exec_context(req),
    }
    if res is not None:
        details.update(
            exit_code=res.exit_code,
            timed_out=res.timed_out,
            oom_killed=res.oom_killed,
            pids_limit_hit=res.pids_limit_hit,
            disk_limit_hit=res.disk_limit_hit,
            handler_lost=res.handler_lost,
            stdout_bytes=res.stdout_total_bytes,
            stderr_bytes=res.stderr_total_bytes,
            duration_ms=round(res.duration_ms, 3),
            # what came back (head + tail when truncated), so a replay can compare outputs
            stdout_sha256=hashlib.sha256(res.stdout).hexdigest(),
            stderr_sha256=hashlib.sha256(res.stderr).hexdigest(),
        )
    if error:
        details["error"] = error[:500]
    if cancelled:
        details["cancelled"] = True

    def append(s: Session) -> audit.Appended:
        return audit.record(
            s,
            "sandbox.exec",
            tenant_id=principal.tenant_id,
            key_id=principal.key_id,
            sandbox_id=sandbox_id,
            details=details,
        )

    return append


def _audit_exec(
    ctx: ServiceContext,
    principal: Principal,
    row: Sandbox,
    req: ExecRequest,
    res: ExecResult | None,
    error: str | None = None,
    *,
    cancelled: bool = False,
) -> None:
    """Append the exec's event; returns once it is durable (a group commit)."""
    ctx.commits.run(_exec_event(principal, row.id, req, res, error, cancelled=cancelled))


def runtime_failure(
    ctx: ServiceContext, principal: Principal, sandbox_id: str, e: CrucibleError
) -> CrucibleError:
    """A runtime error on a sandbox that ended meanwhile is a Conflict, not a 502."""
    try:
        get_live(ctx, principal, sandbox_id)
    except (Conflict, NotFound) as gone:
        return gone
    return e


@tracing.traced("sandbox.exec")
def exec_command(
    ctx: ServiceContext, principal: Principal, sandbox_id: str, req: ExecRequest
) -> ExecResult:
    """Run one command in a leased sandbox and audit it."""
    row = get_live(ctx, principal, sandbox_id)
    try:
        res = ctx.runtime.exec(row.container_id, req)
    except CrucibleError as e:
        _audit_exec(ctx, principal, row, req, None, error=e.detail)
        raise runtime_failure(ctx, principal, sandbox_id, e) from e
    _audit_exec(ctx, principal, row, req, res)
    tracing.set_attributes(sandbox_id=sandbox_id, exit_code=res.exit_code)
    return res


async def exec_command_async(
    ctx: ServiceContext, principal: Principal, sandbox_id: str, req: ExecRequest
) -> ExecResult:
    """``exec_command`` for the event loop: the sandbox's view from the lease cache, the
    channel's I/O awaited on the loop (``runtime.exec_async`` where the runtime has it,
    else the blocking ``exec`` on a worker thread), and the audit event's group commit
    awaited: returns only once the event is durable. A caller cancelled mid-exec still
    gets its event appended (``cancelled``)."""
    with tracing.span("sandbox.exec"):
        view = live_view(ctx, principal, sandbox_id)
        run = getattr(ctx.runtime, "exec_async", None)
        try:
            if run is not None:
                res = await run(view.container_id, req)
            else:
                res = await run_in_threadpool(ctx.runtime.exec, view.container_id, req)
        except CrucibleError as e:
            await ctx.commits.run_async(_exec_event(principal, sandbox_id, req, None, e.detail))
            raise (await run_in_threadpool(runtime_failure, ctx, principal, sandbox_id, e)) from e
        except asyncio.CancelledError:
            ctx.commits.submit(
                _exec_event(principal, sandbox_id, req, None, "cancelled", cancelled=True)
            )
            raise
        await ctx.commits.run_async(_exec_event(principal, sandbox_id, req, res))
        tracing.set_attributes(sandbox_id=sandbox_id, exit_code=res.exit_code)
        return res


class AuditedExecStream:
    """A sandbox's running exec as ``exec_stream`` hands it out: iterate it for chunks and
    the result; ``cancel`` (any thread) stops the command, for a client that went away. The
    exec is audited once, when the iteration ends (with ``cancelled`` when it was)."""

    def __init__(
        self,
        ctx: ServiceContext,
        principal: Principal,
        row: Sandbox,
        req: ExecRequest,
        stream: ExecStream,
    ) -> None:
        self._stream = stream
        self.cancelled = False
        self._items = self._run(ctx, principal, row, req)

    def __iter__(self) -> AuditedExecStream:
        return self

    def __next__(self) -> ExecChunk | ExecResult:
        return next(self._items)

    def cancel(self) -> None:
        """Stop the command (SIGTERM, the grace, SIGKILL); the iteration then ends."""
        self.cancelled = True
        self._stream.cancel()

    def close(self) -> None:
        """Stop the command if it still runs and end the iteration (iterating thread)."""
        self._items.close()

    def _run(
        self, ctx: ServiceContext, principal: Principal, row: Sandbox, req: ExecRequest
    ) -> Iterator[ExecChunk | ExecResult]:
        result: ExecResult | None = None
        error: str | None = None
        try:
            with contextlib.closing(self._stream):
                for item in self._stream:
                    if isinstance(item, ExecResult):
                        result = item
                    yield item
        except CrucibleError as e:
            error = e.detail
            raise
        finally:
            if result is None and error is None:
                error = "stream ended without a result"
            _audit_exec(ctx, principal, row, req, result, error=error, cancelled=self.cancelled)


def exec_stream(
    ctx: ServiceContext, principal: Principal, sandbox_id: str, req: ExecRequest
) -> AuditedExecStream:
    """Like ``exec_command`` but an ``AuditedExecStream`` of chunks as they come, then the
    result.

    Validation and the start happen here, so errors surface as HTTP errors.
    """
    row = get_live(ctx, principal, sandbox_id)
    try:
        stream = ctx.runtime.exec_stream(row.container_id, req)
    except CrucibleError as e:
        _audit_exec(ctx, principal, row, req, None, error=e.detail)
        raise runtime_failure(ctx, principal, sandbox_id, e) from e
    return AuditedExecStream(ctx, principal, row, req, stream)


# -- snapshots and forks ----------------------------------------------------------------


def snapshot(
    ctx: ServiceContext, principal: Principal, sandbox_id: str, *, verified: bool = False
) -> Snapshot:
    """Freeze the sandbox's filesystem (pause, commit, unpause) into a snapshot.

    The snapshot counts against the tenant's snapshot quota (one, and the bytes of the
    writable layer committed, measured first) and expires ``snapshot_ttl_s`` after it is
    made. Nothing is committed when the quota refuses. ``verified``: the verifier's own
    snapshot of an end state it holds (``verifying``), which stays ``verifying``.

    Raises:
        Conflict: not leased, or busy. QuotaExceeded, QuotaNeverFits: the snapshot quota.
        SandboxError: the engine failed (the reservation is given back).
    """
    if verified:
        row = get_owned(ctx, principal, sandbox_id)
        if row.state != "verifying" or not row.container_id:
            raise Conflict(f"sandbox {sandbox_id} is {row.state}, not verifying")
        return _commit(ctx, principal, row, moves=False)
    row = get_live(ctx, principal, sandbox_id)
    with ctx.db.session() as s:
        ok = s.execute(
            update(Sandbox)
            .where(Sandbox.id == sandbox_id, Sandbox.state == "leased")
            .values(state="snapshotting")
            .execution_options(synchronize_session=False)
        ).rowcount
    if not ok:
        raise Conflict(f"sandbox {sandbox_id} is busy or no longer leased")
    return _commit(ctx, principal, row, moves=True)


def _commit(ctx: ServiceContext, principal: Principal, row: Sandbox, *, moves: bool) -> Snapshot:
    """``snapshot``'s commit of ``row``; ``moves``: put the row back from ``snapshotting``
    to ``leased`` afterwards."""
    sandbox_id = row.id
    snap_id = new_id("snap")
    repo = f"{ctx.settings.image_prefix}-snapshots/{ctx.settings.deployment}".lower()
    t0 = time.perf_counter()
    reserved: int | None = None
    try:
        nbytes = ctx.runtime.disk_usage_bytes(row.container_id)
        try:
            with ctx.db.session() as s:
                tenants.reserve_snapshot(s, row.tenant_id, nbytes)
        except (QuotaExceeded, QuotaNeverFits) as e:
            QUOTA_REFUSALS.inc()
            _audit_refusal(ctx, principal, Resources(0, 0, 0), e, snapshot_bytes=nbytes)
            raise
        reserved = nbytes
        image_id = ctx.runtime.snapshot(row.container_id, repository=repo, tag=snap_id)
    except BaseException:
        if reserved is not None:
            with ctx.db.session() as s:
                tenants.release_snapshot(s, row.tenant_id, reserved)
        raise
    finally:
        if moves:
            with ctx.db.session() as s:
                s.execute(
                    update(Sandbox)
                    .where(Sandbox.id == sandbox_id, Sandbox.state == "snapshotting")
                    .values(state="leased")
                    .execution_options(synchronize_session=False)
                )
    with ctx.db.session() as s:
        snap = Snapshot(
            id=snap_id,
            deployment=ctx.settings.deployment,
            sandbox_id=sandbox_id,
            tenant_id=row.tenant_id,
            template=row.template,
            image=f"{repo}:{snap_id}",
            image_id=image_id,
            bytes=nbytes,
            expires_at=utcnow() + timedelta(seconds=ctx.settings.snapshot_ttl_s),
        )
        s.add(snap)
        audit.record(
            s,
            "sandbox.snapshot",
            tenant_id=principal.tenant_id,
            key_id=principal.key_id,
            sandbox_id=sandbox_id,
            details={
                "snapshot_id": snap_id,
                "image_id": image_id,
                "bytes": nbytes,
                "duration_ms": round((time.perf_counter() - t0) * 1e3, 3),
            },
        )
        s.flush()
        return snap


def get_snapshot(ctx: ServiceContext, principal: Principal, snapshot_id: str) -> Snapshot:
    """The tenant's snapshot; ``NotFound`` for unknown, deleted or foreign ids."""
    with ctx.db.read() as s:
        snap = s.get(Snapshot, snapshot_id)
    if (
        snap is None
        or snap.deleted_at is not None
        or (snap.tenant_id != principal.tenant_id and not principal.is_admin)
    ):
        raise NotFound(f"no snapshot {snapshot_id!r}", field="snapshot_id")
    return snap


def _end_snapshot(
    ctx: ServiceContext, snap: Snapshot, action: str, *, key_id: str | None = None
) -> bool:
    """Mark ``snap`` deleted (guarded: once), give back its quota, audit ``action``, and
    remove its image in the background. False when it had already ended."""
    with ctx.db.session() as s:
        ended = s.execute(
            update(Snapshot)
            .where(Snapshot.id == snap.id, Snapshot.deleted_at.is_(None))
            .values(deleted_at=utcnow())
            .execution_options(synchronize_session=False)
        ).rowcount
        if not ended:
            return False
        tenants.release_snapshot(s, snap.tenant_id, snap.bytes)
        audit.record(
            s,
            action,
            tenant_id=snap.tenant_id,
            key_id=key_id,
            sandbox_id=snap.sandbox_id,
            details={"snapshot_id": snap.id, "bytes": snap.bytes},
        )
    ctx.pools.background(ctx.runtime.remove_image, snap.image)
    return True


def delete_snapshot(ctx: ServiceContext, principal: Principal, snapshot_id: str) -> None:
    """Delete a snapshot and its image (sandboxes forked from it keep running); its quota
    is given back.

    Raises:
        NotFound: unknown, foreign, or already deleted (also by a concurrent call).
    """
    snap = get_snapshot(ctx, principal, snapshot_id)
    if not _end_snapshot(ctx, snap, "snapshot.delete", key_id=principal.key_id):
        raise NotFound(f"no snapshot {snapshot_id!r}", field="snapshot_id")


def expire_snapshots(ctx: ServiceContext) -> int:
    """Delete this deployment's snapshots whose TTL passed (run by the pool loop); return
    how many. Each is audited as ``snapshot.expire`` and its quota given back."""
    with ctx.db.read() as s:
        due = (
            s.execute(
                select(Snapshot).where(
                    Snapshot.deployment == ctx.settings.deployment,
                    Snapshot.deleted_at.is_(None),
                    Snapshot.expires_at < utcnow(),
                )
            )
            .scalars()
            .all()
        )
    return sum(_end_snapshot(ctx, snap, "snapshot.expire") for snap in due)


def _all_or_none(
    ctx: ServiceContext, principal: Principal, starts: list[Callable[[], Sandbox]]
) -> tuple[list[Sandbox], list[CrucibleError]]:
    """Run ``starts`` at once (at most 8 threads); when any raised, release the sandboxes
    the others made. Returns (sandboxes, errors): the sandboxes only when ``errors`` is
    empty."""
    with ThreadPoolExecutor(max_workers=max(1, min(len(starts), 8))) as pool:
        futures = [pool.submit(fn) for fn in starts]
        made, errors = [], []
        for f in futures:
            try:
                made.append(f.result())
            except CrucibleError as e:
                errors.append(e)
    if errors:
        for sb in made:
            with contextlib.suppress(CrucibleError):
                release(ctx, principal, sb.id)
        return [], errors
    return made, []


def lease_many(
    ctx: ServiceContext,
    principal: Principal,
    *,
    template: str,
    n: int,
    ttl_s: int | None,
    metadata: dict[str, Any],
) -> list[Sandbox]:
    """``n`` leases of ``template`` at once (warm ones when the pool has them), all or
    nothing: on any failure the ones made are released and the first error is raised
    (``QuotaExceeded``, ``SandboxError``)."""
    one = functools.partial(
        lease, ctx, principal, template=template, ttl_s=ttl_s, metadata=metadata
    )
    made, errors = _all_or_none(ctx, principal, [one] * n)
    if errors:
        raise errors[0]
    return made


def fork(
    ctx: ServiceContext,
    principal: Principal,
    snapshot_id: str,
    *,
    n: int,
    ttl_s: int | None,
    metadata: dict[str, Any],
) -> list[Sandbox]:
    """Start ``n`` sandboxes from a snapshot, all or nothing (a GRPO group's identical start).

    Raises:
        QuotaExceeded: the n sandboxes do not fit. Conflict: the snapshot's own files stop a
        container from starting (``runtime.unstartable``: a FIFO or a directory at
        ``/etc/passwd``, a file at the workdir; the sandbox's doing, not Crucible's).
        SandboxError: a start failed (all are undone).
    """
    if n > ctx.settings.max_fork_n:
        raise InvalidRequest(f"n {n} exceeds the maximum {ctx.settings.max_fork_n}", field="n")
    snap = get_snapshot(ctx, principal, snapshot_id)
    tpl = ctx.templates.get(snap.template)
    unstartable = getattr(ctx.runtime, "unstartable", None)
    why = unstartable(snap.image, workdir=tpl.workdir) if unstartable is not None else None
    if why is not None:  # before anything starts: a FIFO there wedges the engine's start
        raise Conflict(f"snapshot {snapshot_id} cannot be started: {why} in it")
    ttl = _ttl(ctx, ttl_s)
    check_cpus(ctx, tpl.cpus, field="template")
    need = Resources(n, tpl.cpus * n, tpl.memory_mb * n)
    ids = [new_id("sb") for _ in range(n)]
    try:
        with ctx.db.session() as s:
            tenants.reserve(s, principal.tenant_id, need)
            for i, sid in enumerate(ids):
                s.add(
                    Sandbox(
                        id=sid,
                        deployment=ctx.settings.deployment,
                        template=tpl.name,
                        image=snap.image,
                        state="starting",
                        tenant_id=principal.tenant_id,
                        cpus=tpl.cpus,
                        memory_mb=tpl.memory_mb,
                        ttl_s=ttl,
                        metadata_={**metadata, "fork_index": i},
                        source_snapshot_id=snapshot_id,
                    )
                )
    except (QuotaExceeded, QuotaNeverFits) as e:
        _audit_refusal(ctx, principal, need, e, template=tpl.name, snapshot_id=snapshot_id)
        raise

    def start(i_sid: tuple[int, str]) -> Sandbox:
        i, sid = i_sid
        return _finish_cold_start(
            ctx,
            principal,
            sid,
            tpl,
            ttl=ttl,
            image=snap.image,
            action="snapshot.fork",
            extra={"snapshot_id": snapshot_id, "fork_index": i, "n": n},
        )

    results, errors = _all_or_none(
        ctx, principal, [functools.partial(start, x) for x in enumerate(ids)]
    )
    if errors:
        raise SandboxError(
            f"fork of {snapshot_id} failed for {len(errors)} of {n}: {errors[0].detail}"
        )
    return results
