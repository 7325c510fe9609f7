"""The REST exec hot path: audit events group-committed (each response waits for its own
durable event, the chain stays exact) and the lease cache never outlives a row's change."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import docker
import httpx
import pytest
from sqlalchemy import select, update
from sqlalchemy.orm import Session

from service import audit
from service.db.engine import Database
from service.db.models import AuditEvent, Sandbox, utcnow
from tests.integration.api.conftest import Stack

pytestmark = pytest.mark.docker


def _lease(client: httpx.Client) -> str:
    r = client.post("/v1/sandboxes", json={"template": "terminal", "ttl_s": 300})
    assert r.status_code == 201, r.text
    return r.json()["id"]


def _exec(client: httpx.Client, sid: str, cmd: str) -> httpx.Response:
    return client.post(f"/v1/sandboxes/{sid}/exec", json={"cmd": cmd})


def test_concurrent_execs_wait_for_one_group_commit_of_chained_events(stack: Stack) -> None:
    sid = _lease(stack.alice)
    assert _exec(stack.alice, sid, "true").status_code == 200  # channel and cache warm
    commits = stack.ctx.commits
    entered, release = threading.Event(), threading.Event()

    def hold(_s: Session) -> None:
        entered.set()
        release.wait(60)

    held = commits.submit(hold)
    assert entered.wait(30)
    n = 16
    answers: dict[int, httpx.Response] = {}

    def one(i: int) -> None:
        c = stack.make_client(stack.alice.headers["authorization"].split()[1])
        answers[i] = _exec(c, sid, f"echo {i}")

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    try:
        stack.wait_for(lambda: commits.pending >= n, timeout_s=60)  # every exec ran
        time.sleep(0.2)
        assert answers == {}  # none acknowledged while its event is not durable
    finally:
        release.set()
    held.result(30)
    for t in threads:
        t.join(60)
    assert sorted(answers) == list(range(n))
    assert all(r.status_code == 200 for r in answers.values())
    assert {r.json()["stdout"] for r in answers.values()} == {f"{i}\n" for i in range(n)}
    with stack.ctx.db.read() as s:
        events = s.scalars(
            select(AuditEvent)
            .where(AuditEvent.sandbox_id == sid, AuditEvent.action == "sandbox.exec")
            .order_by(AuditEvent.seq)
        ).all()
    batch = [e for e in events if e.details["cmd"] != "true"]
    assert sorted(e.details["cmd"] for e in batch) == sorted(f"echo {i}" for i in range(n))
    seqs = [e.seq for e in batch]
    assert seqs == list(range(seqs[0], seqs[0] + n))  # one transaction: consecutive, no gap
    assert all(b.prev_hash == a.hash for a, b in zip(batch, batch[1:], strict=False))
    assert audit.verify_chain(stack.ctx.db).first_broken_seq is None
    stack.alice.delete(f"/v1/sandboxes/{sid}")


def _behind(stack: Stack, sid: str, change: str) -> None:
    """Change the sandbox's row the way some writer outside the exec path would.

    Each change ends the lease by its state, never by a past ``expires_at``: the pool's
    reaper acts on that within 0.2 s and destroys the container, and the row given back
    afterwards would point at a container that is gone (a CI run saw exactly that).
    """
    if change == "core-update":
        with stack.ctx.db.session() as s:
            s.execute(update(Sandbox).where(Sandbox.id == sid).values(state="expired"))
    elif change == "orm-flush":
        with stack.ctx.db.session() as s:
            s.get(Sandbox, sid).state = "released"
    elif change == "other-engine":  # another Database on the same file, in this process
        other = Database(stack.ctx.db.url)
        try:
            with other.session() as s:
                s.execute(update(Sandbox).where(Sandbox.id == sid).values(state="failed"))
        finally:
            other.dispose()


def _cached(stack: Stack, sid: str) -> None:
    """Exec until the sandbox's view is in the cache.

    Any sandbox row written in this process clears the whole cache (the pool refilling behind
    the lease writes rows), so one exec does not guarantee an entry a moment later.
    """
    deadline = time.monotonic() + 30
    while stack.ctx.leases.get(sid) is None:
        assert time.monotonic() < deadline, "the exec path never cached the sandbox's view"
        assert _exec(stack.alice, sid, "true").status_code == 200


@pytest.mark.parametrize("change", ["core-update", "orm-flush", "other-engine"])
def test_exec_sees_every_change_of_the_row_behind_the_cache(stack: Stack, change: str) -> None:
    sid = _lease(stack.alice)
    _cached(stack, sid)
    _behind(stack, sid, change)
    r = _exec(stack.alice, sid, "echo ran")
    assert r.status_code == 409, r.text  # never runs on a lease that ended or expired
    assert r.headers["content-type"].startswith("application/problem+json")
    with stack.ctx.db.session() as s:  # give it back for the release below
        s.execute(
            update(Sandbox)
            .where(Sandbox.id == sid)
            .values(state="leased", expires_at=utcnow() + timedelta(seconds=300))
        )
    assert _exec(stack.alice, sid, "echo back").json()["stdout"] == "back\n"
    stack.alice.delete(f"/v1/sandboxes/{sid}")


def test_exec_in_a_container_that_stopped_is_a_409_not_a_5xx(stack: Stack) -> None:
    # Regression: a leased sandbox whose container stopped under it (killed outside, or its
    # init killed by the kernel) answered exec with 502 "engine error 409".
    sid = _lease(stack.alice)
    assert _exec(stack.alice, sid, "true").status_code == 200
    with stack.ctx.db.read() as s:
        container_id = s.get(Sandbox, sid).container_id
    engine = docker.from_env()
    try:
        engine.containers.get(container_id).kill()
    finally:
        engine.close()
    r = _exec(stack.alice, sid, "echo ran")
    assert r.status_code == 409, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    assert "not running" in r.json()["detail"]
    assert stack.alice.delete(f"/v1/sandboxes/{sid}").status_code == 200


def test_released_sandbox_refuses_exec_at_once(stack: Stack) -> None:
    sid = _lease(stack.alice)
    assert _exec(stack.alice, sid, "true").status_code == 200
    assert stack.alice.delete(f"/v1/sandboxes/{sid}").status_code == 200
    r = _exec(stack.alice, sid, "echo ran")
    assert r.status_code == 409, r.text
