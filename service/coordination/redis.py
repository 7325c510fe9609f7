"""Coordination of several replicas through Redis, with fallbacks while Redis is down.

Keys (prefix ``crucible:<deployment>:``):

- ``replica:<id>``: a replica's heartbeat, ``EX ttl``, renewed every ``ttl/3`` s.
- ``refill:<template>``: the refill lock, ``<replica id>:<fencing token>``, ``PX ttl``;
  the token is ``INCR fence:<template>``, so each new holder's is larger than any before.
  Renewal is compare-and-expire (a Lua script): a holder whose lock lapsed and was taken
  learns it on its next renewal and stops refilling.
- ``demand:<replica id>``: a hash ``json([owner, template]) -> size``, ``EX ttl``, renewed
  with the heartbeat, so a dead replica's demand expires with it. ``drop_demand`` deletes
  the field from every replica's hash (any replica may end the job that asked).

While Redis cannot be reached: refill locks fall back to PostgreSQL advisory locks
(``pglock``: one refiller still), demand is this replica's own, the live replica set is
unknown (recovery then touches nothing another replica may own), and ``health`` says so.
"""

from __future__ import annotations

import json
import logging
import threading
import time

import redis

from service.coordination.base import DemandKey, new_replica_id
from service.coordination.pglock import AdvisoryLocks

log = logging.getLogger("crucible.coordination")

_RENEW = """
if redis.call('get', KEYS[1]) == ARGV[1] then
  return redis.call('pexpire', KEYS[1], ARGV[2])
end
return 0
"""
_RELEASE = """
if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end
return 0
"""


class RedisCoordinator:
    """The ``Coordinator`` of a replica that shares Redis with the others.

    Args:
        url: the Redis URL (``CRUCIBLE_REDIS_URL``). deployment: namespaces every key.
        db_url: the database URL (advisory-lock fallback). ttl_s: heartbeat, demand and lock
        lifetime in seconds (a dead replica's locks and demand are gone after it).
        replica_id: this process's id (generated when omitted).
    """

    def __init__(
        self,
        url: str,
        *,
        deployment: str,
        db_url: str,
        ttl_s: float = 10.0,
        replica_id: str | None = None,
    ) -> None:
        self.replica_id = replica_id or new_replica_id()
        self.ttl_s = ttl_s
        self._r = redis.Redis.from_url(
            url, socket_timeout=1.0, socket_connect_timeout=1.0, decode_responses=True
        )
        self._p = f"crucible:{deployment}:"
        self._renew = self._r.register_script(_RENEW)
        self._release = self._r.register_script(_RELEASE)
        self._pg = AdvisoryLocks(db_url, deployment)
        self._held: dict[str, int] = {}  # template -> fencing token (Redis lock)
        self._demand: dict[DemandKey, int] = {}  # this replica's own (fallback, renewal)
        self._ok, self._detail = True, "not checked yet"
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- state -----------------------------------------------------------------------------

    def _failed(self, what: str, e: Exception) -> None:
        if self._ok:
            log.warning("redis unreachable (%s): %s; refill falls back to one replica", what, e)
        self._ok, self._detail = False, f"{what}: {e}"

    def _fine(self) -> None:
        if not self._ok:
            log.info("redis reachable again")
        self._ok, self._detail = True, "ok"

    @property
    def _ms(self) -> int:
        return int(self.ttl_s * 1000)

    # -- refill lock -----------------------------------------------------------------------

    def fence(self, template: str) -> int | None:
        """The fencing token of ``template``'s lock while this replica holds it."""
        with self._lock:
            return self._held.get(template)

    def hold_refill(self, template: str) -> bool:
        """Take or keep ``template``'s refill lock (Redis; advisory lock while it is down)."""
        key = f"{self._p}refill:{template}"
        try:
            with self._lock:
                token = self._held.get(template)
            if token is not None:
                if self._renew(keys=[key], args=[f"{self.replica_id}:{token}", self._ms]):
                    self._fine()
                    self._pg.release(template)
                    return True
                with self._lock:
                    self._held.pop(template, None)
            if self._r.exists(key):
                self._fine()
                self._pg.release(template)
                return False
            token = int(self._r.incr(f"{self._p}fence:{template}"))
            got = bool(self._r.set(key, f"{self.replica_id}:{token}", nx=True, px=self._ms))
            self._fine()
            self._pg.release(template)
            if got:
                with self._lock:
                    self._held[template] = token
            return got
        except redis.RedisError as e:
            self._failed("refill lock", e)
            with self._lock:
                self._held.pop(template, None)
            return self._pg.hold(template)

    # -- demand ----------------------------------------------------------------------------

    @staticmethod
    def _field(key: DemandKey) -> str:
        return json.dumps([key[0], key[1]])

    def put_demand(self, key: DemandKey, size: int) -> None:
        """Record ``size`` (the larger of the old and the new) in this replica's hash."""
        with self._lock:
            size = max(self._demand.get(key, 0), size)
            self._demand[key] = size
        mine = f"{self._p}demand:{self.replica_id}"
        try:
            pipe = self._r.pipeline()
            pipe.hset(mine, self._field(key), size)
            pipe.expire(mine, int(self.ttl_s) + 1)
            pipe.execute()
            self._fine()
        except redis.RedisError as e:
            self._failed("put demand", e)

    def drop_demand(self, key: DemandKey) -> None:
        """Delete ``key`` from every replica's demand hash (and this replica's own)."""
        with self._lock:
            self._demand.pop(key, None)
        try:
            field = self._field(key)
            for name in self._r.scan_iter(f"{self._p}demand:*", count=100):
                self._r.hdel(name, field)
            self._fine()
        except redis.RedisError as e:
            self._failed("drop demand", e)

    def demands(self) -> dict[DemandKey, int]:
        """Every live replica's demands, the largest per key (this replica's own while
        Redis is down)."""
        try:
            out: dict[DemandKey, int] = {}
            for name in self._r.scan_iter(f"{self._p}demand:*", count=100):
                for field, n in self._r.hgetall(name).items():
                    owner, template = json.loads(field)
                    out[(owner, template)] = max(out.get((owner, template), 0), int(n))
            self._fine()
            return out
        except redis.RedisError as e:
            self._failed("read demand", e)
            with self._lock:
                return dict(self._demand)

    # -- replicas --------------------------------------------------------------------------

    def live_replicas(self) -> set[str] | None:
        """Replica ids with a fresh heartbeat; None while Redis cannot be reached."""
        try:
            n = len(f"{self._p}replica:")
            ids = {k[n:] for k in self._r.scan_iter(f"{self._p}replica:*", count=100)}
            self._fine()
            return ids | {self.replica_id}
        except redis.RedisError as e:
            self._failed("list replicas", e)
            return None

    def _beat(self) -> None:
        """Heartbeat, demand and lock renewal; a demand field another replica dropped is
        forgotten here too (the hash is the truth while Redis answers)."""
        mine = f"{self._p}demand:{self.replica_id}"
        try:
            pipe = self._r.pipeline()
            pipe.set(f"{self._p}replica:{self.replica_id}", str(time.time()), ex=int(self.ttl_s))
            pipe.expire(mine, int(self.ttl_s) + 1)
            pipe.hkeys(mine)
            fields = set(pipe.execute()[2])
            with self._lock:
                self._demand = {k: n for k, n in self._demand.items() if self._field(k) in fields}
                held = dict(self._held)
            for template, token in held.items():
                key = f"{self._p}refill:{template}"
                if not self._renew(keys=[key], args=[f"{self.replica_id}:{token}", self._ms]):
                    with self._lock:
                        self._held.pop(template, None)
            self._fine()
        except redis.RedisError as e:
            self._failed("heartbeat", e)

    def health(self) -> dict[str, object]:
        """Redis reachability (pinged now) and which refill lock is in force."""
        try:
            self._r.ping()
            self._fine()
        except redis.RedisError as e:
            self._failed("ping", e)
        return {
            "backend": "redis",
            "ok": self._ok,
            "detail": self._detail,
            "refill_lock": "redis" if self._ok else "postgres-advisory (degraded)",
        }

    def _run(self) -> None:
        while not self._stop.wait(self.ttl_s / 3):
            self._beat()

    def start(self) -> None:
        """Register this replica and start renewing every ``ttl_s / 3`` seconds."""
        self._beat()
        self._thread = threading.Thread(target=self._run, name="crucible-coord", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop renewing; delete the heartbeat, demand hash and held locks (best effort)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        try:
            with self._lock:
                held = dict(self._held)
                self._held.clear()
            for template, token in held.items():
                self._release(
                    keys=[f"{self._p}refill:{template}"], args=[f"{self.replica_id}:{token}"]
                )
            self._r.delete(
                f"{self._p}replica:{self.replica_id}", f"{self._p}demand:{self.replica_id}"
            )
        except redis.RedisError as e:
            log.info("redis clean-up at close failed: %s", e)
        self._pg.close()
        self._r.close()
