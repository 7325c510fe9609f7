"""Per-episode overhead of Crucible against a bare ``docker run`` + ``docker exec`` of the same
steps, measured in the same run.

    .venv/bin/python bench/episode_overhead.py [--task word-frequency-top20] [--n 12] [--json]

Both sides run one real task with its oracle: start a sandbox of the task image, upload the
solution, run it, then check the result with the task's tests.
- Crucible: ``POST /v1/episodes`` (warm lease from the task's pool + set-up), the oracle via
  the files and exec API, ``POST /v1/episodes/{id}/verify`` (freeze, diff, replay onto a
  pristine sandbox, tests, reward record).
- Bare: ``docker run -d`` of the task image, ``put_archive`` of the solution, ``exec``
  solve.sh, ``put_archive`` of the tests, ``exec`` test.sh, read reward.txt, remove.

The task's own work (solve.sh and test.sh) is timed inside the sandbox on both sides (the
exec supervisor's clock for Crucible, bash's ``EPOCHREALTIME`` around the script for bare)
and subtracted. Three figures per side:
- **episode overhead** = lease + set-up + verify (Crucible: ``POST /episodes`` + ``verify``
  minus test.sh; bare: run + tests upload + test exec minus test.sh + reward read + remove).
  This is issue 3's figure; target <= 300 ms.
- **action overhead** = the oracle's two actions (upload + exec, minus solve.sh): the
  per-action cost a policy pays on every turn (bench/lease_exec.py measures it in detail).
- **total overhead** = episode wall minus both scripts.
The task's pool is sized for the load (2 warm: one for the episode, one for the pristine
sandbox its verification takes) and the loop waits for it before each episode, as a
steady stream of episodes finds it.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path

import docker
from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import Series, report, serve  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TARGET_MS = 300.0


@dataclass
class Phases:
    """One episode's times in ms: the lease + set-up + verify part, the oracle's actions, and
    the scripts' own time inside the sandbox."""

    episode_ms: float
    actions_ms: float
    solve_ms: float
    tests_ms: float

    @property
    def episode_overhead(self) -> float:
        return self.episode_ms - self.tests_ms

    @property
    def action_overhead(self) -> float:
        return self.actions_ms - self.solve_ms

    @property
    def total_overhead(self) -> float:
        return self.episode_overhead + self.action_overhead


def tar_of(folder: Path, arcname: str) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        t.add(str(folder), arcname=arcname)
    return buf.getvalue()


def crucible_episode(c, task: str, solution: bytes) -> Phases:  # noqa: ANN001
    """One episode through the API."""
    t0 = time.perf_counter()
    ep = c.post("/v1/episodes", json={"task_id": task, "suite": "terminal"}).json()["episodes"][0]
    t1 = time.perf_counter()
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
    t2 = time.perf_counter()
    rec = c.post(
        f"/v1/episodes/{ep['id']}/verify", json={"policy": {"name": "bench", "version": "1"}}
    ).json()
    t3 = time.perf_counter()
    assert rec["reward"] == 1.0, rec["verifier"]
    # the tests' duration is private (the programs they run can stretch it): the bench's
    # key is an admin of its own tenant
    page = c.get("/v1/rewards", params={"private": "true", "limit": 1000}).json()
    (mine,) = [r for r in page["records"] if r["episode_id"] == ep["id"]]
    return Phases(
        episode_ms=((t1 - t0) + (t3 - t2)) * 1e3,
        actions_ms=(t2 - t1) * 1e3,
        solve_ms=out["duration_ms"],
        tests_ms=mine["verifier"]["details"]["private"]["tests_ms"],
    )


# Runs a script and reports its own wall time (bash's clock, microseconds) on the last line
# of stderr, so bare docker's exec overhead is measured like Crucible's.
_TIMED = (
    'a=$EPOCHREALTIME; bash "$0"; rc=$?; b=$EPOCHREALTIME; '
    'echo "CRUCIBLE_OWN ${a/./} ${b/./}" >&2; exit $rc'
)


def _timed_exec(api, cid: str, script: str) -> float:  # noqa: ANN001
    """Run ``script`` in the container; return its own duration in ms."""
    ex = api.exec_create(cid, ["bash", "-c", _TIMED, script], workdir="/app")
    out = api.exec_start(ex["Id"], demux=True)[1] or b""
    assert api.exec_inspect(ex["Id"])["ExitCode"] == 0, out
    line = [x for x in out.decode().splitlines() if x.startswith("CRUCIBLE_OWN ")][-1]
    a, b = (int(v) for v in line.split()[1:])
    return (b - a) / 1e3


def bare_episode(
    engine: docker.DockerClient, image: str, solution: bytes, tests: bytes, label: dict[str, str]
) -> Phases:
    """The same steps with the docker SDK directly."""
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
    try:
        t1 = time.perf_counter()
        ctr.put_archive("/", solution)
        solve_ms = _timed_exec(api, ctr.id, "/solution/solve.sh")
        t2 = time.perf_counter()
        ctr.put_archive("/", tests)
        tests_ms = _timed_exec(api, ctr.id, "/tests/test.sh")
        stream, _ = api.get_archive(ctr.id, "/logs/verifier/reward.txt")
        with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as t:
            reward = float(t.extractfile(t.next()).read())
        assert reward == 1.0
    finally:
        ctr.remove(force=True)
    t3 = time.perf_counter()
    return Phases(
        episode_ms=((t1 - t0) + (t3 - t2)) * 1e3,
        actions_ms=(t2 - t1) * 1e3,
        solve_ms=solve_ms,
        tests_ms=tests_ms,
    )


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
    cru: list[Phases] = []
    bare: list[Phases] = []
    with serve('{"terminal": 0}') as srv, srv.client() as c:
        with console.status("warming up (task image, pool)"):
            crucible_episode(c, args.task, solution)  # builds the image, registers the template
            template = next(
                t["name"] for t in c.get("/v1/templates").json() if args.task in t["name"]
            )
            image = next(t["image"] for t in c.get("/v1/templates").json() if t["name"] == template)
            c.put(f"/v1/pools/{template}", json={"target_size": 2}).raise_for_status()
        label = {"crucible.deployment": srv.deployment}
        with console.status("episodes") as st:
            for i in range(args.n):
                deadline = time.monotonic() + 60
                while (
                    c.get(f"/v1/pools/{template}").json()["warm"] < 2
                    and time.monotonic() < deadline
                ):
                    time.sleep(0.05)
                cru.append(crucible_episode(c, args.task, solution))
                bare.append(bare_episode(engine, image, solution, tests, label))
                st.update(f"episodes {i + 1}/{args.n}")

    def series(name: str, what: str, runs: list[Phases]) -> Series:
        return Series(f"{what} overhead ({name})", [getattr(p, f"{what}_overhead") for p in runs])

    rows = [
        (series("Crucible", what, cru), series("bare docker", what, bare))
        for what in ("episode", "action", "total")
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
        f"Crucible episode overhead (lease + set-up + verify) p50 {p50:.0f} ms "
        f"{'meets' if p50 <= TARGET_MS else 'misses'} the {TARGET_MS:.0f} ms target"
    )


if __name__ == "__main__":
    main()
