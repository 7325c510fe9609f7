"""The coordination seam: what replicas of one deployment agree on beyond the database.

Leasing never rests on it (the guarded UPDATEs do); it decides who refills a template's warm
pool, what warm demand the jobs of every replica add up to, and which replicas are alive.
``InProcessCoordinator`` serves one process; ``RedisCoordinator`` several replicas.
"""

from __future__ import annotations

import os
import secrets
import socket
from typing import Protocol

# A demand is what a job of ``owner`` (a tenant id, or None) asks of ``template``.
DemandKey = tuple[str | None, str]

LABEL_REPLICA = "crucible.replica"


def new_replica_id() -> str:
    """A replica id unique to this process: ``<host>-<pid>-<8 hex>``."""
    return f"{socket.gethostname()[:32]}-{os.getpid()}-{secrets.token_hex(4)}"


class Coordinator(Protocol):
    """What the pool loop and recovery ask of the replicas' shared state.

    Every method is safe to call when the backing store is down: it falls back (see each
    implementation) instead of raising.
    """

    replica_id: str

    def hold_refill(self, template: str) -> bool:
        """True when this replica is ``template``'s one refiller now (take or keep the lock)."""
        ...

    def put_demand(self, key: DemandKey, size: int) -> None:
        """Record this replica's demand ``size`` for ``key`` (kept alive while we are)."""
        ...

    def drop_demand(self, key: DemandKey) -> None:
        """Forget ``key``'s demand on every replica."""
        ...

    def demands(self) -> dict[DemandKey, int]:
        """Every live replica's demands combined (the largest per key)."""
        ...

    def live_replicas(self) -> set[str] | None:
        """Ids of replicas whose heartbeat is fresh (this one included); None when unknown."""
        ...

    def health(self) -> dict[str, object]:
        """``{"backend": ..., "ok": bool, "detail": str}`` for ``/readyz`` and metrics."""
        ...

    def start(self) -> None:
        """Start background renewal (heartbeat, demand, locks)."""
        ...

    def close(self) -> None:
        """Stop renewal and give up what this replica holds (idempotent)."""
        ...
