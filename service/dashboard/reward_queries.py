"""The rewards page's aggregates, counted in SQL over the newest records.

The page plots the newest ``limit`` records (default 10,000) of a scope (a tenant or all,
optionally one domain). Decoding those rows in Python cost most of the page (their
timestamps alone about 100 ms), so the database counts them instead and returns a few
hundred rows (plus one per distinct reward of each group, below):

- ``window``: how many records, and the time they span (which fixes the bucket width);
- ``cells``: per (domain, task, time bucket), verified records (status ok with a reward)
  and how many of them passed (``reward >= threshold``);
- ``statuses``: per (task, domain), records by verifier status, and the newest time;
- ``rewards``: per (domain, reward), how many verified records scored it (histograms);
- ``groups``: per (task, group, reward), how many verified records scored it, for the
  groups with two or more verified members (the only ones with a spread), so group
  statistics are exact (``stats``) without reading each record.

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
    and_,
    case,
    cast,
    extract,
    func,
    select,
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
            for t, g, r, k in s.execute(_group_values(db, tenant, domain, limit, verified, c))
        ]
    return RewardAggregates(int(n), oldest, newest, width, cells, statuses, counted, groups)


def _group_values(
    db: Database, tenant: str | None, domain: str | None, limit: int, verified: Any, c: Any
) -> Select[Any]:
    """(task, group, reward, count) of the verified records of groups with two or more of
    them, so the groups of one (no spread) are not fetched.

    The group's size is a window over the grouped rows on PostgreSQL; on SQLite, where that
    window cost about 30 ms at 10,000 records, a join with the groups' sizes (SQLite indexes
    the joined subquery itself; PostgreSQL, before its statistics are gathered, chose a
    nested loop over it that took seconds).
    """
    k = func.count().label("k")
    if db.engine.dialect.name != "sqlite":
        size = func.sum(func.count()).over(partition_by=(c.task_id, c.group_id)).label("size")
        sized = (
            select(c.task_id, c.group_id, c.reward, k, size)
            .where(verified)
            .group_by(c.task_id, c.group_id, c.reward)
            .subquery()
        )
        w = sized.c
        return select(w.task_id, w.group_id, w.reward, w.k).where(w.size >= 2)
    per_value = (
        select(c.task_id, c.group_id, c.reward, k)
        .where(verified)
        .group_by(c.task_id, c.group_id, c.reward)
        .subquery()
    )
    o = _newest(tenant, domain, limit).c
    shared = (
        select(o.task_id, o.group_id)
        .where(o.status == "ok", o.reward.is_not(None))
        .group_by(o.task_id, o.group_id)
        .having(func.count() >= 2)
        .subquery()
    )
    v = per_value.c
    return select(v.task_id, v.group_id, v.reward, v.k).join(
        shared, and_(shared.c.task_id == v.task_id, shared.c.group_id == v.group_id)
    )


def _utc(value: datetime | str) -> datetime:
    """An aggregate's time as an aware UTC datetime (whichever form the driver returns)."""
    when = datetime.fromisoformat(value) if isinstance(value, str) else value
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)
