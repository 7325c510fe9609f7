"""Shared fixtures. Runtime fixtures: a ready ``DockerRuntime`` and a sandbox factory that
labels every container with a per-session deployment and removes them all at the end.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator
from typing import Any

import docker
import docker.errors
import pytest

from service.runtime.base import SandboxSpec

RUNTIME_TEST_IMAGES = (
    "crucible/terminal:latest",
    "crucible/base:latest",
    "crucible/base:bootstrap",
)


def _engine() -> docker.DockerClient:
    """The local engine; a missing engine fails the test (never a silent skip)."""
    try:
        engine = docker.from_env()
        engine.ping()
    except docker.errors.DockerException as exc:
        pytest.fail(f"Docker engine not reachable: {exc} (run `make setup`)")
    return engine


@pytest.fixture(scope="session")
def docker_runtime(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A ``DockerRuntime`` whose supervisor volume is ready (built on first use), with exec
    channels (as the service makes it on the engine's host)."""
    from service.runtime.docker import DockerRuntime

    runtime = DockerRuntime(client=_engine(), channel_dir=tmp_path_factory.mktemp("channels"))
    runtime.ensure_ready()
    return runtime


@pytest.fixture(scope="session")
def sandbox_image() -> str:
    """The richest local sandbox image: terminal when built, else the base."""
    engine = _engine()
    for image in RUNTIME_TEST_IMAGES:
        try:
            engine.images.get(image)
            return image
        except docker.errors.ImageNotFound:
            continue
    pytest.fail(f"none of {RUNTIME_TEST_IMAGES} exists; run `crucible images build`")


@pytest.fixture(scope="session")
def runtime_deployment(docker_runtime: Any) -> Iterator[str]:
    """A unique deployment label; every container carrying it is destroyed at the end."""
    deployment = f"test-{secrets.token_hex(4)}"
    yield deployment
    for info in docker_runtime.list(deployment=deployment):
        docker_runtime.destroy(info.container_id)
    docker_runtime.prune_snapshots(deployment=deployment)  # snapshots the tests made


@pytest.fixture(scope="session")
def make_sandbox(
    docker_runtime: Any, runtime_deployment: str, sandbox_image: str
) -> Callable[..., str]:
    """``make_sandbox(**spec_overrides) -> container_id`` in the session's deployment."""

    def make(**overrides: Any) -> str:
        fields: dict[str, Any] = {
            "sandbox_id": f"sb-{secrets.token_hex(4)}",
            "template": "test",
            "deployment": runtime_deployment,
            "image": sandbox_image,
            "cpus": 1.0,
            "memory_bytes": 512 << 20,
            "pids_limit": 256,
        }
        fields.update(overrides)
        return docker_runtime.create(SandboxSpec(**fields))

    return make
