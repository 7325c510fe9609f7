"""Crucible against its peers, measured in one run on this machine, with ratios Crucible/peer.

    .venv/bin/python bench/peers.py [--n 100] [--quick] [--json] [--json-file F] [--skip-...]

Measured in the same run (a real ``crucible serve``, embedded SQLite, the exec channel), with
``bench/lease_exec.py``'s method:
- one-shot exec p50/p99: ``POST /v1/sandboxes/{id}/exec`` of ``echo hi`` (auth and a durable
  audit event included) through two clients, the standard library's ``http.client`` on a
  kept-alive connection (a lean client: the server's time plus ~0.2 ms) and httpx (what the
  SDK uses), against raw ``docker exec`` (docker SDK) in the same container, in alternating
  blocks of 25 (one by one, the engine's teardown of each docker exec ran into the next REST
  exec: 12 ms against 7 ms alone), and SWE-ReX's client talking straight to its in-sandbox
  server (``swerex-remote``: no control plane, no audit);
- session command p50: a Crucible session's ``run`` (``http.client``, in the same blocks)
  against SWE-ReX's ``run_in_session``;
- throughput with 32 sandboxes executing at once (one thread and kept-alive connection each),
  against raw ``docker exec`` with the same 32 threads;
- warm lease p50, and 128 leases arriving at once (the pool sized from that demand, all warm
  first) p99, through a raw HTTP/1.1 client with its connections opened before the timing
  (httpx's client was the bottleneck at 128 at once: 2.9 s for 128 ``/healthz``, 0.11 s raw).

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
from pathlib import Path
from typing import Any

import docker
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import Series, Served, serve, timed  # noqa: E402
from lease_exec import _exec_clients, _session_client, burst  # noqa: E402
from peer_harbor import harbor  # noqa: E402
from peer_rock import rock  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PEERS_VENV = ROOT / "build" / "peers-venv"
SWEREX_IMAGE = "crucible-bench/swerex:latest"
CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"


def _raw_exec(engine: docker.DockerClient, cid: str) -> None:
    ex = engine.api.exec_create(cid, ["sh", "-c", "echo hi"])
    assert engine.api.exec_start(ex["Id"]) == b"hi\n"


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


BLOCK = 25  # samples per path per round of the alternating blocks


def crucible_and_docker(srv: Served, n: int, console: Console) -> dict[str, Series]:
    """Crucible's one-shot exec (two clients) and session command, and raw docker exec in
    the same container, ``n`` samples each in alternating blocks of ``BLOCK``: drift in the
    shared host's load hits every path alike, and no path's tail runs into the next."""
    engine = docker.from_env()
    with srv.client() as c:
        sb = c.post("/v1/sandboxes", json={"template": "terminal"}).json()
        cid = _container(engine, sb["id"])
        sess = c.post(f"/v1/sandboxes/{sb['id']}/sessions", json={"pty": False}).json()
        rest_exec, lean_exec, lean_close = _exec_clients(srv, c, sb["id"])
        paths = {
            "lean": lean_exec,
            "rest": rest_exec,
            "session": _session_client(srv, sb["id"], sess["id"]),
            "raw": lambda: _raw_exec(engine, cid),
        }
        got: dict[str, list[float]] = {k: [] for k in paths}
        with console.status("one-shot exec and session commands, alternating blocks"):
            for _ in range(5):  # warm every path up
                for fn in paths.values():
                    fn()
            for start in range(0, n, BLOCK):
                for name, fn in paths.items():
                    got[name] += timed(fn, min(BLOCK, n - start), name="").ms
                time.sleep(0.05)  # the engine's teardown of the last docker exec
        lean_close()
        c.delete(f"/v1/sandboxes/{sb['id']}")
    return {
        "crucible_exec": Series("Crucible REST exec (http.client)", got["lean"]),
        "crucible_exec_httpx": Series("Crucible REST exec (httpx)", got["rest"]),
        "docker_exec": Series("docker exec (SDK)", got["raw"]),
        "crucible_session": Series("Crucible session run (http.client)", got["session"]),
    }


def concurrent32(srv: Served, console: Console, seconds: float) -> dict[str, float]:
    """Execs per second with 32 sandboxes executing at once: Crucible REST (one thread and
    kept-alive ``http.client`` connection per sandbox) vs docker exec with 32 threads."""
    engine = docker.from_env()
    with srv.client() as c, console.status("32 sandboxes at once"):
        sids = [
            c.post("/v1/sandboxes", json={"template": "terminal"}).json()["id"] for _ in range(32)
        ]
        lanes = [_exec_clients(srv, c, s) for s in sids]
        cids = [_container(engine, s) for s in sids]
        crucible = _throughput([lean for _, lean, _ in lanes], seconds)
        raw = _throughput([lambda cid=cid: _raw_exec(engine, cid) for cid in cids], seconds)
        for _, _, close in lanes:
            close()
        for s in sids:
            c.delete(f"/v1/sandboxes/{s}")
    return {"crucible_per_s": round(crucible, 1), "docker_exec_per_s": round(raw, 1)}


def leases(srv: Served, n: int, burst_n: int, console: Console) -> dict[str, Series]:
    """Warm lease latency one at a time (the pool refilled between samples, outside the
    timing), then ``burst_n`` leases at once (``lease_exec.burst``: the pool sized from that
    demand and all warm first, a raw HTTP/1.1 client)."""
    with srv.client() as c:
        ms = []
        with console.status("warm leases"):
            for _ in range(n):
                deadline = time.monotonic() + 600
                while c.get("/v1/pools/terminal").json()["warm"] < 1:
                    if time.monotonic() > deadline:
                        raise RuntimeError("the terminal pool had no warm sandbox in 600 s")
                    time.sleep(0.05)
                t0 = time.perf_counter()
                r = c.post("/v1/sandboxes", json={"template": "terminal", "ttl_s": 300})
                ms.append((time.perf_counter() - t0) * 1e3)
                r.raise_for_status()
                c.delete(f"/v1/sandboxes/{r.json()['id']}")
        got = burst(srv, c, burst_n, console)
    return {
        "warm_lease": Series("Crucible warm lease", ms),
        "burst": Series(f"{burst_n} leases at once", got.ms),
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
    room = args.burst + 40  # the tenant's quota must admit the burst (default 32 sandboxes)
    os.environ.update(
        CRUCIBLE_DEFAULT_QUOTA_SANDBOXES=str(room),
        CRUCIBLE_DEFAULT_QUOTA_CPUS=str(room * 4),
        CRUCIBLE_DEFAULT_QUOTA_MEMORY_MB=str(room * 4096),
    )
    os.environ.setdefault("CRUCIBLE_POOL_REFILL_CONCURRENCY", "4")
    # The host is shared: its load average (1, 5, 15 min) as each phase began, with the figures.
    load: dict[str, tuple[float, float, float]] = {}
    # A small pool while the execs are timed; the burst sizes it from its demand first.
    with serve('{"terminal": 3}') as srv:
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
    ch = base["crucible_exec_httpx"]
    ratios: dict[str, Any] = {
        "one_shot_p50_vs_docker_exec": _ratio(ce.p50, de.p50),
        "one_shot_p99_vs_docker_exec": _ratio(ce.p99, de.p99),
        "throughput_32_vs_docker_exec": _ratio(tput["crucible_per_s"], tput["docker_exec_per_s"]),
    }
    series = [ce, ch, de, cs, lease["warm_lease"], lease["burst"]]
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
            "one_shot_p50_le_4ms_httpx": ch.p50 <= 4,
            "one_shot_p99_le_15ms_httpx": ch.p99 <= 15,
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
