"""Idle churn of two control-plane replicas (issue 14's "done when"): containers created and
destroyed without a lease while nothing happens.

    CRUCIBLE_BENCH_POSTGRES_URL=postgresql+psycopg://... CRUCIBLE_BENCH_REDIS_URL=redis://...
    .venv/bin/python bench/idle_replicas.py [--idle-s 300] [--target 3] [--json]

Creates a scratch database on that PostgreSQL server (dropped at the end), starts two
``crucible serve`` replicas (``CRUCIBLE_REPLICA=1``) on it and on Redis with a warm-pool
target for ``terminal``, waits until the pool is full, then watches ``--idle-s`` seconds.
Prints the sandboxes created in the window without a lease (``unleased_created``), those
destroyed without a lease (``unleased_destroyed``), the peak number of unleased live
sandboxes, and the number of engine containers of the deployment at the start and the end.
0 and 0 is the goal. Cleans up every container of its deployment.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import docker
import httpx
from sqlalchemy import create_engine, func, select, text
from sqlalchemy.engine import make_url

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from service.db.engine import Database  # noqa: E402
from service.db.models import Sandbox  # noqa: E402

CRUCIBLE = str(Path(sys.executable).parent / "crucible")
ROOT = Path(__file__).resolve().parents[1]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _scratch_db(server_url: str) -> str:
    name = f"bench_idle_{secrets.token_hex(4)}"
    admin = create_engine(server_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(text(f'CREATE DATABASE "{name}"'))
    admin.dispose()
    return make_url(server_url).set(database=name).render_as_string(hide_password=False)


def _drop_db(server_url: str, url: str) -> None:
    name = make_url(url).database
    admin = create_engine(server_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


def _count(db: Database, *where: object) -> int:
    with db.read() as s:
        return s.execute(select(func.count()).select_from(Sandbox).where(*where)).scalar_one()


def main() -> None:
    """Run the measurement and print it (a table line, or JSON with ``--json``)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--idle-s", type=float, default=300.0)
    ap.add_argument("--target", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    pg = os.environ.get("CRUCIBLE_BENCH_POSTGRES_URL") or os.environ["CRUCIBLE_TEST_POSTGRES_URL"]
    rd = os.environ.get("CRUCIBLE_BENCH_REDIS_URL") or os.environ["CRUCIBLE_TEST_REDIS_URL"]
    url = _scratch_db(pg)
    deployment = f"bench-idle-{secrets.token_hex(4)}"
    db = Database(url)
    db.migrate()
    env = {k: v for k, v in os.environ.items() if not k.startswith("CRUCIBLE_")}
    env.update(
        CRUCIBLE_DATABASE_URL=url,
        CRUCIBLE_REDIS_URL=rd,
        CRUCIBLE_REPLICA="1",
        CRUCIBLE_DATA_DIR=str(Path("/tmp") / deployment),
        CRUCIBLE_DEPLOYMENT=deployment,
        CRUCIBLE_POOL_TARGETS=json.dumps({"terminal": args.target}),
        CRUCIBLE_POOL_INTERVAL_S="0.5",
    )
    procs, logs = [], []
    engine = docker.from_env()
    label = {"label": f"crucible.deployment={deployment}"}
    try:
        for i in range(2):
            port = _port()
            log = open(f"/tmp/{deployment}-r{i}.log", "w")  # noqa: SIM115 - closed below
            logs.append(log)
            procs.append(
                subprocess.Popen(
                    [CRUCIBLE, "serve", "--port", str(port), "--log-level", "warning"],
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    cwd=ROOT,
                )
            )
            deadline, last = time.monotonic() + 90, None
            while True:
                try:
                    r = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1)
                    if r.status_code == 200:
                        break
                    last = f"/readyz answered {r.status_code}: {r.text[:200]}"
                except httpx.TransportError as e:  # not listening yet
                    last = repr(e)
                assert time.monotonic() < deadline, f"replica {i} never got ready: {last}"
                time.sleep(0.2)
        deadline = time.monotonic() + 120
        while _count(db, Sandbox.state == "warm") < args.target:
            assert time.monotonic() < deadline, "the warm pool never filled"
            time.sleep(0.2)
        time.sleep(3)  # let the last refills settle
        since = datetime.now(UTC)
        released0 = _count(db, Sandbox.leased_at.is_(None), Sandbox.state == "released")
        containers0 = len(engine.containers.list(all=True, filters=label))
        peak, t_end = 0, time.monotonic() + args.idle_s
        while time.monotonic() < t_end:
            peak = max(peak, _count(db, Sandbox.tenant_id.is_(None), Sandbox.state != "released"))
            time.sleep(0.5)
        out = {
            "replicas": 2,
            "target": args.target,
            "idle_s": args.idle_s,
            "unleased_created": _count(
                db, Sandbox.created_at >= since, Sandbox.leased_at.is_(None)
            ),
            "unleased_destroyed": _count(
                db, Sandbox.leased_at.is_(None), Sandbox.state == "released"
            )
            - released0,
            "peak_unleased_live": peak,
            "containers_start": containers0,
            "containers_end": len(engine.containers.list(all=True, filters=label)),
        }
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            p.wait(timeout=60)
        for log in logs:
            log.close()
        for c in engine.containers.list(all=True, filters=label):
            c.remove(force=True)
        engine.close()
        db.engine.dispose()
        _drop_db(pg, url)
    if args.json:
        print(json.dumps(out))
    else:
        print(" ".join(f"{k}={v}" for k, v in out.items()))


if __name__ == "__main__":
    main()
