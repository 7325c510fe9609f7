"""SQLAlchemy 2 models. Times are timezone-aware UTC; ids are prefixed strings (``sb_...``)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator


def utcnow() -> datetime:
    """Current time, timezone-aware UTC."""
    return datetime.now(UTC)


class UTCDateTime(TypeDecorator[datetime]):
    """A DateTime that always comes back timezone-aware UTC (SQLite drops the zone)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is not None and value.tzinfo is None:
            raise ValueError("naive datetime")
        return value.astimezone(UTC) if value is not None else None

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is not None and value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value


# Snapshot quota of a tenant made without one (and of tenants that predate it, migration 0004).
DEFAULT_MAX_SNAPSHOTS = 64
DEFAULT_MAX_SNAPSHOT_BYTES = 20 << 30


class Base(DeclarativeBase):
    """Declarative base of every Crucible table."""


class Tenant(Base):
    """Who calls. Quota limits and the usage reserved against them (kept in the same row so a
    reservation is one guarded UPDATE)."""

    __tablename__ = "tenants"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    max_sandboxes: Mapped[int] = mapped_column(Integer)
    max_cpus: Mapped[float] = mapped_column(Float)
    max_memory_mb: Mapped[int] = mapped_column(BigInteger)
    used_sandboxes: Mapped[int] = mapped_column(Integer, default=0)
    used_cpus: Mapped[float] = mapped_column(Float, default=0.0)
    used_memory_mb: Mapped[int] = mapped_column(BigInteger, default=0)
    # Snapshots held (not deleted or expired) and their bytes (the writable layer committed).
    max_snapshots: Mapped[int] = mapped_column(Integer, default=DEFAULT_MAX_SNAPSHOTS)
    max_snapshot_bytes: Mapped[int] = mapped_column(BigInteger, default=DEFAULT_MAX_SNAPSHOT_BYTES)
    used_snapshots: Mapped[int] = mapped_column(Integer, default=0)
    used_snapshot_bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class ApiKey(Base):
    """An API key: ``cr_<id>_<secret>``; only sha256(secret) is stored."""

    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"), index=True)
    secret_sha256: Mapped[str] = mapped_column(String(64))
    scopes: Mapped[str] = mapped_column(String(200), default="")
    name: Mapped[str] = mapped_column(String(200), default="")
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)


class Sandbox(Base):
    """One container made from a template, and its lease.

    States: starting -> warm -> leased -> (snapshotting -> leased) -> released | expired |
    failed. A sandbox leased cold goes starting -> leased. Every transition is an UPDATE
    guarded by the expected state.
    """

    __tablename__ = "sandboxes"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    deployment: Mapped[str] = mapped_column(String(64))
    template: Mapped[str] = mapped_column(String(64))
    image: Mapped[str] = mapped_column(String(300))
    container_id: Mapped[str | None] = mapped_column(String(80), nullable=True)
    state: Mapped[str] = mapped_column(String(16))
    tenant_id: Mapped[str | None] = mapped_column(ForeignKey("tenants.id"), nullable=True)
    cpus: Mapped[float] = mapped_column(Float)
    memory_mb: Mapped[int] = mapped_column(BigInteger)
    ttl_s: Mapped[int | None] = mapped_column(Integer, nullable=True)
    metadata_: Mapped[dict[str, Any]] = mapped_column("metadata", JSON, default=dict)
    source_snapshot_id: Mapped[str | None] = mapped_column(String(40), nullable=True)
    failure: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    leased_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    ended_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)

    __table_args__ = (
        Index("ix_sandboxes_pool", "deployment", "template", "state"),
        Index("ix_sandboxes_tenant", "tenant_id", "state"),
        Index("ix_sandboxes_expiry", "state", "expires_at"),
    )


class Snapshot(Base):
    """A frozen filesystem image of a sandbox (``docker commit``)."""

    __tablename__ = "snapshots"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    deployment: Mapped[str] = mapped_column(String(64))
    sandbox_id: Mapped[str] = mapped_column(ForeignKey("sandboxes.id"), index=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"), index=True)
    template: Mapped[str] = mapped_column(String(64))
    image: Mapped[str] = mapped_column(String(300))
    image_id: Mapped[str] = mapped_column(String(100))
    bytes: Mapped[int] = mapped_column(BigInteger, default=0)  # charged to the tenant's quota
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    deleted_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)

    __table_args__ = (Index("ix_snapshots_expiry", "deleted_at", "expires_at"),)


class Pool(Base):
    """Warm-pool target size per template (overrides the configured default)."""

    __tablename__ = "pools"

    deployment: Mapped[str] = mapped_column(String(64), primary_key=True)
    template: Mapped[str] = mapped_column(String(64), primary_key=True)
    target_size: Mapped[int] = mapped_column(Integer)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class RefillFence(Base):
    """The newest fencing token that wrote a template's warm pool (the storage side of the
    refill lock's fencing, Kleppmann, "How to do distributed locking", 2016).

    Every write the refill lock protects (``service.pool.advance_fence``: a refill's
    ``starting`` row, its flip to ``warm``, a trim) first raises ``token`` to the writer's
    own in the same transaction and is refused when a larger one is stored, so a holder whose
    lock lapsed (paused past its TTL) writes nothing after a newer holder did. ``token`` is
    the Redis ``INCR fence:<template>`` value; writes without a token (one process, the
    advisory-lock fallback) leave the row alone.
    """

    __tablename__ = "refill_fences"

    deployment: Mapped[str] = mapped_column(String(64), primary_key=True)
    template: Mapped[str] = mapped_column(String(64), primary_key=True)
    token: Mapped[int] = mapped_column(BigInteger)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class AuditChain(Base):
    """The single head row of the audit hash chain; updating it serializes appenders."""

    __tablename__ = "audit_chain"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    seq: Mapped[int] = mapped_column(BigInteger, default=0)
    last_hash: Mapped[str] = mapped_column(String(64))


class AuditEvent(Base):
    """One append-only, hash-chained event (see ``service.audit``)."""

    __tablename__ = "audit_events"

    seq: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    ts: Mapped[str] = mapped_column(String(40), index=True)  # ISO 8601 UTC, microseconds
    tenant_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    key_id: Mapped[str | None] = mapped_column(String(32), nullable=True)
    action: Mapped[str] = mapped_column(String(64))
    sandbox_id: Mapped[str | None] = mapped_column(String(40), nullable=True)
    details: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    prev_hash: Mapped[str] = mapped_column(String(64))
    hash: Mapped[str] = mapped_column(String(64))

    __table_args__ = (
        Index("ix_audit_tenant", "tenant_id", "seq"),
        Index("ix_audit_sandbox", "sandbox_id", "seq"),
        Index("ix_audit_action", "action", "seq"),
    )


class Episode(Base):
    """One attempt at one task by one policy, in one sandbox; ``group_id`` ties a GRPO group.

    States: running -> verifying -> verified | error; abandoned when released unverified.
    """

    __tablename__ = "episodes"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"), index=True)
    job_id: Mapped[str | None] = mapped_column(String(40), nullable=True, index=True)
    work_item_id: Mapped[str | None] = mapped_column(String(40), nullable=True)
    group_id: Mapped[str] = mapped_column(String(40), index=True)
    sample_idx: Mapped[int] = mapped_column(Integer)
    task_id: Mapped[str] = mapped_column(String(200))
    task_version: Mapped[str] = mapped_column(String(64))
    suite: Mapped[str] = mapped_column(String(200))
    domain: Mapped[str] = mapped_column(String(32))
    template: Mapped[str] = mapped_column(String(64))
    image_digest: Mapped[str] = mapped_column(String(100))
    sandbox_id: Mapped[str] = mapped_column(String(40))
    snapshot_id: Mapped[str | None] = mapped_column(String(40), nullable=True)
    state: Mapped[str] = mapped_column(String(16))
    timing: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    ended_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    # the work-item claim this episode runs under (None for ad-hoc episodes): when that
    # claim lapses the episode is abandoned and its sandbox released
    claim_id: Mapped[str | None] = mapped_column(String(40), nullable=True)

    __table_args__ = (
        Index("ix_episodes_claim", "claim_id"),
        Index("ix_episodes_item", "work_item_id", "sample_idx"),
        Index("ix_episodes_state", "state"),
    )


class RewardRecordRow(Base):
    """A stored reward record: indexed columns for queries, the whole record as JSON."""

    __tablename__ = "reward_records"

    record_id: Mapped[str] = mapped_column(String(40), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"))
    job_id: Mapped[str | None] = mapped_column(String(40), nullable=True)
    episode_id: Mapped[str] = mapped_column(String(40), unique=True)
    # the record's identity: ``<work_item_id>/<sample_idx>`` for a job's sample,
    # ``ep/<episode_id>`` for an ad-hoc episode (see ``service.rewards.sample_key``)
    sample_key: Mapped[str] = mapped_column(String(200))
    group_id: Mapped[str] = mapped_column(String(40))
    task_id: Mapped[str] = mapped_column(String(200))
    suite: Mapped[str] = mapped_column(String(200))
    domain: Mapped[str] = mapped_column(String(32))
    reward: Mapped[float | None] = mapped_column(Float, nullable=True)
    status: Mapped[str] = mapped_column(String(16))
    exclude_from_loss: Mapped[bool] = mapped_column(default=False)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    record: Mapped[dict[str, Any]] = mapped_column(JSON)

    __table_args__ = (
        Index("ix_rewards_tenant", "tenant_id", "created_at"),
        Index("ix_rewards_job", "job_id"),
        Index("ix_rewards_task", "domain", "task_id", "created_at"),
        UniqueConstraint("sample_key", name="uq_rewards_sample"),
    )


class Job(Base):
    """A rollout job: tasks x group size for one policy, with a priority."""

    __tablename__ = "jobs"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"), index=True)
    suite: Mapped[str] = mapped_column(String(200))
    task_ids: Mapped[list[str]] = mapped_column(JSON)
    group_size: Mapped[int] = mapped_column(Integer)
    priority: Mapped[int] = mapped_column(Integer, default=0)
    policy: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    max_attempts: Mapped[int] = mapped_column(Integer, default=3)
    # queued | running | done | partial | failed | cancelled
    state: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    # the job's schedule (``service.scheduler.spec.Schedule``); None: one suite, FIFO
    schedule: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    # the newest policy version a claim of the job carried (bounded staleness)
    policy_version: Mapped[int | None] = mapped_column(Integer, nullable=True)


class WorkItem(Base):
    """One group of a job (a task x group_size samples) that a worker claims.

    States: queued -> claimed -> done | failed (after ``max_attempts`` real failures); a
    claim whose ``claim_expires_at`` passes goes back to queued without using an attempt.
    ``claim_id`` names the current claim (episodes started under it carry it); ``claims``
    counts claims of any outcome, ``attempts`` only failures of the policy or the verifier.
    """

    __tablename__ = "work_items"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"), index=True)
    task_id: Mapped[str] = mapped_column(String(200))
    group_id: Mapped[str] = mapped_column(String(40))
    priority: Mapped[int] = mapped_column(Integer, default=0)
    state: Mapped[str] = mapped_column(String(16))
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    claimed_by: Mapped[str | None] = mapped_column(String(200), nullable=True)
    claim_expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    last_error: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    claim_id: Mapped[str | None] = mapped_column(String(40), nullable=True)
    claims: Mapped[int] = mapped_column(Integer, default=0, server_default=text("0"))
    suite: Mapped[str | None] = mapped_column(String(200), nullable=True)  # None: the job's
    policy_version: Mapped[int | None] = mapped_column(Integer, nullable=True)
    claimed_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    duration_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    # origin ("budget", "degraded_from"), stragglers, stale: see service.scheduler.core
    meta: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)

    __table_args__ = (
        Index("ix_work_queue", "state", "priority", "created_at"),
        Index("ix_work_items_claim", "claim_id"),
        Index("ix_work_items_expiry", "state", "claim_expires_at"),
    )


class IdempotencyKey(Base):
    """The first answer to a request sent with an ``Idempotency-Key`` header (per tenant).

    ``state`` is ``pending`` while the first request runs (``owner`` is that server's boot
    id: a pending row of another boot was cut off by a crash and may be taken over) and
    ``done`` once ``status_code`` and ``response`` hold the answer replays get.
    """

    __tablename__ = "idempotency_keys"

    tenant_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    key: Mapped[str] = mapped_column(String(200), primary_key=True)
    scope: Mapped[str] = mapped_column(String(300))
    request_sha256: Mapped[str] = mapped_column(String(64))
    state: Mapped[str] = mapped_column(String(16))
    owner: Mapped[str] = mapped_column(String(64))
    status_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    response: Mapped[Any] = mapped_column(JSON, nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)

    __table_args__ = (Index("ix_idempotency_created", "created_at"),)


class Checkpoint(Base):
    """An episode's checkpoint: its sandbox's snapshot plus the runner's trajectory so far
    (``state``: turns, chat, token ids...), after ``turn`` turns; the latest per sample."""

    __tablename__ = "checkpoints"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"))
    work_item_id: Mapped[str] = mapped_column(String(40))
    sample_idx: Mapped[int] = mapped_column(Integer)
    episode_id: Mapped[str] = mapped_column(String(40))
    turn: Mapped[int] = mapped_column(Integer)
    snapshot_id: Mapped[str] = mapped_column(String(40))
    state: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)

    __table_args__ = (UniqueConstraint("work_item_id", "sample_idx", name="uq_checkpoints_sample"),)
