"""The same control plane on PostgreSQL: the lease lifecycle, concurrency and the audit chain."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from service.audit import verify_chain
from tests.integration.api.conftest import Stack, start_stack
from tests.integration.api.test_sandboxes_api import lease, run

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def pg_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    yield from start_stack(
        tmp_path_factory.mktemp("pg"), db_kind="postgres", pool_targets={"terminal": 2}
    )


def test_postgres_lifecycle_and_chain(pg_stack: Stack) -> None:
    assert pg_stack.ctx.db.url.startswith("postgresql")
    sb = lease(pg_stack.alice)
    assert run(pg_stack.alice, sb["id"], "echo pg")["stdout"] == "pg\n"
    snap = pg_stack.alice.post(f"/v1/sandboxes/{sb['id']}/snapshots").json()
    forks = pg_stack.alice.post(f"/v1/snapshots/{snap['id']}/fork", json={"n": 2}).json()
    ids = [sb["id"], *[f["id"] for f in forks["sandboxes"]]]
    for sid in ids:
        assert pg_stack.alice.delete(f"/v1/sandboxes/{sid}").json()["state"] == "released"
    check = verify_chain(pg_stack.ctx.db)
    assert check.first_broken_seq is None and check.events_checked >= 6


def test_concurrent_leases_get_distinct_sandboxes(pg_stack: Stack) -> None:
    pg_stack.wait_for(lambda: pg_stack.alice.get("/v1/pools/terminal").json()["warm"] >= 2, 60)
    with ThreadPoolExecutor(6) as pool:
        got = list(pool.map(lambda _: lease(pg_stack.alice), range(6)))
    assert len({g["id"] for g in got}) == 6
    for g in got:
        pg_stack.alice.delete(f"/v1/sandboxes/{g['id']}")
