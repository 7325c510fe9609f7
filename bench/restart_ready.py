"""Restart-to-ready time of ``crucible serve`` with many live sandboxes.

    .venv/bin/python bench/restart_ready.py [--n 100] [--json]

Starts a real ``crucible serve`` on a scratch SQLite data dir, leases ``n`` sandboxes (the
terminal template, limits 0.1 CPU / 64 MiB each so they fit any host), ``kill -9``s the
server and starts it again. Prints seconds from the new process's start to ``/readyz``
answering 200 (start-up holds the serve lock, migrates, reconciles every container and runs
recovery before it answers), and to every one of the ``n`` sandboxes listed as leased again
(adopted, not failed). Cleans up every container of its deployment.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import docker
import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from service import tenants  # noqa: E402
from service.db.engine import Database  # noqa: E402

CRUCIBLE = str(Path(sys.executable).parent / "crucible")


def _wait_ready(url: str, proc: subprocess.Popen, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    last: object = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited {proc.returncode}")
        try:
            r = httpx.get(f"{url}/readyz", timeout=2)
            if r.status_code == 200:
                return
            last = f"/readyz answered {r.status_code}"
        except httpx.TransportError as e:  # not listening yet
            last = e
        time.sleep(0.05)
    raise SystemExit(f"server never became ready (last: {last})")


def main() -> None:
    """Run the measurement and print it."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=100)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="crucible-restart-"))
    deployment = f"bench-restart-{secrets.token_hex(3)}"
    db = Database(f"sqlite:///{tmp / 'crucible.db'}")
    db.migrate()
    with db.session() as s:
        tenants.create_tenant(
            s, "bench", max_sandboxes=args.n, max_cpus=args.n, max_memory_mb=args.n * 128
        )
        key = tenants.create_key(s, "bench", scopes=set())
    db.dispose()
    port = 18000 + secrets.randbelow(2000)
    url = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("CRUCIBLE_")}
    env.update(
        CRUCIBLE_DATA_DIR=str(tmp),
        CRUCIBLE_DEPLOYMENT=deployment,
        CRUCIBLE_POOL_TARGETS=json.dumps({"terminal": 0, "document": 0, "cad": 0}),
    )
    cmd = [CRUCIBLE, "serve", "--port", str(port), "--log-level", "warning"]
    log = (tmp / "server.log").open("a")
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    headers = {"Authorization": f"Bearer {key}"}
    try:
        _wait_ready(url, proc)
        body = {"template": "terminal", "ttl_s": 3600, "limits": {"cpus": 0.1, "memory_mb": 64}}

        def lease(_: int) -> None:
            r = httpx.post(f"{url}/v1/sandboxes", json=body, headers=headers, timeout=300)
            r.raise_for_status()

        t0 = time.monotonic()
        with ThreadPoolExecutor(4) as pool:
            list(pool.map(lease, range(args.n)))
        lease_s = time.monotonic() - t0
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        t0 = time.monotonic()
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
        _wait_ready(url, proc)
        ready_s = time.monotonic() - t0
        live = httpx.get(f"{url}/v1/sandboxes", headers=headers, timeout=60).json()
        leased = sum(1 for sb in live["sandboxes"] if sb["state"] == "leased")
        result = {
            "live_sandboxes": args.n,
            "lease_all_s": round(lease_s, 2),
            "restart_to_ready_s": round(ready_s, 2),
            "adopted_leased": leased,
        }
        if args.json:
            print(json.dumps(result))
        else:
            print(
                f"{args.n} live sandboxes (leased in {lease_s:.1f} s): restart to ready "
                f"{ready_s:.2f} s; {leased} of {args.n} adopted as leased"
            )
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
        engine = docker.from_env()
        for c in engine.containers.list(
            all=True, filters={"label": f"crucible.deployment={deployment}"}
        ):
            c.remove(force=True)
        engine.close()


if __name__ == "__main__":
    main()
