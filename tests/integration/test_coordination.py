"""Coordination on a real Redis (``CRUCIBLE_TEST_REDIS_URL``) and real PostgreSQL: one
refiller per template with fencing, demand shared and expiring with its replica, shared rate
buckets, messages and work in flight, and the fallback (advisory lock, ``degraded`` health)
when Redis cannot be reached. Then one in-process control plane over real HTTP: per-tenant
rate limits, the cached key lookup refusing a revoked key at once, and the event stream."""

from __future__ import annotations

import json
import os
import secrets
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy import update

from service import tenants
from service.config import RateLimit
from service.coordination.redis import RedisCoordinator
from service.db.models import ApiKey, Tenant, utcnow
from tests.dbutil import postgres_url
from tests.integration.api.conftest import Stack, start_stack

pytestmark = pytest.mark.postgres

DOWN = "redis://127.0.0.1:1/0"  # nothing listens on port 1
SSE = {"Accept": "text/event-stream"}


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


def _until(predicate, timeout_s: float = 5.0) -> bool:  # noqa: ANN001
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return False


def test_a_rate_bucket_is_shared_between_replicas(pair) -> None:  # noqa: ANN001
    a, b = pair
    taken = [a.take("tenant:t", rate_per_s=2.0, burst=3) for _ in range(3)]
    assert taken == [0.0, 0.0, 0.0]
    wait = b.take("tenant:t", rate_per_s=2.0, burst=3)
    assert 0.3 < wait <= 0.5, "the other replica draws from the same, empty bucket"
    assert b.take("tenant:other", rate_per_s=2.0, burst=3) == 0.0, "buckets are per name"
    time.sleep(wait + 0.05)
    assert a.take("tenant:t", rate_per_s=2.0, burst=3) == 0.0, "refilled at the rate"


def test_messages_reach_every_replica(pair) -> None:  # noqa: ANN001
    a, b = pair
    got: dict[str, list[str]] = {"a": [], "b": []}
    gaps = {"a": 0}
    a.subscribe("c", got["a"].append, lambda: gaps.__setitem__("a", gaps["a"] + 1))
    b.subscribe("c", got["b"].append, lambda: None)
    a.start()
    b.start()
    assert _until(lambda: a.listening() and b.listening())
    assert gaps["a"] >= 1, "a new subscription reports a gap (what was cached may be stale)"
    a.publish("c", "hello")
    assert _until(lambda: got["a"] == ["hello"] and got["b"] == ["hello"]), got


def test_work_in_flight_is_seen_by_others_and_dies_with_its_replica(pair) -> None:  # noqa: ANN001
    a, b = pair
    a.start()
    b.start()
    with a.track("sb:x"):
        assert "sb:x" in b.in_flight()
        with a.track("sb:x"):  # nested: still in flight after the inner one ends
            pass
        assert "sb:x" in b.in_flight()
    assert "sb:x" not in b.in_flight()
    with a.track("c:y"):
        a._stop.set()  # a dies mid-way: its set expires with its heartbeat
        a._thread.join()
        time.sleep(3.0)
        assert "c:y" not in b.in_flight()


def test_without_redis_nothing_is_trusted_from_memory() -> None:
    down = RedisCoordinator(DOWN, deployment="x", db_url=postgres_url(), ttl_s=1.5)
    try:
        assert down.in_flight() is None, "unknown, so recovery touches nothing"
        assert not down.listening(), "so the key cache reads every key from the database"
        assert down.take("tenant:t", rate_per_s=1.0, burst=1) == 0.0  # this replica's bucket
        assert down.take("tenant:t", rate_per_s=1.0, burst=1) > 0.0
    finally:
        down.close()


# -- one control plane over HTTP ----------------------------------------------------------


DASHBOARD_SECRET = "s" * 40


@pytest.fixture(scope="module")
def limited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    yield from start_stack(
        tmp_path_factory.mktemp("limited"),
        pool_targets={},
        rate_limits={"alice": RateLimit(rps=0.5, burst=3), "admin": None},
        rate_limit=RateLimit(rps=1000, burst=1000),
        key_cache_ttl_s=60.0,
        dashboard_session_secret=DASHBOARD_SECRET,
    )


def _key_id(client: httpx.Client) -> str:
    return client.headers["authorization"].split("_")[1]


@pytest.mark.docker
def test_a_tenant_over_its_rate_gets_429_with_retry_after(limited: Stack) -> None:
    got = [limited.alice.get("/v1/sandboxes").status_code for _ in range(3)]
    assert got == [200, 200, 200], "the burst passes"
    r = limited.alice.get("/v1/sandboxes")
    assert r.status_code == 429, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    assert r.json()["field"] == "rate_limit" and "0.5 requests/s" in r.json()["detail"]
    assert 1 <= int(r.headers["retry-after"]) <= 2
    r = limited.alice.post("/v1/sandboxes", json={"template": "terminal"})
    assert r.status_code == 429, "refused before anything is leased"
    with limited.ctx.db.read() as s:
        assert s.get(Tenant, "alice").used_sandboxes == 0
    assert [limited.bob.get("/v1/sandboxes").status_code for _ in range(10)] == [200] * 10, (
        "another tenant has its own bucket (the default limit)"
    )


@pytest.mark.docker
def test_a_revoked_key_is_refused_at_once_though_cached(limited: Stack) -> None:
    carol = _new_client(limited, "carol")
    assert carol.get("/v1/sandboxes").status_code == 200  # cached now, for 60 s
    r = limited.admin.delete(f"/v1/keys/{_key_id(carol)}")
    assert r.status_code == 204, r.text
    r = carol.get("/v1/sandboxes")
    assert r.status_code == 401 and r.headers["content-type"].startswith("application/problem")
    assert limited.admin.delete(f"/v1/keys/{_key_id(carol)}").status_code == 404
    assert limited.bob.delete(f"/v1/keys/{_key_id(limited.bob)}").status_code == 403
    assert limited.admin.delete("/v1/keys/not-hex").status_code == 422


@pytest.mark.docker
def test_a_key_revoked_outside_the_control_plane_but_cached_keeps_its_idempotency(
    limited: Stack,
) -> None:
    """The route authenticates through the key cache; the idempotency middleware read the
    row. A key revoked in SQL (not through the API, so no revoke event) but still cached
    was served by the route while the middleware, seeing it refused, passed the keyed
    request on unkeyed: a retry leased a second sandbox. Both layers now ask the cache."""
    frank = _new_client(limited, "frank")
    assert frank.get("/v1/sandboxes").status_code == 200  # cached now, for 60 s
    with limited.ctx.db.session() as s:
        s.execute(update(ApiKey).where(ApiKey.id == _key_id(frank)).values(revoked_at=utcnow()))
    key = {"Idempotency-Key": "revoked-in-sql"}
    body = {"template": "terminal", "ttl_s": 60}
    first = frank.post("/v1/sandboxes", json=body, headers=key)
    again = frank.post("/v1/sandboxes", json=body, headers=key)
    assert first.status_code == 201, first.text  # served from the cache, as documented
    assert again.status_code == 201 and again.headers.get("idempotent-replayed") == "true"
    assert again.json()["id"] == first.json()["id"]
    with limited.ctx.db.read() as s:
        assert s.get(Tenant, "frank").used_sandboxes == 1, "one lease, not two"
    limited.admin.delete(f"/v1/sandboxes/{first.json()['id']}")


def _new_client(stack: Stack, tenant: str) -> httpx.Client:
    with stack.ctx.db.session() as s:
        tenants.create_tenant(s, tenant, max_sandboxes=4, max_cpus=4, max_memory_mb=1 << 13)
        key = tenants.create_key(s, tenant, scopes=set())
    return stack.make_client(key)


class _Events:
    """Reads ``GET /v1/events`` on a thread and keeps every parsed event."""

    def __init__(self, client: httpx.Client, **params: str) -> None:
        self.events: list[dict] = []
        self.open = threading.Event()
        self._thread = threading.Thread(target=self._read, args=(client, params), daemon=True)
        self._thread.start()
        assert self.open.wait(10), "the stream did not open"

    def _read(self, client: httpx.Client, params: dict[str, str]) -> None:
        with client.stream("GET", "/v1/events", params={"max_s": "20", **params}, headers=SSE) as r:
            assert r.headers["content-type"].startswith("text/event-stream")
            self.open.set()
            for line in r.iter_lines():
                if line.startswith("data: "):
                    self.events.append(json.loads(line[6:]))

    def actions(self) -> list[str]:
        return [e["action"] for e in self.events]


@pytest.mark.docker
def test_the_event_stream_shows_a_tenant_its_own_events_as_they_commit(limited: Stack) -> None:
    dave, erin = _new_client(limited, "dave"), _new_client(limited, "erin")
    mine, theirs = _Events(dave, actions="sandbox."), _Events(erin)
    admin = _Events(limited.admin, actions="sandbox.,pool.")
    r = dave.post("/v1/sandboxes", json={"template": "tiny"})
    assert r.status_code == 201, r.text
    sid = r.json()["id"]
    assert dave.delete(f"/v1/sandboxes/{sid}").status_code == 200
    want = ["sandbox.lease", "sandbox.release"]
    assert _until(lambda: mine.actions() == want, 10), mine.events
    assert mine.events[0]["sandbox_id"] == sid and mine.events[0]["tenant_id"] == "dave"
    assert _until(lambda: {"sandbox.lease", "sandbox.release"} <= set(admin.actions()), 10)
    time.sleep(0.5)
    assert theirs.events == [], "another tenant sees nothing of it"
    r = dave.get("/v1/events", params={"actions": "bad prefix!"}, headers=SSE)
    assert r.status_code == 422 and r.json()["field"] == "actions"
    r = dave.get("/v1/events", params={"max_s": "600"})  # a client that reads to the end
    assert r.status_code == 400 and r.json()["field"] == "accept", r.text


@pytest.mark.docker
def test_the_dashboard_follows_the_stream_with_its_session(limited: Stack) -> None:
    from service.dashboard.session import SESSION_COOKIE, Signer

    frank = _new_client(limited, "frank")
    cookie = Signer(DASHBOARD_SECRET).issue(_key_id(frank), ttl_s=600)
    with httpx.Client(base_url=limited.url, follow_redirects=False) as anon:
        assert anon.get("/dashboard/live/events").status_code == 303, "sign-in first"
    viewer = limited.make_client(cookies={SESSION_COOKIE: cookie})
    seen: list[str] = []
    opened = threading.Event()

    def read() -> None:
        with viewer.stream(
            "GET", "/dashboard/live/events", params={"max_s": "15"}, headers=SSE
        ) as r:
            opened.set()
            for line in r.iter_lines():
                if line.startswith("event: "):
                    seen.append(line[7:])
                    if "sandbox.release" in seen:
                        return

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    assert opened.wait(10)
    sid = frank.post("/v1/sandboxes", json={"template": "tiny"}).json()["id"]
    assert frank.delete(f"/v1/sandboxes/{sid}").status_code == 200
    reader.join(timeout=15)
    assert seen == ["sandbox.lease", "sandbox.release"], seen


def test_a_bad_rate_limit_setting_names_its_field(tmp_path: Path) -> None:
    from pydantic import ValidationError

    from service.config import Settings

    with pytest.raises(ValidationError, match="rate_limits"):
        Settings(data_dir=tmp_path, rate_limits={"t": {"rps": 0, "burst": 1}})


@pytest.mark.parametrize("redis_url", [None, DOWN])
def test_dead_replica_work_touches_nothing_when_it_cannot_know(
    tmp_path: Path, redis_url: str | None
) -> None:
    """A replica without Redis (or with Redis down) cannot tell a dead replica's half-done
    start from a live one's: it must leave every ``starting`` and ``snapshotting`` row be."""
    from types import SimpleNamespace

    from service import coordination
    from service.config import Settings
    from service.db.models import Sandbox
    from service.recovery import DeadReplicaWork
    from tests.dbutil import fresh_database

    with fresh_database("postgres", tmp_path) as db:
        settings = Settings(
            data_dir=tmp_path, database_url=db.url, replica=True, redis_url=redis_url
        )
        coord = coordination.build(settings)
        with db.session() as s:
            tenants.create_tenant(s, "t", max_sandboxes=2, max_cpus=2, max_memory_mb=1024)
            for sid, state in (("sb_a", "starting"), ("sb_b", "snapshotting")):
                s.add(
                    Sandbox(
                        id=sid,
                        deployment=settings.deployment,
                        template="terminal",
                        image="x",
                        state=state,
                        tenant_id="t",
                        cpus=1,
                        memory_mb=512,
                    )
                )
        ctx = SimpleNamespace(settings=settings, db=db, pools=SimpleNamespace(coord=coord))
        work = DeadReplicaWork(ctx)  # type: ignore[arg-type]
        work.EVERY_S = 0.0
        try:
            for _ in range(3):
                assert not any(work().values())
            with db.read() as s:
                states = {r.id: r.state for r in s.query(Sandbox).all()}
            assert states == {"sb_a": "starting", "sb_b": "snapshotting"}
        finally:
            coord.close()


def test_start_up_recovery_leaves_a_live_replicas_verification_alone(
    tmp_path: Path,
    pair,  # noqa: ANN001
) -> None:
    """A kill -9 trial restarted an idle replica while another verified an episode: start-up
    recovery put the episode back to ``running`` (and a tenant ``PUT`` through the restarted
    replica landed in the frozen end state). Now a verification whose container a live
    replica tracks is left to it; one nobody tracks is recovered (its sandbox stays
    ``verifying`` for the retried verify)."""
    from types import SimpleNamespace

    from service.config import Settings
    from service.db.models import Episode, Sandbox
    from service.recovery import _verifying_to_running
    from tests.dbutil import fresh_database

    with fresh_database("postgres", tmp_path) as db:
        settings = Settings(
            data_dir=tmp_path, database_url=db.url, replica=True, redis_url=_redis_url()
        )
        verifier, restarted = pair
        verifier.start()
        restarted.start()
        with db.session() as s:
            tenants.create_tenant(s, "t", max_sandboxes=2, max_cpus=2, max_memory_mb=1024)
            s.add(
                Sandbox(
                    id="sb_v",
                    deployment=settings.deployment,
                    template="terminal",
                    image="x",
                    state="verifying",
                    tenant_id="t",
                    cpus=1,
                    memory_mb=512,
                    container_id="c0ffee",
                )
            )
            s.add(
                Episode(
                    id="ep_v",
                    tenant_id="t",
                    task_id="x",
                    suite="terminal",
                    domain="terminal",
                    sandbox_id="sb_v",
                    state="verifying",
                    group_id="grp_v",
                    sample_idx=0,
                    task_version="1",
                    template="terminal",
                    image_digest="sha256:0",
                )
            )
        ctx = SimpleNamespace(settings=settings, db=db, pools=SimpleNamespace(coord=restarted))
        with verifier.track("c:c0ffee"):
            assert _until(lambda: "c:c0ffee" in (restarted.in_flight() or set()))
            assert _verifying_to_running(ctx) == 0  # type: ignore[arg-type]
            with db.read() as s:
                assert s.get(Episode, "ep_v").state == "verifying"
        assert _until(lambda: "c:c0ffee" not in (restarted.in_flight() or set()))
        assert _verifying_to_running(ctx) == 1  # type: ignore[arg-type]
        with db.read() as s:
            assert s.get(Episode, "ep_v").state == "running"
            assert s.get(Sandbox, "sb_v").state == "verifying"
