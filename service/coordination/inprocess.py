"""Coordination within one process: it is the only refiller and the only replica."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections import Counter
from collections.abc import Callable, Iterator

from service.coordination.base import DemandKey, new_replica_id
from service.coordination.bucket import TokenBuckets

log = logging.getLogger("crucible.coordination")


class InProcessCoordinator:
    """The ``Coordinator`` of a single control plane (no Redis configured).

    Args:
        replica_id: this process's id (generated when omitted).
    """

    def __init__(self, replica_id: str | None = None) -> None:
        self.replica_id = replica_id or new_replica_id()
        self._demand: dict[DemandKey, int] = {}
        self._lock = threading.Lock()
        self._buckets = TokenBuckets()
        self._subs: dict[str, list[Callable[[str], None]]] = {}
        self._busy: Counter[str] = Counter()

    def hold_refill(self, template: str) -> bool:
        """Always True: one process is its deployment's only refiller."""
        return True

    def fence(self, template: str) -> None:
        """None: no fencing. One process is its deployment's only refiller (a lone server
        holds ``service.serverlock``), its "lock" is this object, which never lapses, so
        there is no other holder whose writes a token would have to order against."""
        return None

    def fenced_out(self, template: str, newest: int) -> None:
        """Never called (no tokens are issued); nothing to give up."""

    def put_demand(self, key: DemandKey, size: int) -> None:
        """Keep ``size`` for ``key`` (the larger of the old and the new)."""
        with self._lock:
            self._demand[key] = max(self._demand.get(key, 0), size)

    def drop_demand(self, key: DemandKey) -> None:
        """Forget ``key``."""
        with self._lock:
            self._demand.pop(key, None)

    def demands(self) -> dict[DemandKey, int]:
        """A copy of the demands."""
        with self._lock:
            return dict(self._demand)

    def live_replicas(self) -> set[str] | None:
        """Just this one."""
        return {self.replica_id}

    def take(self, bucket: str, *, rate_per_s: float, burst: int) -> float:
        """One token from the in-memory bucket (see ``TokenBuckets.take``)."""
        return self._buckets.take(bucket, rate_per_s=rate_per_s, burst=burst)

    def publish(self, channel: str, message: str) -> None:
        """Call this process's subscribers of ``channel`` now (a failing one is logged)."""
        for fn in list(self._subs.get(channel, ())):
            try:
                fn(message)
            except Exception:  # noqa: BLE001 - one subscriber must not break the publisher
                log.exception("subscriber of %s failed", channel)

    def subscribe(
        self, channel: str, on_message: Callable[[str], None], on_gap: Callable[[], None]
    ) -> None:
        """Add ``on_message``; in one process nothing is ever missed, so ``on_gap`` is unused."""
        with self._lock:
            self._subs.setdefault(channel, []).append(on_message)

    def listening(self) -> bool:
        """Always: publishing calls the subscribers directly."""
        return True

    @contextlib.contextmanager
    def track(self, item: str) -> Iterator[None]:
        """Count ``item`` as in flight while the context runs."""
        with self._lock:
            self._busy[item] += 1
        try:
            yield
        finally:
            with self._lock:
                self._busy[item] -= 1
                if self._busy[item] <= 0:
                    del self._busy[item]

    def in_flight(self) -> set[str] | None:
        """What this process is in the middle of."""
        with self._lock:
            return set(self._busy)

    def health(self) -> dict[str, object]:
        """In-process coordination is always healthy."""
        return {"backend": "inprocess", "ok": True, "detail": "single process"}

    def start(self) -> None:
        """Nothing runs in the background."""

    def close(self) -> None:
        """Nothing to give up."""
