"""Content-hash image builds against the real Docker engine (``service.images``).

Context builds use a unique repository under ``crucible-test/`` and remove only the tags
they created. The sandbox images themselves are built (or found cached) once per module.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import docker
import docker.errors
import pytest
from typer.testing import CliRunner

from service.cli import app
from service.config import Settings
from service.errors import NotFound
from service.images import (
    BuildEvent,
    ImageBuildError,
    build_context,
    build_images,
    context_hash,
    discover_images,
)

TEST_LABEL = {"crucible.test": "test_images"}


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
def terminal_tag(client: docker.DockerClient, settings: Settings) -> str:
    results = build_images(["terminal"], settings=settings, client=client)
    return next(r.tag for r in results if r.name == "terminal")


@pytest.fixture
def repository(client: docker.DockerClient) -> Iterator[str]:
    repo = f"crucible-test/images-{uuid.uuid4().hex[:12]}"
    yield repo
    for image in client.images.list(name=repo):
        for tag in image.tags:
            if tag.startswith(repo + ":"):
                client.images.remove(tag)


def _context(root: Path, hello: str) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "Dockerfile").write_text(
        "ARG BASE_IMAGE=crucible/terminal:latest\nFROM ${BASE_IMAGE}\nCOPY hello.txt /hello.txt\n"
    )
    (root / "hello.txt").write_text(hello)
    return root


def _run(client: docker.DockerClient, image: str, script: str) -> str:
    out = client.containers.run(
        image,
        ["bash", "-c", script],
        remove=True,
        network_mode="none",
        init=True,
        labels=TEST_LABEL,
    )
    return out.decode()


# --------------------------------------------------------------------------- sandbox images


@pytest.mark.docker
def test_building_twice_does_not_rebuild(client: docker.DockerClient, settings: Settings) -> None:
    first = build_images(["terminal"], settings=settings, client=client)
    started = time.monotonic()
    events: list[BuildEvent] = []
    second = build_images(["terminal"], settings=settings, client=client, progress=events.append)
    elapsed_s = time.monotonic() - started

    assert [r.name for r in second] == ["base", "terminal"]
    assert [r.tag for r in second] == [r.tag for r in first]
    assert all(r.cached for r in second)
    assert [e.message for e in events if e.kind == "done"] == [r.action for r in second]
    assert not [e for e in events if e.kind == "start"]
    assert elapsed_s < 5
    terminal = second[-1]
    assert terminal.tag.startswith("crucible/terminal:") and len(terminal.tag.split(":")[1]) == 12
    assert client.images.get("crucible/terminal:latest").id == terminal.image_id
    labels = client.images.get(terminal.tag).labels
    assert labels["crucible.image"] == "terminal"
    assert labels["crucible.content_hash"] == terminal.tag.split(":")[1]


@pytest.mark.docker
def test_base_image_override_uses_that_image(
    client: docker.DockerClient, settings: Settings, terminal_tag: str
) -> None:
    base = client.images.get(terminal_tag).labels["crucible.base_image"]
    results = build_images(["terminal"], settings=settings, client=client, base_image=base)
    assert results[0].action == "external" and results[0].tag == base
    assert results[1].tag == terminal_tag and results[1].cached  # same base id: same hash


@pytest.mark.docker
def test_terminal_image_has_the_toolchain(client: docker.DockerClient, terminal_tag: str) -> None:
    out = _run(
        client,
        terminal_tag,
        "set -e; pwd; bash --version | head -1; python3 --version; python3 -m pytest --version;"
        " git --version; ps --version; jq --version; make --version | head -1; sqlite3 --version;"
        " command -v curl vi tree zip unzip bc file patch killall ip",
    )
    assert out.splitlines()[0] == "/workspace"
    for expected in ("GNU bash", "Python 3.11", "pytest", "git version", "procps-ng", "jq-"):
        assert expected in out, out


@pytest.mark.docker
def test_unknown_image_name(settings: Settings, client: docker.DockerClient) -> None:
    with pytest.raises(NotFound, match="unknown image 'nope'"):
        build_images(["nope"], settings=settings, client=client)


@pytest.mark.docker
def test_cli_build_and_list_json(terminal_tag: str) -> None:
    runner = CliRunner()
    built = runner.invoke(app, ["images", "build", "terminal", "--json"])
    assert built.exit_code == 0, built.output
    listed = runner.invoke(app, ["images", "list", "--json"])
    assert listed.exit_code == 0, listed.output
    rows = {row["name"]: row for row in json.loads(listed.stdout)}
    assert rows["terminal"]["status"] == "current"
    assert terminal_tag in rows["terminal"]["tags"]


# --------------------------------------------------------------------------- task contexts


@pytest.mark.docker
def test_context_build_is_cached_the_second_time(
    client: docker.DockerClient,
    settings: Settings,
    terminal_tag: str,
    repository: str,
    tmp_path: Path,
) -> None:
    context = _context(tmp_path / "env", "one\n")
    events: list[BuildEvent] = []
    tag = build_context(
        context,
        repository=repository,
        base_image=terminal_tag,
        settings=settings,
        client=client,
        progress=events.append,
    )
    assert [e.message for e in events if e.kind == "done"] == ["built"]
    assert any(e.kind == "log" and e.message.startswith("Step ") for e in events)

    events.clear()
    started = time.monotonic()
    again = build_context(
        context,
        repository=repository,
        base_image=terminal_tag,
        settings=settings,
        client=client,
        progress=events.append,
    )
    assert again == tag
    assert time.monotonic() - started < 5
    assert [e.message for e in events if e.kind == "done"] == ["cached"]
    result = events[-1].result
    assert result is not None and result.cached and result.log_path is None


@pytest.mark.docker
def test_changing_a_file_changes_the_tag(
    client: docker.DockerClient,
    settings: Settings,
    terminal_tag: str,
    repository: str,
    tmp_path: Path,
) -> None:
    context = _context(tmp_path / "env", "one\n")
    kwargs = {"repository": repository, "base_image": terminal_tag, "settings": settings}
    first = build_context(context, client=client, **kwargs)
    (context / "hello.txt").write_text("two\n")
    second = build_context(context, client=client, **kwargs)

    assert first != second
    assert first.split(":")[0] == second.split(":")[0] == repository
    assert _run(client, first, "cat /hello.txt") == "one\n"
    assert _run(client, second, "cat /hello.txt") == "two\n"
    (context / "hello.txt").write_text("one\n")
    assert build_context(context, client=client, **kwargs) == first


@pytest.mark.docker
def test_failed_build_names_the_step_and_log(
    client: docker.DockerClient,
    settings: Settings,
    terminal_tag: str,
    repository: str,
    tmp_path: Path,
) -> None:
    context = tmp_path / "env"
    context.mkdir()
    (context / "Dockerfile").write_text(
        "ARG BASE_IMAGE\nFROM ${BASE_IMAGE}\nRUN echo about to fail && exit 3\n"
    )
    with pytest.raises(ImageBuildError) as info:
        build_context(
            context,
            repository=repository,
            base_image=terminal_tag,
            settings=settings,
            client=client,
        )
    assert "returned a non-zero code: 3" in info.value.detail
    assert "about to fail" in info.value.detail
    assert info.value.log_path is not None and info.value.log_path.is_file()


# --------------------------------------------------------------------------- no engine needed


def test_context_hash_covers_bytes_mode_base_and_args(tmp_path: Path) -> None:
    context = _context(tmp_path / "env", "one\n")
    base = context_hash(context, base_image_id="sha256:aa")
    assert len(base) == 12
    assert context_hash(context, base_image_id="sha256:aa") == base
    assert context_hash(context, base_image_id="sha256:bb") != base
    assert context_hash(context, base_image_id="sha256:aa", build_args={"X": "1"}) != base
    (context / "hello.txt").chmod(0o755)
    assert context_hash(context, base_image_id="sha256:aa") != base
    (context / "hello.txt").chmod(0o644)
    (context / "sub").mkdir()
    assert context_hash(context, base_image_id="sha256:aa") != base


def test_every_folder_with_a_dockerfile_is_an_image(tmp_path: Path) -> None:
    for name, dockerfile in {
        "cad": "ARG BASE_IMAGE=crucible/terminal:latest\nFROM ${BASE_IMAGE}\n",
        "terminal": "ARG BASE_IMAGE=crucible/base:latest\nFROM ${BASE_IMAGE}\n",
        "plain": "FROM ${BASE_IMAGE}\n",
        "slim": "ARG BASE_IMAGE=debian:bookworm-slim\nFROM ${BASE_IMAGE}\n",
    }.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "Dockerfile").write_text(dockerfile)
    (tmp_path / "notes").mkdir()  # no Dockerfile: not an image

    defs = {d.name: d for d in discover_images(tmp_path)}
    order = [d.name for d in discover_images(tmp_path)]
    assert set(order) == {"base", "cad", "terminal", "plain", "slim"}
    assert order[0] == "base" and order.index("terminal") < order.index("cad")
    assert defs["cad"].depends_on == "terminal"
    assert defs["plain"].depends_on == "base" and defs["plain"].base_ref == "crucible/base:latest"
    assert defs["slim"].depends_on is None and defs["slim"].base_ref == "debian:bookworm-slim"


def test_dependency_cycle_is_refused(tmp_path: Path) -> None:
    for name, other in (("a", "b"), ("b", "a")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "Dockerfile").write_text(
            f"ARG BASE_IMAGE=crucible/{other}:latest\nFROM ${{BASE_IMAGE}}\n"
        )
    with pytest.raises(ImageBuildError, match="cycle"):
        discover_images(tmp_path)
