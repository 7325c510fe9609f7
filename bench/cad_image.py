"""The CAD sandbox image against the terminal image, measured in the same run.

    .venv/bin/python bench/cad_image.py [--n 10] [--json]

Prints, for ``crucible/cad:latest`` beside ``crucible/terminal:latest`` (build both with
``crucible images build cad terminal``):
- image size (bytes on disk as the engine reports it) and its ratio;
- cold start: create + start of a sandbox through Crucible's ``DockerRuntime`` (what a lease
  pays without a warm pool: supervisor mount, limits, init), n samples each, interleaved;
- first tool call in that fresh sandbox: ``blender -b --factory-startup --version`` in the
  CAD sandbox against ``python3 -c pass`` in the terminal sandbox (each domain's interpreter).
Latencies in milliseconds; ratios are CAD / terminal (p50 and p99).
"""

from __future__ import annotations

import argparse
import json
import secrets
import sys
import time
from pathlib import Path

import docker
import docker.errors
from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from harness import Series, report  # noqa: E402

from service.runtime.base import ExecRequest, SandboxSpec  # noqa: E402
from service.runtime.docker import DockerRuntime  # noqa: E402

IMAGES = {"cad": "crucible/cad:latest", "terminal": "crucible/terminal:latest"}
FIRST_CALL = {
    "cad": ["blender", "-b", "--factory-startup", "--version"],
    "terminal": ["python3", "-c", "pass"],
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=10, help="samples per operation")
    ap.add_argument("--json", action="store_true", help="machine-readable output")
    args = ap.parse_args()
    console = Console(stderr=args.json)
    engine = docker.from_env()
    sizes = {}
    for name, ref in IMAGES.items():
        try:
            sizes[name] = int(engine.images.get(ref).attrs["Size"])
        except docker.errors.ImageNotFound:
            sys.exit(f"{ref} is missing: build it with `crucible images build cad terminal`")
    runtime = DockerRuntime(client=engine)
    runtime.ensure_ready()
    deployment = f"bench-{secrets.token_hex(4)}"
    start: dict[str, list[float]] = {n: [] for n in IMAGES}
    first: dict[str, list[float]] = {n: [] for n in IMAGES}
    try:
        with console.status("cold starts") as status:
            for i in range(args.n):
                for name, ref in IMAGES.items():  # interleaved so noise hits both alike
                    spec = SandboxSpec(
                        sandbox_id=f"bench_{secrets.token_hex(6)}",
                        template=name,
                        deployment=deployment,
                        image=ref,
                        cpus=1.0,
                        memory_bytes=2 << 30,
                        workdir="/app" if name == "cad" else "/workspace",
                    )
                    t0 = time.perf_counter()
                    cid = runtime.create(spec)
                    start[name].append((time.perf_counter() - t0) * 1e3)
                    try:
                        t0 = time.perf_counter()
                        res = runtime.exec(cid, ExecRequest(cmd=FIRST_CALL[name], timeout_s=120))
                        first[name].append((time.perf_counter() - t0) * 1e3)
                        if res.exit_code != 0:
                            sys.exit(f"{FIRST_CALL[name]} failed in {ref}: {res.stderr[-500:]!r}")
                    finally:
                        runtime.destroy(cid)
                status.update(f"cold starts {i + 1}/{args.n}")
    finally:
        for c in engine.containers.list(
            all=True, filters={"label": f"crucible.deployment={deployment}"}
        ):
            c.remove(force=True)

    rows = [
        (Series("cad sandbox create+start", start["cad"]), Series("terminal", start["terminal"])),
        (
            Series("cad: blender -b --version", first["cad"]),
            Series("terminal: python3 -c pass", first["terminal"]),
        ),
    ]
    size_ratio = sizes["cad"] / sizes["terminal"]
    if args.json:
        out = {
            "image_size_bytes": sizes,
            "image_size_ratio": round(size_ratio, 3),
            **{
                s.name: {
                    **s.summary(),
                    "baseline": b.name,
                    **{f"baseline_{k}": v for k, v in b.summary().items()},
                    "p50_ratio": round(s.p50 / b.p50, 3),
                    "p99_ratio": round(s.p99 / b.p99, 3),
                }
                for s, b in rows
            },
        }
        print(json.dumps(out, indent=2))
        return
    console.print(
        f"image size: cad {sizes['cad'] / 1e6:.0f} MB, terminal {sizes['terminal'] / 1e6:.0f} MB,"
        f" ratio {size_ratio:.2f}x"
    )
    report("CAD sandbox vs terminal sandbox (same run)", rows, console)


if __name__ == "__main__":
    main()
