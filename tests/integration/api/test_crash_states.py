"""States a crash leaves behind, made exactly (the service's own writes, then no more), and
what recovers them. Found by a crash trial: ``kill -9`` right after a record was stored and
before its sandbox was released left the sandbox leased (and its quota held) until its
lease ran out; neither the worker's retried verify nor start-up recovery released it."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import update

from service import rewards
from service.db.models import Episode, Sandbox, utcnow
from service.episodes import build_record, get
from service.recovery import reclaim, recover_on_start
from service.tenants import Principal
from service.verifiers.base import VerifierResult
from tests.integration.api.conftest import Stack

pytestmark = pytest.mark.docker

TRAJ = {"policy": {"name": "test", "version": "1"}}


def _stored_but_not_released(stack: Stack) -> dict[str, Any]:
    """An episode whose record is stored and state final, its sandbox still leased: what
    ``episodes.verify`` leaves when the process dies between its two steps."""
    r = stack.alice.post(
        "/v1/episodes", json={"task_id": "word-frequency-top20", "suite": "terminal"}
    )
    assert r.status_code == 201, r.text
    ep_json = r.json()["episodes"][0]
    with stack.ctx.db.read() as s:
        tenant = s.get(Episode, ep_json["id"]).tenant_id
    principal = Principal(tenant_id=tenant, key_id="k", scopes=frozenset())
    ep = get(stack.ctx, principal, ep_json["id"])
    result = VerifierResult(name="terminal", version="2", status="ok", reward=0.0)
    record = build_record(ep, result, trajectory=TRAJ, verify_ms=1.0, snapshot_id=None)
    with stack.ctx.db.session() as s:
        rewards.store(s, record, tenant_id=tenant)
        s.execute(update(Episode).where(Episode.id == ep.id).values(state="verified"))
    assert stack.alice.get(f"/v1/sandboxes/{ep_json['sandbox_id']}").json()["state"] == "leased"
    return ep_json


def test_a_retried_verify_releases_the_sandbox(stack: Stack) -> None:
    ep = _stored_but_not_released(stack)
    r = stack.alice.post(f"/v1/episodes/{ep['id']}/verify", json=TRAJ)
    assert r.status_code == 200, r.text
    assert stack.alice.get(f"/v1/sandboxes/{ep['sandbox_id']}").json()["state"] == "released"


def test_start_up_recovery_releases_the_sandbox(stack: Stack) -> None:
    ep = _stored_but_not_released(stack)
    counts = recover_on_start(stack.ctx)
    assert counts["orphan_sandboxes"] >= 1, counts
    assert stack.alice.get(f"/v1/sandboxes/{ep['sandbox_id']}").json()["state"] == "released"


@pytest.mark.parametrize("frozen", [True, False])
def test_a_verification_cut_off_by_a_crash_resumes_on_the_frozen_end_state(
    stack: Stack, frozen: bool
) -> None:
    """A crash mid-verification leaves the episode and its sandbox ``verifying``, frozen.
    Restarting (reconcile, recovery) puts the episode back to ``running`` and keeps the
    sandbox frozen and ``verifying``, its lease re-armed, so the worker's retried verify
    scores the end state first submitted. A crash trial: the restart thawed the container,
    a process the agent left solved the task, and the retry recorded 1.0 for an unsolved
    end state; and a lease that ran out during the downtime left a solved sample with no
    record."""
    r = stack.alice.post(
        "/v1/episodes", json={"task_id": "word-frequency-top20", "suite": "terminal"}
    )
    ep = r.json()["episodes"][0]
    sid = ep["sandbox_id"]
    late = "sleep 2; echo late > /app/late"
    r = stack.alice.post(
        f"/v1/sandboxes/{sid}/exec", json={"cmd": ["bash", "-c", f"({late}) >/dev/null 2>&1 &"]}
    )
    assert r.status_code == 200, r.text
    with stack.ctx.db.session() as s:
        s.execute(update(Episode).where(Episode.id == ep["id"]).values(state="verifying"))
        s.execute(
            update(Sandbox)
            .where(Sandbox.id == sid)
            .values(state="verifying", expires_at=utcnow() - timedelta(seconds=10))
        )
        cid = s.get(Sandbox, sid).container_id
    if frozen:  # as the verifier had, when the control plane died (else before its freeze)
        stack.ctx.runtime.freeze(cid)
    stack.ctx.pools.reconcile()
    recover_on_start(stack.ctx)
    time.sleep(3)
    engine = stack.ctx.runtime._api.inspect_container(cid)["State"]
    assert engine["Paused"], engine  # never thawed: the late process has not run
    assert stack.alice.get(f"/v1/sandboxes/{sid}").json()["state"] == "verifying"
    assert stack.alice.post(f"/v1/sandboxes/{sid}/exec", json={"cmd": ["true"]}).status_code == 409
    with stack.ctx.db.read() as s:
        assert s.get(Sandbox, sid).expires_at > utcnow() + timedelta(seconds=60)
    stack.ctx.pools.reap()  # the re-armed lease holds
    rec = stack.alice.post(f"/v1/episodes/{ep['id']}/verify", json=TRAJ)
    assert rec.status_code == 200, rec.text
    verdict = rec.json()["verifier"]
    assert (rec.json()["reward"], verdict["status"]) == (0.0, "ok"), verdict
    assert stack.alice.get(f"/v1/sandboxes/{sid}").json()["state"] == "released"


def test_a_cut_off_verification_nobody_resumes_expires(stack: Stack) -> None:
    r = stack.alice.post(
        "/v1/episodes", json={"task_id": "word-frequency-top20", "suite": "terminal"}
    )
    ep = r.json()["episodes"][0]
    sid = ep["sandbox_id"]
    with stack.ctx.db.session() as s:
        s.execute(update(Episode).where(Episode.id == ep["id"]).values(state="verifying"))
        s.execute(update(Sandbox).where(Sandbox.id == sid).values(state="verifying"))
    recover_on_start(stack.ctx)
    with stack.ctx.db.session() as s:  # the grace passed and no verify came
        s.execute(
            update(Sandbox)
            .where(Sandbox.id == sid)
            .values(expires_at=utcnow() - timedelta(seconds=1))
        )
    assert stack.ctx.pools.reap() >= 1
    assert stack.alice.get(f"/v1/sandboxes/{sid}").json()["state"] == "expired"
    reclaim(stack.ctx)
    assert stack.alice.get(f"/v1/episodes/{ep['id']}").json()["state"] == "abandoned"


def test_a_verified_episodes_sandbox_left_verifying_is_released(stack: Stack) -> None:
    """A crash between storing the record and releasing the sandbox, mid-verification."""
    ep = _stored_but_not_released(stack)
    with stack.ctx.db.session() as s:
        s.execute(update(Sandbox).where(Sandbox.id == ep["sandbox_id"]).values(state="verifying"))
    recover_on_start(stack.ctx)
    assert stack.alice.get(f"/v1/sandboxes/{ep['sandbox_id']}").json()["state"] == "released"
