"""Reward records: the contract with trainers (DESIGN.md section 7; layout in docs/records.md).

One ``RewardRecord`` per trajectory. It is stored once per episode (``store``), listed with
keyset pagination (``query``, ``iter_records``) and exported as JSONL or Parquet
(``export_jsonl``, ``export_parquet``), optionally with an ``advantage`` per record.

Invariants the model enforces (an infrastructure failure is never a reward of 0):

- ``len(loss_mask) == len(response_ids)``; ``len(rollout_logprobs)`` is ``len(response_ids)``
  or 0 (a policy that returns no logprobs).
- ``verifier.status != "ok"`` implies ``reward is None`` and ``exclude_from_loss``;
  ``verifier.status == "ok"`` implies a reward.

Advantages at export (``normalize=``), with ``r`` the raw reward and ``eps`` default 1e-6:

- ``"grpo"``: ``(r - mean_g) / (std_g + eps)`` over the valid members of the record's group
  (DeepSeekMath, Shao et al. 2024, arXiv:2402.03300, section 4.1.2). ``std_g`` is the
  *sample* standard deviation (Bessel's correction, divisor ``n - 1``): the std that verl
  (``compute_grpo_outcome_advantage``), TRL (``GRPOTrainer``) and OpenRLHF (``group_norm``)
  all compute with ``torch.std``, so an exported advantage equals the one those trainers
  compute from the same group (the paper does not say which std).
- ``"mean"``: ``r - mean_g`` (Dr. GRPO, Liu et al. 2025, arXiv:2503.20783: dividing by the
  group std weights questions by their difficulty).
- ``"domain_z"``: ``(r - mean_d) / (std_d + eps)`` with the running mean and *population*
  std of the domain's valid rewards so far, this record included (Welford 1962, as in the
  running normalizers of RL libraries, e.g. OpenAI baselines' ``RunningMeanStd``), over
  records in ``created_at`` order. One pass, O(domains) memory, so an export streams.

A record is *valid* for statistics when ``verifier.status == "ok"`` and it is not
``exclude_from_loss``; every other record gets advantage ``None`` and adds nothing to a
group's or a domain's statistics. A group with one valid member gets 0.0 (``grpo``, ``mean``);
verl instead leaves a singleton's reward unnormalized (mean 0, std 1).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Annotated, Any, Literal

import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError
from sqlalchemy import and_, or_, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from service.db.engine import Database
from service.db.models import RewardRecordRow, utcnow
from service.errors import Conflict, InvalidRequest, NotFound
from service.ids import new_id
from service.text import find_unencodable

SCHEMA_VERSION = "2"
"""Version of the record layout; written into every record and into the Parquet metadata.
Changelog: docs/records.md ("Schema versions"). A stored version-1 record reads as version 2
(every field version 2 added has a default)."""

READABLE_VERSIONS = ("1", "2")
"""Record versions ``RewardRecord`` reads (older ones are upgraded on read)."""

DEFAULT_EPS = 1e-6
"""Default ``eps`` of the std-normalized advantages (verl's default)."""

MAX_PAGE = 1000
"""Most records ``query`` returns at once."""

VerifierStatus = Literal["ok", "error", "timeout"]
StopReason = Literal[
    "complete", "max_turns", "agent_timeout", "context_length", "sandbox_stopped", "error"
]
Normalize = Literal["none", "grpo", "mean", "domain_z"]

TokenId = Annotated[int, Field(ge=0, le=2**31 - 1)]  # fits Parquet int32
NonNegMs = Annotated[float, Field(ge=0.0)]
UTCDatetime = Annotated[AwareDatetime, AfterValidator(lambda d: d.astimezone(UTC))]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    @field_validator("*", mode="after")
    @classmethod
    def _valid_text(cls, value: Any, info: ValidationInfo) -> Any:
        """Refuse lone surrogates anywhere in a field (see ``service.text``)."""
        if (bad := find_unencodable(value)) is not None:
            where = info.field_name if bad == "value" else f"{info.field_name}.{bad}"
            raise ValueError(f"{where} is not valid Unicode text (a lone surrogate)")
        return value


class PolicyInfo(_Model):
    """Which policy produced the trajectory."""

    name: str = Field(min_length=1, max_length=200)
    version: str = Field(max_length=200)


class VerifierInfo(_Model):
    """Which verifier scored the episode, and how that went.

    ``status``: ``ok`` (a trustworthy score exists), ``error`` (the verifier crashed) or
    ``timeout`` (it ran out of time). ``details``: free-form JSON (test counts, logs tail...).
    """

    name: str = Field(min_length=1, max_length=200)
    version: str = Field(max_length=200)
    status: VerifierStatus
    details: dict[str, Any] = Field(default_factory=dict)


class TurnRecord(_Model):
    """One turn's action and its exec result summary (not the output itself).

    ``exit_code`` is None when the action ran no command (a done marker, a parse failure);
    ``duration_ms`` is the exec wall time in milliseconds; ``truncated`` says the output
    was capped at ``max_output_bytes``. A session episode's turn (send keys, read the screen)
    has ``keys`` (what was sent, in order) and ``screen`` (the rendered display read after).
    """

    action: str
    exit_code: int | None = Field(default=None, ge=-(2**31), le=2**31 - 1)
    duration_ms: NonNegMs = 0.0
    truncated: bool = False
    keys: list[str] = Field(default_factory=list)
    screen: str | None = None


class Timing(_Model):
    """Where the episode's wall time went, in milliseconds.

    ``queue_ms`` waiting for a worker, ``lease_ms`` getting a sandbox, ``policy_ms``
    generating actions, ``env_ms`` executing them, ``verify_ms`` verifying.
    """

    queue_ms: NonNegMs = 0.0
    lease_ms: NonNegMs = 0.0
    policy_ms: NonNegMs = 0.0
    env_ms: NonNegMs = 0.0
    verify_ms: NonNegMs = 0.0


class ChatMessage(_Model):
    """One message of the chat the policy was prompted with (``role``: system, user...)."""

    role: str = Field(min_length=1, max_length=32)
    content: str


Missing = Literal["token_ids", "logprobs"]


class RewardRecord(_Model):
    """One verified trajectory (DESIGN.md section 7). Every column: docs/records.md.

    Shapes: ``prompt_ids`` (P,), ``response_ids`` (R,), ``loss_mask`` (R,) of 0/1 (1 on
    tokens the policy generated, 0 on observation tokens the environment inserted),
    ``rollout_logprobs`` (R,) natural-log probabilities of ``response_ids`` under the
    sampling policy, or (0,) when the policy reports none. ``reward`` is on the
    verifier's own scale (no normalization); None unless ``verifier.status == "ok"``.
    """

    schema_version: Literal["2"] = SCHEMA_VERSION
    record_id: str = Field(default_factory=lambda: new_id("rr"), min_length=1, max_length=40)
    job_id: str | None = Field(default=None, max_length=40)
    episode_id: str = Field(min_length=1, max_length=40)
    group_id: str = Field(min_length=1, max_length=40)
    sample_idx: int = Field(ge=0)
    task_id: str = Field(min_length=1, max_length=200)
    task_version: str = Field(max_length=64)
    suite: str = Field(max_length=200)
    domain: str = Field(min_length=1, max_length=32)
    template: str = Field(max_length=64)
    image_digest: str = Field(max_length=100)
    policy: PolicyInfo
    reward: float | None
    reward_components: dict[str, float] = Field(default_factory=dict)
    verifier: VerifierInfo
    stop_reason: StopReason
    error: str | None = Field(default=None, max_length=4000)
    exclude_from_loss: bool = False
    turns: list[TurnRecord] = Field(default_factory=list)
    instruction: str = ""
    prompt_messages: list[ChatMessage] = Field(default_factory=list)
    prompt_ids: list[TokenId] = Field(default_factory=list)
    response_ids: list[TokenId] = Field(default_factory=list)
    loss_mask: list[Literal[0, 1]] = Field(default_factory=list)
    rollout_logprobs: list[float] = Field(default_factory=list)
    missing: list[Missing] = Field(default_factory=list)
    missing_reason: str | None = Field(default=None, max_length=1000)
    timing: Timing = Field(default_factory=Timing)
    sandbox_id: str = Field(max_length=40)
    snapshot_id: str | None = Field(default=None, max_length=40)
    resumed_from: str | None = Field(default=None, max_length=40)
    created_at: UTCDatetime = Field(default_factory=utcnow)

    @model_validator(mode="before")
    @classmethod
    def _upgrade(cls, data: Any) -> Any:
        """A version-1 document (a stored row, an old JSONL line) reads as version 2."""
        if isinstance(data, dict) and data.get("schema_version") in READABLE_VERSIONS[:-1]:
            data = {**data, "schema_version": SCHEMA_VERSION}
        return data

    @model_validator(mode="after")
    def _invariants(self) -> RewardRecord:
        errors: list[InitErrorDetails] = []

        def fail(field: str, kind: str, message: str, value: Any) -> None:
            errors.append(
                InitErrorDetails(
                    type=PydanticCustomError(kind, f"{field}: {message}"), loc=(field,), input=value
                )
            )

        n = len(self.response_ids)
        if len(self.loss_mask) != n:
            fail(
                "loss_mask",
                "length_mismatch",
                f"has {len(self.loss_mask)} entries but response_ids has {n}",
                len(self.loss_mask),
            )
        if len(self.rollout_logprobs) not in (0, n):
            fail(
                "rollout_logprobs",
                "length_mismatch",
                f"has {len(self.rollout_logprobs)} entries; expected {n} (one per response "
                "token) or 0 (no logprobs)",
                len(self.rollout_logprobs),
            )
        status = self.verifier.status
        if status != "ok" and self.reward is not None:
            fail(
                "reward",
                "reward_without_verdict",
                f"must be null when verifier.status is {status!r} (an infrastructure failure "
                "is never a reward)",
                self.reward,
            )
        if status != "ok" and not self.exclude_from_loss:
            fail(
                "exclude_from_loss",
                "failure_in_loss",
                f"must be true when verifier.status is {status!r}",
                self.exclude_from_loss,
            )
        if status == "ok" and self.reward is None:
            fail("reward", "missing_reward", "is required when verifier.status is 'ok'", None)
        if errors:
            raise ValidationError.from_exception_data(type(self).__name__, errors)
        return self

    @property
    def is_valid(self) -> bool:
        """True when the reward may enter advantage statistics (verified ok, not excluded)."""
        return self.verifier.status == "ok" and not self.exclude_from_loss


# --------------------------------------------------------------------------- what tenants see

PRIVATE_KEY = "private"
"""Key of ``verifier.details`` that only admins may read: a verifier puts there whatever
would give the answer away (expected values, reference geometry, hidden test names,
assertion diffs). Stored rows keep it; ``redact`` removes it from what tenants get."""


def redact(record: RewardRecord) -> RewardRecord:
    """``record`` without ``verifier.details["private"]`` (the tenant's view; the record
    itself is not changed). Every route that returns records to a tenant passes them here:
    ``GET /v1/rewards``, the exports and the episode verify response."""
    if PRIVATE_KEY not in record.verifier.details:
        return record
    details = {k: v for k, v in record.verifier.details.items() if k != PRIVATE_KEY}
    verifier = record.verifier.model_copy(update={"details": details})
    return record.model_copy(update={"verifier": verifier})


def view(record: RewardRecord, *, private: bool) -> RewardRecord:
    """``record`` as is when ``private`` (an admin asked for it), else ``redact(record)``."""
    return record if private else redact(record)


# --------------------------------------------------------------------------- storage


def sample_key(record: RewardRecord, work_item_id: str | None) -> str:
    """A record's identity, unique in storage: ``<work_item_id>/<sample_idx>`` for a job's
    sample (the same sample of a retried work item has the same key), ``ep/<episode_id>``
    for an episode outside any work item."""
    if work_item_id:
        return f"{work_item_id}/{record.sample_idx}"
    return f"ep/{record.episode_id}"


def _to_row(record: RewardRecord, tenant_id: str, key: str) -> RewardRecordRow:
    return RewardRecordRow(
        record_id=record.record_id,
        tenant_id=tenant_id,
        job_id=record.job_id,
        episode_id=record.episode_id,
        sample_key=key,
        group_id=record.group_id,
        task_id=record.task_id,
        suite=record.suite,
        domain=record.domain,
        reward=record.reward,
        status=record.verifier.status,
        exclude_from_loss=record.exclude_from_loss,
        created_at=record.created_at,
        record=record.model_dump(mode="json"),
    )


def _by_episode(session: Session, episode_id: str) -> RewardRecordRow | None:
    stmt = select(RewardRecordRow).where(RewardRecordRow.episode_id == episode_id)
    return session.execute(stmt).scalar_one_or_none()


def _by_sample(session: Session, key: str) -> RewardRecordRow | None:
    stmt = select(RewardRecordRow).where(RewardRecordRow.sample_key == key)
    return session.execute(stmt).scalar_one_or_none()


def by_episode(db: Database, episode_id: str) -> RewardRecord | None:
    """The record stored for ``episode_id``, if any."""
    with db.read() as s:
        row = _by_episode(s, episode_id)
        return to_record(row) if row is not None else None


def _owned(row: RewardRecordRow, tenant_id: str) -> RewardRecordRow:
    if row.tenant_id != tenant_id:  # another tenant's episode: it does not exist for this one
        raise NotFound(f"episode {row.episode_id} not found", field="episode_id")
    return row


def store(
    session: Session,
    record: RewardRecord,
    *,
    tenant_id: str,
    work_item_id: str | None = None,
    replace_error: bool = False,
) -> RewardRecordRow:
    """Insert ``record`` for ``tenant_id`` in ``session``'s transaction; at most one record
    per sample (``sample_key``) and per episode.

    A second store for the same sample or episode (a retried request, a re-run of a retried
    work item, two racing writers) inserts nothing and returns the row already stored, whose
    content wins; compare its ``record_id`` to tell. Only with ``replace_error`` (a retry of
    a failed sample while its work item is still open) does a stored record whose verifier
    status is not ``ok`` give way: it is deleted and ``record`` takes its sample. The write
    runs in a SAVEPOINT, so losing a race on PostgreSQL leaves the caller's transaction
    usable.

    Raises:
        NotFound: the episode's record belongs to another tenant.
        Conflict: ``record_id`` is already used by another episode's record.
    """
    key = sample_key(record, work_item_id)
    existing = _by_episode(session, record.episode_id) or _by_sample(session, key)
    if existing is not None:
        existing = _owned(existing, tenant_id)
        if not (
            replace_error
            and existing.status != "ok"
            and existing.sample_key == key
            and existing.episode_id != record.episode_id
        ):
            return existing
    row = _to_row(record, tenant_id, key)
    try:
        with session.begin_nested():
            if existing is not None:
                session.delete(existing)
                session.flush()
            session.add(row)
    except IntegrityError:
        existing = _by_episode(session, record.episode_id) or _by_sample(session, key)
        if existing is not None:
            return _owned(existing, tenant_id)
        if session.get(RewardRecordRow, record.record_id) is not None:
            raise Conflict(
                f"record_id {record.record_id} is already used by another episode's record",
                field="record_id",
            ) from None
        raise
    return row


def to_record(row: RewardRecordRow) -> RewardRecord:
    """The ``RewardRecord`` a stored row holds."""
    return RewardRecord.model_validate(row.record)


def query(
    db: Database,
    *,
    tenant_id: str,
    job_id: str | None = None,
    suite: str | None = None,
    domain: str | None = None,
    task_id: str | None = None,
    status: VerifierStatus | None = None,
    since: datetime | None = None,
    limit: int = 100,
    after: str | None = None,
) -> list[RewardRecord]:
    """One page of ``tenant_id``'s records, oldest first (``created_at``, then ``record_id``).

    Filters are ANDed; ``since`` keeps ``created_at >= since``. ``after`` is the
    ``record_id`` of the last record of the previous page (keyset pagination: stable while
    records are appended). ``limit`` is 1..``MAX_PAGE``.

    Raises:
        InvalidRequest: ``limit`` out of range, a naive ``since``, or an unknown ``after``.
    """
    if not 1 <= limit <= MAX_PAGE:
        raise InvalidRequest(f"limit must be 1..{MAX_PAGE}", field="limit")
    if since is not None and since.tzinfo is None:
        raise InvalidRequest("since must carry a time zone", field="since")
    R = RewardRecordRow
    stmt = select(R.record).where(R.tenant_id == tenant_id)
    for column, value in (
        (R.job_id, job_id),
        (R.suite, suite),
        (R.domain, domain),
        (R.task_id, task_id),
        (R.status, status),
    ):
        if value is not None:
            stmt = stmt.where(column == value)
    if since is not None:
        stmt = stmt.where(R.created_at >= since)
    with db.read() as s:
        if after is not None:
            cursor = s.execute(
                select(R.created_at).where(R.tenant_id == tenant_id, R.record_id == after)
            ).scalar_one_or_none()
            if cursor is None:
                raise InvalidRequest(f"unknown record {after!r}", field="after")
            stmt = stmt.where(
                or_(R.created_at > cursor, and_(R.created_at == cursor, R.record_id > after))
            )
        stmt = stmt.order_by(R.created_at, R.record_id).limit(limit)
        docs = s.execute(stmt).scalars().all()
    return [RewardRecord.model_validate(d) for d in docs]


def iter_records(
    db: Database, *, tenant_id: str, batch: int = 500, **filters: Any
) -> Iterator[RewardRecord]:
    """Every record ``query`` would list (same filters), oldest first, read page by page."""
    after: str | None = None
    while True:
        page = query(db, tenant_id=tenant_id, limit=batch, after=after, **filters)
        yield from page
        if len(page) < batch:
            return
        after = page[-1].record_id


class StoredRecords:
    """A re-iterable view of stored records: each ``iter()`` reads them afresh.

    Pass it to an export with ``normalize="grpo"`` or ``"mean"``: those read the records
    twice (group statistics, then rows) and so never hold the whole export in memory.
    Records come redacted (``redact``) unless ``private`` (an admin's export).
    """

    def __init__(
        self,
        db: Database,
        *,
        tenant_id: str,
        batch: int = 500,
        private: bool = False,
        **filters: Any,
    ):
        self._db, self._tenant_id, self._batch, self._filters = db, tenant_id, batch, filters
        self._private = private

    def __iter__(self) -> Iterator[RewardRecord]:
        records = iter_records(
            self._db, tenant_id=self._tenant_id, batch=self._batch, **self._filters
        )
        return (view(r, private=self._private) for r in records)


# --------------------------------------------------------------------------- advantages


def group_moments(rewards: Sequence[float]) -> tuple[float, float]:
    """``(mean, sample std)`` of one group's valid rewards; std is 0.0 for fewer than 2.

    Two-pass with ``math.fsum``: ``mean = sum(r) / n``, ``std = sqrt(sum((r - mean)^2) /
    (n - 1))`` (Bessel's correction, as ``torch.std`` in verl, TRL and OpenRLHF).
    """
    n = len(rewards)
    if n == 0:
        raise ValueError("a group needs at least one reward")
    mean = math.fsum(rewards) / n
    if n < 2:
        return mean, 0.0
    return mean, math.sqrt(math.fsum((r - mean) ** 2 for r in rewards) / (n - 1))


def _group_advantage(
    reward: float, mean: float, std: float, n: int, *, normalize: str, eps: float
) -> float:
    if n < 2:
        return 0.0
    if normalize == "grpo":
        return (reward - mean) / (std + eps)
    return reward - mean


def grpo_advantages(
    rewards: Sequence[float | None], *, eps: float = DEFAULT_EPS
) -> list[float | None]:
    """GRPO advantages of one group: ``(r - mean) / (std + eps)``, std with divisor ``n - 1``.

    ``None`` marks a member that is not valid (error, timeout, excluded): it gets ``None``
    and is left out of the mean and std. One valid member gets 0.0.
    Example: ``[1, 0, 0, 1]`` -> ``±0.5 / (sqrt(1/3) + eps)``.
    """
    return _advantages_of_group(rewards, normalize="grpo", eps=eps)


def mean_advantages(rewards: Sequence[float | None]) -> list[float | None]:
    """Dr. GRPO advantages of one group: ``r - mean``; ``None`` members as in GRPO."""
    return _advantages_of_group(rewards, normalize="mean", eps=0.0)


def _advantages_of_group(
    rewards: Sequence[float | None], *, normalize: str, eps: float
) -> list[float | None]:
    valid = [r for r in rewards if r is not None]
    if not valid:
        return [None] * len(rewards)
    mean, std = group_moments(valid)
    return [
        None
        if r is None
        else _group_advantage(r, mean, std, len(valid), normalize=normalize, eps=eps)
        for r in rewards
    ]


class RunningStats:
    """Welford's online mean and variance (Welford 1962; Knuth TAOCP vol. 2, 4.2.2).

    ``update(x)``: ``n += 1; d = x - mean; mean += d / n; m2 += d * (x - mean)``.
    ``variance`` is the population variance ``m2 / n`` (0.0 before two values).
    """

    __slots__ = ("n", "mean", "m2")

    def __init__(self) -> None:
        self.n = 0
        self.mean = 0.0
        self.m2 = 0.0

    def update(self, x: float) -> None:
        """Add one value."""
        self.n += 1
        delta = x - self.mean
        self.mean += delta / self.n
        self.m2 += delta * (x - self.mean)

    @property
    def variance(self) -> float:
        """Population variance of the values seen so far."""
        return self.m2 / self.n if self.n else 0.0

    @property
    def std(self) -> float:
        """Population standard deviation of the values seen so far."""
        return math.sqrt(self.variance)


class DomainZScorer:
    """Per-domain running z-scores: ``(r - mean_d) / (std_d + eps)``, statistics so far.

    Call it on records in ``created_at`` order; the record's own reward is added to its
    domain's statistics before it is scored (so a domain's first valid record scores 0.0).
    Invalid records score ``None`` and leave the statistics alone.

    Raises:
        InvalidRequest: a record is older than the previous record of its domain.
    """

    def __init__(self, *, eps: float = DEFAULT_EPS) -> None:
        self.eps = eps
        self.stats: dict[str, RunningStats] = {}
        self._last: dict[str, datetime] = {}

    def __call__(self, record: RewardRecord) -> float | None:
        last = self._last.get(record.domain)
        if last is not None and record.created_at < last:
            raise InvalidRequest(
                f"domain_z needs records in created_at order; {record.record_id} "
                f"({record.created_at.isoformat()}) comes after {last.isoformat()}",
                field="created_at",
            )
        self._last[record.domain] = record.created_at
        if not record.is_valid or record.reward is None:
            return None
        stats = self.stats.setdefault(record.domain, RunningStats())
        stats.update(record.reward)
        return (record.reward - stats.mean) / (stats.std + self.eps)


def with_advantages(
    records: Iterable[RewardRecord], *, normalize: Normalize, eps: float = DEFAULT_EPS
) -> Iterator[tuple[RewardRecord, float | None]]:
    """``(record, advantage)`` for each record, in the input order.

    ``none``: advantage None. ``domain_z``: one pass. ``grpo`` / ``mean``: two passes,
    the first keeping only each group's valid rewards (floats) in memory; an iterator that
    cannot be read twice is materialized once (pass a list or a ``StoredRecords`` to avoid
    that).

    Raises:
        Conflict: the records changed between the two passes (a group grew).
    """
    if normalize == "none":
        for record in records:
            yield record, None
        return
    if normalize == "domain_z":
        scorer = DomainZScorer(eps=eps)
        for record in records:
            yield record, scorer(record)
        return
    if normalize not in ("grpo", "mean"):
        raise InvalidRequest(f"unknown normalization {normalize!r}", field="normalize")
    if isinstance(records, Iterator):  # one-shot: keep it once
        records = list(records)
    groups: dict[str, list[float]] = {}
    for record in records:
        bucket = groups.setdefault(record.group_id, [])
        if record.is_valid and record.reward is not None:
            bucket.append(record.reward)
    moments = {g: (*group_moments(v), len(v)) for g, v in groups.items() if v}
    seen: dict[str, int] = {}
    for record in records:
        if record.group_id not in groups:
            raise Conflict("records changed during a group-normalized export; retry it")
        if not record.is_valid or record.reward is None:
            yield record, None
            continue
        seen[record.group_id] = seen.get(record.group_id, 0) + 1
        mean, std, n = moments[record.group_id]
        if seen[record.group_id] > n:
            raise Conflict("records changed during a group-normalized export; retry it")
        yield record, _group_advantage(record.reward, mean, std, n, normalize=normalize, eps=eps)


# --------------------------------------------------------------------------- JSONL


def export_jsonl(
    records: Iterable[RewardRecord],
    fp: IO[str],
    *,
    normalize: Normalize = "none",
    eps: float = DEFAULT_EPS,
) -> int:
    """Write one JSON object per line (the record's fields; ``advantage`` last unless
    ``normalize == "none"``) to the text stream ``fp``; return the number of lines."""
    n = 0
    for record, advantage in with_advantages(records, normalize=normalize, eps=eps):
        doc = record.model_dump(mode="json")
        if normalize != "none":
            doc["advantage"] = advantage
        fp.write(json.dumps(doc, ensure_ascii=False, separators=(",", ":")))
        fp.write("\n")
        n += 1
    return n


def read_jsonl(fp: IO[str]) -> Iterator[RewardRecord]:
    """Records from a JSONL export (an ``advantage`` key is dropped); blank lines skipped."""
    for line in fp:
        if line.strip():
            doc = json.loads(line)
            doc.pop("advantage", None)
            yield RewardRecord.model_validate(doc)


# --------------------------------------------------------------------------- Parquet


def _f(name: str, type_: pa.DataType, nullable: bool = False) -> pa.Field:
    return pa.field(name, type_, nullable=nullable)


def _list_of(type_: pa.DataType) -> pa.DataType:
    # "element" is the Parquet-compliant list item name; it reads back unchanged.
    return pa.list_(_f("element", type_))


_POLICY = pa.struct([_f("name", pa.string()), _f("version", pa.string())])
_VERIFIER = pa.struct(
    [
        _f("name", pa.string()),
        _f("version", pa.string()),
        _f("status", pa.string()),
        _f("details_json", pa.string()),
    ]
)
_TURN = pa.struct(
    [
        _f("action", pa.string()),
        _f("exit_code", pa.int32(), nullable=True),
        _f("duration_ms", pa.float64()),
        _f("truncated", pa.bool_()),
        _f("keys", _list_of(pa.string())),
        _f("screen", pa.string(), nullable=True),
    ]
)
_TIMING = pa.struct([_f(k, pa.float64()) for k in Timing.model_fields])
_COMPONENT = pa.struct([_f("name", pa.string()), _f("value", pa.float64())])
_MESSAGE = pa.struct([_f("role", pa.string()), _f("content", pa.string())])

_RECORD_FIELDS = [
    _f("schema_version", pa.string()),
    _f("record_id", pa.string()),
    _f("job_id", pa.string(), nullable=True),
    _f("episode_id", pa.string()),
    _f("group_id", pa.string()),
    _f("sample_idx", pa.int32()),
    _f("task_id", pa.string()),
    _f("task_version", pa.string()),
    _f("suite", pa.string()),
    _f("domain", pa.string()),
    _f("template", pa.string()),
    _f("image_digest", pa.string()),
    _f("policy", _POLICY),
    _f("reward", pa.float64(), nullable=True),
    _f("reward_components", _list_of(_COMPONENT)),
    _f("verifier", _VERIFIER),
    _f("stop_reason", pa.string()),
    _f("error", pa.string(), nullable=True),
    _f("exclude_from_loss", pa.bool_()),
    _f("turns", _list_of(_TURN)),
    _f("instruction", pa.string()),
    _f("prompt_messages", _list_of(_MESSAGE)),
    _f("prompt_ids", _list_of(pa.int32())),
    _f("response_ids", _list_of(pa.int32())),
    _f("loss_mask", _list_of(pa.int32())),
    _f("rollout_logprobs", _list_of(pa.float32())),
    _f("missing", _list_of(pa.string())),
    _f("missing_reason", pa.string(), nullable=True),
    _f("timing", _TIMING),
    _f("sandbox_id", pa.string()),
    _f("snapshot_id", pa.string(), nullable=True),
    _f("resumed_from", pa.string(), nullable=True),
    _f("created_at", pa.timestamp("us", tz="UTC")),
]


def parquet_schema(*, normalize: Normalize = "none", eps: float = DEFAULT_EPS) -> pa.Schema:
    """The explicit Arrow schema of a Parquet export (docs/records.md, "Parquet").

    Key-value metadata: ``crucible.schema_version``, ``crucible.normalize`` and, when
    advantages are present, ``crucible.advantage_eps``. A nullable float64 ``advantage``
    column is appended when ``normalize != "none"``.
    """
    fields = list(_RECORD_FIELDS)
    meta = {b"crucible.schema_version": SCHEMA_VERSION.encode(), b"crucible.normalize": b"none"}
    if normalize != "none":
        fields.append(_f("advantage", pa.float64(), nullable=True))
        meta[b"crucible.normalize"] = normalize.encode()
        meta[b"crucible.advantage_eps"] = repr(eps).encode()
    return pa.schema(fields, metadata=meta)


def _arrow_row(record: RewardRecord) -> dict[str, Any]:
    row = record.model_dump(
        exclude={"verifier", "reward_components", "turns", "prompt_messages", "timing"}
    )
    # a list of {name, value} structs, not an Arrow map: HF datasets has no map type
    row["reward_components"] = [
        {"name": k, "value": v} for k, v in sorted(record.reward_components.items())
    ]
    row["prompt_messages"] = [m.model_dump() for m in record.prompt_messages]
    row["verifier"] = {
        "name": record.verifier.name,
        "version": record.verifier.version,
        "status": record.verifier.status,
        "details_json": json.dumps(
            record.verifier.details, ensure_ascii=False, sort_keys=True, separators=(",", ":")
        ),
    }
    row["turns"] = [t.model_dump() for t in record.turns]
    row["timing"] = record.timing.model_dump()
    return row


def export_parquet(
    records: Iterable[RewardRecord],
    path_or_fp: str | Path | IO[bytes],
    *,
    normalize: Normalize = "none",
    eps: float = DEFAULT_EPS,
    row_group_size: int = 1024,
) -> int:
    """Write records to Parquet (zstd) with ``parquet_schema(normalize=...)``; return the count.

    Records are converted and written ``row_group_size`` at a time (one row group each), so
    memory holds one batch of rows, plus what ``with_advantages`` needs for ``normalize``.
    Token ids and masks become int32 and logprobs float32 (their values round to float32).
    """
    if row_group_size < 1:
        raise InvalidRequest("row_group_size must be positive", field="row_group_size")
    schema = parquet_schema(normalize=normalize, eps=eps)
    n = 0
    rows: list[dict[str, Any]] = []
    with pq.ParquetWriter(path_or_fp, schema, compression="zstd") as writer:
        for record, advantage in with_advantages(records, normalize=normalize, eps=eps):
            row = _arrow_row(record)
            if normalize != "none":
                row["advantage"] = advantage
            rows.append(row)
            if len(rows) == row_group_size:
                writer.write_batch(pa.RecordBatch.from_pylist(rows, schema=schema))
                n += len(rows)
                rows = []
        if rows:
            writer.write_batch(pa.RecordBatch.from_pylist(rows, schema=schema))
            n += len(rows)
    return n
