"""The ``SandboxRuntime`` protocol: the one seam between the control plane and a container engine.

Everything above it (pools, API, verifiers) speaks in sandbox ids, specs and exec results;
everything engine-specific (docker SDK today, Kubernetes later) lives below it.
"""

from __future__ import annotations

import tarfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import BinaryIO, Literal, Protocol

from service.errors import SandboxError

# Labels every container carries (DESIGN.md section 3).
LABEL_SANDBOX_ID = "crucible.sandbox_id"
LABEL_TEMPLATE = "crucible.template"
LABEL_DEPLOYMENT = "crucible.deployment"


@dataclass(frozen=True, kw_only=True)
class SandboxSpec:
    """What to start: one container made from a template.

    Units: ``cpus`` in CPUs (fractional allowed), ``memory_bytes`` is memory and
    memory+swap (no swap), ``tmpfs`` maps a mount path to its size in bytes. ``disk_bytes``
    bounds the writable layer (None: unbounded); how it holds is the runtime's (Docker:
    ``service.runtime.diskwatch``).
    """

    sandbox_id: str
    template: str
    deployment: str
    image: str
    cpus: float = 1.0
    memory_bytes: int = 1 << 30
    pids_limit: int = 256
    nofile: int = 1024
    network: Literal["none", "bridge"] = "none"
    workdir: str = "/workspace"
    user: str = "root"
    env: Mapping[str, str] = field(default_factory=dict)
    cap_add: tuple[str, ...] = ()
    tmpfs: Mapping[str, int] = field(default_factory=dict)
    disk_bytes: int | None = None
    extra_labels: Mapping[str, str] = field(default_factory=dict)


class HandlerLost(SandboxError):
    """The command's handler in the sandbox ended without a result after the request was
    sent (the reply stream closed). The runtime turns it into an ``ExecResult`` with
    ``handler_lost`` where the container still runs; it escapes only from the transports."""


class EndStateUnreadable(SandboxError):
    """The end state itself cannot be read the way the runtime reads it (a path too long
    for the host, a name the host refuses): the agent's outcome, which verifiers score 0,
    unlike every other ``SandboxError`` (the engine's or Crucible's failure)."""


ROOT = "0:0"
"""The identity of Crucible's own commands in a sandbox: uid 0 and gid 0 by number. The
supervisor takes a numeric group as given, so the sandbox's ``/etc/passwd`` and
``/etc/group`` (the agent's to write) choose neither (a trial gave root the gid 2**32 - 1
in the end state's passwd, and every verification of the episode became an error)."""


@dataclass(frozen=True, kw_only=True)
class ExecRequest:
    """One command to run in a sandbox.

    ``cmd`` is a shell string (run by ``/bin/sh -c``) or an argv list. ``env`` values are
    bytes and arrive byte for byte. ``stdin`` is empty unless given (readers get EOF).
    ``max_output_bytes`` caps each stream, keeping head and tail. ``observe_bytes`` > 0
    gives the command an observation pipe as its fd 3 (inherited by what it starts unless
    they close it); what is written there before the command exits comes back in
    ``ExecResult.observed``, capped at that many bytes (head and tail). The verifier uses it
    to hear its own pytest plugin (``service.verifiers.observer``).
    """

    cmd: str | list[str]
    timeout_s: float = 60.0
    cwd: str | None = None
    env: Mapping[str, bytes] = field(default_factory=dict)
    stdin: bytes = b""
    max_output_bytes: int = 1 << 20
    user: str | None = None
    observe_bytes: int = 0


@dataclass(frozen=True)
class ExecChunk:
    """A piece of live output from a streaming exec (before the head cap is reached)."""

    stream: Literal["stdout", "stderr"]
    data: bytes


@dataclass(frozen=True, kw_only=True)
class ExecResult:
    """How a command ended.

    ``exit_code`` is the shell convention: the status, or 128+N when killed by signal N
    (``signal`` then holds N). ``timed_out`` means Crucible killed the process group at
    ``timeout_s``; ``oom_killed`` that the kernel's OOM killer killed a process of the exec;
    ``pids_limit_hit`` that a fork was refused at the sandbox's pids limit while it ran (the
    exec's process group is then killed, bomb and all); ``disk_limit_hit`` that the
    sandbox's writable layer went over its disk budget while it ran (its writers were
    killed). The three are sandbox-wide: a concurrent exec's event counts too.
    ``stdout``/``stderr`` hold at most ``max_output_bytes`` each (head + tail when
    ``*_truncated``); ``*_total_bytes`` count everything the command wrote.
    ``handler_lost``: the command's handler in the sandbox was killed before it could
    report (by the sandbox's own processes, ``kill -9 -1``, or its memory limit) while the
    container went on running; ``exit_code`` is then 137 (``signal`` 9), and the output is
    what arrived before. Only the sandbox's own processes or its limits can do that, so it
    is the command's outcome, not a failure of Crucible.
    """

    exit_code: int
    signal: int | None = None
    timed_out: bool = False
    oom_killed: bool = False
    pids_limit_hit: bool = False
    disk_limit_hit: bool = False
    stdout: bytes = b""
    stderr: bytes = b""
    stdout_total_bytes: int = 0
    stderr_total_bytes: int = 0
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    duration_ms: float = 0.0
    observed: bytes = b""
    observed_truncated: bool = False
    handler_lost: bool = False


class ExecStream(Protocol):
    """A running exec: iterate it for chunks, then exactly one ``ExecResult``.

    ``cancel`` may be called from any thread while another iterates: the command's process
    group gets SIGTERM, then SIGKILL after the grace, and the iteration then ends with the
    result of the stopped command. ``close`` (from the iterating thread) does the same and
    drops the rest.
    """

    def __iter__(self) -> Iterator[ExecChunk | ExecResult]: ...

    def __next__(self) -> ExecChunk | ExecResult: ...

    def cancel(self) -> None:
        """Stop the command (idempotent, thread-safe)."""
        ...

    def close(self) -> None:
        """Stop the command if it still runs and end the iteration."""
        ...


@dataclass(frozen=True)
class FsChange:
    """One entry of a container's filesystem diff against its image (``docker diff``).

    ``replaced``: a modified entry whose type changed between directory and non-directory
    (known only where the runtime reads the layers itself; the engine's diff cannot say).
    """

    path: str
    kind: Literal["modified", "added", "deleted"]
    replaced: bool = False


@dataclass(frozen=True, kw_only=True)
class PathStat:
    """One path in a container, as ``lstat`` sees it (a final symlink is not followed).

    ``kind`` is ``file``, ``dir``, ``symlink`` or ``other``; ``size`` in bytes; ``mode`` the
    permission bits (0o7777); ``link_target`` the target of a symlink, else empty.
    """

    kind: Literal["file", "dir", "symlink", "other"]
    size: int = 0
    mode: int = 0
    link_target: str = ""


@dataclass(frozen=True, kw_only=True)
class ContainerInfo:
    """A container as the engine reports it, with Crucible's labels."""

    container_id: str
    sandbox_id: str | None
    template: str | None
    deployment: str | None
    status: str  # engine status: created, running, paused, exited, dead
    labels: Mapping[str, str]


class SandboxRuntime(Protocol):
    """Operations the control plane needs from a container engine.

    All methods are blocking; callers run them in worker threads. Errors surface as
    ``service.errors.SandboxError`` (or ``NotFound`` for a container that is gone).
    """

    def ping(self) -> bool:
        """True when the engine answers."""
        ...

    def ensure_ready(self) -> None:
        """Prepare what sandboxes need (e.g. the read-only supervisor volume). Idempotent."""
        ...

    def create(self, spec: SandboxSpec) -> str:
        """Create and start a container for ``spec``; return its engine id."""
        ...

    def exec(self, container_id: str, request: ExecRequest) -> ExecResult:
        """Run ``request`` to completion (or timeout) and return its result."""
        ...

    def exec_stream(self, container_id: str, request: ExecRequest) -> ExecStream:
        """Run ``request``: an ``ExecStream`` of output chunks as they come, then exactly one
        ExecResult."""
        ...

    def resolve_path(self, container_id: str, path: str, *, create_parents: bool = False) -> str:
        """Resolve ``path`` (symlinks too) in the container; optionally ``mkdir -p`` its parent."""
        ...

    def put_archive(
        self,
        container_id: str,
        dest_dir: str,
        tar_bytes: bytes | BinaryIO,
        *,
        pristine_tar: bool = False,
    ) -> None:
        """Extract an (already validated) tar, bytes or a readable binary file, into
        ``dest_dir`` inside the container. ``pristine_tar``: the container is one nothing
        but Crucible has touched (a verifier's sandbox), so its own ``tar`` may do it, as
        root, through the exec channel (faster than the engine where it has one)."""
        ...

    def get_archive(self, container_id: str, path: str) -> Iterator[bytes]:
        """Stream a tar of ``path`` from the container."""
        ...

    def stat_path(self, container_id: str, path: str) -> PathStat | None:
        """What absolute ``path`` is in the container (None when it does not exist); asked
        of the engine where it can answer, so it costs no exec on the hot path."""
        ...

    def update_limits(self, container_id: str, *, cpus: float, memory_bytes: int) -> None:
        """Change a running container's CPU and memory (= memory+swap) limits."""
        ...

    def host_cpus(self) -> int:
        """How many CPUs the engine's host has: the most one container may be given."""
        ...

    def known_host_cpus(self) -> int | None:
        """``host_cpus``'s answer when it is already known without asking the engine (no
        I/O: an event loop may call it), else None."""
        ...

    def disk_usage_bytes(self, container_id: str) -> int:
        """Size in bytes of the container's writable layer (what a snapshot commits)."""
        ...

    def snapshot(self, container_id: str, *, repository: str, tag: str) -> str:
        """Pause, commit the filesystem to ``repository:tag``, unpause; return the image id."""
        ...

    def prune_snapshots(self, *, deployment: str) -> int:
        """Delete this deployment's untagged snapshot images no container uses; return how
        many (deleted snapshots stay alive untagged while forks run from them)."""
        ...

    def remove_image(self, image: str) -> None:
        """Delete a snapshot image (missing is fine)."""
        ...

    def destroy(self, container_id: str) -> None:
        """Kill and remove the container (missing is fine)."""
        ...

    def list(self, *, deployment: str) -> list[ContainerInfo]:
        """All containers of this deployment, by label."""
        ...

    def freeze(self, container_id: str) -> None:
        """Suspend every process in the container (idempotent). Its filesystem can still be
        read engine-side (``diff``, ``get_archive``, ``export_entries``, ``snapshot``); exec is
        refused with ``Conflict``; ``destroy`` still works."""
        ...

    def read_files(
        self, container_id: str, directory: str, names: Sequence[str], *, max_bytes: int
    ) -> dict[str, bytes | None]:
        """The regular files ``names`` directly in absolute ``directory`` of a frozen
        container, read engine-side: bytes, or None when missing, not a regular file (a
        symlink is not followed) or larger than ``max_bytes``."""
        ...

    def thaw(self, container_id: str) -> None:
        """Resume a frozen container's processes (a running one is fine)."""
        ...

    def export_entries(
        self,
        container_id: str,
        paths: Sequence[str],
        *,
        max_bytes: int | None = None,
        base_image: str | None = None,
    ) -> Iterator[tuple[tarfile.TarInfo, BinaryIO | None]]:
        """Tar members (names relative to ``/``) of absolute ``paths`` as they are in a frozen
        container: directories recursively, owners, modes and symlinks kept. A regular file's
        reader is valid only until the next member is asked for. ``PayloadTooLarge`` when
        the regular files add up to more than ``max_bytes``. ``base_image``: the image the
        paths were diffed against (``diff``)."""
        ...

    def prune_host_state(self, *, deployment: str, live_sandbox_ids: set[str]) -> int:
        """Remove what this host keeps for this deployment's sandboxes that no longer exist
        (exec channel directories); return how many."""
        ...

    def marks_type_changes(self, container_id: str) -> bool:
        """Whether ``diff`` marks an entry whose type changed (``replaced``) for this
        container: True only where its layers are read directly. Default False."""
        return False

    def diff(
        self, container_id: str, *, base_image: str | None = None, max_entries: int | None = None
    ) -> list[FsChange]:
        """What changed in the container's filesystem since its image, or since
        ``base_image`` when its image derives from that one (engine-side, so nothing inside
        the sandbox can hide a change). With ``max_entries``, at most ``max_entries + 1``
        changes are read and returned (more than ``max_entries``: there may be more)."""
        ...

    def image_digest(self, image: str) -> str:
        """The image's content id (``sha256:...``)."""
        ...
