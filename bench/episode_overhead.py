"""Per-episode overhead of Crucible against a bare ``docker run`` + ``docker exec`` of the same
steps, measured in the same run.

    .venv/bin/python bench/episode_overhead.py [--task word-frequency-top20] [--n 12] [--json]

Both sides run one real task with its oracle: start a sandbox of the task image, upload the
solution, run it, then check the result with the task's tests.
- Crucible: ``POST /v1/episodes`` (warm lease from the task's pool + set-up), the oracle via
  the files and exec API, ``POST /v1/episodes/{id}/verify`` (snapshot, isolated verifier
  sandbox, tests, reward record).
- Bare: ``docker run -d`` of the task image, ``put_archive`` of the solution, ``exec``
  solve.sh, ``put_archive`` of the tests, ``exec`` test.sh, read reward.txt, remove.
Overhead = wall time minus the work that is the task's own (solve.sh and test.sh durations as
measured inside the sandbox). Target (issue 3): Crucible's overhead <= 300 ms.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import tarfile
import time
from pathlib import Path

import docker
from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import Series, report, serve  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def tar_of(folder: Path, arcname: str) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        t.add(str(folder), arcname=arcname)
    return buf.getvalue()


def crucible_episode(c, task: str, solution: bytes) -> tuple[float, float]:  # noqa: ANN001
    """One episode; returns (wall ms, task-own ms)."""
    t0 = time.perf_counter()
    ep = c.post("/v1/episodes", json={"task_id": task, "suite": "terminal"}).json()["episodes"][0]
    sid = ep["sandbox_id"]
    c.put(
        f"/v1/sandboxes/{sid}/files",
        params={"path": "/"},
        content=solution,
        headers={"content-type": "application/x-tar"},
    ).raise_for_status()
    out = c.post(
        f"/v1/sandboxes/{sid}/exec", json={"cmd": "bash /solution/solve.sh", "cwd": ep["workdir"]}
    ).json()
    assert out["exit_code"] == 0, out
    rec = c.post(
        f"/v1/episodes/{ep['id']}/verify", json={"policy": {"name": "bench", "version": "1"}}
    ).json()
    wall = (time.perf_counter() - t0) * 1e3
    assert rec["reward"] == 1.0, rec["verifier"]
    own = out["duration_ms"] + rec["verifier"]["details"]["tests_ms"]
    return wall, own


def bare_episode(
    engine: docker.DockerClient, image: str, solution: bytes, tests: bytes, label: dict[str, str]
) -> tuple[float, float]:
    """The same steps with the docker SDK directly; returns (wall ms, task-own ms)."""
    api = engine.api
    t0 = time.perf_counter()
    ctr = engine.containers.run(
        image,
        ["sleep", "infinity"],
        detach=True,
        init=True,
        network_mode="none",
        labels=label,
        working_dir="/app",
    )
    own = 0.0
    try:
        ctr.put_archive("/", solution)
        for cmd in (["bash", "/solution/solve.sh"], ["bash", "/tests/test.sh"]):
            if cmd[1].startswith("/tests"):
                ctr.put_archive("/", tests)
            e0 = time.perf_counter()
            ex = api.exec_create(ctr.id, cmd, workdir="/app")
            api.exec_start(ex["Id"])
            own += (time.perf_counter() - e0) * 1e3
        stream, _ = api.get_archive(ctr.id, "/logs/verifier/reward.txt")
        with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as t:
            reward = float(t.extractfile(t.next()).read())
        assert reward == 1.0
    finally:
        ctr.remove(force=True)
    return (time.perf_counter() - t0) * 1e3, own


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", default="word-frequency-top20")
    ap.add_argument("--n", type=int, default=12)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    console = Console(stderr=args.json)
    task_dir = ROOT / "tasks" / "terminal" / args.task
    solution = tar_of(task_dir / "solution", "solution")
    tests = tar_of(task_dir / "tests", "tests")
    engine = docker.from_env()
    with serve('{"terminal": 0}') as srv, srv.client() as c:
        with console.status("warming up (task image, pool)"):
            crucible_episode(c, args.task, solution)  # builds the image, registers the template
            template = next(
                t["name"] for t in c.get("/v1/templates").json() if args.task in t["name"]
            )
            image = next(t["image"] for t in c.get("/v1/templates").json() if t["name"] == template)
            c.put(f"/v1/pools/{template}", json={"target_size": 2}).raise_for_status()
        cru_wall, cru_over, bare_wall, bare_over = [], [], [], []
        label = {"crucible.deployment": srv.deployment}
        with console.status("episodes") as st:
            for i in range(args.n):
                deadline = time.monotonic() + 60
                while (
                    c.get(f"/v1/pools/{template}").json()["warm"] < 1
                    and time.monotonic() < deadline
                ):
                    time.sleep(0.05)
                wall, own = crucible_episode(c, args.task, solution)
                cru_wall.append(wall)
                cru_over.append(wall - own)
                wall, own = bare_episode(engine, image, solution, tests, label)
                bare_wall.append(wall)
                bare_over.append(wall - own)
                st.update(f"episodes {i + 1}/{args.n}")
    rows = [
        (
            Series("episode overhead (Crucible)", cru_over),
            Series("overhead (bare docker)", bare_over),
        ),
        (Series("episode wall (Crucible)", cru_wall), Series("wall (bare docker)", bare_wall)),
    ]
    if args.json:
        print(
            json.dumps(
                {
                    s.name: {
                        **s.summary(),
                        "baseline": b.name,
                        **{f"baseline_{k}": v for k, v in b.summary().items()},
                        "p50_ratio": round(s.p50 / b.p50, 3),
                    }
                    for s, b in rows
                },
                indent=2,
            )
        )
        return
    report(f"Per-episode overhead, task {args.task} (same run)", rows, console)
    p50 = rows[0][0].p50
    console.print(
        f"Crucible overhead p50 {p50:.0f} ms "
        f"{'meets' if p50 <= 300 else 'misses'} the 300 ms target"
    )


if __name__ == "__main__":
    main()
