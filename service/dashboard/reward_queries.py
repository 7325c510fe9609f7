"""The rewards page's aggregates over the newest records (SQLite: one read and one pass).

The page plots the newest ``limit`` records (default 10,000) of a scope (a tenant or all,
optionally one domain). They are read once through a covering index (``_newest``; no
record's row, no JSON), with their time undecoded (decoding 10,000 timestamps into
datetimes cost about 100 ms) and as whole epoch seconds, and counted in one pass in Python
into a few hundred figures (plus one per distinct reward of each group, below):

- ``window``: how many records, and the time they span (which fixes the bucket width);
- ``cells``: per (domain, task, time bucket), verified records (status ok with a reward)
  and how many of them passed (``reward >= threshold``);
- ``statuses``: per (task, domain), records by verifier status, and the newest time;
- ``rewards``: per (domain, reward), how many verified records scored it (histograms);
- ``groups``: per (task, group, reward), how many verified records scored it, for the
  groups with two or more verified members (the only ones with a spread), so group
  statistics are exact (``stats``) without keeping each record.

That is how SQLite counts them. There, one GROUP BY per figure over the newest records
cost about 85 ms CPU at 10,000 records: each sorts them in a temporary B-tree (15 to 50 ms
apiece), while the read is about 20 ms and the pass about 10 ms. PostgreSQL counts them in
SQL (hash aggregates: about 13 ms, against 55 ms for the read and the pass, most of it the
driver decoding 10,000 timestamps), so it returns the figures alone.

A bucket's start is ``floor(epoch_s / width) * width`` (epoch seconds, UTC), which for a
whole-second ``width`` equals the same division of the fractional timestamp.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Integer,
    Select,
    String,
    and_,
    case,
    cast,
    extract,
    func,
    select,
    type_coerce,
)

from service.db.engine import Database
from service.db.models import RewardRecordRow

LIMIT = 10_000
"""Newest records the rewards page aggregates."""


@dataclass(frozen=True)
class Cell:
    """Verified and passed record counts of one (domain, task, bucket starting at ``start_s``)."""

    domain: str
    task_id: str
    start_s: float
    verified: int
    passed: int


@dataclass(frozen=True)
class StatusCount:
    """Records of one (task, domain) with one verifier status; ``newest`` is the latest
    ``created_at`` among them (UTC)."""

    task_id: str
    domain: str
    status: str
    count: int
    newest: datetime


@dataclass(frozen=True)
class RewardCount:
    """Verified records of one domain that scored exactly ``reward``."""

    domain: str
    reward: float
    count: int


@dataclass(frozen=True)
class GroupValue:
    """Verified records of one (task, group) that scored exactly ``reward``."""

    task_id: str
    group_id: str
    reward: float
    count: int


@dataclass(frozen=True)
class RewardAggregates:
    """Everything the rewards page plots, for ``n`` records from ``oldest`` to ``newest``
    (both None when ``n`` is 0), bucketed ``bucket_s`` seconds wide."""

    n: int
    oldest: datetime | None
    newest: datetime | None
    bucket_s: int
    cells: list[Cell]
    statuses: list[StatusCount]
    rewards: list[RewardCount]
    groups: list[GroupValue]


def _newest(tenant: str | None, domain: str | None, limit: int) -> Any:
    """The newest ``limit`` records of the scope, as a subquery."""
    R = RewardRecordRow
    stmt: Select[Any] = select(
        R.task_id, R.domain, R.group_id, R.reward, R.status, R.created_at
    ).order_by(R.created_at.desc())
    if tenant is not None:
        stmt = stmt.where(R.tenant_id == tenant)
    if domain:
        stmt = stmt.where(R.domain == domain)
    return stmt.limit(limit).subquery()


def _epoch_s(db: Database, column: Any) -> Any:
    """Whole epoch seconds (UTC) of a ``UTCDateTime`` column, as an integer expression."""
    if db.engine.dialect.name == "sqlite":
        # Stored as 'YYYY-MM-DD HH:MM:SS.ffffff' (UTC). SQLite's date functions keep only
        # milliseconds, rounding 23:59:59.9999995 up into the next bucket: the fraction is
        # cut off before they see it.
        return cast(func.strftime("%s", func.substr(column, 1, 19)), Integer)
    return cast(func.floor(extract("epoch", column)), BigInteger)


def aggregates(
    db: Database,
    *,
    tenant: str | None,
    domain: str | None,
    bucket_width: Callable[[datetime | None, datetime | None], int],
    threshold: float,
    limit: int = LIMIT,
) -> RewardAggregates:
    """Count the newest ``limit`` records of the scope (module docstring).

    Args:
        tenant: only this tenant's records; None: every tenant's.
        domain: only this domain's; None or empty: all.
        bucket_width: ``(oldest, newest) -> width_s`` (whole seconds), called with the span
            of the records found.
        threshold: a verified record passes when ``reward >= threshold``.
        limit: how many of the newest records.
    """
    if db.engine.dialect.name == "sqlite":
        return _counted_in_python(db, tenant, domain, bucket_width, threshold, limit)
    return _counted_in_sql(db, tenant, domain, bucket_width, threshold, limit)


def _counted_in_python(
    db: Database,
    tenant: str | None,
    domain: str | None,
    bucket_width: Callable[[datetime | None, datetime | None], int],
    threshold: float,
    limit: int,
) -> RewardAggregates:
    """SQLite: one read of the newest records and one pass over them (module docstring)."""
    c = _newest(tenant, domain, limit).c
    # The time comes back undecoded (SQLite: the stored text, whose order is the time's;
    # PostgreSQL: the driver's datetime), and as whole epoch seconds for the buckets.
    stmt = select(
        c.domain,
        c.task_id,
        c.group_id,
        c.reward,
        c.status,
        _epoch_s(db, c.created_at),
        type_coerce(c.created_at, String),
    )
    with db.read() as s:  # on the session's connection: ORM row loading cost about 8 ms
        rows = s.connection().execute(stmt).all()
    if not rows:
        return RewardAggregates(0, None, None, bucket_width(None, None), [], [], [], [])
    oldest = _utc(min(r[6] for r in rows))
    newest = _utc(max(r[6] for r in rows))
    width = int(bucket_width(oldest, newest))
    cells: dict[tuple[str, str, int], list[int]] = {}
    statuses: dict[tuple[str, str, str], list[Any]] = {}
    counted: dict[tuple[str, float], int] = {}
    groups: dict[tuple[str, str], dict[float, int]] = {}
    for d, t, g, reward, status, epoch, at in rows:
        seen = statuses.get((t, d, status))
        if seen is None:
            statuses[(t, d, status)] = [1, at]
        else:
            seen[0] += 1
            if at > seen[1]:
                seen[1] = at
        if status != "ok" or reward is None:
            continue
        epoch = int(epoch)
        cell = cells.setdefault((d, t, epoch - epoch % width), [0, 0])
        cell[0] += 1
        cell[1] += reward >= threshold
        counted[(d, reward)] = counted.get((d, reward), 0) + 1
        values = groups.setdefault((t, g), {})
        values[reward] = values.get(reward, 0) + 1
    return RewardAggregates(
        len(rows),
        oldest,
        newest,
        width,
        [Cell(d, t, float(b), v, p) for (d, t, b), (v, p) in cells.items()],
        [StatusCount(t, d, st, k, _utc(w)) for (t, d, st), (k, w) in statuses.items()],
        [RewardCount(d, float(r), k) for (d, r), k in counted.items()],
        [
            GroupValue(t, g, float(r), k)
            for (t, g), values in groups.items()
            if sum(values.values()) >= 2
            for r, k in values.items()
        ],
    )


def _counted_in_sql(
    db: Database,
    tenant: str | None,
    domain: str | None,
    bucket_width: Callable[[datetime | None, datetime | None], int],
    threshold: float,
    limit: int,
) -> RewardAggregates:
    """PostgreSQL: one GROUP BY per figure over the newest records (module docstring)."""
    sq = _newest(tenant, domain, limit)
    c = sq.c
    verified = and_(c.status == "ok", c.reward.is_not(None))
    with db.read() as s:
        n, oldest, newest = s.execute(
            select(func.count(), func.min(c.created_at), func.max(c.created_at))
        ).one()
        if not n:
            return RewardAggregates(0, None, None, bucket_width(None, None), [], [], [], [])
        oldest, newest = _utc(oldest), _utc(newest)
        width = int(bucket_width(oldest, newest))
        epoch = _epoch_s(db, c.created_at)
        start = epoch - epoch % width
        cells = [
            Cell(d, t, float(b), int(v), int(p))
            for d, t, b, v, p in s.execute(
                select(
                    c.domain,
                    c.task_id,
                    start,
                    func.count(),
                    func.sum(case((c.reward >= threshold, 1), else_=0)),
                )
                .where(verified)
                .group_by(c.domain, c.task_id, start)
            )
        ]
        statuses = [
            StatusCount(t, d, st, int(k), _utc(w))
            for t, d, st, k, w in s.execute(
                select(
                    c.task_id, c.domain, c.status, func.count(), func.max(c.created_at)
                ).group_by(c.task_id, c.domain, c.status)
            )
        ]
        counted = [
            RewardCount(d, float(r), int(k))
            for d, r, k in s.execute(
                select(c.domain, c.reward, func.count())
                .where(verified)
                .group_by(c.domain, c.reward)
            )
        ]
        groups = [
            GroupValue(t, g, float(r), int(k))
            for t, g, r, k in s.execute(_group_values(verified, c))
        ]
    return RewardAggregates(int(n), oldest, newest, width, cells, statuses, counted, groups)


def _group_values(verified: Any, c: Any) -> Select[Any]:
    """(task, group, reward, count) of the verified records of groups with two or more of
    them, so the groups of one (no spread) are not fetched; the group's size is a window
    over the grouped rows (a join with the groups' sizes: PostgreSQL, before its statistics
    are gathered, chose a nested loop over it that took seconds)."""
    k = func.count().label("k")
    size = func.sum(func.count()).over(partition_by=(c.task_id, c.group_id)).label("size")
    sized = (
        select(c.task_id, c.group_id, c.reward, k, size)
        .where(verified)
        .group_by(c.task_id, c.group_id, c.reward)
        .subquery()
    )
    w = sized.c
    return select(w.task_id, w.group_id, w.reward, w.k).where(w.size >= 2)


def _utc(value: datetime | str) -> datetime:
    """An aggregate's time as an aware UTC datetime (whichever form the driver returns)."""
    when = datetime.fromisoformat(value) if isinstance(value, str) else value
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)
