#!/usr/bin/env python3
"""Validate the bundled terminal tasks end to end with Docker.

For every task folder (Harbor layout) under tasks/terminal/ this script:

1. checks the layout and task.toml (fields, [crucible] domain/expected_tests);
2. builds environment/ with the build arg BASE_IMAGE (default crucible/terminal:latest);
3. oracle run: starts a container (network_mode="none", init=True, the task's cpu/memory
   limits), copies solution/ to /solution, runs `bash /solution/solve.sh` in /app, snapshots
   the container (docker commit) and starts a *fresh* container from the snapshot, so no
   process survives into verification, copies tests/ to /tests and runs
   `bash --noprofile --norc /tests/test.sh` in /app; /logs/verifier/reward.txt must be 1 and
   the junit report must list exactly `expected_tests` tests, none failed or skipped;
4. no-op run: the same without the solution; the reward must be 0.

Everything it creates is named `taskval-<run id>-...` and labelled `crucible.taskval=<run id>`,
and removed at the end (task images unless --keep-images). Prints a table; exits non-zero on
any failure.

Usage: .venv/bin/python scripts/validate_tasks.py [TASK_ID ...] [-j 2] [--base-image IMG]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import secrets
import sys
import tarfile
import time
import tomllib
import xml.etree.ElementTree as ET
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import docker
from docker.errors import APIError, BuildError, ImageNotFound, NotFound

REPO = Path(__file__).resolve().parents[1]
DEFAULT_TASKS = REPO / "tasks" / "terminal"
VERIFIER_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
REQUIRED_FILES = [
    "task.toml",
    "instruction.md",
    "environment/Dockerfile",
    "solution/solve.sh",
    "tests/test.sh",
    "tests/test_outputs.py",
]
TEST_SH = "\n".join(
    [
        "#!/bin/bash",
        "mkdir -p /logs/verifier",
        "python3 -m pytest -p no:cacheprovider -rA --junitxml=/logs/verifier/junit.xml"
        " /tests/test_outputs.py",
        "if [ $? -eq 0 ]; then echo 1 > /logs/verifier/reward.txt;"
        " else echo 0 > /logs/verifier/reward.txt; fi",
        "",
    ]
)


@dataclass
class RunResult:
    reward: str = "-"
    tests: int | None = None
    failed: int | None = None
    skipped: int | None = None
    seconds: float = 0.0
    log: str = ""


@dataclass
class TaskResult:
    task_id: str
    difficulty: str = "?"
    category: str = "?"
    expected_tests: int | None = None
    build_s: float = 0.0
    oracle: RunResult = field(default_factory=RunResult)
    noop: RunResult = field(default_factory=RunResult)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def tar_dir(src: Path, arcname: str) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.add(str(src), arcname=arcname)
    return buf.getvalue()


def read_file(container, path: str) -> bytes | None:
    try:
        stream, _ = container.get_archive(path)
    except NotFound:
        return None
    buf = io.BytesIO(b"".join(stream))
    with tarfile.open(fileobj=buf) as tar:
        for m in tar.getmembers():
            if m.isfile():
                return tar.extractfile(m).read()
    return None


def check_layout(task_dir: Path, res: TaskResult) -> dict | None:
    for rel in REQUIRED_FILES:
        if not (task_dir / rel).is_file():
            res.problems.append(f"missing {rel}")
    if res.problems:
        return None
    cfg = tomllib.loads((task_dir / "task.toml").read_text())
    meta = cfg.get("metadata", {})
    res.difficulty = meta.get("difficulty", "?")
    res.category = meta.get("category", "?")
    if cfg.get("version") != "1.0":
        res.problems.append('task.toml: version must be "1.0"')
    if res.difficulty not in ("easy", "medium", "hard"):
        res.problems.append("task.toml: metadata.difficulty must be easy|medium|hard")
    for key in ("author_name", "category", "tags"):
        if key not in meta:
            res.problems.append(f"task.toml: metadata.{key} missing")
    for sect in ("agent", "verifier"):
        if not isinstance(cfg.get(sect, {}).get("timeout_sec"), (int, float)):
            res.problems.append(f"task.toml: [{sect}] timeout_sec missing")
    env = cfg.get("environment", {})
    for key in (
        "build_timeout_sec",
        "cpus",
        "memory_mb",
        "storage_mb",
        "allow_internet",
        "workdir",
    ):
        if key not in env:
            res.problems.append(f"task.toml: environment.{key} missing")
    if env.get("allow_internet") is not False:
        res.problems.append("task.toml: environment.allow_internet must be false")
    cru = cfg.get("crucible", {})
    if cru.get("domain") != "terminal":
        res.problems.append('task.toml: crucible.domain must be "terminal"')
    if not isinstance(cru.get("expected_tests"), int) or cru["expected_tests"] < 1:
        res.problems.append("task.toml: crucible.expected_tests must be a positive integer")
    else:
        res.expected_tests = cru["expected_tests"]
    first = (task_dir / "environment/Dockerfile").read_text().lstrip().splitlines()[0]
    if first.strip() != "ARG BASE_IMAGE=crucible/terminal:latest":
        res.problems.append("Dockerfile must start with ARG BASE_IMAGE=crucible/terminal:latest")
    if (task_dir / "tests/test.sh").read_text() != TEST_SH:
        res.problems.append("tests/test.sh differs from the standard verifier contract")
    return cfg


class Validator:
    def __init__(self, base_image: str, run_id: str, keep_images: bool, verbose: bool):
        self.client = docker.from_env(timeout=900)
        self.base_image = base_image
        self.run_id = run_id
        self.prefix = f"taskval-{run_id}"
        self.labels = {"crucible.taskval": run_id}
        self.keep_images = keep_images
        self.verbose = verbose

    # -- helpers -----------------------------------------------------------------
    def _start(self, image: str, name: str, cfg: dict):
        env = cfg.get("environment", {})
        return self.client.containers.run(
            image,
            command=["sleep", "infinity"],
            entrypoint=[],
            detach=True,
            name=name,
            network_mode="none",
            init=True,
            labels=self.labels,
            nano_cpus=int(float(env.get("cpus", 1)) * 1e9),
            mem_limit=f"{int(env.get('memory_mb', 1024))}m",
        )

    def _exec(self, container, cmd: str, timeout: float, environment=None) -> tuple[int, str]:
        full = ["timeout", "-k", "5", str(int(timeout)), "bash", "-c", cmd]
        code, out = container.exec_run(full, workdir="/app", environment=environment, demux=False)
        return code, (out or b"").decode("utf-8", "replace")

    def _remove(self, container):
        with contextlib.suppress(NotFound, APIError):
            container.remove(force=True)

    def _remove_image(self, ref: str):
        with contextlib.suppress(ImageNotFound, APIError):
            self.client.images.remove(ref, force=True, noprune=False)

    # -- one run -----------------------------------------------------------------
    def run_once(self, task_dir: Path, image: str, cfg: dict, with_solution: bool) -> RunResult:
        rr = RunResult()
        mode = "oracle" if with_solution else "noop"
        tid = task_dir.name
        t0 = time.monotonic()
        episode = verifier = None
        snapshot = f"{self.prefix}-{tid}-{mode}-snap"
        try:
            episode = self._start(image, f"{self.prefix}-{tid}-{mode}-ep", cfg)
            if with_solution:
                episode.put_archive("/", tar_dir(task_dir / "solution", "solution"))
                code, out = self._exec(
                    episode, "bash /solution/solve.sh", cfg["agent"]["timeout_sec"]
                )
                rr.log += f"--- solve.sh exit {code}\n{out[-4000:]}\n"
            # the verifier gets a fresh container from the episode's final filesystem
            episode.commit(repository=snapshot, tag="latest", conf={"Labels": self.labels})
            self._remove(episode)
            episode = None
            verifier = self._start(f"{snapshot}:latest", f"{self.prefix}-{tid}-{mode}-ver", cfg)
            verifier.put_archive("/", tar_dir(task_dir / "tests", "tests"))
            code, out = self._exec(
                verifier,
                "cd /app && bash --noprofile --norc /tests/test.sh",
                cfg["verifier"]["timeout_sec"] + 10,
                environment={"PATH": VERIFIER_PATH},
            )
            rr.log += f"--- test.sh exit {code}\n{out[-6000:]}\n"
            reward = read_file(verifier, "/logs/verifier/reward.txt")
            rr.reward = reward.decode().strip() if reward is not None else "missing"
            junit = read_file(verifier, "/logs/verifier/junit.xml")
            if junit:
                root = ET.fromstring(junit)
                suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
                rr.tests = sum(int(s.get("tests", 0)) for s in suites)
                rr.failed = sum(int(s.get("failures", 0)) + int(s.get("errors", 0)) for s in suites)
                rr.skipped = sum(int(s.get("skipped", 0)) for s in suites)
        finally:
            for c in (episode, verifier):
                if c is not None:
                    self._remove(c)
            self._remove_image(f"{snapshot}:latest")
        rr.seconds = time.monotonic() - t0
        return rr

    # -- one task ----------------------------------------------------------------
    def validate(self, task_dir: Path) -> TaskResult:
        res = TaskResult(task_dir.name)
        cfg = check_layout(task_dir, res)
        if cfg is None:
            return res
        tag = f"{self.prefix}-{task_dir.name}:latest"
        t0 = time.monotonic()
        try:
            self.client.images.build(
                path=str(task_dir / "environment"),
                tag=tag,
                rm=True,
                forcerm=True,
                pull=False,
                buildargs={"BASE_IMAGE": self.base_image},
                labels=self.labels,
                timeout=int(cfg["environment"].get("build_timeout_sec", 600)),
            )
        except BuildError as e:
            log = "".join(x.get("stream", "") or x.get("error", "") for x in e.build_log)
            res.problems.append(f"build failed: {e.msg}")
            res.oracle.log = log[-4000:]
            return res
        res.build_s = time.monotonic() - t0
        try:
            res.oracle = self.run_once(task_dir, tag, cfg, with_solution=True)
            res.noop = self.run_once(task_dir, tag, cfg, with_solution=False)
        except Exception as e:  # noqa: BLE001 - report any docker failure per task
            res.problems.append(f"docker error: {e!r}")
            return res
        # task images are removed in cleanup(), once no build is running any more: removing an
        # image prunes its untagged parent layers, which concurrent builds may be reusing
        o, n = res.oracle, res.noop
        if o.reward != "1":
            res.problems.append(f"oracle reward {o.reward} (expected 1)")
        if o.tests != res.expected_tests:
            res.problems.append(
                f"oracle junit tests {o.tests} != expected_tests {res.expected_tests}"
            )
        if o.failed or o.skipped:
            res.problems.append(f"oracle: {o.failed} failed/errored, {o.skipped} skipped")
        if n.reward != "0":
            res.problems.append(f"no-op reward {n.reward} (expected 0)")
        return res

    def cleanup(self):
        flt = {"label": f"crucible.taskval={self.run_id}"}
        for c in self.client.containers.list(all=True, filters=flt):
            self._remove(c)
        if not self.keep_images:
            for img in self.client.images.list(filters=flt):
                for t in img.tags or [img.id]:
                    if t == img.id or t.startswith(self.prefix):
                        self._remove_image(t)


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("tasks", nargs="*", help="task ids (default: all under --tasks-dir)")
    ap.add_argument("--tasks-dir", type=Path, default=DEFAULT_TASKS)
    ap.add_argument("--base-image", default="crucible/terminal:latest")
    ap.add_argument("-j", "--jobs", type=int, default=2, help="tasks validated in parallel")
    ap.add_argument("--keep-images", action="store_true", help="keep the built task images")
    ap.add_argument("-v", "--verbose", action="store_true", help="print run logs of failing tasks")
    args = ap.parse_args()

    dirs = sorted(d for d in args.tasks_dir.iterdir() if d.is_dir() and (d / "task.toml").exists())
    if args.tasks:
        wanted = set(args.tasks)
        dirs = [d for d in dirs if d.name in wanted]
        missing = wanted - {d.name for d in dirs}
        if missing:
            print(f"unknown task(s): {', '.join(sorted(missing))}", file=sys.stderr)
            return 2
    if not dirs:
        print("no tasks found", file=sys.stderr)
        return 2

    v = Validator(args.base_image, secrets.token_hex(3), args.keep_images, args.verbose)
    try:
        v.client.images.get(args.base_image)
    except ImageNotFound:
        print(f"base image {args.base_image} not found", file=sys.stderr)
        return 2

    t0 = time.monotonic()
    results: list[TaskResult] = []
    try:
        with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            for res in pool.map(v.validate, dirs):
                results.append(res)
                mark = "ok " if res.ok else "FAIL"
                print(
                    f"[{mark}] {res.task_id}  oracle={res.oracle.reward} noop={res.noop.reward} "
                    f"({res.build_s + res.oracle.seconds + res.noop.seconds:.1f}s)",
                    flush=True,
                )
    finally:
        v.cleanup()
    total = time.monotonic() - t0

    hdr = (
        f"{'task':34} {'diff':6} {'category':18} {'exp':>3} {'oracle':>6} {'tests':>5} {'noop':>4} "
        f"{'noop_fail':>9} {'build':>6} {'orc_s':>6} {'noop_s':>6}  result"
    )
    print()
    print(hdr)
    print("-" * len(hdr))
    for r in results:
        verdict = "PASS" if r.ok else "FAIL: " + "; ".join(r.problems)
        print(
            f"{r.task_id:34} {r.difficulty:6} {r.category[:18]:18} {str(r.expected_tests):>3} "
            f"{r.oracle.reward:>6} {str(r.oracle.tests):>5} {r.noop.reward:>4} "
            f"{f'{r.noop.failed}/{r.noop.tests}':>9} {r.build_s:6.1f} "
            f"{r.oracle.seconds:6.1f} {r.noop.seconds:6.1f}  {verdict}"
        )
    failed = [r for r in results if not r.ok]
    diff = {d: sum(1 for r in results if r.difficulty == d) for d in ("easy", "medium", "hard")}
    print(
        f"\n{len(results) - len(failed)}/{len(results)} tasks passed in {total:.1f}s "
        f"(easy {diff['easy']}, medium {diff['medium']}, hard {diff['hard']})"
    )
    if args.verbose:
        for r in failed:
            print(f"\n===== {r.task_id} =====\n--- oracle\n{r.oracle.log}\n--- noop\n{r.noop.log}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
