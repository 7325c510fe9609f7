"""Reward records: invariants, advantages (exact values), JSONL and Parquet round trips."""

from __future__ import annotations

import io
import json
import math
import random
import statistics
import struct
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pydantic import ValidationError

from service import rewards
from service.anomaly import two_proportion_z
from service.errors import Conflict, InvalidRequest
from service.rewards import RewardRecord, RunningStats

EPS = rewards.DEFAULT_EPS
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def make(**overrides: Any) -> RewardRecord:
    """A valid record; ``overrides`` replace fields (``status=`` sets the verifier's)."""
    status = overrides.pop("status", "ok")
    fields: dict[str, Any] = {
        "record_id": f"rr_{random.getrandbits(64):016x}",
        "episode_id": f"ep_{random.getrandbits(64):016x}",
        "group_id": "grp_1",
        "sample_idx": 0,
        "task_id": "fix-the-build",
        "task_version": "3",
        "suite": "terminal-core",
        "domain": "terminal",
        "template": "terminal",
        "image_digest": "sha256:" + "ab" * 32,
        "policy": {"name": "qwen-7b", "version": "step-100"},
        "reward": 1.0 if status == "ok" else None,
        "reward_components": {"tests_passed": 3.0, "tests_total": 3.0},
        "verifier": {"name": "pytest", "version": "1", "status": status, "details": {"n": 3}},
        "stop_reason": "complete",
        "exclude_from_loss": status != "ok",
        "turns": [
            {"action": "ls -la", "exit_code": 0, "duration_ms": 12.5, "truncated": False},
            {"action": "<done>", "exit_code": None, "duration_ms": 0.0, "truncated": False},
        ],
        "prompt_ids": [1, 2, 3],
        "response_ids": [10, 11, 12, 13],
        "loss_mask": [1, 1, 0, 1],
        "rollout_logprobs": [-0.1, -0.2, 0.0, -1.0 / 3.0],
        "timing": {"queue_ms": 1, "lease_ms": 2, "policy_ms": 3, "env_ms": 4, "verify_ms": 5},
        "sandbox_id": "sb_0123456789abcdef",
        "snapshot_id": "snap_0123456789abcdef",
        "created_at": T0,
    }
    fields.update(overrides)
    return RewardRecord.model_validate(fields)


# ----------------------------------------------------------------- model invariants


def _locs(exc: ValidationError) -> list[tuple[Any, ...]]:
    return [e["loc"] for e in exc.errors()]


def test_loss_mask_length_mismatch_names_the_field() -> None:
    with pytest.raises(ValidationError) as e:
        make(loss_mask=[1, 1, 1])
    assert _locs(e.value) == [("loss_mask",)]
    assert "loss_mask: has 3 entries but response_ids has 4" in str(e.value)


def test_logprobs_must_match_response_or_be_empty() -> None:
    with pytest.raises(ValidationError) as e:
        make(rollout_logprobs=[-0.1])
    assert _locs(e.value) == [("rollout_logprobs",)]
    assert "rollout_logprobs" in e.value.errors()[0]["msg"]
    assert make(rollout_logprobs=[]).rollout_logprobs == []


def test_error_status_with_a_reward_names_the_field() -> None:
    with pytest.raises(ValidationError) as e:
        make(status="error", reward=0.0)
    assert _locs(e.value) == [("reward",)]
    assert "reward: must be null when verifier.status is 'error'" in str(e.value)


def test_failed_verification_must_be_excluded_from_loss() -> None:
    with pytest.raises(ValidationError) as e:
        make(status="timeout", exclude_from_loss=False)
    assert _locs(e.value) == [("exclude_from_loss",)]


def test_ok_status_needs_a_reward_and_every_violation_is_reported() -> None:
    with pytest.raises(ValidationError) as e:
        make(reward=None, loss_mask=[1])
    assert sorted(_locs(e.value)) == [("loss_mask",), ("reward",)]


@pytest.mark.parametrize(
    "overrides",
    [
        {"loss_mask": [1, 2, 0, 1]},
        {"response_ids": [10, -1, 12, 13]},
        {"response_ids": [10, 2**31, 12, 13]},
        {"reward": math.nan},
        {"rollout_logprobs": [-0.1, -math.inf, 0.0, 0.0]},
        {"created_at": datetime(2026, 1, 1)},
        {"stop_reason": "crashed"},
        {"unknown_column": 1},
    ],
)
def test_bad_values_are_rejected(overrides: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        make(**overrides)


def test_created_at_is_normalized_to_utc_and_schema_version_is_set() -> None:
    r = make(created_at=datetime(2026, 1, 1, 2, 0, tzinfo=timezone(timedelta(hours=2))))
    assert r.created_at == T0 and r.created_at.tzinfo == UTC
    assert r.schema_version == "2"
    assert list(RewardRecord.model_fields)[0] == "schema_version"


# ----------------------------------------------------------------- advantages


def test_grpo_uses_sample_std_exactly() -> None:
    a = 0.5 / (math.sqrt(1.0 / 3.0) + EPS)  # mean 0.5, sample std sqrt(1/3)
    assert rewards.grpo_advantages([1.0, 0.0, 0.0, 1.0]) == [a, -a, -a, a]
    assert rewards.group_moments([1.0, 0.0, 0.0, 1.0]) == (0.5, math.sqrt(1.0 / 3.0))


def test_grpo_matches_torch_std_convention() -> None:
    xs = [0.2, 0.9, 0.4, 0.4, 1.0]
    mean, std = statistics.fmean(xs), statistics.stdev(xs)  # stdev: divisor n - 1, as torch.std
    expected = [(x - mean) / (std + EPS) for x in xs]
    assert rewards.grpo_advantages(xs) == pytest.approx(expected, rel=1e-12, abs=1e-15)


def test_mean_only_variant() -> None:
    assert rewards.mean_advantages([1.0, 0.0, 0.0, 1.0]) == [0.5, -0.5, -0.5, 0.5]
    assert rewards.mean_advantages([0.75, 0.25]) == [0.25, -0.25]


def test_identical_rewards_and_singletons_get_zero() -> None:
    assert rewards.grpo_advantages([1.0, 1.0, 1.0]) == [0.0, 0.0, 0.0]
    assert rewards.grpo_advantages([0.7]) == [0.0]
    assert rewards.mean_advantages([0.7]) == [0.0]
    assert rewards.grpo_advantages([None, 0.3, None]) == [None, 0.0, None]
    assert rewards.grpo_advantages([None, None]) == [None, None]


def test_error_record_is_excluded_from_its_group() -> None:
    group = [
        make(sample_idx=0, reward=1.0),
        make(sample_idx=1, reward=0.0),
        make(sample_idx=2, status="error"),
        make(sample_idx=3, reward=1.0),
    ]
    # valid rewards [1, 0, 1]: mean 2/3, sample std sqrt(((1/3)^2*2 + (2/3)^2) / 2) = sqrt(1/3)
    mean = 2.0 / 3.0
    std = math.sqrt(math.fsum([(1 - mean) ** 2, (0 - mean) ** 2, (1 - mean) ** 2]) / 2)
    got = [a for _, a in rewards.with_advantages(group, normalize="grpo")]
    assert got == [
        (1 - mean) / (std + EPS),
        (0 - mean) / (std + EPS),
        None,
        (1 - mean) / (std + EPS),
    ]
    got_mean = [a for _, a in rewards.with_advantages(group, normalize="mean")]
    assert got_mean == [1 - mean, 0 - mean, None, 1 - mean]


def test_excluded_ok_record_and_one_valid_member() -> None:
    group = [
        make(sample_idx=0, reward=1.0, exclude_from_loss=True),
        make(sample_idx=1, status="timeout"),
        make(sample_idx=2, reward=0.25),
    ]
    assert [a for _, a in rewards.with_advantages(group, normalize="grpo")] == [None, None, 0.0]
    assert [a for _, a in rewards.with_advantages(group, normalize="mean")] == [None, None, 0.0]


def test_groups_are_kept_apart_and_an_iterator_works() -> None:
    records = [
        make(group_id="a", reward=1.0),
        make(group_id="b", reward=0.2),
        make(group_id="a", reward=0.0),
        make(group_id="b", reward=0.4),
    ]
    got = [a for _, a in rewards.with_advantages(iter(records), normalize="mean")]
    assert got == pytest.approx([0.5, -0.1, -0.5, 0.1], abs=1e-15)


def test_welford_matches_direct_computation() -> None:
    rng = random.Random(7)
    xs = [rng.uniform(-3.0, 5.0) for _ in range(1000)]
    stats = RunningStats()
    for i, x in enumerate(xs, 1):
        stats.update(x)
        if i in (1, 2, 10, 1000):
            assert stats.n == i
            assert stats.mean == pytest.approx(statistics.fmean(xs[:i]), rel=1e-12)
            assert stats.variance == pytest.approx(statistics.pvariance(xs[:i]), rel=1e-9, abs=0)


def test_domain_z_streams_running_stats_per_domain() -> None:
    rs = [0.0, 1.0, 1.0, 0.5, 0.0]
    records = []
    for i, r in enumerate(rs):
        records.append(make(domain="terminal", reward=r, created_at=T0 + timedelta(seconds=i)))
    records.insert(2, make(domain="cad", reward=0.3, created_at=T0 + timedelta(seconds=1)))
    records.insert(4, make(domain="terminal", status="error", created_at=T0 + timedelta(seconds=2)))
    got = [a for _, a in rewards.with_advantages(records, normalize="domain_z")]
    expected_terminal = [
        (r - statistics.fmean(rs[: i + 1])) / (statistics.pstdev(rs[: i + 1]) + EPS)
        for i, r in enumerate(rs)
    ]
    terminal = [a for rec, a in zip(records, got, strict=True) if rec.domain == "terminal"]
    assert terminal[:3] + terminal[4:] == pytest.approx(expected_terminal, rel=1e-12, abs=1e-12)
    assert terminal[3] is None  # the error record
    assert got[2] == 0.0  # cad's first record
    assert expected_terminal[0] == 0.0


def test_domain_z_refuses_records_out_of_order() -> None:
    records = [make(created_at=T0 + timedelta(seconds=1)), make(created_at=T0)]
    with pytest.raises(InvalidRequest) as e:
        list(rewards.with_advantages(records, normalize="domain_z"))
    assert e.value.field == "created_at"


class _Growing:
    """Iterates a group of two, then a group of three (as if a record arrived mid-export)."""

    def __init__(self) -> None:
        self.calls = 0

    def __iter__(self):  # noqa: ANN204
        self.calls += 1
        n = 2 if self.calls == 1 else 3
        return iter([make(episode_id=f"ep_{i}", reward=float(i % 2)) for i in range(n)])


def test_group_export_detects_records_that_changed_between_passes() -> None:
    with pytest.raises(Conflict):
        list(rewards.with_advantages(_Growing(), normalize="grpo"))


# ----------------------------------------------------------------- JSONL


def _group() -> list[RewardRecord]:
    return [
        make(sample_idx=0, reward=1.0, created_at=T0),
        make(sample_idx=1, reward=0.0, created_at=T0 + timedelta(seconds=1)),
        make(sample_idx=2, reward=0.0, created_at=T0 + timedelta(seconds=2)),
        make(sample_idx=3, reward=1.0, created_at=T0 + timedelta(seconds=3)),
        make(
            sample_idx=4, status="error", stop_reason="error", created_at=T0 + timedelta(seconds=4)
        ),
    ]


def test_jsonl_round_trip_is_exact() -> None:
    records = _group()
    buf = io.StringIO()
    assert rewards.export_jsonl(records, buf) == 5
    lines = buf.getvalue().splitlines()
    assert len(lines) == 5 and "advantage" not in json.loads(lines[0])
    assert list(rewards.read_jsonl(io.StringIO(buf.getvalue()))) == records


def test_jsonl_with_grpo_advantages() -> None:
    records = _group()
    buf = io.StringIO()
    rewards.export_jsonl(records, buf, normalize="grpo")
    docs = [json.loads(line) for line in buf.getvalue().splitlines()]
    a = 0.5 / (math.sqrt(1.0 / 3.0) + EPS)
    assert [d["advantage"] for d in docs] == [a, -a, -a, a, None]
    assert list(docs[0])[-1] == "advantage" and docs[0]["schema_version"] == "2"
    assert docs[4]["reward"] is None and docs[4]["verifier"]["status"] == "error"
    assert list(rewards.read_jsonl(io.StringIO(buf.getvalue()))) == records


# ----------------------------------------------------------------- Parquet


def _f32(x: float) -> float:
    """``x`` rounded to the nearest float32, as a Python float."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


def test_parquet_round_trip_with_pyarrow(tmp_path: Path) -> None:
    records = _group()
    path = tmp_path / "records.parquet"
    assert rewards.export_parquet(records, path, normalize="grpo", row_group_size=2) == 5

    pf = pq.ParquetFile(path)
    assert pf.metadata.num_row_groups == 3
    meta = pf.schema_arrow.metadata
    assert meta[b"crucible.schema_version"] == b"2"
    assert meta[b"crucible.normalize"] == b"grpo"
    assert float(meta[b"crucible.advantage_eps"]) == EPS

    table = pq.read_table(path)
    expected = rewards.parquet_schema(normalize="grpo")
    for field in expected:
        assert table.schema.field(field.name).equals(field), field.name
    assert table.schema.names == expected.names

    assert table.column("prompt_ids").type.value_type == pa.int32()
    assert table.column("rollout_logprobs").type.value_type == pa.float32()
    for i, (rec, row) in enumerate(zip(records, table.to_pylist(), strict=True)):
        assert row["prompt_ids"] == rec.prompt_ids
        assert row["response_ids"] == rec.response_ids
        assert row["loss_mask"] == rec.loss_mask
        lp = table.column("rollout_logprobs")[i].values
        assert lp.type == pa.float32()
        assert lp.to_pylist() == [_f32(x) for x in rec.rollout_logprobs]
        assert row["turns"] == [t.model_dump() for t in rec.turns]
        assert row["policy"] == rec.policy.model_dump()
        assert row["timing"] == rec.timing.model_dump()
        assert row["verifier"]["status"] == rec.verifier.status
        assert json.loads(row["verifier"]["details_json"]) == rec.verifier.details
        assert {c["name"]: c["value"] for c in row["reward_components"]} == rec.reward_components
        assert row["reward"] == rec.reward
        assert row["created_at"] == rec.created_at
        assert row["snapshot_id"] == rec.snapshot_id and row["job_id"] is None
        assert row["exclude_from_loss"] == rec.exclude_from_loss
    a = 0.5 / (math.sqrt(1.0 / 3.0) + EPS)
    assert table.column("advantage").to_pylist() == [a, -a, -a, a, None]


def test_parquet_without_normalization_has_no_advantage_column() -> None:
    buf = io.BytesIO()
    rewards.export_parquet([make()], buf)
    buf.seek(0)
    table = pq.read_table(buf)
    assert "advantage" not in table.schema.names
    assert table.schema.metadata[b"crucible.normalize"] == b"none"
    assert table.num_rows == 1


def test_parquet_of_nothing_still_has_the_schema(tmp_path: Path) -> None:
    path = tmp_path / "empty.parquet"
    assert rewards.export_parquet([], path, normalize="mean") == 0
    table = pq.read_table(path)
    assert table.num_rows == 0 and "advantage" in table.schema.names


# ----------------------------------------------------------------- anomaly statistic


def test_two_proportion_z() -> None:
    p = 65 / 250
    expected = (0.9 - 0.1) / math.sqrt(p * (1 - p) * (1 / 50 + 1 / 200))
    assert two_proportion_z(45, 50, 20, 200) == pytest.approx(expected, rel=1e-12)
    assert two_proportion_z(25, 50, 100, 200) == 0.0
    assert two_proportion_z(50, 50, 200, 200) == 0.0
    assert two_proportion_z(5, 50, 0, 0) is None
