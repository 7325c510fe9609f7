"""Quotas over HTTP, reconcile after a restart, and audit chain verification from the CLI."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import update

from service import tenants
from service.db.models import AuditEvent
from service.pool import spec_for
from tests.integration.api.conftest import Stack
from tests.integration.api.test_sandboxes_api import assert_problem, lease, run

pytestmark = pytest.mark.docker


def test_quota_is_429_with_retry_after_and_audited(stack: Stack) -> None:
    with stack.ctx.db.session() as s:
        tenants.create_tenant(s, "carol", max_sandboxes=2, max_cpus=1.5, max_memory_mb=4096)
        carol = stack.make_client(tenants.create_key(s, "carol"))
    a = lease(carol)  # 1 CPU
    r = carol.post("/v1/sandboxes", json={"template": "terminal"})
    body = assert_problem(r, 429)
    assert r.headers["retry-after"].isdigit()
    assert "cpus 1+1 > 1.5" in body["detail"]
    b = lease(carol, "tiny")  # 0.5 CPU fits exactly
    assert_problem(carol.post("/v1/sandboxes", json={"template": "tiny"}), 429)
    refused = stack.admin.get("/v1/audit", params={"action": "quota.refused", "tenant": "carol"})
    assert len(refused.json()["events"]) == 2
    carol.delete(f"/v1/sandboxes/{a['id']}")
    c = lease(carol)  # capacity came back on release
    # a fork of 2 needs 2 CPUs, more than the whole quota (1.5): refused for good, nothing starts
    snap = carol.post(f"/v1/sandboxes/{c['id']}/snapshots").json()
    r = carol.post(f"/v1/snapshots/{snap['id']}/fork", json={"n": 2})
    assert_problem(r, 400, "quota")
    # asking more than the whole quota is not retryable: 400, not 429
    # (memory: CPUs beyond the host's are refused before the quota is asked, limits.cpus)
    r = carol.post("/v1/sandboxes", json={"template": "terminal", "limits": {"memory_mb": 8192}})
    assert "memory_mb 8192 > 4096" in assert_problem(r, 400, "quota")["detail"]
    assert "retry-after" not in r.headers
    live = carol.get("/v1/sandboxes").json()["sandboxes"]
    assert sorted(s["id"] for s in live) == sorted([b["id"], c["id"]])
    for sid in (b["id"], c["id"]):
        carol.delete(f"/v1/sandboxes/{sid}")


def test_reconcile_adopts_known_and_destroys_unknown(stack: Stack) -> None:
    ctx = stack.ctx
    sb = lease(stack.alice)
    run(stack.alice, sb["id"], "echo kept > /workspace/k")
    stray = ctx.runtime.create(
        spec_for(ctx.templates.get("terminal"), "sb_stray0000000000", ctx.settings.deployment)
    )
    counts = ctx.pools.reconcile()
    assert counts["destroyed"] >= 1
    ids = {c.sandbox_id for c in ctx.runtime.list(deployment=ctx.settings.deployment)}
    assert "sb_stray0000000000" not in ids and sb["id"] in ids
    assert stray not in {
        c.container_id for c in ctx.runtime.list(deployment=ctx.settings.deployment)
    }
    assert run(stack.alice, sb["id"], "cat /workspace/k")["stdout"] == "kept\n"
    # a DB row whose container vanished is failed and its quota given back
    ctx.runtime.destroy(_container_of(stack, sb["id"]))
    ctx.pools.reconcile()
    got = stack.alice.get(f"/v1/sandboxes/{sb['id']}").json()
    assert got["state"] == "failed" and "restart" in got["failure"]


def _container_of(stack: Stack, sid: str) -> str:
    return next(
        c.container_id
        for c in stack.ctx.runtime.list(deployment=stack.ctx.settings.deployment)
        if c.sandbox_id == sid
    )


def test_audit_time_filters_are_validated(stack: Stack) -> None:
    assert_problem(stack.admin.get("/v1/audit", params={"since": "garbage"}), 422, "since")
    first = stack.admin.get("/v1/audit", params={"limit": 1}).json()["events"][0]
    later = stack.admin.get("/v1/audit", params={"since": first["ts"], "limit": 1}).json()
    assert later["events"][0]["seq"] == first["seq"]
    none = stack.admin.get("/v1/audit", params={"until": "2000-01-01T00:00:00Z"}).json()
    assert none["events"] == []


def test_audit_verify_cli_names_first_broken_event(stack: Stack) -> None:
    env = {**os.environ, "CRUCIBLE_DATABASE_URL": stack.ctx.db.url}
    cmd = [str(Path(sys.executable).parent / "crucible"), "audit", "verify", "--json"]
    ok = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0, ok.stderr
    assert '"first_broken_seq": null' in ok.stdout
    with stack.ctx.db.session() as s:
        s.execute(update(AuditEvent).where(AuditEvent.seq == 2).values(action="tampered"))
    bad = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1
    assert '"first_broken_seq": 2' in bad.stdout
