"""Shared bench plumbing: a real ``crucible serve`` subprocess on a temporary embedded DB,
percentiles, and a rich table with ratios against a baseline measured in the same run."""

from __future__ import annotations

import os
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import docker
import httpx
from rich.console import Console
from rich.table import Table

CRUCIBLE = str(Path(sys.executable).parent / "crucible")


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0-100) by linear interpolation (numpy's default method)."""
    xs = sorted(values)
    if not xs:
        return float("nan")
    k = (len(xs) - 1) * q / 100
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


@dataclass
class Series:
    """Latencies of one measured operation, in milliseconds."""

    name: str
    ms: list[float]

    @property
    def p50(self) -> float:
        return percentile(self.ms, 50)

    @property
    def p99(self) -> float:
        return percentile(self.ms, 99)

    def summary(self) -> dict[str, float]:
        return {
            "n": len(self.ms),
            "p50_ms": round(self.p50, 3),
            "p99_ms": round(self.p99, 3),
            "mean_ms": round(statistics.fmean(self.ms), 3),
        }


def timed(fn, n: int, *, name: str) -> Series:  # noqa: ANN001 - any zero-argument callable
    """Call ``fn`` n times; each call's wall time in ms."""
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e3)
    return Series(name, out)


@dataclass
class Served:
    """A running control plane: base URL, an API key, its deployment label."""

    url: str
    key: str
    deployment: str
    env: dict[str, str]
    pid: int = 0  # the server process (its CPU time: /proc/<pid>/stat)

    def client(self) -> httpx.Client:
        return httpx.Client(
            base_url=self.url, headers={"Authorization": f"Bearer {self.key}"}, timeout=120
        )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def serve(
    pool_targets: str = '{"terminal": 2}', *args: str, env: dict[str, str] | None = None
) -> Iterator[Served]:
    """Start ``crucible serve`` (with ``args`` added, ``env`` over this process's
    environment) on a temp SQLite file with a unique deployment; stop and clean its
    containers afterwards."""
    extra = env or {}
    tmp = tempfile.mkdtemp(prefix="crucible-bench-")
    deployment = f"bench-{secrets.token_hex(4)}"
    port = _free_port()
    env = {
        **os.environ,
        **extra,
        "CRUCIBLE_DATA_DIR": tmp,
        "CRUCIBLE_DEPLOYMENT": deployment,
        "CRUCIBLE_POOL_TARGETS": pool_targets,
        "CRUCIBLE_PORT": str(port),
    }
    env.pop("CRUCIBLE_DATABASE_URL", None)
    key = subprocess.run(
        [CRUCIBLE, "keys", "create", "--tenant", "bench", "--admin", "--json"],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    import json

    key = json.loads(key)["key"]
    proc = subprocess.Popen(
        [CRUCIBLE, "serve", "--log-level", "warning", *args],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        last = "no answer yet"
        while True:
            try:
                r = httpx.get(f"{url}/readyz", timeout=2)
                if r.status_code == 200:
                    break
                last = f"/readyz answered {r.status_code}: {r.text[:200]}"
            except httpx.HTTPError as e:  # not listening yet: keep polling, remember why
                last = f"{type(e).__name__}: {e}"
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"crucible serve did not start ({last}): {proc.stderr.read().decode()}"
                )
            time.sleep(0.2)
        yield Served(url=url, key=key, deployment=deployment, env=env, pid=proc.pid)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
        engine = docker.from_env()
        for c in engine.containers.list(
            all=True, filters={"label": f"crucible.deployment={deployment}"}
        ):
            c.remove(force=True)
        engine.close()


def report(title: str, rows: list[tuple[Series, Series | None]], console: Console) -> None:
    """Print each series beside its baseline with p50/p99 ratios, at least 150 columns wide
    (a CI log is not a terminal: rich's default 80 columns folded every cell)."""
    table = Table(title=title)
    for col in (
        "operation",
        "n",
        "p50 ms",
        "p99 ms",
        "baseline",
        "base p50",
        "base p99",
        "p50 ratio",
        "p99 ratio",
    ):
        table.add_column(col, justify="right" if col not in ("operation", "baseline") else "left")
    for s, b in rows:
        table.add_row(
            s.name,
            str(len(s.ms)),
            f"{s.p50:.2f}",
            f"{s.p99:.2f}",
            b.name if b else "-",
            f"{b.p50:.2f}" if b else "-",
            f"{b.p99:.2f}" if b else "-",
            f"{s.p50 / b.p50:.2f}x" if b else "-",
            f"{s.p99 / b.p99:.2f}x" if b else "-",
        )
    width = console.width
    console.width = max(width, 150)
    try:
        console.print(table)
    finally:
        console.width = width
