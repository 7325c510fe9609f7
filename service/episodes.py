"""Episodes: lease + task set-up, and verification into a reward record.

An episode group of ``group_size`` n leases n sandboxes of the task's template at once
(warm ones when the pool has them): every member of a GRPO group starts from the task image
itself, the identical state by construction, and that image is the one the verifier takes
as pristine (nothing a tenant can reach precedes it). Verification freezes the episode's
sandbox (its end state) and hands it to the task's verifier (``service.verifiers``), which
runs isolated from the agent in a pristine sandbox (from the warm pool when it can); the
result becomes a reward record (``service.rewards``) stored once per episode.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from service import audit, rewards, sandboxes, scheduler, tracing
from service.context import ServiceContext
from service.db.models import Episode, Job, RewardRecordRow, Sandbox, WorkItem, utcnow
from service.errors import Conflict, CrucibleError, InvalidRequest, NotFound
from service.ids import new_id
from service.metrics import observe_verification
from service.pool import spec_for
from service.scheduler import plan
from service.tasks import builds, verifier_network
from service.tasks.models import Task
from service.tasks.registry import template_name
from service.templates import Template
from service.tenants import Principal
from service.text import recordable
from service.verifiers import fairslots
from service.verifiers import registry as verifier_registry
from service.verifiers.base import VerifierResult
from service.verifiers.registry import EndState

log = logging.getLogger("crucible.episodes")


@dataclass(frozen=True)
class StartedEpisode:
    """An episode as its worker needs it: where to act and what to do."""

    episode: Episode
    task: Task


def resolve_task(ctx: ServiceContext, task_id: str, suite: str | None) -> Task:
    """The task, or ``NotFound`` naming ``task_id``."""
    try:
        return ctx.tasks.get(task_id, suite)
    except NotFound as e:
        raise NotFound(e.detail, field="task_id") from None


def ensure_template(ctx: ServiceContext, task: Task) -> str:
    """The task's template name; the template registry's resolver (``ServiceContext``)
    builds the task's image on its domain's sandbox image once and registers it."""
    return ctx.templates.get(template_name(task)).name


@dataclass(frozen=True)
class _Slots:
    """Which samples a start runs: ``reuse`` (live episodes of the same claim) and ``new``
    (sample indexes to start now); ``claim_id`` owns both (None: ad-hoc)."""

    claim_id: str | None
    group_id: str | None
    reuse: list[Episode]
    new: list[int]
    job_id: str | None = None  # the work item's job (None: ad-hoc)


def _slots(
    ctx: ServiceContext,
    principal: Principal,
    *,
    task: Task,
    group_size: int,
    job_id: str | None,
    work_item_id: str | None,
    group_id: str | None,
) -> _Slots:
    """The samples to run. For a work item: it must be under a live claim; samples with an
    ``ok`` record are done, live episodes of this claim are reused, and every other sample
    (no record, an error record, or only episodes of a lapsed claim) gets a new episode."""
    if job_id is not None:  # only the job's own tenant may add episodes to it
        scheduler.get_job(ctx.db, principal, job_id)
    if work_item_id is None:
        # A job's groups are its work items': an ad-hoc episode naming a job or a group
        # joined that group's records and moved its advantages (a trial's injection).
        for name, value in (("job_id", job_id), ("group_id", group_id)):
            if value is not None:
                raise InvalidRequest(
                    f"{name} is given only with work_item_id (the group of a claimed work "
                    "item); an ad-hoc episode gets a group of its own",
                    field=name,
                )
        return _Slots(None, None, [], list(range(group_size)))
    item = scheduler.get_item(ctx.db, principal, work_item_id)
    if group_id is not None and group_id != item.group_id:
        raise InvalidRequest(
            f"work item {work_item_id} is group {item.group_id}, not {group_id}",
            field="group_id",
        )
    if job_id is not None and item.job_id != job_id:
        raise InvalidRequest(
            f"work item {work_item_id} is not part of job {job_id}", field="work_item_id"
        )
    claim_id = scheduler.live_claim(ctx.db, work_item_id)
    if claim_id is None:
        raise Conflict(f"work item {work_item_id} is {item.state}, not under a live claim")
    job = scheduler.get_job(ctx.db, principal, item.job_id)
    # The item names its task: a trial started an easy task under a hard task's item and
    # its records completed the item at 1.0.
    want = (plan.item_suite(item, job), item.task_id)
    if (task.suite, task.id) != want:
        raise InvalidRequest(
            f"work item {work_item_id} is task {want[0]}/{want[1]}, not {task.suite}/{task.id}",
            field="task_id",
        )
    with ctx.db.read() as s:
        recorded = scheduler.recorded_samples(s, work_item_id)
        live = (
            s.execute(
                select(Episode).where(
                    Episode.claim_id == claim_id, Episode.state.in_(("running", "verifying"))
                )
            )
            .scalars()
            .all()
        )
    todo = [i for i in range(job.group_size) if recorded.get(i) != "ok"]
    reuse = {ep.sample_idx: ep for ep in live if ep.sample_idx in todo}
    new = [i for i in todo if i not in reuse]
    if not todo:
        raise Conflict(f"every sample of work item {work_item_id} is recorded; complete it")
    reused = sorted(reuse.values(), key=lambda e: e.sample_idx)
    return _Slots(claim_id, item.group_id, reused, new, job_id=item.job_id)


def start(
    ctx: ServiceContext,
    principal: Principal,
    *,
    task_id: str,
    suite: str | None,
    group_size: int,
    ttl_s: int | None,
    job_id: str | None = None,
    work_item_id: str | None = None,
    group_id: str | None = None,
    initial_state: str = "running",
) -> list[StartedEpisode]:
    """Start the episodes of one task's group from an identical state.

    ``initial_state``: ``running`` (a sample: verifiable through the API), or ``replaying``
    (``service.replay``: its own code verifies it, and ``verify`` refuses it).

    Ad hoc (no ``work_item_id``): ``group_size`` new episodes. For a work item (which must
    be under a live claim; its job's group size counts): the samples still without an
    ``ok`` record, reusing live episodes this claim already started, so a repeated call
    starts nothing twice. Each episode belongs to the claim (``claim_id``).

    Raises:
        NotFound: unknown task. QuotaExceeded: the group does not fit the quota.
        Conflict: the work item is not under a live claim, or all its samples are recorded.
        SandboxError: sandboxes could not be started (nothing is left leased).
    """
    if group_size > ctx.settings.max_fork_n:
        raise InvalidRequest(
            f"group_size {group_size} exceeds {ctx.settings.max_fork_n}", field="group_size"
        )
    task = resolve_task(ctx, task_id, suite)
    slots = _slots(
        ctx,
        principal,
        task=task,
        group_size=group_size,
        job_id=job_id,
        work_item_id=work_item_id,
        group_id=group_id,
    )
    reused = [StartedEpisode(ep, task) for ep in slots.reuse]
    if not slots.new:
        return reused
    job_id = slots.job_id or job_id  # a work item's records always carry its job
    t0 = time.perf_counter()
    with builds.on_behalf_of(job_id, tenant_id=principal.tenant_id):  # its build is theirs
        template = ensure_template(ctx, task)
    ttl = ttl_s or int(task.agent_timeout_s + task.verifier_timeout_s + 300)
    meta = {"task_id": task.id, "suite": task.suite, "job_id": job_id}
    n = len(slots.new)
    members = _lease_members(
        ctx, principal, template, n=n, ttl_s=ttl, metadata={**meta, "episode_role": "member"}
    )
    digest = ctx.runtime.image_digest(members[0].image)
    prepared_snapshot = None  # every member starts from the task image itself
    lease_ms = (time.perf_counter() - t0) * 1e3
    group = slots.group_id or new_id("grp")
    out = []
    with ctx.db.session() as s:
        for sample_idx, sb in zip(slots.new, members, strict=True):
            ep = Episode(
                id=new_id("ep"),
                tenant_id=principal.tenant_id,
                job_id=job_id,
                work_item_id=work_item_id,
                group_id=group,
                sample_idx=sample_idx,
                task_id=task.id,
                task_version=task.version,
                suite=task.suite,
                domain=task.domain,
                template=template,
                image_digest=digest,
                sandbox_id=sb.id,
                snapshot_id=prepared_snapshot,
                state=initial_state,
                timing={"lease_ms": round(lease_ms, 3)},
                claim_id=slots.claim_id,
            )
            s.add(ep)
            audit.record(
                s,
                "episode.start",
                tenant_id=principal.tenant_id,
                key_id=principal.key_id,
                sandbox_id=sb.id,
                details={
                    "episode_id": ep.id,
                    "task": task.key,
                    "group_id": group,
                    "sample_idx": sample_idx,
                    "task_version": task.version,
                    "claim_id": slots.claim_id,
                },
            )
            out.append(StartedEpisode(ep, task))
    return sorted(reused + out, key=lambda e: e.episode.sample_idx)


SNAPSHOT_WAIT_S = 60.0
"""Longest wait of ``verify`` for a snapshot of the episode's sandbox to finish."""


def _wait_out_snapshot(ctx: ServiceContext, sandbox_id: str) -> None:
    """Wait (at most ``SNAPSHOT_WAIT_S``) while the sandbox is ``snapshotting``: a runner's
    checkpoint may still be committing when it asks for the verdict."""
    deadline = time.monotonic() + SNAPSHOT_WAIT_S
    while time.monotonic() < deadline:
        with ctx.db.read() as s:
            state = s.execute(select(Sandbox.state).where(Sandbox.id == sandbox_id)).scalar()
        if state != "snapshotting":
            return
        time.sleep(0.1)


def refuse_while_verifying(ctx: ServiceContext, sandbox_id: str) -> None:
    """``Conflict`` when an episode on ``sandbox_id`` is being verified: the tenant may not
    release or snapshot its end state away under the verifier (a trial turned its 0s into
    errors that way)."""
    with ctx.db.read() as s:
        busy = s.execute(
            select(Episode.id).where(Episode.sandbox_id == sandbox_id, Episode.state == "verifying")
        ).scalar()
    if busy is not None:
        raise Conflict(f"sandbox {sandbox_id}: its episode {busy} is being verified")


def _tenants_doing(
    ctx: ServiceContext, ep: Episode, task: Task, result: VerifierResult
) -> VerifierResult:
    """``result`` (an error), or a 0 when what made verification fail was the tenant's:
    its sandbox released (``DELETE``), its lease run out, or its snapshot still committing
    after ``SNAPSHOT_WAIT_S``, before or during verification.
    ``status=error`` is excluded from loss, so it must never be something a tenant's call
    can produce (a trial released the sandbox, then verified). A sandbox Crucible itself
    failed (``failed``: lost across a restart) stays an error."""
    with ctx.db.read() as s:
        row = s.get(Sandbox, ep.sandbox_id)
    state = row.state if row is not None else "released"
    if state == "leased" and row is not None and row.expires_at and row.expires_at <= utcnow():
        state = "expired"  # run out, not yet swept
    dodges = {
        "released": "sandbox_released",
        "expired": "lease_expired",
        # a tenant's snapshot still committing after SNAPSHOT_WAIT_S (a trial made one take
        # 88 s with 700,000 empty files)
        "snapshotting": "snapshot_in_flight",
    }
    if state not in dodges:
        return result
    dodge = dodges[state]
    reason = (
        f"the episode's sandbox was {state} before its end state could be verified "
        f"({result.details.get('reason', 'no verdict')})"
    )
    return VerifierResult(
        name=task.verifier,
        version=result.version,
        status="ok",
        reward=0.0,
        details={"dodge": dodge, "reason": reason, "passed": False},
    )


def _lease_members(
    ctx: ServiceContext,
    principal: Principal,
    template: str,
    *,
    n: int,
    ttl_s: int,
    metadata: dict[str, Any],
) -> list[Sandbox]:
    """``n`` sandboxes of ``template`` for a group, all or nothing
    (``sandboxes.lease_many``).

    Every member starts from the task image, which is the group's identical start by
    construction. Groups used to fork from a snapshot of a prepared sandbox; a red-team
    trial exec'd into that sandbox through the API before it was snapshotted, and what it
    planted became every member's image *and* the image the verifier took as pristine
    (never in a diff, older than the replay window): 1.0 on six tasks unsolved. Nothing a
    tenant can reach now precedes the verifier's pristine image.
    """
    if n == 1:
        return [sandboxes.lease(ctx, principal, template=template, ttl_s=ttl_s, metadata=metadata)]
    return sandboxes.lease_many(
        ctx, principal, template=template, n=n, ttl_s=ttl_s, metadata=metadata
    )


def get(ctx: ServiceContext, principal: Principal, episode_id: str) -> Episode:
    """The tenant's episode (``NotFound`` otherwise)."""
    with ctx.db.read() as s:
        ep = s.get(Episode, episode_id)
    if ep is None or (ep.tenant_id != principal.tenant_id and not principal.is_admin):
        raise NotFound(f"no episode {episode_id!r}", field="episode_id")
    return ep


def _tenant_work_zero(task: Task, what: str) -> VerifierResult:
    """A 0 for an end state the tenant's own engine work kept from settling
    (``dodge: tenant_work_in_flight``)."""
    return VerifierResult(
        name=task.verifier,
        version="",
        status="ok",
        reward=0.0,
        details={
            "dodge": "tenant_work_in_flight",
            "reason": "a files upload or download the tenant sent was still inside the "
            f"engine {sandboxes.TENANT_WORK_SETTLE_S:g} s after the sandbox was taken for "
            f"verification ({what})",
            "passed": False,
        },
    )


def run_verifier(
    ctx: ServiceContext, principal: Principal, ep: Episode, task: Task, sandbox: Sandbox
) -> tuple[VerifierResult, str | None]:
    """Freeze the episode's sandbox and verify its end state; returns the result and, with
    ``keep_episode_snapshots``, the id of the end state's snapshot (else None)."""
    verifier = verifier_registry.get(task.verifier)
    snapshot_id = None
    # The tenant's own work in the engine (a files PUT or GET it sent before the take)
    # holds the container's lock, which the freeze needs, for as long as the tenant made it
    # (a trial: minutes, and the freeze's timeout was an error record, re-rolled). Waited
    # for briefly; still running, the end state never settled by the tenant's doing: a 0.
    if not sandboxes.settle_tenant_work(ctx, sandbox.id):
        return _tenant_work_zero(task, "still running"), snapshot_id
    try:
        ctx.runtime.freeze(sandbox.container_id)
    except CrucibleError as e:
        if sandboxes.tenant_engine_busy(ctx, sandbox.id):
            return _tenant_work_zero(task, f"the freeze failed: {e.detail}"), snapshot_id
        return VerifierResult(
            name=task.verifier,
            version="",
            status="error",
            reward=None,
            details={"reason": f"freezing the end state failed: {e.detail}"},
        ), snapshot_id
    if ctx.settings.keep_episode_snapshots:
        # A kept snapshot is a convenience, never a condition of the verdict: one refused
        # (the tenant's snapshot quota full: a trial made every verify an error that way)
        # leaves the record without it.
        try:
            snapshot_id = sandboxes.snapshot(ctx, principal, sandbox.id, verified=True).id
        except CrucibleError as e:
            log.warning("episode %s: end-state snapshot not kept: %s", ep.id, e.detail)
    template = ctx.templates.get(ep.template)
    end = EndState(
        runtime=ctx.runtime,
        episode_container_id=sandbox.container_id,
        pristine_image=ep.image_digest,  # the image id survives the prepared snapshot's untag
        template=template,
        deployment=ctx.settings.deployment,
        fresh_sandbox=lambda: _fresh_sandbox(ctx, ep, template),
        dispose=ctx.pools.destroy_container_async,
    )
    # the bounded workers it uses count against the episode's tenant (fairslots)
    with (
        tracing.span(f"verifier.{task.verifier}", domain=task.domain),
        fairslots.on_behalf_of(ep.tenant_id),
    ):
        try:
            return verifier(task, end), snapshot_id
        except Exception as e:  # a verifier bug: a record of it, never a 500 and a stuck episode
            log.exception("episode %s: the %s verifier raised", ep.id, task.verifier)
            return VerifierResult(
                name=task.verifier,
                version="",
                status="error",
                reward=None,
                details={"reason": f"the verifier failed: {type(e).__name__}: {e}"[:2000]},
            ), snapshot_id


def _fresh_sandbox(ctx: ServiceContext, ep: Episode, template: Template) -> str:
    """A started, untouched container of the episode's pristine image: a warm one of the
    task's pool when the episode started from the task image (no prepared snapshot), else a
    new one."""
    net = verifier_network.policy_for(ctx.settings, resolve_task(ctx, ep.task_id, ep.suite))
    if ep.snapshot_id is None and net.network == "none":  # warm ones have the agent's network
        cid = ctx.pools.take_warm(
            template.name,
            image_id=ep.image_digest,
            purpose={"verifier_of": ep.id, "task_id": ep.task_id},
        )
        if cid is not None:
            return cid
    spec = spec_for(
        template,
        new_id("vf"),
        ctx.settings.deployment,
        image=ep.image_digest,
        replica=ctx.pools.replica_id,
    )
    if net.network != "none":  # the verifier network policy: this sandbox only
        spec = dataclasses.replace(spec, network=net.network, env={**spec.env, **net.env})
    cid = ctx.runtime.create(spec)
    if net.ca_bundle is not None:
        verifier_network.place_ca(ctx.runtime, cid, net.ca_bundle)
    return cid


@tracing.traced("episode.verify")
def verify(
    ctx: ServiceContext, principal: Principal, episode_id: str, *, trajectory: dict[str, Any]
) -> rewards.RewardRecord:
    """Verify an episode into its reward record (stored once; a repeat returns the same).

    ``trajectory`` carries what the worker knows: ``policy``, ``stop_reason``, ``turns``,
    token ids, ``loss_mask``, ``rollout_logprobs`` and ``timing`` (queue, policy, env ms).
    The episode's sandbox is released afterwards.

    Raises:
        NotFound: unknown episode. Conflict: the episode is being verified by another call.
        InvalidRequest: the trajectory does not make a valid record (names the field).
    """
    ep = get(ctx, principal, episode_id)
    if ep.state in ("verified", "error"):
        stored = rewards.by_episode(ctx.db, episode_id)
        if stored is not None:
            # A server killed after storing the record but before releasing the sandbox
            # (a crash trial): the retried verify releases it now (idempotent).
            _finish(ctx, principal, ep, None)
            return stored
    done = _recorded_elsewhere(ctx, principal, ep)
    if done is not None:
        return done
    trajectory = _with_jobs_policy(ctx, ep, trajectory)
    # A bad trajectory is refused before any verification work (a placeholder verdict).
    build_record(
        ep,
        VerifierResult(name="check", version="", status="ok", reward=0.0),
        trajectory=trajectory,
        verify_ms=0.0,
        snapshot_id=None,
    )
    with ctx.db.session() as s:
        got = s.execute(
            update(Episode)
            .where(Episode.id == episode_id, Episode.state == "running")
            .values(state="verifying")
            .execution_options(synchronize_session=False)
        ).rowcount
    if not got:
        raise Conflict(f"episode {episode_id} is {ep.state}, not running")
    task = resolve_task(ctx, ep.task_id, ep.suite)
    t0 = time.perf_counter()
    snapshot_id = None
    sandbox = None
    try:
        _wait_out_snapshot(ctx, ep.sandbox_id)
        # the sandbox is the verifier's now: every tenant call on it is refused
        sandbox = sandboxes.take_for_verification(ctx, principal, ep.sandbox_id)
        result, snapshot_id = run_verifier(ctx, principal, ep, task, sandbox)
    except (Conflict, NotFound) as e:
        result = VerifierResult(
            name=task.verifier,
            version="",
            status="error",
            reward=None,
            details={"reason": f"the episode's sandbox is gone: {e.detail}"},
        )
    if result.status == "error":
        result = _tenants_doing(ctx, ep, task, result)
    verify_ms = (time.perf_counter() - t0) * 1e3
    observe_verification(task.domain, result, duration_s=verify_ms / 1e3)
    tracing.set_attributes(domain=task.domain, verifier=task.verifier, status=result.status)
    try:
        record = record_verdict(
            ep, result, trajectory=trajectory, verify_ms=verify_ms, snapshot_id=snapshot_id
        )
    except InvalidRequest:
        # The worker sent a bad trajectory: nothing is stored, the episode stays verifiable
        # (its sandbox runs again), and the end-state snapshot taken for this attempt goes.
        if sandbox is not None:
            with contextlib.suppress(CrucibleError):
                ctx.runtime.thaw(sandbox.container_id)
        with ctx.db.session() as s:
            s.execute(
                update(Episode)
                .where(Episode.id == episode_id)
                .values(state="running")
                .execution_options(synchronize_session=False)
            )
            sandboxes.hand_back(s, [ep.sandbox_id])
        if snapshot_id:
            sandboxes.delete_snapshot(ctx, principal, snapshot_id)
        raise
    with ctx.db.session() as s:
        row = rewards.store(
            s,
            record,
            tenant_id=principal.tenant_id,
            work_item_id=ep.work_item_id,
            replace_error=_may_replace(s, ep),
        )
        s.execute(
            update(Episode)
            .where(Episode.id == episode_id)
            .values(
                state="verified" if record.verifier.status == "ok" else "error",
                snapshot_id=snapshot_id,
                ended_at=utcnow(),
                timing={**ep.timing, "verify_ms": round(verify_ms, 3)},
            )
            .execution_options(synchronize_session=False)
        )
        audit.record(
            s,
            "episode.verify",
            tenant_id=principal.tenant_id,
            key_id=principal.key_id,
            sandbox_id=ep.sandbox_id,
            details={
                "episode_id": episode_id,
                "status": record.verifier.status,
                "reward": record.reward,
                "record_id": row.record_id,
                "tampered": record.verifier.details.get("tampered", []),
            },
        )
    _finish(ctx, principal, ep, snapshot_id)
    return rewards.to_record(row)


def record_verdict(
    ep: Episode,
    result: VerifierResult,
    *,
    trajectory: dict[str, Any],
    verify_ms: float,
    snapshot_id: str | None,
) -> rewards.RewardRecord:
    """``build_record`` for a verdict read from an end state, which is the agent's to shape.

    Its details are made storable first (``service.text.recordable``: lone surrogates
    escaped, non-finite numbers as strings). A verdict that still makes no valid record
    (a trial put a lone surrogate in an answer's key and every verify answered 400, so the
    sample had no record) scores 0 with ``details["dodge"] = "verdict_unrecordable"``, or
    keeps its own error status without its details.

    Raises:
        InvalidRequest: the trajectory is invalid (names the field).
    """
    result = dataclasses.replace(result, details=recordable(result.details))
    try:
        return build_record(
            ep, result, trajectory=trajectory, verify_ms=verify_ms, snapshot_id=snapshot_id
        )
    except InvalidRequest as e:
        # Raises again when the trajectory is what is invalid (not the verdict's doing).
        build_record(
            ep,
            VerifierResult(name="check", version="", status="ok", reward=0.0),
            trajectory=trajectory,
            verify_ms=verify_ms,
            snapshot_id=snapshot_id,
        )
        details: dict[str, Any] = {"reason": f"the verdict could not be recorded: {e.detail}"}
        if result.status == "ok":
            details["dodge"] = "verdict_unrecordable"
        fallback = VerifierResult(
            name=result.name,
            version=result.version,
            status=result.status,
            reward=0.0 if result.status == "ok" else None,
            details=recordable(details),
        )
        return build_record(
            ep, fallback, trajectory=trajectory, verify_ms=verify_ms, snapshot_id=snapshot_id
        )


def _with_jobs_policy(
    ctx: ServiceContext, ep: Episode, trajectory: dict[str, Any]
) -> dict[str, Any]:
    """``trajectory`` whose policy name is the job's for a job's episode (a trial's worker
    named its records of one job's claim after another policy); the version stays the
    worker's to report (the weights that sampled it), else the job's."""
    if ep.job_id is None:
        return trajectory
    with ctx.db.read() as s:
        declared = s.execute(select(Job.policy).where(Job.id == ep.job_id)).scalar() or {}
    if not declared.get("name"):
        return trajectory
    sent = trajectory.get("policy") or {}
    version = sent.get("version") if isinstance(sent, dict) else None
    policy = {"name": declared["name"], "version": version or declared.get("version", "")}
    return {**trajectory, "policy": policy}


def _recorded_elsewhere(
    ctx: ServiceContext, principal: Principal, ep: Episode
) -> rewards.RewardRecord | None:
    """When another episode of the same sample already holds an ``ok`` record (an earlier
    claim's), this one is superseded: it is abandoned, its sandbox released, and that
    record is the answer (a sample has one record)."""
    if ep.work_item_id is None or ep.state != "running":
        return None
    key = scheduler.sample_key(ep.work_item_id, ep.sample_idx)
    with ctx.db.read() as s:
        row = s.execute(
            select(RewardRecordRow).where(
                RewardRecordRow.sample_key == key, RewardRecordRow.status == "ok"
            )
        ).scalar_one_or_none()
    if row is None or row.episode_id == ep.id:
        return None
    with ctx.db.session() as s:
        s.execute(
            update(Episode)
            .where(Episode.id == ep.id, Episode.state == "running")
            .values(state="abandoned", ended_at=utcnow())
            .execution_options(synchronize_session=False)
        )
        audit.record(
            s,
            "episode.superseded",
            tenant_id=principal.tenant_id,
            key_id=principal.key_id,
            sandbox_id=ep.sandbox_id,
            details={"episode_id": ep.id, "record_id": row.record_id, "sample_key": key},
        )
    _finish(ctx, principal, ep, None)
    return rewards.to_record(row)


def _may_replace(s: Session, ep: Episode) -> bool:
    """A new record may replace the sample's error record only while the episode's claim
    is its work item's current claim (a retry of a failed sample)."""
    if ep.work_item_id is None or ep.claim_id is None:
        return False
    item = s.get(WorkItem, ep.work_item_id)
    return item is not None and item.state == "claimed" and item.claim_id == ep.claim_id


def _finish(
    ctx: ServiceContext, principal: Principal, ep: Episode, snapshot_id: str | None
) -> None:
    with contextlib.suppress(Conflict, NotFound):  # already gone (expired, or released)
        sandboxes.release(ctx, principal, ep.sandbox_id, verified=True)
    if snapshot_id and not ctx.settings.keep_episode_snapshots:
        sandboxes.delete_snapshot(ctx, principal, snapshot_id)


def build_record(
    ep: Episode,
    result: VerifierResult,
    *,
    trajectory: dict[str, Any],
    verify_ms: float,
    snapshot_id: str | None,
) -> rewards.RewardRecord:
    """Assemble the reward record (``InvalidRequest`` naming the field when it is invalid)."""
    from pydantic import ValidationError

    timing = {
        "queue_ms": 0.0,
        "policy_ms": 0.0,
        "env_ms": 0.0,
        **trajectory.get("timing", {}),
        "lease_ms": ep.timing.get("lease_ms", 0.0),
        "verify_ms": round(verify_ms, 3),
    }
    ok = result.status == "ok"
    try:
        return rewards.RewardRecord(
            job_id=ep.job_id,
            episode_id=ep.id,
            group_id=ep.group_id,
            sample_idx=ep.sample_idx,
            task_id=ep.task_id,
            task_version=ep.task_version,
            suite=ep.suite,
            domain=ep.domain,
            template=ep.template,
            image_digest=ep.image_digest,
            policy=trajectory.get("policy") or {"name": "unknown", "version": ""},
            reward=result.reward if ok else None,
            reward_components=result.components,
            verifier={
                "name": result.name,
                "version": result.version,
                "status": result.status,
                "details": result.details,
            },
            stop_reason=trajectory.get("stop_reason", "complete"),
            error=trajectory.get("error"),
            exclude_from_loss=(not ok) or bool(trajectory.get("exclude_from_loss", False)),
            turns=trajectory.get("turns", []),
            instruction=trajectory.get("instruction", ""),
            prompt_messages=trajectory.get("prompt_messages", []),
            prompt_ids=trajectory.get("prompt_ids", []),
            response_ids=trajectory.get("response_ids", []),
            loss_mask=trajectory.get("loss_mask", []),
            rollout_logprobs=trajectory.get("rollout_logprobs", []),
            missing=trajectory.get("missing", []),
            missing_reason=trajectory.get("missing_reason"),
            timing=timing,
            sandbox_id=ep.sandbox_id,
            snapshot_id=snapshot_id,
            resumed_from=(ep.timing or {}).get("resumed", {}).get("checkpoint_id"),
        )
    except ValidationError as e:
        first = e.errors()[0]
        field = ".".join(str(x) for x in first["loc"]) or "trajectory"
        raise InvalidRequest(f"trajectory: {field}: {first['msg']}", field=field) from e
