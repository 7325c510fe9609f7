"""Episode checkpoints: the sandbox's snapshot plus the runner's trajectory so far.

A runner checkpoints a job's episode every K turns (or when it likes): the sandbox is
snapshotted and the trajectory so far (``state``: turns, chat, token ids, loss mask,
logprobs, timing; opaque here, at most ``MAX_STATE_BYTES`` of JSON) stored with the number
of turns done. One checkpoint per sample: a newer one replaces the older (whose snapshot is
deleted). After a lost worker, a timeout or a restart the item's next claim resumes the
sample: a sandbox forked from the checkpoint's snapshot becomes a new episode of the current
claim (same task version, pristine image digest, group and sample), and the runner goes on
at turn ``turn`` with the stored trajectory. The record names the checkpoint
(``resumed_from``). An item's checkpoints (and their snapshots) are dropped when it ends.
Checkpoint snapshots count against the tenant's snapshot quota and expire with
``snapshot_ttl_s`` like any snapshot; a sample whose checkpoint expired starts afresh.
"""

from __future__ import annotations

import contextlib
import json
import time
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import select
from sqlalchemy.orm import Session

from service import audit, episodes, sandboxes, scheduler
from service.context import ServiceContext
from service.db.models import Checkpoint, Episode
from service.errors import Conflict, CrucibleError, InvalidRequest, NotFound
from service.ids import new_id
from service.tenants import Principal

MAX_STATE_BYTES = 16 << 20


class CheckpointIn(BaseModel):
    """``POST /v1/episodes/{id}/checkpoints``: ``turn`` turns done; ``state`` the runner's
    trajectory so far (token ids included)."""

    model_config = ConfigDict(extra="forbid")

    turn: int = Field(ge=0, le=100000)
    state: dict[str, Any]


class CheckpointOut(BaseModel):
    """A stored checkpoint."""

    id: str
    work_item_id: str
    sample_idx: int
    episode_id: str
    turn: int
    snapshot_id: str
    created_at: datetime
    state: dict[str, Any] | None = None


class ResumeIn(BaseModel):
    """``POST /v1/work-items/{id}/resume``: the sample to resume from its checkpoint."""

    model_config = ConfigDict(extra="forbid")

    sample_idx: int = Field(ge=0)


def out(c: Checkpoint, *, with_state: bool = False) -> CheckpointOut:
    """Row -> API schema (``state`` only when asked: it can be large)."""
    return CheckpointOut(
        id=c.id,
        work_item_id=c.work_item_id,
        sample_idx=c.sample_idx,
        episode_id=c.episode_id,
        turn=c.turn,
        snapshot_id=c.snapshot_id,
        created_at=c.created_at,
        state=c.state if with_state else None,
    )


def _live_episode(ctx: ServiceContext, principal: Principal, episode_id: str) -> Episode:
    ep = episodes.get(ctx, principal, episode_id)
    if ep.work_item_id is None:
        raise InvalidRequest("only a job's episodes are checkpointed", field="episode_id")
    if ep.state != "running" or scheduler.live_claim(ctx.db, ep.work_item_id) != ep.claim_id:
        raise Conflict(f"episode {episode_id} is {ep.state}, not running under a live claim")
    return ep


def save(
    ctx: ServiceContext, principal: Principal, episode_id: str, body: CheckpointIn
) -> Checkpoint:
    """Snapshot the episode's sandbox and store it with ``body.state``.

    Raises:
        NotFound: unknown episode. InvalidRequest: not a job's episode, or ``state`` over
        ``MAX_STATE_BYTES``. Conflict: the episode is not running under its live claim.
        QuotaExceeded: the snapshot quota is full.
    """
    if len(json.dumps(body.state)) > MAX_STATE_BYTES:
        raise InvalidRequest(f"state is over {MAX_STATE_BYTES} bytes of JSON", field="state")
    ep = _live_episode(ctx, principal, episode_id)
    _refuse_unverifiable(ctx, principal, ep)
    snap = sandboxes.snapshot(ctx, principal, ep.sandbox_id)
    old_snapshot = None
    with ctx.db.session() as s:
        old = _row(s, ep.work_item_id, ep.sample_idx)
        if old is not None:
            old_snapshot = old.snapshot_id
            s.delete(old)
            s.flush()
        row = Checkpoint(
            id=new_id("ckpt"),
            tenant_id=principal.tenant_id,
            work_item_id=ep.work_item_id,
            sample_idx=ep.sample_idx,
            episode_id=ep.id,
            turn=body.turn,
            snapshot_id=snap.id,
            state=body.state,
        )
        s.add(row)
        audit.record(
            s,
            "episode.checkpoint",
            tenant_id=principal.tenant_id,
            key_id=principal.key_id,
            sandbox_id=ep.sandbox_id,
            details={"episode_id": ep.id, "checkpoint_id": row.id, "turn": body.turn},
        )
    if old_snapshot is not None:
        with contextlib.suppress(CrucibleError):  # expired meanwhile
            sandboxes.delete_snapshot(ctx, principal, old_snapshot)
    return row


def _refuse_unverifiable(ctx: ServiceContext, principal: Principal, ep: Episode) -> None:
    """``Conflict`` when this control plane could not verify an episode resumed from a
    checkpoint of ``ep``: its end state would lie partly in the snapshot's image layers,
    which only a control plane that reads the engine's storage can diff (a compose
    replica reads through the engine's API). A fifth trial made every unsolved episode's 0
    an error that way: checkpoint, give the claim back, resume, verify."""
    reads = getattr(ctx.runtime, "reads_layers", None)
    if reads is None:
        return
    row = sandboxes.get_live(ctx, principal, ep.sandbox_id)
    if not reads(row.container_id):
        raise Conflict(
            "checkpoints need a control plane that reads the engine's storage (overlay2 on "
            "the engine's host): this one could not verify an episode resumed from one",
            field="episode_id",
        )


def _row(s: Session, work_item_id: str, sample_idx: int) -> Checkpoint | None:
    return s.execute(
        select(Checkpoint).where(
            Checkpoint.work_item_id == work_item_id, Checkpoint.sample_idx == sample_idx
        )
    ).scalar()


def of_item(ctx: ServiceContext, principal: Principal, work_item_id: str) -> list[Checkpoint]:
    """The item's checkpoints, by sample (``NotFound`` for another tenant's item)."""
    scheduler.get_item(ctx.db, principal, work_item_id)
    with ctx.db.read() as s:
        return list(
            s.execute(
                select(Checkpoint)
                .where(Checkpoint.work_item_id == work_item_id)
                .order_by(Checkpoint.sample_idx)
            ).scalars()
        )


def resume(
    ctx: ServiceContext, principal: Principal, work_item_id: str, sample_idx: int
) -> episodes.StartedEpisode:
    """A new episode of the item's live claim for ``sample_idx``, in a sandbox forked from
    its checkpoint (a live episode of this claim for the sample is returned as is).

    Raises:
        NotFound: no such item or no checkpoint for the sample (field ``sample_idx``).
        Conflict: the item is not under a live claim, or the sample is recorded.
    """
    item = scheduler.get_item(ctx.db, principal, work_item_id)
    claim_id = scheduler.live_claim(ctx.db, work_item_id)
    if claim_id is None:
        raise Conflict(f"work item {work_item_id} is {item.state}, not under a live claim")
    with ctx.db.read() as s:
        ck = _row(s, work_item_id, sample_idx)
        if scheduler.recorded_samples(s, work_item_id).get(sample_idx) == "ok":
            raise Conflict(f"sample {sample_idx} of {work_item_id} is recorded")
        live = s.execute(
            select(Episode).where(
                Episode.claim_id == claim_id,
                Episode.sample_idx == sample_idx,
                Episode.state.in_(("running", "verifying")),
            )
        ).scalar()
        orig = s.get(Episode, ck.episode_id) if ck is not None else None
    if ck is None or orig is None:
        raise NotFound(f"no checkpoint for sample {sample_idx}", field="sample_idx")
    task = episodes.resolve_task(ctx, orig.task_id, orig.suite)
    if live is not None:
        return episodes.StartedEpisode(live, task)
    t0 = time.perf_counter()
    ttl = int(task.agent_timeout_s + task.verifier_timeout_s + 300)
    meta = {"task_id": task.id, "suite": task.suite, "job_id": orig.job_id}
    sb = sandboxes.fork(
        ctx, principal, ck.snapshot_id, n=1, ttl_s=ttl, metadata={**meta, "episode_role": "member"}
    )[0]
    resumed = {"checkpoint_id": ck.id, "from_episode": orig.id, "turn": ck.turn}
    with ctx.db.session() as s:
        ep = Episode(
            id=new_id("ep"),
            tenant_id=principal.tenant_id,
            job_id=orig.job_id,
            work_item_id=work_item_id,
            group_id=orig.group_id,
            sample_idx=sample_idx,
            task_id=orig.task_id,
            task_version=orig.task_version,
            suite=orig.suite,
            domain=orig.domain,
            template=orig.template,
            image_digest=orig.image_digest,  # the pristine image the verifier compares with
            sandbox_id=sb.id,
            snapshot_id=orig.snapshot_id,
            state="running",
            timing={"lease_ms": round((time.perf_counter() - t0) * 1e3, 3), "resumed": resumed},
            claim_id=claim_id,
        )
        s.add(ep)
        audit.record(
            s,
            "episode.resume",
            tenant_id=principal.tenant_id,
            key_id=principal.key_id,
            sandbox_id=sb.id,
            details={"episode_id": ep.id, "claim_id": claim_id, **resumed},
        )
    return episodes.StartedEpisode(ep, task)


def drop_item(ctx: ServiceContext, principal: Principal, work_item_id: str) -> int:
    """Delete an ended item's checkpoints and their snapshots; returns how many."""
    with ctx.db.session() as s:
        rows = list(
            s.execute(select(Checkpoint).where(Checkpoint.work_item_id == work_item_id)).scalars()
        )
        snaps = [r.snapshot_id for r in rows]
        for r in rows:
            s.delete(r)
    for snap in snaps:
        with contextlib.suppress(CrucibleError):
            sandboxes.delete_snapshot(ctx, principal, snap)
    return len(rows)
