"""The lease's warm claim (``PoolManager.claim``): one statement that picks the oldest warm
row and leases it, returning its columns; never one sandbox to two claimers."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from pathlib import Path

from sqlalchemy import inspect, select, text

from service import tenants
from service.config import Settings
from service.db.engine import Database
from service.db.models import Sandbox, utcnow
from service.pool import PoolManager
from service.templates import TemplateRegistry
from tests.dbutil import fresh_database

DEPLOYMENT = "d-claim"


def _pools(db: Database, tmp_path: Path) -> PoolManager:
    settings = Settings(data_dir=tmp_path, database_url=db.url, deployment=DEPLOYMENT)
    return PoolManager(settings=settings, db=db, runtime=None, templates=TemplateRegistry())  # type: ignore[arg-type]


def _warm(
    db: Database, *ids: str, template: str = "terminal", deployment: str = DEPLOYMENT
) -> None:
    """Warm rows, created one second apart in the order given (the first is the oldest)."""
    start = utcnow() - timedelta(hours=1)
    with db.session() as s:
        for i, sid in enumerate(ids):
            s.add(
                Sandbox(
                    id=sid,
                    deployment=deployment,
                    template=template,
                    image="img",
                    container_id=f"c-{sid}",
                    state="warm",
                    cpus=1.0,
                    memory_mb=1024,
                    created_at=start + timedelta(seconds=i),
                )
            )


def _claim(pools: PoolManager, s, *, tenant: str = "acme", cpus: float = 1.0) -> Sandbox | None:  # noqa: ANN001
    return pools.claim(
        s,
        template="terminal",
        tenant_id=tenant,
        expires_at=utcnow() + timedelta(seconds=300),
        ttl_s=300,
        metadata={"run": "r1", "é": [1, 2.5]},
        cpus=cpus,
        memory_mb=512,
    )


def _setup(db: Database, tmp_path: Path) -> PoolManager:
    with db.session() as s:
        tenants.create_tenant(s, "acme", max_sandboxes=64, max_cpus=64, max_memory_mb=1 << 20)
    return _pools(db, tmp_path)


def test_claim_leases_the_oldest_warm_row_and_returns_its_columns(
    db: Database, tmp_path: Path
) -> None:
    pools = _setup(db, tmp_path)
    _warm(db, "sb_other_template", template="document")
    _warm(db, "sb_other_deployment", deployment="elsewhere")
    _warm(db, "sb_a", "sb_b")
    with db.session() as s:
        s.add(
            Sandbox(
                id="sb_starting",
                deployment=DEPLOYMENT,
                template="terminal",
                image="img",
                state="starting",
                cpus=1.0,
                memory_mb=1024,
                created_at=utcnow() - timedelta(days=1),
            )
        )
    before = utcnow()
    with db.session() as s:
        got = _claim(pools, s, cpus=0.25)
    assert got is not None and got.id == "sb_a"
    # detached with every column loaded: readable after its session closed, as a loaded row
    assert inspect(got).detached
    assert (got.state, got.tenant_id, got.cpus, got.memory_mb, got.ttl_s) == (
        "leased",
        "acme",
        0.25,
        512,
        300,
    )
    assert got.container_id == "c-sb_a" and got.template == "terminal"
    assert got.metadata_ == {"run": "r1", "é": [1, 2.5]}
    assert got.leased_at is not None and got.leased_at >= before - timedelta(seconds=1)
    assert got.expires_at is not None and got.expires_at > got.leased_at
    with db.read() as s:
        row = s.get(Sandbox, "sb_a")
        stored = {c.key: getattr(row, c.key) for c in inspect(Sandbox).column_attrs}
    assert stored == {c.key: getattr(got, c.key) for c in inspect(Sandbox).column_attrs}
    with db.session() as s:
        assert _claim(pools, s).id == "sb_b"  # type: ignore[union-attr]
    with db.session() as s:
        assert _claim(pools, s) is None  # no warm row of this template and deployment left
    with db.read() as s:
        states = dict(s.execute(select(Sandbox.id, Sandbox.state)).all())
    assert states["sb_other_template"] == states["sb_other_deployment"] == "warm"
    assert states["sb_starting"] == "starting"


def test_claims_in_one_transaction_take_different_rows(db: Database, tmp_path: Path) -> None:
    # A group commit runs a burst's claims one after another in one transaction.
    pools = _setup(db, tmp_path)
    _warm(db, *(f"sb_{i}" for i in range(5)))
    with db.session() as s:
        got = [_claim(pools, s) for _ in range(6)]
    assert [g.id if g else None for g in got] == [*(f"sb_{i}" for i in range(5)), None]


def test_concurrent_claims_never_share_a_sandbox(db: Database, tmp_path: Path) -> None:
    pools = _setup(db, tmp_path)
    _warm(db, *(f"sb_{i}" for i in range(8)))
    got: list[str | None] = []
    lock = threading.Lock()

    def claimer() -> None:
        for _ in range(3):
            with db.session() as s:
                row = _claim(pools, s)
            with lock:
                got.append(row.id if row else None)

    threads = [threading.Thread(target=claimer) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ids = [g for g in got if g is not None]
    assert sorted(ids) == sorted(f"sb_{i}" for i in range(8)) and got.count(None) == 4
    with db.read() as s:
        leased = s.execute(select(Sandbox.id).where(Sandbox.state == "leased")).scalars().all()
    assert sorted(leased) == sorted(ids)


def _waiting_for_a_lock(db: Database) -> bool:
    """Whether some other connection to ``db`` waits for a row lock now (PostgreSQL)."""
    with db.read() as s:
        return bool(
            s.execute(
                text(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                    " AND datname = current_database() AND pid <> pg_backend_pid()"
                )
            ).scalar_one()
        )


def test_a_claim_passes_over_a_row_another_replica_holds(tmp_path: Path) -> None:
    # PostgreSQL only (SQLite serializes write transactions: BEGIN IMMEDIATE). Replica A's
    # batch holds the oldest warm row (claimed, not committed); replica B's claim takes the
    # next one at once (SKIP LOCKED) instead of waiting for A's commit and then retrying.
    with fresh_database("postgres", tmp_path) as db:
        pools = _setup(db, tmp_path)
        _warm(db, "sb_a", "sb_b")
        got: list[str | None] = []
        with db.session() as a:
            assert _claim(pools, a).id == "sb_a"  # type: ignore[union-attr]
            racer = threading.Thread(
                target=lambda: got.append(_one_claim(db, pools)), name="replica-b"
            )
            t0 = time.monotonic()
            racer.start()
            racer.join(10)
            assert got == ["sb_b"], got
            assert time.monotonic() - t0 < 5
        with db.read() as s:
            assert s.execute(select(Sandbox.state).where(Sandbox.state == "warm")).first() is None


def test_a_claim_waits_for_the_holder_of_the_last_warm_row(tmp_path: Path) -> None:
    # PostgreSQL only. The last warm row is held by another transaction: the claim is not
    # answered "empty" (a needless cold start) but waits, as the plain guarded UPDATE did:
    # the holder rolls back, so the row is still warm and this claim gets it.
    with fresh_database("postgres", tmp_path) as db:
        pools = _setup(db, tmp_path)
        _warm(db, "sb_last")
        got: list[str | None] = []
        with db.session() as a:
            assert _claim(pools, a).id == "sb_last"  # type: ignore[union-attr]
            racer = _claim_waiting_on_a_lock(db, pools, got)
            a.rollback()
        racer.join(30)
        assert got == ["sb_last"]
        # and when the holder commits, the waiting claim finds the pool empty
        _warm(db, "sb_next")
        got.clear()
        with db.session() as a:
            assert _claim(pools, a).id == "sb_next"  # type: ignore[union-attr]
            racer = _claim_waiting_on_a_lock(db, pools, got)
        racer.join(30)
        assert got == [None]


def _claim_waiting_on_a_lock(
    db: Database, pools: PoolManager, got: list[str | None]
) -> threading.Thread:
    """A claim on another thread (its answer appended to ``got``), once it waits on a row
    lock another transaction holds."""
    racer = threading.Thread(target=lambda: got.append(_one_claim(db, pools)))
    racer.start()
    deadline = time.monotonic() + 30
    while not _waiting_for_a_lock(db):
        assert time.monotonic() < deadline and racer.is_alive(), got
        time.sleep(0.02)
    return racer


def _one_claim(db: Database, pools: PoolManager) -> str | None:
    with db.session() as s:
        row = _claim(pools, s)
    return row.id if row else None
