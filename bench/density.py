"""Idle sandboxes per GiB of host memory, and control-plane RSS with many live sandboxes.

    .venv/bin/python bench/density.py [--steps 16,32,64] [--live 200] [--quick] [--json]

Measured in one run on this machine, against a baseline measured in the same run:
- baseline: ``docker run -d --init --network none IMAGE sleep infinity`` of the terminal
  template's image, idle, grown through the same step counts (shared pages make the
  per-container PSS of the shims fall as n grows, so each step is compared at the same n);
- Crucible: a real ``crucible serve`` (embedded SQLite); for each step N, N terminal
  sandboxes leased from its warm pool (pool target set to the step's demand, then back to 0 so
  only leased sandboxes are left), idle: nothing runs in them but their init and the exec
  supervisor.

Cost of one idle sandbox = its container's cgroup working set (``memory.usage_in_bytes`` less
``total_inactive_file`` on cgroup v1, ``memory.current`` less ``inactive_file`` on v2: what
``docker stats`` shows) + the proportional set size (PSS, ``/proc/PID/smaps_rollup``) of the
container's ``containerd-shim`` + the control plane's RSS growth since it held no sandbox,
divided by N. The raw baseline has the first two. Sandboxes per GiB = 2**30 / that cost. The
engine daemons' growth (dockerd, containerd) and the host's MemAvailable drop are printed as
cross-checks: the engine is shared with other work on this machine, so they are noisy.

Control-plane RSS is then measured with ``--live`` live sandboxes; if the host runs short of
memory (``--min-free-gib``) or of time (``--max-seconds``) first, the bench stops where it is,
says so, and prints a linear extrapolation of RSS to ``--live`` from the points it measured,
labelled as such. Everything it made carries its own ``crucible.deployment`` label and is
removed at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import docker
import httpx
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import Served, serve  # noqa: E402

GIB = 1 << 30
CGROUP = Path("/sys/fs/cgroup")
TEMPLATE = "terminal"


# ---- pure helpers (unit-tested in tests/unit/test_bench_density.py) ----


def parse_kv(text: str) -> dict[str, int]:
    """``memory.stat`` / ``smaps_rollup`` / ``status`` lines (``key value [kB]``) -> {key: int}.

    Keys keep their trailing colon stripped; a ``kB`` unit is turned into bytes; lines whose
    second field is not an integer are skipped."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 2:
            continue
        try:
            value = int(parts[1])
        except ValueError:
            continue
        out[parts[0].rstrip(":")] = value * 1024 if parts[2:3] == ["kB"] else value
    return out


def working_set_bytes(usage: int, stat: dict[str, int]) -> int:
    """What ``docker stats`` reports as a container's memory use: usage less inactive file
    cache (``total_inactive_file`` on cgroup v1, ``inactive_file`` on v2), never below 0."""
    inactive = stat.get("total_inactive_file", stat.get("inactive_file", 0))
    return max(usage - inactive, 0)


def parse_environ(raw: bytes) -> dict[str, str]:
    """``/proc/PID/environ`` (NUL-separated ``K=V``) -> dict; entries without ``=`` dropped."""
    out = {}
    for item in raw.split(b"\0"):
        k, sep, v = item.partition(b"=")
        if sep:
            out[k.decode(errors="replace")] = v.decode(errors="replace")
    return out


def per_gib(bytes_each: float) -> float:
    """How many items of ``bytes_each`` bytes fit in one GiB (inf for 0)."""
    return GIB / bytes_each if bytes_each > 0 else float("inf")


def linear_fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares line through (xs, ys): (slope, intercept). Needs two distinct xs."""
    n = len(xs)
    if n < 2 or len(set(xs)) < 2:
        raise ValueError("a line needs at least two distinct x values")
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    return slope, my - slope * mx


# ---- host readings ----


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def container_working_set(cid: str) -> int | None:
    """A container's cgroup working set in bytes, cgroup v1 (cgroupfs or systemd driver) or
    v2; None when its cgroup is not found on this host."""
    candidates = [
        (CGROUP / "memory" / "docker" / cid, "memory.usage_in_bytes"),
        (CGROUP / "memory" / "system.slice" / f"docker-{cid}.scope", "memory.usage_in_bytes"),
        (CGROUP / "system.slice" / f"docker-{cid}.scope", "memory.current"),
        (CGROUP / "docker" / cid, "memory.current"),
    ]
    for d, usage_file in candidates:
        usage = _read(d / usage_file).strip()
        if usage:
            return working_set_bytes(int(usage), parse_kv(_read(d / "memory.stat")))
    return None


def pss_bytes(pid: int) -> int:
    """Proportional set size of a process in bytes (0 when it is gone)."""
    return parse_kv(_read(Path(f"/proc/{pid}/smaps_rollup"))).get("Pss", 0)


def rss_bytes(pid: int) -> int:
    """Resident set size of a process in bytes (0 when it is gone)."""
    return parse_kv(_read(Path(f"/proc/{pid}/status"))).get("VmRSS", 0)


def ppid(pid: int) -> int:
    """Parent pid (0 when the process is gone)."""
    return parse_kv(_read(Path(f"/proc/{pid}/status"))).get("PPid", 0)


def mem_available() -> int:
    """The host's MemAvailable in bytes."""
    return parse_kv(_read(Path("/proc/meminfo"))).get("MemAvailable", 0)


def pids_with_env(key: str, value: str) -> list[int]:
    """Pids whose environment has ``key=value`` (the control plane and any children)."""
    found = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                env = parse_environ((p / "environ").read_bytes())
            except OSError:
                continue
            if env.get(key) == value:
                found.append(int(p.name))
    return found


def daemons_rss() -> int:
    """RSS of dockerd and containerd (not the shims), in bytes."""
    total = 0
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            comm = _read(p / "comm").strip()
            if comm in ("dockerd", "containerd"):
                total += rss_bytes(int(p.name))
    return total


@dataclass
class Reading:
    """Memory of ``n`` idle containers, in bytes (means are per container)."""

    n: int
    cgroup_mean: float
    shim_pss_mean: float
    control_plane_rss: int
    control_plane_growth: int
    daemons_growth: int
    host_drop: int

    @property
    def per_sandbox(self) -> float:
        """Bytes one sandbox costs: cgroup + shim + its share of the control plane's growth."""
        return self.cgroup_mean + self.shim_pss_mean + max(self.control_plane_growth, 0) / self.n

    @property
    def per_gib(self) -> float:
        return per_gib(self.per_sandbox)


def read_containers(engine: docker.DockerClient, cids: Iterable[str]) -> tuple[float, float, int]:
    """(mean cgroup working set, mean shim PSS, count) over ``cids``."""
    cg, shim, n = 0, 0, 0
    for cid in cids:
        info = engine.api.inspect_container(cid)
        ws = container_working_set(info["Id"])
        if ws is None:
            continue
        cg += ws
        shim += pss_bytes(ppid(info["State"]["Pid"]))
        n += 1
    return (cg / n if n else 0.0), (shim / n if n else 0.0), n


# ---- the two measurements ----


@contextmanager
def raw_containers(engine: docker.DockerClient, image: str, progress: Progress) -> Iterator[Any]:
    """A ``grow_to(n) -> ids`` callable that starts idle ``docker run -d`` containers of
    ``image`` under a label of their own; all of them (and only them) removed on exit."""
    label = {"crucible.deployment": f"bench-density-raw-{secrets.token_hex(4)}"}
    ids: list[str] = []
    task = progress.add_task("raw docker run baseline", total=None)

    def grow_to(n: int) -> list[str]:
        progress.update(task, total=n, completed=len(ids))
        while len(ids) < n:
            ctr = engine.containers.run(
                image,
                ["sleep", "infinity"],
                detach=True,
                init=True,
                network_mode="none",
                labels=label,
            )
            ids.append(ctr.id)
            progress.advance(task)
        return list(ids)

    try:
        yield grow_to
    finally:
        for c in engine.api.containers(
            all=True, filters={"label": f"crucible.deployment={label['crucible.deployment']}"}
        ):
            engine.api.remove_container(c["Id"], force=True)
        progress.remove_task(task)


def _wait(pred: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not pred():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(0.2)


class Fleet:
    """Leased idle sandboxes of one served control plane, grown step by step."""

    def __init__(self, srv: Served, engine: docker.DockerClient, progress: Progress) -> None:
        self.srv, self.engine, self.progress = srv, engine, progress
        self.c: httpx.Client = srv.client()
        self.sids: list[str] = []

    def _set_target(self, n: int) -> None:
        self.c.put(f"/v1/pools/{TEMPLATE}", json={"target_size": n}).raise_for_status()

    def _warm(self) -> int:
        return self.c.get(f"/v1/pools/{TEMPLATE}").json()["warm"]

    def deployment_containers(self) -> list[dict[str, Any]]:
        """This deployment's containers as the engine lists them (no inspect: no race with a
        container being removed)."""
        return self.engine.api.containers(
            all=True, filters={"label": f"crucible.deployment={self.srv.deployment}"}
        )

    def grow_to(self, n: int, timeout_s: float) -> None:
        """Lease sandboxes from the warm pool until ``n`` are live; leave no warm ones."""
        k = n - len(self.sids)
        if k <= 0:
            return
        task = self.progress.add_task(
            f"pool filling to {k} (live {len(self.sids)} -> {n})", total=k
        )
        self._set_target(k)

        def filled() -> bool:
            self.progress.update(task, completed=min(self._warm(), k))
            return self._warm() >= k

        _wait(filled, timeout_s, f"{k} warm sandboxes")
        for _ in range(k):
            r = self.c.post("/v1/sandboxes", json={"template": TEMPLATE, "ttl_s": 3600})
            r.raise_for_status()
            self.sids.append(r.json()["id"])
        self._set_target(0)
        self.progress.update(task, description=f"trimming the refill (live {n})")
        _wait(lambda: len(self.deployment_containers()) == len(self.sids), 120, "the pool trimmed")
        self.progress.remove_task(task)

    def container_ids(self) -> list[str]:
        live = set(self.sids)
        return [
            c["Id"]
            for c in self.deployment_containers()
            if (c.get("Labels") or {}).get("crucible.sandbox_id") in live
        ]

    def release_all(self) -> None:
        for sid in self.sids:
            self.c.delete(f"/v1/sandboxes/{sid}")
        self.sids.clear()
        self.c.close()


def control_plane_rss(srv: Served) -> int:
    """RSS in bytes of every process running with this control plane's deployment id."""
    return sum(rss_bytes(p) for p in pids_with_env("CRUCIBLE_DEPLOYMENT", srv.deployment))


def measure(args: argparse.Namespace, console: Console) -> dict[str, Any]:
    """Run the baseline, the steps and the live-count growth; return every figure."""
    engine = docker.from_env()
    t_start = time.monotonic()
    steps = sorted(int(s) for s in args.steps.split(","))
    room = max(args.live, steps[-1]) + 16
    os.environ.update(
        CRUCIBLE_DEFAULT_QUOTA_SANDBOXES=str(room),
        CRUCIBLE_DEFAULT_QUOTA_CPUS=str(room * 4),
        CRUCIBLE_DEFAULT_QUOTA_MEMORY_MB=str(room * 4096),
        CRUCIBLE_POOL_REFILL_CONCURRENCY=str(args.refill_concurrency),
    )
    out: dict[str, Any] = {"steps": [], "live": [], "notes": []}
    with Progress(console=console, transient=True) as progress:
        host0, daemons0 = mem_available(), daemons_rss()
        with serve(json.dumps({TEMPLATE: 0})) as srv:
            with srv.client() as c:
                image = next(t for t in c.get("/v1/templates").json() if t["name"] == TEMPLATE)[
                    "image"
                ]
                for _ in range(20):  # warm the request path before the RSS reference point
                    c.get(f"/v1/pools/{TEMPLATE}")
            out["baseline"] = []
            with raw_containers(engine, image, progress) as grow_raw:
                for n in steps:
                    ids = grow_raw(n)
                    time.sleep(args.settle_s)
                    cg, shim, got = read_containers(engine, ids)
                    out["baseline"].append(
                        Reading(
                            got, cg, shim, 0, 0, daemons_rss() - daemons0, host0 - mem_available()
                        )
                    )
            fleet = Fleet(srv, engine, progress)
            # One lease and release first, so the reference RSS already holds what the lease
            # path loads once (imports, caches) and the growth is what sandboxes cost.
            fleet.grow_to(1, timeout_s=300)
            fleet.release_all()
            fleet = Fleet(srv, engine, progress)
            _wait(lambda: not fleet.deployment_containers(), 120, "the warm-up sandbox gone")
            time.sleep(args.settle_s)
            host1, daemons1, rss0 = mem_available(), daemons_rss(), control_plane_rss(srv)
            out["control_plane_rss_idle"] = rss0
            try:
                for n in steps:
                    fleet.grow_to(n, timeout_s=600)
                    time.sleep(args.settle_s)
                    cg, shim, got = read_containers(engine, fleet.container_ids())
                    rss = control_plane_rss(srv)
                    out["steps"].append(
                        Reading(
                            got,
                            cg,
                            shim,
                            rss,
                            rss - rss0,
                            daemons_rss() - daemons1,
                            host1 - mem_available(),
                        )
                    )
                    out["live"].append((len(fleet.sids), rss))
                target = max(args.live, steps[-1])
                if args.quick and len(fleet.sids) < target:
                    out["notes"].append(
                        f"--quick: stopped at {len(fleet.sids)} live, {target} not attempted"
                    )
                while not args.quick and len(fleet.sids) < target:
                    if mem_available() < args.min_free_gib * GIB:
                        out["notes"].append(
                            f"stopped at {len(fleet.sids)} live: host MemAvailable below "
                            f"{args.min_free_gib} GiB"
                        )
                        break
                    if time.monotonic() - t_start > args.max_seconds:
                        out["notes"].append(
                            f"stopped at {len(fleet.sids)} live: --max-seconds "
                            f"{args.max_seconds:.0f} reached"
                        )
                        break
                    try:
                        fleet.grow_to(min(target, len(fleet.sids) + args.batch), timeout_s=300)
                    except (TimeoutError, httpx.HTTPStatusError) as e:
                        out["notes"].append(f"stopped at {len(fleet.sids)} live: {e}")
                        break
                    time.sleep(args.settle_s)
                    out["live"].append((len(fleet.sids), control_plane_rss(srv)))
            finally:
                fleet.release_all()
    out["seconds"] = round(time.monotonic() - t_start, 1)
    out["target_live"] = max(args.live, steps[-1])
    return out


def summarize(m: dict[str, Any]) -> dict[str, Any]:
    """The figures a program reads: per step and baseline, per-GiB counts, ratios, RSS."""
    raw_at = {r.n: r for r in m["baseline"]}

    def row(r: Reading) -> dict[str, Any]:
        raw = raw_at.get(r.n)
        return {
            **asdict(r),
            "per_sandbox_bytes": round(r.per_sandbox),
            "per_gib": round(r.per_gib, 1),
            "ratio_vs_raw_docker_same_n": round(r.per_gib / raw.per_gib, 3) if raw else None,
            "host_drop_per_sandbox_bytes": round(r.host_drop / r.n) if r.n else None,
        }

    live = m["live"]
    measured_max = max(n for n, _ in live)
    rss_at = {
        "target_live": m["target_live"],
        "measured_live": measured_max,
        "rss_bytes_at_measured": dict(live)[measured_max],
        "points": [{"live": n, "rss_bytes": rss} for n, rss in live],
    }
    if measured_max < m["target_live"]:
        # The first sandboxes add a one-time step (measured: +3 MiB by 16, then about 11 KiB
        # each up to 200), so the line goes through the live points only, where there are two.
        pts = live if len({n for n, _ in live}) >= 2 else [(0, m["control_plane_rss_idle"]), *live]
        slope, icpt = linear_fit([n for n, _ in pts], [r for _, r in pts])
        rss_at["extrapolated_rss_bytes_at_target"] = round(icpt + slope * m["target_live"])
        rss_at["extrapolation"] = (
            f"EXTRAPOLATED, not measured: least-squares line through {len(pts)} points "
            f"at {', '.join(str(n) for n, _ in pts)} live "
            f"({slope / 1024:.1f} KiB per sandbox)"
        )
    return {
        "baseline_raw_docker": [row(r) for r in m["baseline"]],
        "crucible_steps": [row(r) for r in m["steps"]],
        "control_plane_rss_idle_bytes": m["control_plane_rss_idle"],
        "control_plane_rss_with_live": rss_at,
        "notes": m["notes"],
        "seconds": m["seconds"],
    }


def _mib(b: float) -> str:
    return f"{b / (1 << 20):.1f}"


def print_tables(s: dict[str, Any], console: Console) -> None:
    """Rich tables for people."""
    t = Table(title="Idle sandboxes per GiB of host memory (MiB per sandbox)")
    cols = ("what", "n", "cgroup", "shim", "CP", "total", "/GiB", "vs raw")
    for col in cols:
        t.add_column(col, justify="left" if col == "what" else "right")
    x = Table(title="Cross-checks, MiB per sandbox (shared engine and host: noisy)")
    for col in ("what", "n", "dockerd+containerd growth", "host MemAvailable drop"):
        x.add_column(col, justify="left" if col == "what" else "right")
    raw_at = {b["n"]: b for b in s["baseline_raw_docker"]}
    for r in s["crucible_steps"]:
        for name, row in (("raw docker run", raw_at.get(r["n"])), ("Crucible leased", r)):
            if row is None:
                continue
            ratio = row.get("ratio_vs_raw_docker_same_n") if row is r else 1.0
            t.add_row(
                name,
                str(row["n"]),
                _mib(row["cgroup_mean"]),
                _mib(row["shim_pss_mean"]),
                _mib(max(row["control_plane_growth"], 0) / row["n"]) if row is r else "-",
                _mib(row["per_sandbox_bytes"]),
                f"{row['per_gib']:.1f}",
                f"{ratio:.3f}" if ratio is not None else "-",
            )
            x.add_row(
                name,
                str(row["n"]),
                _mib(row["daemons_growth"] / row["n"]),
                _mib(row["host_drop"] / row["n"]),
            )
    console.print(t)
    console.print(
        "cgroup: container working set; shim: containerd-shim PSS; CP: control-plane RSS "
        "growth / n; vs raw: sandboxes per GiB over raw docker run's at the same n",
        soft_wrap=True,
    )
    console.print(x)
    live = s["control_plane_rss_with_live"]
    lt = Table(title="Control-plane RSS by live sandboxes (MiB)")
    lt.add_column("live", justify="right")
    lt.add_column("RSS", justify="right")
    lt.add_row("0", _mib(s["control_plane_rss_idle_bytes"]))
    for p in live["points"]:
        lt.add_row(str(p["live"]), _mib(p["rss_bytes"]))
    if "extrapolated_rss_bytes_at_target" in live:
        lt.add_row(
            f"{live['target_live']} EXTRAPOLATED", _mib(live["extrapolated_rss_bytes_at_target"])
        )
    console.print(lt)
    if "extrapolation" in live:
        console.print(live["extrapolation"], soft_wrap=True)
    for note in s["notes"]:
        console.print(note, soft_wrap=True)
    console.print(f"took {s['seconds']} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", default="16,32,64", help="live sandbox counts measured in full")
    ap.add_argument("--live", type=int, default=200, help="live sandboxes for control-plane RSS")
    ap.add_argument("--batch", type=int, default=48, help="growth step beyond --steps")
    ap.add_argument("--refill-concurrency", type=int, default=4)
    ap.add_argument("--settle-s", type=float, default=3.0, help="wait before each reading")
    ap.add_argument("--min-free-gib", type=float, default=3.0)
    ap.add_argument("--max-seconds", type=float, default=480.0)
    ap.add_argument("--quick", action="store_true", help="8,16 live; RSS extrapolated (< 2 min)")
    ap.add_argument("--json", action="store_true", help="machine-readable output")
    args = ap.parse_args()
    if args.quick:
        args.steps, args.live, args.settle_s = "8,16", 200, 2.0
    console = Console(stderr=args.json)
    s = summarize(measure(args, console))
    if args.json:
        print(json.dumps(s, indent=2))
    else:
        print_tables(s, console)


if __name__ == "__main__":
    main()
