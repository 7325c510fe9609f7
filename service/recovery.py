"""Reclaiming abandoned work: lapsed claims, ownerless episodes, leftovers of a crash.

Two entry points:

- ``reclaim(ctx)`` runs on every pool tick (``PoolManager.add_maintenance``). Claimed work
  items whose claim expired go back to the queue (no attempt used); every ``running``
  episode whose owner is gone is ``abandoned`` and its sandbox released (quota returned).
  An episode's owner is its claim while that claim is its work item's live claim; an ad-hoc
  episode's owner is its sandbox lease, so it is abandoned when that lease ended.
- ``recover_on_start(ctx)`` runs once at start-up, after ``PoolManager.reconcile`` (which
  adopts live containers and thaws the ones a crash left paused mid-snapshot; one frozen
  for verification stays frozen). Episodes cut off mid-verification go back to ``running``
  with their sandboxes kept ``verifying`` (their worker's retried verify reads the end
  state first submitted, idempotently);
  sandboxes an interrupted episode start left behind (a prepared sandbox, or fork members
  that never became episodes) are released; snapshot rows of interrupted group starts and
  snapshot images without a live row (a commit cut off before its row was written) are
  removed. Then ``reclaim`` runs once.

After both, no episode is ``running`` or ``verifying`` without a live owner.

On replicas, ``DeadReplicaWork`` also runs on every pool tick: the cold starts and
snapshots a dead replica left half done are failed or put back (see its docstring).
"""

from __future__ import annotations

import contextlib
import logging
import time

import docker
from sqlalchemy import and_, exists, or_, select, update

from service import audit, sandboxes, scheduler
from service.context import ServiceContext
from service.db.models import Episode, Sandbox, Snapshot, WorkItem, utcnow
from service.errors import Conflict, CrucibleError, NotFound
from service.pool import ENDED_STATES, keep_for_verification
from service.tenants import Principal

log = logging.getLogger("crucible.recovery")


def _system(tenant_id: str) -> Principal:
    """The control plane acting on a tenant's behalf (audited as key ``system``)."""
    return Principal(tenant_id, "system", frozenset({"admin"}))


def _release(
    ctx: ServiceContext, tenant_id: str | None, sandbox_id: str, *, verified: bool = False
) -> None:
    if tenant_id is None:
        return
    with contextlib.suppress(Conflict, NotFound):  # ended already, or mid-snapshot (next tick)
        sandboxes.release(ctx, _system(tenant_id), sandbox_id, verified=verified)


def reclaim(ctx: ServiceContext) -> dict[str, int]:
    """Re-queue lapsed claims and abandon ownerless running episodes (releasing their
    sandboxes). Returns counts: ``requeued`` items, ``abandoned`` episodes."""
    now = utcnow()
    with ctx.db.session() as s:
        lapsed = scheduler.requeue_lapsed(s, now=now)
    owner_gone = or_(
        and_(
            Episode.claim_id.is_not(None),
            or_(
                WorkItem.id.is_(None),
                WorkItem.state != "claimed",
                WorkItem.claim_id != Episode.claim_id,
                WorkItem.claim_expires_at < now,
            ),
        ),
        and_(Episode.claim_id.is_(None), Sandbox.state.in_(ENDED_STATES)),
        Sandbox.id.is_(None),
    )
    with ctx.db.read() as s:
        rows = s.execute(
            select(Episode.id, Episode.tenant_id, Episode.sandbox_id, Episode.claim_id)
            .outerjoin(WorkItem, WorkItem.id == Episode.work_item_id)
            .outerjoin(Sandbox, Sandbox.id == Episode.sandbox_id)
            .where(Episode.state == "running", owner_gone)
        ).all()
    abandoned = 0
    for ep_id, tenant_id, sandbox_id, claim_id in rows:
        with ctx.db.session() as s:
            got = s.execute(
                update(Episode)
                .where(Episode.id == ep_id, Episode.state == "running")
                .values(state="abandoned", ended_at=utcnow())
                .execution_options(synchronize_session=False)
            ).rowcount
            if not got:
                continue
            audit.record(
                s,
                "episode.abandon",
                tenant_id=tenant_id,
                sandbox_id=sandbox_id,
                details={"episode_id": ep_id, "claim_id": claim_id, "reason": "owner gone"},
            )
        abandoned += 1
        _release(ctx, tenant_id, sandbox_id)
    if lapsed or abandoned:
        log.info("reclaimed %d lapsed claims, abandoned %d episodes", len(lapsed), abandoned)
    return {"requeued": len(lapsed), "abandoned": abandoned}


def recover_on_start(ctx: ServiceContext) -> dict[str, int]:
    """Finish what a crash interrupted (see the module docstring). Returns counts."""
    counts = {"reverify": _verifying_to_running(ctx), "replays": _end_interrupted_replays(ctx)}
    counts["orphan_sandboxes"] = _release_orphan_sandboxes(ctx)
    counts["snapshots"] = _drop_interrupted_snapshots(ctx)
    counts["snapshot_images"] = _remove_rowless_snapshot_images(ctx)
    counts.update(reclaim(ctx))
    with ctx.db.session() as s:
        audit.record(
            s, "deployment.recover", details={"deployment": ctx.settings.deployment, **counts}
        )
    return counts


def _end_interrupted_replays(ctx: ServiceContext) -> int:
    """Replays a crash cut off (``replaying``; nothing else ends them) end ``abandoned``
    and give their sandboxes back."""
    with ctx.db.session() as s:
        rows = s.execute(
            select(Episode.id, Episode.tenant_id, Episode.sandbox_id)
            .join(Sandbox, Sandbox.id == Episode.sandbox_id)
            .where(Episode.state == "replaying", Sandbox.deployment == ctx.settings.deployment)
        ).all()
        if rows:
            s.execute(
                update(Episode)
                .where(Episode.id.in_([r.id for r in rows]), Episode.state == "replaying")
                .values(state="abandoned", ended_at=utcnow())
                .execution_options(synchronize_session=False)
            )
    for r in rows:
        _release(ctx, r.tenant_id, r.sandbox_id)
    return len(rows)


def _verifying_to_running(ctx: ServiceContext) -> int:
    """Episodes a crash cut off mid-verification go back to ``running``; their sandboxes stay
    ``verifying`` and frozen (``pool.keep_for_verification``), so the worker's retried verify
    reads the end state first submitted and no tenant call changes it meanwhile. On
    replicas, only those no live replica is verifying (its container tracked in flight; a
    crash trial's restarted idle replica took over a live one's verification): with Redis
    down none, and ``DeadReplicaWork`` finishes them once it answers. Replicas without
    Redis cannot know, and recover all, as before."""
    with ctx.db.session() as s:
        rows = s.execute(
            select(Episode.id, Sandbox.container_id)
            .join(Sandbox, Sandbox.id == Episode.sandbox_id)
            .where(Episode.state == "verifying", Sandbox.deployment == ctx.settings.deployment)
        ).all()
        if ctx.settings.replica and ctx.settings.redis_url and rows:
            busy = ctx.pools.coord.in_flight()
            if busy is None:
                return 0  # Redis down: DeadReplicaWork finishes them once it answers
            rows = [r for r in rows if not (r.container_id and f"c:{r.container_id}" in busy)]
        ids = [r.id for r in rows]
        if ids:
            s.execute(
                update(Episode)
                .where(Episode.id.in_(ids), Episode.state == "verifying")
                .values(state="running")
                .execution_options(synchronize_session=False)
            )
            keep_for_verification(
                s, s.execute(select(Episode.sandbox_id).where(Episode.id.in_(ids))).scalars()
            )
            audit.record(s, "episode.recover", details={"episodes": list(ids)})
    return len(ids)


FINAL_EPISODE_STATES = ("verified", "error", "abandoned")


def _release_orphan_sandboxes(ctx: ServiceContext) -> int:
    """Leased sandboxes made by an episode start that no episode row names, or whose
    episode already ended (a crash between storing its record and releasing its sandbox:
    found by a crash trial; the sandbox and its quota were held until the lease ran out)."""
    final = FINAL_EPISODE_STATES
    with ctx.db.read() as s:
        rows = (
            s.execute(
                select(Sandbox)
                .outerjoin(Episode, Episode.sandbox_id == Sandbox.id)
                .where(
                    Sandbox.deployment == ctx.settings.deployment,
                    Sandbox.state.in_(("leased", "snapshotting", "verifying")),
                    or_(Episode.id.is_(None), Episode.state.in_(final)),
                )
            )
            .scalars()
            .all()
        )
    orphans = [
        r
        for r in rows
        if (r.metadata_ or {}).get("episode_role") in ("prepare", "member")
        or r.state == "verifying"  # its verdict is stored: the release was what was left
    ]
    for row in orphans:
        _release(ctx, row.tenant_id, row.id, verified=True)
    return len(orphans)


def _drop_interrupted_snapshots(ctx: ServiceContext) -> int:
    """Prepared snapshots of group starts that a crash kept from being deleted."""
    with ctx.db.read() as s:
        rows = s.execute(
            select(Snapshot, Sandbox.metadata_)
            .join(Sandbox, Sandbox.id == Snapshot.sandbox_id)
            .where(Snapshot.deployment == ctx.settings.deployment, Snapshot.deleted_at.is_(None))
        ).all()
    dropped = 0
    for snap, meta in rows:
        if (meta or {}).get("episode_role") != "prepare":
            continue
        with contextlib.suppress(NotFound):
            sandboxes.delete_snapshot(ctx, _system(snap.tenant_id), snap.id)
            dropped += 1
    return dropped


def _remove_rowless_snapshot_images(ctx: ServiceContext) -> int:
    """Snapshot tags of this deployment with no live snapshot row (a commit that finished
    after its request died). Read through the engine's image list; an engine that cannot be
    asked is logged and skipped (the next start tries again)."""
    repo = f"{ctx.settings.image_prefix}-snapshots/{ctx.settings.deployment}".lower()
    try:
        client = (
            docker.DockerClient(base_url=ctx.settings.docker_host)
            if ctx.settings.docker_host
            else docker.from_env()
        )
        tags = [t for img in client.images.list(name=repo) for t in img.tags]
        client.close()
    except docker.errors.DockerException as e:
        log.warning("listing snapshot images of %s failed: %s", repo, e)
        return 0
    with ctx.db.read() as s:
        live = set(
            s.execute(
                select(Snapshot.id).where(
                    Snapshot.deployment == ctx.settings.deployment, Snapshot.deleted_at.is_(None)
                )
            )
            .scalars()
            .all()
        )
    removed = 0
    for tag in tags:
        if tag.rsplit(":", 1)[-1] in live:
            continue
        try:
            ctx.runtime.remove_image(tag)
            removed += 1
        except CrucibleError as e:  # still used by a container: prune removes it later
            log.info("snapshot image %s kept: %s", tag, e)
    return removed


class DeadReplicaWork:
    """Finishes what a dead replica left mid-way (a pool-tick maintenance callable).

    A replica tracks its starts (``sb:<id>``) and snapshots (``c:<container>``) in the
    coordinator while they run (``service.coordination.tracking``). Every ``EVERY_S``
    seconds this looks at tenants' ``starting`` rows (cold leases, forks) and
    ``snapshotting`` rows (snapshots, group starts), and at ``verifying`` episodes whose
    frozen sandbox no live replica tracks; one found so twice in a row, in the same state, is
    its dead owner's: a ``starting`` row is failed (quota back, container destroyed), a
    ``snapshotting`` one thawed and put back to ``leased`` (and released when it was a group
    start's prepared sandbox: the request that made it died with its replica), a
    ``verifying`` episode thawed and put back to ``running`` (its worker verifies again
    through a live replica; a worker gone too loses its claim, and ``reclaim`` abandons it),
    and a group start's leased sandbox (``metadata.episode_role``) that no live episode owns
    is released (the start died between its lease, fork and episode rows: milliseconds apart
    on a live replica, so never seen so twice there).
    Only on replicas, and only while the live set is known (Redis answers); otherwise it
    does nothing. Unleased refill rows are the pool's (``PoolManager.reclaim_dead_replicas``).

    Args:
        ctx: the service context.
    """

    EVERY_S = 5.0

    def __init__(self, ctx: ServiceContext) -> None:
        self.ctx = ctx
        self._suspects: dict[str, str] = {}  # sandbox id -> state when seen untracked
        self._checked_at = 0.0

    def __call__(self) -> dict[str, int]:
        """Run one check when due; returns counts ``failed``, ``restored``, ``released``,
        ``reverify``."""
        counts = {"failed": 0, "restored": 0, "released": 0, "reverify": 0}
        now = time.monotonic()
        settings = self.ctx.settings
        if not (settings.replica and settings.redis_url) or now - self._checked_at < self.EVERY_S:
            return counts  # without Redis no replica knows what the others are doing
        self._checked_at = now
        busy = self.ctx.pools.coord.in_flight()
        if busy is None:
            self._suspects.clear()
            return counts
        with self.ctx.db.read() as s:
            rows = s.execute(
                select(Sandbox.id, Sandbox.state, Sandbox.container_id).where(
                    Sandbox.deployment == self.ctx.settings.deployment,
                    Sandbox.state.in_(("starting", "snapshotting")),
                    Sandbox.tenant_id.is_not(None),
                )
            ).all()
            verifying = s.execute(
                select(Episode.id, Sandbox.container_id)
                .join(Sandbox, Sandbox.id == Episode.sandbox_id)
                .where(
                    Episode.state == "verifying",
                    Sandbox.deployment == self.ctx.settings.deployment,
                )
            ).all()
            owned = exists().where(
                Episode.sandbox_id == Sandbox.id, Episode.state.not_in(FINAL_EPISODE_STATES)
            )
            left = s.execute(
                select(Sandbox.id, Sandbox.metadata_, Sandbox.container_id, Sandbox.state).where(
                    Sandbox.deployment == self.ctx.settings.deployment,
                    Sandbox.state.in_(("leased", "verifying")),
                    ~owned,
                )
            ).all()
        untracked = {
            sid: state
            for sid, state, cid in rows
            if f"sb:{sid}" not in busy and not (cid and f"c:{cid}" in busy)
        }
        untracked.update(
            {f"ep:{ep}": cid or "" for ep, cid in verifying if not cid or f"c:{cid}" not in busy}
        )
        untracked.update(
            {
                f"or:{sid}": (meta or {}).get("episode_role", "")
                for sid, meta, cid, state in left
                if (
                    (meta or {}).get("episode_role") in ("prepare", "member")
                    or state == "verifying"
                )
                and f"sb:{sid}" not in busy
                and not (cid and f"c:{cid}" in busy)
            }
        )
        confirmed = [sid for sid, state in untracked.items() if self._suspects.get(sid) == state]
        self._suspects = {k: v for k, v in untracked.items() if k not in confirmed}
        for sid in confirmed:
            if sid.startswith("ep:"):
                counts["reverify"] += self._reverify(sid[3:], untracked[sid])
            elif sid.startswith("or:"):
                counts["released"] += self._release_orphan(sid[3:])
            elif untracked[sid] == "starting":
                self.ctx.pools.mark_failed(sid, "no live replica was starting it (its died)")
                counts["failed"] += 1
            elif self._restore(sid):
                counts["restored"] += 1
                if self._release_prepared(sid):
                    counts["released"] += 1
        if any(counts.values()):
            log.info("finished the work of dead replicas: %s", counts)
        return counts

    def _restore(self, sandbox_id: str) -> bool:
        """Thaw a dead replica's snapshot sandbox and put it back to ``leased``."""
        with self.ctx.db.read() as s:
            row = s.get(Sandbox, sandbox_id)
        if row is None or row.state != "snapshotting":
            return False
        paused = any(
            c.sandbox_id == sandbox_id and c.status == "paused"
            for c in self.ctx.runtime.list(deployment=self.ctx.settings.deployment)
        )
        if paused and row.container_id:
            try:
                self.ctx.runtime.thaw(row.container_id)
            except CrucibleError as e:
                self.ctx.pools.mark_failed(
                    sandbox_id, f"could not thaw after its replica died: {e}"
                )
                return False
        with self.ctx.db.session() as s:
            got = s.execute(
                update(Sandbox)
                .where(Sandbox.id == sandbox_id, Sandbox.state == "snapshotting")
                .values(state="leased")
                .execution_options(synchronize_session=False)
            ).rowcount
            if got:
                audit.record(
                    s,
                    "sandbox.recover",
                    tenant_id=row.tenant_id,
                    sandbox_id=sandbox_id,
                    details={"reason": "its snapshot's replica died", "thawed": paused},
                )
        return bool(got)

    def _release_orphan(self, sandbox_id: str) -> int:
        """Release a group start's sandbox that no episode came to own (its start died)."""
        if self._release_prepared(sandbox_id):
            return 1
        with self.ctx.db.read() as s:
            row = s.get(Sandbox, sandbox_id)
        if row is None or row.state not in ("leased", "verifying"):
            return 0
        # a verifying one's verdict is stored (no live episode owns it): only its release
        _release(self.ctx, row.tenant_id, sandbox_id, verified=row.state == "verifying")
        return 1

    def _reverify(self, episode_id: str, container_id: str) -> int:
        """Put a dead replica's verification's episode back to ``running``, its sandbox kept
        ``verifying`` and frozen for the verify that resumes it (``keep_for_verification``)."""
        with self.ctx.db.session() as s:
            got = s.execute(
                update(Episode)
                .where(Episode.id == episode_id, Episode.state == "verifying")
                .values(state="running")
                .execution_options(synchronize_session=False)
            ).rowcount
            if got:
                keep_for_verification(
                    s,
                    s.execute(select(Episode.sandbox_id).where(Episode.id == episode_id)).scalars(),
                )
                audit.record(
                    s,
                    "episode.recover",
                    details={"episodes": [episode_id], "reason": "its verifier's replica died"},
                )
        return got

    def _release_prepared(self, sandbox_id: str) -> bool:
        """Release a group start's prepared sandbox whose start died (and its snapshots)."""
        with self.ctx.db.read() as s:
            row = s.get(Sandbox, sandbox_id)
            snaps = (
                s.execute(
                    select(Snapshot.id).where(
                        Snapshot.sandbox_id == sandbox_id, Snapshot.deleted_at.is_(None)
                    )
                )
                .scalars()
                .all()
            )
        if row is None or (row.metadata_ or {}).get("episode_role") != "prepare":
            return False
        for snap_id in snaps:
            with contextlib.suppress(NotFound):
                sandboxes.delete_snapshot(self.ctx, _system(row.tenant_id), snap_id)
        _release(self.ctx, row.tenant_id, sandbox_id)
        return True
