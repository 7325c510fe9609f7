"""Task images against the real Docker engine (``TaskRegistry.ensure_image``).

Every image built here lives under a unique ``crucible-test/tasks-<hex>/`` repository prefix,
and only tags under that prefix are removed at the end (the engine is shared).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import docker
import docker.errors
import pytest

from service.config import Settings
from service.images import BuildEvent, build_images
from service.tasks import TaskRegistry, load_suite, template_for

pytestmark = pytest.mark.docker

GOOD = Path(__file__).resolve().parents[1] / "fixtures" / "tasks" / "good"
BASE_IMAGE = "crucible/terminal:latest"
TEST_LABEL = {"crucible.test": "test_task_images"}


@pytest.fixture(scope="module")
def client() -> docker.DockerClient:
    try:
        engine = docker.from_env()
        engine.ping()
    except docker.errors.DockerException as exc:
        pytest.fail(f"Docker engine not reachable: {exc} (run `make setup`)")
    return engine


@pytest.fixture(scope="module")
def settings(tmp_path_factory: pytest.TempPathFactory) -> Settings:
    return Settings(data_dir=tmp_path_factory.mktemp("crucible-data"))


@pytest.fixture(scope="module")
def base_image(client: docker.DockerClient, settings: Settings) -> str:
    """``crucible/terminal:latest``, built (or found cached) first."""
    build_images(["terminal"], settings=settings, client=client)
    return BASE_IMAGE


@pytest.fixture(scope="module")
def prefix(client: docker.DockerClient) -> Iterator[str]:
    prefix = f"crucible-test/tasks-{uuid.uuid4().hex[:12]}"
    yield prefix
    for image in client.images.list():
        for tag in image.tags:
            if tag.startswith(prefix + "/"):
                client.images.remove(tag)


def _registry(prefix: str, settings: Settings, client: docker.DockerClient) -> TaskRegistry:
    return TaskRegistry([load_suite(GOOD)], image_prefix=prefix, settings=settings, client=client)


def _run(client: docker.DockerClient, image: str, script: str, *, workdir: str) -> str:
    out = client.containers.run(
        image,
        ["bash", "-c", script],
        remove=True,
        network_mode="none",
        working_dir=workdir,
        labels=TEST_LABEL,
    )
    return out.decode()


def test_harbor_task_image_builds_once_then_is_cached(
    client: docker.DockerClient, settings: Settings, base_image: str, prefix: str
) -> None:
    registry = _registry(prefix, settings, client)
    task = registry.get("good/harbor-hello")
    events: list[BuildEvent] = []
    tag = registry.ensure_image(task, base_image=base_image, progress=events.append)
    assert tag.startswith(f"{prefix}/good-harbor-hello:")
    assert len(tag.rsplit(":", 1)[1]) == 12
    assert [e.message for e in events if e.kind == "done"] == ["built"]

    events.clear()
    started = time.monotonic()
    assert registry.ensure_image(task, base_image=base_image, progress=events.append) == tag
    assert time.monotonic() - started < 0.1  # the process cache: the engine is not asked
    assert events == []

    fresh = _registry(prefix, settings, client)  # another process: the content hash tag exists
    assert fresh.ensure_image(task, base_image=base_image, progress=events.append) == tag
    assert [e.message for e in events if e.kind == "done"] == ["cached"]

    image = client.images.get(tag)
    assert image.labels["crucible.task"] == "good/harbor-hello"
    template = template_for(task, tag)
    out = _run(client, tag, "pwd; cat hello.txt", workdir=template.workdir)
    assert out.splitlines() == ["/srv/work", "hello from a harbor fixture"]


def test_tb1_task_image_builds(
    client: docker.DockerClient, settings: Settings, base_image: str, prefix: str
) -> None:
    registry = _registry(prefix, settings, client)
    task = registry.get("tb1-hello", suite="good")
    tag = registry.ensure_image(task, base_image=base_image)
    assert tag.startswith(f"{prefix}/good-tb1-hello:")
    assert registry.ensure_image(task, base_image=base_image) == tag
    out = _run(
        client,
        tag,
        "wc -l < data.txt; ls /app; test -e /tests && echo tests-leaked || echo no-tests",
        workdir=task.environment.workdir,
    )
    assert out.split() == ["3", "data.txt", "no-tests"]
