"""Third-party tasks (Harbor layout, Terminal-Bench 2 conventions) build and run unchanged:
fixed ``FROM`` lines through image aliases, verifier venvs pip-installed from PyPI through
the build CA setting, CTRF output, ``conftest.py``, tools installed at verify time through
the verifier network policy; deterministic build failures fail once, network ones are
retried with a log per attempt; cancelled builds stop; suites are re-read while serving."""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from service.images import build_context
from service.tasks import builds
from service.tasks.loader import load_suite
from tests.integration.api.conftest import Stack, start_stack
from tests.integration.api.test_sandboxes_api import run

pytestmark = pytest.mark.docker

TB2 = Path(__file__).resolve().parents[2] / "fixtures" / "tasks" / "tb2"
CA = Path("/etc/ssl/certs/ca-certificates.crt")
TRAJ = {"policy": {"name": "test", "version": "1"}}
TASKS = ("word-freq", "json-merge", "csv-sum")


@pytest.fixture(scope="module")
def tb2(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """A server whose tasks_dir starts with no tb2 suite (it is copied in while serving)."""
    standin = build_context(
        TB2 / "_images" / "python-3.11-slim",
        repository="crucible-test/python-3.11-slim",
        base_image="crucible/base:latest",
    )
    tmp = tmp_path_factory.mktemp("tb2")
    (tmp / "tasks").mkdir()
    yield from start_stack(
        tmp,
        tasks_dir=tmp / "tasks",
        image_aliases={"debian:bookworm-slim": "crucible/base:latest", "python:3.11-slim": standin},
        build_ca_bundle=CA,
        verifier_network="bridge",
        verifier_ca_bundle=CA,
        build_attempts=2,
        build_retry_delay_s=0.1,
        tasks_rescan_interval_s=0.0,
    )


def _episode(stack: Stack, task: str, suite: str = "tb2") -> dict:
    r = stack.alice.post("/v1/episodes", json={"task_id": task, "suite": suite})
    assert r.status_code == 201, r.text
    return r.json()["episodes"][0]


def _verify(stack: Stack, ep: dict) -> dict:
    r = stack.alice.post(f"/v1/episodes/{ep['id']}/verify", json=TRAJ)
    assert r.status_code == 200, r.text
    return r.json()


def test_suite_added_while_serving_is_found(tb2: Stack) -> None:
    assert tb2.alice.get("/v1/tasks/tb2/word-freq").status_code == 404
    shutil.copytree(TB2, tb2.ctx.settings.tasks_dir / "tb2")
    r = tb2.alice.get("/v1/tasks/tb2/word-freq")
    assert r.status_code == 200, r.text
    assert {
        t["id"] for t in tb2.alice.get("/v1/tasks", params={"suite": "tb2"}).json()["tasks"]
    } == set(TASKS)


@pytest.mark.parametrize("task", TASKS)
def test_tb2_oracle_one_noop_zero(tb2: Stack, task: str) -> None:
    if not (tb2.ctx.settings.tasks_dir / "tb2").exists():
        shutil.copytree(TB2, tb2.ctx.settings.tasks_dir / "tb2")
    solution = (TB2 / task / "solution" / "solve.sh").read_bytes()
    rewards = {}
    records: list[dict] = []
    for policy in ("oracle", "noop"):
        ep = _episode(tb2, task)
        if policy == "oracle":
            tb2.alice.put(
                f"/v1/sandboxes/{ep['sandbox_id']}/files",
                params={"path": "/solution/solve.sh"},
                content=solution,
            )
            out = run(tb2.alice, ep["sandbox_id"], "bash /solution/solve.sh", cwd=ep["workdir"])
            assert out["exit_code"] == 0, out
        rec = _verify(tb2, ep)
        assert rec["verifier"]["status"] == "ok", rec["verifier"]
        rewards[policy] = rec["reward"]
        records.append(rec["verifier"])
    assert rewards == {"oracle": 1.0, "noop": 0.0}, records


def test_agent_sandbox_has_no_network_even_when_the_verifier_may(tb2: Stack) -> None:
    if not (tb2.ctx.settings.tasks_dir / "tb2").exists():
        shutil.copytree(TB2, tb2.ctx.settings.tasks_dir / "tb2")
    ep = _episode(tb2, "csv-sum")
    out = run(tb2.alice, ep["sandbox_id"], "cat /sys/class/net/*/operstate; ls /sys/class/net")
    assert out["stdout"].split() == ["unknown", "lo"], out  # loopback only
    _verify(tb2, ep)


def test_offline_verifier_is_an_error_with_its_reason(tb2: Stack) -> None:
    if not (tb2.ctx.settings.tasks_dir / "tb2").exists():
        shutil.copytree(TB2, tb2.ctx.settings.tasks_dir / "tb2")
    tb2.ctx.settings.verifier_network = "none"
    try:
        ep = _episode(tb2, "csv-sum")
        rec = _verify(tb2, ep)
    finally:
        tb2.ctx.settings.verifier_network = "bridge"
    assert rec["verifier"]["status"] == "error", rec["verifier"]
    assert rec["verifier"]["details"]["reason"].startswith("verifier_offline"), rec["verifier"]


def _broken_suite(root: Path, name: str, dockerfile: str) -> None:
    task = root / name / "t"
    (task / "environment").mkdir(parents=True)
    (task / "tests").mkdir()
    (task / "task.toml").write_text('version = "1.0"\n')
    (task / "instruction.md").write_text("nothing\n")
    (task / "environment" / "Dockerfile").write_text(dockerfile)
    (task / "tests" / "test.sh").write_text("true\n")


@pytest.mark.parametrize(
    ("suite", "dockerfile"),
    [
        ("syntax", "FROM debian:bookworm-slim\nRUNN true\n"),
        ("missing", "FROM debian:bookworm-slim\nCOPY not-there.txt /x\n"),
        (
            "certs",
            "FROM debian:bookworm-slim\nRUN echo 'SSL: CERTIFICATE_VERIFY_FAILED' && false\n",
        ),
    ],
)
def test_deterministic_build_failure_fails_once(
    tb2: Stack, tmp_path: Path, suite: str, dockerfile: str
) -> None:
    _broken_suite(tmp_path, suite, dockerfile)
    tb2.ctx.tasks.add_suite(load_suite(tmp_path / suite))
    before = {b.id for b in tb2.ctx.tasks.builds().list()}
    first = tb2.alice.post("/v1/episodes", json={"task_id": "t", "suite": suite})
    assert first.status_code == 422, first.text
    assert first.headers["content-type"].startswith("application/problem+json")
    t0 = time.monotonic()
    again = tb2.alice.post("/v1/episodes", json={"task_id": "t", "suite": suite})
    assert again.status_code == 422 and time.monotonic() - t0 < 5
    new = [b for b in tb2.ctx.tasks.builds().list() if b.id not in before]
    assert len(new) == 1 and len(new[0].attempts) == 1, new  # one build, one attempt
    if suite == "certs":
        assert "CRUCIBLE_BUILD_CA_BUNDLE" in first.json()["detail"]


def test_network_build_failure_is_retried_with_a_log_per_attempt(
    tb2: Stack, tmp_path: Path
) -> None:
    flaky = "FROM debian:bookworm-slim\nRUN echo 'Temporary failure in name resolution' && false\n"
    _broken_suite(tmp_path, "flaky", flaky)
    tb2.ctx.tasks.add_suite(load_suite(tmp_path / "flaky"))
    r = tb2.alice.post("/v1/episodes", json={"task_id": "t", "suite": "flaky"})
    assert r.status_code == 502, r.text
    build = next(b for b in tb2.ctx.tasks.builds().list() if b.task == "flaky/t")
    assert [a.failure for a in build.attempts] == ["network", "network"]
    logs = [Path(a.log).read_text() for a in build.attempts]
    assert all("Temporary failure in name resolution" in log for log in logs)
    assert len({a.log for a in build.attempts}) == 2
    data, _ = builds.read_log(tb2.ctx.tasks.builds().logs_dir, build.id, 1)
    assert b"Temporary failure" in data


def test_cancelling_the_job_stops_its_build(tb2: Stack, tmp_path: Path) -> None:
    _broken_suite(tmp_path, "slow", "FROM debian:bookworm-slim\nRUN sleep 120\n")
    suite = load_suite(tmp_path / "slow")
    tb2.ctx.tasks.add_suite(suite)
    errors: list[BaseException] = []

    def build() -> None:
        with builds.on_behalf_of("job_x"):
            try:
                tb2.ctx.tasks.ensure_image(suite.get("t"), base_image="crucible/terminal:latest")
            except BaseException as e:  # noqa: BLE001 (asserted below)
                errors.append(e)

    thread = threading.Thread(target=build)
    thread.start()
    client = docker.from_env()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not _sleepers(client):
        time.sleep(0.2)
    assert _sleepers(client), "the build's RUN step never started"
    t0 = time.monotonic()
    assert tb2.ctx.tasks.builds().cancel_job("job_x")
    thread.join(timeout=30)
    assert not thread.is_alive() and time.monotonic() - t0 < 30
    assert errors and isinstance(errors[0], builds.BuildCancelled), errors
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and _sleepers(client):
        time.sleep(0.5)
    assert not _sleepers(client), "the engine kept running the cancelled build"


def _sleepers(client: docker.DockerClient) -> list[object]:
    return [
        c
        for c in client.containers.list()
        if "sleep 120" in " ".join(c.attrs["Config"]["Cmd"] or [])
    ]
