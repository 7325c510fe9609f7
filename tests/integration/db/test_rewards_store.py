"""Reward records in the database (SQLite and PostgreSQL): idempotent store, listing, export
from the store, and the anomaly monitor."""

from __future__ import annotations

import io
import json
import math
import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import func, select

from service import anomaly, rewards, tenants
from service.db.engine import Database
from service.db.models import RewardRecordRow
from service.errors import Conflict, InvalidRequest, NotFound
from service.metrics import REGISTRY
from service.rewards import RewardRecord

T0 = datetime(2026, 1, 1, tzinfo=UTC)
_seq = iter(range(10**9))


def make(**overrides: Any) -> RewardRecord:
    """A valid record with fresh ids; ``status=`` sets the verifier's status."""
    n = next(_seq)
    status = overrides.pop("status", "ok")
    fields: dict[str, Any] = {
        "record_id": f"rr_{n:016x}",
        "episode_id": f"ep_{n:016x}",
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
        "verifier": {"name": "pytest", "version": "1", "status": status, "details": {}},
        "stop_reason": "complete",
        "exclude_from_loss": status != "ok",
        "prompt_ids": [1, 2],
        "response_ids": [3, 4, 5],
        "loss_mask": [1, 0, 1],
        "rollout_logprobs": [-0.5, -0.25, -0.125],
        "sandbox_id": "sb_1",
        "created_at": T0,
    }
    fields.update(overrides)
    return RewardRecord.model_validate(fields)


def _tenants(db: Database, *names: str) -> None:
    with db.session() as s:
        for name in names or ("acme",):
            tenants.create_tenant(s, name, max_sandboxes=4, max_cpus=4.0, max_memory_mb=4096)


def _count(db: Database) -> int:
    with db.read() as s:
        return s.execute(select(func.count()).select_from(RewardRecordRow)).scalar_one()


# ----------------------------------------------------------------- store


def test_store_is_idempotent_per_episode(db: Database) -> None:
    _tenants(db)
    first = make(reward=0.5, job_id="job_1")
    with db.session() as s:
        row = rewards.store(s, first, tenant_id="acme")
        assert row.record_id == first.record_id
    retry = first.model_copy(update={"record_id": "rr_other", "reward": 0.0})
    with db.session() as s:
        again = rewards.store(s, retry, tenant_id="acme")
        assert again.record_id == first.record_id and again.reward == 0.5
        assert rewards.to_record(again) == first
    with db.session() as s:  # the same record twice in one transaction
        assert rewards.store(s, first, tenant_id="acme").record_id == first.record_id
    assert _count(db) == 1
    with db.read() as s:
        row = s.get(RewardRecordRow, first.record_id)
        assert row is not None
        assert (row.status, row.exclude_from_loss, row.job_id) == ("ok", False, "job_1")
        assert row.created_at == T0 and row.record["schema_version"] == "2"


def test_concurrent_stores_of_one_episode_keep_one_row(db: Database) -> None:
    _tenants(db)
    base = make()
    stored: list[str] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(8)

    def worker(i: int) -> None:
        try:
            barrier.wait()
            with db.session() as s:
                row = rewards.store(
                    s, base.model_copy(update={"record_id": f"rr_race_{i}"}), tenant_id="acme"
                )
                stored.append(row.record_id)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert _count(db) == 1
    assert len(stored) == 8 and len(set(stored)) == 1


def test_losing_the_race_keeps_the_transaction_usable(db: Database) -> None:
    """An IntegrityError inside store rolls back only its SAVEPOINT."""
    _tenants(db)
    rec = make()
    with db.session() as s:
        rewards.store(s, rec, tenant_id="acme")
    clash = make(record_id=rec.record_id)  # another episode, same record id
    other = make()
    with db.session() as s:
        with pytest.raises(Conflict) as e:
            rewards.store(s, clash, tenant_id="acme")
        assert e.value.field == "record_id"
        rewards.store(s, other, tenant_id="acme")  # same transaction, still works
    assert _count(db) == 2


def test_another_tenants_episode_is_not_found(db: Database) -> None:
    _tenants(db, "acme", "umbrella")
    rec = make()
    with db.session() as s:
        rewards.store(s, rec, tenant_id="acme")
    with db.session() as s, pytest.raises(NotFound):
        rewards.store(s, rec.model_copy(update={"record_id": "rr_x"}), tenant_id="umbrella")
    assert _count(db) == 1


# ----------------------------------------------------------------- query


def _seed_for_query(db: Database) -> list[RewardRecord]:
    _tenants(db, "acme", "umbrella")
    recs = [
        make(created_at=T0 + timedelta(seconds=i % 3), job_id=f"job_{i % 2}", domain=d)
        for i, d in enumerate(["terminal", "document", "terminal", "cad", "terminal"])
    ]
    recs.append(make(status="error", created_at=T0 + timedelta(seconds=5)))
    with db.session() as s:
        for r in recs:
            rewards.store(s, r, tenant_id="acme")
        rewards.store(s, make(), tenant_id="umbrella")
    return sorted(recs, key=lambda r: (r.created_at, r.record_id))


def test_query_pages_in_created_at_order_and_stays_in_its_tenant(db: Database) -> None:
    ordered = _seed_for_query(db)
    page1 = rewards.query(db, tenant_id="acme", limit=4)
    page2 = rewards.query(db, tenant_id="acme", limit=4, after=page1[-1].record_id)
    assert page1 + page2 == ordered and len(page2) == 2
    assert list(rewards.iter_records(db, tenant_id="acme", batch=2)) == ordered
    (theirs,) = rewards.query(db, tenant_id="umbrella", limit=10)
    assert theirs.record_id not in {r.record_id for r in ordered}


def test_query_filters(db: Database) -> None:
    ordered = _seed_for_query(db)

    def ids(**kw: Any) -> list[str]:
        return [r.record_id for r in rewards.query(db, tenant_id="acme", limit=100, **kw)]

    def expect(pred: Any) -> list[str]:
        return [r.record_id for r in ordered if pred(r)]

    assert ids(domain="terminal") == expect(lambda r: r.domain == "terminal")
    assert ids(job_id="job_1") == expect(lambda r: r.job_id == "job_1")
    assert ids(status="error") == expect(lambda r: r.verifier.status == "error")
    since = T0 + timedelta(seconds=2)
    assert ids(since=since) == expect(lambda r: r.created_at >= since)
    assert ids(task_id="nope") == [] and ids(suite="terminal-core") == expect(lambda r: True)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"limit": 0}, "limit"),
        ({"after": "rr_missing"}, "after"),
        ({"since": datetime(2026, 1, 1)}, "since"),
    ],
)
def test_query_rejects_bad_arguments(db: Database, kwargs: dict[str, Any], field: str) -> None:
    _tenants(db)
    kwargs.setdefault("limit", 10)
    with pytest.raises(InvalidRequest) as e:
        rewards.query(db, tenant_id="acme", **kwargs)
    assert e.value.field == field


def test_group_normalized_export_reads_the_store_twice(db: Database) -> None:
    _tenants(db)
    group = [
        make(group_id="g", sample_idx=i, reward=r, created_at=T0 + timedelta(seconds=i))
        for i, r in enumerate([1.0, 0.0, 0.0, 1.0])
    ]
    with db.session() as s:
        for r in group:
            rewards.store(s, r, tenant_id="acme")
    buf = io.StringIO()
    source = rewards.StoredRecords(db, tenant_id="acme", batch=3)
    assert rewards.export_jsonl(source, buf, normalize="grpo") == 4
    a = 0.5 / (math.sqrt(1.0 / 3.0) + rewards.DEFAULT_EPS)
    assert [json.loads(x)["advantage"] for x in buf.getvalue().splitlines()] == [a, -a, -a, a]


# ----------------------------------------------------------------- anomaly monitor


def _store_series(db: Database, passes: list[bool], *, task: str, tenant: str = "acme") -> None:
    with db.session() as s:
        for i, ok in enumerate(passes):
            rewards.store(
                s,
                make(
                    task_id=task,
                    reward=1.0 if ok else 0.0,
                    created_at=T0 + timedelta(minutes=i),
                ),
                tenant_id=tenant,
            )


def test_a_pass_rate_spike_is_flagged(db: Database) -> None:
    _tenants(db)
    history = [i % 10 == 0 for i in range(200)]  # 20 of 200 pass: 10%
    recent = [i % 10 != 0 for i in range(50)]  # 45 of 50 pass: 90%
    _store_series(db, history + recent, task="gamed")
    with db.session() as s:  # verifier failures are not verified outcomes
        for i in range(5):
            rewards.store(
                s,
                make(task_id="gamed", status="error", created_at=T0 + timedelta(days=1, minutes=i)),
                tenant_id="acme",
            )

    found = {(a.scope, a.key): a for a in anomaly.compute_anomalies(db)}
    p = (45 + 20) / 250
    z = (0.9 - 0.1) / math.sqrt(p * (1 - p) * (1 / 50 + 1 / 200))  # 11.535
    for scope, key in (("task", "gamed"), ("domain", "terminal")):
        a = found[(scope, key)]
        assert (a.window_n, a.history_n) == (50, 200)
        assert a.window_rate == pytest.approx(0.9) and a.history_rate == pytest.approx(0.1)
        assert a.z == pytest.approx(z, rel=1e-12)
        assert a.flagged
    assert z == pytest.approx(11.53499601456945)

    anomaly.update_gauge(found.values())
    labels = {"scope": "task", "key": "gamed"}
    assert REGISTRY.get_sample_value("crucible_verifier_anomaly", labels) == 1.0


def test_a_steady_pass_rate_is_not_flagged(db: Database) -> None:
    _tenants(db)
    _store_series(db, [i % 2 == 0 for i in range(250)], task="steady")
    (task,) = [a for a in anomaly.compute_anomalies(db) if a.scope == "task"]
    assert (task.window_rate, task.history_rate, task.z, task.flagged) == (0.5, 0.5, 0.0, False)
    anomaly.update_gauge([task])
    labels = {"scope": "task", "key": "steady"}
    assert REGISTRY.get_sample_value("crucible_verifier_anomaly", labels) == 0.0
    assert (
        REGISTRY.get_sample_value("crucible_verifier_anomaly", {"scope": "task", "key": "gamed"})
        is None
    )


def test_too_little_history_is_not_flagged_and_options_apply(db: Database) -> None:
    _tenants(db, "acme", "umbrella")
    _store_series(db, [False] * 60 + [True] * 50, task="young")  # history 60 < 100
    _store_series(db, [False] * 200, task="other", tenant="umbrella")
    (young,) = [a for a in anomaly.compute_anomalies(db, tenant_id="acme") if a.scope == "task"]
    assert (young.window_n, young.history_n, young.window_rate, young.history_rate) == (
        50,
        60,
        1.0,
        0.0,
    )
    assert young.z is not None and young.z > 3 and not young.flagged
    assert anomaly.compute_anomalies(db, tenant_id="acme", min_history=60)[1].flagged

    capped = anomaly.compute_anomalies(db, tenant_id="acme", max_history=10, min_history=10)
    assert [(a.key, a.history_n, a.flagged) for a in capped] == [
        ("terminal", 10, True),
        ("young", 10, True),
    ]
    # a threshold above every reward: nothing passes, nothing spikes
    high = anomaly.compute_anomalies(db, pass_thresholds={"terminal": 1.5}, min_history=10)
    assert all(a.window_rate == 0.0 and not a.flagged for a in high)
    keys = {(a.scope, a.key) for a in anomaly.compute_anomalies(db)}
    assert keys == {("domain", "terminal"), ("task", "young"), ("task", "other")}
