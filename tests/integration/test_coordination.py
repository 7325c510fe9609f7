"""Coordination on a real Redis (``CRUCIBLE_TEST_REDIS_URL``) and real PostgreSQL: one
refiller per template with fencing, demand shared and expiring with its replica, and the
fallback (advisory lock, ``degraded`` health) when Redis cannot be reached."""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Iterator

import pytest

from service.coordination.redis import RedisCoordinator
from tests.dbutil import postgres_url

pytestmark = pytest.mark.postgres

DOWN = "redis://127.0.0.1:1/0"  # nothing listens on port 1


def _redis_url() -> str:
    url = os.environ.get("CRUCIBLE_TEST_REDIS_URL")
    if not url:
        raise RuntimeError("CRUCIBLE_TEST_REDIS_URL is not set: start scripts/services.sh")
    return url


@pytest.fixture
def pair() -> Iterator[tuple[RedisCoordinator, RedisCoordinator]]:
    dep = f"coord-{secrets.token_hex(4)}"
    a, b = (
        RedisCoordinator(_redis_url(), deployment=dep, db_url=postgres_url(), ttl_s=1.5)
        for _ in range(2)
    )
    try:
        yield a, b
    finally:
        a.close()
        b.close()


def test_one_refiller_per_template_with_growing_fence(pair) -> None:  # noqa: ANN001
    a, b = pair
    assert a.hold_refill("t") and not b.hold_refill("t")
    assert a.hold_refill("t"), "the holder keeps its lock"
    assert b.hold_refill("other"), "locks are per template"
    first = a.fence("t")
    a.close()  # gives the lock up: the next holder's token is larger
    assert b.hold_refill("t")
    assert b.fence("t") > first


def test_a_lock_whose_holder_stops_renewing_passes_on(pair) -> None:  # noqa: ANN001
    a, b = pair
    assert a.hold_refill("t")
    token = a.fence("t")
    time.sleep(1.8)  # a neither ticks nor beats: its lock lapses
    assert b.hold_refill("t")
    assert not a.hold_refill("t"), "a lapsed holder learns it lost the lock"
    assert b.fence("t") > token


def test_demand_is_shared_dropped_anywhere_and_expires_with_its_replica(pair) -> None:  # noqa: ANN001
    a, b = pair
    a.start()
    b.start()
    a.put_demand(("ten", "tpl"), 2)
    b.put_demand(("ten2", "tpl"), 3)
    assert a.demands() == b.demands() == {("ten", "tpl"): 2, ("ten2", "tpl"): 3}
    assert a.live_replicas() == {a.replica_id, b.replica_id}
    b.drop_demand(("ten", "tpl"))  # the job ended on the other replica
    time.sleep(0.7)  # a's renewal sees the drop and forgets it locally too
    assert a.demands() == {("ten2", "tpl"): 3}
    assert ("ten", "tpl") not in a._demand
    b._stop.set()  # b dies without cleaning up: its demand and heartbeat expire
    b._thread.join()
    time.sleep(3.0)
    assert a.demands() == {}
    assert a.live_replicas() == {a.replica_id}


def test_redis_down_falls_back_to_one_refiller_and_says_degraded() -> None:
    dep = f"coord-{secrets.token_hex(4)}"
    a, b = (RedisCoordinator(DOWN, deployment=dep, db_url=postgres_url()) for _ in range(2))
    try:
        assert a.hold_refill("t") and not b.hold_refill("t"), "advisory lock: one refiller"
        assert a.hold_refill("t")
        assert a.live_replicas() is None, "the live set is unknown without Redis"
        a.put_demand((None, "t"), 4)
        assert a.demands() == {(None, "t"): 4}, "a replica's own demand still counts"
        h = a.health()
        assert h["ok"] is False and "degraded" in h["refill_lock"]
        a.close()  # its connection ends: the lock is free
        assert b.hold_refill("t")
    finally:
        a.close()
        b.close()
