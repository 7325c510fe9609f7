"""Crucible against its peers, measured in one run on this machine, with ratios Crucible/peer.

    .venv/bin/python bench/peers.py [--n 100] [--quick] [--json] [--json-file F] [--skip-...]

Measured in the same run (a real ``crucible serve``, embedded SQLite, the exec channel):
- one-shot exec p50/p99: ``POST /v1/sandboxes/{id}/exec`` of ``echo hi`` (auth and a durable
  audit event included) against raw ``docker exec`` (docker SDK) and SWE-ReX's client
  talking straight to its in-sandbox server (``swerex-remote``: no control plane, no audit);
- session command p50: a Crucible session's ``run`` against SWE-ReX's ``run_in_session``;
- throughput with 32 sandboxes executing at once (one client thread each), against raw
  ``docker exec`` with the same 32 threads;
- warm lease p50, and 128 leases arriving at once (pool sized from that demand) p99.

Each peer lives in its own environment and reports what it took (install, start) or exactly
why it did not run, as its row's status; a peer's failure never stops the bench:
- SWE-ReX: its own venv (``build/peers-venv``), its server in an image built FROM our local
  base image (no registry here; PyPI through the host's CA bundle);
- ROCK (``rl-rock``, ``bench/peer_rock.py``): its own venv, its rocklet mounted from the host
  (its ``local`` worker env); its Docker deployment always asks for ``--privileged``, which
  this engine refuses, so it is started again with every capability the engine grants
  instead, and the status says so with the engine's message; one-shot and session timed;
- Harbor (``harbor``, ``bench/peer_harbor.py``): needs Python >= 3.12 and compose v2, so it
  runs in a Debian 13 rootfs (debootstrap, ``docker-compose`` 2.26) entered with chroot; its
  environment is built FROM our local base image and its one-shot ``exec`` is timed.
Nothing is made up: a figure is printed only when it was measured in this run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import docker
import httpx
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import Series, Served, serve  # noqa: E402
from peer_harbor import harbor  # noqa: E402
from peer_rock import rock  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PEERS_VENV = ROOT / "build" / "peers-venv"
SWEREX_IMAGE = "crucible-bench/swerex:latest"
CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"


def _rest_exec(c: httpx.Client, sid: str) -> None:
    r = c.post(f"/v1/sandboxes/{sid}/exec", json={"cmd": "echo hi"})
    assert r.status_code == 200 and r.json()["stdout"] == "hi\n", r.text


def _raw_exec(engine: docker.DockerClient, cid: str) -> None:
    ex = engine.api.exec_create(cid, ["sh", "-c", "echo hi"])
    assert engine.api.exec_start(ex["Id"]) == b"hi\n"


def _series(name: str, fn: Any, n: int) -> Series:
    ms = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        ms.append((time.perf_counter() - t0) * 1e3)
    return Series(name, ms)


def _throughput(fns: list[Any], seconds: float) -> float:
    """Calls per second with one thread per callable, each looping for ``seconds``."""
    done = [0] * len(fns)
    stop = time.monotonic() + seconds

    def loop(i: int) -> None:
        while time.monotonic() < stop:
            fns[i]()
            done[i] += 1

    threads = [threading.Thread(target=loop, args=(i,)) for i in range(len(fns))]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(done) / (time.perf_counter() - t0)


def _container(engine: docker.DockerClient, sid: str) -> str:
    return engine.containers.list(filters={"label": f"crucible.sandbox_id={sid}"})[0].id


def crucible_and_docker(srv: Served, n: int, console: Console) -> dict[str, Any]:
    """Every Crucible figure and the raw docker exec baselines, in one served control plane."""
    engine = docker.from_env()
    out: dict[str, Any] = {}
    with srv.client() as c:
        sb = c.post("/v1/sandboxes", json={"template": "terminal"}).json()
        cid = _container(engine, sb["id"])
        for _ in range(10):
            _rest_exec(c, sb["id"])
            _raw_exec(engine, cid)
        rest, raw = [], []
        with console.status("one-shot exec"):
            for _ in range(n):  # interleaved so noise hits both alike
                rest.append(_series("", lambda: _rest_exec(c, sb["id"]), 1).ms[0])
                raw.append(_series("", lambda: _raw_exec(engine, cid), 1).ms[0])
        out["crucible_exec"] = Series("Crucible REST exec", rest)
        out["docker_exec"] = Series("docker exec (SDK)", raw)
        sess = c.post(f"/v1/sandboxes/{sb['id']}/sessions", json={"pty": False}).json()

        def session_cmd() -> None:
            r = c.post(
                f"/v1/sandboxes/{sb['id']}/sessions/{sess['id']}/run", json={"command": "echo hi"}
            )
            assert r.status_code == 200 and "hi" in r.json()["output"], r.text

        with console.status("session commands"):
            for _ in range(5):
                session_cmd()
            out["crucible_session"] = _series("Crucible session run", session_cmd, n)
        c.delete(f"/v1/sandboxes/{sb['id']}")
    return out


def concurrent32(srv: Served, console: Console, seconds: float) -> dict[str, float]:
    """Execs per second with 32 sandboxes executing at once: Crucible REST vs docker exec."""
    engine = docker.from_env()
    with srv.client() as c, console.status("32 sandboxes at once"):
        sids = [
            c.post("/v1/sandboxes", json={"template": "terminal"}).json()["id"] for _ in range(32)
        ]
        clients = [srv.client() for _ in sids]
        cids = [_container(engine, s) for s in sids]
        crucible = _throughput(
            [lambda cl=cl, s=s: _rest_exec(cl, s) for cl, s in zip(clients, sids, strict=True)],
            seconds,
        )
        raw = _throughput([lambda cid=cid: _raw_exec(engine, cid) for cid in cids], seconds)
        for cl in clients:
            cl.close()
        for s in sids:
            c.delete(f"/v1/sandboxes/{s}")
    return {"crucible_per_s": round(crucible, 1), "docker_exec_per_s": round(raw, 1)}


def leases(srv: Served, n: int, burst: int, console: Console) -> dict[str, Series]:
    """Warm lease latency one at a time, then ``burst`` leases at once from a pool that size."""
    with srv.client() as c:

        def warm() -> int:
            return c.get("/v1/pools/terminal").json()["warm"]

        def wait_warm(k: int) -> None:
            deadline = time.monotonic() + 600
            while warm() < k and time.monotonic() < deadline:
                time.sleep(0.2)

        ms = []
        with console.status("warm leases"):
            for _ in range(n):
                wait_warm(1)
                t0 = time.perf_counter()
                r = c.post("/v1/sandboxes", json={"template": "terminal", "ttl_s": 300})
                ms.append((time.perf_counter() - t0) * 1e3)
                r.raise_for_status()
                c.delete(f"/v1/sandboxes/{r.json()['id']}")
        with console.status(f"pool filling to {burst}"):
            wait_warm(burst)
        clients = [srv.client() for _ in range(burst)]
        gate = threading.Barrier(burst)

        def one(cl: httpx.Client) -> tuple[float, str]:
            gate.wait()
            t0 = time.perf_counter()
            r = cl.post("/v1/sandboxes", json={"template": "terminal", "ttl_s": 300})
            r.raise_for_status()
            return (time.perf_counter() - t0) * 1e3, r.json()["id"]

        with console.status(f"{burst} leases at once"), ThreadPoolExecutor(burst) as ex:
            got = list(ex.map(one, clients))
        for cl in clients:
            cl.close()
        for _, sid in got:
            c.delete(f"/v1/sandboxes/{sid}")
    return {
        "warm_lease": Series("Crucible warm lease", ms),
        "burst": Series(f"{burst} leases at once", [m for m, _ in got]),
    }


_SWEREX_CLIENT = textwrap.dedent(
    """
    import asyncio, json, sys, time
    from swerex.runtime.remote import RemoteRuntime
    from swerex.runtime.abstract import Command, CreateBashSessionRequest, BashAction

    async def main(port, n):
        rt = RemoteRuntime(host="http://127.0.0.1", port=port, auth_token="bench")
        last, deadline = None, time.monotonic() + 120  # a loaded 2-core host: python is slow
        while True:
            try:
                last = await rt.is_alive()
                if last:
                    break
            except Exception as e:  # not up yet: kept for the message below
                last = e
            if time.monotonic() > deadline:
                raise SystemExit(f"swe-rex server on port {port} not up in 120 s: {last!r}")
            await asyncio.sleep(0.2)
        one, sess = [], []
        for _ in range(10):
            await rt.execute(Command(command=["sh", "-c", "echo hi"]))
        for _ in range(n):
            t = time.perf_counter()
            r = await rt.execute(Command(command=["sh", "-c", "echo hi"]))
            one.append((time.perf_counter() - t) * 1e3)
            assert r.stdout == "hi\\n", r
        await rt.create_session(CreateBashSessionRequest())
        for _ in range(n):
            t = time.perf_counter()
            r = await rt.run_in_session(BashAction(command="echo hi"))
            sess.append((time.perf_counter() - t) * 1e3)
            assert "hi" in r.output, r
        print(json.dumps({"one_shot": one, "session": sess}))

    asyncio.run(main(int(sys.argv[1]), int(sys.argv[2])))
    """
)


def swerex(base_image: str, n: int, console: Console) -> dict[str, Any]:
    """SWE-ReX one-shot and session latency, or ``{"error": ...}`` saying what failed."""
    t0 = time.monotonic()
    py = PEERS_VENV / "bin" / "python"
    try:
        with console.status("SWE-ReX: venv"):
            if not py.exists():
                subprocess.run([sys.executable, "-m", "venv", str(PEERS_VENV)], check=True)
            subprocess.run(
                [
                    str(py),
                    "-m",
                    "pip",
                    "install",
                    "-q",
                    "swe-rex",
                    "aiohttp",
                ],  # aiohttp: its remote client
                check=True,
                capture_output=True,
                text=True,
            )
        engine = docker.from_env()
        with console.status("SWE-ReX: server image"):
            dockerfile = (
                f"FROM {base_image}\nUSER root\nCOPY ca.crt /tmp/ca.crt\n"
                "RUN (command -v pip3 || (apt-get update && apt-get install -y python3-pip "
                "python3-venv)) >/dev/null && python3 -m venv /opt/swerex && PIP_CERT=/tmp/ca.crt "
                "/opt/swerex/bin/pip install -q swe-rex && rm /tmp/ca.crt\n"
            )
            ctx_dir = ROOT / "build" / "swerex-image"
            ctx_dir.mkdir(parents=True, exist_ok=True)
            (ctx_dir / "Dockerfile").write_text(dockerfile)
            (ctx_dir / "ca.crt").write_bytes(Path(CA_BUNDLE).read_bytes())
            subprocess.run(
                ["docker", "build", "-q", "-t", SWEREX_IMAGE, str(ctx_dir)],
                check=True,
                capture_output=True,
                text=True,
            )
        setup_s = time.monotonic() - t0
        version = subprocess.run(
            [str(py), "-c", "import importlib.metadata as m; print(m.version('swe-rex'))"],
            capture_output=True,
            text=True,
        ).stdout.strip()
        ctr = engine.containers.run(
            SWEREX_IMAGE,
            ["/opt/swerex/bin/swerex-remote", "--port", "8000", "--auth-token", "bench"],
            detach=True,
            ports={"8000/tcp": ("127.0.0.1", None)},
            labels={"crucible.deployment": "bench-peers-swerex"},
        )
        try:
            ctr.reload()
            port = int(ctr.attrs["NetworkSettings"]["Ports"]["8000/tcp"][0]["HostPort"])
            with console.status("SWE-ReX: measuring"):
                r = subprocess.run(
                    [str(py), "-c", _SWEREX_CLIENT, str(port), str(n)],
                    check=True,
                    capture_output=True,
                    text=True,
                    timeout=600,
                )
            got = json.loads(r.stdout.strip().splitlines()[-1])
        finally:
            ctr.remove(force=True)
        return {
            "one_shot": Series("SWE-ReX execute", got["one_shot"]),
            "session": Series("SWE-ReX run_in_session", got["session"]),
            "version": version,
            "setup_s": round(setup_s, 1),
        }
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as e:
        detail = str(getattr(e, "stderr", "") or e).strip().splitlines()
        return {"error": f"{type(e).__name__}: {' | '.join(detail[-3:])[-400:]}"}
    except docker.errors.DockerException as e:
        return {"error": f"{type(e).__name__}: {e}"}


def _ratio(a: float, b: float) -> float:
    return round(a / b, 3) if b else float("nan")


def _peer_status(name: str, got: dict[str, Any]) -> str:
    """One line for a peer: what it took, or exactly why it did not run."""
    took = ", ".join(
        f"{k} {got[k]}" for k in ("version", "compose", "setup_s", "start_s") if k in got
    )
    if "error" in got:
        return (
            f"{name}: not measured ({took}): {got['error']}" if took else f"{name}: {got['error']}"
        )
    notes = [got["note"]] if "note" in got else []
    notes += [f"{k} {got[k]}" for k in ("session_error", "stop_error") if k in got]
    return f"{name}: measured ({took})" + "".join(f"; {x}" for x in notes)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=100, help="samples per latency series")
    ap.add_argument("--burst", type=int, default=128, help="leases arriving at once")
    ap.add_argument("--seconds", type=float, default=6.0, help="throughput window")
    ap.add_argument("--quick", action="store_true", help="--n 30 --burst 32 --seconds 3")
    ap.add_argument("--skip-swerex", action="store_true")
    ap.add_argument("--skip-rock", action="store_true")
    ap.add_argument("--skip-harbor", action="store_true")
    ap.add_argument("--json", action="store_true", help="machine-readable output")
    ap.add_argument(
        "--json-file", type=Path, help="also write the JSON here (the table and it: one run)"
    )
    args = ap.parse_args()
    if args.quick:
        args.n, args.burst, args.seconds = 30, 32, 3.0
    console = Console(stderr=args.json)
    targets = json.dumps({"terminal": args.burst})  # the pool sized from the burst's demand
    room = args.burst + 40  # the tenant's quota must admit the burst (default 32 sandboxes)
    os.environ.update(
        CRUCIBLE_DEFAULT_QUOTA_SANDBOXES=str(room),
        CRUCIBLE_DEFAULT_QUOTA_CPUS=str(room * 4),
        CRUCIBLE_DEFAULT_QUOTA_MEMORY_MB=str(room * 4096),
    )
    # The host is shared: its load average (1, 5, 15 min) as each phase began, with the figures.
    load: dict[str, tuple[float, float, float]] = {}
    with serve(targets) as srv:
        with srv.client() as c:
            # The image Crucible's own sandboxes run here ("terminal"), so every peer execs in
            # the same image (the first template listed is not necessarily that one).
            base_image = next(
                t["image"] for t in c.get("/v1/templates").json() if t["name"] == "terminal"
            )
        # Exec first: after the burst the pool refills ``burst`` sandboxes, which loads the
        # host for a minute or more.
        load["exec"] = os.getloadavg()
        base = crucible_and_docker(srv, args.n, console)
        load["throughput_32"] = os.getloadavg()
        tput = concurrent32(srv, console, args.seconds)
        load["leases"] = os.getloadavg()
        lease = leases(srv, args.n, args.burst, console)
    # Peers after Crucible's control plane is gone, one at a time, so none loads another.
    skipped = {"error": "skipped"}
    load["swerex"] = os.getloadavg()
    peer = skipped if args.skip_swerex else swerex(base_image, args.n, console)
    load["rock"] = os.getloadavg()
    with console.status("ROCK: venv, then one sandbox through its Docker deployment"):
        rk = skipped if args.skip_rock else rock(base_image, args.n)
    load["harbor"] = os.getloadavg()
    with console.status("Harbor: trixie rootfs (first run), then its Docker environment"):
        hb = skipped if args.skip_harbor else harbor(base_image, args.n)
    load["end"] = os.getloadavg()

    ce, de, cs = base["crucible_exec"], base["docker_exec"], base["crucible_session"]
    ratios: dict[str, Any] = {
        "one_shot_p50_vs_docker_exec": _ratio(ce.p50, de.p50),
        "one_shot_p99_vs_docker_exec": _ratio(ce.p99, de.p99),
        "throughput_32_vs_docker_exec": _ratio(tput["crucible_per_s"], tput["docker_exec_per_s"]),
    }
    series = [ce, de, cs, lease["warm_lease"], lease["burst"]]
    if "error" not in peer:
        ratios.update(
            one_shot_p50_vs_swerex=_ratio(ce.p50, peer["one_shot"].p50),
            one_shot_p99_vs_swerex=_ratio(ce.p99, peer["one_shot"].p99),
            session_p50_vs_swerex=_ratio(cs.p50, peer["session"].p50),
        )
        series += [peer["one_shot"], peer["session"]]
    for key, got in (("rock", rk), ("harbor", hb)):
        if "one_shot" in got:
            ratios[f"one_shot_p50_vs_{key}"] = _ratio(ce.p50, got["one_shot"].p50)
            ratios[f"one_shot_p99_vs_{key}"] = _ratio(ce.p99, got["one_shot"].p99)
            series.append(got["one_shot"])
        if "session" in got:
            ratios[f"session_p50_vs_{key}"] = _ratio(cs.p50, got["session"].p50)
            series.append(got["session"])
    statuses = {
        "SWE-ReX (swe-rex)": _peer_status("SWE-ReX (swe-rex)", peer),
        "ROCK (rl-rock)": _peer_status("ROCK (rl-rock)", rk),
        "Harbor (harbor)": _peer_status("Harbor (harbor)", hb),
    }
    result = {
        "series": {s.name: s.summary() for s in series},
        "throughput_32": tput,
        "ratios_crucible_over_peer": ratios,
        "targets": {
            "one_shot_p50_le_4ms": ce.p50 <= 4,
            "one_shot_p99_le_15ms": ce.p99 <= 15,
            "session_p50_le_6ms": cs.p50 <= 6,
            "throughput_32_ge_8x_docker_exec": ratios["throughput_32_vs_docker_exec"] >= 8,
            "warm_lease_p50_le_10ms": lease["warm_lease"].p50 <= 10,
            "burst_p99_le_100ms": lease["burst"].p99 <= 100,
        },
        "peers": {
            name: {k: v for k, v in got.items() if not isinstance(v, Series)}
            for name, got in (("swerex", peer), ("rock", rk), ("harbor", hb))
        },
        "peer_status": statuses,
        "loadavg_at_phase_start": {k: [round(x, 2) for x in v] for k, v in load.items()},
    }
    if args.json_file:
        args.json_file.write_text(json.dumps(result, indent=2) + "\n")
    if args.json:
        print(json.dumps(result, indent=2))
        return
    table = Table(title="Crucible and peers, one run, this machine (ms)")
    for col in ("operation", "n", "p50", "p99", "mean"):
        table.add_column(col, justify="left" if col == "operation" else "right")
    for s in series:
        m = s.summary()
        table.add_row(
            s.name, str(m["n"]), f"{m['p50_ms']:.2f}", f"{m['p99_ms']:.2f}", f"{m['mean_ms']:.2f}"
        )
    console.print(table)
    console.print(f"32 sandboxes at once: {tput}")
    rt = Table(title="ratios Crucible / peer (below 1: Crucible faster; throughput: above 1)")
    rt.add_column("ratio")
    rt.add_column("value", justify="right")
    for k, v in ratios.items():
        rt.add_row(k, f"{v:.3f}")
    console.print(rt)
    for k, ok in result["targets"].items():
        console.print(f"{'meets' if ok else 'misses'} {k}")
    for line in statuses.values():
        console.print(line, soft_wrap=True)
    console.print(
        "load average (1, 5, 15 min) as each phase began: "
        + "; ".join(f"{k} {' '.join(f'{x:.2f}' for x in v)}" for k, v in load.items()),
        soft_wrap=True,
    )


if __name__ == "__main__":
    main()
