"""Shared fixtures. Runtime fixtures: a ready ``DockerRuntime`` and a sandbox factory that
labels every container with a per-session deployment and removes them all at the end.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import docker
import docker.errors
import pytest

from tests.runtimeutil import deployment_of, sandbox_factory

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
    """The session's deployment label (see ``deployment_of``)."""
    yield from deployment_of(docker_runtime)


@pytest.fixture(scope="session")
def make_sandbox(
    docker_runtime: Any, runtime_deployment: str, sandbox_image: str
) -> Callable[..., str]:
    """``make_sandbox(**spec_overrides) -> container_id`` in the session's deployment."""
    return sandbox_factory(docker_runtime, runtime_deployment, sandbox_image)
