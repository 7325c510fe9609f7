"""Sandbox images: content-hash builds of ``sandbox_images/*`` and of task environments.

An image's tag is a hash of what it is made from, so a build runs only when an input changed::

    tag = sha256(context files (path, mode, bytes; sorted) + base image id + build args)[:12]

Built images are tagged ``<prefix>/<name>:<hash>`` and ``<prefix>/<name>:latest``; when the
hash tag is already present nothing is built (the result says ``cached``).

Which images exist is data: every folder of ``sandbox_images/`` with a ``Dockerfile`` is an
image named after the folder, unless its Dockerfile has the line ``# crucible-images: skip``
(the local stack's PostgreSQL and Redis images live there too, built by ``scripts/stack.sh``).
Its base is the default of ``ARG BASE_IMAGE=...`` in that Dockerfile (``<prefix>/base:latest``
when the Dockerfile has none); a base named
``<prefix>/<other>:latest`` where ``<other>`` is also a folder makes ``<other>`` a dependency,
built first. ``base`` itself is special: with ``base_image`` (``--base-image``,
``CRUCIBLE_BASE_IMAGE``) that image is used as base and nothing is built; without it a
``debootstrap --variant=minbase bookworm`` root filesystem is imported as ``<prefix>/base``.

Task environments (a task's ``environment/`` folder) build on top of a sandbox image with
the same rule through ``build_context``.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import json
import os
import re
import shutil
import socket
import stat
import subprocess
import tarfile
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Literal

import docker
import docker.errors
import docker.utils.build
import requests
import urllib3
from docker.models.images import Image
from rich.console import Console
from rich.markup import escape

from service.config import Settings, get_settings
from service.errors import InvalidRequest, NotFound, SandboxError

BASE = "base"
HASH_LEN = 12

# The debootstrap recipe of the base image. Any change here changes the base image's tag.
DEBIAN_SUITE = "bookworm"
DEBIAN_MIRROR = "http://deb.debian.org/debian"
DEBOOTSTRAP_VARIANT = "minbase"
BASE_SOURCES_LIST = (
    f"deb {DEBIAN_MIRROR} {DEBIAN_SUITE} main\n"
    f"deb {DEBIAN_MIRROR} {DEBIAN_SUITE}-updates main\n"
    f"deb http://deb.debian.org/debian-security {DEBIAN_SUITE}-security main\n"
)
BASE_APT_CONF = (
    'APT::Install-Recommends "false";\nAPT::Install-Suggests "false";\nAcquire::Retries "3";\n'
)
BASE_CHANGES = (
    "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "ENV LANG=C.UTF-8",
    'CMD ["bash"]',
)
BASE_RECIPE_VERSION = 1  # bump to force a new base image with the same recipe

# Socket read timeout of the engine client used for builds: a build step may be silent long.
BUILD_CLIENT_TIMEOUT_S = 1800

LABEL_IMAGE = "crucible.image"
LABEL_CONTENT_HASH = "crucible.content_hash"
LABEL_BASE = "crucible.base_image"

REWRITTEN_DOCKERFILE = ".crucible-build/Dockerfile"  # service.tasks.buildprep writes it

_ARG_BASE_RE = re.compile(r"^\s*ARG\s+BASE_IMAGE\s*=\s*(\S+)\s*$", re.IGNORECASE | re.MULTILINE)


class ImageBuildError(SandboxError):
    """An image could not be built (engine error, failed step, missing base or tool).

    ``log_path`` names the full build log when there is one.
    """

    title = "Image build failed"

    def __init__(self, detail: str, *, log_path: Path | None = None) -> None:
        super().__init__(detail)
        self.log_path = log_path


@dataclass(frozen=True, kw_only=True)
class ImageDef:
    """One sandbox image: ``context_dir`` is None for the debootstrap base.

    ``base_ref`` is the image it builds on (the Dockerfile's ``ARG BASE_IMAGE`` default);
    ``depends_on`` names the sandbox image that ref points to, if it is one.
    """

    name: str
    context_dir: Path | None
    base_ref: str | None = None
    depends_on: str | None = None


@dataclass(frozen=True, kw_only=True)
class BuildResult:
    """What one build call produced.

    ``action``: ``built`` (ran now), ``cached`` (the hash tag existed), ``external`` (an
    image used as is, e.g. ``--base-image debian:bookworm-slim``). ``tag`` is the immutable
    content-hash tag (or the external reference); ``duration_s`` in seconds.
    """

    name: str
    tag: str
    image_id: str
    action: Literal["built", "cached", "external"]
    duration_s: float
    log_path: Path | None = None
    base_image: str | None = None

    @property
    def cached(self) -> bool:
        """True when nothing had to be built."""
        return self.action != "built"


@dataclass(frozen=True, kw_only=True)
class BuildEvent:
    """Progress of a build: ``start``, one ``log`` per build-log line, then ``done``."""

    image: str
    kind: Literal["start", "log", "done"]
    message: str = ""
    result: BuildResult | None = None


ProgressFn = Callable[[BuildEvent], None]


@dataclass(frozen=True, kw_only=True)
class ImageStatus:
    """An image as ``crucible images list`` shows it.

    ``status``: ``current`` (``latest`` is the image the build contexts hash to), ``stale``
    (present, but a build would produce another tag), ``missing`` (no ``latest`` tag).
    ``size_bytes`` and ``created`` describe ``latest``.
    """

    name: str
    repository: str
    expected_tag: str | None
    latest_id: str | None
    status: Literal["current", "stale", "missing"]
    size_bytes: int | None = None
    created: str | None = None
    tags: tuple[str, ...] = field(default_factory=tuple)


# --------------------------------------------------------------------------- discovery


def discover_images(images_dir: Path, *, image_prefix: str = "crucible") -> list[ImageDef]:
    """All sandbox images in build order: ``base`` first, then every folder with a Dockerfile.

    Raises ``ImageBuildError`` on a dependency cycle.
    """
    folders = sorted(
        p
        for p in images_dir.iterdir()
        if p.is_dir()
        and (p / "Dockerfile").is_file()
        and not _SKIP_RE.search((p / "Dockerfile").read_text(encoding="utf-8"))
    )
    names = {p.name for p in folders} | {BASE}
    defs: dict[str, ImageDef] = {BASE: ImageDef(name=BASE, context_dir=None)}
    for folder in folders:
        if folder.name == BASE:
            continue  # the base is made by debootstrap, never from a Dockerfile
        base_ref = _dockerfile_base(folder / "Dockerfile") or f"{image_prefix}/{BASE}:latest"
        match = re.fullmatch(rf"{re.escape(image_prefix)}/([a-z0-9_.-]+):latest", base_ref)
        depends_on = match.group(1) if match and match.group(1) in names else None
        defs[folder.name] = ImageDef(
            name=folder.name, context_dir=folder, base_ref=base_ref, depends_on=depends_on
        )
    return _build_order(defs)


_SKIP_RE = re.compile(r"^# crucible-images: skip$", re.MULTILINE)


def _dockerfile_base(dockerfile: Path) -> str | None:
    match = _ARG_BASE_RE.search(dockerfile.read_text(encoding="utf-8"))
    return match.group(1).strip("\"'") if match else None


def _build_order(defs: Mapping[str, ImageDef]) -> list[ImageDef]:
    order: list[ImageDef] = []
    state: dict[str, str] = {}

    def visit(name: str, chain: tuple[str, ...]) -> None:
        if state.get(name) == "done":
            return
        if state.get(name) == "visiting":
            raise ImageBuildError(f"image dependency cycle: {' -> '.join((*chain, name))}")
        state[name] = "visiting"
        dep = defs[name].depends_on
        if dep:
            visit(dep, (*chain, name))
        state[name] = "done"
        order.append(defs[name])

    for name in [BASE, *sorted(n for n in defs if n != BASE)]:
        visit(name, ())
    return order


def _closure(defs: Sequence[ImageDef], names: Sequence[str]) -> set[str]:
    by_name = {d.name: d for d in defs}
    unknown = [n for n in names if n not in by_name]
    if unknown:
        raise NotFound(
            f"unknown image {', '.join(map(repr, unknown))}; known: {', '.join(by_name)}",
            field="names",
        )
    wanted: set[str] = set()
    for name in names:
        current: str | None = name
        while current and current not in wanted:
            wanted.add(current)
            current = by_name[current].depends_on
    return wanted


# --------------------------------------------------------------------------- hashing


def context_hash(
    context_dir: Path,
    *,
    base_image_id: str,
    build_args: Mapping[str, str] | None = None,
    dockerfile: str = "Dockerfile",
    labels: Mapping[str, str] | None = None,
) -> str:
    """The content hash (12 hex digits) of a build context on a given base image id.

    Covers every file, directory and symlink under ``context_dir`` (relative path, exec bit,
    bytes), ``base_image_id``, ``build_args``, the Dockerfile name and extra ``labels``.
    """
    digest = hashlib.sha256(b"crucible-context-v1\0")
    for path in _walk(context_dir):
        rel = path.relative_to(context_dir).as_posix()
        st = path.lstat()
        if stat.S_ISLNK(st.st_mode):
            digest.update(b"L\0" + rel.encode() + b"\0" + os.readlink(path).encode() + b"\0")
        elif stat.S_ISDIR(st.st_mode):
            digest.update(b"D\0" + rel.encode() + b"\0")
        else:
            executable = b"x" if st.st_mode & 0o111 else b"-"
            digest.update(b"F\0" + rel.encode() + b"\0" + executable + b"%d\0" % st.st_size)
            with path.open("rb") as fh:
                while chunk := fh.read(1 << 20):
                    digest.update(chunk)
    meta = {
        "base_image_id": base_image_id,
        "build_args": dict(sorted((build_args or {}).items())),
        "dockerfile": dockerfile,
        "labels": dict(sorted((labels or {}).items())),
    }
    digest.update(json.dumps(meta, sort_keys=True).encode())
    return digest.hexdigest()[:HASH_LEN]


def _walk(root: Path) -> Iterator[Path]:
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        here = Path(dirpath)
        for name in sorted([*dirnames, *filenames]):
            yield here / name


def base_recipe_hash() -> str:
    """The content hash (12 hex digits) of the debootstrap base recipe."""
    recipe = {
        "version": BASE_RECIPE_VERSION,
        "suite": DEBIAN_SUITE,
        "variant": DEBOOTSTRAP_VARIANT,
        "mirror": DEBIAN_MIRROR,
        "sources": BASE_SOURCES_LIST,
        "apt_conf": BASE_APT_CONF,
        "changes": BASE_CHANGES,
    }
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:HASH_LEN]


# --------------------------------------------------------------------------- building


def build_images(
    names: Sequence[str] | None = None,
    *,
    settings: Settings | None = None,
    base_image: str | None = None,
    force: bool = False,
    progress: ProgressFn | None = None,
    client: docker.DockerClient | None = None,
) -> list[BuildResult]:
    """Build sandbox images (and the images they depend on) where their content hash is new.

    ``names``: folder names under ``settings.images_dir`` (plus ``base``); None means all.
    ``base_image``: an existing image to build on instead of the debootstrap base (default
    ``settings.base_image``); it must be present locally or pullable. ``force``: rebuild the
    named images without the layer cache even when their hash tag exists (dependencies are
    still only built when missing). ``progress`` receives a ``BuildEvent`` per step and log
    line. Returns one result per image in build order.

    Raises ``NotFound`` for an unknown name, ``SandboxError`` when the engine is unreachable,
    ``ImageBuildError`` when a build fails (its message ends with the log tail and path).
    """
    settings = settings or get_settings()
    base_image = base_image or settings.base_image
    client = client or _client(settings)
    emit = progress or (lambda _event: None)
    defs = discover_images(settings.images_dir, image_prefix=settings.image_prefix)
    wanted = _closure(defs, names) if names else {d.name for d in defs}
    forced = set(names) if names else wanted
    resolved: dict[str, BuildResult] = {}
    for image in defs:
        if image.name not in wanted:
            continue
        if image.context_dir is None:
            result = _ensure_base(
                settings=settings,
                client=client,
                base_image=base_image,
                force=force and image.name in forced,
                emit=emit,
            )
        else:
            if image.depends_on is not None:  # built or resolved above: build order
                dep = resolved[image.depends_on]
                base_ref, base_id = dep.tag, dep.image_id
            else:
                base_ref = image.base_ref or ""
                base_id = _resolve_external(client, base_ref).id
            repository = f"{settings.image_prefix}/{image.name}"
            result = _build_docker_context(
                image.context_dir,
                name=image.name,
                repository=repository,
                base_ref=base_ref,
                base_id=base_id,
                build_args={},
                labels={LABEL_IMAGE: image.name},
                dockerfile="Dockerfile",
                force=force and image.name in forced,
                tag_latest=True,
                settings=settings,
                client=client,
                emit=emit,
            )
        resolved[image.name] = result
    return list(resolved.values())


def build_context(
    context_dir: Path,
    *,
    repository: str,
    base_image: str,
    build_args: Mapping[str, str] | None = None,
    dockerfile: str = "Dockerfile",
    labels: Mapping[str, str] | None = None,
    force: bool = False,
    tag_latest: bool = False,
    settings: Settings | None = None,
    progress: ProgressFn | None = None,
    client: docker.DockerClient | None = None,
    dockerfile_text: str | None = None,
    extra_files: Mapping[str, str] | None = None,
    log_path: Path | None = None,
    cancel: threading.Event | None = None,
    unhashed_build_args: Mapping[str, str] | None = None,
) -> str:
    """Build an arbitrary context (e.g. a task's ``environment/``) on ``base_image``.

    ``dockerfile_text`` replaces the context's Dockerfile and ``extra_files`` (name -> text)
    are added to the context sent to the engine (``service.tasks.buildprep``); the files on
    disk are never changed, and the content hash covers only the context as it is on disk
    plus ``labels`` (which callers use to name what they added); ``unhashed_build_args``
    (proxies, CA paths) reach the build without changing its tag. ``log_path``: where this
    build's log goes (default ``<data_dir>/logs/images/<repo>-<hash>.log``). Setting
    ``cancel`` closes the build's connection, which makes the engine stop the build;
    ``BuildCancelled`` is raised.

    The Dockerfile receives the base as ``ARG BASE_IMAGE`` (the base's image id, so a
    concurrent re-tag cannot change what it builds on). The result is tagged
    ``<repository>:<hash>`` (content-hash rule as in ``context_hash``) and, with
    ``tag_latest``, ``<repository>:latest``; nothing is built when the hash tag exists unless
    ``force``. Returns the hash tag.

    Raises ``InvalidRequest`` when the Dockerfile is missing, ``ImageBuildError`` when
    ``base_image`` is absent (and cannot be pulled) or a step fails, ``SandboxError`` when the
    engine is unreachable.
    """
    settings = settings or get_settings()
    client = client or _client(settings)
    context_dir = Path(context_dir).resolve()
    base = _resolve_external(client, base_image)
    result = _build_docker_context(
        context_dir,
        name=repository.rsplit("/", 1)[-1],
        repository=repository,
        base_ref=base_image,
        base_id=base.id,
        build_args=dict(build_args or {}),
        labels=dict(labels or {}),
        dockerfile=dockerfile,
        force=force,
        tag_latest=tag_latest,
        settings=settings,
        client=client,
        emit=progress or (lambda _event: None),
        dockerfile_text=dockerfile_text,
        extra_files=dict(extra_files or {}),
        log_path=log_path,
        cancel=cancel,
        unhashed_build_args=dict(unhashed_build_args or {}),
    )
    return result.tag


def resolve_image_id(
    ref: str, *, settings: Settings | None = None, client: docker.DockerClient | None = None
) -> str:
    """The id of a local image (one pull attempt when absent).

    Raises ``ImageBuildError`` when it is neither present nor pullable, ``SandboxError`` when
    the engine is unreachable.
    """
    client = client or _client(settings or get_settings())
    return _resolve_external(client, ref).id


def _build_docker_context(
    context_dir: Path,
    *,
    name: str,
    repository: str,
    base_ref: str,
    base_id: str,
    build_args: dict[str, str],
    labels: dict[str, str],
    dockerfile: str,
    force: bool,
    tag_latest: bool,
    settings: Settings,
    client: docker.DockerClient,
    emit: ProgressFn,
    dockerfile_text: str | None = None,
    extra_files: dict[str, str] | None = None,
    log_path: Path | None = None,
    cancel: threading.Event | None = None,
    unhashed_build_args: dict[str, str] | None = None,
) -> BuildResult:
    if not (context_dir / dockerfile).is_file():
        raise InvalidRequest(f"{context_dir}: no {dockerfile} in the build context")
    started = time.monotonic()
    digest = context_hash(
        context_dir,
        base_image_id=base_id,
        build_args=build_args,
        dockerfile=dockerfile,
        labels=labels,
    )
    tag = f"{repository}:{digest}"
    with _tag_lock(tag):
        existing = None if force else _get_image(client, tag)
        if existing is not None:
            if tag_latest:
                existing.tag(repository, "latest")
            result = BuildResult(
                name=name,
                tag=tag,
                image_id=existing.id,
                action="cached",
                duration_s=time.monotonic() - started,
                base_image=base_ref,
            )
            emit(BuildEvent(image=name, kind="done", message="cached", result=result))
            return result
        emit(BuildEvent(image=name, kind="start", message=f"building {tag} on {base_ref}"))
        log_path = log_path or _log_path(settings, repository, digest)
        all_labels = {**labels, LABEL_CONTENT_HASH: digest, LABEL_BASE: base_ref}
        files = dict(extra_files or {})
        if dockerfile_text is not None:
            files[REWRITTEN_DOCKERFILE] = dockerfile_text
        image_id = _stream_build(
            client,
            name=name,
            log_path=log_path,
            emit=emit,
            cancel=cancel,
            context=_context_archive(context_dir, dockerfile=dockerfile, extra_files=files),
            dockerfile=REWRITTEN_DOCKERFILE if dockerfile_text is not None else dockerfile,
            tag=tag,
            buildargs={**(unhashed_build_args or {}), **build_args, "BASE_IMAGE": base_id},
            labels=all_labels,
            nocache=force,
        )
        if tag_latest:
            client.images.get(image_id).tag(repository, "latest")
    result = BuildResult(
        name=name,
        tag=tag,
        image_id=image_id,
        action="built",
        duration_s=time.monotonic() - started,
        log_path=log_path,
        base_image=base_ref,
    )
    emit(BuildEvent(image=name, kind="done", message="built", result=result))
    return result


def _context_archive(
    context_dir: Path, *, dockerfile: str, extra_files: Mapping[str, str]
) -> IO[bytes]:
    """The build context as a tar file (``.dockerignore`` applied, as the CLI does), with
    ``extra_files`` added (mode 0644); the caller's files are never changed."""
    ignore = context_dir / ".dockerignore"
    patterns: list[str] = []
    if ignore.is_file():
        lines = ignore.read_text(encoding="utf-8", errors="replace").splitlines()
        patterns = [ln.strip() for ln in lines if ln.strip() and not ln.startswith("#")]
    files = sorted(docker.utils.build.exclude_paths(str(context_dir), patterns, dockerfile))
    archive = tempfile.TemporaryFile()  # noqa: SIM115 (returned; closed by the caller)
    with tarfile.open(fileobj=archive, mode="w") as tar:
        for rel in files:
            if rel in extra_files:
                continue
            info = tar.gettarinfo(str(context_dir / rel), arcname=rel)
            if info is None:  # a socket
                continue
            if info.isfile():
                with (context_dir / rel).open("rb") as fh:
                    tar.addfile(info, fh)
            else:
                tar.addfile(info)
        for name, text in sorted(extra_files.items()):
            data = text.encode("utf-8")
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))
    archive.seek(0)
    return archive


class BuildCancelled(ImageBuildError):
    """The build was cancelled (its connection closed; the engine stopped it)."""

    title = "Image build cancelled"


def _stream_build(
    client: docker.DockerClient,
    *,
    name: str,
    log_path: Path,
    emit: ProgressFn,
    context: IO[bytes],
    cancel: threading.Event | None = None,
    **params: object,
) -> str:
    """Run ``POST /build`` with ``context``, teeing its log to ``log_path`` and ``emit``.

    The log file is flushed line by line (it can be read while the build runs). When
    ``cancel`` is set, the connection is shut down: the engine cancels a build whose client
    went away, and ``BuildCancelled`` is raised.
    """
    tail: deque[str] = deque(maxlen=15)
    image_id: str | None = None
    pending = ""
    api = client.api
    query = {
        "t": params["tag"],
        "dockerfile": params["dockerfile"],
        "rm": True,
        "forcerm": True,
        "pull": False,
        "nocache": bool(params.get("nocache")),
        "buildargs": json.dumps(params.get("buildargs") or {}),
        "labels": json.dumps(params.get("labels") or {}),
    }
    done = threading.Event()
    with log_path.open("w", encoding="utf-8") as log, context:

        def line_out(line: str) -> None:
            line = line.rstrip()
            if line:
                tail.append(line)
                emit(BuildEvent(image=name, kind="log", message=line))

        try:
            headers = {"Content-Type": "application/tar"}
            api._set_auth_headers(headers)
            response = api._post(
                api._url("/build"),
                data=context,
                params=query,
                headers=headers,
                stream=True,
                timeout=None,
            )
            if cancel is not None:
                threading.Thread(
                    target=_close_on_cancel,
                    args=(api, response, cancel, done),
                    daemon=True,
                    name=f"build-cancel-{name}",
                ).start()
            api._raise_for_status(response)
            for chunk in api._stream_helper(response, decode=True):
                if "error" in chunk:
                    log.write(f"ERROR: {chunk['error']}\n")
                    line_out(pending)
                    raise ImageBuildError(
                        _failure(name, str(chunk["error"]).strip(), tail, log_path),
                        log_path=log_path,
                    )
                text = chunk.get("stream") or chunk.get("status") or ""
                if text:
                    log.write(text if chunk.get("stream") else text + "\n")
                    log.flush()
                    pending += text if chunk.get("stream") else text + "\n"
                    *lines, pending = pending.split("\n")
                    for line in lines:
                        line_out(line)
                aux = chunk.get("aux")
                if isinstance(aux, dict) and "ID" in aux:
                    image_id = aux["ID"]
            line_out(pending)
            if cancel is not None and cancel.is_set():
                raise BuildCancelled(f"building {name} was cancelled", log_path=log_path)
        except BuildCancelled:
            raise
        except Exception as exc:
            if cancel is not None and cancel.is_set():  # whatever the closed socket raised
                log.write("CANCELLED\n")
                raise BuildCancelled(f"building {name} was cancelled", log_path=log_path) from exc
            transport = (
                docker.errors.DockerException,
                requests.exceptions.RequestException,
                urllib3.exceptions.HTTPError,
                OSError,
            )
            if not isinstance(exc, transport) or isinstance(exc, ImageBuildError):
                raise
            raise ImageBuildError(
                _failure(name, str(exc), tail, log_path), log_path=log_path
            ) from exc
        finally:
            done.set()
    if image_id is None:
        tag = str(params["tag"])
        image = _get_image(client, tag)
        if image is None:
            raise ImageBuildError(
                _failure(name, "the engine reported no image", tail, log_path), log_path=log_path
            )
        image_id = image.id
    return image_id


def _close_on_cancel(
    api: docker.APIClient, response: object, cancel: threading.Event, done: threading.Event
) -> None:
    """Wait for ``cancel`` (or the build's end); on cancel shut the response's socket down,
    which wakes the reader and tells the engine the client went away."""
    while not done.is_set():
        if cancel.wait(0.2):
            break
    if done.is_set():
        return
    with contextlib.suppress(Exception):
        raw = api._get_raw_response_socket(response)
        sock = getattr(raw, "_sock", raw)
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(Exception):
        response.close()  # type: ignore[attr-defined]


def _failure(name: str, reason: str, tail: Sequence[str], log_path: Path) -> str:
    lines = "\n".join(f"  | {line}" for line in tail)
    return f"building {name} failed: {reason}\n{lines}\n  full log: {log_path}"


# --------------------------------------------------------------------------- the base image


def _ensure_base(
    *,
    settings: Settings,
    client: docker.DockerClient,
    base_image: str | None,
    force: bool,
    emit: ProgressFn,
) -> BuildResult:
    started = time.monotonic()
    if base_image:
        hint = "leave BASE_IMAGE unset to build a debootstrap base"
        image = _resolve_external(client, base_image, hint=hint)
        result = BuildResult(
            name=BASE,
            tag=base_image,
            image_id=image.id,
            action="external",
            duration_s=time.monotonic() - started,
            base_image=base_image,
        )
        emit(BuildEvent(image=BASE, kind="done", message="external", result=result))
        return result
    repository = f"{settings.image_prefix}/{BASE}"
    digest = base_recipe_hash()
    tag = f"{repository}:{digest}"
    with _tag_lock(tag):
        existing = None if force else _get_image(client, tag)
        if existing is not None:
            existing.tag(repository, "latest")
            result = BuildResult(
                name=BASE,
                tag=tag,
                image_id=existing.id,
                action="cached",
                duration_s=time.monotonic() - started,
            )
            emit(BuildEvent(image=BASE, kind="done", message="cached", result=result))
            return result
        _check_debootstrap()
        emit(BuildEvent(image=BASE, kind="start", message=f"debootstrap {DEBIAN_SUITE} -> {tag}"))
        log_path = _log_path(settings, repository, digest)
        image_id = _debootstrap_import(
            client, repository=repository, digest=digest, log_path=log_path, emit=emit
        )
        client.images.get(image_id).tag(repository, "latest")
    result = BuildResult(
        name=BASE,
        tag=tag,
        image_id=image_id,
        action="built",
        duration_s=time.monotonic() - started,
        log_path=log_path,
    )
    emit(BuildEvent(image=BASE, kind="done", message="built", result=result))
    return result


def _check_debootstrap() -> None:
    hint = "or pass --base-image debian:bookworm-slim (any local Debian 12 image)"
    if shutil.which("debootstrap") is None:
        raise ImageBuildError(f"the base image needs debootstrap: run `make setup`, {hint}")
    if os.geteuid() != 0:
        raise ImageBuildError(f"debootstrap needs root: run the build as root, {hint}")


def _debootstrap_import(
    client: docker.DockerClient, *, repository: str, digest: str, log_path: Path, emit: ProgressFn
) -> str:
    """debootstrap a minbase root filesystem, tidy it, import it as ``repository:digest``."""
    tail: deque[str] = deque(maxlen=15)
    rootfs = Path(tempfile.mkdtemp(prefix="crucible-rootfs-", dir=_scratch_dir()))
    try:
        with log_path.open("w", encoding="utf-8") as log:
            cmd = [
                "debootstrap",
                f"--variant={DEBOOTSTRAP_VARIANT}",
                DEBIAN_SUITE,
                str(rootfs),
                DEBIAN_MIRROR,
            ]
            log.write("$ " + " ".join(cmd) + "\n")
            log.flush()
            proc = subprocess.Popen(
                cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace"
            )
            assert proc.stdout is not None
            for line in proc.stdout:
                log.write(line)
                tail.append(line.rstrip())
                emit(BuildEvent(image=BASE, kind="log", message=line.rstrip()))
            if proc.wait() != 0:
                reason = f"debootstrap exited with status {proc.returncode}"
                raise ImageBuildError(_failure(BASE, reason, tail, log_path), log_path=log_path)
            _tidy_rootfs(rootfs)
            emit(BuildEvent(image=BASE, kind="log", message=f"importing {repository}:{digest}"))
            log.write(f"$ tar -C {rootfs} -c . | docker import - {repository}:{digest}\n")
            image_id = _import_rootfs(client, rootfs, repository=repository, digest=digest, log=log)
            log.write(f"imported {image_id}\n")
        return image_id
    finally:
        shutil.rmtree(rootfs, ignore_errors=True)


def _tidy_rootfs(rootfs: Path) -> None:
    (rootfs / "etc/apt/sources.list").write_text(BASE_SOURCES_LIST)
    (rootfs / "etc/apt/apt.conf.d/90crucible").write_text(BASE_APT_CONF)
    (rootfs / "etc/resolv.conf").write_text("")  # the engine provides one at run time
    for pattern in ("var/cache/apt/archives/*.deb", "var/cache/apt/*.bin", "var/lib/apt/lists/*"):
        for path in rootfs.glob(pattern):
            if path.is_file() and path.name != "lock":
                path.unlink()


def _import_rootfs(
    client: docker.DockerClient, rootfs: Path, *, repository: str, digest: str, log: IO[str]
) -> str:
    log.flush()
    tar = subprocess.Popen(
        ["tar", "--numeric-owner", "-C", str(rootfs), "-c", "."],
        stdout=subprocess.PIPE,
        stderr=log.fileno(),
    )
    out = tar.stdout
    assert out is not None

    def chunks() -> Iterator[bytes]:
        while chunk := out.read(1 << 20):
            yield chunk

    changes = [
        *BASE_CHANGES,
        f"LABEL {LABEL_IMAGE}={BASE}",
        f"LABEL {LABEL_CONTENT_HASH}={digest}",
    ]
    try:
        answer = client.api.import_image_from_data(
            chunks(), repository=repository, tag=digest, changes=changes
        )
    except docker.errors.DockerException as exc:
        tar.kill()
        raise ImageBuildError(f"docker import of the base rootfs failed: {exc}") from exc
    finally:
        out.close()
        tar.wait()
    log.write(str(answer).strip() + "\n")
    if tar.returncode != 0:
        raise ImageBuildError(f"tar of the base rootfs failed with status {tar.returncode}")
    image = _get_image(client, f"{repository}:{digest}")
    if image is None:
        raise ImageBuildError(f"docker import did not produce {repository}:{digest}: {answer}")
    return image.id


def _scratch_dir() -> str:
    """A roomy place for the ~200 MB root filesystem (``/var/tmp`` when writable)."""
    return "/var/tmp" if os.access("/var/tmp", os.W_OK) else tempfile.gettempdir()


# --------------------------------------------------------------------------- listing


def list_images(
    *, settings: Settings | None = None, client: docker.DockerClient | None = None
) -> list[ImageStatus]:
    """Every sandbox image with its ``latest`` tag and whether a build would change it.

    The expected tag is what ``build_images`` would produce now (with
    ``settings.base_image`` as base when set); it is None when the image's base is missing.
    Raises ``SandboxError`` when the engine is unreachable.
    """
    settings = settings or get_settings()
    client = client or _client(settings)
    expected_ids: dict[str, str | None] = {}  # image id of each image's expected tag
    rows: list[ImageStatus] = []
    for image in discover_images(settings.images_dir, image_prefix=settings.image_prefix):
        repository = f"{settings.image_prefix}/{image.name}"
        expected: str | None = None
        if image.context_dir is None:
            expected = settings.base_image or f"{repository}:{base_recipe_hash()}"
        else:
            if image.depends_on is not None:
                base_id = expected_ids.get(image.depends_on)
            else:
                external = _get_image(client, image.base_ref or "")
                base_id = external.id if external else None
            if base_id is not None:
                digest = context_hash(
                    image.context_dir, base_image_id=base_id, labels={LABEL_IMAGE: image.name}
                )
                expected = f"{repository}:{digest}"
        found = _get_image(client, expected) if expected else None
        expected_ids[image.name] = found.id if found else None
        latest = _get_image(client, f"{repository}:latest")
        external_base = image.context_dir is None and bool(settings.base_image)
        shown = found if external_base else latest
        status: Literal["current", "stale", "missing"]
        if shown is None:
            status = "missing"
        elif found is not None and found.id == shown.id:
            status = "current"
        else:
            status = "stale"
        rows.append(
            ImageStatus(
                name=image.name,
                repository=repository,
                expected_tag=expected,
                latest_id=shown.id if shown else None,
                status=status,
                size_bytes=shown.attrs.get("Size") if shown else None,
                created=shown.attrs.get("Created") if shown else None,
                tags=tuple(sorted(shown.tags)) if shown else (),
            )
        )
    return rows


# --------------------------------------------------------------------------- progress display


_CI_LINES = ("Step ", "I: Retrieving Release", "I: Base system", "importing")


class RichProgress:
    """A ``ProgressFn`` for terminals: a spinner with the latest log line while an image
    builds, and one line per image when it is done. Without a terminal (CI) it prints the
    build steps instead of a spinner. Use as a context manager.
    """

    def __init__(self, console: Console | None = None) -> None:
        self.console = console or Console(stderr=True)
        self._status = self.console.status("", spinner="dots")
        self._live = self.console.is_terminal

    def __enter__(self) -> RichProgress:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._status.stop()

    def __call__(self, event: BuildEvent) -> None:
        if event.kind == "start":
            if self._live:
                self._status.update(f"[bold]{event.image}[/]: {escape(event.message)}")
                self._status.start()
            else:
                self.console.print(f"{event.image}: {escape(event.message)}", highlight=False)
        elif event.kind == "log":
            if self._live:
                line = event.message if len(event.message) < 100 else event.message[:97] + "..."
                self._status.update(f"[bold]{event.image}[/]: {escape(line)}")
            elif event.message.startswith(_CI_LINES):
                line = " ".join(event.message.split())
                line = line if len(line) < 100 else line[:97] + "..."
                self.console.print(f"  {escape(line)}", highlight=False, soft_wrap=True)
        elif event.result is not None:
            self._status.stop()
            r = event.result
            detail = f"built in {r.duration_s:.1f} s" if r.action == "built" else r.action
            self.console.print(
                f"[green]ok[/] {r.name:<10} {escape(r.tag):<32} {detail}", highlight=False
            )


# --------------------------------------------------------------------------- engine helpers


def _client(settings: Settings) -> docker.DockerClient:
    try:
        if settings.docker_host:
            client = docker.DockerClient(
                base_url=settings.docker_host, timeout=BUILD_CLIENT_TIMEOUT_S
            )
        else:
            client = docker.from_env(timeout=BUILD_CLIENT_TIMEOUT_S)
        client.ping()
    except docker.errors.DockerException as exc:
        raise SandboxError(
            f"Docker engine not reachable ({exc}); start it with `make setup`"
        ) from exc
    return client


def _get_image(client: docker.DockerClient, ref: str) -> Image | None:
    try:
        return client.images.get(ref)
    except docker.errors.ImageNotFound:
        return None
    except docker.errors.APIError as exc:
        if exc.status_code in (400, 404):  # 400: not a valid reference
            return None
        raise SandboxError(f"inspecting image {ref!r} failed: {exc}") from exc


def _resolve_external(
    client: docker.DockerClient, ref: str, *, hint: str = "build it with `make images`"
) -> Image:
    """A base image by reference: local first, then one pull attempt."""
    image = _get_image(client, ref)
    if image is not None:
        return image
    try:
        return client.images.pull(ref)
    except docker.errors.DockerException as exc:
        raise ImageBuildError(
            f"base image {ref!r} is not present locally and could not be pulled ({exc}); "
            f"load it with `docker load`, or {hint}"
        ) from exc


def _log_path(settings: Settings, repository: str, digest: str) -> Path:
    logs = settings.data_dir / "logs" / "images"
    logs.mkdir(parents=True, exist_ok=True)
    return (logs / f"{re.sub(r'[^A-Za-z0-9_.-]+', '_', repository)}-{digest}.log").resolve()


@contextlib.contextmanager
def _tag_lock(tag: str) -> Iterator[None]:
    """Serialize builds of one tag across processes on this machine (parallel tests, users)."""
    lock_dir = Path(tempfile.gettempdir()) / "crucible-image-locks"
    lock_dir.mkdir(mode=0o777, exist_ok=True)
    lock_file = lock_dir / (hashlib.sha256(tag.encode()).hexdigest()[:24] + ".lock")
    with lock_file.open("a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
