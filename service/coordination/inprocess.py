"""Coordination within one process: it is the only refiller and the only replica."""

from __future__ import annotations

import threading

from service.coordination.base import DemandKey, new_replica_id


class InProcessCoordinator:
    """The ``Coordinator`` of a single control plane (no Redis configured).

    Args:
        replica_id: this process's id (generated when omitted).
    """

    def __init__(self, replica_id: str | None = None) -> None:
        self.replica_id = replica_id or new_replica_id()
        self._demand: dict[DemandKey, int] = {}
        self._lock = threading.Lock()

    def hold_refill(self, template: str) -> bool:
        """Always True: one process is its deployment's only refiller."""
        return True

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

    def health(self) -> dict[str, object]:
        """In-process coordination is always healthy."""
        return {"backend": "inprocess", "ok": True, "detail": "single process"}

    def start(self) -> None:
        """Nothing runs in the background."""

    def close(self) -> None:
        """Nothing to give up."""
