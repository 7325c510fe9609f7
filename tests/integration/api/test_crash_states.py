"""States a crash leaves behind, made exactly (the service's own writes, then no more), and
what recovers them. Found by a crash trial: ``kill -9`` right after a record was stored and
before its sandbox was released left the sandbox leased (and its quota held) until its
lease ran out; neither the worker's retried verify nor start-up recovery released it."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import update

from service import rewards
from service.db.models import Episode, Sandbox
from service.episodes import build_record, get
from service.recovery import recover_on_start
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


def test_a_verification_cut_off_by_a_crash_hands_the_sandbox_back(stack: Stack) -> None:
    """A crash mid-verification leaves the episode and its sandbox ``verifying``; start-up
    recovery puts both back (``running``, ``leased``) so the worker's retried verify runs."""
    r = stack.alice.post(
        "/v1/episodes", json={"task_id": "word-frequency-top20", "suite": "terminal"}
    )
    ep = r.json()["episodes"][0]
    with stack.ctx.db.session() as s:
        s.execute(update(Episode).where(Episode.id == ep["id"]).values(state="verifying"))
        s.execute(update(Sandbox).where(Sandbox.id == ep["sandbox_id"]).values(state="verifying"))
    assert (
        stack.alice.post(
            f"/v1/sandboxes/{ep['sandbox_id']}/exec", json={"cmd": ["true"]}
        ).status_code
        == 409
    )
    recover_on_start(stack.ctx)
    assert stack.alice.get(f"/v1/sandboxes/{ep['sandbox_id']}").json()["state"] == "leased"
    rec = stack.alice.post(f"/v1/episodes/{ep['id']}/verify", json=TRAJ)
    assert rec.status_code == 200, rec.text
    assert (rec.json()["reward"], rec.json()["verifier"]["status"]) == (0.0, "ok")


def test_a_verified_episodes_sandbox_left_verifying_is_released(stack: Stack) -> None:
    """A crash between storing the record and releasing the sandbox, mid-verification."""
    ep = _stored_but_not_released(stack)
    with stack.ctx.db.session() as s:
        s.execute(update(Sandbox).where(Sandbox.id == ep["sandbox_id"]).values(state="verifying"))
    recover_on_start(stack.ctx)
    assert stack.alice.get(f"/v1/sandboxes/{ep['sandbox_id']}").json()["state"] == "released"
