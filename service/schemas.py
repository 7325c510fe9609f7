"""Pydantic schemas of the REST API v1, shared by the server and ``policy_client``.

Bytes travel two ways: as text (UTF-8; invalid sequences become U+FFFD) and, on request,
as base64 (``*_b64`` fields) so nothing is lost.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
)

from service.scheduler.spec import Schedule
from service.text import find_unencodable

# A float must be finite: PostgreSQL's json refuses NaN and the infinities (a lease with
# {"x": NaN} was a 500 there; SQLite stored null)
MetadataValue = str | int | Annotated[float, Field(allow_inf_nan=False)] | bool | None

# Metadata keys the service writes and acts on: recovery releases a leased sandbox whose
# ``episode_role`` names a group start that no live episode owns, so a tenant's own key of
# that name would have its ad-hoc sandbox taken from it. A tenant's metadata may not set them.
RESERVED_METADATA_KEYS = frozenset({"episode_role"})


def _tenant_metadata(value: dict[str, MetadataValue]) -> dict[str, MetadataValue]:
    """Refuse the keys the service reserves (``RESERVED_METADATA_KEYS``)."""
    if reserved := sorted(RESERVED_METADATA_KEYS & value.keys()):
        raise ValueError(f"metadata key {reserved[0]!r} is reserved for the service")
    return value


def _no_nul(value: str | None) -> str | None:
    """Refuse U+0000 in text stored in (or compared with) a text column: PostgreSQL refuses
    it, a 500 there (worker, error, ids)."""
    if value is not None and "\x00" in value:
        raise ValueError("must not contain a NUL character (U+0000)")
    return value


NoNul = Annotated[str, AfterValidator(_no_nul)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")

    @field_validator("*", mode="after")
    @classmethod
    def _valid_text(cls, value: Any, info: ValidationInfo) -> Any:
        """Refuse lone surrogates anywhere in a field (see ``service.text``)."""
        if (bad := find_unencodable(value)) is not None:
            where = info.field_name if bad == "value" else f"{info.field_name}.{bad}"
            raise ValueError(f"{where} is not valid Unicode text (a lone surrogate)")
        return value


class LimitsIn(_Model):
    """Per-lease overrides of the template's limits (checked against the tenant's quota)."""

    cpus: float | None = Field(None, gt=0, le=64)
    memory_mb: int | None = Field(None, ge=16, le=256 * 1024)


class LeaseRequest(_Model):
    """``POST /v1/sandboxes``: lease one sandbox of ``template`` for ``ttl_s`` seconds."""

    template: str = Field(min_length=1, max_length=64)
    limits: LimitsIn | None = None
    ttl_s: int | None = Field(None, ge=1, description="Lease length; default from settings.")
    metadata: dict[str, MetadataValue] = Field(default_factory=dict, max_length=64)

    _metadata = field_validator("metadata")(_tenant_metadata)


class SandboxOut(_Model):
    """A sandbox as its tenant sees it."""

    id: str
    template: str
    state: Literal[
        "starting", "warm", "leased", "snapshotting", "verifying", "released", "expired", "failed"
    ]
    image: str
    cpus: float
    memory_mb: int
    created_at: datetime
    leased_at: datetime | None
    expires_at: datetime | None
    ended_at: datetime | None
    metadata: dict[str, Any]
    source_snapshot_id: str | None = None
    failure: str | None = None


class SandboxList(_Model):
    """``GET /v1/sandboxes``."""

    sandboxes: list[SandboxOut]


class ExecIn(_Model):
    """``POST /v1/sandboxes/{id}/exec``.

    ``cmd``: a shell string (``/bin/sh -c``) or an argv list. ``env``/``stdin`` as text
    (sent as UTF-8 bytes exactly) or ``env_b64``/``stdin_b64`` for arbitrary bytes.
    ``max_output_bytes`` caps each of stdout and stderr (head and tail kept).
    """

    cmd: str | list[str] = Field(min_length=1)
    timeout_s: float = Field(60.0, gt=0, le=24 * 3600)
    cwd: str | None = Field(None, min_length=1, max_length=4096)
    env: dict[str, str] = Field(default_factory=dict, max_length=256)
    env_b64: dict[str, str] = Field(default_factory=dict, max_length=256)
    stdin: str | None = None
    stdin_b64: str | None = None
    max_output_bytes: int | None = Field(None, ge=0)
    output_b64: bool = Field(False, description="Also return raw stdout/stderr as base64.")
    user: str | None = Field(
        None,
        min_length=1,
        max_length=256,
        description="Run as this user (name, uid or uid:gid); default the template's user. "
        "Another user than the template's is 403 unless the template allows root.",
    )


class ExecOut(_Model):
    """How a command ended. ``exit_code`` is 128+N when killed by signal N."""

    exit_code: int
    signal: int | None
    timed_out: bool
    oom_killed: bool
    pids_limit_hit: bool = Field(
        False, description="A fork was refused at the sandbox's pids limit meanwhile."
    )
    disk_limit_hit: bool = Field(
        False, description="The sandbox went over its disk budget meanwhile; writers killed."
    )
    stdout: str
    stderr: str
    stdout_b64: str | None = None
    stderr_b64: str | None = None
    stdout_bytes: int = Field(description="Total bytes the command wrote to stdout.")
    stderr_bytes: int
    stdout_truncated: bool
    stderr_truncated: bool
    duration_ms: float
    handler_lost: bool = Field(
        False,
        description="The command's handler was killed inside the sandbox (by its own "
        "processes, e.g. kill -9 -1, or its memory limit) before it could report: the "
        "command counts as killed (exit_code 137), the output is what arrived before.",
    )


class ExecStreamLine(_Model):
    """One NDJSON line of a streaming exec: output chunks, then one ``result``."""

    type: Literal["stdout", "stderr", "result"]
    data: str | None = None
    data_b64: str | None = None
    result: ExecOut | None = None


class HeartbeatIn(_Model):
    """``POST /v1/sandboxes/{id}/heartbeat``: extend the lease to now + ``ttl_s``."""

    ttl_s: int | None = Field(None, ge=1)


class FileOut(_Model):
    """Result of an upload."""

    path: str
    bytes: int
    kind: Literal["file", "tar"]


class SnapshotOut(_Model):
    """A filesystem snapshot of a sandbox. ``bytes`` (its writable layer) counts against
    the tenant's snapshot quota until it is deleted or expires at ``expires_at``."""

    id: str
    sandbox_id: str
    template: str
    created_at: datetime
    bytes: int = 0
    expires_at: datetime | None = None


class ForkIn(_Model):
    """``POST /v1/snapshots/{id}/fork``: start ``n`` sandboxes from the snapshot."""

    n: int = Field(1, ge=1)
    ttl_s: int | None = Field(None, ge=1)
    metadata: dict[str, MetadataValue] = Field(default_factory=dict, max_length=64)

    _metadata = field_validator("metadata")(_tenant_metadata)


class ForkOut(_Model):
    """The sandboxes a fork started, in order."""

    snapshot_id: str
    sandboxes: list[SandboxOut]


class TemplateOut(_Model):
    """A template (sandbox recipe)."""

    name: str
    image: str
    description: str
    cpus: float
    memory_mb: int
    pids_limit: int
    nofile: int
    disk_mb: int
    network: str
    workdir: str
    files_root: str
    user: str
    uid: int
    gid: int
    allow_root: bool


class PoolOut(_Model):
    """Warm-pool levels of one template."""

    template: str
    target: int
    warm: int
    starting: int
    leased: int


class PoolIn(_Model):
    """``PUT /v1/pools/{template}``."""

    target_size: int = Field(ge=0, le=1000)


class AuditEventOut(_Model):
    """One audit event (hash-chained; see ``crucible audit verify``)."""

    seq: int
    ts: str
    tenant_id: str | None
    key_id: str | None
    action: str
    sandbox_id: str | None
    details: dict[str, Any]
    prev_hash: str
    hash: str


class AuditPage(_Model):
    """A page of audit events; pass ``next_after`` as ``after`` for the next page."""

    events: list[AuditEventOut]
    next_after: int | None


class Problem(BaseModel):
    """RFC 9457 problem details (``application/problem+json``)."""

    type: str = "about:blank"
    title: str
    status: int
    detail: str
    instance: str | None = None
    field: str | None = None
    errors: list[dict[str, Any]] | None = None
    request_id: str | None = Field(
        None, description="The request's id (also the X-Request-ID response header)."
    )


class TaskOut(_Model):
    """A task as workers see it (no tests, no solution)."""

    id: str
    suite: str
    domain: str
    version: str
    format: str
    instruction: str
    agent_timeout_s: float
    verifier_timeout_s: float
    workdir: str
    metadata: dict[str, Any]


class TaskList(_Model):
    """``GET /v1/tasks``; ``errors`` lists malformed tasks the server skipped."""

    tasks: list[TaskOut]
    errors: list[str] = Field(default_factory=list)


class EpisodeIn(_Model):
    """``POST /v1/episodes``: start ``group_size`` episodes of one task from one state."""

    task_id: NoNul = Field(min_length=1, max_length=400)
    suite: NoNul | None = Field(None, max_length=200)
    group_size: int = Field(1, ge=1)
    ttl_s: int | None = Field(None, ge=1)
    job_id: NoNul | None = Field(None, max_length=40)
    work_item_id: NoNul | None = Field(None, max_length=40)
    group_id: NoNul | None = Field(None, max_length=40)


class EpisodeOut(_Model):
    """One started episode: act in ``sandbox_id``, in ``workdir``, on ``instruction``."""

    id: str
    group_id: str
    sample_idx: int
    task_id: str
    suite: str
    domain: str
    task_version: str
    sandbox_id: str
    state: str
    instruction: str
    workdir: str
    agent_timeout_s: float
    job_id: str | None = None


class EpisodeGroupOut(_Model):
    """The episodes of one group, in sample order."""

    group_id: str
    episodes: list[EpisodeOut]


class PolicyIn(_Model):
    """Which policy acted."""

    name: str = Field(min_length=1, max_length=200)
    version: str = Field("", max_length=200)


class TurnIn(_Model):
    """One turn's summary: the action and how its exec ended; in a session episode also the
    keys sent and the screen read after them."""

    action: str
    exit_code: int | None = None
    duration_ms: float = Field(0.0, ge=0)
    truncated: bool = False
    keys: list[str] = Field(default_factory=list, max_length=1024)
    screen: str | None = Field(None, max_length=1 << 18)


class TimingIn(_Model):
    """What the worker measured, in milliseconds."""

    queue_ms: float = Field(0.0, ge=0)
    policy_ms: float = Field(0.0, ge=0)
    env_ms: float = Field(0.0, ge=0)


class MessageIn(_Model):
    """One chat message of the prompt."""

    role: str = Field(min_length=1, max_length=32)
    content: str


class VerifyIn(_Model):
    """``POST /v1/episodes/{id}/verify``: the trajectory the worker recorded."""

    policy: PolicyIn
    stop_reason: Literal[
        "complete", "max_turns", "agent_timeout", "context_length", "sandbox_stopped", "error"
    ] = "complete"
    error: str | None = Field(None, max_length=4000)  # stop_reason "error": what failed
    exclude_from_loss: bool = False
    turns: list[TurnIn] = Field(default_factory=list)
    instruction: str = ""  # the task instruction the policy was given
    prompt_messages: list[MessageIn] = Field(default_factory=list)  # the chat prompt_ids render
    prompt_ids: list[int] = Field(default_factory=list)
    response_ids: list[int] = Field(default_factory=list)
    loss_mask: list[int] = Field(default_factory=list)
    rollout_logprobs: list[float] = Field(default_factory=list)
    missing: list[Literal["token_ids", "logprobs"]] = Field(default_factory=list)
    missing_reason: str | None = Field(None, max_length=1000)
    timing: TimingIn = Field(default_factory=TimingIn)


class JobIn(_Model):
    """``POST /v1/jobs``: tasks x group size for one policy (all of ``suite`` by default).

    A mixed-domain job leaves ``suite`` and ``task_ids`` out and names its domains in
    ``schedule.mix``; ``schedule`` also selects budgets, limits, stragglers and staleness.
    """

    suite: str | None = Field(None, min_length=1, max_length=200)
    task_ids: list[str] | None = Field(None, max_length=10000)
    group_size: int = Field(1, ge=1)
    priority: int = Field(0, ge=-1000, le=1000)
    policy: PolicyIn
    max_attempts: int = Field(3, ge=1, le=20)
    schedule: Schedule | None = None


class JobOut(_Model):
    """A job and its progress."""

    id: str
    suite: str
    task_ids: list[str]
    group_size: int
    priority: int
    policy: dict[str, Any]
    max_attempts: int
    state: str
    created_at: datetime
    finished_at: datetime | None
    progress: dict[str, Any]
    schedule: dict[str, Any] | None = None
    policy_version: int | None = None


class ClaimIn(_Model):
    """``POST /v1/jobs/{id}/claim``."""

    worker: NoNul = Field(min_length=1, max_length=200)
    lease_s: float = Field(
        60.0,
        gt=0,
        le=24 * 3600,
        description="Seconds the claim holds without a heartbeat; when it lapses, the "
        "claim's episodes are abandoned, their sandboxes released and the item re-queued.",
    )
    policy_version: int | None = Field(
        None,
        ge=0,
        description="The policy version that samples this claim (a job's max_staleness "
        "refuses or flags claims that far behind the newest version it has seen).",
    )


class WorkItemOut(_Model):
    """A claimed unit of work: run ``group_size`` episodes of ``task_id`` as ``group_id``."""

    id: str
    job_id: str
    task_id: str
    group_id: str
    state: str
    attempts: int
    claim_expires_at: datetime | None
    last_error: str | None
    created_at: datetime
    group_size: int
    claim_id: str | None = None
    claims: int = 0
    suite: str
    policy: dict[str, Any]
    policy_version: int | None = None


class CompleteIn(_Model):
    """``POST /v1/work-items/{id}/complete``."""

    worker: NoNul = Field(min_length=1, max_length=200)
    ok: bool
    error: NoNul | None = Field(None, max_length=10000)
    cause: Literal["policy", "verifier", "infrastructure"] = Field(
        "policy",
        description="Why a failed attempt failed: only the policy's or the verifier's failures "
        "use up an attempt; ``infrastructure`` re-queues the item without using one.",
    )
