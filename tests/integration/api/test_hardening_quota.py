"""Everything a tenant causes counts against its quota (issue 11): the warm sandboxes its jobs
ask for, its snapshots (count and bytes) with a TTL, and snapshot get/delete in the API and
the SDK."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from datetime import datetime

import docker
import pytest
from sqlalchemy import select, update

from policy_client import AsyncClient, Client, NotFoundError
from service import tenants
from service.db.models import Sandbox, Snapshot, Tenant, utcnow
from service.tasks.registry import template_name
from tests.integration.api.conftest import Stack, start_stack
from tests.integration.api.test_sandboxes_api import assert_problem, lease, run

pytestmark = pytest.mark.docker

# Bundled tasks whose images earlier tests built (content-hashed: built once per change).
TASKS = [
    "word-frequency-top20",
    "access-log-top-ips",
    "fixed-width-to-csv",
    "semver-library-bugfix",
]
TTL_S = 600


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def stack(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[Stack]:
    yield from start_stack(
        tmp_path_factory.mktemp("quota"),
        db_kind=request.param,
        pool_targets={},
        snapshot_ttl_s=TTL_S,
    )


def _tenant(stack: Stack, name: str, **quota: int) -> tuple[Client, str]:
    with stack.ctx.db.session() as s:
        tenants.create_tenant(
            s,
            name,
            max_sandboxes=quota.pop("max_sandboxes", 8),
            max_cpus=8,
            max_memory_mb=1 << 14,
            **quota,
        )
        key = tenants.create_key(s, name)
    return stack.make_client(key), key


def _task_warm(stack: Stack, names: set[str]) -> int:
    with stack.ctx.db.read() as s:
        return len(
            s.execute(
                select(Sandbox.id).where(
                    Sandbox.template.in_(names), Sandbox.state.in_(("warm", "starting"))
                )
            ).all()
        )


def test_a_jobs_warm_sandboxes_stay_within_its_tenants_quota(stack: Stack) -> None:
    # Regression: a tenant limited to 2 sandboxes made the service start 2 warm sandboxes
    # per task of its job (51 at once).
    carol, _ = _tenant(stack, "carol", max_sandboxes=2)
    job = {"suite": "terminal", "task_ids": TASKS, "policy": {"name": "p"}}
    jobs = [carol.post("/v1/jobs", json=job).json()["id"] for _ in range(2)]
    names = {template_name(stack.ctx.tasks.get(t, "terminal")) for t in TASKS}

    def targets() -> dict[str, int]:
        return {k: v["target"] for k, v in stack.ctx.pools.levels().items() if k in names}

    stack.wait_for(lambda: sum(targets().values()) == 2, 300)
    peak, deadline = 0, time.monotonic() + 10
    while time.monotonic() < deadline:  # the pool fills to the budget and no further
        peak = max(peak, _task_warm(stack, names))
        assert sum(targets().values()) == 2, targets()
        time.sleep(0.2)
    assert 1 <= peak <= 2
    for job_id in jobs:
        assert carol.post(f"/v1/jobs/{job_id}/cancel").status_code == 200
    stack.wait_for(lambda: sum(targets().values()) == 0 and _task_warm(stack, names) == 0, 60)


def _images(stack: Stack) -> int:
    repo = f"crucible-snapshots/{stack.ctx.settings.deployment}"
    client = docker.from_env()
    try:
        return len(client.images.list(name=repo))
    finally:
        client.close()


def _usage(stack: Stack, tenant: str) -> tuple[int, int]:
    with stack.ctx.db.read() as s:
        t = s.get(Tenant, tenant)
        return t.used_snapshots, t.used_snapshot_bytes


def test_snapshots_count_against_a_quota_of_count_and_bytes(stack: Stack) -> None:
    # Regression: one tenant held 119 snapshot images; nothing limited them.
    dave, _ = _tenant(stack, "dave", max_snapshots=2, max_snapshot_bytes=4 << 20)
    sid = lease(dave, "tiny", ttl_s=120)["id"]
    snaps = []
    for _ in range(2):
        r = dave.post(f"/v1/sandboxes/{sid}/snapshots")
        assert r.status_code == 201, r.text
        snaps.append(r.json())
        assert r.json()["expires_at"] is not None and r.json()["bytes"] >= 0
    images = _images(stack)
    r = dave.post(f"/v1/sandboxes/{sid}/snapshots")
    assert "snapshot quota" in assert_problem(r, 429)["detail"]
    assert r.headers["retry-after"] and _images(stack) == images
    assert dave.get(f"/v1/sandboxes/{sid}").json()["state"] == "leased"
    assert dave.delete(f"/v1/snapshots/{snaps[0]['id']}").status_code == 204
    assert_problem(dave.get(f"/v1/snapshots/{snaps[0]['id']}"), 404, "snapshot_id")
    assert_problem(dave.delete(f"/v1/snapshots/{snaps[0]['id']}"), 404, "snapshot_id")
    assert _usage(stack, "dave")[0] == 1
    # bytes: a writable layer larger than the whole byte quota never fits (400) ...
    run(dave, sid, "head -c 5000000 /dev/urandom > /tmp/big")
    r = dave.post(f"/v1/sandboxes/{sid}/snapshots")
    assert_problem(r, 400, "quota")
    # ... one that fits alone but not with what is held is a 429
    run(dave, sid, "rm /tmp/big && head -c 3000000 /dev/urandom > /tmp/mid")
    r = dave.post(f"/v1/sandboxes/{sid}/snapshots")
    assert r.status_code == 201, r.text
    held = r.json()
    assert held["bytes"] >= 3_000_000
    assert _usage(stack, "dave") == (2, snaps[1]["bytes"] + held["bytes"])
    assert dave.delete(f"/v1/snapshots/{snaps[1]['id']}").status_code == 204
    run(dave, sid, "rm /tmp/mid && head -c 2000000 /dev/urandom > /tmp/more")
    r = dave.post(f"/v1/sandboxes/{sid}/snapshots")
    assert "bytes" in assert_problem(r, 429)["detail"]  # 3 MB held + 2 MB > 4 MiB
    r = stack.admin.get("/v1/audit", params={"action": "quota.refused", "tenant": "dave"})
    assert len(r.json()["events"]) == 3
    dave.delete(f"/v1/sandboxes/{sid}")


def test_snapshots_expire_after_their_ttl(stack: Stack) -> None:
    erin, _ = _tenant(stack, "erin", max_snapshots=4)
    sid = lease(erin, "tiny", ttl_s=120)["id"]
    images = _images(stack) + 1
    snap = erin.post(f"/v1/sandboxes/{sid}/snapshots").json()
    assert _usage(stack, "erin")[0] == 1
    made, expires = (datetime.fromisoformat(snap[k]) for k in ("created_at", "expires_at"))
    assert abs((expires - made).total_seconds() - TTL_S) < 5
    time.sleep(1)
    assert erin.get(f"/v1/snapshots/{snap['id']}").status_code == 200
    with stack.ctx.db.session() as s:  # let its TTL pass
        s.execute(update(Snapshot).where(Snapshot.id == snap["id"]).values(expires_at=utcnow()))
    stack.wait_for(lambda: erin.get(f"/v1/snapshots/{snap['id']}").status_code == 404, 30)
    assert _usage(stack, "erin") == (0, 0)
    r = stack.admin.get("/v1/audit", params={"action": "snapshot.expire", "tenant": "erin"})
    assert [e["details"]["snapshot_id"] for e in r.json()["events"]] == [snap["id"]]
    stack.wait_for(lambda: _images(stack) == images - 1, 30)
    erin.delete(f"/v1/sandboxes/{sid}")


def test_sdk_gets_and_deletes_snapshots(stack: Stack) -> None:
    _, key = _tenant(stack, "frank", max_snapshots=4)
    with Client(stack.url, key) as client, client.sandbox("tiny") as sb:
        snap = client.snapshot(sb.id)
        got = client.get_snapshot(snap.id)
        assert (got.id, got.sandbox_id, got.expires_at) == (snap.id, sb.id, snap.expires_at)
        client.delete_snapshot(snap.id)
        with pytest.raises(NotFoundError):
            client.get_snapshot(snap.id)

        async def use_async() -> None:
            async with AsyncClient(stack.url, key) as aclient:
                snap = await aclient.snapshot(sb.id)
                assert (await aclient.get_snapshot(snap.id)).bytes == snap.bytes
                await aclient.delete_snapshot(snap.id)
                with pytest.raises(NotFoundError):
                    await aclient.delete_snapshot(snap.id)

        asyncio.run(use_async())
    assert _usage(stack, "frank") == (0, 0)
