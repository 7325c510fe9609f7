"""A verdict read from an end state always makes a record: its text is made storable, and
one that still is not scores 0 (``episodes.record_verdict``); only a bad trajectory is
refused (a trial's lone surrogate in an answer's key made every verify answer 400)."""

from __future__ import annotations

import math

import pytest

from service.db.models import Episode
from service.episodes import record_verdict
from service.errors import InvalidRequest
from service.text import recordable
from service.verifiers.base import VerifierResult

TRAJ = {"policy": {"name": "p", "version": "1"}}


def _episode() -> Episode:
    return Episode(
        id="ep_1",
        tenant_id="acme",
        group_id="grp_1",
        sample_idx=0,
        task_id="t",
        task_version="1",
        suite="document",
        domain="document",
        template="document",
        image_digest="sha256:x",
        sandbox_id="sb_1",
        state="verifying",
        timing={},
    )


def _verdict(**kw: object) -> VerifierResult:
    base: dict = {"name": "document", "version": "1", "status": "ok", "reward": 0.0}
    return VerifierResult(**{**base, **kw})


def test_recordable_escapes_surrogates_and_writes_non_finite_numbers_as_text() -> None:
    got = recordable({"\ud800": [1.5, math.inf, ("x\udfff", -math.inf)], 3: math.nan})
    assert got == {"\\ud800": [1.5, "inf", ["x\\udfff", "-inf"]], "3": "nan"}
    assert recordable({"ok": "plain", "n": 2, "b": True}) == {"ok": "plain", "n": 2, "b": True}


def test_agent_text_in_the_details_is_stored_escaped() -> None:
    details = {"unknown_keys": ["\ud800"], "private": {"fields": {"a": {"given": "\udfff"}}}}
    rec = record_verdict(
        _episode(), _verdict(details=details), trajectory=TRAJ, verify_ms=1.0, snapshot_id=None
    )
    assert (rec.reward, rec.verifier.status) == (0.0, "ok")
    assert rec.verifier.details["unknown_keys"] == ["\\ud800"]


def test_a_verdict_no_record_can_hold_scores_zero_with_the_reason() -> None:
    bad = _verdict(reward=1.0, components={"score": math.inf})
    rec = record_verdict(_episode(), bad, trajectory=TRAJ, verify_ms=1.0, snapshot_id=None)
    assert (rec.reward, rec.verifier.status, rec.exclude_from_loss) == (0.0, "ok", False)
    assert rec.verifier.details["dodge"] == "verdict_unrecordable"
    assert rec.reward_components == {}
    err = _verdict(status="error", reward=None, components={"x": math.nan})
    rec = record_verdict(_episode(), err, trajectory=TRAJ, verify_ms=1.0, snapshot_id=None)
    assert (rec.reward, rec.verifier.status) == (None, "error")
    assert "dodge" not in rec.verifier.details


def test_a_bad_trajectory_is_still_refused_naming_the_field() -> None:
    bad = _verdict(components={"score": math.inf})
    with pytest.raises(InvalidRequest) as e:
        record_verdict(
            _episode(), bad, trajectory={**TRAJ, "loss_mask": [2]}, verify_ms=1.0, snapshot_id=None
        )
    assert e.value.field is not None and "loss_mask" in e.value.field


def test_a_verdict_of_any_size_makes_a_record_of_bounded_size() -> None:
    # A fourth trial: 50,000 changed protected paths made one record (and its verify answer,
    # export line and audit event) 83 MB.
    paths = [f"/usr/local/lib/{'x' * 1500}/{i}" for i in range(50_000)]
    big = _verdict(
        details={"tampered": paths, "log": "y" * 10**6, "map": {str(i): i for i in range(10**4)}}
    )
    rec = record_verdict(_episode(), big, trajectory=TRAJ, verify_ms=1.0, snapshot_id=None)
    details = rec.verifier.details
    assert len(details["tampered"]) == 201 and details["tampered"][-1] == "... 49800 more"
    assert details["tampered"][:200] == paths[:200]
    assert len(details["log"]) < 20_000 and details["map"]["..."] == "8000 more"
    assert len(rec.model_dump_json()) < 1 << 20
