"""Warm-lease and exec round-trip latency through REST, beside raw Docker in the same run.

    .venv/bin/python bench/lease_exec.py [--n 40] [--json]

Measures, on a real ``crucible serve`` (embedded SQLite, local engine):
- warm lease: ``POST /v1/sandboxes`` served from the warm pool (the pool is refilled between
  samples, outside the timing), against raw ``docker create + start`` of the same image (what
  a lease costs without a pool);
- exec round trip: ``POST /v1/sandboxes/{id}/exec`` of ``echo hi`` against raw ``docker exec``
  (docker SDK ``exec_create`` + ``exec_start``) of ``sh -c 'echo hi'`` in the same container.
Target (issue 2): warm lease p50 <= 15 ms.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import docker
from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import Series, report, serve, timed  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=40, help="samples per operation")
    ap.add_argument("--json", action="store_true", help="machine-readable output")
    args = ap.parse_args()
    console = Console(stderr=args.json)
    engine = docker.from_env()
    with serve('{"terminal": 3}') as srv, srv.client() as c:

        def warm() -> int:
            return c.get("/v1/pools/terminal").json()["warm"]

        lease_ms: list[float] = []
        with console.status("warm leases") as st:
            for i in range(args.n):
                deadline = time.monotonic() + 60
                while warm() < 1 and time.monotonic() < deadline:
                    time.sleep(0.05)
                t0 = time.perf_counter()
                r = c.post("/v1/sandboxes", json={"template": "terminal", "ttl_s": 300})
                lease_ms.append((time.perf_counter() - t0) * 1e3)
                r.raise_for_status()
                c.delete(f"/v1/sandboxes/{r.json()['id']}")
                st.update(f"warm leases {i + 1}/{args.n}")
        lease = Series("warm lease (REST)", lease_ms)

        image = c.get("/v1/templates").json()[0]["image"]
        label = {"crucible.deployment": srv.deployment}

        def cold() -> None:
            ctr = engine.containers.create(
                image, ["sleep", "infinity"], labels=label, network_mode="none", init=True
            )
            ctr.start()
            cold_ids.append(ctr.id)

        cold_ids: list[str] = []
        with console.status("raw docker create+start"):
            raw_start = timed(cold, max(10, args.n // 4), name="docker create+start")
        for cid in cold_ids:
            engine.api.remove_container(cid, force=True)

        sb = c.post("/v1/sandboxes", json={"template": "terminal"}).json()
        cid = next(
            x.id
            for x in engine.containers.list(filters={"label": f"crucible.sandbox_id={sb['id']}"})
        )

        def rest_exec() -> None:
            r = c.post(f"/v1/sandboxes/{sb['id']}/exec", json={"cmd": "echo hi"})
            assert r.json()["stdout"] == "hi\n", r.text

        def raw_exec() -> None:
            ex = engine.api.exec_create(cid, ["sh", "-c", "echo hi"])
            assert engine.api.exec_start(ex["Id"]) == b"hi\n"

        with console.status("exec round trips"):
            for _ in range(5):  # warm both paths up
                rest_exec()
                raw_exec()
            rest, raw = [], []
            for _ in range(args.n):  # interleaved so noise hits both alike
                rest.append(timed(rest_exec, 1, name="").ms[0])
                raw.append(timed(raw_exec, 1, name="").ms[0])
        rest_s, raw_s = Series("exec echo hi (REST)", rest), Series("docker exec (SDK)", raw)
        c.delete(f"/v1/sandboxes/{sb['id']}")

    rows = [(lease, raw_start), (rest_s, raw_s)]
    if args.json:
        print(
            json.dumps(
                {
                    s.name: {
                        **s.summary(),
                        "baseline": b.name,
                        **{f"baseline_{k}": v for k, v in b.summary().items()},
                        "p50_ratio": round(s.p50 / b.p50, 3),
                        "p99_ratio": round(s.p99 / b.p99, 3),
                    }
                    for s, b in rows
                },
                indent=2,
            )
        )
    else:
        report("Crucible lease and exec latency vs raw Docker (same run)", rows, console)
        verdict = "meets" if lease.p50 <= 15 else "misses"
        console.print(f"warm lease p50 {lease.p50:.2f} ms {verdict} the 15 ms target")


if __name__ == "__main__":
    main()
