"""The task registry: loaded suites by name, task look-up, and each task's image and template.

A task's image is its environment folder built on a Crucible sandbox image
(``service.images.build_context``: the tag is a content hash, so an unchanged task on an
unchanged base is never rebuilt), or the prebuilt ``[environment].docker_image``. Its template
is the sandbox recipe made from the task's limits, network policy and workdir.
"""

from __future__ import annotations

import builtins
import hashlib
import io
import json
import logging
import os
import re
import tarfile
import threading
import time
from collections.abc import Iterable
from pathlib import Path

import docker

from service.config import Settings, get_settings
from service.errors import InvalidRequest, NotFound, TaskFormatError
from service.images import ProgressFn, build_context, resolve_image_id
from service.tasks.buildprep import BuildSettings, PreparedDockerfile, from_references, prepare
from service.tasks.builds import BuildTracker
from service.tasks.loader import discover_suites
from service.tasks.models import DOMAINS, Suite, Task
from service.templates import Template

DEFAULT_IMAGE_PREFIX = "crucible-task"
LABEL_TASK = "crucible.task"
TEMPLATE_NAME_MAX = 63  # service.templates.Template.name: ^[a-z0-9][a-z0-9_.-]{0,62}$

_TEMPLATE_BAD = re.compile(r"[^a-z0-9_.-]+")
_REPO_BAD = re.compile(r"[^a-z0-9]+")

log = logging.getLogger(__name__)


def image_repository(task: Task, *, prefix: str = DEFAULT_IMAGE_PREFIX) -> str:
    """The Docker repository of a task's built image: ``<prefix>/<suite>-<id>``, lowercased.

    Characters Docker does not allow in a repository path component become ``-``.
    """
    component = _REPO_BAD.sub("-", f"{task.suite}-{task.id}".lower()).strip("-")
    return f"{prefix}/{component}"


def template_name(task: Task) -> str:
    """``task-<suite>-<id>`` within the template name rule (at most 63 characters).

    Lowercased, other characters replaced by ``-``; a name too long is cut and ends with 8 hex
    digits of a sha256 of the full name, so distinct tasks keep distinct names.
    """
    full = f"task-{task.suite}-{task.id}"
    name = _TEMPLATE_BAD.sub("-", full.lower())
    if len(name) <= TEMPLATE_NAME_MAX and name == full.lower():
        return name
    suffix = hashlib.sha256(full.encode()).hexdigest()[:8]
    return f"{name[: TEMPLATE_NAME_MAX - 9].rstrip('-_.')}-{suffix}"


def template_for(task: Task, image: str, *, ids: tuple[int, int] | None = None) -> Template:
    """The sandbox template of a task running on ``image`` (from ``ensure_image``).

    Limits come from the task (``cpus``, ``memory_mb``, ``storage_mb`` as ``disk_mb``); the
    network is ``none`` unless the task allows internet; ``workdir`` is the task's;
    ``files_root`` is ``/``. The sandbox user is the task's ``[environment]`` ``uid``/``gid``
    (``gid`` defaults to ``uid``), or ``ids`` (uid, gid: a ``user`` name looked up in the
    image), else root. ``allow_root`` is the task's (default: root tasks only).

    Raises ``TaskFormatError`` (field ``environment.user``) for a name given without ``ids``.
    """
    env = task.environment
    uid, gid = 0, 0
    if env.uid is not None:
        uid, gid = env.uid, env.gid if env.gid is not None else env.uid
    elif env.user not in (None, "root"):
        if ids is None:
            raise TaskFormatError(
                f"task {task.key}: user {env.user!r} needs its uid (or an image to look it up)",
                field="environment.user",
            )
        uid, gid = ids
    name = env.user or ("root" if uid == 0 else "agent")
    return Template(
        user=name,
        uid=uid,
        gid=gid,
        allow_root=env.allow_root if env.allow_root is not None else uid == 0,
        name=template_name(task),
        image=image,
        description=f"task {task.key} ({task.format}, version {task.version})",
        cpus=env.cpus,
        memory_mb=env.memory_mb,
        disk_mb=env.storage_mb,
        network="bridge" if env.allow_internet else "none",
        workdir=env.workdir,
        files_root="/",
    )


def image_user_ids(client: docker.DockerClient, image: str, name: str) -> tuple[int, int] | None:
    """``name``'s (uid, gid) in ``image``'s ``/etc/passwd``, or None when it is not there.

    The file is read through the engine's archive API from a container that is created and
    removed, never started. Raises ``docker.errors.DockerException`` when the engine fails.
    """
    container = client.containers.create(image, command=["true"], entrypoint=[])
    try:
        try:
            chunks, _ = container.get_archive("/etc/passwd")
        except docker.errors.NotFound:
            return None
        with tarfile.open(fileobj=io.BytesIO(b"".join(chunks))) as tar:
            member = tar.next()
            handle = tar.extractfile(member) if member is not None else None
            text = handle.read().decode("utf-8", "replace") if handle is not None else ""
    finally:
        container.remove(force=True)
    for line in text.splitlines():
        fields = line.split(":")
        if len(fields) >= 4 and fields[0] == name and fields[2].isdigit() and fields[3].isdigit():
            return int(fields[2]), int(fields[3])
    return None


def _signature(root: Path) -> tuple[tuple[str, int], ...]:
    """Modification times of the root, each suite folder, each task folder and the files
    directly in a task folder (``task.toml``, ``instruction.md``...): what a new, removed or
    edited task changes. Stat calls only."""
    out: list[tuple[str, int]] = []
    try:
        out.append((".", root.stat().st_mtime_ns))
        for suite in sorted(os.scandir(root), key=lambda e: e.name):
            if not suite.is_dir():
                continue
            out.append((suite.name, suite.stat().st_mtime_ns))
            for task in sorted(os.scandir(suite.path), key=lambda e: e.name):
                if not task.is_dir():
                    continue
                out.append((f"{suite.name}/{task.name}", task.stat().st_mtime_ns))
                for entry in sorted(os.scandir(task.path), key=lambda e: e.name):
                    if entry.is_file():
                        out.append(
                            (f"{suite.name}/{task.name}/{entry.name}", entry.stat().st_mtime_ns)
                        )
    except OSError as e:
        # A folder that vanished or cannot be read mid-walk: the partial fingerprint differs
        # from the last one, so the rescan it triggers meets (and reports) the real error.
        log.warning("task folders changed while they were read: %s", e)
    return tuple(out)


class TaskRegistry:
    """Thread-safe holder of loaded suites, with per-process caching of task images.

    ``image_prefix`` is the repository prefix of built task images (tests use a unique one);
    ``settings`` and ``client`` are passed to ``build_context`` (defaults: process settings and
    a client from the environment).
    """

    def __init__(
        self,
        suites: Iterable[Suite] = (),
        *,
        image_prefix: str = DEFAULT_IMAGE_PREFIX,
        settings: Settings | None = None,
        client: docker.DockerClient | None = None,
    ) -> None:
        self._lock = threading.Lock()
        self._suites: dict[str, Suite] = {}
        self._root: Path | None = None
        self._root_suites: set[str] = set()
        self._root_signature: tuple[tuple[str, int], ...] = ()
        self._checked_at = 0.0
        self._rescan_lock = threading.Lock()
        self._tracker: BuildTracker | None = None
        self._images: dict[tuple[str, str, str], str] = {}
        self._build_locks: dict[tuple[str, str, str], threading.Lock] = {}
        self.image_prefix = image_prefix
        self._settings = settings
        self._client = client
        for suite in suites:
            self.add_suite(suite)

    @classmethod
    def from_root(
        cls,
        root: str | Path,
        *,
        collect_errors: bool = False,
        image_prefix: str = DEFAULT_IMAGE_PREFIX,
        settings: Settings | None = None,
        client: docker.DockerClient | None = None,
    ) -> TaskRegistry:
        """A registry of every suite under ``root`` (e.g. ``tasks/``).

        Raises ``TaskFormatError`` as ``discover_suites`` does.
        """
        suites = discover_suites(root, collect_errors=collect_errors)
        registry = cls(suites, image_prefix=image_prefix, settings=settings, client=client)
        registry._root = Path(root)
        registry._root_suites = {s.name for s in suites}
        registry._root_signature = _signature(Path(root))
        registry._checked_at = time.monotonic()
        return registry

    # ----------------------------------------------------------------------- re-reading

    def rescan(self, *, force: bool = False) -> bool:
        """Re-read the suites of the root folder when its folders or task files changed
        (a cheap stat walk, at most every ``tasks_rescan_interval_s`` unless ``force``).
        Suites added with ``add_suite`` stay. Returns whether anything was re-read."""
        if self._root is None:
            return False
        interval = self._effective_settings().tasks_rescan_interval_s
        now = time.monotonic()
        if not force and now - self._checked_at < interval:
            return False
        with self._rescan_lock:
            self._checked_at = time.monotonic()
            signature = _signature(self._root)
            if signature == self._root_signature:
                return False
            suites = discover_suites(self._root, collect_errors=True)
            with self._lock:
                for name in self._root_suites - {s.name for s in suites}:
                    self._suites.pop(name, None)
                for suite in suites:
                    self._suites[suite.name] = suite
                self._root_suites = {s.name for s in suites}
                self._images.clear()
            self._root_signature = signature
            return True

    # ----------------------------------------------------------------------- suites and tasks

    def add_suite(self, suite: Suite) -> None:
        """Add a suite, replacing one of the same name."""
        with self._lock:
            self._suites[suite.name] = suite

    def suites(self) -> builtins.list[Suite]:
        """All suites, sorted by name (re-read first when the root folder changed)."""
        self.rescan()
        with self._lock:
            return [self._suites[name] for name in sorted(self._suites)]

    def suite(self, name: str) -> Suite:
        """The suite; ``NotFound`` (field ``suite``) when unknown (after a re-read)."""
        self.rescan()
        with self._lock:
            found = self._suites.get(name)
            known = sorted(self._suites)
        if found is None:
            raise NotFound(f"unknown suite {name!r}; known: {', '.join(known)}", field="suite")
        return found

    def get(self, task_id: str, suite: str | None = None) -> Task:
        """A task by id (or ``<suite>/<id>``), optionally within one suite.

        Raises ``NotFound`` (field ``suite`` or ``task_id``) when unknown, ``InvalidRequest``
        (field ``task_id``) when the id exists in several suites and no suite is named.
        """
        if suite is None and "/" in task_id:
            suite, task_id = task_id.split("/", 1)
        if suite is not None:
            found = self.suite(suite).get(task_id)
            if found is None and self.rescan():
                found = self.suite(suite).get(task_id)
            if found is None:
                raise NotFound(f"unknown task {task_id!r} in suite {suite!r}", field="task_id")
            return found
        matches = [t for s in self.suites() if (t := s.get(task_id)) is not None]
        if not matches:
            raise NotFound(f"unknown task {task_id!r}", field="task_id")
        if len(matches) > 1:
            where = ", ".join(t.suite for t in matches)
            raise InvalidRequest(
                f"task id {task_id!r} is in several suites ({where}); name the suite",
                field="task_id",
            )
        return matches[0]

    def list(self, suite: str | None = None, domain: str | None = None) -> builtins.list[Task]:
        """Tasks sorted by suite then id, optionally of one suite and/or one domain.

        Raises ``NotFound`` for an unknown suite, ``InvalidRequest`` for an unknown domain.
        """
        if domain is not None and domain not in DOMAINS:
            raise InvalidRequest(
                f"unknown domain {domain!r}; known: {', '.join(DOMAINS)}", field="domain"
            )
        suites = [self.suite(suite)] if suite is not None else self.suites()
        return [t for s in suites for t in s.tasks if domain is None or t.domain == domain]

    # ----------------------------------------------------------------------- images and templates

    def ensure_image(
        self,
        task: Task,
        *,
        base_image: str,
        force: bool = False,
        progress: ProgressFn | None = None,
    ) -> str:
        """The image reference to run ``task`` on, building it at most once per process.

        A prebuilt ``docker_image`` is returned as is (it must be present or pullable when a
        sandbox starts). Otherwise ``task.environment_dir`` is built on ``base_image`` (e.g.
        ``crucible/terminal:latest``) as ``<image_prefix>/<suite>-<id>:<content hash>``; the
        Dockerfile gets the base as ``ARG BASE_IMAGE``. The tag is remembered per (task,
        version, base image ref): later calls return it without touching the engine (after
        rebuilding the base under the same ref in a running process, ``clear_image_cache``).
        ``force`` rebuilds without the layer cache.

        Raises ``ImageBuildError`` when the base is missing or a build step fails (the message
        ends with the build log tail and path), ``SandboxError`` when the engine is
        unreachable. The task's ``build_timeout_s`` is not enforced here.
        """
        if task.environment.docker_image is not None:
            return task.environment.docker_image
        context_dir = task.environment_dir
        assert context_dir is not None  # TaskEnvironment guarantees one image source
        key = (task.key, task.version, base_image)
        with self._lock:
            cached = None if force else self._images.get(key)
            build_lock = self._build_locks.setdefault(key, threading.Lock())
        if cached is not None:
            return cached
        settings = self._effective_settings()
        prepared = self._prepare(task, context_dir)
        digest = hashlib.sha256(
            json.dumps(
                [task.key, task.version, base_image, prepared.text, prepared.labels]
            ).encode()
        ).hexdigest()
        tracker = self.builds()
        running = tracker.running_for(digest)
        if running is not None:
            tracker.join(running)  # this requester keeps the running build alive
        with build_lock:
            with self._lock:
                cached = None if force else self._images.get(key)
            if cached is not None:
                return cached  # another thread built it while this one waited

            def attempt(log_path: Path, cancel: threading.Event) -> str:
                return build_context(
                    context_dir,
                    repository=image_repository(task, prefix=self.image_prefix),
                    base_image=base_image,
                    build_args={"BASE_IMAGE": base_image},
                    unhashed_build_args=prepared.build_args,
                    dockerfile=task.environment.dockerfile,
                    dockerfile_text=prepared.text,
                    extra_files=prepared.files,
                    labels={LABEL_TASK: task.key, **prepared.labels},
                    force=force,
                    settings=settings,
                    progress=progress,
                    client=self._client,
                    log_path=log_path,
                    cancel=cancel,
                )

            tag = tracker.run(
                task=task.key,
                repository=image_repository(task, prefix=self.image_prefix),
                digest=digest,
                attempt_fn=attempt,
            )
            with self._lock:
                self._images[key] = tag
        return tag

    def _prepare(self, task: Task, context_dir: Path) -> PreparedDockerfile:
        """The task's Dockerfile rewritten for this install's aliases and build settings."""
        dockerfile = context_dir / task.environment.dockerfile
        try:
            text = dockerfile.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise InvalidRequest(f"task {task.key}: {dockerfile}: {e}", field="task_id") from e
        build_settings = BuildSettings.from_settings(self._effective_settings())
        alias_ids = {
            ref: resolve_image_id(build_settings.aliases[ref], client=self._client)
            for ref in from_references(text)
            if ref in build_settings.aliases
        }
        return prepare(text, settings=build_settings, alias_ids=alias_ids)

    def builds(self) -> BuildTracker:
        """The task-build tracker of this registry (attempts, logs, cancellation)."""
        with self._lock:
            if self._tracker is None:
                settings = self._effective_settings()
                self._tracker = BuildTracker(
                    (settings.data_dir / "logs" / "builds").resolve(),
                    attempts=settings.build_attempts,
                    retry_delay_s=settings.build_retry_delay_s,
                )
            return self._tracker

    def _docker(self) -> docker.DockerClient:
        if self._client is None:
            from service.images import _client

            self._client = _client(self._effective_settings())
        return self._client

    def _effective_settings(self) -> Settings:
        return self._settings or get_settings()

    def cached_image(self, task: Task, *, base_image: str) -> str | None:
        """The tag ``ensure_image`` would return without building, or None."""
        if task.environment.docker_image is not None:
            return task.environment.docker_image
        with self._lock:
            return self._images.get((task.key, task.version, base_image))

    def clear_image_cache(self) -> None:
        """Forget the tags built so far (the next ``ensure_image`` re-checks the engine)."""
        with self._lock:
            self._images.clear()

    def template_for(self, task: Task, image: str) -> Template:
        """The task's sandbox template on ``image``; see the module function ``template_for``.

        A ``user`` given by name only is looked up in the image's ``/etc/passwd`` (read from
        a created, never started, container). Raises ``TaskFormatError`` (field
        ``environment.user``) when the image has no such user.
        """
        env = task.environment
        ids = None
        if env.uid is None and env.user not in (None, "root"):
            ids = image_user_ids(self._docker(), image, env.user or "")
            if ids is None:
                raise TaskFormatError(
                    f"task {task.key}: image {image} has no user {env.user!r} in /etc/passwd",
                    field="environment.user",
                )
        return template_for(task, image, ids=ids)
