"""The anomaly monitor's results for the dashboard, computed at most once per refresh
interval, and not again while the records are unchanged.

``anomaly.compute_anomalies`` and ``anomaly.outcome_rates`` count every record of a scope
(about 20 ms together at 10,000 records, SQLite; 45 before migration 0009); the overview
asks for them on every live refresh of every open page, and the rewards page again.
``MonitorCache`` keeps one result per scope (a tenant, or None for all). Within the
refresh interval it is served as is (a record that arrived meanwhile shows at the next
interval, as on a live panel). After that, since both are functions of the records alone
(no clock), it is kept while a probe of the scope's records is unchanged: their count, the
newest ``created_at`` and how many are verified ok (one pass over a covering index, about
2 ms). Records are only ever added, or a failed one replaced
(``rewards.store(replace_error=)``): an addition changes the count, a failed record
replaced by a verified one the ok count, and a replacement made now the newest time. What
the probe cannot see (a failed record replaced by another failed one dated earlier than
the newest) shows within ``MAX_AGE_REFRESHES`` intervals.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import case, func, select

from service import anomaly
from service.db.engine import Database
from service.db.models import RewardRecordRow

MAX_AGE_REFRESHES = 10
"""Refresh intervals an unchanged probe keeps a result for (``max_age_s`` of the dashboard)."""


@dataclass(frozen=True)
class MonitorView:
    """The spike checks and outcome rates of one scope, as ``anomaly`` computes them."""

    anomalies: list[anomaly.Anomaly]
    rates: list[anomaly.OutcomeRates]


def probe(db: Database, scope: str | None) -> tuple[int, Any, int]:
    """``(count, newest created_at, verified ok count)`` of the scope's records."""
    R = RewardRecordRow
    stmt = select(
        func.count(), func.max(R.created_at), func.sum(case((R.status == "ok", 1), else_=0))
    )
    if scope is not None:
        stmt = stmt.where(R.tenant_id == scope)
    with db.read() as s:
        n, newest, ok = s.execute(stmt).one()
    return int(n), newest, int(ok or 0)


class MonitorCache:
    """Per-scope ``MonitorView``: served as is for ``fresh_s`` seconds (the refresh interval:
    while records stream in, computed at most once per interval), then while the probe is
    unchanged, up to ``max_age_s`` after it was computed.

    Thread-safe (pages render in a thread pool); two requests that miss together both
    compute, and the later result is kept.
    """

    def __init__(
        self,
        fresh_s: float,
        max_age_s: float,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.fresh_s = fresh_s
        self.max_age_s = max_age_s
        self._clock = clock
        self._lock = threading.Lock()
        self._entries: dict[str | None, tuple[float, tuple[int, Any, int], MonitorView]] = {}

    def get(self, db: Database, scope: str | None) -> MonitorView:
        """The scope's view, from the cache when fresh or unchanged, else computed and kept."""
        now = self._clock()
        with self._lock:
            hit = self._entries.get(scope)
        if hit is not None and now - hit[0] < self.fresh_s:
            return hit[2]
        key = probe(db, scope)
        if hit is not None and hit[1] == key and now - hit[0] < self.max_age_s:
            return hit[2]
        view = MonitorView(
            anomalies=anomaly.compute_anomalies(db, tenant_id=scope),
            rates=anomaly.outcome_rates(db, tenant_id=scope),
        )
        with self._lock:
            self._entries[scope] = (now, key, view)
        return view
