"""Execs per second one control plane serves, by client concurrency (1 client is the baseline).

    .venv/bin/python bench/exec_throughput.py [--seconds 8] [--sandboxes 4] [--json]

A real ``crucible serve`` (embedded SQLite, local engine, the exec channel) and 1, 4 and 8
client threads, each with its own HTTP connection, sending ``POST /v1/sandboxes/{id}/exec``
of ``true`` round-robin over ``--sandboxes`` leased sandboxes for ``--seconds``. Prints execs
per second, p50 and p99 per concurrency, and the speed-up over one client. Everything shares
this machine's cores (clients, server, engine), so the figure is a floor for one replica;
docs/scale-out.md scales it.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import Series, serve  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--sandboxes", type=int, default=4)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    out: dict[str, dict[str, float]] = {}
    with serve(pool_targets=json.dumps({"terminal": args.sandboxes})) as srv:
        with srv.client() as c:
            ids = []
            for _ in range(args.sandboxes):
                r = c.post("/v1/sandboxes", json={"template": "terminal", "ttl_s": 600})
                r.raise_for_status()
                ids.append(r.json()["id"])
        for threads in (1, 4, 8):
            series = [Series(f"t{i}", []) for i in range(threads)]
            stop = time.monotonic() + args.seconds

            def run(i: int, s: Series, stop: float = stop) -> None:
                with srv.client() as c:
                    n = 0
                    while time.monotonic() < stop:
                        sid = ids[(i + n) % len(ids)]
                        t0 = time.perf_counter()
                        r = c.post(f"/v1/sandboxes/{sid}/exec", json={"cmd": "true"})
                        s.ms.append((time.perf_counter() - t0) * 1e3)
                        r.raise_for_status()
                        n += 1

            ts = [threading.Thread(target=run, args=(i, s)) for i, s in enumerate(series)]
            t0 = time.monotonic()
            for t in ts:
                t.start()
            for t in ts:
                t.join()
            wall = time.monotonic() - t0
            all_ms = Series(f"{threads} clients", [x for s in series for x in s.ms])
            out[f"{threads} clients"] = {
                "execs_per_s": round(len(all_ms.ms) / wall, 1),
                "p50_ms": round(all_ms.p50, 2),
                "p99_ms": round(all_ms.p99, 2),
            }
    base = out["1 clients"]["execs_per_s"]
    for row in out.values():
        row["x_one_client"] = round(row["execs_per_s"] / base, 2)
    if args.json:
        print(json.dumps(out, indent=2))
        return
    for name, row in out.items():
        print(
            f"{name:10} {row['execs_per_s']:8.1f} exec/s  p50 {row['p50_ms']:6.2f} ms  "
            f"p99 {row['p99_ms']:7.2f} ms  x{row['x_one_client']:.2f}"
        )


if __name__ == "__main__":
    main()
