"""The local stack (issue 14): ``scripts/stack.sh up`` (what ``make stack`` runs) brings up
docker-compose.yml from the working tree under a project of its own; a rollout job (oracle,
3 terminal tasks, group size 2) starts on replica 1 through the ``worker`` profile; replica 1
and its worker are killed mid-job (``docker kill``); a second worker on replica 2 finishes
the job. Checked: the job ends ``done`` with exactly one record per (task, sample), all 1.0;
the stack's Prometheus reports both replicas ``up`` (and replica 1 down after the kill) and
holds the verifications of the job; the replicas log JSON lines with request ids;
``scripts/stack.sh down`` leaves no container, volume, network, sandbox or data dir.

Marked ``stack`` (a few minutes: image builds are cached, claims of the killed worker expire
after their 60 s lease).
"""

from __future__ import annotations

import json
import os
import secrets
import shlex
import shutil
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from policy_client.client import Client
from tests.integration.api.conftest import _free_port

pytestmark = [pytest.mark.docker, pytest.mark.stack]

ROOT = Path(__file__).resolve().parents[3]
TASKS = ["access-log-top-ips", "bank-ledger-reconcile", "cron-next-fire-times"]
GROUP = 2


def _run(cmd: list[str], env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(
        cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False
    )


def _docker(*args: str) -> list[str]:
    out = subprocess.run(["docker", *args], capture_output=True, text=True, check=True).stdout
    return [line for line in out.split() if line]


def _compose_bin() -> list[str]:
    """The compose ``scripts/stack.sh up`` used (and may have installed): docker-compose
    1.29 when on PATH, else the compose v2 plugin (``docker compose``)."""
    return ["docker-compose"] if shutil.which("docker-compose") else ["docker", "compose"]


def _records(url: str, key: str, job_id: str) -> list[dict]:
    r = httpx.get(
        f"{url}/v1/rewards",
        params={"job_id": job_id, "limit": 1000},
        headers={"Authorization": f"Bearer {key}"},
        timeout=10,
    )
    r.raise_for_status()
    return r.json()["records"]


def _prometheus_up(url: str) -> dict[str, str]:
    """``up`` of every target of the ``crucible`` job: instance -> "1" or "0"."""
    r = httpx.get(f"{url}/api/v1/query", params={"query": 'up{job="crucible"}'}, timeout=10)
    r.raise_for_status()
    return {s["metric"]["instance"]: s["value"][1] for s in r.json()["data"]["result"]}


def _wait_prometheus_up(url: str, want: dict[str, str], timeout_s: float = 60) -> None:
    deadline, got = time.monotonic() + timeout_s, {}
    while time.monotonic() < deadline:
        got = _prometheus_up(url)
        if got == want:
            return
        time.sleep(1)
    raise AssertionError(f"Prometheus up: {got}, wanted {want}")


def test_stack_runs_a_job_through_a_replica_kill(tmp_path: Path) -> None:
    project = f"crucible-stack-test-{secrets.token_hex(3)}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("CRUCIBLE_")}
    env.update(
        CRUCIBLE_STACK_PROJECT=project,
        CRUCIBLE_STACK_DATA_DIR=str(tmp_path / "stack"),
        CRUCIBLE_STACK_PORT_1=str(_free_port()),
        CRUCIBLE_STACK_PORT_2=str(_free_port()),
        CRUCIBLE_STACK_PROMETHEUS_PORT=str(_free_port()),
    )
    exports = _run([str(ROOT / "scripts/stack.sh"), "env"], env, 30).stdout
    for line in exports.splitlines():
        name, _, value = line.removeprefix("export ").partition("=")
        env[name] = shlex.split(value)[0] if value else ""
    url1 = f"http://127.0.0.1:{env['CRUCIBLE_STACK_PORT_1']}"
    url2 = f"http://127.0.0.1:{env['CRUCIBLE_STACK_PORT_2']}"
    prom = f"http://127.0.0.1:{env['CRUCIBLE_STACK_PROMETHEUS_PORT']}"
    t0 = time.monotonic()
    timings: dict[str, float] = {}
    try:
        up = _run([str(ROOT / "scripts/stack.sh"), "up"], env, 900)
        assert up.returncode == 0, up.stderr[-3000:]
        timings["up_s"] = time.monotonic() - t0
        compose = [*_compose_bin(), "-p", project, "-f", str(ROOT / "docker-compose.yml")]
        key = next(ln.split()[-1] for ln in up.stdout.splitlines() if ln.startswith("admin key"))
        for url in (url1, url2):
            ready = httpx.get(f"{url}/readyz", timeout=10).json()
            assert ready["status"] == "ok" and ready["coordination"]["backend"] == "redis", ready
            assert httpx.get(f"{url}/dashboard/login", timeout=10).status_code == 200
        _wait_prometheus_up(prom, {"replica-1:8000": "1", "replica-2:8000": "1"})
        timings["prometheus_up_s"] = time.monotonic() - t0
        httpx.get(f"{url2}/healthz", headers={"X-Request-ID": "stack-probe-1"}, timeout=10)
        logs = _run([*compose, "logs", "--no-color", "replica-2"], env, 60).stdout
        lines = [ln.partition("| ")[2] for ln in logs.splitlines() if "stack-probe-1" in ln]
        assert lines, logs[-2000:]
        probe = json.loads(lines[0])
        assert probe["request_id"] == "stack-probe-1" and probe["logger"] == "crucible.access"

        with Client(url1, key) as client:
            job = client.create_job(
                suite="terminal",
                policy={"name": "oracle", "version": "1"},
                task_ids=TASKS,
                group_size=GROUP,
            )
        args = f"--suite /app/tasks/terminal --job {job.id} --concurrency 2"
        wenv = dict(env, CRUCIBLE_STACK_API_KEY=key, CRUCIBLE_STACK_ROLLOUT_ARGS=args)
        first = _run(
            [*compose, "--profile", "worker", "run", "-d", "--no-deps", "worker"],
            dict(wenv, CRUCIBLE_STACK_WORKER_URL="http://replica-1:8000"),
            120,
        )
        assert first.returncode == 0, first.stderr[-2000:]
        worker_1 = first.stdout.split()[-1]
        deadline = time.monotonic() + 300
        while len(_records(url2, key, job.id)) < 2:
            assert time.monotonic() < deadline, _run(["docker", "logs", worker_1], env, 30).stderr
            time.sleep(1)
        at_kill = len(_records(url2, key, job.id))
        assert at_kill < len(TASKS) * GROUP, "the job ended before the kill"
        (replica_1,) = _docker(
            "ps", "-q", "--filter", f"label=com.docker.compose.project={project}",
            "--filter", "label=com.docker.compose.service=replica-1",
        )  # fmt: skip
        _docker("kill", replica_1, worker_1)
        timings["kill_at_s"] = time.monotonic() - t0

        second = _run(
            [*compose, "--profile", "worker", "run", "--rm", "--no-deps", "worker"],
            dict(wenv, CRUCIBLE_STACK_WORKER_URL="http://replica-2:8000"),
            420,
        )
        assert second.returncode == 0, second.stderr[-3000:]
        summary = json.loads(second.stdout[second.stdout.index("{") :])
        assert summary["state"] == "done", summary
        timings["job_done_s"] = time.monotonic() - t0
        records = _records(url2, key, job.id)
        samples = sorted((r["task_id"], r["sample_idx"]) for r in records)
        expected = sorted((t, i) for t in TASKS for i in range(GROUP))
        assert samples == expected, (at_kill, samples)  # none lost, none twice
        assert {r["reward"] for r in records} == {1.0}, records
        _wait_prometheus_up(prom, {"replica-1:8000": "0", "replica-2:8000": "1"})
        # Replica 2 verified the items it took over; its next scrape (every 5 s) shows them.
        q = 'crucible_verifications_total{domain="terminal",outcome="pass"}'
        deadline, verified = time.monotonic() + 30, {}
        while verified.get("replica-2:8000", 0) < 1 and time.monotonic() < deadline:
            r = httpx.get(f"{prom}/api/v1/query", params={"query": q}, timeout=10).json()
            verified = {s["metric"]["instance"]: float(s["value"][1]) for s in r["data"]["result"]}
            time.sleep(1)
        assert verified.get("replica-2:8000", 0) >= 1, r
    finally:
        down = _run([str(ROOT / "scripts/stack.sh"), "down"], env, 300)
        timings["total_s"] = time.monotonic() - t0
        print("stack timings:", {k: round(v, 1) for k, v in timings.items()})
    assert down.returncode == 0, down.stderr[-2000:]
    project_label = f"label=com.docker.compose.project={project}"
    assert _docker("ps", "-aq", "--filter", project_label) == []
    assert _docker("ps", "-aq", "--filter", f"label=crucible.deployment={project}") == []
    assert _docker("volume", "ls", "-q", "--filter", project_label) == []
    assert _docker("network", "ls", "-q", "--filter", project_label) == []
    assert _docker("images", "-q", f"crucible-snapshots/{project}") == []
    assert not (tmp_path / "stack").exists()
