"""Warm leases on the event loop and a burst of them at once (issue 15.5), on SQLite and
PostgreSQL: no thread hop when the plan needs no I/O, one answer per lease built once, every
sandbox to one lease, the quota charged once per lease, the chain intact."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from service import audit, sandboxes
from service.db.models import AuditEvent, Tenant
from tests.integration.api.conftest import Stack, start_stack

BURST = 8


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def stack(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    tmp: Path = tmp_path_factory.mktemp(f"burst-{request.param}")
    yield from start_stack(tmp, db_kind=request.param, pool_targets={"terminal": BURST})


def _warm(stack: Stack, n: int) -> None:
    stack.wait_for(lambda: stack.admin.get("/v1/pools/terminal").json()["warm"] >= n, 120)


def test_a_warm_lease_plans_on_the_event_loop(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    _warm(stack, 1)
    first = stack.alice.post("/v1/sandboxes", json={"template": "terminal"})  # the host's CPUs
    assert first.status_code == 201, first.text
    stack.alice.delete(f"/v1/sandboxes/{first.json()['id']}")
    hops: list[Any] = []
    real = sandboxes.run_in_threadpool

    async def counted(fn: Any, *args: Any, **kwargs: Any) -> Any:
        hops.append(fn)
        return await real(fn, *args, **kwargs)

    monkeypatch.setattr(sandboxes, "run_in_threadpool", counted)
    _warm(stack, 1)
    r = stack.alice.post("/v1/sandboxes", json={"template": "terminal", "metadata": {"k": "é"}})
    assert r.status_code == 201, r.text
    assert r.headers["content-type"] == "application/json"
    assert hops == []  # template in memory, host CPUs known: no worker thread
    body = r.json()
    assert body == stack.alice.get(f"/v1/sandboxes/{body['id']}").json()
    assert (body["state"], body["metadata"]) == ("leased", {"k": "é"})
    # an unknown template still goes to a thread (the registry may make a task's template)
    miss = stack.alice.post("/v1/sandboxes", json={"template": "no-such-template"})
    assert miss.status_code == 404 and len(hops) == 1
    stack.alice.delete(f"/v1/sandboxes/{body['id']}")


def test_a_burst_of_leases_gets_distinct_sandboxes_charged_once(stack: Stack) -> None:
    _warm(stack, BURST)
    with stack.ctx.db.read() as s:
        used_before = s.get(Tenant, "bob").used_sandboxes
        seq_before = s.execute(select(AuditEvent.seq).order_by(AuditEvent.seq.desc())).scalar()
    key = stack.bob.headers["authorization"]

    async def burst() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=stack.url, headers={"Authorization": key}) as c:
            return await asyncio.gather(
                *(c.post("/v1/sandboxes", json={"template": "terminal"}) for _ in range(BURST))
            )

    answers = asyncio.run(burst())
    assert [r.status_code for r in answers] == [201] * BURST, [r.text for r in answers]
    ids = [r.json()["id"] for r in answers]
    assert len(set(ids)) == BURST
    with stack.ctx.db.read() as s:
        assert s.get(Tenant, "bob").used_sandboxes == used_before + BURST
        leases = (
            s.execute(
                select(AuditEvent.sandbox_id).where(
                    AuditEvent.seq > seq_before, AuditEvent.action == "sandbox.lease"
                )
            )
            .scalars()
            .all()
        )
    assert sorted(leases) == sorted(ids)
    assert audit.verify_chain(stack.ctx.db).first_broken_seq is None
    for sid in ids:
        assert stack.bob.delete(f"/v1/sandboxes/{sid}").status_code == 200
