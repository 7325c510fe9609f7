"""The coordination seam: what replicas of one deployment agree on beyond the database.

Leasing never rests on it (the guarded UPDATEs do); it decides who refills a template's warm
pool, what warm demand the jobs of every replica add up to, which replicas are alive and
what each is in the middle of, per-tenant request rates, and messages every replica hears
(key revocations, the dashboard's event stream).
``InProcessCoordinator`` serves one process; ``RedisCoordinator`` several replicas.
"""

from __future__ import annotations

import os
import secrets
import socket
from collections.abc import Callable
from contextlib import AbstractContextManager
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

    def fence(self, template: str) -> int | None:
        """The fencing token of this replica's latest hold of ``template``'s refill lock (a
        positive int, larger for every new holder), or None when that hold carries no token
        (the backend has none: ``service.pool`` then writes unfenced).

        Read right after ``hold_refill`` returned True and carried with the writes that hold
        decided: a token stays what it was after its lock lapsed (a stale token is what the
        database's check refuses, ``service.pool.advance_fence``).
        """
        ...

    def fenced_out(self, template: str, newest: int) -> None:
        """The database refused a write of ``template`` carrying this replica's token:
        ``newest`` (a larger token) is stored. Give up the lock if still held, and make
        every later token larger than ``newest`` (the token source may have lost its count,
        e.g. Redis restarted without persistence)."""
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

    def take(self, bucket: str, *, rate_per_s: float, burst: int) -> float:
        """Take one token from ``bucket`` (a token bucket refilled at ``rate_per_s`` up to
        ``burst``); 0.0 when taken, else the seconds until one will be there."""
        ...

    def publish(self, channel: str, message: str) -> None:
        """Send ``message`` to every replica's subscribers of ``channel`` (this one's too);
        never blocks the caller on the network."""
        ...

    def subscribe(
        self, channel: str, on_message: Callable[[str], None], on_gap: Callable[[], None]
    ) -> None:
        """Call ``on_message`` for each message on ``channel`` (on a background thread), and
        ``on_gap`` whenever messages may have been missed (the link to the others broke)."""
        ...

    def listening(self) -> bool:
        """True while every message published anywhere reaches this replica's subscribers."""
        ...

    def track(self, item: str) -> AbstractContextManager[None]:
        """Mark ``item`` (``sb:<sandbox id>`` or ``c:<container id>``) as in the hands of
        this replica while the context runs."""
        ...

    def in_flight(self) -> set[str] | None:
        """Items every live replica is in the middle of; None when unknown."""
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
