"""Chaos: ``kill -9`` of a real ``crucible serve`` at chosen moments of a job while a real
``crucible rollout --job`` worker runs through it, on SQLite and on PostgreSQL.

The moments are read from the database the server writes (a lease or fork in flight, an exec
just audited, an episode under verification, a warm-pool refill); the engine is slowed by the
``CRUCIBLE_FAULT_SLOW_MS`` seam (``service.faults``) so those windows are wide enough to hit.
After the kills: the worker exits 0, the job is ``done`` with exactly tasks x group size
records, one per sample, all 1.0 (the oracle policy), no episode is left ``running`` or
``verifying``, quota is back to zero, the audit chain is intact, and once the server has
stopped no container or snapshot image of the deployment is left. A second ``crucible
serve`` on the same database refuses to start and leaves the live server's sandboxes alone.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import docker
import httpx
import pytest
from sqlalchemy import func, select

from policy_client.client import Client
from service import audit, tenants
from service.db.engine import Database
from service.db.models import AuditEvent, Episode, RewardRecordRow, Sandbox, Tenant
from tests.dbutil import fresh_database
from tests.integration.api.conftest import _cleanup, _free_port

pytestmark = pytest.mark.docker

ROOT = Path(__file__).resolve().parents[3]
CRUCIBLE = str(Path(sys.executable).parent / "crucible")
TASKS = ["word-frequency-top20", "access-log-top-ips", "fixed-width-to-csv"]
GROUP = 2
SLOW = "snapshot=400,create=300,freeze=300"


class Server:
    """One ``crucible serve`` subprocess at a time on a fixed port and database."""

    def __init__(self, env: dict[str, str], port: int, log: Path) -> None:
        self.env, self.port, self.log = env, port, log
        self.proc: subprocess.Popen | None = None
        self.url = f"http://127.0.0.1:{port}"

    def start(self, timeout_s: float = 60.0) -> float:
        """Start and wait until it answers; returns seconds to ready."""
        t0, last = time.monotonic(), None
        with self.log.open("a") as log:
            self.proc = subprocess.Popen(
                [CRUCIBLE, "serve", "--port", str(self.port), "--log-level", "warning"],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=ROOT,
            )
        while time.monotonic() - t0 < timeout_s:
            if self.proc.poll() is not None:
                raise AssertionError(f"server exited {self.proc.returncode}: {self.log}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    return time.monotonic() - t0
            except httpx.TransportError as e:  # not listening yet
                last = e
            time.sleep(0.1)
        raise AssertionError(f"server did not become ready (last: {last!r}): {self.log}")

    def kill9(self) -> None:
        """``kill -9`` and reap."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        """Graceful stop (SIGTERM: the lifespan drains the warm pool)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=60)


def _moments(db: Database, deployment: str) -> list[tuple[str, Callable[[], bool]]]:
    def count(stmt: object) -> int:
        with db.read() as s:
            return s.execute(stmt).scalar_one()

    def execs() -> int:
        return count(
            select(func.count()).select_from(AuditEvent).where(AuditEvent.action == "sandbox.exec")
        )

    base = {"exec": 0}

    def exec_now() -> bool:
        n = execs()
        if base["exec"] == 0:
            base["exec"] = n
        return n > base["exec"]

    mine = Sandbox.deployment == deployment
    return [
        (
            "lease",
            lambda: (
                count(
                    select(func.count())
                    .select_from(Sandbox)
                    .where(
                        mine,
                        Sandbox.tenant_id.is_not(None),
                        Sandbox.state.in_(("starting", "snapshotting")),
                    )
                )
                > 0
            ),
        ),
        ("exec", exec_now),
        (
            "refill",
            lambda: (
                count(
                    select(func.count())
                    .select_from(Sandbox)
                    .where(mine, Sandbox.tenant_id.is_(None), Sandbox.state == "starting")
                )
                > 0
            ),
        ),
        (
            "verification",
            lambda: (
                count(select(func.count()).select_from(Episode).where(Episode.state == "verifying"))
                > 0
            ),
        ),
    ]


def _kill_at_moments(
    server: Server, worker: subprocess.Popen, pending: dict[str, Callable[[], bool]]
) -> tuple[list[tuple[str, float]], list[float]]:
    """``kill -9`` the server at each moment of ``pending`` once, in whatever order the job
    reaches them, while the worker runs (at most 150 s); restart it after each kill.

    Returns the moments hit with seconds since the first poll, and each restart's seconds
    to ready. A fixed order missed moments: which ones a job passes through after a given
    kill depends on how fast the machine is (after the first verification no lease need
    come; after a restart the pool may already be warm).
    """
    hit, ready_s = [], []
    t0 = time.monotonic()
    while pending and worker.poll() is None and time.monotonic() - t0 < 150:
        name = next((n for n, moment in pending.items() if moment()), None)
        if name is None:
            time.sleep(0.05)
            continue
        server.kill9()
        hit.append((name, round(time.monotonic() - t0, 1)))
        del pending[name]
        ready_s.append(server.start())
    return hit, ready_s


def _wait(predicate: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


@pytest.fixture(params=["sqlite", "postgres"])
def chaos_env(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Database, dict]]:
    deployment = f"chaos-{secrets.token_hex(4)}"
    with fresh_database(request.param, tmp_path) as db:
        with db.session() as s:
            tenants.create_tenant(s, "chaos", max_sandboxes=12, max_cpus=12, max_memory_mb=1 << 15)
            key = tenants.create_key(s, "chaos", scopes=set())
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith("CRUCIBLE_") or k == "CRUCIBLE_TEST_POSTGRES_URL"
        }
        env.update(
            CRUCIBLE_DATABASE_URL=db.url,
            CRUCIBLE_DATA_DIR=str(tmp_path / "data"),
            CRUCIBLE_DEPLOYMENT=deployment,
            CRUCIBLE_POOL_TARGETS=json.dumps({"terminal": 1}),
            CRUCIBLE_POOL_INTERVAL_S="0.2",
            CRUCIBLE_FAULT_SLOW_MS=SLOW,
            CRUCIBLE_URL="",
            CRUCIBLE_API_KEY=key,
        )
        try:
            yield db, {"env": env, "key": key, "deployment": deployment, "tmp": tmp_path}
        finally:
            _cleanup(deployment)


def test_kill_nine_during_a_job_loses_and_duplicates_nothing(
    chaos_env: tuple[Database, dict],
) -> None:
    db, c = chaos_env
    env, deployment, tmp = c["env"], c["deployment"], c["tmp"]
    port = _free_port()
    server = Server(env, port, tmp / "server.log")
    env["CRUCIBLE_URL"] = server.url
    server.start()
    try:
        _second_serve_refuses(env, deployment, db)
        with Client(server.url, c["key"]) as client:
            job = client.create_job(
                suite="terminal",
                policy={"name": "oracle", "version": "1"},
                task_ids=TASKS,
                group_size=GROUP,
            )
        with (tmp / "worker.log").open("w") as wlog:
            worker = subprocess.Popen(
                [
                    CRUCIBLE,
                    "rollout",
                    "--suite",
                    str(ROOT / "tasks" / "terminal"),
                    "--job",
                    job.id,
                    "--policy",
                    "oracle",
                    "--concurrency",
                    "3",
                    "--json",
                    "--out",
                    str(tmp / "records"),
                ],
                env=env,
                stdout=subprocess.PIPE,
                stderr=wlog,
                cwd=ROOT,
            )
        hit, ready_s = _kill_at_moments(server, worker, dict(_moments(db, deployment)))
        out, _ = worker.communicate(timeout=240)
        log = (tmp / "worker.log").read_text()[-3000:]
        assert worker.returncode == 0, (hit, log)
        assert len(hit) >= 3, (hit, ready_s)
        summary = json.loads(out)
        expected = len(TASKS) * GROUP
        assert summary["state"] == "done" and summary["episodes"] == expected, (summary, hit)

        with db.read() as s:
            rows = s.execute(
                select(RewardRecordRow.sample_key, RewardRecordRow.reward).where(
                    RewardRecordRow.job_id == job.id
                )
            ).all()
            stuck = s.execute(
                select(func.count())
                .select_from(Episode)
                .where(Episode.state.in_(("running", "verifying")))
            ).scalar_one()
        assert len(rows) == expected and len({k for k, _ in rows}) == expected, rows  # 0 dups
        assert {r for _, r in rows} == {1.0}, rows
        assert stuck == 0
        # one more restart: its first tick prunes untagged snapshot images nothing uses
        server.stop()
        server.start()
        time.sleep(3)
    finally:
        server.stop()
    with db.read() as s:
        used = s.execute(select(Tenant.used_sandboxes).where(Tenant.id == "chaos")).scalar_one()
    assert used == 0
    check = audit.verify_chain(db)
    assert check.first_broken_seq is None, check
    engine = docker.from_env()
    label = f"crucible.deployment={deployment}"
    try:
        left = engine.containers.list(all=True, filters={"label": label})
        tagged = engine.images.list(name=f"crucible-snapshots/{deployment}")
        dangling = engine.images.list(filters={"dangling": True, "label": label})
    finally:
        engine.close()
    assert (left, tagged, dangling) == ([], [], []), (hit, ready_s)


def _second_serve_refuses(env: dict[str, str], deployment: str, db: Database) -> None:
    """A second server on the same database exits at once and touches nothing."""

    def warm() -> bool:
        with db.read() as s:
            return bool(
                s.execute(
                    select(Sandbox.id).where(
                        Sandbox.deployment == deployment, Sandbox.state == "warm"
                    )
                ).first()
            )

    assert _wait(warm, 60), "the warm pool never filled"
    with db.read() as s:
        before = s.execute(
            select(Sandbox.id, Sandbox.state).where(Sandbox.deployment == deployment)
        ).all()
    second = subprocess.run(
        [CRUCIBLE, "serve", "--port", str(_free_port())],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert second.returncode != 0 and "another crucible serve" in second.stdout + second.stderr
    with db.read() as s:
        after = s.execute(
            select(Sandbox.id, Sandbox.state).where(Sandbox.deployment == deployment)
        ).all()
    assert set(before) <= set(after)  # its warm sandbox is still warm: nothing was touched
