"""Task builds through the API and the CLI (issue 11, deliverable 5): build logs readable
per attempt while they run and only by the tenants that asked; cancelling a job stops its
build in the engine; shutdown does not wait for a build; a build that fails the same way
every time fails the rollout's work item with its reason instead of being re-claimed."""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest
from sqlalchemy import select
from typer.testing import CliRunner

from policy_client import calls
from policy_client.client import AsyncClient, Client
from policy_client.policies.scripted import NoopPolicy
from policy_client.rollout import RolloutConfig, RolloutRunner
from service.cli import app as cli_app
from service.db.models import WorkItem
from service.tasks.loader import load_suite
from tests.integration.api.conftest import Stack, start_stack
from tests.integration.api.test_sandboxes_api import PROBLEM

pytestmark = pytest.mark.docker

ALIASES = {"debian:bookworm-slim": "crucible/base:latest"}
POLICY = {"name": "noop", "version": "1"}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    yield from start_stack(
        tmp_path_factory.mktemp("builds"),
        image_aliases=ALIASES,
        build_attempts=2,
        build_retry_delay_s=0.1,
    )


def _suite(stack: Stack, root: Path, name: str, dockerfile: str) -> None:
    """A one-task suite ``name`` (task ``t``) built from ``dockerfile``, added to the server."""
    task = root / name / "t"
    (task / "environment").mkdir(parents=True)
    (task / "tests").mkdir()
    (task / "task.toml").write_text('version = "1.0"\n')
    (task / "instruction.md").write_text("nothing\n")
    (task / "environment" / "Dockerfile").write_text(dockerfile)
    (task / "tests" / "test.sh").write_text("true\n")
    stack.ctx.tasks.add_suite(load_suite(root / name))


def _slow(stack: Stack, root: Path) -> tuple[str, str]:
    """A suite whose build prints a line, then sleeps 120 s; (suite, marker in its RUN)."""
    marker = secrets.token_hex(6)
    name = f"slow{marker}"
    _suite(
        stack,
        root,
        name,
        f"FROM debian:bookworm-slim\nRUN echo started-{marker} && sleep 120 && echo {marker}\n",
    )
    return name, marker


def _sleepers(marker: str) -> list[str]:
    """Running containers whose command carries ``marker`` (one engine call: no race with a
    container that goes away while it is listed)."""
    client = docker.from_env()
    try:
        listed = client.api.containers()
        return [c["Id"] for c in listed if marker in (c.get("Command") or "")]
    finally:
        client.close()


def _wait(predicate, timeout_s: float) -> bool:  # noqa: ANN001
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.2)
    return predicate()


def _build_of(stack: Stack, suite: str) -> dict:
    r = stack.admin.get("/v1/builds")
    assert r.status_code == 200, r.text
    found = [b for b in r.json()["builds"] if b["task"] == f"{suite}/t"]
    assert found, r.json()
    return found[0]


def test_cancelling_a_job_stops_its_build_and_its_log_is_followed_meanwhile(
    stack: Stack, tmp_path: Path
) -> None:
    suite, marker = _slow(stack, tmp_path)
    r = stack.alice.post("/v1/jobs", json={"suite": suite, "policy": POLICY})
    assert r.status_code == 201, r.text
    job = r.json()
    assert _wait(lambda: _sleepers(marker), 60), "the build's RUN step never started"
    build = _build_of(stack, suite)
    assert build["state"] == "running" and build["jobs"] == [job["id"]]

    # the tenant that asked reads it while it runs; another tenant cannot see it
    assert stack.alice.get(f"/v1/builds/{build['id']}").json()["state"] == "running"
    assert [b["id"] for b in stack.alice.get("/v1/builds").json()["builds"]].count(build["id"])
    assert build["id"] not in {b["id"] for b in stack.bob.get("/v1/builds").json()["builds"]}
    hidden = stack.bob.get(f"/v1/builds/{build['id']}/attempts/1/log")
    assert hidden.status_code == 404 and hidden.headers["content-type"] == PROBLEM
    log_url = f"/v1/builds/{build['id']}/attempts/1/log"
    assert _wait(lambda: f"started-{marker}".encode() in stack.alice.get(log_url).content, 30), (
        stack.alice.get(log_url).text
    )
    whole = stack.alice.get(log_url)
    assert whole.headers["x-attempt-outcome"] == "running"
    assert whole.headers["content-type"].startswith("text/plain")
    nxt = int(whole.headers["x-next-offset"])
    assert nxt == len(whole.content)
    tail = stack.alice.get(log_url, params={"offset": 10})
    assert tail.content == whole.content[10 : len(tail.content) + 10]

    t0 = time.monotonic()
    r = stack.alice.post(f"/v1/jobs/{job['id']}/cancel")
    assert r.status_code == 200 and r.json()["state"] == "cancelled", r.text
    assert _wait(lambda: not _sleepers(marker), 15), "the engine kept running the build"
    assert time.monotonic() - t0 < 15
    assert _wait(
        lambda: stack.alice.get(f"/v1/builds/{build['id']}").json()["state"] == "cancelled", 15
    )
    done = stack.alice.get(f"/v1/builds/{build['id']}").json()
    assert done["attempts"][0]["outcome"] == "cancelled" and done["ended_at"]


def test_an_episode_start_build_is_the_tenants_and_bad_requests_are_problems(
    stack: Stack, tmp_path: Path
) -> None:
    suite = f"failing{secrets.token_hex(4)}"
    _suite(stack, tmp_path, suite, "FROM debian:bookworm-slim\nRUN echo no-such-tool && false\n")
    r = stack.alice.post("/v1/episodes", json={"task_id": "t", "suite": suite})
    assert r.status_code == 422 and r.headers["content-type"] == PROBLEM, r.text
    build_id = _build_of(stack, suite)["id"]
    assert build_id in r.json()["detail"]
    mine = stack.alice.get(f"/v1/builds/{build_id}")
    assert mine.status_code == 200 and mine.json()["jobs"] == [], mine.text
    assert mine.json()["attempts"][0]["failure"] == "deterministic"
    log = stack.alice.get(f"/v1/builds/{build_id}/attempts/1/log")
    assert b"no-such-tool" in log.content and log.headers["x-attempt-outcome"] == "failed"
    end = stack.alice.get(
        f"/v1/builds/{build_id}/attempts/1/log", params={"offset": len(log.content) + 99}
    )
    assert end.status_code == 200 and end.content == b""
    for client, path, status, field in (
        (stack.bob, f"/v1/builds/{build_id}", 404, "build_id"),
        (stack.alice, "/v1/builds/bld_nosuch", 404, "build_id"),
        (stack.alice, "/v1/builds/not-a-build", 422, "build_id"),
        (stack.alice, f"/v1/builds/{build_id}/attempts/0/log", 422, "n"),
        (stack.alice, f"/v1/builds/{build_id}/attempts/2/log", 404, "attempt"),
        (stack.alice, f"/v1/builds/{build_id}/attempts/1/log?offset=-1", 422, "offset"),
        (stack.alice, f"/v1/builds/{build_id}/attempts/1/log?offset={1 << 63}", 422, "offset"),
    ):
        r = client.get(path)
        assert r.status_code == status, (path, r.text)
        assert r.headers["content-type"] == PROBLEM and r.json()["field"] == field, r.json()
    assert stack.make_client().get("/v1/builds").status_code == 401


def test_deterministic_build_failure_fails_the_work_item_with_its_reason(
    stack: Stack, tmp_path: Path
) -> None:
    suite = f"broken{secrets.token_hex(4)}"
    _suite(stack, tmp_path, suite, "FROM debian:bookworm-slim\nRUN echo missing-dep && exit 3\n")
    key = stack.alice.headers["authorization"].split(" ", 1)[1]
    with Client(stack.url, key) as client:
        job = client.run(calls.create_job(suite=suite, policy=POLICY, max_attempts=2))

        async def go() -> None:
            async with AsyncClient(stack.url, key) as aclient:
                runner = RolloutRunner(
                    aclient, NoopPolicy(), sync_client=client, config=RolloutConfig(concurrency=1)
                )
                await asyncio.wait_for(runner.run_job(job.id), timeout=120)

        asyncio.run(go())
        final = client.run(calls.get_job(job.id))
    assert final.state == "failed", final
    with stack.ctx.db.read() as s:
        (item,) = s.execute(select(WorkItem).where(WorkItem.job_id == job.id)).scalars().all()
    assert item.state == "failed" and item.attempts == 2 and item.claims == 2, item
    assert "does not build" in (item.last_error or ""), item.last_error
    build = _build_of(stack, suite)
    assert build["state"] == "failed" and len(build["attempts"]) == 1  # built once, not retried
    assert build["attempts"][0]["failure"] == "deterministic"

    # the CLI lists it and prints its log
    env = {"CRUCIBLE_URL": stack.url, "CRUCIBLE_API_KEY": key}
    runner = CliRunner()
    listed = runner.invoke(cli_app, ["builds", "list", "--json"], env=env)
    assert listed.exit_code == 0, listed.output
    assert build["id"] in listed.output
    table = runner.invoke(cli_app, ["builds", "list"], env={**env, "COLUMNS": "200"})
    assert table.exit_code == 0 and build["id"] in table.output, table.output
    log = runner.invoke(cli_app, ["builds", "log", build["id"], "--follow"], env=env)
    assert log.exit_code == 0 and "missing-dep" in log.output, log.output
    shown = runner.invoke(cli_app, ["builds", "show", build["id"]], env=env)
    assert shown.exit_code == 0 and "deterministic" in shown.output, shown.output
    missing = runner.invoke(cli_app, ["builds", "log", "bld_nosuch"], env=env)
    assert missing.exit_code == 1


def test_shutdown_during_a_build_returns_within_seconds(tmp_path: Path) -> None:
    gen = start_stack(tmp_path, image_aliases=ALIASES)
    stack = next(gen)
    try:
        suite, marker = _slow(stack, tmp_path / "suites")
        r = stack.alice.post("/v1/jobs", json={"suite": suite, "policy": POLICY})
        assert r.status_code == 201, r.text
        assert _wait(lambda: _sleepers(marker), 60), "the build's RUN step never started"
    finally:
        t0 = time.monotonic()
        next(gen, None)  # server.should_exit, join, clean-up
        took = time.monotonic() - t0
    assert took < 20, took
    assert _wait(lambda: not _sleepers(marker), 10), "the engine kept running the build"
