"""The anomaly monitor's results for the dashboard, computed at most once per refresh.

``anomaly.compute_anomalies`` and ``anomaly.outcome_rates`` rank every verified record of
a scope (about 75 ms together at 10,000 records); the overview asks for them on every live
refresh of every open page, and the rewards page again. ``MonitorCache`` keeps one result
per scope (a tenant, or None for all) for ``ttl_s`` seconds (the dashboard's refresh
interval), and only while the scope's records are unchanged: a cheap probe (count and
newest ``created_at``, one index range) is part of the key, so a new record shows at once
and a replaced one within ``ttl_s``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select

from service import anomaly
from service.db.engine import Database
from service.db.models import RewardRecordRow


@dataclass(frozen=True)
class MonitorView:
    """The spike checks and outcome rates of one scope, as ``anomaly`` computes them."""

    anomalies: list[anomaly.Anomaly]
    rates: list[anomaly.OutcomeRates]


def probe(db: Database, scope: str | None) -> tuple[int, Any]:
    """``(count, newest created_at)`` of the scope's records: changes when one is added."""
    R = RewardRecordRow
    stmt = select(func.count(), func.max(R.created_at))
    if scope is not None:
        stmt = stmt.where(R.tenant_id == scope)
    with db.read() as s:
        n, newest = s.execute(stmt).one()
    return int(n), newest


class MonitorCache:
    """Per-scope ``MonitorView`` kept ``ttl_s`` seconds while the probe is unchanged.

    Thread-safe (pages render in a thread pool); two requests that miss together both
    compute, and the later result is kept.
    """

    def __init__(self, ttl_s: float, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s = ttl_s
        self._clock = clock
        self._lock = threading.Lock()
        self._entries: dict[str | None, tuple[float, tuple[int, Any], MonitorView]] = {}

    def get(self, db: Database, scope: str | None) -> MonitorView:
        """The scope's view, from the cache when fresh, else computed and kept."""
        key = probe(db, scope)
        now = self._clock()
        with self._lock:
            hit = self._entries.get(scope)
        if hit is not None and hit[1] == key and now - hit[0] < self.ttl_s:
            return hit[2]
        view = MonitorView(
            anomalies=anomaly.compute_anomalies(db, tenant_id=scope),
            rates=anomaly.outcome_rates(db, tenant_id=scope),
        )
        with self._lock:
            self._entries[scope] = (now, key, view)
        return view
