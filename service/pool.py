"""Warm pools: keep started, idle sandboxes per template so a lease needs no cold start.

One ``PoolManager`` per control-plane process. Its background thread ticks every
``pool_interval_s``: refill (bounded concurrency), reap expired leases, destroy what was
released. ``claim`` is the lease fast path: one guarded UPDATE of a warm row.
``reconcile`` runs once at start-up: adopt the containers the DB knows, destroy labelled
containers of this deployment it does not, fail rows whose container is gone.

Across replicas (``service.coordination``): each template's pool is refilled and trimmed
only by the replica holding its refill lock; warm demand is the combination of every live
replica's; containers carry their creator's id (``crucible.replica``), and a replica's
reconcile leaves alone what another live replica may own, while the pool loop reclaims the
``starting`` rows and containers of replicas whose heartbeat lapsed. The writes the refill
lock protects are fenced in the database (``advance_fence``): a holder paused past its
lock's lapse adds no warm sandbox once a newer holder wrote.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import and_, bindparam, exists, func, or_, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session, make_transient_to_detached

from service import audit, coordination, tenants, tracing
from service.config import Settings
from service.coordination import LABEL_REPLICA, Coordinator, InProcessCoordinator
from service.db.engine import Database
from service.db.models import Episode, Pool, RefillFence, Sandbox, utcnow
from service.errors import CrucibleError, NotFound
from service.ids import new_id
from service.metrics import (
    COLD_START_LATENCY,
    POOL_CREATED,
    POOL_DESTROYED_UNLEASED,
    REFILL_LOCK_HELD,
)
from service.runtime.base import SandboxRuntime, SandboxSpec
from service.templates import Template, TemplateRegistry

log = logging.getLogger("crucible.pool")

ENDED_STATES = ("released", "expired", "failed")
PRUNE_EVERY_S = 60.0
_SB = Sandbox.__table__
# What a claim writes on the warm row it leases (both claim statements below)
_LEASED = dict(
    state="leased",
    tenant_id=bindparam("b_tenant"),
    leased_at=bindparam("b_now", type_=_SB.c.leased_at.type),
    expires_at=bindparam("b_expires", type_=_SB.c.expires_at.type),
    ttl_s=bindparam("b_ttl"),
    metadata=bindparam("b_meta", type_=_SB.c.metadata.type),
    cpus=bindparam("b_cpus", type_=_SB.c.cpus.type),
    memory_mb=bindparam("b_memory_mb", type_=_SB.c.memory_mb.type),
)
_OLDEST_WARM = (
    select(_SB.c.id)
    .where(
        _SB.c.deployment == bindparam("b_deployment"),
        _SB.c.template == bindparam("b_template"),
        _SB.c.state == "warm",
    )
    .order_by(_SB.c.created_at)
    .limit(1)
)
_CLAIM_WARM = (
    update(_SB).where(_SB.c.id == bindparam("b_sid"), _SB.c.state == "warm").values(**_LEASED)
)
# The lease's claim as one statement: pick the oldest warm row of the template and lease it,
# returning the leased row's columns (SQLite >= 3.35 and PostgreSQL: RETURNING), instead of a
# SELECT, the guarded UPDATE and an ORM load of the row (~0.35 ms of the group-commit writer's
# CPU per lease in a burst, this ~0.15 ms). The pick is a subquery on an alias (not correlated
# with the UPDATE's table). On PostgreSQL it takes the row's lock with SKIP LOCKED: another
# replica's transaction that holds a warm row (claiming it) is passed over at once, and a row
# that another transaction leased and committed since this statement's snapshot fails the
# lock's recheck of ``state = 'warm'`` and is passed over too; SQLite has no FOR UPDATE (its
# write transactions are serialized: BEGIN IMMEDIATE). The UPDATE stays guarded by
# ``state = 'warm'``. When it leases nothing, ``claim`` falls back to the plain pick and
# guarded UPDATE, which waits on a row another transaction holds, as before.
_W = _SB.alias("w")
_PICK_WARM = (
    select(_W.c.id)
    .where(
        _W.c.deployment == bindparam("b_deployment"),
        _W.c.template == bindparam("b_template"),
        _W.c.state == "warm",
    )
    .order_by(_W.c.created_at)
    .limit(1)
    .with_for_update(skip_locked=True)
    .scalar_subquery()
)
_CLAIM_OLDEST_WARM = (
    update(_SB)
    .where(_SB.c.id == _PICK_WARM, _SB.c.state == "warm")
    .values(**_LEASED)
    .returning(*_SB.c)
)
# (attribute, column key) of every mapped column: a returned row -> a Sandbox
_SANDBOX_ATTRS = tuple((p.key, p.columns[0].key) for p in Sandbox.__mapper__.column_attrs)
# A lease wakes the loop to refill; in a burst of leases the refill waits until they pause
# this long (at most the max), so the burst's claims never queue behind container starts
# and refill writes on the database (issue 15.5: 128 leases at once).
LEASE_SETTLE_S = 0.05
LEASE_SETTLE_MAX_S = 1.0
DEAD_REPLICAS_EVERY_S = 5.0


def _detached(row: Any) -> Sandbox:
    """A ``Sandbox`` from a returned row of all its columns, detached with its identity (the
    state a row loaded in a session that has closed is in), without an ORM load."""
    m = row._mapping
    sb = Sandbox(**{attr: m[key] for attr, key in _SANDBOX_ATTRS})
    make_transient_to_detached(sb)
    return sb


def spec_for(
    template: Template,
    sandbox_id: str,
    deployment: str,
    image: str | None = None,
    *,
    replica: str | None = None,
) -> SandboxSpec:
    """The runtime spec of a sandbox made from ``template`` (``image`` overrides, for forks);
    ``replica`` labels the container with the id of the replica that creates it."""
    return SandboxSpec(
        extra_labels={LABEL_REPLICA: replica} if replica else {},
        sandbox_id=sandbox_id,
        template=template.name,
        deployment=deployment,
        image=image or template.image,
        cpus=template.cpus,
        memory_bytes=template.memory_mb * 1024 * 1024,
        pids_limit=template.pids_limit,
        nofile=template.nofile,
        network=template.network,
        workdir=template.workdir,
        user=template.exec_user,
        env=template.env,
        cap_add=template.cap_add,
        disk_bytes=template.disk_mb << 20,
    )


class FencedOut(Exception):  # noqa: N818 - a refusal, caught in this module, never an API error
    """A refill write of ``template`` carried fencing token ``token``, older than the
    ``newest`` stored in ``refill_fences``: a newer holder of the refill lock has written,
    so this write is refused (its transaction rolls back). Never leaves ``PoolManager``."""

    def __init__(self, template: str, token: int, newest: int) -> None:
        super().__init__(f"refill of {template} fenced out: token {token} is older than {newest}")
        self.template, self.token, self.newest = template, token, newest


_FENCES = RefillFence.__table__


def advance_fence(s: Session, deployment: str, template: str, token: int | None) -> None:
    """Check and advance ``template``'s fencing token in session ``s``'s transaction: call it
    first in every transaction that writes what the refill lock protects.

    The storage side of a lock with fencing tokens (Kleppmann, "How to do distributed
    locking", 2016): ``UPDATE refill_fences SET token=:token WHERE token <= :token``, or the
    row's INSERT when there is none (``ON CONFLICT DO NOTHING``, then the UPDATE once more:
    a concurrent first writer's row). On PostgreSQL the UPDATE holds the row lock until the
    transaction ends, so a newer holder's advance waits for this write's commit and a stale
    one, arriving after it, matches no row; on SQLite writers are serialized already
    (``BEGIN IMMEDIATE``).

    Args:
        s: a session inside a write transaction (``Database.session``).
        deployment, template: the fence's key. token: the writer's fencing token (an int
            from ``Coordinator.fence``); None writes unfenced (a coordinator without tokens:
            one process, the advisory-lock fallback) and touches nothing.

    Raises:
        FencedOut: a larger token is stored; the caller lets the transaction roll back.
    """
    if token is None:
        return
    key = and_(_FENCES.c.deployment == deployment, _FENCES.c.template == template)
    bump = update(_FENCES).where(key, _FENCES.c.token <= token).values(token=token)
    if s.execute(bump.values(updated_at=utcnow())).rowcount:
        return
    insert = pg_insert if s.get_bind().dialect.name == "postgresql" else sqlite_insert
    row = {"deployment": deployment, "template": template, "token": token, "updated_at": utcnow()}
    made = insert(_FENCES).values(**row).on_conflict_do_nothing().returning(_FENCES.c.token)
    if s.execute(made).first() is not None:  # (rowcount is -1 here on psycopg)
        return
    if s.execute(bump.values(updated_at=utcnow())).rowcount:
        return
    raise FencedOut(
        template, token, int(s.execute(select(_FENCES.c.token).where(key)).scalar_one())
    )


RESUME_GRACE_S = 600.0  # a cut-off verification's lease, from the restart that finds it


def keep_for_verification(s: Session, sandbox_ids: Iterable[str]) -> None:
    """Keep ``verifying`` sandboxes whose verification a crash cut off as they are (frozen,
    refused to every tenant call) for the verify call that resumes it, their lease re-armed
    to at least ``RESUME_GRACE_S`` from now (the deadline did not run while the verifier
    held it; a crash trial's lease ran out during the downtime and the solved sample got no
    record). One nobody resumes expires then (``PoolManager.reap``)."""
    ids = list(sandbox_ids)
    if ids:
        grace = utcnow() + timedelta(seconds=RESUME_GRACE_S)
        for sid, expires in s.execute(
            select(Sandbox.id, Sandbox.expires_at).where(
                Sandbox.id.in_(ids), Sandbox.state == "verifying"
            )
        ).all():
            if expires is None or expires < grace:
                s.execute(
                    update(Sandbox)
                    .where(Sandbox.id == sid, Sandbox.state == "verifying")
                    .values(expires_at=grace)
                    .execution_options(synchronize_session=False)
                )


class PoolManager:
    """Warm pools, lease claims, expiry and reconcile for one deployment."""

    def __init__(
        self,
        *,
        settings: Settings,
        db: Database,
        runtime: SandboxRuntime,
        templates: TemplateRegistry,
        coordinator: Coordinator | None = None,
    ) -> None:
        self.settings = settings
        self.coord = coordinator or coordination.build(settings)
        self.replica_id = self.coord.replica_id
        self.db = db
        self.runtime = runtime
        self.templates = templates
        self.deployment = settings.deployment
        self._executor = ThreadPoolExecutor(
            max_workers=settings.pool_refill_concurrency, thread_name_prefix="crucible-pool"
        )
        self._destroyer = ThreadPoolExecutor(max_workers=2, thread_name_prefix="crucible-destroy")
        self._inflight: dict[str, int] = {}
        self._images_seen: dict[str, tuple[bool, float]] = {}
        self._pruned_at = 0.0
        self._last_lease = 0.0  # monotonic time of the last lease's wake
        self._dead_checked_at = 0.0
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._maintenance: list[Callable[[], object]] = []

    def add_maintenance(self, fn: Callable[[], object]) -> None:
        """Run ``fn`` on every tick after the pool's own work (claim reclaim, for one)."""
        self._maintenance.append(fn)

    # -- targets ---------------------------------------------------------------------------

    def target(self, template: str) -> int:
        """Target warm size of ``template``: the stored override, else the configured default."""
        with self.db.read() as s:
            row = s.get(Pool, (self.deployment, template))
        return row.target_size if row else self.settings.pool_targets.get(template, 0)

    def set_target(
        self, template: str, size: int, *, tenant_id: str | None, key_id: str | None
    ) -> None:
        """Store a new target size for ``template`` and wake the refill loop."""
        self.templates.get(template)
        with self.db.session() as s:
            row = s.get(Pool, (self.deployment, template))
            old = row.target_size if row else self.settings.pool_targets.get(template, 0)
            if row is None:
                s.add(Pool(deployment=self.deployment, template=template, target_size=size))
            else:
                row.target_size, row.updated_at = size, utcnow()
            audit.record(
                s,
                "pool.set_target",
                tenant_id=tenant_id,
                key_id=key_id,
                details={"template": template, "old": old, "new": size},
            )
        self._wake.set()

    def add_demand(
        self, template: str, size: int = 1, *, owner: str | None = None, budget: int | None = None
    ) -> int:
        """Ask for ``size`` warm sandboxes of ``template`` while a job of ``owner`` (a
        tenant) needs it (in-process, never below the stored target); return how many were
        granted. With ``budget``, the owner's demands over all its templates stay within it
        (a tenant's jobs cannot make the service start more warm sandboxes than its quota
        has room for)."""
        with self._lock:
            key = (owner, template)
            demands = self.coord.demands()
            held = sum(n for (o, t), n in demands.items() if o == owner and t != template)
            granted = size if budget is None else max(0, min(size, budget - held))
            if granted:
                self.coord.put_demand(key, granted)
        self._wake.set()
        return granted

    def drop_demand(self, template: str, *, owner: str | None = None) -> None:
        """Forget ``owner``'s demand for ``template`` (on every replica); surplus warm
        sandboxes are trimmed."""
        self.coord.drop_demand((owner, template))
        self._wake.set()

    def set_demands(self, wanted: dict[str, dict[str, int]]) -> None:
        """Make the tenants' warm demand exactly ``wanted`` (tenant id -> template -> warm
        sandboxes; ``scheduler.demand.Feed`` computes it from what is queued): demands of
        tenants or templates not in it are dropped, lowered ones replaced, raised ones put
        (on every replica, through the coordinator). Demands without an owner are left."""
        changed = False
        with self._lock:
            have = {k: n for k, n in self.coord.demands().items() if k[0] is not None}
            for key, n in have.items():
                want = wanted.get(key[0], {}).get(key[1], 0)  # type: ignore[arg-type]
                if want < n:  # the seam keeps the larger of old and new: drop, then put
                    self.coord.drop_demand(key)
                    have[key], changed = 0, True
            for owner, per in wanted.items():
                for template, n in per.items():
                    if n > 0 and have.get((owner, template), 0) != n:
                        self.coord.put_demand((owner, template), n)
                        changed = True
        if changed:
            self._wake.set()

    def levels(self) -> dict[str, dict[str, int]]:
        """Per template: target, warm, starting (not yet leased) and leased counts."""
        with self.db.read() as s:
            rows = s.execute(
                select(Sandbox.template, Sandbox.state, Sandbox.tenant_id.is_(None), func.count())
                .where(Sandbox.deployment == self.deployment, Sandbox.state.not_in(ENDED_STATES))
                .group_by(Sandbox.template, Sandbox.state, Sandbox.tenant_id.is_(None))
            ).all()
            overrides = {
                p.template: p.target_size
                for p in s.execute(select(Pool).where(Pool.deployment == self.deployment)).scalars()
            }
        out: dict[str, dict[str, int]] = {}
        demand: dict[str, int] = {}
        for (_, template), n in self.coord.demands().items():
            demand[template] = max(demand.get(template, 0), n)
        names = {t.name for t in self.templates.all()} | set(overrides) | {r[0] for r in rows}
        for name in names:
            tgt = max(
                overrides.get(name, self.settings.pool_targets.get(name, 0)), demand.get(name, 0)
            )
            out[name] = {"target": tgt, "warm": 0, "starting": 0, "leased": 0}
        for template, state, unowned, n in rows:
            lv = out[template]
            if state == "warm":
                lv["warm"] += n
            elif state == "starting" and unowned:
                lv["starting"] += n
            elif state in ("leased", "snapshotting", "verifying", "starting"):
                lv["leased"] += n
        return out

    # -- lease fast path -------------------------------------------------------------------

    def claim(
        self,
        s: Session,
        *,
        template: str,
        tenant_id: str,
        expires_at: datetime,
        ttl_s: int,
        metadata: dict,
        cpus: float,
        memory_mb: int,
    ) -> Sandbox | None:
        """Atomically turn one warm sandbox of ``template`` into a lease, in session ``s``'s
        transaction: the oldest warm one, given the lease's ``cpus`` and ``memory_mb`` (MiB,
        what the quota was charged), expiring at ``expires_at`` (``ttl_s`` seconds).

        Returns the leased row, detached (as if loaded and its session closed; later changes
        to it are not written), or None when the pool is empty. Every UPDATE is guarded by
        ``state='warm'``, so two claimers (also on two replicas) never get the same sandbox.
        """
        # Prebuilt Core statements on the session's connection (the lease hot path: a
        # burst's claims run one after another in a group commit).
        conn = s.connection()
        params = {
            "b_deployment": self.deployment,
            "b_template": template,
            "b_tenant": tenant_id,
            "b_now": utcnow(),
            "b_expires": expires_at,
            "b_ttl": ttl_s,
            "b_meta": metadata,
            "b_cpus": cpus,
            "b_memory_mb": memory_mb,
        }
        row = conn.execute(_CLAIM_OLDEST_WARM, params).first()
        if row is not None:
            return _detached(row)
        # None leasable at once: the pool is empty, or (PostgreSQL) every warm row is held
        # by another transaction. The plain pick waits for such a row's holder.
        for _ in range(5):
            sid = conn.execute(_OLDEST_WARM, params).scalar()
            if sid is None:
                return None
            got = conn.execute(_CLAIM_WARM, {**params, "b_sid": sid}).rowcount
            if got == 1:
                return s.get(Sandbox, sid, populate_existing=True)
        return None

    def _oldest_warm(self, s, template: str):  # noqa: ANN001, ANN202 - a session; a Row
        """(id, container_id) of the oldest warm sandbox of ``template``, or None."""
        return s.execute(
            select(Sandbox.id, Sandbox.container_id)
            .where(
                Sandbox.deployment == self.deployment,
                Sandbox.template == template,
                Sandbox.state == "warm",
            )
            .order_by(Sandbox.created_at)
            .limit(1)
        ).first()

    def take_warm(self, template: str, *, image_id: str, purpose: dict) -> str | None:
        """Take one warm sandbox of ``template`` out of the pool for internal use (a
        verifier's pristine sandbox); return its container id, or None when the pool is empty
        or its image is not ``image_id`` (``sha256:...``).

        The row ends at once (``released``, ``purpose`` in its metadata; no tenant, no quota):
        the caller owns the container and destroys it (``destroy_container_async``); after a
        crash, reconcile destroys it as a container of an ended row. The refill loop is woken
        to replace it.
        """
        try:
            tpl = self.templates.get(template)
            if self.runtime.image_digest(tpl.image) != image_id:
                return None
        except CrucibleError:
            return None
        with self.db.session() as s:
            for _ in range(5):
                row = self._oldest_warm(s, template)
                if row is None:
                    break
                got = s.execute(
                    update(Sandbox)
                    .where(Sandbox.id == row.id, Sandbox.state == "warm")
                    .values(state="released", ended_at=utcnow(), metadata_=purpose)
                    .execution_options(synchronize_session=False)
                ).rowcount
                if got == 1 and row.container_id:
                    self._wake.set()
                    return row.container_id
        return None

    # -- starting containers ---------------------------------------------------------------

    @tracing.traced("sandbox.start")
    def start_container(self, row_id: str, template: Template, image: str | None = None) -> str:
        """Create the container of an already inserted ``starting`` row; store its id.

        Raises:
            SandboxError: the runtime failed (the row is marked failed by the caller).
        """
        t0 = time.perf_counter()
        cid = self.runtime.create(
            spec_for(template, row_id, self.deployment, image, replica=self.replica_id)
        )
        COLD_START_LATENCY.observe(time.perf_counter() - t0)
        with self.db.session() as s:
            s.execute(
                update(Sandbox)
                .where(Sandbox.id == row_id)
                .values(container_id=cid)
                .execution_options(synchronize_session=False)
            )
        return cid

    def _image_present(self, image: str) -> bool:
        """Whether ``image`` exists (re-checked every 60 s); a missing one is warned about
        once and its pool is not refilled (``crucible images build`` makes it)."""
        now = time.monotonic()
        with self._lock:
            known = self._images_seen.get(image)
        if known is not None and now - known[1] < 60:
            return known[0]
        try:
            self.runtime.image_digest(image)
            present = True
        except CrucibleError:
            present = False
            if known is None or known[0]:
                log.warning("image %s is missing; its warm pool stays empty", image)
        with self._lock:
            self._images_seen[image] = (present, now)
        return present

    def _refill_one(self, template: Template, token: int | None = None) -> None:
        """Insert one ``starting`` row of ``template``, create its container, flip it to
        ``warm``. ``token`` is the refill lock's fencing token when ``refill`` decided
        (``Coordinator.fence``): the insert and the flip are fenced (``advance_fence``), so a
        refiller that paused past its lock's lapse creates no container once a newer holder
        wrote, and one that lost the lock mid-start fails its row (the container is
        destroyed). Errors are logged, never raised (the loop goes on)."""
        sid = new_id("sb")
        inserted = False
        try:
            with self.db.session() as s:
                advance_fence(s, self.deployment, template.name, token)
                s.add(
                    Sandbox(
                        id=sid,
                        deployment=self.deployment,
                        template=template.name,
                        image=template.image,
                        state="starting",
                        cpus=template.cpus,
                        memory_mb=template.memory_mb,
                        metadata_={"replica": self.replica_id},
                    )
                )
            inserted = True
            self.start_container(sid, template)
            with self.db.session() as s:
                advance_fence(s, self.deployment, template.name, token)
                ok = s.execute(
                    update(Sandbox)
                    .where(Sandbox.id == sid, Sandbox.state == "starting")
                    .values(state="warm")
                    .execution_options(synchronize_session=False)
                ).rowcount
            if not ok:  # removed meanwhile (shutdown, reconcile: counted there)
                self._destroy_row(sid)
            else:
                POOL_CREATED.labels(template.name).inc()
        except FencedOut as e:  # a newer refiller wrote: this one's lock lapsed
            self.coord.fenced_out(template.name, e.newest)
            if inserted:
                POOL_DESTROYED_UNLEASED.labels(template.name, "failed").inc()
                self.mark_failed(sid, str(e))
        except Exception as e:  # noqa: BLE001 - a failed refill must not kill the loop
            log.warning("warm start of %s failed: %s", template.name, e)
            POOL_DESTROYED_UNLEASED.labels(template.name, "failed").inc()
            self.mark_failed(sid, f"warm start failed: {e}")
        finally:
            with self._lock:
                self._inflight[template.name] -= 1

    def _hold_refill(self, template: str) -> bool:
        held = self.coord.hold_refill(template)
        REFILL_LOCK_HELD.labels(template).set(1 if held else 0)
        return held

    def refill(self) -> None:
        """Start sandboxes where a template's warm + starting count is below its target
        (only for templates whose refill lock this replica holds)."""
        for name, lv in self.levels().items():
            with self._lock:
                inflight = self._inflight.get(name, 0)
            deficit = lv["target"] - lv["warm"] - max(lv["starting"], inflight)
            if deficit <= 0 or not self._hold_refill(name):
                continue
            try:
                template = self.templates.get(name)
            except NotFound:
                log.debug("no template %s any more: its pool is not refilled", name)
                continue
            if not self._image_present(template.image):
                continue
            token = self.coord.fence(name)  # the hold that decided carries its token
            for _ in range(deficit):
                with self._lock:
                    self._inflight[name] = self._inflight.get(name, 0) + 1
                self._executor.submit(self._refill_one, template, token)

    def trim(self) -> None:
        """Destroy warm sandboxes in excess of each template's target (only for templates
        whose refill lock this replica holds; the release is fenced, ``advance_fence``)."""
        for name, lv in self.levels().items():
            excess = lv["warm"] - lv["target"]
            if excess <= 0 or not self._hold_refill(name):
                continue
            try:
                ids = self._trim_rows(name, excess, self.coord.fence(name))
            except FencedOut as e:
                self.coord.fenced_out(name, e.newest)
                continue
            POOL_DESTROYED_UNLEASED.labels(name, "trim").inc(len(ids))
            for sid in ids:
                self.destroy_async(sid)

    def _trim_rows(self, name: str, excess: int, token: int | None) -> list[str]:
        """Release the ``excess`` newest warm rows of ``name`` in one fenced transaction;
        return their ids. Raises ``FencedOut`` (nothing released) for a stale ``token``."""
        with self.db.session() as s:
            advance_fence(s, self.deployment, name, token)
            ids = list(
                s.execute(
                    select(Sandbox.id)
                    .where(
                        Sandbox.deployment == self.deployment,
                        Sandbox.template == name,
                        Sandbox.state == "warm",
                    )
                    .order_by(Sandbox.created_at.desc())
                    .limit(excess)
                )
                .scalars()
                .all()
            )
            for sid in ids:
                s.execute(
                    update(Sandbox)
                    .where(Sandbox.id == sid, Sandbox.state == "warm")
                    .values(state="released", ended_at=utcnow())
                    .execution_options(synchronize_session=False)
                )
        return ids

    # -- ending ----------------------------------------------------------------------------

    def mark_failed(self, sandbox_id: str, reason: str) -> None:
        """Move a non-ended sandbox to ``failed``, give back its quota, destroy its container."""
        with self.db.session() as s:
            row = s.get(Sandbox, sandbox_id)
            if row is None or row.state in ENDED_STATES:
                return
            was_live = row.tenant_id is not None and row.state in tenants.LIVE_STATES
            reason = reason.replace("\x00", "\ufffd")  # text cannot store NUL (engine.py)
            row.state, row.failure, row.ended_at = "failed", reason[:2000], utcnow()
            if was_live:
                tenants.release(s, row.tenant_id, tenants.Resources(1, row.cpus, row.memory_mb))
            audit.record(
                s,
                "sandbox.fail",
                tenant_id=row.tenant_id,
                sandbox_id=sandbox_id,
                details={"reason": reason[:500]},
            )
        self.destroy_async(sandbox_id)

    def _destroy_row(self, sandbox_id: str) -> None:
        with self.db.read() as s:
            row = s.get(Sandbox, sandbox_id)
        if row is not None and row.container_id:
            self._destroy_quietly(row.container_id)

    def destroy_async(self, sandbox_id: str) -> Future:
        """Destroy a sandbox's container in the background (release must stay fast)."""
        return self._destroyer.submit(self._destroy_row, sandbox_id)

    def background(self, fn: Callable[..., object], *args: object, **kwargs: object) -> Future:
        """Run a clean-up call (image removal...) off the request path; errors are logged."""

        def run() -> None:
            try:
                fn(*args, **kwargs)
            except CrucibleError as e:
                log.warning("background %s failed: %s", getattr(fn, "__name__", fn), e)

        return self._destroyer.submit(run)

    def destroy_container_async(self, container_id: str) -> Future:
        """Destroy a container that has no sandbox row (a verifier's) in the background."""
        return self._destroyer.submit(self._destroy_quietly, container_id)

    def _destroy_quietly(self, container_id: str) -> None:
        try:
            self.runtime.destroy(container_id)
        except CrucibleError as e:
            log.warning("destroy of container %s failed: %s", container_id, e)

    def reap(self) -> int:
        """Expire leases whose ``expires_at`` passed; return how many were expired. A
        ``verifying`` sandbox expires only when no verification holds it (one a crash cut
        off that nobody resumed: ``keep_for_verification``)."""
        now = utcnow()
        held = exists().where(Episode.sandbox_id == Sandbox.id, Episode.state == "verifying")
        expirable = or_(Sandbox.state == "leased", and_(Sandbox.state == "verifying", ~held))
        with self.db.session() as s:
            rows = (
                s.execute(
                    select(Sandbox).where(
                        Sandbox.deployment == self.deployment,
                        expirable,
                        Sandbox.expires_at < now,
                    )
                )
                .scalars()
                .all()
            )
            expired = []
            for row in rows:
                ok = s.execute(
                    update(Sandbox)
                    .where(Sandbox.id == row.id, expirable, Sandbox.expires_at < now)
                    .values(state="expired", ended_at=now)
                    .execution_options(synchronize_session=False)
                ).rowcount
                if ok:
                    tenants.release(s, row.tenant_id, tenants.Resources(1, row.cpus, row.memory_mb))
                    audit.record(
                        s,
                        "sandbox.expire",
                        tenant_id=row.tenant_id,
                        sandbox_id=row.id,
                        details={"expires_at": row.expires_at.isoformat()},
                    )
                    expired.append(row.id)
        for sid in expired:
            self.destroy_async(sid)
        return len(expired)

    # -- start-up --------------------------------------------------------------------------

    def reconcile(self) -> dict[str, int]:
        """Adopt, destroy and fail so the DB and the engine agree (run before serving).

        Returns counts: adopted, destroyed (containers unknown to the DB or whose row ended),
        failed (rows whose container is gone or that were mid-start), thawed (adopted
        containers a crash left paused: mid-snapshot, or frozen for verification).
        """
        containers = {c.sandbox_id: c for c in self.runtime.list(deployment=self.deployment)}
        counts = {"adopted": 0, "destroyed": 0, "failed": 0, "thawed": 0, "left_to_others": 0}
        live_replicas = self._live_replicas()
        alone = live_replicas is not None and live_replicas <= {self.replica_id}

        def others_may_own(owner: str | None) -> bool:
            """Whether another live replica may be using what ``owner`` created."""
            if alone:
                return False
            if owner is None or live_replicas is None:
                return True
            return owner != self.replica_id and owner in live_replicas

        with self.db.session() as s:
            rows = (
                s.execute(
                    select(Sandbox).where(
                        Sandbox.deployment == self.deployment, Sandbox.state.not_in(ENDED_STATES)
                    )
                )
                .scalars()
                .all()
            )
            known = {r.id: r for r in rows}
        live = set(containers)
        for sid, c in containers.items():
            row = known.get(sid)
            if others_may_own(c.labels.get(LABEL_REPLICA)):
                continue
            if row is None or row.state == "starting" or c.status not in ("running", "paused"):
                self.runtime.destroy(c.container_id)
                counts["destroyed"] += 1
                if row is None or row.tenant_id is None:
                    POOL_DESTROYED_UNLEASED.labels(c.template or "", "reconcile").inc()
                live.discard(sid)
        if alone:  # a live replica's starting sandbox has host state before its container
            self.runtime.prune_host_state(deployment=self.deployment, live_sandbox_ids=live)
        for sid, row in known.items():
            c = containers.get(sid)
            owner = c.labels.get(LABEL_REPLICA) if c else (row.metadata_ or {}).get("replica")
            if (row.state == "starting" or c is not None) and others_may_own(owner):
                counts["left_to_others"] += 1  # mid-start, or maybe paused for a snapshot
                continue
            if row.state == "starting" or c is None or c.status not in ("running", "paused"):
                self.mark_failed(sid, "lost across a control-plane restart")
                counts["failed"] += 1
                continue
            if row.state == "verifying":
                # frozen with the end state its episode submitted: kept so, for the verify
                # call that resumes it (a crash trial's process, thawed here, solved the task
                # before the retried verify read it); one cut off before its freeze is
                # frozen now
                if c.status == "running":
                    try:
                        self.runtime.freeze(c.container_id)
                    except CrucibleError as e:
                        self.mark_failed(sid, f"could not freeze after a restart: {e}")
                        counts["failed"] += 1
                        continue
                with self.db.session() as s:
                    keep_for_verification(s, [sid])
                counts["kept_frozen"] = counts.get("kept_frozen", 0) + 1
                counts["adopted"] += 1
                continue
            if c.status == "paused":
                try:
                    self.runtime.thaw(c.container_id)
                    counts["thawed"] += 1
                except CrucibleError as e:
                    self.mark_failed(sid, f"could not thaw after a restart: {e}")
                    counts["failed"] += 1
                    continue
            if row.state == "snapshotting":  # recovery re-runs the episode
                with self.db.session() as s:
                    s.execute(
                        update(Sandbox)
                        .where(Sandbox.id == sid)
                        .values(state="leased")
                        .execution_options(synchronize_session=False)
                    )
            counts["adopted"] += 1
        with self.db.session() as s:
            if alone:  # another replica's leases in flight would race the recount
                tenants.recompute_usage(s)
            audit.record(
                s,
                "deployment.reconcile",
                details={"deployment": self.deployment, "replica": self.replica_id, **counts},
            )
        return counts

    def _live_replicas(self) -> set[str] | None:
        """Live replica ids; just this one for a lone server; None when a replica cannot
        know (no shared coordination, or Redis down)."""
        if not self.settings.replica:
            return {self.replica_id}
        if isinstance(self.coord, InProcessCoordinator):
            return None
        return self.coord.live_replicas()

    def reclaim_dead_replicas(self) -> dict[str, int]:
        """Fail the unleased ``starting`` rows and destroy the row-less containers of
        replicas whose heartbeat lapsed (a replica killed mid-refill). Does nothing while the
        live set is unknown. Returns counts: ``failed`` rows, ``destroyed`` containers."""
        counts = {"failed": 0, "destroyed": 0}
        live = self._live_replicas()
        if not self.settings.replica or live is None:
            return counts
        with self.db.read() as s:
            rows = s.execute(
                select(Sandbox.id, Sandbox.metadata_).where(
                    Sandbox.deployment == self.deployment,
                    Sandbox.state == "starting",
                    Sandbox.tenant_id.is_(None),
                )
            ).all()
        for sid, meta in rows:
            owner = (meta or {}).get("replica")
            if owner and owner not in live:
                self.mark_failed(sid, f"replica {owner} died while starting it")
                counts["failed"] += 1
        containers = self.runtime.list(deployment=self.deployment)
        with self.db.read() as s:
            alive = set(
                s.execute(
                    select(Sandbox.id).where(
                        Sandbox.deployment == self.deployment, Sandbox.state.not_in(ENDED_STATES)
                    )
                ).scalars()
            )
        for c in containers:
            owner = c.labels.get(LABEL_REPLICA)
            if owner and owner not in live and c.sandbox_id not in alive:
                self._destroy_quietly(c.container_id)
                counts["destroyed"] += 1
                POOL_DESTROYED_UNLEASED.labels(c.template or "", "reclaim").inc()
        if counts["failed"] or counts["destroyed"]:
            log.info("reclaimed from dead replicas: %s", counts)
        return counts

    # -- background loop -------------------------------------------------------------------

    def tick(self) -> None:
        """One round of maintenance: reap, trim, refill; every ``PRUNE_EVERY_S`` also delete
        snapshot images nothing uses any more."""
        self.reap()
        for fn in self._maintenance:
            fn()
        self.trim()
        self.refill()
        now = time.monotonic()
        if self.settings.replica and now - self._dead_checked_at >= DEAD_REPLICAS_EVERY_S:
            self._dead_checked_at = now
            self.reclaim_dead_replicas()
        if now - self._pruned_at >= PRUNE_EVERY_S:
            self._pruned_at = now
            self.background(self.runtime.prune_snapshots, deployment=self.deployment)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.tick()
            except Exception:  # noqa: BLE001 - keep maintaining; the error is logged
                log.exception("pool maintenance failed")
            self._wake.wait(self.settings.pool_interval_s)
            self._wake.clear()
            self._settle()

    def _settle(self) -> None:
        """After a lease, wait until leases pause for ``LEASE_SETTLE_S`` (at most
        ``LEASE_SETTLE_MAX_S``) before the next tick refills."""
        started = time.monotonic()
        while not self._stop.is_set():
            now = time.monotonic()
            quiet = now - self._last_lease
            if quiet >= LEASE_SETTLE_S or now - started >= LEASE_SETTLE_MAX_S:
                return
            self._stop.wait(LEASE_SETTLE_S - quiet)

    def start(self) -> None:
        """Start coordination (heartbeat) and the maintenance thread."""
        self.coord.start()
        self._thread = threading.Thread(target=self._loop, name="crucible-pool-loop", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        """Ask the maintenance loop to run now (a lease: once leases pause, ``_settle``)."""
        self._last_lease = time.monotonic()
        self._wake.set()

    def stop(self, *, drain_warm: bool = True) -> None:
        """Stop the loop; with ``drain_warm`` destroy this deployment's warm sandboxes
        (not while another replica lives: they stay its to lease)."""
        self._stop.set()
        self._wake.set()
        if self._thread:
            self._thread.join(timeout=10)
        self._executor.shutdown(wait=True, cancel_futures=True)
        live = self._live_replicas()
        if drain_warm and live is not None and live <= {self.replica_id}:
            with self.db.session() as s:
                drained = s.execute(
                    select(Sandbox.id, Sandbox.template).where(
                        Sandbox.deployment == self.deployment,
                        Sandbox.state.in_(("warm", "starting")),
                        Sandbox.tenant_id.is_(None),
                    )
                ).all()
                ids = [sid for sid, _ in drained]
                for _, name in drained:
                    POOL_DESTROYED_UNLEASED.labels(name, "drain").inc()
                s.execute(
                    update(Sandbox)
                    .where(Sandbox.id.in_(ids))
                    .values(state="released", ended_at=utcnow())
                    .execution_options(synchronize_session=False)
                )
            for sid in ids:
                self.destroy_async(sid)
        self._destroyer.shutdown(wait=True)
        self.coord.close()


def lease_expiry(ttl_s: int) -> datetime:
    """``now + ttl_s`` seconds, UTC."""
    return utcnow() + timedelta(seconds=ttl_s)
