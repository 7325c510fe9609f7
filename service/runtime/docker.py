"""``DockerRuntime``: the ``SandboxRuntime`` protocol on a Docker engine (docker SDK).

Every exec goes through ``crucible-exec`` (``service/runtime/supervisor/``), a static C
supervisor on a read-only named volume mounted at ``/opt/crucible`` in every sandbox; the
wire format is in ``service.runtime.protocol``. ``ensure_ready`` builds the supervisor once
per source hash and fills the volume ``crucible-supervisor-<hash>``.

Containers (see ``create``): the supervisor's ``--idle`` mode is the main process under
docker-init (``init=True``), so images need no ``sleep``; network ``none`` unless the spec
says ``bridge``; ``cap_drop=ALL`` plus ``DEFAULT_CAP_ADD`` plus the spec's ``cap_add``;
``no-new-privileges``; memory = memory+swap; pids and open-files limits.

Disk: the engine here (overlay2 without XFS project quotas) refuses ``storage_opt size=``,
so the writable layer cannot be capped at create. A spec's ``disk_bytes`` holds through
``RLIMIT_FSIZE`` (no file over the budget) and ``service.runtime.diskwatch`` (the layer
measured every 50 ms; writers killed past the budget); ``tmpfs`` mounts from the spec give
scratch space with a hard size limit, charged to the sandbox's memory.

Fork bombs: an exec that cannot start because the sandbox's processes hold every pid is
retried once after those processes are killed (``service.runtime.cgroups``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import hashlib
import io
import logging
import os
import posixpath
import re
import shutil
import signal
import stat
import struct
import tarfile
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, BinaryIO

import docker
import docker.errors
import docker.utils
import requests.exceptions
from docker.types import Mount, Ulimit

from service.errors import (
    Conflict,
    CrucibleError,
    InvalidRequest,
    NotFound,
    PayloadTooLarge,
    SandboxError,
    SandboxStopped,
)
from service.runtime import cgroups, channel, diskwatch, jsonstream, overlay
from service.runtime.base import (
    LABEL_DEPLOYMENT,
    LABEL_SANDBOX_ID,
    LABEL_TEMPLATE,
    ROOT,
    ContainerInfo,
    EndStateUnreadable,
    ExecChunk,
    ExecRequest,
    ExecResult,
    FsChange,
    HandlerLost,
    PathStat,
    SandboxSpec,
)
from service.runtime.protocol import (
    DEFAULT_GRACE_MS,
    FRAME_ERROR,
    FRAME_PATH,
    FRAME_RESULT,
    ExecCollector,
    Frame,
    FrameDecoder,
    encode_exec,
    encode_kill,
    encode_mkdir,
    encode_resolve,
    raise_for_error,
    supervisor_args,
    with_identity,
)
from service.text import find_unencodable

SUPERVISOR_DIR = Path(__file__).resolve().parent / "supervisor"
SUPERVISOR_SOURCES = (
    "Dockerfile",
    "crucible-exec.c",
    "crucible-audit.c",
    # The verifier's in-sandbox Python (``service.verifiers.observe``), shipped read-only.
    "py/crucible_guard.py",
    "py/crucible_observer.py",
    "py/sitecustomize.py",
    "py/crucible-verifier.pth",
)
log = logging.getLogger("crucible.runtime")

FREEZE_ATTEMPTS = 3
# How long a snapshot whose engine call timed out waits for the engine's commit to end.
COMMIT_OUTWAIT_S = 3600.0
"""Pause tries before ``DockerRuntime.freeze`` kills the container instead."""

SUPERVISOR_MOUNT = "/opt/crucible"
SUPERVISOR_PATH = f"{SUPERVISOR_MOUNT}/crucible-exec"
SUPERVISOR_BUILD_REPOSITORY = "crucible/supervisor-build"

LABEL_ROLE = "crucible.role"
LABEL_SUPERVISOR = "crucible.supervisor"
LABEL_USER = "crucible.user"  # the template's user: the default user of execs
LABEL_DISK = "crucible.disk_bytes"  # the writable layer's budget (``diskwatch``)

# Capabilities a sandbox's root keeps: enough for package managers, chown/chmod of any file,
# switching to an unprivileged user (apt's _apt sandbox, su-less setuid in tools), signalling
# its own processes and binding ports below 1024; SETPCAP so the verifier's judge can drop
# capabilities from its bounding set (``crucible_observer._bound_execs``: no program its
# tests exec gets them back, whatever API started it). SETPCAP gives a process nothing over
# another: with file capabilities (every kernel since 2.6.33) it only shrinks the holder's
# own bounding set, sets its own securebits, and raises its inheritable set within its
# bounding set, which for root here equals its permitted set (``cap_drop=ALL`` then these),
# so it cannot raise what root could not already have. Dropped on purpose (Docker keeps
# them by default): MKNOD, NET_RAW, SETFCAP, SYS_CHROOT, AUDIT_WRITE. (The verifier's
# pristine sandbox comes from the same warm pool as the agent's, so both have it.)
DEFAULT_CAP_ADD = (
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "NET_BIND_SERVICE",
    "SETGID",
    "SETPCAP",
    "SETUID",
)

# Images tried, in order, to build the supervisor when none is configured.
DEFAULT_BUILDER_BASES = ("crucible/base:latest", "crucible/base:bootstrap")
_ROOT_USERS = {"", "root", "0", "0:0", "root:root"}
_READ_MARGIN_S = 30.0  # socket slack over an exec's timeout before the supervisor is presumed lost
_DIAG_BYTES = 8192  # supervisor stderr kept for error messages
_BUILD_TIMEOUT_S = 1800
_MAX_CONNECTIONS = 64
_TAR_MAX_BYTES = 1 << 30  # tar of a tmpfs path: kept whole up to 512 MiB (the head)


def supervisor_source_hash() -> str:
    """12 hex digits of sha256 over the supervisor's sources (names and bytes)."""
    digest = hashlib.sha256()
    for name in SUPERVISOR_SOURCES:
        digest.update(name.encode() + b"\0" + (SUPERVISOR_DIR / name).read_bytes() + b"\0")
    return digest.hexdigest()[:12]


# --------------------------------------------------------------------- engine plumbing


def _map_error(e: Exception, what: str) -> CrucibleError:
    """The Crucible error for an engine error while doing ``what``."""
    if isinstance(e, docker.errors.NotFound):
        return NotFound(f"{what}: not found ({_explain(e)})")
    if isinstance(e, docker.errors.APIError):
        if e.status_code == 409 and "is paused" in _explain(e):
            return Conflict(f"{what}: the sandbox is frozen (its episode is being verified)")
        if e.status_code == 409 and "is not running" in _explain(e):
            return SandboxStopped(f"{what}: the sandbox's container is not running")
        return SandboxError(f"{what}: engine error {e.status_code}: {_explain(e)}")
    if isinstance(e, requests.exceptions.RequestException | OSError):
        return SandboxError(f"{what}: Docker engine unreachable or timed out: {e}")
    return SandboxError(f"{what}: {e}")


def _explain(e: docker.errors.APIError) -> str:
    explanation = e.explanation
    if isinstance(explanation, bytes):
        explanation = explanation.decode("utf-8", "replace")
    return str(explanation or e)


def _engine_exec_error(text: bytes, what: str) -> CrucibleError:
    """The error for a message the engine wrote instead of starting the supervisor."""
    message = text.decode("utf-8", "replace").strip()[:2000]
    if "unable to find user" in message or "no matching entries in passwd" in message:
        return InvalidRequest(message, field="user")
    return SandboxError(f"{what}: the engine could not start the exec supervisor: {message}")


# Go's os.FileMode bits in the engine's path stat (X-Docker-Container-Path-Stat).
_GO_MODE_DIR = 1 << 31
_GO_MODE_SYMLINK = 1 << 27
_GO_MODE_TYPE = (1 << 31) | (1 << 27) | (1 << 26) | (1 << 25) | (1 << 24) | (1 << 21) | (1 << 19)
_GO_MODE_SPECIAL = ((1 << 23, 0o4000), (1 << 22, 0o2000), (1 << 20, 0o1000))

# An extraction refused by the sandbox's filesystem because of what the client sent, by the
# errno text (Go's and GNU tar's, compared lower case): the error class and what it means.
# Anything else (no space left, permission denied, engine trouble) stays a SandboxError.
_EXTRACT_ERRNOS: dict[str, tuple[type[CrucibleError], str]] = {
    "file name too long": (InvalidRequest, "the name is too long for the sandbox's filesystem"),
    "no such file or directory": (
        Conflict,
        "a directory on its path does not exist (a dangling symlink?)",
    ),
    "not a directory": (Conflict, "a component of its path is not a directory"),
    "is a directory": (Conflict, "a directory is in the way"),
    "file exists": (Conflict, "something is in the way (a non-empty directory?)"),
    "directory not empty": (Conflict, "a non-empty directory is in the way"),
    "read-only file system": (Conflict, "it lies on a read-only filesystem"),
    "too many levels of symbolic links": (Conflict, "its path has a symlink loop"),
    "device or resource busy": (Conflict, "it is a mount point (e.g. /etc/hosts, the engine's)"),
}
_ENGINE_READ_ONLY = ("mounted volume is marked read-only", "container rootfs is marked read-only")
_GNU_TAR_FAILURE = re.compile(r"^tar: (?P<member>.+?): (?:Cannot|Could not) [^:]*: (?P<reason>.+)$")
_DETAIL_NAME_CHARS = 200


def _path_stat(raw: dict[str, Any]) -> PathStat:
    """A ``PathStat`` from the engine's stat of a path (Go ``os.FileMode`` in ``mode``)."""
    mode = int(raw.get("mode") or 0)
    if mode & _GO_MODE_DIR:
        kind = "dir"
    elif mode & _GO_MODE_SYMLINK:
        kind = "symlink"
    elif mode & _GO_MODE_TYPE:
        kind = "other"
    else:
        kind = "file"
    perm = (mode & 0o777) | sum(bit for go, bit in _GO_MODE_SPECIAL if mode & go)
    return PathStat(
        kind=kind,
        size=int(raw.get("size") or 0),
        mode=perm,
        link_target=str(raw.get("linkTarget") or ""),
    )


def _short(name: str) -> str:
    """``name`` for a message: cut to ``_DETAIL_NAME_CHARS`` characters."""
    return name if len(name) <= _DETAIL_NAME_CHARS else name[:_DETAIL_NAME_CHARS] + "..."


def _extract_error(member: str | None, reason: str, dest_dir: str) -> CrucibleError | None:
    """The client-side error for an extraction the filesystem refused with ``reason`` (an
    errno text) at ``member`` (None: unknown), or None when ``reason`` is not the client's
    doing. The field names the member (``tar:<name>``) when known, else ``path``."""
    known = _EXTRACT_ERRNOS.get(reason.strip().lower())
    if known is None:
        return None
    cls, meaning = known
    if member:
        written = _short(posixpath.join(dest_dir, member))
        return cls(
            f"cannot write {written}: {meaning} ({reason.strip()}); nothing after it was written",
            field=f"tar:{member}",
        )
    return cls(f"extracting into {dest_dir}: {meaning} ({reason.strip()})", field="path")


def _engine_extract_error(message: str, dest_dir: str) -> CrucibleError | None:
    """``_extract_error`` for the engine's answer to a put of an archive, e.g. ``Error
    processing tar file(exit status 1): open /workspace/d/x: no such file or directory``."""
    text = message.strip()
    low = text.lower()
    if any(marker in low for marker in _ENGINE_READ_ONLY):
        return Conflict(
            f"{dest_dir} is on a read-only mount of the sandbox; nothing was written",
            field="path",
        )
    if "extraction point is not a directory" in low:
        return Conflict(f"{dest_dir} is not a directory", field="path")
    if not low.startswith("error processing tar file"):
        return None
    head, _, reason = text.rpartition(": ")
    op, _, path = (head.partition("): ")[2] or head).partition(" ")
    prefix = dest_dir.rstrip("/") + "/"
    if op in ("link", "symlink"):  # Go's LinkError: "<op> <old> <new>"; the member is <new>
        at = path.rfind(" " + prefix)
        path = path[at + 1 :] if at >= 0 else path
    member = path[len(prefix) :] if path.startswith(prefix) else None
    return _extract_error(member, reason, dest_dir)


class _NoTar(Exception):
    """The sandbox has no ``tar`` to run (exit status 127)."""


def _tar_extract_error(stderr: str, dest_dir: str) -> CrucibleError | None:
    """``_extract_error`` for GNU tar's complaint, e.g. ``tar: d/x: Cannot open: Not a
    directory`` (the first line that says which member)."""
    for line in stderr.splitlines():
        match = _GNU_TAR_FAILURE.match(line.strip())
        if match:
            return _extract_error(match["member"], match["reason"], dest_dir)
    return None


@dataclasses.dataclass(frozen=True)
class _ContainerMeta:
    """``user``: the template's user (default user of execs); ``tmpfs``: tmpfs mount paths."""

    user: str
    tmpfs: tuple[str, ...]
    graph: dict[str, Any] | None = None  # the engine's GraphDriver (fixed for a container's life)
    channel_dir: str | None = None  # the host directory mounted for its exec channel

    def on_tmpfs(self, path: str) -> bool:
        """True when ``path`` lies on one of the tmpfs mounts."""
        path = posixpath.normpath(path)
        return any(path == m or path.startswith(m.rstrip("/") + "/") for m in self.tmpfs)


class _DockerDemux:
    """Splits Docker's multiplexed attach stream (8-byte headers) into (stream, bytes)."""

    _HEADER = struct.Struct(">BxxxI")

    def __init__(self) -> None:
        self._buf = bytearray()
        self.raw_text = False  # the engine wrote unframed text (e.g. an OCI exec error)

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        """Append ``data``; return complete (stream, payload) pairs (1 stdout, 2 stderr)."""
        self._buf += data
        out = []
        while len(self._buf) >= self._HEADER.size and not self.raw_text:
            stream, length = self._HEADER.unpack_from(self._buf)
            if stream not in (0, 1, 2) or self._buf[1:4] != b"\0\0\0":
                self.raw_text = True
                break
            end = self._HEADER.size + length
            if len(self._buf) < end:
                break
            out.append((stream, bytes(self._buf[self._HEADER.size : end])))
            del self._buf[:end]
        return out

    def leftover(self) -> bytes:
        """Bytes not parsed as frames (all of them once ``raw_text`` is set)."""
        return bytes(self._buf)


class _ExecConnection:
    """The hijacked connection of one ``exec_start``: read (buffered), write, close."""

    def __init__(self, sock: Any) -> None:
        self._sock = sock
        self._raw = getattr(sock, "_sock", sock)
        response = getattr(sock, "_response", None)
        fp = getattr(getattr(getattr(response, "raw", None), "_fp", None), "fp", None)
        # Read through the HTTP response's buffer so no byte read along with the headers is lost.
        self._reader = fp if hasattr(fp, "read1") else None
        self._response = response

    def settimeout(self, timeout_s: float | None) -> None:
        self._raw.settimeout(timeout_s)

    def send(self, data: bytes) -> None:
        self._raw.sendall(data)

    def recv(self) -> bytes:
        if self._reader is not None:
            return self._reader.read1(65536)
        return self._raw.recv(65536)

    def close(self) -> None:
        for closer in (self._sock, self._raw, self._response):
            with contextlib.suppress(Exception):
                if closer is not None:
                    closer.close()


# ------------------------------------------------------------------------- the runtime


class DockerRuntime:
    """``SandboxRuntime`` on one Docker engine. Thread-safe; all methods block.

    ``builder_base_image`` is the image the supervisor is compiled in (needs apt and a
    Debian mirror); by default the first of ``DEFAULT_BUILDER_BASES`` that exists.
    ``kill_grace_ms``: SIGTERM-to-SIGKILL grace of an exec timeout, in milliseconds.
    ``api_timeout_s``: socket timeout of ordinary engine calls, in seconds.
    ``read_host_layers``: read overlay2 layers directly when this host can (``overlay``);
    False always asks the engine's API (as a control plane on another host must).
    ``channel_dir``: where sandboxes' exec channels are set up on this host (``channel``):
    each sandbox made here gets ``<channel_dir>/<sandbox_id>`` bind-mounted read-only while
    its supervisor connects (milliseconds), then requests go over that connection instead
    of ``docker exec`` (which stays the fallback). None: no channel
    (the engine must be on this host for one to work).
    """

    def __init__(
        self,
        *,
        client: docker.DockerClient | None = None,
        docker_host: str | None = None,
        builder_base_image: str | None = None,
        default_cap_add: Sequence[str] = DEFAULT_CAP_ADD,
        kill_grace_ms: int = DEFAULT_GRACE_MS,
        api_timeout_s: float = 120.0,
        read_host_layers: bool = True,
        channel_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        if client is None:
            # Every exec holds one connection while it runs: allow many at once.
            options = {"timeout": api_timeout_s, "max_pool_size": _MAX_CONNECTIONS}
            if docker_host:
                client = docker.DockerClient(base_url=docker_host, **options)
            else:
                client = docker.from_env(**options)
        self._client = client
        self._api = client.api
        self._builder_base_image = builder_base_image
        self._default_cap_add = tuple(default_cap_add)
        self._kill_grace_ms = kill_grace_ms
        self._read_host_layers = read_host_layers
        self._channel_dir = Path(channel_dir).resolve() if channel_dir is not None else None
        self._frozen: set[str] = set()  # containers this runtime froze (no channel to them)
        self._channels: dict[str, channel.ControlChannel] = {}  # by container id
        self._source_hash = supervisor_source_hash()
        self._ready = False
        self._ready_lock = threading.Lock()
        self._meta: dict[str, _ContainerMeta] = {}  # by container id
        self._meta_lock = threading.Lock()
        self._disk = diskwatch.DiskWatcher(on_over=self._stop_writers)
        # pids cgroup directory and its refused-fork counter as the last exec ended
        self._pids: dict[str, tuple[Path | None, int | None]] = {}

    @classmethod
    def from_settings(cls, settings: Any) -> DockerRuntime:
        """Build from ``service.config.Settings`` (``docker_host``, ``read_host_layers``,
        ``base_image``, ``image_prefix``: the supervisor builds in the base image, else
        ``<prefix>/base:latest``, else ``DEFAULT_BUILDER_BASES``)."""
        base = settings.base_image or f"{settings.image_prefix}/base:latest"
        local = not settings.docker_host or settings.docker_host.startswith("unix://")
        channels = settings.data_dir / "channels" if settings.exec_channel and local else None
        return cls(
            docker_host=settings.docker_host,
            builder_base_image=base,
            channel_dir=channels,
            read_host_layers=settings.read_host_layers,
        )

    @property
    def supervisor_volume(self) -> str:
        """Name of the read-only volume holding this version of ``crucible-exec``."""
        return f"crucible-supervisor-{self._source_hash}"

    # ------------------------------------------------------------------ engine, readiness

    def ping(self) -> bool:
        """True when the engine answers."""
        try:
            return bool(self._api.ping())
        except Exception:
            return False

    def ensure_ready(self) -> None:
        """Build ``crucible-exec`` (once per source hash) and fill its volume. Idempotent.

        Safe when several processes race: builds are tagged by hash and the binary lands in
        the volume by an atomic rename. Raises ``SandboxError`` when it cannot.
        """
        with self._ready_lock:
            if self._ready:
                return
            try:
                self._ensure_supervisor_volume()
            except CrucibleError:
                raise
            except Exception as e:
                raise _map_error(e, "preparing the exec supervisor") from e
            self._ready = True

    def _ensure_supervisor_volume(self) -> None:
        volume = self.supervisor_volume
        labels = {LABEL_ROLE: "supervisor", LABEL_SUPERVISOR: self._source_hash}
        self._client.volumes.create(name=volume, labels=labels)  # returns it if it exists
        expected = f"crucible-exec {self._source_hash}"
        if self._volume_version(volume) == expected:
            return
        image = self._ensure_builder_image()
        script = (
            "set -e; rm -rf /out/py /out/.py.new; cp -r /build/py /out/.py.new; "
            "chmod -R a+rX,go-w /out/.py.new; mv /out/.py.new /out/py; "
            't=$(mktemp /out/.crucible-exec.XXXXXX); cp /build/crucible-exec "$t"; '
            'chmod 0755 "$t"; mv -f "$t" /out/crucible-exec'
        )
        mount = Mount(target="/out", source=volume, type="volume")
        self._run_helper(image, ["/bin/sh", "-c", script], mount)
        found = self._volume_version(volume)
        if found != expected:
            raise SandboxError(f"supervisor volume {volume} holds {found!r}, expected {expected!r}")

    def _volume_version(self, volume: str) -> str | None:
        """What ``crucible-exec --version`` in the volume prints (None when it cannot run)."""
        mount = Mount(target=SUPERVISOR_MOUNT, source=volume, type="volume", read_only=True)
        image = self._builder_base()
        try:
            return self._run_helper(image, [SUPERVISOR_PATH, "--version"], mount).strip()
        except SandboxError:
            return None

    def _run_helper(self, image: str, entrypoint: list[str], mount: Mount) -> str:
        """Run a short-lived labelled helper container; return its output or raise."""
        try:
            container = self._client.containers.create(
                image,
                entrypoint=entrypoint,
                command=[],
                mounts=[mount],
                network_mode="none",
                labels={LABEL_ROLE: "supervisor-helper"},
            )
        except docker.errors.APIError as e:
            raise SandboxError(f"helper container on {image}: {_explain(e)}") from e
        try:
            container.start()
            status = container.wait(timeout=120)
            output = container.logs(stdout=True, stderr=True).decode("utf-8", "replace")
        except docker.errors.APIError as e:
            raise SandboxError(f"helper container on {image}: {_explain(e)}") from e
        finally:
            with contextlib.suppress(docker.errors.APIError):
                container.remove(force=True)
        if status.get("StatusCode") != 0:
            raise SandboxError(f"helper container {entrypoint!r} failed: {output[-2000:]}")
        return output

    def _builder_base(self) -> str:
        candidates = [self._builder_base_image] if self._builder_base_image else []
        candidates += DEFAULT_BUILDER_BASES
        for image in candidates:
            with contextlib.suppress(docker.errors.ImageNotFound):
                self._api.inspect_image(image)
                return image
        raise SandboxError(
            f"no image to build the exec supervisor in (tried {', '.join(candidates)}); "
            "build the base image first (`crucible images build`)"
        )

    def _ensure_builder_image(self) -> str:
        tag = f"{SUPERVISOR_BUILD_REPOSITORY}:{self._source_hash}"
        with contextlib.suppress(docker.errors.ImageNotFound):
            self._api.inspect_image(tag)
            return tag
        try:
            self._client.images.build(
                path=str(SUPERVISOR_DIR),
                tag=tag,
                buildargs={
                    "BASE_IMAGE": self._builder_base(),
                    "CRUCIBLE_EXEC_VERSION": self._source_hash,
                },
                labels={LABEL_ROLE: "supervisor-build", LABEL_SUPERVISOR: self._source_hash},
                rm=True,
                forcerm=True,
                pull=False,
                timeout=_BUILD_TIMEOUT_S,
            )
        except docker.errors.BuildError as e:
            log = "".join(str(chunk.get("stream", chunk.get("error", ""))) for chunk in e.build_log)
            raise SandboxError(f"building the exec supervisor failed: {e}\n{log[-3000:]}") from e
        return tag

    # ------------------------------------------------------------------------- lifecycle

    def create(self, spec: SandboxSpec) -> str:
        """Create and start a container for ``spec``; return its engine id.

        Runs ``ensure_ready`` first if needed. Raises ``NotFound`` for a missing image,
        ``SandboxError`` otherwise (a half-made container is removed).
        """
        self.ensure_ready()
        kwargs = self._create_kwargs(spec)
        listener = self._listener(spec.deployment, spec.sandbox_id)
        if listener is not None:
            kwargs["entrypoint"] += ["--connect", channel.socket_path_in_sandbox()]
            kwargs["mounts"].append(
                Mount(
                    target=channel.CHANNEL_MOUNT,
                    source=str(listener.directory),
                    type="bind",
                    read_only=True,
                )
            )
        try:
            try:
                container = self._client.containers.create(spec.image, **kwargs)
            except Exception as e:
                if listener is not None:
                    listener.discard()
                    if "bind source path does not exist" in str(e):
                        # The engine does not see this host's files (a control plane in a
                        # container of its own): no channels for this runtime.
                        log.warning("no exec channels: the engine cannot see %s", self._channel_dir)
                        self._channel_dir = None
                        return self.create(spec)
                raise _map_error(e, f"creating sandbox {spec.sandbox_id} from {spec.image}") from e
            meta = _ContainerMeta(
                user=spec.user,
                tmpfs=tuple(spec.tmpfs),
                graph=container.attrs.get("GraphDriver"),
                channel_dir=str(listener.directory) if listener is not None else None,
            )
            self._remember(container.id, meta)
            if spec.disk_bytes is not None:
                self._watch_disk(container.id, meta.graph, spec.disk_bytes)
            try:
                container.start()
                if listener is not None:
                    self._connect_channel(listener, container.id)
                if spec.user not in _ROOT_USERS:
                    self._own_workdir(container.id, spec)
            except Exception as e:
                self.destroy(container.id)
                if isinstance(e, CrucibleError):
                    raise
                raise _map_error(e, f"starting sandbox {spec.sandbox_id}") from e
        finally:
            if listener is not None:
                listener.close()
        return container.id

    def _remove_channel_dir(self, path: str) -> None:
        """Remove a sandbox's channel directory, only ever one under ``channel_dir``."""
        assert self._channel_dir is not None
        target = Path(path)
        if target.parent.parent == self._channel_dir:
            shutil.rmtree(target, ignore_errors=True)

    def prune_host_state(self, *, deployment: str, live_sandbox_ids: set[str]) -> int:
        """Remove this deployment's exec channel directories whose sandbox is not in
        ``live_sandbox_ids`` (its container went while no control plane ran, or a start
        was cut short); return how many."""
        if self._channel_dir is None:
            return 0
        removed = 0
        with contextlib.suppress(OSError):
            for entry in os.scandir(self._channel_dir / deployment):
                if entry.name not in live_sandbox_ids and entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path, ignore_errors=True)
                    removed += 1
        return removed

    def _listener(self, deployment: str, sandbox_id: str) -> channel.Listener | None:
        """The host side of a new sandbox's channel (None: no channel, ``docker exec``)."""
        if self._channel_dir is None:
            return None
        try:
            return channel.Listener(self._channel_dir / deployment, sandbox_id)
        except OSError as e:
            log.warning("no exec channel for %s: %s", sandbox_id, e)
            return None

    def _connect_channel(self, listener: channel.Listener, container_id: str) -> None:
        try:
            control = listener.accept(container_id)
        except channel.Unavailable as e:
            log.warning("no exec channel: %s", e)
            return
        with self._meta_lock:
            self._channels[container_id] = control

    def _watch_disk(self, container_id: str, graph: dict | None, limit_bytes: int) -> None:
        """Hold the container's writable layer to ``limit_bytes`` (``diskwatch``) where this
        host sees it; elsewhere only ``RLIMIT_FSIZE`` holds."""
        found = overlay.layers(graph) if graph and self._read_host_layers else None
        if found is None or not os.path.isdir(found[0]):
            log.info(
                "container %s: writable layer not visible here; disk budget by RLIMIT_FSIZE only",
                container_id,
            )
            return
        self._disk.watch(container_id, upper=found[0], limit_bytes=limit_bytes)

    def _stop_writers(self, container_id: str) -> None:
        """Kill the sandbox's processes other than init and the supervisor, with the
        container frozen so nothing forks meanwhile (the disk watcher's action)."""
        try:
            init_pid = int(self._api.inspect_container(container_id)["State"]["Pid"] or 0)
        except docker.errors.NotFound:
            self._disk.forget(container_id)
            return
        if init_pid <= 0 or container_id in self._frozen:
            return  # stopped, or frozen for verification: nothing writes
        self._api.pause(container_id)
        try:
            cgroups.kill_agent_processes(init_pid, budget_s=0)
        finally:
            self._api.unpause(container_id)
        cgroups.kill_agent_processes(init_pid)

    def _create_kwargs(self, spec: SandboxSpec) -> dict[str, Any]:
        labels = {
            **spec.extra_labels,
            LABEL_SANDBOX_ID: spec.sandbox_id,
            LABEL_TEMPLATE: spec.template,
            LABEL_DEPLOYMENT: spec.deployment,
            LABEL_SUPERVISOR: self._source_hash,
            LABEL_USER: spec.user,
        }
        ulimits = [Ulimit(name="nofile", soft=spec.nofile, hard=spec.nofile)]
        if spec.disk_bytes is not None:
            labels[LABEL_DISK] = str(spec.disk_bytes)
            ulimits.append(Ulimit(name="fsize", soft=spec.disk_bytes, hard=spec.disk_bytes))
        supervisor = Mount(
            target=SUPERVISOR_MOUNT,
            source=self.supervisor_volume,
            type="volume",
            read_only=True,
            no_copy=True,
        )
        tmpfs = {
            path: f"rw,nosuid,nodev,exec,size={size},mode=1777" for path, size in spec.tmpfs.items()
        }
        return {
            "entrypoint": [SUPERVISOR_PATH, "--idle"],
            "command": [],
            "init": True,
            "labels": labels,
            "nano_cpus": int(spec.cpus * 1e9),
            "mem_limit": spec.memory_bytes,
            "memswap_limit": spec.memory_bytes,
            "pids_limit": spec.pids_limit,
            "ulimits": ulimits,
            "network_mode": "bridge" if spec.network == "bridge" else "none",
            "cap_drop": ["ALL"],
            "cap_add": sorted({*self._default_cap_add, *spec.cap_add}),
            "security_opt": ["no-new-privileges"],
            "working_dir": spec.workdir,
            # The container runs as root and execs switch to the template's user: the engine
            # gives no capabilities to root execs of a container configured as non-root.
            "user": "0:0",
            "environment": dict(spec.env),
            "tmpfs": tmpfs,
            "mounts": [supervisor],
            "detach": True,
        }

    def _own_workdir(self, container_id: str, spec: SandboxSpec) -> None:
        """Give a non-root template user its workdir (the engine creates it root-owned)."""
        record = encode_mkdir(spec.workdir, owner=spec.user)
        for frame in self._supervise(container_id, record, user="0", read_timeout_s=60.0):
            if frame.kind == FRAME_ERROR:
                raise_for_error(frame)

    def destroy(self, container_id: str) -> None:
        """Kill and remove the container and its anonymous volumes (missing is fine); close
        its exec channel."""
        meta = self._container_meta(container_id) if self._channel_dir is not None else None
        with self._meta_lock:
            self._meta.pop(container_id, None)
            control = self._channels.pop(container_id, None)
        self._frozen.discard(container_id)
        self._disk.forget(container_id)
        with self._meta_lock:
            self._pids.pop(container_id, None)
        if control is not None:
            control.close()
        if meta is not None and meta.channel_dir:
            self._remove_channel_dir(meta.channel_dir)
        try:
            self._api.remove_container(container_id, force=True, v=True)
        except docker.errors.NotFound:
            return
        except docker.errors.APIError as e:
            if e.status_code == 409 and "already in progress" in _explain(e):
                return
            raise _map_error(e, f"destroying container {container_id}") from e
        except Exception as e:
            raise _map_error(e, f"destroying container {container_id}") from e

    def list(self, *, deployment: str) -> list[ContainerInfo]:
        """All containers (any state) labelled with this deployment."""
        try:
            rows = self._api.containers(
                all=True, filters={"label": f"{LABEL_DEPLOYMENT}={deployment}"}
            )
        except Exception as e:
            raise _map_error(e, f"listing deployment {deployment}") from e
        infos = [self._info(row) for row in rows]
        for info in infos:  # adopted after a restart: watch their disk budgets again
            if LABEL_DISK in info.labels and not self._disk.watching(info.container_id):
                with contextlib.suppress(CrucibleError):
                    self._container_meta(info.container_id)
        return infos

    @staticmethod
    def _info(row: dict[str, Any]) -> ContainerInfo:
        labels = row.get("Labels") or {}
        return ContainerInfo(
            container_id=row["Id"],
            sandbox_id=labels.get(LABEL_SANDBOX_ID),
            template=labels.get(LABEL_TEMPLATE),
            deployment=labels.get(LABEL_DEPLOYMENT),
            status=row.get("State", ""),
            labels=labels,
        )

    def disk_usage_bytes(self, container_id: str) -> int:
        """Size of the container's writable layer in bytes (the engine walks it: not cheap)."""
        try:
            rows = self._api.containers(all=True, size=True, filters={"id": container_id})
        except Exception as e:
            raise _map_error(e, f"container {container_id}") from e
        if not rows:
            raise NotFound(f"container {container_id}: not found")
        return int(rows[0].get("SizeRw") or 0)

    # ------------------------------------------------------------------------------ exec

    def exec(self, container_id: str, request: ExecRequest) -> ExecResult:
        """Run ``request`` to completion (or timeout); see ``service.runtime.protocol``.

        Raises ``InvalidRequest`` (bad request, missing ``cwd``), ``NotFound`` (container
        gone) or ``SandboxError`` (container not running, supervisor failure).
        """
        result = None
        for item in self.exec_stream(container_id, request):
            if isinstance(item, ExecResult):
                result = item
        if result is None:  # cannot happen: exec_stream raises when no result arrives
            raise SandboxError(f"exec in container {container_id} ended without a result")
        return result

    async def exec_async(self, container_id: str, request: ExecRequest) -> ExecResult:
        """``exec`` for an event loop: the channel's I/O awaited on the loop, no thread in
        the common case (``service.runtime.docker_async``). Same results and errors."""
        from service.runtime.docker_async import exec_async

        return await exec_async(self, container_id, request)

    def exec_stream(self, container_id: str, request: ExecRequest) -> _DockerExecStream:
        """Run ``request``: an ``ExecStream`` of output chunks, then exactly one ``ExecResult``.

        Chunks of the head of each stream come live; when a stream exceeds
        ``max_output_bytes`` its kept tail comes as chunks just before the result. Per
        stream the chunks add up to the result's ``stdout``/``stderr``. Closing the
        stream early, calling its ``cancel`` from any thread, or losing the supervisor stops
        the command: its process group gets SIGTERM, then SIGKILL after the grace.

        The command starts before this returns, so a bad request or a gone container
        raises here (``InvalidRequest``, ``NotFound``, ``SandboxError``), not at the first
        ``next``. When it cannot start because the sandbox's own processes hold every pid
        of its limit (a fork bomb left running), those processes are killed (host-side, the
        container frozen meanwhile) and the command starts once more; its result then says
        ``pids_limit_hit``. Where that cannot be done, ``Conflict`` says why.
        """
        record = encode_exec(request, grace_ms=self._kill_grace_ms)
        read_timeout_s = request.timeout_s + self._kill_grace_ms / 1000 + _READ_MARGIN_S

        max_reply_bytes = 2 * request.max_output_bytes + 2 * request.observe_bytes + (1 << 20)

        def start() -> Iterator[Frame]:
            frames = self._supervise(
                container_id,
                record,
                user=request.user or self._container_meta(container_id).user,
                read_timeout_s=read_timeout_s,
                max_reply_bytes=max_reply_bytes,
            )
            return _first_read(frames)

        disk_hits = self._disk.hits(container_id)
        with self._meta_lock:
            baseline = container_id not in self._pids
        if baseline:  # a container this runtime has not seen exec yet (made or adopted)
            self._pids_refused(container_id)
        reclaimed = False
        try:
            frames = start()
        except (NotFound, Conflict, InvalidRequest):
            raise
        except HandlerLost as e:  # before the first frame: the stream's result says so
            frames = _raise_when_read(e)
        except SandboxError as e:
            if not self._reclaim_pids(container_id):
                stopped = self._stopped_or(container_id, e)
                if stopped is e:
                    raise
                raise stopped from e
            reclaimed = True
            frames = start()
        return _DockerExecStream(
            self, container_id, request, frames, pids_reclaimed=reclaimed, disk_hits=disk_hits
        )

    def _stopped_or(self, container_id: str, error: SandboxError) -> SandboxError:
        """``SandboxStopped`` when the engine says the container is not running (an exec
        the engine could not start because the container was stopping), else ``error``."""
        try:
            running = self._api.inspect_container(container_id)["State"].get("Running")
        except Exception:
            return error
        if running:
            return error
        return SandboxStopped(f"exec in container {container_id}: the container is not running")

    def _lost_result(
        self, container_id: str, collector: ExecCollector, started: float, cause: HandlerLost
    ) -> ExecResult:
        """The ``handler_lost`` result of a command whose handler ended without one
        (``cause``), once the engine says the container still runs; ``started``: the
        command's ``time.monotonic()``.

        Raises ``SandboxStopped`` (the container stopped meanwhile), ``NotFound`` (it is
        gone), or ``cause`` when the engine cannot say (its failure, not the sandbox's).
        """
        try:
            state = self._api.inspect_container(container_id)["State"]
        except docker.errors.NotFound as e:
            raise NotFound(f"container {container_id}: not found") from e
        except Exception:
            raise cause from None
        if not state.get("Running"):
            raise SandboxStopped(
                f"exec in container {container_id}: the container stopped while it ran"
            ) from cause
        log.info("container %s: %s; the command counts as killed", container_id, cause.detail)
        if collector.pid is not None:  # a stopped handler's command may still run: end it
            self._cancel(container_id, collector.pid, user=None)
        return collector.lost((time.monotonic() - started) * 1000)

    def _finish(
        self,
        container_id: str,
        result: ExecResult,
        *,
        oom_known: bool,
        pids_reclaimed: bool,
        disk_hits: int,
    ) -> ExecResult:
        """The supervisor's result with what only the host knows: the engine's OOM flag
        where the sandbox could not read its counter, a fork bomb reclaimed before the
        start, the disk watcher's kills while it ran, a file stopped at the budget
        (``RLIMIT_FSIZE``: SIGXFSZ, also as a shell's exit status 128+25)."""
        result = self._with_oom_fallback(container_id, result, oom_known)
        refused = self._pids_refused(container_id)  # always: it moves the baseline on
        return dataclasses.replace(
            result,
            pids_limit_hit=result.pids_limit_hit or pids_reclaimed or refused,
            disk_limit_hit=self._disk.hits(container_id) > disk_hits
            or signal.SIGXFSZ in (result.signal, result.exit_code - 128),
        )

    def _pids_refused(self, container_id: str) -> bool:
        """True when the sandbox refused a fork at its pids limit since this was last asked
        (a bomb a finished exec left in the background counts in the next exec's result).
        Host-side; False where the cgroup is not visible here."""
        with self._meta_lock:
            known = self._pids.get(container_id)
        if known is None:
            try:
                init_pid = int(self._api.inspect_container(container_id)["State"]["Pid"] or 0)
            except Exception:
                init_pid = 0
            known = (cgroups.pids_dir(init_pid) if init_pid > 0 else None, None)
        directory, before = known
        now = cgroups.pids_max_events(directory) if directory is not None else None
        with self._meta_lock:
            if len(self._pids) > 10_000:
                self._pids.clear()
            self._pids[container_id] = (directory, now)
        return before is not None and now is not None and now > before

    def _reclaim_pids(self, container_id: str) -> bool:
        """When the sandbox's processes hold every pid of its limit, kill them (not init nor
        the supervisor: ``service.runtime.cgroups``) with the container frozen, so nothing
        forks meanwhile; True when that was done. False when the limit is not what stops
        execs. Raises ``Conflict`` when the pids are exhausted and this host cannot reach
        the sandbox's processes."""
        try:
            init_pid = int(self._api.inspect_container(container_id)["State"]["Pid"] or 0)
        except Exception:
            return False
        state = cgroups.pids_state(init_pid) if init_pid > 0 else None
        if state is not None and not state.exhausted and self._pids_refused(container_id):
            state = cgroups.PidsState(current=state.limit or 0, limit=state.limit)  # it was
        if state is None:
            state = self._engine_pids_state(container_id)
            if state is not None and state.exhausted:
                raise Conflict(
                    f"sandbox container {container_id}: its processes hold all {state.limit} "
                    "pids of its limit (a fork bomb?) and this host cannot stop them; release it"
                )
            return False
        if not state.exhausted:
            return False
        log.warning(
            "container %s: pids limit %s exhausted; killing its processes",
            container_id,
            state.limit,
        )
        try:
            self._api.pause(container_id)
        except Exception as e:
            raise _map_error(e, f"freezing container {container_id}") from e
        try:
            first = cgroups.kill_agent_processes(init_pid, budget_s=0)
        finally:
            with contextlib.suppress(Exception):
                self._api.unpause(container_id)
        if first is None:
            return False
        cgroups.kill_agent_processes(init_pid)
        return True

    def _engine_pids_state(self, container_id: str) -> cgroups.PidsState | None:
        """``pids.current`` / ``pids.max`` as the engine's stats report them, or None."""
        try:
            stats = self._api.stats(container_id, stream=False, one_shot=True)
            pids = stats.get("pids_stats") or {}
            return cgroups.PidsState(current=int(pids["current"]), limit=int(pids["limit"]))
        except Exception:
            return None

    def _cancel(self, container_id: str, pgid: int, *, user: str | None) -> None:
        """Best effort: stop an exec's process group whose caller went away (SIGTERM, the
        grace, then SIGKILL until gone)."""
        record = encode_kill(pgid, grace_ms=self._kill_grace_ms)
        user = user or self._container_meta(container_id).user
        with contextlib.suppress(CrucibleError):
            for _ in self._supervise(container_id, record, user=user, read_timeout_s=30.0):
                pass

    def _container_meta(self, container_id: str) -> _ContainerMeta:
        """What execs and file calls need to know of a container, cached per runtime.

        An unknown container gives empty metadata (its exec then reports NotFound).
        """
        with self._meta_lock:
            meta = self._meta.get(container_id)
        if meta is not None:
            return meta
        try:
            info = self._api.inspect_container(container_id)
        except docker.errors.NotFound:
            return _ContainerMeta(user="", tmpfs=())
        except Exception as e:
            raise _map_error(e, f"container {container_id}") from e
        labels = info["Config"].get("Labels") or {}
        tmpfs = tuple((info["HostConfig"].get("Tmpfs") or {}).keys())
        channel_dir = next(
            (
                m.get("Source")
                for m in info.get("Mounts") or []
                if m.get("Destination") == channel.CHANNEL_MOUNT
            ),
            None,
        )
        meta = _ContainerMeta(
            user=labels.get(LABEL_USER, ""),
            tmpfs=tmpfs,
            graph=info.get("GraphDriver"),
            channel_dir=channel_dir,
        )
        self._remember(container_id, meta)
        with contextlib.suppress(ValueError):
            if LABEL_DISK in labels and not self._disk.watching(container_id):
                self._watch_disk(container_id, meta.graph, int(labels[LABEL_DISK]))
        return meta

    def _remember(self, container_id: str, meta: _ContainerMeta) -> None:
        with self._meta_lock:
            if len(self._meta) > 10_000:
                self._meta.clear()
            self._meta[container_id] = meta

    def _with_oom_fallback(self, container_id: str, result: ExecResult, known: bool) -> ExecResult:
        """Where the sandbox cannot read its OOM counter, use the engine's sticky flag."""
        if known or result.exit_code != 137:
            return result
        try:
            state = self._api.inspect_container(container_id)["State"]
        except Exception:
            return result
        return dataclasses.replace(result, oom_killed=bool(state.get("OOMKilled")))

    def resolve_path(self, container_id: str, path: str, *, create_parents: bool = False) -> str:
        """Resolve absolute ``path`` inside the container (symlinks of the existing prefix
        followed, the missing rest appended, like ``realpath -m``); with ``create_parents``
        also ``mkdir -p`` the resolved path's parent, as the template's user.

        Raises ``InvalidRequest`` (field ``path``) for a relative or unresolvable path.
        """
        record = encode_resolve(path, create_parents=create_parents)
        resolved = None
        user = self._container_meta(container_id).user
        for frame in self._supervise(container_id, record, user=user, read_timeout_s=60.0):
            if frame.kind == FRAME_ERROR:
                raise_for_error(frame)
            if frame.kind == FRAME_PATH:
                resolved = os.fsdecode(frame.payload)
        if resolved is None:
            raise SandboxError(f"exec supervisor resolved no path for {path!r}")
        return resolved

    def keeper_channel(self, container_id: str) -> tuple[channel.ControlChannel, str]:
        """The channel to ``container_id``'s supervisor and the identity its commands take,
        for kept processes (``service.runtime.keeper``). ``Conflict`` when the sandbox is
        frozen or has no channel (``docker exec`` cannot keep a process)."""
        what = f"container {container_id}"
        if container_id in self._frozen:
            raise Conflict(f"{what}: the sandbox is frozen (its episode is being verified)")
        with self._meta_lock:
            control = self._channels.get(container_id)
        if control is None:
            raise Conflict(
                f"{what}: background processes and sessions need the exec channel, which "
                "this sandbox does not have (made without one, or adopted after a restart)"
            )
        return control, self._container_meta(container_id).user or ""

    def _supervise(
        self,
        container_id: str,
        record: bytes,
        *,
        user: str | None,
        read_timeout_s: float,
        max_reply_bytes: int = 1 << 20,
    ) -> Iterator[Frame]:
        """Start the supervisor on ``record`` now (errors raise here); return an iterator
        of its frames up to the final R or X frame. ``read_timeout_s``: the longest silence
        tolerated on a ``docker exec`` connection, the whole reply's bound on the channel,
        in seconds; ``max_reply_bytes`` bounds a channel reply's size.
        """
        what = f"exec in container {container_id}"
        if container_id in self._frozen:  # what the engine answers a docker exec, at once
            raise Conflict(f"{what}: the sandbox is frozen (its episode is being verified)")
        with self._meta_lock:
            control = self._channels.get(container_id)
        if control is not None:
            try:
                frames = self._over_channel(
                    control,
                    with_identity(record, user or ""),
                    read_timeout_s=read_timeout_s,
                    max_reply_bytes=max_reply_bytes,
                    what=what,
                )
            except channel.Unavailable as e:
                log.warning("%s: docker exec from now on: %s", what, e)
                with self._meta_lock:
                    self._channels.pop(container_id, None)
                control.close()
            else:
                return frames
        args, stdin = supervisor_args(record)
        try:
            exec_id = self._api.exec_create(
                container_id,
                [SUPERVISOR_PATH, *args],
                stdout=True,
                stderr=True,
                stdin=stdin is not None,
                user=user or "",
            )["Id"]
            conn = _ExecConnection(self._api.exec_start(exec_id, socket=True))
        except Exception as e:
            raise _map_error(e, what) from e
        try:
            conn.settimeout(read_timeout_s)
            if stdin is not None:
                conn.send(stdin)
        except OSError as e:
            conn.close()
            raise SandboxError(f"{what}: sending the request to the supervisor failed: {e}") from e
        return self._frames(conn, exec_id, what)

    @staticmethod
    def _over_channel(
        control: channel.ControlChannel,
        record: bytes,
        *,
        read_timeout_s: float,
        max_reply_bytes: int,
        what: str,
    ) -> Iterator[Frame]:
        """The request on the channel; its first frame is read here. ``Unavailable`` when
        the handler could not start anything (no handler, or an ``internal``/``spawn`` error
        before any process: the agent can lower the idle supervisor's limits, which its
        handlers inherit), so ``docker exec``, with the container's own limits, serves it."""
        sock = control.open()
        frames = channel.frames(
            sock, record, read_timeout_s=read_timeout_s, max_bytes=max_reply_bytes, what=what
        )
        first = next(frames)
        if first.kind == FRAME_ERROR:
            kind = first.payload.split(b"\n", 1)[0]
            if kind in (b"internal", b"spawn"):
                frames.close()
                message = first.payload.decode("utf-8", "replace").replace("\n", ": ")
                raise channel.Unavailable(f"the handler could not start: {message}")

        def rest() -> Iterator[Frame]:
            yield first
            yield from frames

        return rest()

    def _frames(self, conn: _ExecConnection, exec_id: str, what: str) -> Iterator[Frame]:
        try:
            yield from self._read_frames(conn, exec_id, what)
        except (OSError, requests.exceptions.RequestException) as e:
            # after the request: its handler stopped (SIGSTOP: the read timed out) or died
            raise HandlerLost(f"{what}: connection to the exec supervisor failed: {e}") from e
        finally:
            conn.close()

    def _read_frames(self, conn: _ExecConnection, exec_id: str, what: str) -> Iterator[Frame]:
        demux, decoder, diag = _DockerDemux(), FrameDecoder(), bytearray()
        while data := conn.recv():
            for stream, payload in demux.feed(data):
                if stream != 1:
                    diag += payload[: max(0, _DIAG_BYTES - len(diag))]
                    continue
                try:
                    frames = decoder.feed(payload)
                except SandboxError as e:  # the engine, not the supervisor, wrote this
                    raise _engine_exec_error(payload, what) from e
                for frame in frames:
                    yield frame
                    if frame.kind in (FRAME_RESULT, FRAME_ERROR):
                        return
            if demux.raw_text:
                diag += demux.leftover()[:_DIAG_BYTES]
                break
        raise HandlerLost(
            f"{what}: the exec supervisor ended without a result ({self._exit_note(exec_id, diag)})"
        )

    def _exit_note(self, exec_id: str, diag: bytes) -> str:
        try:
            code = self._api.exec_inspect(exec_id).get("ExitCode")
        except Exception:
            code = None
        text = bytes(diag).decode("utf-8", "replace").strip()
        return f"exit code {code}" + (f": {text[-2000:]}" if text else "")

    # ---------------------------------------------------------------- files and images

    def put_archive(
        self,
        container_id: str,
        dest_dir: str,
        tar_bytes: bytes | BinaryIO,
        *,
        pristine_tar: bool = False,
    ) -> None:
        """Extract a tar (validated by the caller; bytes or a readable binary file) into
        existing ``dest_dir``.

        ``pristine_tar`` (a container only Crucible has touched, whose ``tar`` is the
        image's: the verifier's sandbox; never an agent's, whose ``tar`` the agent may have
        replaced): the sandbox's GNU tar extracts it as root, numeric owners as the
        engine's untar keeps them, through the exec channel: one channel round trip
        instead of the engine's chrooted untar (about 90 ms here, the largest part of a
        terminal verification's replay). An image without ``tar`` falls back to the engine.

        Raises ``NotFound`` when the container or ``dest_dir`` is missing (the message
        says which); ``InvalidRequest`` or ``Conflict`` when the sandbox's filesystem
        refuses what the tar asks (a read-only mount, a member through a dangling symlink
        or a file, a name too long: field ``tar:<member>`` when the engine names it, else
        ``path``); ``SandboxError`` otherwise. The engine's archive API does not see tmpfs
        mounts, so there the tar is extracted by ``tar -x`` in the sandbox (as root, like
        the engine; the image needs ``tar``).
        """
        on_tmpfs = self._container_meta(container_id).on_tmpfs(dest_dir)
        if on_tmpfs or (pristine_tar and self._channel_dir is not None):
            data = tar_bytes if isinstance(tar_bytes, bytes) else tar_bytes.read()
            args = ["-x", "-f", "-", "-C", dest_dir]
            if not on_tmpfs:  # times are the archive's to keep: no warning per member
                args += ["--numeric-owner", "--warning=no-timestamp"]
            try:
                self._tar_in_sandbox(container_id, args, data, extract_into=dest_dir)
                return
            except _NoTar:
                if on_tmpfs:
                    raise SandboxError(
                        f"container {container_id} has no tar to extract onto its tmpfs"
                    ) from None
                tar_bytes = data  # the image has no tar: the engine extracts it
        try:
            ok = self._api.put_archive(container_id, dest_dir, tar_bytes)
        except Exception as e:
            raise self._map_put_error(e, container_id, dest_dir) from e
        if not ok:
            raise SandboxError(f"extracting into {dest_dir} of container {container_id} failed")

    def stat_path(self, container_id: str, path: str) -> PathStat | None:
        """What absolute ``path`` is (``lstat``: a final symlink is not followed), or None
        when it does not exist.

        One ``HEAD /containers/{id}/archive`` to the engine, no exec. On a tmpfs mount
        (invisible to the engine's archive API) a shell test in the sandbox answers, and
        only ``kind`` is known. A missing container reads as a missing path (the call that
        follows reports it); an unreachable engine raises ``SandboxError``.
        """
        if self._container_meta(container_id).on_tmpfs(path):
            return self._stat_in_sandbox(container_id, path)
        what = f"container {container_id}, stat of {path}"
        try:
            url = self._api._url("/containers/{0}/archive", container_id)
            response = self._api.head(url, params={"path": path}, timeout=self._api.timeout)
        except Exception as e:
            raise _map_error(e, what) from e
        header = response.headers.get("X-Docker-Container-Path-Stat")
        if response.status_code != 200 or not header:
            return None
        try:
            return _path_stat(docker.utils.decode_json_header(header))
        except (ValueError, TypeError) as e:
            raise SandboxError(f"{what}: unreadable answer from the engine: {e}") from e

    def _stat_in_sandbox(self, container_id: str, path: str) -> PathStat | None:
        script = (
            'if [ -L "$1" ]; then echo symlink; elif [ -d "$1" ]; then echo dir; '
            'elif [ -f "$1" ]; then echo file; elif [ -e "$1" ]; then echo other; fi'
        )
        request = ExecRequest(cmd=["/bin/sh", "-c", script, "sh", path], user=ROOT, timeout_s=30)
        kind = self.exec(container_id, request).stdout.decode("utf-8", "replace").strip()
        if kind not in ("file", "dir", "symlink", "other"):
            return None
        return PathStat(kind=kind)

    def get_archive(self, container_id: str, path: str) -> Iterator[bytes]:
        """A tar of ``path`` from the container, streamed in chunks (errors raise at call).

        On a tmpfs mount (invisible to the engine's archive API) the tar is made by
        ``tar -c`` in the sandbox and returned in one chunk.
        """
        if self._container_meta(container_id).on_tmpfs(path):
            parent, name = posixpath.split(posixpath.normpath(path))
            return iter([self._tar_in_sandbox(container_id, ["-c", "-f", "-", "-C", parent, name])])
        try:
            stream, _stat = self._api.get_archive(container_id, path, chunk_size=1 << 16)
        except Exception as e:
            raise self._map_path_error(e, container_id, path) from e
        return self._guard_stream(stream, f"reading {path} from container {container_id}")

    def _tar_in_sandbox(
        self,
        container_id: str,
        args: list[str],
        stdin: bytes = b"",
        *,
        extract_into: str | None = None,
    ) -> bytes:
        """Run ``tar args`` as root in the sandbox; return its stdout (the whole of it).

        ``extract_into``: the directory an extraction writes to, so that a member the
        filesystem refuses becomes the client's error (see ``put_archive``).
        """
        request = ExecRequest(
            cmd=["tar", *args],
            stdin=stdin,
            user=ROOT,
            timeout_s=600,
            max_output_bytes=_TAR_MAX_BYTES,
        )
        result = self.exec(container_id, request)
        if result.exit_code == 0 and not result.stdout_truncated:
            return result.stdout
        if result.exit_code == 127:
            raise _NoTar(container_id)
        said = result.stderr.decode("utf-8", "replace").strip()
        message = said[-2000:]
        if extract_into is not None:
            # the first failure, wherever it is (a trial hid it behind 2 KB of warnings
            # about later members, and the verdict became an error instead of a 0)
            mapped = _tar_extract_error(said, extract_into)
            if mapped is not None:
                raise mapped
        elif "No such file or directory" in message:
            raise NotFound(f"no such file or directory in the sandbox: {message}", field="path")
        raise SandboxError(
            f"tar {' '.join(args[:1])} in container {container_id} failed: {message}"
        )

    @staticmethod
    def _guard_stream(stream: Iterator[bytes], what: str) -> Iterator[bytes]:
        try:
            yield from stream
        except Exception as e:
            raise _map_error(e, what) from e

    @classmethod
    def _map_put_error(cls, e: Exception, container_id: str, dest_dir: str) -> CrucibleError:
        """``_map_path_error``, but the filesystem refusing the archive's content is the
        client's error (``_engine_extract_error``), not the engine's."""
        if isinstance(e, docker.errors.APIError) and not isinstance(e, docker.errors.NotFound):
            mapped = _engine_extract_error(_explain(e), dest_dir)
            if mapped is not None:
                return mapped
        return cls._map_path_error(e, container_id, dest_dir)

    @staticmethod
    def _map_path_error(e: Exception, container_id: str, path: str) -> CrucibleError:
        if isinstance(e, docker.errors.NotFound) and "no such container" not in _explain(e).lower():
            return NotFound(f"{path}: no such file or directory in the sandbox", field="path")
        if isinstance(e, docker.errors.APIError) and "not a directory" in _explain(e).lower():
            # a parent of the path is a file: the path is not there (the engine's 500 named
            # the host's storage path: a fourth trial)
            return NotFound(f"{path}: a parent is not a directory in the sandbox", field="path")
        if isinstance(e, docker.errors.APIError) and "too many links" in _explain(e).lower():
            # A symlink loop the sandbox's own agent made (a fuzzing trial: a 502 whose
            # detail showed the host's storage path): the client's, like an upload's.
            return InvalidRequest(
                f"{path}: too many levels of symbolic links in the sandbox", field="path"
            )
        return _map_error(e, f"container {container_id}, path {path}")

    def host_cpus(self) -> int:
        """The CPUs of the engine's host (``NCPU`` of ``GET /info``, asked once): the most a
        container may be given.

        Raises:
            SandboxError: the engine did not answer.
        """
        known = getattr(self, "_host_cpus", None)
        if known is None:
            try:
                known = self._host_cpus = int(self._api.info()["NCPU"])
            except Exception as e:
                raise _map_error(e, "asking the engine for its CPU count") from e
        return known

    def known_host_cpus(self) -> int | None:
        """``host_cpus``'s answer once it was asked (it is asked once), else None; no I/O."""
        return getattr(self, "_host_cpus", None)

    def update_limits(self, container_id: str, *, cpus: float, memory_bytes: int) -> None:
        """Set NanoCpus, Memory and MemorySwap (= Memory) of a running container.

        The docker SDK's ``update_container`` has no NanoCpus, and CpuQuota conflicts with
        the NanoCpus set at create, so the engine's update endpoint is called directly.
        Raises ``SandboxError`` (e.g. memory below what the container uses now).
        """
        body = {"NanoCpus": int(cpus * 1e9), "Memory": memory_bytes, "MemorySwap": memory_bytes}
        try:
            url = self._api._url("/containers/{0}/update", container_id)
            self._api._raise_for_status(self._api._post_json(url, data=body))
        except Exception as e:
            raise _map_error(e, f"updating the limits of container {container_id}") from e

    def _layers_below(self, container_id: str, base_image: str) -> list[str] | None:
        """``base_image``'s layer directories (top first) when the container's image is
        another one (None when it is that image: nothing lies between)."""
        try:
            own = self._api.inspect_container(container_id).get("Image")
            base = self._api.inspect_image(base_image)
        except Exception as e:
            raise _map_error(e, f"inspect of container {container_id} and {base_image}") from e
        if own == base.get("Id"):
            return None
        data = (base.get("GraphDriver") or {}).get("Data") or {}
        upper, lower = data.get("UpperDir"), data.get("LowerDir") or ""
        return [d for d in [upper, *lower.split(":")] if d] or [""]

    def reads_layers(self, container_id: str) -> bool:
        """Whether this host reads the container's layers (``overlay``): only then can a
        sandbox made from a snapshot of it be diffed against the task image (``diff`` with
        ``base_image``), so only then may it be checkpointed and resumed."""
        return self._layers(container_id) is not None

    def _layers(self, container_id: str) -> tuple[str, list[str]] | None:
        """The container's (upper, lowers) when this host can read them (``overlay``)."""
        if not self._read_host_layers:
            return None
        graph = self._container_meta(container_id).graph
        if graph is None:
            try:
                graph = self._api.inspect_container(container_id).get("GraphDriver") or {}
            except Exception as e:
                raise _map_error(e, f"inspect of container {container_id}") from e
        return overlay.layers(graph)

    def diff(
        self, container_id: str, *, base_image: str | None = None, max_entries: int | None = None
    ) -> list[FsChange]:
        """The container's filesystem changes against its image, or against ``base_image``
        (an image the container's own derives from: a sandbox forked or resumed from a
        snapshot holds the snapshot's changes in its image's layers).

        On overlay2 with the engine's storage visible (a control plane on the engine's
        host) the writable layer's upper directory is walked directly, as the engine's own
        overlay diff does: milliseconds instead of the engine's full-tree comparison
        (~0.6 s here); type changes are marked ``replaced``; with ``base_image`` the layers
        between are read too (``overlay.changes_since``). Otherwise the engine's ``diff``
        API answers, which knows only the container's own image. Both read engine-side
        state; nothing inside the sandbox can hide a change.

        With ``max_entries``, reading stops after ``max_entries + 1`` changes, on either
        path: an end state with millions of entries is never held whole (the engine's answer
        is parsed as it streams, ``jsonstream``).

        Raises ``SandboxError`` when ``base_image`` is not below the container's image, or
        is another image and this host cannot read the layers.
        """
        found = self._layers(container_id)
        base_layers = self._layers_below(container_id, base_image) if base_image else None
        if found is not None:
            upper, lowers = found
            try:
                if base_layers:
                    lowers = [d for d in lowers if not d.endswith("-init/diff")]
                    return overlay.changes_since(upper, lowers, base_layers, limit=max_entries)
                return overlay.changes(upper, lowers, limit=max_entries)
            except ValueError as e:
                raise SandboxError(f"diff of container {container_id}: {e}") from e
            except OSError as e:
                raise _read_error(e, f"reading the layers of container {container_id}") from e
        if base_layers:
            raise SandboxError(
                f"container {container_id} started from a snapshot of {base_image}: its "
                "changes since that image are in image layers, which only a control plane "
                "on the engine's host (overlay2) can read"
            )
        try:
            rows = self._engine_diff(container_id, max_entries)
        except docker.errors.APIError as e:
            cause = _explain(e).rsplit(": ", 1)[-1].strip().lower()
            if cause in _END_STATE_CAUSES:
                # the engine's walk of the frozen filesystem met what the end state made
                # (a fifth trial: a tree deeper than PATH_MAX under the engine's storage);
                # its message names the host's storage path, so only the cause is kept
                raise EndStateUnreadable(f"the engine cannot diff the end state: {cause}") from e
            raise _map_error(e, f"diff of container {container_id}") from e
        except Exception as e:
            raise _map_error(e, f"diff of container {container_id}") from e
        kinds = {0: "modified", 1: "added", 2: "deleted"}
        return [FsChange(r["Path"], kinds[r["Kind"]]) for r in rows]

    def marks_type_changes(self, container_id: str) -> bool:
        """True where this host reads the container's layers (``diff``'s fast path)."""
        return self._layers(container_id) is not None

    def _engine_diff(self, container_id: str, max_entries: int | None) -> list[dict[str, Any]]:
        """The engine's ``GET /containers/{id}/changes`` rows, parsed as they stream, at most
        ``max_entries + 1`` of them. Raises ``docker.errors.APIError`` as the SDK does."""
        api = self._api
        res = api._get(api._url("/containers/{0}/changes", container_id), stream=True)
        try:
            api._raise_for_status(res)
            rows: list[dict[str, Any]] = []
            try:
                for row in jsonstream.array_items(res.iter_content(1 << 16)):
                    rows.append(row)
                    if max_entries is not None and len(rows) > max_entries:
                        break
            except ValueError as e:
                raise SandboxError(f"diff of container {container_id}: {e}") from e
            return rows
        finally:
            res.close()

    def freeze(self, container_id: str) -> None:
        """Stop everything in the container from running: pause it (cgroup freezer), or,
        when the freezer refuses after ``FREEZE_ATTEMPTS`` tries, kill it (a stopped
        container is read from its filesystem like a paused one). Pausing a paused or
        stopped one is fine (nothing runs in either).

        The freezer can refuse for reasons outside the end state (runc's "unable to
        freeze" when a process joins the cgroup while it freezes, seen under load in CI)
        or inside it (processes that keep forking): either way nothing may run while the
        end state is read, and killing gives that without turning an earned reward into
        a zero.

        Raises ``NotFound`` (gone) or ``SandboxError`` (the engine refused both).
        """
        for attempt in range(FREEZE_ATTEMPTS):
            try:
                self._api.pause(container_id)
                break
            except docker.errors.APIError as e:
                text = _explain(e).lower()
                if "already paused" in text or "is not running" in text:
                    # Stopped (its main process ended, e.g. the agent killed the
                    # supervisor): nothing runs in it, so it is as frozen as a paused one.
                    break
                if isinstance(e, docker.errors.NotFound):
                    raise _map_error(e, f"freezing container {container_id}") from e
                log.warning("container %s: pause refused (%s)", container_id, text[:200])
                if attempt + 1 == FREEZE_ATTEMPTS:
                    self._kill_for_freeze(container_id, e)
                    break
                time.sleep(0.2 * (attempt + 1))
            except Exception as e:
                raise _map_error(e, f"freezing container {container_id}") from e
        self._frozen.add(container_id)

    def _kill_for_freeze(self, container_id: str, cause: Exception) -> None:
        """SIGKILL the container and wait until it has stopped (the freezer's fallback).

        Raises ``SandboxError`` naming ``cause`` when the engine cannot stop it either.
        """
        try:
            self._api.kill(container_id, signal="SIGKILL")
        except docker.errors.APIError as e:
            if "is not running" not in _explain(e).lower():
                raise _map_error(cause, f"freezing container {container_id}") from e
        try:
            self._api.wait(container_id, timeout=30)
        except Exception as e:
            raise _map_error(cause, f"freezing container {container_id}") from e
        log.warning("container %s: the freezer refused; killed it instead", container_id)

    def read_files(
        self, container_id: str, directory: str, names: Sequence[str], *, max_bytes: int
    ) -> dict[str, bytes | None]:
        """The regular files ``names`` directly in ``directory`` of a frozen container (see
        the protocol): from the upper directory when this host can read it
        (``overlay.read_regular``), else one engine archive of ``directory``.
        """
        found = self._layers(container_id)
        if found is not None:
            try:
                return overlay.read_regular(*found, directory, names, max_bytes=max_bytes)
            except overlay.UnreadablePath as e:
                log.debug("%s of %s is the engine's to read: %s", directory, container_id, e)
            except OSError as e:
                raise SandboxError(f"reading {directory} of container {container_id}: {e}") from e
        if self._container_meta(container_id).on_tmpfs(directory):
            return self._read_files_of_archive(container_id, directory, names, max_bytes)
        return {n: self._read_one(container_id, directory, n, max_bytes) for n in names}

    def _read_one(
        self, container_id: str, directory: str, name: str, max_bytes: int
    ) -> bytes | None:
        """One regular file through the engine's archive of that path alone: None when it is
        missing, not a regular file or larger than ``max_bytes``, read no further than that
        (a fifth trial left a sparse file of a terabyte beside the report: the archive of
        the whole directory streamed it into memory)."""
        path = posixpath.join(directory, name)
        try:
            stream, st = self._api.get_archive(container_id, path, chunk_size=1 << 16)
        except Exception as e:
            err = self._map_path_error(e, container_id, path)
            if isinstance(err, NotFound):
                return None
            raise err from e
        try:
            mode, size = int(st.get("mode", 0)), int(st.get("size", 0))
            if mode & _GO_MODE_TYPE or size > max_bytes:
                return None
            limit, buf = max_bytes + (8 << 10), bytearray()  # the member, its headers, padding
            for chunk in self._guard_stream(
                stream, f"reading {path} from container {container_id}"
            ):
                buf += chunk
                if len(buf) > limit:
                    return None
        finally:
            close = getattr(stream, "close", None)
            if close is not None:
                close()
        try:
            with tarfile.open(fileobj=io.BytesIO(bytes(buf))) as t:
                member = t.next()
                if member is None or not member.isreg() or member.size > max_bytes:
                    return None
                reader = t.extractfile(member)
                return reader.read() if reader else None
        except tarfile.TarError as e:
            raise SandboxError(f"reading {path} from container {container_id}: {e}") from e

    def _read_files_of_archive(
        self, container_id: str, directory: str, names: Sequence[str], max_bytes: int
    ) -> dict[str, bytes | None]:
        """``read_files`` from one archive of ``directory`` made in the sandbox (a tmpfs
        mount, which the engine's archive API cannot see)."""
        out: dict[str, bytes | None] = dict.fromkeys(names)
        try:
            data = b"".join(self.get_archive(container_id, directory))
        except NotFound:
            return out
        try:
            with tarfile.open(fileobj=io.BytesIO(data)) as t:
                for member in t:
                    parent, _, name = member.name.rpartition("/")
                    if "/" in parent or name not in out:
                        continue  # only direct children of ``directory``
                    if member.isreg() and member.size <= max_bytes:
                        reader = t.extractfile(member)
                        out[name] = reader.read() if reader else None
        except tarfile.TarError as e:
            raise SandboxError(f"reading {directory} from container {container_id}: {e}") from e
        return out

    def thaw(self, container_id: str) -> None:
        """Unpause the container; one that is not paused is fine.

        Raises ``NotFound`` (gone) or ``SandboxError``.
        """
        self._frozen.discard(container_id)
        try:
            self._api.unpause(container_id)
        except docker.errors.APIError as e:
            if "is not paused" in _explain(e).lower():
                return
            raise _map_error(e, f"thawing container {container_id}") from e
        except Exception as e:
            raise _map_error(e, f"thawing container {container_id}") from e

    def export_entries(
        self,
        container_id: str,
        paths: Sequence[str],
        *,
        max_bytes: int | None = None,
        base_image: str | None = None,
    ) -> Iterator[tuple[tarfile.TarInfo, BinaryIO | None]]:
        """Tar members of ``paths`` as they are in the frozen container (see the protocol).

        From the upper directory when this host can read it (``overlay.entries``: each path
        preceded by its ancestors' directory entries, so a directory that replaced a file is
        recreated as one); otherwise, or when a path is not there, one engine archive per
        path (no ancestor entries). ``max_bytes`` bounds the regular files' total (apparent)
        size: ``PayloadTooLarge`` is raised before the member that would pass it is read (a
        sparse file counts at its full size, as it would be copied). With ``base_image``
        below the container's own image (``diff``), the upper directory alone does not hold
        a changed directory's whole content, so the engine reads every path. Raises
        ``NotFound`` or ``SandboxError`` otherwise.
        """
        found = self._layers(container_id)
        if base_image and self._layers_below(container_id, base_image):
            found = None
        members: Iterator[tuple[tarfile.TarInfo, BinaryIO | None]] | None = None
        if found is not None:
            try:
                members = overlay.entries(found[0], paths)
            except (overlay.UnreadablePath, OSError) as e:
                log.debug("changes of %s are the engine's to read: %s", container_id, e)
        if members is None:
            members = (
                m for path in paths for m in self._engine_entries(container_id, path, max_bytes)
            )
        members = _read_errors_mapped(members, f"reading the changes of container {container_id}")
        return members if max_bytes is None else _capped(members, max_bytes)

    def _engine_entries(
        self, container_id: str, path: str, max_bytes: int | None
    ) -> Iterator[tuple[tarfile.TarInfo, BinaryIO | None]]:
        """Members of the engine's archive of ``path``, renamed to be relative to ``/``."""
        parent = posixpath.dirname(posixpath.normpath(path)).strip("/")
        spool = tempfile.SpooledTemporaryFile(max_size=16 << 20)  # noqa: SIM115 - closed below
        with spool:
            # The diff of this frozen container listed the path, and nothing writes it now
            # but the end state's own (suspended) processes: what keeps the engine from
            # reading it back is the end state's doing (a fourth trial: a name that is not
            # UTF-8, a symlink loop, a path gone or under a file).
            if find_unencodable(path) is not None:
                raise EndStateUnreadable(f"{path!r}: a name the engine's API cannot carry")
            try:
                chunks = self.get_archive(container_id, path)
            except (NotFound, InvalidRequest) as e:
                raise EndStateUnreadable(f"{e.detail} (listed in its changes)") from e
            for chunk in chunks:
                spool.write(chunk)
                if max_bytes is not None and spool.tell() > max_bytes + (1 << 20):
                    raise PayloadTooLarge(f"{path} holds more than {max_bytes} bytes")
            spool.seek(0)
            try:
                with tarfile.open(fileobj=spool, mode="r:") as t:
                    for member in t:
                        reader = t.extractfile(member) if member.isreg() else None
                        member.name = f"{parent}/{member.name}" if parent else member.name
                        if member.islnk():  # hard link targets are archive names too
                            member.linkname = (
                                f"{parent}/{member.linkname}" if parent else member.linkname
                            )
                        yield member, reader
            except tarfile.TarError as e:
                raise SandboxError(f"reading {path} from container {container_id}: {e}") from e

    def snapshot(self, container_id: str, *, repository: str, tag: str) -> str:
        """Commit the container's filesystem to ``repository:tag``; return the image id.

        The engine pauses the container for the commit and unpauses it afterwards, also
        when the commit fails (commit's ``pause=True``). Volumes and tmpfs are not included.
        """
        try:
            image = self._api.commit(container_id, repository=repository, tag=tag, pause=True)
        except requests.exceptions.Timeout as e:
            # The engine commits on after its answer timed out, with the container paused,
            # and unpauses it when done. Returning now let the caller hand the sandbox on
            # (``leased``) while the engine still held it: a verification then took it, its
            # freeze found it "already paused", and the commit's unpause ran the end state
            # again under the verifier (trial 32). So wait for the engine's work to end
            # (a container this runtime froze stays paused: nothing to wait for there).
            if container_id in self._frozen:
                raise _map_error(e, f"snapshot of container {container_id}") from e
            got = self._outwait_commit(container_id, f"{repository}:{tag}")
            if got is None:
                raise _map_error(e, f"snapshot of container {container_id}") from e
            return got
        except Exception as e:
            raise _map_error(e, f"snapshot of container {container_id}") from e
        return image["Id"]

    def _outwait_commit(self, container_id: str, ref: str) -> str | None:
        """After a commit's call timed out: the image id once the engine's commit made
        ``ref``, or None once the container is no longer paused without it (the commit
        failed), the container is gone, or ``COMMIT_OUTWAIT_S`` passed."""
        deadline = time.monotonic() + COMMIT_OUTWAIT_S
        while time.monotonic() < deadline:
            try:
                made = self._image_id(ref)
                if made is not None:
                    return made
                if not self._api.inspect_container(container_id)["State"].get("Paused"):
                    return self._image_id(ref)  # the commit ended: just made it, or failed
            except docker.errors.NotFound:
                return None  # the container is gone
            except Exception as e:  # noqa: BLE001 - the engine is slow: ask again
                log.info("container %s: waiting out a commit, the engine: %s", container_id, e)
                time.sleep(1.0)
                continue
            time.sleep(0.5)
        log.warning("container %s: the engine's commit of %s outlasted the wait", container_id, ref)
        return None

    def _image_id(self, ref: str) -> str | None:
        """``ref``'s image id, or None when the engine has no such image."""
        try:
            return self._api.inspect_image(ref)["Id"]
        except docker.errors.ImageNotFound:
            return None

    def unstartable(self, image: str, *, workdir: str) -> str | None:
        """Why a container of the snapshot ``image`` cannot be started, judged from what the
        engine reads in it at start, or None. runc opens ``/etc/passwd`` and ``/etc/group``
        to set the user up (numeric ids too) and enters ``workdir``: a FIFO there blocked
        the engine's start indefinitely (and left the container wedged in the engine), a
        directory or a file in the way failed it (a trial's resumes, every one a 502).

        Read host-side in the image's own top layer (overlay2's ``UpperDir``, with
        ``lstat``: nothing is opened); what lies in lower layers is the template's. None
        also when that layer is not readable here (another driver, a remote engine)."""
        try:
            driver = self._api.inspect_image(image).get("GraphDriver") or {}
        except Exception:  # noqa: BLE001 - the start says what is wrong, if anything
            return None
        upper = (driver.get("Data") or {}).get("UpperDir")
        if driver.get("Name") != "overlay2" or not upper or not os.path.isdir(upper):
            return None
        wanted = [("etc", stat.S_ISDIR), ("etc/passwd", stat.S_ISREG), ("etc/group", stat.S_ISREG)]
        parts = [p for p in workdir.split("/") if p]
        wanted += [("/".join(parts[: i + 1]), stat.S_ISDIR) for i in range(len(parts))]
        for rel, ok in wanted:
            try:
                mode = os.lstat(os.path.join(upper, rel))
            except FileNotFoundError:
                continue
            except OSError:
                return None
            if stat.S_ISCHR(mode.st_mode) and mode.st_rdev == 0:
                continue  # an overlay whiteout: removed in this layer
            if not ok(mode.st_mode):
                return f"/{rel} is {_file_kind(mode.st_mode)}"
        return None

    def remove_image(self, image: str) -> None:
        """Delete an image (missing is fine).

        While containers still use it (forks of a snapshot) only the name is removed: the
        engine keeps the untagged image until they are gone; ``prune_snapshots`` then
        deletes it.
        """
        try:
            self._api.remove_image(image)
        except docker.errors.ImageNotFound:
            return
        except docker.errors.APIError as e:
            if e.status_code != 409:
                raise _map_error(e, f"removing image {image}") from e
            try:
                self._api.remove_image(image, force=True)  # untag; the layers stay in use
            except docker.errors.ImageNotFound:
                return
            except Exception as e2:
                raise _map_error(e2, f"removing image {image}") from e2
        except Exception as e:
            raise _map_error(e, f"removing image {image}") from e

    def prune_snapshots(self, *, deployment: str) -> int:
        """Delete untagged snapshot images of this deployment no container uses.

        Snapshots inherit the source container's labels, ``crucible.deployment`` included.
        Returns how many were deleted.
        """
        try:
            images = self._api.images(
                filters={"dangling": True, "label": f"{LABEL_DEPLOYMENT}={deployment}"}
            )
        except Exception as e:
            raise _map_error(e, f"listing snapshot images of {deployment}") from e
        removed = 0
        for image in images:
            with contextlib.suppress(docker.errors.APIError):
                self._api.remove_image(image["Id"])
                removed += 1
        return removed

    def image_digest(self, image: str) -> str:
        """The image's content id (``sha256:...``); ``NotFound`` when absent."""
        try:
            return self._api.inspect_image(image)["Id"]
        except Exception as e:
            raise _map_error(e, f"image {image}") from e


# What the end state's own content can make a host read fail with (a path longer than the
# host allows once under the layer's prefix, a name the host refuses): the agent's outcome.
_CONTENT_ERRNOS = frozenset({errno.ENAMETOOLONG, errno.ELOOP, errno.EOVERFLOW, errno.EILSEQ})


def _read_error(e: OSError, what: str) -> SandboxError:
    """``EndStateUnreadable`` for what the content caused, else ``SandboxError``."""
    if e.errno in _CONTENT_ERRNOS:
        name = os.path.basename(str(e.filename))[:80]
        return EndStateUnreadable(f"{what}: {e.strerror} ({name})")
    return SandboxError(f"{what}: {e}")


_END_STATE_CAUSES = frozenset(
    {
        "file name too long",
        "too many levels of symbolic links",
        "not a directory",
        "no such file or directory",
        "permission denied",
        "value too large for defined data type",
    }
)
"""The causes (an errno's text) of an engine error that a filesystem's content can bring
about, as the engine ends its message with them."""


def _read_errors_mapped(
    members: Iterator[tuple[tarfile.TarInfo, BinaryIO | None]], what: str
) -> Iterator[tuple[tarfile.TarInfo, BinaryIO | None]]:
    """``members`` with host read errors during iteration mapped (``_read_error``)."""
    try:
        yield from members
    except overlay.UnreadablePath as e:
        # Read only from frozen containers: nothing but the end state (its suspended
        # processes, a write accepted before the verifier took it) changed it.
        raise EndStateUnreadable(f"{what}: {e} changed while it was read") from e
    except OSError as e:
        raise _read_error(e, what) from e


def _capped(
    members: Iterator[tuple[tarfile.TarInfo, BinaryIO | None]], max_bytes: int
) -> Iterator[tuple[tarfile.TarInfo, BinaryIO | None]]:
    """``members``, raising ``PayloadTooLarge`` before the regular file that would take
    their total size past ``max_bytes``."""
    total = 0
    for info, reader in members:
        if info.isreg():
            total += info.size
            if total > max_bytes:
                raise PayloadTooLarge(
                    f"the changed files hold more than {max_bytes} bytes (at {info.name})"
                )
        yield info, reader


def _raise_when_read(error: Exception) -> Iterator[Frame]:
    """Frames that raise ``error`` at the first read."""
    raise error
    yield  # a generator: nothing runs before the first read


def _first_read(frames: Iterator[Frame]) -> Iterator[Frame]:
    """``frames`` with its first frame read now, so a start that fails (the supervisor could
    not fork, the engine could not exec) raises here."""
    try:
        first = next(frames)
    except StopIteration:  # cannot happen: frame iterators raise when no result arrives
        return iter(())
    if first.kind == FRAME_ERROR and first.payload.startswith(b"spawn\n"):
        frames.close()
        raise_for_error(first)  # SandboxError: the command never started

    def rest() -> Iterator[Frame]:
        yield first
        yield from frames

    return rest()


class _DockerExecStream:
    """``ExecStream`` over one supervisor reply (see ``DockerRuntime.exec_stream``)."""

    def __init__(
        self,
        runtime: DockerRuntime,
        container_id: str,
        request: ExecRequest,
        frames: Iterator[Frame],
        *,
        pids_reclaimed: bool,
        disk_hits: int,
    ) -> None:
        self._runtime, self._container_id, self._request = runtime, container_id, request
        self._frames = frames
        self._pids_reclaimed, self._disk_hits = pids_reclaimed, disk_hits
        self._collector = ExecCollector()
        self._started = time.monotonic()
        self._lock = threading.Lock()
        self._cancelled = False
        self._killed = False
        self._items = self._run()

    def __iter__(self) -> _DockerExecStream:
        return self

    def __next__(self) -> ExecChunk | ExecResult:
        return next(self._items)

    def cancel(self) -> None:
        """Stop the command now (thread-safe); the iteration ends with its result."""
        with self._lock:
            self._cancelled = True
        self._kill_once()

    def close(self) -> None:
        """Stop the command if it still runs; end the iteration."""
        self._items.close()

    def _finish(self, result: ExecResult) -> ExecResult:
        return self._runtime._finish(
            self._container_id,
            result,
            oom_known=self._collector.oom_known,
            pids_reclaimed=self._pids_reclaimed,
            disk_hits=self._disk_hits,
        )

    def _kill_once(self) -> None:
        with self._lock:
            pid = self._collector.pid
            if pid is None or self._killed or self._collector.result is not None:
                return
            self._killed = True
        self._runtime._cancel(self._container_id, pid, user=self._request.user)

    def _run(self) -> Iterator[ExecChunk | ExecResult]:
        collector = self._collector
        try:
            with contextlib.closing(self._frames):
                try:
                    for frame in self._frames:
                        with self._lock:
                            item = collector.add(frame)
                            cancelled = self._cancelled
                        if cancelled:  # cancel came before the started frame
                            self._kill_once()
                        if isinstance(item, ExecResult):
                            yield self._finish(item)
                        elif item is not None:
                            yield item
                except HandlerLost as e:
                    rt, cid = self._runtime, self._container_id
                    yield self._finish(rt._lost_result(cid, collector, self._started, e))
        finally:
            if collector.result is None:
                self._kill_once()


def _file_kind(mode: int) -> str:
    """``mode``'s file type in words ("a FIFO", "a directory", ...)."""
    for test, name in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISREG, "a regular file"),
        (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    ):
        if test(mode):
            return name
    return "a special file"
