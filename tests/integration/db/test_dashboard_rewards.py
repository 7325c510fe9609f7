"""The rewards page's aggregates give exactly the figures of a plain pass over the records
(issue 13: the page counts in one pass over undecoded rows on SQLite, in SQL on PostgreSQL;
each way is checked on both), and the dashboard's anomaly cache follows new records."""

from __future__ import annotations

import math
import random
from collections import defaultdict
from datetime import timedelta
from typing import Any

import pytest
from alembic import command
from alembic.config import Config
from sqlalchemy import event, func, inspect, select
from sqlalchemy.engine import Engine

from service import anomaly, rewards
from service.dashboard import reward_queries, stats
from service.dashboard.monitor import MonitorCache
from service.db.engine import MIGRATIONS_DIR, Database
from service.db.models import RewardRecordRow
from service.rewards import group_moments
from tests.integration.db.test_rewards_store import T0, _tenants, make

DOMAINS = ("terminal", "document", "cad")
VALUES = (0.0, 0.25, 0.1 + 0.2, 0.5, 0.7, 1.0, 1.0, 1.0)


def _seed(db: Database, n: int = 240) -> None:
    """Records of two tenants, three domains, five tasks, groups of four (some flat),
    continuous rewards, errors and timeouts, 37.123457 s apart from a bucket boundary."""
    _tenants(db, "acme", "beta")
    rng = random.Random(13)
    with db.session() as s:
        for i in range(n):
            status = "ok" if i % 11 else rng.choice(["error", "timeout"])
            flat = (i // 20) % 5 == 0
            reward = 1.0 if flat else rng.choice(VALUES)
            rec = make(
                task_id=f"task-{i % 5}",
                domain=DOMAINS[i % 5 % 3],
                group_id=f"g{i % 5}-{i // 20}",
                sample_idx=i // 5 % 4,
                status=status,
                created_at=T0 + timedelta(seconds=i * 37.123457),
            )
            if status == "ok":
                rec = rec.model_copy(update={"reward": reward})
            rewards.store(s, rec, tenant_id="acme" if i % 3 else "beta")
        for i, at in enumerate((299.999999, 300.0, 599.5, 600.000001)):  # bucket edges
            rec = make(task_id="task-1", domain="document", created_at=T0 + timedelta(seconds=at))
            rewards.store(s, rec.model_copy(update={"reward": float(i % 2)}), tenant_id="acme")


def _rows(db: Database, tenant: str | None, domain: str | None, limit: int) -> list[Any]:
    """The newest ``limit`` records of the scope, oldest first (what the page used to read)."""
    R = RewardRecordRow
    stmt = select(R)
    if tenant:
        stmt = stmt.where(R.tenant_id == tenant)
    if domain:
        stmt = stmt.where(R.domain == domain)
    with db.read() as s:
        rows = list(s.execute(stmt.order_by(R.created_at.desc()).limit(limit)).scalars())
    return rows[::-1]


def _plain(rows: list[Any], threshold: float = 1.0) -> dict[str, Any]:
    """The figures straight from the rows, one record at a time."""
    verified = [r for r in rows if r.status == "ok" and r.reward is not None]
    span = rows[-1].created_at.timestamp() - rows[0].created_at.timestamp()
    width = next(
        (w for w in stats.BUCKET_WIDTHS_S if span / w < stats.MAX_BUCKETS),
        stats.BUCKET_WIDTHS_S[-1],
    )
    series: dict[str, dict[str, dict[float, list[int]]]] = {"domain": {}, "task_id": {}}
    for by in series:
        for r in verified:
            cell = (
                series[by]
                .setdefault(getattr(r, by), {})
                .setdefault(r.created_at.timestamp() // width * width, [0, 0])
            )
            cell[0] += 1
            cell[1] += r.reward >= threshold
    plots = {
        by: {
            k: [stats.Bucket(t, n, x / n) for t, (n, x) in sorted(c.items())]
            for k, c in sorted(keys.items())
        }
        for by, keys in series.items()
    }
    per_domain: dict[str, list[float]] = defaultdict(list)
    for r in verified:
        per_domain[r.domain].append(r.reward)
    hists = {}
    for d, vs in sorted(per_domain.items()):
        lo, hi = min(0.0, min(vs)), max(1.0, max(vs))
        counts = [0] * stats.HIST_BINS
        for v in vs:
            counts[min(stats.HIST_BINS - 1, int((v - lo) / (hi - lo) * stats.HIST_BINS))] += 1
        hists[d] = stats.Histogram(lo, hi, counts)
    tasks = []
    for task in sorted({r.task_id for r in rows}):
        mine = [r for r in rows if r.task_id == task]
        ok = [r for r in verified if r.task_id == task]
        groups: dict[str, list[float]] = defaultdict(list)
        for r in ok:
            groups[r.group_id].append(r.reward)
        stds = [group_moments(g)[1] for g in groups.values() if len(g) >= 2]
        statuses: dict[str, int] = defaultdict(int)
        for r in mine:
            statuses[r.status] += 1
        tasks.append(
            stats.TaskSummary(
                task_id=task,
                domain=mine[-1].domain,
                statuses=dict(statuses),
                pass_rate=sum(r.reward >= threshold for r in ok) / len(ok) if ok else None,
                groups=len(stds),
                mean_group_std=math.fsum(stds) / len(stds) if stds else None,
                flat_group_share=sum(s == 0.0 for s in stds) / len(stds) if stds else None,
            )
        )
    return {
        "n": len(rows),
        "width": width,
        "plots": plots,
        "hists": hists,
        "tasks": tasks,
        "oldest": rows[0].created_at,
        "newest": rows[-1].created_at,
    }


@pytest.mark.parametrize(
    "how",
    [
        reward_queries.aggregates,  # SQLite: in Python; PostgreSQL: in SQL
        reward_queries._counted_in_python,  # each way on each database
        reward_queries._counted_in_sql,
    ],
)
@pytest.mark.parametrize(
    ("tenant", "domain", "limit"),
    [(None, None, 10_000), (None, None, 150), ("acme", None, 10_000), (None, "document", 60)],
)
def test_aggregates_equal_a_plain_pass_over_the_records(
    db: Database, tenant: str | None, domain: str | None, limit: int, how: Any
) -> None:
    _seed(db)
    want = _plain(_rows(db, tenant, domain, limit))
    kw = dict(bucket_width=stats.bucket_width_s, threshold=anomaly.DEFAULT_PASS_THRESHOLD)
    agg = (
        how(db, tenant=tenant, domain=domain, limit=limit, **kw)
        if how is reward_queries.aggregates
        else how(db, tenant, domain, kw["bucket_width"], kw["threshold"], limit)
    )
    assert (agg.oldest, agg.newest) == (want["oldest"], want["newest"])
    assert agg.n == want["n"]
    assert agg.bucket_s == want["width"] == 300
    assert len(want["plots"]["domain"][domain or "cad"]) > 10
    for by in ("domain", "task_id"):
        assert stats.pass_rate_series(agg.cells, by=by) == want["plots"][by]
    assert stats.histograms(agg.rewards) == want["hists"]
    got = stats.task_summaries(agg.statuses, agg.cells, agg.groups)
    assert got == want["tasks"]
    assert any(t.flat_group_share for t in got) and any(t.mean_group_std for t in got)


@pytest.mark.parametrize("how", [reward_queries._counted_in_python, reward_queries._counted_in_sql])
def test_aggregates_of_nothing(db: Database, how: Any) -> None:
    _seed(db, n=8)
    agg = how(db, "nobody", None, stats.bucket_width_s, 1.0, reward_queries.LIMIT)
    assert (agg.n, agg.cells, agg.statuses, agg.rewards, agg.groups) == (0, [], [], [], [])
    assert agg.bucket_s == stats.BUCKET_WIDTHS_S[0]


def test_monitor_cache_recomputes_once_per_interval_and_only_on_change(db: Database) -> None:
    _seed(db, n=40)
    now = [0.0]
    cache = MonitorCache(3.0, 30.0, clock=lambda: now[0])
    first = cache.get(db, None)
    assert first.anomalies == anomaly.compute_anomalies(db)
    assert first.rates == anomaly.outcome_rates(db)
    assert cache.get(db, None) is first  # same interval: not recomputed
    assert cache.get(db, "acme") is not first  # each scope has its own
    with db.session() as s:
        rec = make(task_id="task-new", created_at=T0 - timedelta(days=1))
        rewards.store(s, rec, tenant_id="acme")
    now[0] = 2.9
    assert cache.get(db, None) is first  # within the interval, as a live panel
    now[0] = 3.0  # the next interval: the probe sees the new record
    second = cache.get(db, None)
    assert second is not first and "task-new" in {r.task_id for r in second.rates}
    now[0] = 20.0
    assert cache.get(db, None) is second  # nothing changed: kept past the interval
    # a failed record replaced by a verified one dated earlier than the newest is seen
    failed = make(status="error", task_id="task-retried", created_at=T0 - timedelta(days=2))
    with db.session() as s:
        rewards.store(s, failed, tenant_id="acme", work_item_id="wi_1")
    now[0] = 24.0
    third = cache.get(db, None)
    assert third.rates[-1].task_id == "task-retried" and third.rates[-1].error_rate == 1.0
    retry = make(task_id="task-retried", created_at=T0 - timedelta(days=2), reward=1.0)
    with db.session() as s:
        row = rewards.store(s, retry, tenant_id="acme", work_item_id="wi_1", replace_error=True)
        assert row.record_id == retry.record_id  # it did replace the failed one
    now[0] = 28.0
    fourth = cache.get(db, None)
    assert fourth is not third and fourth.rates[-1].error_rate == 0.0
    now[0] = 57.9
    assert cache.get(db, None) is fourth
    now[0] = 58.0  # max_age_s after it was computed: computed again though nothing changed
    fifth = cache.get(db, None)
    assert fifth is not fourth and fifth == fourth


def _indexes(db: Database, table: str) -> set[str]:
    return {ix["name"] for ix in inspect(db.engine).get_indexes(table)}


def _alembic(db: Database, verb: str, target: str) -> None:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    with db.engine.begin() as conn:
        cfg.attributes["connection"] = conn
        getattr(command, verb)(cfg, target)


def test_covering_indexes_serve_the_newest_records_and_migrate_both_ways(db: Database) -> None:
    _seed(db, n=40)
    plot = {"ix_rewards_plot", "ix_rewards_tenant_plot", "ix_rewards_domain_plot"}
    assert plot <= _indexes(db, "reward_records")
    assert "ix_rewards_created" not in _indexes(db, "reward_records")
    assert "ix_audit_tenant_action" in _indexes(db, "audit_events")
    if db.engine.dialect.name == "sqlite":  # the page's scans never read a record's row
        for tenant, domain, index in [
            (None, None, "ix_rewards_plot"),
            ("acme", None, "ix_rewards_tenant_plot"),
            (None, "cad", "ix_rewards_domain_plot"),
        ]:
            sq = reward_queries._newest(tenant, domain, 10_000)
            sql = (
                select(func.count())
                .select_from(sq)
                .compile(db.engine, compile_kwargs={"literal_binds": True})
            )
            with db.engine.connect() as conn:
                plan = " ".join(r[-1] for r in conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {sql}"))
            assert f"COVERING INDEX {index}" in plan, plan
    _alembic(db, "downgrade", "0007_checkpoints")
    assert not plot & _indexes(db, "reward_records")
    assert "ix_rewards_created" in _indexes(db, "reward_records")
    _alembic(db, "upgrade", "head")
    assert plot <= _indexes(db, "reward_records")


def _plain_anomalies(db: Database, **kw: Any) -> list[tuple[Any, ...]]:
    """(scope, key, window n and passes, history n and passes) straight from the records."""
    window, cap = kw.get("window", anomaly.DEFAULT_WINDOW), kw.get("max_history")
    thresholds = kw.get("pass_thresholds") or {}
    with db.read() as s:
        stmt = select(RewardRecordRow).where(RewardRecordRow.status == "ok")
        if kw.get("tenant_id"):
            stmt = stmt.where(RewardRecordRow.tenant_id == kw["tenant_id"])
        rows = [r for r in s.execute(stmt).scalars() if r.reward is not None]
    rows.sort(key=lambda r: (r.created_at, r.record_id), reverse=True)
    out = []
    for scope in ("domain", "task"):
        per: dict[str, list[int]] = defaultdict(list)
        for r in rows:
            ok = r.reward >= thresholds.get(r.domain, anomaly.DEFAULT_PASS_THRESHOLD)
            per[r.task_id if scope == "task" else r.domain].append(int(ok))
        for key, passed in sorted(per.items()):
            hist = passed[window:] if cap is None else passed[window : window + cap]
            out.append(
                (scope, key, len(passed[:window]), sum(passed[:window]), len(hist), sum(hist))
            )
    return out


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"tenant_id": "acme"},
        {"window": 7, "max_history": 20},
        {"tenant_id": "beta", "window": 3, "max_history": 5},
        {"pass_thresholds": {"document": 0.3, "cad": 0.5}, "window": 11},
        {"window": 10_000},
        {"window": 1},  # the two newest records share their time: the larger id is newer
    ],
)
def test_anomaly_counts_equal_a_plain_pass_over_the_records(
    db: Database, kw: dict[str, Any]
) -> None:
    """The spike checks' window and history counts (LIMITs correlated with each key, not a
    ranking of every record) are those of the records sorted newest first, ties broken by
    record id (the seed's bucket-edge records share times with no one; these share none)."""
    _seed(db)
    with db.session() as s:  # two records at the same time: the larger record id is newer
        for i in range(2):
            rec = make(task_id="task-1", domain="cad", created_at=T0 + timedelta(days=30))
            rewards.store(s, rec.model_copy(update={"reward": float(i)}), tenant_id="acme")
    got = [
        (
            a.scope,
            a.key,
            a.window_n,
            round((a.window_rate or 0) * a.window_n),
            a.history_n,
            round((a.history_rate or 0) * a.history_n),
        )
        for a in anomaly.compute_anomalies(db, **kw)
    ]
    assert got == _plain_anomalies(db, **kw)


def test_anomaly_rank_index_serves_the_window_and_migrates_both_ways(db: Database) -> None:
    """Migration 0009: each task's newest verified records come from ``ix_rewards_task_rank``
    (SQLite's plan), and it goes away on downgrade and comes back."""
    _seed(db, n=40)
    assert "ix_rewards_task_rank" in _indexes(db, "reward_records")
    before = anomaly.compute_anomalies(db)
    if db.engine.dialect.name == "sqlite":
        stmt: list[str] = []

        def keep(conn: Any, cursor: Any, statement: str, *rest: Any) -> None:
            stmt.append(statement)

        event.listen(Engine, "before_cursor_execute", keep)  # reads may use their own engine
        try:
            anomaly.compute_anomalies(db)
        finally:
            event.remove(Engine, "before_cursor_execute", keep)
        task_sql = next(s for s in stmt if "WHERE ranked.task_id = " in s)
        with db.engine.connect() as conn:
            params = ["ok"] * task_sql.count("?")
            plan = " ".join(
                r[-1] for r in conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {task_sql}", tuple(params))
            )
        assert "COVERING INDEX ix_rewards_task_rank" in plan, plan
    _alembic(db, "downgrade", "0008_dashboard_covering")
    assert "ix_rewards_task_rank" not in _indexes(db, "reward_records")
    assert anomaly.compute_anomalies(db) == before  # the same figures, only slower
    _alembic(db, "upgrade", "head")
    assert "ix_rewards_task_rank" in _indexes(db, "reward_records")


@pytest.mark.parametrize(
    ("tenant", "window"),
    [(None, 50), ("acme", 50), ("beta", 4), (None, 1), (None, 3), (None, 10_000)],
)
def test_outcome_rates_equal_a_plain_pass_over_the_records(
    db: Database, tenant: str | None, window: int
) -> None:
    """Each task's window (its records from the ``window``-th newest on, not a ranking of
    every record) holds its newest records, ties at the edge broken by record id."""
    _seed(db)
    with db.session() as s:  # three records at one time, the newest of task-2: a tie
        for i, (status, dodge) in enumerate(
            [("ok", "timeout"), ("error", None), ("ok", "tampered")]
        ):
            rec = make(
                task_id="task-2",
                status=status,
                created_at=T0 + timedelta(days=30),
                verifier={
                    "name": "t",
                    "version": "1",
                    "status": status,
                    "details": {"dodge": dodge},
                },
            )
            rewards.store(s, rec, tenant_id="acme" if i else "beta")
    with db.read() as s:
        stmt = select(RewardRecordRow)
        if tenant:
            stmt = stmt.where(RewardRecordRow.tenant_id == tenant)
        rows = sorted(s.execute(stmt).scalars(), key=lambda r: (r.created_at, r.record_id))
    per: dict[str, list[Any]] = defaultdict(list)
    for r in reversed(rows):
        per[r.task_id].append(r)
    want = []
    for task, recs in sorted(per.items()):
        recs = recs[:window]
        causes: dict[str, int] = defaultdict(int)
        for r in recs:
            if cause := r.record["verifier"]["details"].get("dodge"):
                causes[cause] += 1
        want.append(
            anomaly.OutcomeRates(
                task_id=task,
                n=len(recs),
                dodge_rate=sum(causes.values()) / len(recs),
                tamper_rate=causes.get("tampered", 0) / len(recs),
                error_rate=sum(r.status != "ok" for r in recs) / len(recs),
                dodges=dict(causes),
            )
        )
    assert anomaly.outcome_rates(db, tenant_id=tenant, window=window) == want
