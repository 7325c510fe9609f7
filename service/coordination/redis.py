"""Coordination of several replicas through Redis, with fallbacks while Redis is down.

Keys (prefix ``crucible:<deployment>:``):

- ``replica:<id>``: a replica's heartbeat, ``EX ttl``, renewed every ``ttl/3`` s.
- ``refill:<template>``: the refill lock, ``<replica id>:<fencing token>``, ``PX ttl``;
  the token is ``INCR fence:<template>``, so each new holder's is larger than any before.
  Renewal is compare-and-expire (a Lua script): a holder whose lock lapsed and was taken
  learns it on its next renewal and stops refilling. A holder paused past the lapse may not
  renew before it writes, so the database checks the token (``service.pool.advance_fence``,
  table ``refill_fences``: a write carrying a token older than the newest stored is
  refused; Kleppmann, "How to do distributed locking", 2016). A refused holder raises
  ``fence:<template>`` to at least the stored token (``fenced_out``), so a counter Redis
  lost (restart without persistence) cannot leave every later holder refused.
- ``rate:<bucket>``: a token bucket (hash ``tokens``, ``ts``), taken by one Lua script on
  Redis's clock (``TIME``), so every replica draws from the same bucket.
- ``inflight:<replica id>``: a set of what the replica is in the middle of (``sb:<id>``
  starts, ``c:<container>`` commits), ``EX ttl`` renewed with the heartbeat.
- ``chan:<name>``: pub/sub channels (key revocations, events); one listener thread per
  replica, publishing from a queue on a thread of its own (a request never waits on Redis).
- ``demand:<replica id>``: a hash ``json([owner, template]) -> size``, ``EX ttl``, renewed
  with the heartbeat, so a dead replica's demand expires with it. ``drop_demand`` deletes
  the field from every replica's hash (any replica may end the job that asked).

While Redis cannot be reached: refill locks fall back to PostgreSQL advisory locks
(``pglock``: one refiller still; its holds carry no token, so those writes are unfenced),
demand is this replica's own, the live replica set is
unknown (recovery then touches nothing another replica may own), rate limits are this
replica's own buckets, subscribers are told of the gap (``on_gap``), and ``health`` says so.
"""

from __future__ import annotations

import contextlib
import json
import logging
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator

import redis

from service.coordination.base import DemandKey, new_replica_id
from service.coordination.bucket import TokenBuckets
from service.coordination.pglock import AdvisoryLocks

log = logging.getLogger("crucible.coordination")

_RENEW = """
if redis.call('get', KEYS[1]) == ARGV[1] then
  return redis.call('pexpire', KEYS[1], ARGV[2])
end
return 0
"""
_TAKE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local rate, burst = tonumber(ARGV[1]), tonumber(ARGV[2])
local v = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local tokens, ts = tonumber(v[1]) or burst, tonumber(v[2]) or now
tokens = math.min(burst, tokens + math.max(0, now - ts) * rate)
local wait = 0
if tokens >= 1 then tokens = tokens - 1 else wait = (1 - tokens) / rate end
redis.call('HSET', KEYS[1], 'tokens', string.format('%.6f', tokens),
           'ts', string.format('%.6f', now))
redis.call('PEXPIRE', KEYS[1], math.ceil(burst / rate * 1000) + 1000)
return string.format('%.6f', wait)
"""
_RAISE = """
if tonumber(redis.call('get', KEYS[1]) or '0') < tonumber(ARGV[1]) then
  redis.call('set', KEYS[1], ARGV[1])
end
return 1
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
        self._take = self._r.register_script(_TAKE)
        self._raise = self._r.register_script(_RAISE)
        self._url = url
        self._buckets = TokenBuckets()  # while Redis is down
        self._subs: dict[str, list[tuple[Callable[[str], None], Callable[[], None]]]] = {}
        self._listening = False
        self._listener: threading.Thread | None = None
        self._outbox: queue.SimpleQueue[tuple[str, str] | None] = queue.SimpleQueue()
        self._publisher: threading.Thread | None = None
        self._busy: Counter[str] = Counter()
        self._pg = AdvisoryLocks(db_url, deployment)
        self._held: dict[str, int] = {}  # template -> fencing token (Redis lock)
        self._tokens: dict[str, int | None] = {}  # template -> token of the latest hold
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
        """The fencing token of this replica's latest hold of ``template``'s lock: the
        ``INCR fence:<template>`` value it took the Redis lock with (kept after the lock
        lapses: the database refuses it once a newer holder wrote); None when the latest
        hold was the advisory-lock fallback (no token) or there was none."""
        with self._lock:
            return self._tokens.get(template)

    def fenced_out(self, template: str, newest: int) -> None:
        """A write with this replica's token was refused, ``newest`` being stored: raise
        ``fence:<template>`` to at least ``newest`` (Lua, atomic; the next ``INCR`` exceeds
        it) and give up the lock if the token held is older than ``newest``. Redis errors
        are recorded (``health``), not raised."""
        key = f"{self._p}refill:{template}"
        with self._lock:
            token = self._held.get(template)
            stale = token is not None and token < newest
            if stale:
                self._held.pop(template, None)
        log.warning(
            "refill of %s fenced out: a newer holder's token %d is stored", template, newest
        )
        try:
            self._raise(keys=[f"{self._p}fence:{template}"], args=[newest])
            if stale:
                self._release(keys=[key], args=[f"{self.replica_id}:{token}"])
            self._fine()
        except redis.RedisError as e:
            self._failed("raise fence", e)

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
                    with self._lock:
                        self._tokens[template] = token
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
                    self._tokens[template] = token
            return got
        except redis.RedisError as e:
            self._failed("refill lock", e)
            with self._lock:
                self._held.pop(template, None)
            held = self._pg.hold(template)
            if held:
                with self._lock:
                    self._tokens[template] = None  # an advisory hold has no token
            return held

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

    # -- rate limits -----------------------------------------------------------------------

    def take(self, bucket: str, *, rate_per_s: float, burst: int) -> float:
        """One token from the shared bucket (this replica's own while Redis is down)."""
        try:
            wait = float(self._take(keys=[f"{self._p}rate:{bucket}"], args=[rate_per_s, burst]))
            if not self._ok:
                self._fine()
            return wait
        except redis.RedisError as e:
            self._failed("rate limit", e)
            return self._buckets.take(bucket, rate_per_s=rate_per_s, burst=burst)

    # -- messages --------------------------------------------------------------------------

    def publish(self, channel: str, message: str) -> None:
        """Queue ``message`` for the publisher thread (started on first use)."""
        with self._lock:
            if self._publisher is None and not self._stop.is_set():
                self._publisher = threading.Thread(
                    target=self._publish_loop, name="crucible-coord-pub", daemon=True
                )
                self._publisher.start()
        self._outbox.put((channel, message))

    def _publish_loop(self) -> None:
        while True:
            item = self._outbox.get()
            if item is None:
                return
            channel, message = item
            try:
                self._r.publish(f"{self._p}chan:{channel}", message)
            except redis.RedisError as e:
                self._failed("publish", e)
                self._deliver(channel, message)  # this replica's subscribers still hear it

    def _deliver(self, channel: str, message: str) -> None:
        for on_message, _ in list(self._subs.get(channel, ())):
            try:
                on_message(message)
            except Exception:  # noqa: BLE001 - one subscriber must not stop the listener
                log.exception("subscriber of %s failed", channel)

    def _gap(self) -> None:
        for subs in list(self._subs.values()):
            for _, on_gap in subs:
                with contextlib.suppress(Exception):
                    on_gap()

    def subscribe(
        self, channel: str, on_message: Callable[[str], None], on_gap: Callable[[], None]
    ) -> None:
        """Register the callbacks; the listener thread (re)subscribes to every channel."""
        with self._lock:
            if channel not in self._subs:
                self._listening = False  # until the listener has subscribed to it too
            self._subs.setdefault(channel, []).append((on_message, on_gap))
            start = self._listener is None and self._thread is not None
        if start:
            self._start_listener()

    def listening(self) -> bool:
        """True while the listener is subscribed to every channel."""
        return self._listening

    def _start_listener(self) -> None:
        with self._lock:
            if self._listener is not None:
                return
            self._listener = threading.Thread(
                target=self._listen, name="crucible-coord-sub", daemon=True
            )
        self._listener.start()

    def _listen(self) -> None:
        """Subscribe, dispatch, and on any failure report a gap and reconnect (1 s apart)."""
        client = redis.Redis.from_url(
            self._url, socket_connect_timeout=1.0, socket_timeout=5.0, decode_responses=True
        )
        n = len(f"{self._p}chan:")
        while not self._stop.is_set():
            ps = client.pubsub(ignore_subscribe_messages=True)
            try:
                with self._lock:
                    names = set(self._subs)
                ps.subscribe(*(f"{self._p}chan:{c}" for c in names))
                self._listening = True
                self._gap()  # anything cached before this subscription may be stale
                while not self._stop.is_set():
                    with self._lock:
                        if set(self._subs) != names:
                            break
                    m = ps.get_message(timeout=0.5)
                    if m is not None and m["type"] == "message":
                        self._deliver(m["channel"][n:], m["data"])
            except (redis.RedisError, OSError) as e:
                self._listening = False
                self._failed("subscribe", e)
                self._gap()
                self._stop.wait(1.0)
            finally:
                with contextlib.suppress(redis.RedisError, OSError):
                    ps.close()
        self._listening = False
        client.close()

    # -- work in flight --------------------------------------------------------------------

    @contextlib.contextmanager
    def track(self, item: str) -> Iterator[None]:
        """``item`` is in this replica's ``inflight`` set while the context runs."""
        mine = f"{self._p}inflight:{self.replica_id}"
        with self._lock:
            self._busy[item] += 1
        try:
            pipe = self._r.pipeline()
            pipe.sadd(mine, item)
            pipe.expire(mine, int(self.ttl_s) + 1)
            pipe.execute()
        except redis.RedisError as e:
            self._failed("track", e)  # the heartbeat adds it once Redis answers
        try:
            yield
        finally:
            with self._lock:
                self._busy[item] -= 1
                gone = self._busy[item] <= 0
                if gone:
                    del self._busy[item]
            if gone:
                try:
                    self._r.srem(mine, item)
                except redis.RedisError as e:
                    self._failed("untrack", e)

    def in_flight(self) -> set[str] | None:
        """The union of every live replica's ``inflight`` set; None while Redis is down."""
        live = self.live_replicas()
        if live is None:
            return None
        try:
            names = [f"{self._p}inflight:{r}" for r in live]
            out = set(self._r.sunion(names)) if names else set()
            with self._lock:
                return out | set(self._busy)
        except redis.RedisError as e:
            self._failed("read in flight", e)
            return None

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
            with self._lock:
                busy = list(self._busy)
            flight = f"{self._p}inflight:{self.replica_id}"
            if busy:
                pipe.sadd(flight, *busy)
            pipe.expire(flight, int(self.ttl_s) + 1)
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
            "subscribed": self._listening,
        }

    def _run(self) -> None:
        while not self._stop.wait(self.ttl_s / 3):
            self._beat()

    def start(self) -> None:
        """Register this replica and start renewing every ``ttl_s / 3`` seconds."""
        self._beat()
        self._thread = threading.Thread(target=self._run, name="crucible-coord", daemon=True)
        self._thread.start()
        if self._subs:
            self._start_listener()

    def close(self) -> None:
        """Stop renewing; delete the heartbeat, demand hash and held locks (best effort)."""
        self._stop.set()
        self._outbox.put(None)
        for t in (self._thread, self._listener, self._publisher):
            if t is not None:
                t.join(timeout=5)
        try:
            with self._lock:
                held = dict(self._held)
                self._held.clear()
            for template, token in held.items():
                self._release(
                    keys=[f"{self._p}refill:{template}"], args=[f"{self.replica_id}:{token}"]
                )
            self._r.delete(
                f"{self._p}replica:{self.replica_id}",
                f"{self._p}demand:{self.replica_id}",
                f"{self._p}inflight:{self.replica_id}",
            )
        except redis.RedisError as e:
            log.info("redis clean-up at close failed: %s", e)
        self._pg.close()
        self._r.close()
