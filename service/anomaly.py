"""Anomaly monitor: a pass-rate spike against history flags a verifier as possibly gamed.

For each task and each domain, the verified records (``status == "ok"``) are ordered newest
first. The *window* is the newest ``window`` of them (default 50); the *history* is every
older one (optionally only the newest ``max_history`` of those). A record passes when
``reward >= threshold`` (1.0 by default, per-domain overrides for continuous scores).

The spike test is a one-sided two-proportion z-test with the pooled proportion::

    p_w = x_w / n_w,  p_h = x_h / n_h,  p = (x_w + x_h) / (n_w + n_h)
    z = (p_w - p_h) / sqrt(p * (1 - p) * (1/n_w + 1/n_h))

(e.g. Agresti, *Categorical Data Analysis*, 3rd ed., section 3.1.3; ``z`` is 0.0 when every
record passed or every record failed). A key is flagged when the window is full
(``n_w == window``), the history holds at least ``min_history`` records (default 100) and
``z > z_threshold`` (default 3.0: about 1 false alarm in 740 checks of a key whose pass rate
did not change, by the normal approximation). The z-test accounts for sample size: a jump
from 10% to 30% over 50 records is z = 3.6 against 200 records of history, z = 1.8
against 20. Only rises are flagged: an agent that suddenly "solves" a task is the symptom of
a verifier it can game; a drop is a regression, not an exploit.

``update_gauge`` publishes ``crucible_verifier_anomaly{scope, key}`` (1 flagged, 0 not).

Beside the spike test, ``outcome_rates`` counts, per task over its newest ``window``
records, how often verification ended in a dodge (a 0 the end state caused: a hang, a
crash, a tampered report; ``verifier.details.dodge``), a tampered report, or an error
(excluded from loss). A policy that learns to dodge shows as a rising dodge rate before
anything else; ``crucible_verifier_dodge_rate{task}`` and ``..._error_rate{task}`` publish
them.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable, Mapping
from typing import Any, Literal

from prometheus_client import Gauge
from pydantic import BaseModel, ConfigDict
from sqlalchemy import Float, and_, case, cast, func, literal, or_, select
from sqlalchemy.orm import aliased

from service.db.engine import Database
from service.db.models import RewardRecordRow
from service.metrics import REGISTRY

DEFAULT_WINDOW = 50
DEFAULT_MIN_HISTORY = 100
DEFAULT_Z_THRESHOLD = 3.0
DEFAULT_PASS_THRESHOLD = 1.0

Scope = Literal["task", "domain"]

VERIFIER_ANOMALY = Gauge(
    "crucible_verifier_anomaly",
    "1 when the recent pass rate of a task or domain spikes against its history "
    "(verifier possibly gamed), else 0.",
    ["scope", "key"],
    registry=REGISTRY,
)


DODGE_RATE = Gauge(
    "crucible_verifier_dodge_rate",
    "Share of a task's newest records whose 0 the end state caused (hang, crash, tamper...).",
    ["task"],
    registry=REGISTRY,
)
ERROR_RATE = Gauge(
    "crucible_verifier_error_rate",
    "Share of a task's newest records whose verification failed (status error or timeout).",
    ["task"],
    registry=REGISTRY,
)


class OutcomeRates(BaseModel):
    """How one task's newest ``n`` records ended. Rates are fractions of ``n`` in [0, 1];
    ``dodges`` counts each cause (``verifier.details.dodge``)."""

    model_config = ConfigDict(frozen=True)

    task_id: str
    n: int
    dodge_rate: float
    tamper_rate: float
    error_rate: float
    dodges: dict[str, int]


def outcome_rates(
    db: Database, *, tenant_id: str | None = None, window: int = DEFAULT_WINDOW
) -> list[OutcomeRates]:
    """Dodge, tamper and error rates per task over its newest ``window`` records (module
    docstring), sorted by task. ``tenant_id`` None pools every tenant."""
    if window < 1:
        return []
    R = RewardRecordRow
    # Each task's window ends at its ``window``-th newest record (a LIMIT 1 OFFSET
    # ``window - 1`` correlated with the task, over ``ix_rewards_task_rank``; none when it
    # has fewer); its rows are the task's records from there on, and the JSON is read for
    # those alone. Ranking every record with row_number over the task instead sorted them
    # all (about 20 ms at 10,000 records on SQLite, against about 4).
    r = aliased(R, name="ranked")
    mine = [R.tenant_id == tenant_id] if tenant_id is not None else []
    tasks = select(R.task_id.label("task_id")).where(*mine).group_by(R.task_id).subquery("tasks")

    def edge(column: Any) -> Any:
        """``column`` of the task's ``window``-th newest record (NULL when it has fewer)."""
        return (
            select(column)
            .where(r.task_id == tasks.c.task_id, *([r.tenant_id == tenant_id] if mine else []))
            .order_by(r.created_at.desc(), r.record_id.desc())
            .offset(window - 1)
            .limit(1)
            .correlate(tasks)
            .scalar_subquery()
        )

    edges = (
        select(tasks.c.task_id, edge(r.created_at).label("at"), edge(r.record_id).label("rid"))
        .cte("edges")
        .prefix_with("MATERIALIZED")  # once per task, not once per record joined
    )
    e = edges.c
    dodge = R.record["verifier"]["details"]["dodge"].as_string()
    stmt = (
        select(R.task_id, R.status, dodge)
        .join(edges, R.task_id == e.task_id)
        .where(
            *mine,
            or_(
                e.at.is_(None),
                R.created_at > e.at,
                and_(R.created_at == e.at, R.record_id >= e.rid),
            ),
        )
    )
    with db.read() as s:
        rows = s.execute(stmt).all()
    per: dict[str, list[tuple[str, str | None]]] = {}
    for task, status, cause in rows:
        per.setdefault(task, []).append((status, cause))
    out = []
    for task, recs in sorted(per.items()):
        n = len(recs)
        causes: dict[str, int] = {}
        for _, cause in recs:
            if cause:
                causes[cause] = causes.get(cause, 0) + 1
        out.append(
            OutcomeRates(
                task_id=task,
                n=n,
                dodge_rate=sum(causes.values()) / n,
                tamper_rate=causes.get("tampered", 0) / n,
                error_rate=sum(1 for st, _ in recs if st != "ok") / n,
                dodges=causes,
            )
        )
    return out


def update_rate_gauges(rates: Iterable[OutcomeRates]) -> None:
    """Publish ``crucible_verifier_dodge_rate`` and ``_error_rate`` per task."""
    for r in rates:
        DODGE_RATE.labels(task=r.task_id).set(r.dodge_rate)
        ERROR_RATE.labels(task=r.task_id).set(r.error_rate)


class Anomaly(BaseModel):
    """The spike check of one task or domain.

    Rates are pass fractions in [0, 1] (None when their count is 0); ``z`` is the
    two-proportion z statistic (None when either count is 0).
    """

    model_config = ConfigDict(frozen=True)

    scope: Scope
    key: str
    window_rate: float | None
    history_rate: float | None
    window_n: int
    history_n: int
    z: float | None
    flagged: bool


def two_proportion_z(x_w: int, n_w: int, x_h: int, n_h: int) -> float | None:
    """Pooled two-proportion z of ``x_w / n_w`` against ``x_h / n_h`` (module docstring).

    None when a count is 0; 0.0 when the pooled proportion is 0 or 1 (no spread).
    """
    if n_w <= 0 or n_h <= 0:
        return None
    p = (x_w + x_h) / (n_w + n_h)
    var = p * (1.0 - p) * (1.0 / n_w + 1.0 / n_h)
    if var <= 0.0:
        return 0.0
    return (x_w / n_w - x_h / n_h) / math.sqrt(var)


def compute_anomalies(
    db: Database,
    *,
    tenant_id: str | None = None,
    window: int = DEFAULT_WINDOW,
    min_history: int = DEFAULT_MIN_HISTORY,
    max_history: int | None = None,
    z_threshold: float = DEFAULT_Z_THRESHOLD,
    pass_threshold: float = DEFAULT_PASS_THRESHOLD,
    pass_thresholds: Mapping[str, float] | None = None,
) -> list[Anomaly]:
    """The spike check of every task and every domain with verified records.

    Args:
        tenant_id: only this tenant's records; None (default) pools every tenant's, since a
            gamed verifier is a property of the task, whoever runs it.
        window: records in the window (the newest ones).
        min_history: fewest history records for a key to be flagged.
        max_history: use only the newest ``max_history`` records before the window
            (None: all of them).
        z_threshold: flag when ``z`` exceeds it.
        pass_threshold: a record passes when ``reward >= pass_threshold``...
        pass_thresholds: ...or the threshold of its domain here (e.g. ``{"cad": 0.8}``).

    Returns:
        One ``Anomaly`` per task (key ``task_id``) and per domain (key ``domain``), sorted
        by scope then key.
    """
    if window < 1 or min_history < 1 or (max_history is not None and max_history < 1):
        raise ValueError("window, min_history and max_history must be positive")
    out: list[Anomaly] = []
    for scope in ("domain", "task"):
        out += _scope(
            db,
            scope,
            tenant_id=tenant_id,
            window=window,
            min_history=min_history,
            max_history=max_history,
            z_threshold=z_threshold,
            pass_threshold=pass_threshold,
            pass_thresholds=pass_thresholds,
        )
    return sorted(out, key=lambda a: (a.scope, a.key))


def _scope(
    db: Database,
    scope: Scope,
    *,
    tenant_id: str | None,
    window: int,
    min_history: int,
    max_history: int | None,
    z_threshold: float,
    pass_threshold: float,
    pass_thresholds: Mapping[str, float] | None,
) -> list[Anomaly]:
    R = RewardRecordRow
    key_col = R.task_id if scope == "task" else R.domain
    # Per key: its verified records' count and passes (one GROUP BY), and those of its
    # newest ``window`` (and next ``max_history``) ones, each a LIMIT over an index of the
    # key newest first (``ix_rewards_task_rank``, ``ix_rewards_domain_plot``), correlated
    # with the key. The history is the rest. Ranking every record with a window function
    # instead (row_number over the key, newest first) sorted them all: about 20 ms per
    # scope at 10,000 records on SQLite, against about 2.
    r = aliased(R, name="ranked")
    r_key = r.task_id if scope == "task" else r.domain

    def passed(row: Any) -> Any:
        """1 when a record of ``row`` (the table or its alias) passes, else 0."""
        t = (
            case(
                {d: literal(float(v), Float) for d, v in pass_thresholds.items()},
                value=row.domain,
                else_=literal(float(pass_threshold), Float),
            )
            if pass_thresholds
            else literal(float(pass_threshold), Float)
        )
        return case((cast(row.reward, Float) >= t, 1), else_=0)

    def verified(row: Any) -> list[Any]:
        """The conditions of a verified record of the scope's tenant."""
        cond = [row.status == "ok", row.reward.is_not(None)]
        return cond + ([row.tenant_id == tenant_id] if tenant_id is not None else [])

    totals = (
        select(key_col.label("key"), func.count().label("n"), func.sum(passed(R)).label("x"))
        .where(*verified(R))
        .group_by(key_col)
        .subquery("totals")
    )

    def ranked(offset: int, limit: int) -> tuple[Any, Any]:
        """(count, passes) of the key's verified records ranked ``offset + 1`` to
        ``offset + limit``, newest first, as scalar subqueries correlated with the key."""
        rows = (
            select(passed(r).label("p"))
            .where(r_key == totals.c.key, *verified(r))
            .order_by(r.created_at.desc(), r.record_id.desc())
            .offset(offset)
            .limit(limit)
            .correlate(totals)
            .subquery()
        )
        n = select(func.count()).select_from(rows).scalar_subquery()
        x = select(func.coalesce(func.sum(rows.c.p), 0)).select_from(rows).scalar_subquery()
        return n, x

    n_w, x_w = ranked(0, window)
    columns = [totals.c.key, totals.c.n, totals.c.x, n_w, x_w]
    if max_history is not None:
        columns += ranked(window, max_history)
    stmt = select(*columns)
    with db.read() as s:
        rows = s.execute(stmt).all()
    out = []
    for key, n, x, n_w, x_w, *capped in rows:
        n_w, x_w = int(n_w), int(x_w)
        n_h, x_h = (int(n) - n_w, int(x) - x_w) if not capped else map(int, capped)
        z = two_proportion_z(x_w, n_w, x_h, n_h)
        out.append(
            Anomaly(
                scope=scope,
                key=key,
                window_rate=x_w / n_w if n_w else None,
                history_rate=x_h / n_h if n_h else None,
                window_n=n_w,
                history_n=n_h,
                z=z,
                flagged=n_w >= window and n_h >= min_history and z is not None and z > z_threshold,
            )
        )
    return out


_published: set[tuple[str, str]] = set()
_publish_lock = threading.Lock()


def update_gauge(anomalies: Iterable[Anomaly]) -> None:
    """Set ``crucible_verifier_anomaly{scope, key}`` to 1 (flagged) or 0 for each check,
    and drop the series of keys that are no longer reported."""
    with _publish_lock:
        current: set[tuple[str, str]] = set()
        for a in anomalies:
            VERIFIER_ANOMALY.labels(scope=a.scope, key=a.key).set(1.0 if a.flagged else 0.0)
            current.add((a.scope, a.key))
        for labels in _published - current:
            VERIFIER_ANOMALY.remove(*labels)
        _published.clear()
        _published.update(current)


def refresh(db: Database, **options: Any) -> list[Anomaly]:
    """``compute_anomalies(db, **options)`` (all tenants unless given), then ``update_gauge``."""
    anomalies = compute_anomalies(db, **options)
    update_gauge(anomalies)
    return anomalies
