"""The refill lock's fencing token, checked where it matters: at the database write it
protects (issue 14; Kleppmann, "How to do distributed locking", 2016).

``service.pool.advance_fence`` on SQLite and PostgreSQL (migration 0010 makes its table
and drops it on downgrade): a token equal to or newer than the
stored one advances it, an older one is refused (``FencedOut``), and on PostgreSQL a stale
write waiting on a newer one's row lock is refused once that commits. With the real
``RedisCoordinator`` (``CRUCIBLE_TEST_REDIS_URL``), real PostgreSQL and real Docker
containers: a refiller paused past its lock's TTL (its queued refill resumes after a newer
holder, token N+1, refilled) inserts no row and creates no container; one whose lock passes
on mid-start fails its row and its container is destroyed; a token source that lost its
count (Redis restarted empty) is raised past the stored fence, so refilling resumes; one
process (in-process coordination, SQLite) refills unfenced.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from alembic.config import Config
from sqlalchemy import inspect, select

from service.config import Settings
from service.coordination import LABEL_REPLICA, InProcessCoordinator
from service.coordination.redis import RedisCoordinator
from service.db.engine import MIGRATIONS_DIR, Database
from service.db.models import RefillFence, Sandbox
from service.pool import FencedOut, PoolManager, advance_fence
from service.runtime.base import SandboxSpec
from service.templates import TemplateRegistry, builtin_templates
from tests.dbutil import fresh_database
from tests.runtimeutil import deployment_of

pytestmark = pytest.mark.postgres

TEMPLATE = "terminal"
TTL_S = 1.5  # the refill lock's lifetime in these tests
LAPSE_S = 2.0  # longer than TTL_S: a holder that neither ticks nor beats loses the lock


def _redis_url() -> str:
    url = os.environ.get("CRUCIBLE_TEST_REDIS_URL")
    if not url:
        raise RuntimeError("CRUCIBLE_TEST_REDIS_URL is not set: start scripts/services.sh")
    return url


def _stored(db: Database, deployment: str, template: str) -> int | None:
    """The fencing token stored for (deployment, template), None without a row."""
    with db.read() as s:
        return s.execute(
            select(RefillFence.token).where(
                RefillFence.deployment == deployment, RefillFence.template == template
            )
        ).scalar()


def _advance(db: Database, deployment: str, template: str, token: int | None) -> None:
    with db.session() as s:
        advance_fence(s, deployment, template, token)


@pytest.fixture(params=["sqlite", "postgres"])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Database]:
    with fresh_database(request.param, tmp_path) as d:
        yield d


@pytest.fixture
def pg(tmp_path: Path) -> Iterator[Database]:
    with fresh_database("postgres", tmp_path) as d:
        yield d


def test_the_fence_takes_equal_and_newer_tokens_and_refuses_older_ones(db: Database) -> None:
    dep = "fence-unit"
    _advance(db, dep, "t", 3)  # the first fenced write makes the row
    assert _stored(db, dep, "t") == 3
    _advance(db, dep, "t", 3)  # the same holder writes again (concurrent refills share it)
    _advance(db, dep, "t", 5)  # a newer holder
    assert _stored(db, dep, "t") == 5
    with pytest.raises(FencedOut) as refused:
        _advance(db, dep, "t", 4)
    assert (refused.value.template, refused.value.token, refused.value.newest) == ("t", 4, 5)
    assert _stored(db, dep, "t") == 5, "a refused write leaves the fence as it was"
    _advance(db, dep, "other", 1)  # fences are per template ...
    _advance(db, "another-deployment", "t", 1)  # ... and per deployment
    assert (_stored(db, dep, "other"), _stored(db, "another-deployment", "t")) == (1, 1)
    _advance(db, dep, "unfenced", None)  # no token (one process, advisory fallback)
    assert _stored(db, dep, "unfenced") is None


def test_migration_0010_makes_and_drops_the_fence_table(db: Database) -> None:
    assert "refill_fences" in inspect(db.engine).get_table_names()
    _advance(db, "m", "t", 7)
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    for verb, target in (("downgrade", "0009_anomaly_rank"), ("upgrade", "head")):
        with db.engine.begin() as conn:
            cfg.attributes["connection"] = conn
            getattr(command, verb)(cfg, target)
        if verb == "downgrade":
            assert "refill_fences" not in inspect(db.engine).get_table_names()
    assert _stored(db, "m", "t") is None, "the upgrade starts with no fences"
    _advance(db, "m", "t", 1)
    assert _stored(db, "m", "t") == 1


def test_a_stale_write_queued_behind_a_newer_ones_row_lock_is_refused(pg: Database) -> None:
    """PostgreSQL at READ COMMITTED: the newer holder's advance holds the fence row until it
    commits; the stale write waits on it, then matches no row and is refused."""
    dep = "fence-race"
    _advance(pg, dep, "t", 5)
    advanced, commit = threading.Event(), threading.Event()
    outcome: list[BaseException | None] = []

    def newer() -> None:
        with pg.session() as s:
            advance_fence(s, dep, "t", 6)
            advanced.set()
            commit.wait(30)

    def stale() -> None:
        try:
            _advance(pg, dep, "t", 5)
            outcome.append(None)
        except FencedOut as e:
            outcome.append(e)

    holder = threading.Thread(target=newer)
    holder.start()
    assert advanced.wait(30)
    waiter = threading.Thread(target=stale)
    waiter.start()
    waiter.join(1.0)
    assert waiter.is_alive(), "the stale write waits for the newer one's transaction"
    commit.set()
    holder.join(30)
    waiter.join(30)
    assert len(outcome) == 1 and isinstance(outcome[0], FencedOut)
    assert outcome[0].newest == 6 and _stored(pg, dep, "t") == 6


def test_a_token_source_that_lost_its_count_is_raised_past_the_stored_fence(
    pg: Database,
) -> None:
    """Redis restarted without persistence: ``INCR fence:<template>`` starts again at 1,
    below what the database stores. The refused holder gives its lock up and raises the
    counter (``fenced_out``), so the next holder's token is newer and its writes go in."""
    dep = f"fence-lost-{os.getpid()}-{time.monotonic_ns()}"
    _advance(pg, dep, "t", 50)  # written before Redis lost its keys
    a, b = (
        RedisCoordinator(_redis_url(), deployment=dep, db_url=pg.url, ttl_s=TTL_S) for _ in range(2)
    )
    try:
        assert a.hold_refill("t")
        token = a.fence("t")
        assert token is not None and token < 50
        with pytest.raises(FencedOut) as refused:
            _advance(pg, dep, "t", token)
        a.fenced_out("t", refused.value.newest)
        assert b.hold_refill("t"), "the fenced-out holder gave its lock up"
        newer = b.fence("t")
        assert newer is not None and newer > 50
        _advance(pg, dep, "t", newer)
        assert _stored(pg, dep, "t") == newer
    finally:
        a.close()
        b.close()


# -- the pool, on real containers -----------------------------------------------------------


class _PausedCreate:
    """The real runtime, except that ``create`` waits for ``gate`` before creating (a
    refiller paused mid-start, between its row's insert and its flip to warm)."""

    def __init__(self, inner: Any, gate: threading.Event) -> None:
        self.inner, self.gate, self.entered = inner, gate, threading.Event()

    def create(self, spec: SandboxSpec) -> str:
        self.entered.set()
        assert self.gate.wait(60)
        return self.inner.create(spec)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


Replica = tuple[PoolManager, RedisCoordinator]


@contextmanager
def _replicas(
    db: Database, runtime: Any, deployment: str, *, target: int, runtime_a: Any = None
) -> Iterator[tuple[Replica, Replica]]:
    """Two replicas' pools (refill concurrency 1, loops not started: the test ticks them)
    sharing ``db``, one Redis and ``deployment``; ``runtime_a`` replaces replica a's."""
    settings = Settings(
        database_url=db.url,
        redis_url=_redis_url(),
        replica=True,
        deployment=deployment,
        pool_targets={TEMPLATE: target},
        pool_refill_concurrency=1,
    )
    with ExitStack() as stack:
        out = []
        for rt in (runtime_a or runtime, runtime):
            coord = RedisCoordinator(
                _redis_url(), deployment=deployment, db_url=db.url, ttl_s=TTL_S
            )
            pm = PoolManager(
                settings=settings,
                db=db,
                runtime=rt,
                templates=TemplateRegistry(builtin_templates()),
                coordinator=coord,
            )
            stack.callback(pm.stop)
            out.append((pm, coord))
        yield out[0], out[1]


def _idle(pm: PoolManager, timeout_s: float = 120.0) -> None:
    """Wait until ``pm`` has no refill in flight."""
    deadline = time.monotonic() + timeout_s
    while pm._inflight.get(TEMPLATE, 0):
        assert time.monotonic() < deadline, "refill did not finish"
        time.sleep(0.05)


def _rows(db: Database, deployment: str) -> list[tuple[str, str]]:
    """(state, creating replica) of the deployment's sandboxes, oldest first."""
    with db.read() as s:
        rows = s.execute(
            select(Sandbox.state, Sandbox.metadata_)
            .where(Sandbox.deployment == deployment)
            .order_by(Sandbox.created_at)
        ).all()
    return [(state, (meta or {}).get("replica")) for state, meta in rows]


def _containers_of(runtime: Any, deployment: str, replica: str) -> list[str]:
    return [
        c.container_id
        for c in runtime.list(deployment=deployment)
        if c.labels.get(LABEL_REPLICA) == replica
    ]


def _until(check: Callable[[], bool], timeout_s: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


@pytest.fixture
def deployment(docker_runtime: Any) -> Iterator[str]:
    """A fresh deployment: Redis keys, rows and containers; its containers removed after."""
    yield from deployment_of(docker_runtime)


@pytest.mark.docker
def test_a_refiller_paused_past_its_lock_adds_nothing_after_a_newer_holder_wrote(
    pg: Database, docker_runtime: Any, deployment: str
) -> None:
    with _replicas(pg, docker_runtime, deployment, target=1) as ((pa, a), (pb, b)):
        resume = threading.Event()
        pa._executor.submit(resume.wait, 60)  # a's one refill worker is paused (GC, SIGSTOP)
        pa.refill()  # a holds the lock (token N); its refill waits behind the pause
        stale = a.fence(TEMPLATE)
        assert stale is not None and pa._inflight.get(TEMPLATE) == 1
        time.sleep(LAPSE_S)  # a neither ticks nor beats: its lock lapses
        pb.refill()  # b takes the lock (token N+1) and refills: the normal path
        newer = b.fence(TEMPLATE)
        assert newer is not None and newer > stale
        _idle(pb)
        assert _rows(pg, deployment) == [("warm", b.replica_id)]
        assert _stored(pg, deployment, TEMPLATE) == newer
        resume.set()  # a resumes with its old token
        _idle(pa)
        assert _rows(pg, deployment) == [("warm", b.replica_id)], "a inserted nothing"
        assert _containers_of(docker_runtime, deployment, a.replica_id) == [], (
            "a created no container"
        )
        assert len(_containers_of(docker_runtime, deployment, b.replica_id)) == 1
        assert _stored(pg, deployment, TEMPLATE) == newer
        assert b.hold_refill(TEMPLATE) and not a.hold_refill(TEMPLATE)


@pytest.mark.docker
def test_a_refiller_whose_lock_passes_on_mid_start_fails_its_row_and_drops_its_container(
    pg: Database, docker_runtime: Any, deployment: str
) -> None:
    gate = threading.Event()
    paused = _PausedCreate(docker_runtime, gate)
    with _replicas(pg, docker_runtime, deployment, target=2, runtime_a=paused) as (
        (pa, a),
        (pb, b),
    ):
        pa.refill()  # a inserts its starting row (token N), then pauses creating it
        assert paused.entered.wait(30)
        assert _rows(pg, deployment) == [("starting", a.replica_id)]
        time.sleep(LAPSE_S)
        pb.refill()  # b counts a's starting row: one more to reach 2; token N+1
        _idle(pb)
        assert _rows(pg, deployment) == [("starting", a.replica_id), ("warm", b.replica_id)]
        gate.set()  # a's container is created; its flip to warm is refused
        _idle(pa)
        assert _rows(pg, deployment) == [("failed", a.replica_id), ("warm", b.replica_id)]
        assert _until(lambda: not _containers_of(docker_runtime, deployment, a.replica_id)), (
            "the fenced-out refill's container is destroyed"
        )
        assert len(_containers_of(docker_runtime, deployment, b.replica_id)) == 1


@pytest.mark.docker
def test_one_process_refills_unfenced(tmp_path: Path, docker_runtime: Any, deployment: str) -> None:
    """In-process coordination has no tokens (one refiller, no lock to lapse): the refill
    goes in and ``refill_fences`` stays empty."""
    with fresh_database("sqlite", tmp_path) as db:
        settings = Settings(database_url=db.url, deployment=deployment, pool_targets={TEMPLATE: 1})
        coord = InProcessCoordinator()
        pm = PoolManager(
            settings=settings,
            db=db,
            runtime=docker_runtime,
            templates=TemplateRegistry(builtin_templates()),
            coordinator=coord,
        )
        try:
            pm.refill()
            _idle(pm)
            assert _rows(db, deployment) == [("warm", coord.replica_id)]
            with db.read() as s:
                assert s.execute(select(RefillFence)).first() is None
        finally:
            pm.stop()
