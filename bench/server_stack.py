"""Exec round trip and control-plane CPU per exec: uvicorn on uvloop + httptools (what
``crucible serve`` picks when they are installed) against asyncio + h11, in the same run.

    .venv/bin/python bench/server_stack.py [--n 400] [--rounds 2] [--json]

Each round starts one ``crucible serve`` per stack (embedded SQLite, local engine), leases a
terminal sandbox from each and sends ``--n`` ``POST /v1/sandboxes/{id}/exec`` of ``echo hi``
over one kept-alive raw HTTP/1.1 connection (no client library in the timing), in blocks
that alternate between the stacks. It prints each stack's latency percentiles and the
server process's CPU time per exec (user + system, all threads, from ``/proc/<pid>/stat``:
less sensitive to a shared host's load than wall time), with ratios against asyncio + h11.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from contextlib import ExitStack
from pathlib import Path
from urllib.parse import urlparse

from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import Series, Served, report, serve  # noqa: E402

STACKS = {
    "uvloop + httptools": ("--loop", "uvloop", "--http", "httptools"),
    "asyncio + h11": ("--loop", "asyncio", "--http", "h11"),
}
BLOCK = 50


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def exec_block(srv: Served, sandbox_id: str, n: int) -> list[float]:
    """``n`` execs of ``echo hi`` on one connection; each round trip in ms."""
    url = urlparse(srv.url)
    reader, writer = await asyncio.open_connection(url.hostname, url.port)
    body = json.dumps({"cmd": "echo hi"}).encode()
    request = (
        f"POST /v1/sandboxes/{sandbox_id}/exec HTTP/1.1\r\nHost: {url.netloc}\r\n"
        f"Authorization: Bearer {srv.key}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    loop = asyncio.get_running_loop()
    out = []
    try:
        for _ in range(n):
            t0 = loop.time()
            writer.write(request)
            await writer.drain()
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(
                int(line.split(b":", 1)[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            )
            payload = await reader.readexactly(length)
            out.append((loop.time() - t0) * 1e3)
            if not head.startswith(b"HTTP/1.1 200") or b'"stdout":"hi\\n"' not in payload:
                raise RuntimeError(f"exec answered {head[:40]!r}: {payload[:300]!r}")
    finally:
        writer.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=400, help="execs per stack and round")
    ap.add_argument("--rounds", type=int, default=2, help="fresh servers per stack")
    ap.add_argument("--json", action="store_true", help="machine-readable output")
    args = ap.parse_args()
    console = Console(stderr=args.json)
    load_before = os.getloadavg()
    ms: dict[str, list[float]] = {name: [] for name in STACKS}
    cpu: dict[str, list[float]] = {name: [] for name in STACKS}
    for r in range(args.rounds):
        with ExitStack() as stack, console.status(f"round {r + 1}/{args.rounds}") as st:
            served = {
                n: stack.enter_context(serve('{"terminal": 1}', *a)) for n, a in STACKS.items()
            }
            boxes = {}
            for name, srv in served.items():
                c = stack.enter_context(srv.client())
                boxes[name] = c.post("/v1/sandboxes", json={"template": "terminal"}).json()["id"]
                asyncio.run(exec_block(srv, boxes[name], 20))  # warm up
            for i in range(0, args.n, BLOCK):
                st.update(f"round {r + 1}/{args.rounds}: exec {i}/{args.n}")
                for name, srv in served.items():
                    n = min(BLOCK, args.n - i)
                    c0 = cpu_s(srv.pid)
                    ms[name].extend(asyncio.run(exec_block(srv, boxes[name], n)))
                    cpu[name].append((cpu_s(srv.pid) - c0) / n * 1e3)
    series = {name: Series(f"exec echo hi, {name}", xs) for name, xs in ms.items()}
    cpu_ms = {name: sum(xs) / len(xs) for name, xs in cpu.items()}
    base = "asyncio + h11"
    if args.json:
        print(
            json.dumps(
                {
                    name: {
                        **s.summary(),
                        "server_cpu_ms_per_exec": round(cpu_ms[name], 3),
                        "p50_ratio": round(s.p50 / series[base].p50, 3),
                        "cpu_ratio": round(cpu_ms[name] / cpu_ms[base], 3),
                    }
                    for name, s in series.items()
                }
                | {"loadavg_before": load_before, "loadavg_after": os.getloadavg()}
            )
        )
        return
    new = "uvloop + httptools"
    report(
        "uvicorn server stacks, exec through REST (same run)",
        [(series[new], series[base])],
        console,
    )
    console.print(
        f"server CPU per exec: {new} {cpu_ms[new]:.2f} ms, {base} {cpu_ms[base]:.2f} ms "
        f"({cpu_ms[new] / cpu_ms[base]:.2f}x)"
    )
    console.print(f"load average before {load_before}, after {os.getloadavg()}")


if __name__ == "__main__":
    main()
