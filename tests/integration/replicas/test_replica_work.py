"""Replicas of ``crucible serve`` on one PostgreSQL database and one Redis, through real HTTP:

- a key revoked through one replica is refused by another at once (its cache holds for 60 s);
  a tenant's rate limit is one bucket across replicas; a lease on one replica is an event on
  another's stream;
- a replica killed with SIGKILL mid cold start and mid snapshot: the others fail its
  ``starting`` row (quota back) and put its ``snapshotting`` sandbox back to ``leased``;
  one killed mid group start (its members starting): the members are failed, quota back;
- three replicas run a job with a worker each; one replica and its worker are killed with
  SIGKILL mid-job: the job ends ``done`` with each sample recorded once, no item claimed
  again while a claim on it was live, nothing left held.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy import func, select

from policy_client.client import Client
from service import audit, tenants
from service.db.engine import Database
from service.db.models import AuditEvent, Episode, RewardRecordRow, Sandbox, Tenant, WorkItem
from tests.dbutil import fresh_database
from tests.integration.api.conftest import _cleanup, _free_port
from tests.integration.chaos.test_crash_recovery import Server

pytestmark = [pytest.mark.docker, pytest.mark.postgres]

SSE = {"Accept": "text/event-stream"}

ROOT = Path(__file__).resolve().parents[3]
TASKS = ["word-frequency-top20", "access-log-top-ips", "fixed-width-to-csv"]
GROUP = 2


class Cluster:
    """Starts replicas on one database and Redis; stops them and cleans up at the end."""

    def __init__(self, db: Database, tmp: Path, deployment: str, keys: dict[str, str]) -> None:
        self.db, self.tmp, self.deployment, self.keys = db, tmp, deployment, keys
        self.servers: list[Server] = []
        base = {k: v for k, v in os.environ.items() if not k.startswith("CRUCIBLE_")}
        base.update(
            CRUCIBLE_DATABASE_URL=db.url,
            CRUCIBLE_REDIS_URL=os.environ["CRUCIBLE_TEST_REDIS_URL"],
            CRUCIBLE_REPLICA="1",
            CRUCIBLE_DATA_DIR=str(tmp / "data"),
            CRUCIBLE_DEPLOYMENT=deployment,
            CRUCIBLE_POOL_TARGETS=json.dumps({}),
            CRUCIBLE_POOL_INTERVAL_S="0.2",
        )
        self.base = base

    def start(self, **extra: str) -> Server:
        srv = Server({**self.base, **extra}, _free_port(), self.tmp / f"r{len(self.servers)}.log")
        self.servers.append(srv)
        srv.start()
        return srv

    def client(self, srv: Server, tenant: str) -> httpx.Client:
        return httpx.Client(
            base_url=srv.url, headers={"Authorization": f"Bearer {self.keys[tenant]}"}, timeout=120
        )

    def count(self, *where: object, model: object = Sandbox) -> int:
        with self.db.read() as s:
            return s.execute(select(func.count()).select_from(model).where(*where)).scalar_one()

    def used(self, tenant: str) -> int:
        with self.db.read() as s:
            return s.execute(select(Tenant.used_sandboxes).where(Tenant.id == tenant)).scalar_one()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    deployment = f"rw-{secrets.token_hex(4)}"
    with fresh_database("postgres", tmp_path) as db:
        keys = {}
        with db.session() as s:
            for t in ("rep", "limited", "victim"):
                tenants.create_tenant(s, t, max_sandboxes=12, max_cpus=12, max_memory_mb=1 << 15)
                keys[t] = tenants.create_key(s, t, scopes={"admin"} if t == "rep" else set())
        c = Cluster(db, tmp_path, deployment, keys)
        try:
            yield c
        finally:
            for srv in c.servers:
                if srv.proc is not None and srv.proc.poll() is None:
                    srv.stop()
            _cleanup(deployment)


def _wait(predicate: Callable[[], bool], timeout_s: float) -> float:
    """Seconds until ``predicate`` held; fails after ``timeout_s``."""
    t0 = time.monotonic()
    while not predicate():
        assert time.monotonic() - t0 < timeout_s, f"not within {timeout_s} s"
        time.sleep(0.02)
    return time.monotonic() - t0


def test_revoke_rate_limit_and_events_hold_across_replicas(cluster: Cluster) -> None:
    env = {
        "CRUCIBLE_KEY_CACHE_TTL_S": "60",
        "CRUCIBLE_RATE_LIMITS": json.dumps({"limited": {"rps": 0.1, "burst": 4}}),
    }
    a, b = cluster.start(**env), cluster.start(**env)
    _wait(lambda: httpx.get(f"{b.url}/readyz").json()["coordination"]["subscribed"], 10)
    with cluster.client(b, "victim") as victim_b, cluster.client(a, "rep") as admin_a:
        assert victim_b.get("/v1/sandboxes").status_code == 200  # cached on b for 60 s
        key_id = cluster.keys["victim"].split("_")[1]
        assert admin_a.delete(f"/v1/keys/{key_id}").status_code == 204
        took = _wait(lambda: victim_b.get("/v1/sandboxes").status_code == 401, 1.0)
        print(f"revoked on a, refused on b after {took * 1e3:.0f} ms")
    ok, refused = 0, []
    with cluster.client(a, "limited") as la, cluster.client(b, "limited") as lb:
        for i in range(10):
            r = (la, lb)[i % 2].get("/v1/sandboxes")
            ok += r.status_code == 200
            if r.status_code == 429:
                refused.append(r)
    assert ok == 4, f"{ok} passed: the burst of 4 is one bucket across both replicas"
    assert all(int(r.headers["retry-after"]) >= 1 for r in refused)
    assert refused[0].headers["content-type"].startswith("application/problem+json")
    events: list[dict] = []
    opened = threading.Event()

    def read() -> None:
        with (
            cluster.client(b, "rep") as rb,
            rb.stream(
                "GET", "/v1/events", params={"actions": "sandbox.", "max_s": "30"}, headers=SSE
            ) as r,
        ):
            opened.set()
            for line in r.iter_lines():
                if line.startswith("data: "):
                    events.append(json.loads(line[6:]))
                    if len(events) >= 2:
                        return

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    assert opened.wait(10)
    with cluster.client(a, "rep") as ra:
        r = ra.post("/v1/sandboxes", json={"template": "terminal"})
        assert r.status_code == 201, r.text
        sid = r.json()["id"]
        assert ra.delete(f"/v1/sandboxes/{sid}").status_code == 200
    reader.join(timeout=20)
    assert [(e["action"], e["sandbox_id"]) for e in events] == [
        ("sandbox.lease", sid),
        ("sandbox.release", sid),
    ], events


def test_a_dead_replicas_cold_start_and_snapshot_are_finished_by_the_others(
    cluster: Cluster,
) -> None:
    live = cluster.start()
    slow = cluster.start(CRUCIBLE_FAULT_SLOW_MS="create=8000,snapshot=8000")
    with cluster.client(live, "rep") as c:
        r = c.post("/v1/sandboxes", json={"template": "terminal"})
        assert r.status_code == 201, r.text
        sid = r.json()["id"]

    def call(method: str, path: str, **kw: object) -> None:
        with cluster.client(slow, "rep") as c, pytest.raises(httpx.TransportError):
            c.request(method, path, **kw)  # the replica dies under it

    threads = [
        threading.Thread(target=call, args=("POST", f"/v1/sandboxes/{sid}/snapshots")),
        threading.Thread(
            target=call, args=("POST", "/v1/sandboxes"), kwargs={"json": {"template": "terminal"}}
        ),
    ]
    for t in threads:
        t.start()
    _wait(lambda: cluster.count(Sandbox.id == sid, Sandbox.state == "snapshotting") == 1, 10)
    _wait(lambda: cluster.count(Sandbox.state == "starting", Sandbox.tenant_id == "rep") == 1, 10)
    assert cluster.used("rep") == 2
    slow.kill9()
    for t in threads:
        t.join(timeout=10)
    took = _wait(
        lambda: (
            cluster.count(Sandbox.state.in_(("starting", "snapshotting"))) == 0
            and cluster.used("rep") == 1
        ),
        60,
    )
    print(f"dead replica's work finished after {took:.1f} s")
    assert cluster.count(Sandbox.id == sid, Sandbox.state == "leased") == 1
    assert cluster.count(Sandbox.state == "failed", Sandbox.tenant_id == "rep") == 1
    with cluster.client(live, "rep") as c:
        r = c.post(f"/v1/sandboxes/{sid}/exec", json={"cmd": "echo alive"})
        assert r.status_code == 200 and r.json()["stdout"] == "alive\n", r.text
        assert c.post(f"/v1/sandboxes/{sid}/snapshots").status_code == 201
        assert c.delete(f"/v1/sandboxes/{sid}").status_code == 200
    _wait(lambda: cluster.used("rep") == 0, 10)


def test_a_group_start_cut_off_by_its_replicas_death_is_given_back(cluster: Cluster) -> None:
    cluster.start()
    slow = cluster.start(CRUCIBLE_FAULT_SLOW_MS="create=5000")

    def start() -> None:
        with cluster.client(slow, "rep") as c, pytest.raises(httpx.TransportError):
            c.post("/v1/episodes", json={"task_id": TASKS[0], "group_size": 2})

    t = threading.Thread(target=start)
    t.start()
    member = Sandbox.metadata_["episode_role"].as_string() == "member"
    _wait(  # both members are starting (cold: the pool is empty), no episode names them yet
        lambda: cluster.count(member, Sandbox.state == "starting", Sandbox.tenant_id == "rep") == 2,
        90,
    )
    slow.kill9()
    t.join(timeout=10)
    took = _wait(
        lambda: (
            cluster.used("rep") == 0
            and cluster.count(Sandbox.state.in_(("starting", "leased", "snapshotting"))) == 0
        ),
        60,
    )
    print(f"the dead replica's group start was given back after {took:.1f} s")
    assert cluster.count(member, Sandbox.state == "failed", Sandbox.tenant_id == "rep") == 2


def test_three_replicas_finish_a_job_through_a_kill_nine_recording_each_sample_once(
    cluster: Cluster,
) -> None:
    servers = [cluster.start() for _ in range(3)]
    with Client(servers[0].url, cluster.keys["rep"]) as client:
        job = client.create_job(
            suite="terminal",
            policy={"name": "oracle", "version": "1"},
            task_ids=TASKS,
            group_size=GROUP,
        )
    workers = []
    for i, srv in enumerate(servers):
        log = (cluster.tmp / f"w{i}.log").open("w")
        workers.append(
            subprocess.Popen(
                [sys.executable, "-m", "tests.integration.replicas.worker", srv.url]
                + [cluster.keys["rep"], job.id],
                stdout=subprocess.PIPE,
                stderr=log,
                cwd=ROOT,
            )
        )
    expected = len(TASKS) * GROUP
    jobs_records = (RewardRecordRow.job_id == job.id,)
    _wait(lambda: cluster.count(*jobs_records, model=RewardRecordRow) >= 1, 180)
    servers[2].kill9()  # a node dies: its replica and its worker
    workers[2].kill()
    workers[2].wait(timeout=30)
    for i, w in enumerate(workers[:2]):
        out, _ = w.communicate(timeout=300)
        log = (cluster.tmp / f"w{i}.log").read_text()[-2000:]
        assert w.returncode == 0, log
    with cluster.db.read() as s:
        rows = s.execute(
            select(RewardRecordRow.sample_key, RewardRecordRow.reward).where(*jobs_records)
        ).all()
        items = s.execute(select(WorkItem.id, WorkItem.state).where(WorkItem.job_id == job.id))
        states = dict(items.all())
        claims = s.execute(
            select(AuditEvent.action, AuditEvent.details)
            .where(AuditEvent.action.in_(("job.claim", "job.claim_lapsed", "job.complete")))
            .order_by(AuditEvent.seq)
        ).all()
    assert len(rows) == expected and len({k for k, _ in rows}) == expected, rows
    assert {r for _, r in rows} == {1.0}, rows
    assert set(states.values()) == {"done"}, states
    for item in states:  # a second claim only after the first one lapsed or was given back
        mine = [(x, d) for x, d in claims if d.get("work_item_id") == item]
        again = sum(
            1
            for x, d in mine
            if x == "job.claim_lapsed" or (x == "job.complete" and d.get("state") == "queued")
        )
        assert sum(1 for x, _ in mine if x == "job.claim") == 1 + again, (item, mine)

    def settled() -> bool:
        return (
            cluster.count(Episode.state.in_(("running", "verifying")), model=Episode) == 0
            and cluster.used("rep") == 0
        )

    try:
        took = _wait(settled, 60)
        print(f"nothing held {took:.1f} s after the job ended")
    except AssertionError:
        with cluster.db.read() as s:
            eps = s.execute(select(Episode.id, Episode.state, Episode.sandbox_id)).all()
            sbs = s.execute(
                select(Sandbox.id, Sandbox.state).where(Sandbox.tenant_id == "rep")
            ).all()
        raise AssertionError(  # noqa: B904 - the wait failed; this names what is held
            (
                "stuck",
                [e for e in eps if e[1] in ("running", "verifying")],
                [b for b in sbs if b[1] not in ("released", "failed", "expired")],
            )
        )
    for srv in servers[:2]:
        srv.stop()
    check = audit.verify_chain(cluster.db)
    assert check.first_broken_seq is None, check
