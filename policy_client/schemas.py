"""The API's request and response models as the client sees them (pydantic only).

The client owns these instead of importing the server's (``service.schemas``,
``service.rewards``, ``service.api.rewards``), so ``crucible-client`` installs with httpx
and pydantic alone. ``tests/unit/test_client_schemas.py`` pins every model here to the
server's model of the same name: field names, types, required-ness and defaults, so the two
cannot drift. Value bounds (lengths, ranges) and the record invariants are the server's to
enforce; it answers a violation with a 422 naming the field.

Responses ignore fields they do not know (a newer server may add some); requests forbid
them (a misspelt field fails here, not on the server).
"""

from __future__ import annotations

import secrets
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

SCHEMA_VERSION = "2"
"""The reward-record layout these models read (``docs/records.md``, "Schema versions")."""

READABLE_VERSIONS = ("1", "2")
"""Record versions ``RewardRecord`` reads; older ones are upgraded on read."""

MetadataValue = str | int | float | bool | None
VerifierStatus = Literal["ok", "error", "timeout"]
StopReason = Literal[
    "complete", "max_turns", "agent_timeout", "context_length", "sandbox_stopped", "error"
]
Missing = Literal["token_ids", "logprobs"]


class _Out(BaseModel):
    """A server answer: unknown fields are ignored."""

    model_config = ConfigDict(extra="ignore")


class _In(BaseModel):
    """A request body the client builds: unknown fields are refused."""

    model_config = ConfigDict(extra="forbid")


# --------------------------------------------------------------------------- sandboxes


class SandboxOut(_Out):
    """A sandbox as its tenant sees it (``GET /v1/sandboxes/{id}``)."""

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


class SandboxList(_Out):
    """``GET /v1/sandboxes``."""

    sandboxes: list[SandboxOut]


class ExecOut(_Out):
    """How a command ended. ``exit_code`` is 128+N when killed by signal N; ``*_bytes`` are
    the totals written, ``*_truncated`` whether the text kept was capped; ``duration_ms`` is
    wall time in milliseconds; ``*_b64`` the raw bytes when asked with ``output_b64``."""

    exit_code: int
    signal: int | None
    timed_out: bool
    oom_killed: bool
    pids_limit_hit: bool = False
    disk_limit_hit: bool = False
    stdout: str
    stderr: str
    stdout_b64: str | None = None
    stderr_b64: str | None = None
    stdout_bytes: int
    stderr_bytes: int
    stdout_truncated: bool
    stderr_truncated: bool
    duration_ms: float
    handler_lost: bool = False  # killed inside the sandbox before it reported (exit 137)


class FileOut(_Out):
    """Result of an upload: where it landed, its size in bytes, and whether it was a tar."""

    path: str
    bytes: int
    kind: Literal["file", "tar"]


class SnapshotOut(_Out):
    """A filesystem snapshot of a sandbox; ``bytes`` (its writable layer) counts against the
    tenant's snapshot quota until it is deleted or expires at ``expires_at``."""

    id: str
    sandbox_id: str
    template: str
    created_at: datetime
    bytes: int = 0
    expires_at: datetime | None = None


class ForkOut(_Out):
    """The sandboxes a fork started, in order."""

    snapshot_id: str
    sandboxes: list[SandboxOut]


class TemplateOut(_Out):
    """A template (sandbox recipe): image, limits, network policy, paths and user."""

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


# ------------------------------------------------------ terminal sessions and processes


class SessionOut(_Out):
    """A shell session: its id, the kept process's ``handle``, its terminal size, whether
    ``run`` works (``can_run``: a bash session whose shell still runs), and the shell's state
    (``running``; ``exit_code`` once it exited)."""

    id: str
    sandbox_id: str
    handle: int
    pty: bool
    rows: int
    cols: int
    can_run: bool
    running: bool
    exit_code: int | None


class SessionList(_Out):
    """The sandbox's sessions."""

    sessions: list[SessionOut]


class RunOut(_Out):
    """What the terminal showed while a session command ran; ``exit_code`` None on timeout
    (the command still runs), the shell's exit status when the command ended the shell
    (``shell_exited``: the session takes no more runs or keys); ``duration_ms`` wall
    milliseconds."""

    output: str
    output_b64: str
    exit_code: int | None
    timed_out: bool
    truncated: bool
    duration_ms: float
    shell_exited: bool


class ScreenOut(_Out):
    """The terminal as an emulator renders it: ``display`` rows (right-trimmed), ``cursor``
    [row, col], ``scrollback`` lines (oldest first), ``bytes_total`` terminal bytes so far."""

    display: list[str]
    cursor: list[int]
    scrollback: list[str]
    bytes_total: int
    dropped: int
    running: bool
    exit_code: int | None

    @property
    def text(self) -> str:
        """The display as one string, trailing blank rows dropped."""
        return "\n".join(self.display).rstrip("\n")


class ProcessOut(_Out):
    """A background process: ``exit_code`` None while it runs (128+N for signal N);
    ``*_bytes`` written so far, ``*_first`` the oldest offset still kept."""

    handle: int
    pid: int
    cmd: str
    running: bool
    exit_code: int | None
    signal: int | None
    stdout_bytes: int
    stderr_bytes: int
    stdout_first: int
    stderr_first: int
    stdin_open: bool
    stdin_pending: int


class ProcessList(_Out):
    """The sandbox's background processes, oldest first."""

    processes: list[ProcessOut]


class OutputOut(_Out):
    """Bytes ``[offset, next)`` of a process stream (``data`` text, ``data_b64`` raw);
    ``dropped``: asked-for bytes that had left the kept window."""

    data: str
    data_b64: str
    offset: int
    next: int
    dropped: int
    process: ProcessOut


# --------------------------------------------------------------------------- tasks, episodes


class TaskOut(_Out):
    """A task as workers see it (no tests, no solution); timeouts in seconds."""

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


class TaskList(_Out):
    """``GET /v1/tasks``; ``errors`` lists malformed tasks the server skipped."""

    tasks: list[TaskOut]
    errors: list[str] = Field(default_factory=list)


class EpisodeOut(_Out):
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


class EpisodeGroupOut(_Out):
    """The episodes of one group, in sample order."""

    group_id: str
    episodes: list[EpisodeOut]


class PolicyIn(_In):
    """Which policy acted."""

    name: str
    version: str = ""


class TurnIn(_In):
    """One turn's summary: the action and how its exec ended (``duration_ms``: wall ms)."""

    action: str
    exit_code: int | None = None
    duration_ms: float = 0.0
    truncated: bool = False
    keys: list[str] = Field(default_factory=list)
    screen: str | None = None


class TimingIn(_In):
    """What the worker measured, in milliseconds."""

    queue_ms: float = 0.0
    policy_ms: float = 0.0
    env_ms: float = 0.0


class MessageIn(_In):
    """One chat message of the prompt."""

    role: str
    content: str


class VerifyIn(_In):
    """``POST /v1/episodes/{id}/verify``: the trajectory the worker recorded.

    Shapes as in ``RewardRecord``: ``prompt_ids`` (P,), ``response_ids``, ``loss_mask`` and
    ``rollout_logprobs`` (R,) (logprobs may be empty when the policy reports none).
    """

    policy: PolicyIn
    stop_reason: StopReason = "complete"
    error: str | None = None
    exclude_from_loss: bool = False
    turns: list[TurnIn] = Field(default_factory=list)
    instruction: str = ""
    prompt_messages: list[MessageIn] = Field(default_factory=list)
    prompt_ids: list[int] = Field(default_factory=list)
    response_ids: list[int] = Field(default_factory=list)
    loss_mask: list[int] = Field(default_factory=list)
    rollout_logprobs: list[float] = Field(default_factory=list)
    missing: list[Missing] = Field(default_factory=list)
    missing_reason: str | None = None
    timing: TimingIn = Field(default_factory=TimingIn)


# --------------------------------------------------------------------------- jobs


class JobOut(_Out):
    """A job and its progress (``progress``: counts by state, records, failed episodes...)."""

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


class WorkItemOut(_Out):
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


# --------------------------------------------------------------------------- reward records


class PolicyInfo(_Out):
    """Which policy produced the trajectory."""

    name: str
    version: str


class VerifierInfo(_Out):
    """Which verifier scored the episode and how that went (``ok``: a trustworthy score
    exists; ``error``: it crashed; ``timeout``); ``details`` is free-form JSON."""

    name: str
    version: str
    status: VerifierStatus
    details: dict[str, Any] = Field(default_factory=dict)


class TurnRecord(_Out):
    """One turn's action and its exec summary (``exit_code`` None when no command ran)."""

    action: str
    exit_code: int | None = None
    duration_ms: float = 0.0
    truncated: bool = False
    keys: list[str] = Field(default_factory=list)
    screen: str | None = None


class Timing(_Out):
    """Where the episode's wall time went, in milliseconds."""

    queue_ms: float = 0.0
    lease_ms: float = 0.0
    policy_ms: float = 0.0
    env_ms: float = 0.0
    verify_ms: float = 0.0


class ChatMessage(_Out):
    """One message of the chat the policy was prompted with (``role``: system, user...)."""

    role: str
    content: str


def _record_id() -> str:
    return f"rr_{secrets.token_hex(8)}"


def _now() -> datetime:
    return datetime.now(UTC)


class RewardRecord(_Out):
    """One verified trajectory; every column is described in ``docs/records.md``.

    Shapes: ``prompt_ids`` (P,), ``response_ids`` (R,), ``loss_mask`` (R,) of 0/1 (1 on
    tokens the policy generated), ``rollout_logprobs`` (R,) natural-log probabilities or (0,).
    ``reward`` is on the verifier's own scale; None unless ``verifier.status == "ok"``.
    """

    schema_version: Literal["2"] = SCHEMA_VERSION
    record_id: str = Field(default_factory=_record_id)
    job_id: str | None = None
    episode_id: str
    group_id: str
    sample_idx: int
    task_id: str
    task_version: str
    suite: str
    domain: str
    template: str
    image_digest: str
    policy: PolicyInfo
    reward: float | None
    reward_components: dict[str, float] = Field(default_factory=dict)
    verifier: VerifierInfo
    stop_reason: StopReason
    error: str | None = None
    exclude_from_loss: bool = False
    turns: list[TurnRecord] = Field(default_factory=list)
    instruction: str = ""
    prompt_messages: list[ChatMessage] = Field(default_factory=list)
    prompt_ids: list[int] = Field(default_factory=list)
    response_ids: list[int] = Field(default_factory=list)
    loss_mask: list[Literal[0, 1]] = Field(default_factory=list)
    rollout_logprobs: list[float] = Field(default_factory=list)
    missing: list[Missing] = Field(default_factory=list)
    missing_reason: str | None = None
    timing: Timing = Field(default_factory=Timing)
    sandbox_id: str
    snapshot_id: str | None = None
    resumed_from: str | None = None
    created_at: datetime = Field(default_factory=_now)

    @model_validator(mode="before")
    @classmethod
    def _upgrade(cls, data: Any) -> Any:
        """A version-1 document (an old JSONL line) reads as version 2: every field version
        2 added has a default."""
        if isinstance(data, dict) and data.get("schema_version") in READABLE_VERSIONS[:-1]:
            data = {**data, "schema_version": SCHEMA_VERSION}
        return data

    @property
    def is_valid(self) -> bool:
        """True when the reward may enter advantage statistics (verified ok, not excluded)."""
        return self.verifier.status == "ok" and not self.exclude_from_loss


class RewardPage(_Out):
    """A page of records (``GET /v1/rewards``); pass ``next_after`` as ``after`` for the next."""

    records: list[RewardRecord]
    next_after: str | None
