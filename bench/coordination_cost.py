"""What the coordination features cost a request on the hot paths (exec, lease).

    .venv/bin/python bench/coordination_cost.py [--n 20000] [--json]

Times, per call, in microseconds (median of 5 runs of ``n`` calls): the rate-limit check
with no limit configured (skipped), with one in memory, and with one in Redis
(``CRUCIBLE_TEST_REDIS_URL``, skipped when unset); an API-key lookup from the cache against
one read from the database (SQLite, a scratch file); an event's publish after a commit (in
process, no listener). Baseline for the ratios: the uncached key lookup it replaces.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from service import tenants  # noqa: E402
from service.config import RateLimit, Settings  # noqa: E402
from service.coordination.inprocess import InProcessCoordinator  # noqa: E402
from service.db.engine import Database  # noqa: E402
from service.events import EventBus  # noqa: E402
from service.keycache import KeyCache  # noqa: E402
from service.ratelimit import RateLimiter  # noqa: E402


def per_call_us(fn: Callable[[], object], n: int) -> float:
    """Median over 5 runs of the mean time of one ``fn()``, in microseconds."""
    runs = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        runs.append((time.perf_counter() - t0) / n * 1e6)
    return statistics.median(runs)


def main() -> None:
    """Measure and print one line per case (or JSON)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    n = args.n
    out: dict[str, float] = {}
    tmp = Path(tempfile.mkdtemp(prefix="coord-cost-"))
    coord = InProcessCoordinator()
    none = RateLimiter(Settings(data_dir=tmp), coord)
    out["ratelimit_unset_us"] = per_call_us(lambda: none.check("t"), n)
    big = RateLimit(rps=1e6, burst=1_000_000)
    mem = RateLimiter(Settings(data_dir=tmp, rate_limit=big), coord)
    out["ratelimit_inprocess_us"] = per_call_us(lambda: mem.check("t"), n)
    if os.environ.get("CRUCIBLE_TEST_REDIS_URL"):
        from service.coordination.redis import RedisCoordinator

        rc = RedisCoordinator(
            os.environ["CRUCIBLE_TEST_REDIS_URL"],
            deployment=f"cost-{os.getpid()}",
            db_url=f"sqlite:///{tmp / 'x.db'}",
        )
        red = RateLimiter(Settings(data_dir=tmp, rate_limit=big), rc)
        out["ratelimit_redis_us"] = per_call_us(lambda: red.check("t"), max(1, n // 10))
        rc.close()
    db = Database(f"sqlite:///{tmp / 'c.db'}")
    db.migrate()
    with db.session() as s:
        tenants.create_tenant(s, "t", max_sandboxes=1, max_cpus=1, max_memory_mb=1)
        key = tenants.create_key(s, "t")

    def uncached() -> object:
        with db.read() as s:
            return tenants.authenticate(s, key)

    out["key_lookup_db_us"] = per_call_us(uncached, max(1, n // 10))
    cache = KeyCache(coord, ttl_s=60, read=db.read)
    out["key_lookup_cached_us"] = per_call_us(lambda: cache.authenticate(key), n)
    bus = EventBus(coord)
    ev = {"action": "sandbox.lease", "seq": 1, "tenant_id": "t", "details": {"warm": True}}
    out["event_publish_us"] = per_call_us(lambda: bus.publish(ev), n)
    db.engine.dispose()
    if args.json:
        print(json.dumps(out))
        return
    base = out["key_lookup_db_us"]
    for name, us in out.items():
        print(f"{name:26s} {us:9.2f} us   {us / base:7.3f} x uncached key lookup")


if __name__ == "__main__":
    main()
