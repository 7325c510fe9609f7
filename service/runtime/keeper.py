"""Kept processes: background processes and terminal sessions owned by the sandbox's supervisor.

A ``spawn`` request on the exec channel makes the handler that received it the process's
*keeper* (``crucible-exec.c``, section "keepers"): it starts the command on pipes or a
pseudo-terminal, is the subreaper of everything the command starts, keeps the newest
``ring_bytes`` of each stream with absolute offsets, buffers stdin (1 MiB), and answers ops
on connections the idle supervisor hands over (control byte ``A`` + the handle). Handles are
the keeper's pid inside the sandbox; they live until ``release`` or the sandbox's end.

Engine-agnostic apart from ``keeper_channel`` (``DockerRuntime``): a runtime without one
cannot keep processes, and everything here raises ``Conflict`` saying so.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Protocol

from service.errors import Conflict, InvalidRequest, NotFound, SandboxError
from service.runtime import channel
from service.runtime.base import ExecRequest, HandlerLost
from service.runtime.protocol import (
    FRAME_ERROR,
    FRAME_RESULT,
    FRAME_STDERR,
    FRAME_STDOUT,
    encode_keeper_op,
    encode_spawn,
    parse_kv,
    with_identity,
)

MAX_KEPT = 64  # keepers per sandbox (``MAX_KEEPERS`` in crucible-exec.c)
MARK_FD = 63  # the keeper's mark pipe in a session: the shell writes "$?\n" per prompt
OP_TIMEOUT_S = 10.0  # an op that does not wait is answered within microseconds
MAX_WAIT_S = 600.0
_MAX_REPLY = 80 << 20  # a ring (64 MiB at most) plus framing


class KeeperRuntime(Protocol):
    """What a runtime offers for kept processes."""

    def keeper_channel(self, container_id: str) -> tuple[channel.ControlChannel, str]: ...


@dataclass(frozen=True, slots=True)
class KeptStatus:
    """A kept process now. ``exit_code`` is None while it runs (128+N when killed by signal
    N); ``*_total`` are bytes written so far, ``*_first`` the oldest offset still kept;
    ``marks`` counts the prompts a session's shell reported, ``last_rc`` the last ``$?``."""

    pid: int
    running: bool
    exit_code: int | None
    signal: int | None
    stdout_total: int
    stderr_total: int
    stdout_first: int
    stderr_first: int
    stdin_open: bool
    stdin_pending: int
    marks: int
    last_rc: int
    pty: bool


@dataclass(frozen=True, slots=True)
class KeptOutput:
    """Bytes ``[offset, next)`` of a stream; ``dropped`` bytes before ``offset`` that were
    asked for but had left the ring; ``done`` (``run``): the shell's prompt came back."""

    data: bytes
    offset: int
    next: int
    dropped: int
    timed_out: bool
    done: bool
    status: KeptStatus


def _status(kv: dict[str, str]) -> KeptStatus:
    running = kv.get("running") == "1"
    sig = int(kv.get("signal", "0"))
    return KeptStatus(
        pid=int(kv["pid"]),
        running=running,
        exit_code=None if running else int(kv["exit_code"]),
        signal=sig or None,
        stdout_total=int(kv["stdout_total"]),
        stderr_total=int(kv["stderr_total"]),
        stdout_first=int(kv["stdout_first"]),
        stderr_first=int(kv["stderr_first"]),
        stdin_open=kv.get("stdin_open") == "1",
        stdin_pending=int(kv.get("stdin_pending", "0")),
        marks=int(kv.get("marks", "0")),
        last_rc=int(kv.get("last_rc", "-1")),
        pty=kv.get("pty") == "1",
    )


class ShellState(Conflict):
    """A session's shell cannot take a ``prun`` now: ``state`` is the keeper's word for why
    (``busy run``, ``busy keys``, ``busy foreground <pgid>``, ``partial``, ``exited <code>``);
    ``service.sessions`` says it in words."""

    def __init__(self, state: str) -> None:
        super().__init__(f"the shell cannot run a command now: {state}")
        self.state = state


def _raise(payload: bytes) -> None:
    kind, _, message = payload.decode("utf-8", "replace").partition("\n")
    if kind == "shell":
        raise ShellState(message)
    if kind == "exec":  # a spawn whose command could not be executed
        raise InvalidRequest(f"cannot execute {message}", field="cmd")
    if kind in ("state", "busy", "channel"):
        raise Conflict(message)
    if kind in ("request", "cwd", "user"):
        field = {"cwd": "cwd", "user": "user"}.get(kind)
        raise InvalidRequest(message, field=field)
    raise SandboxError(f"kept process: {kind}: {message}")


def _exchange(sock: Any, record: bytes, *, timeout_s: float, what: str) -> tuple[bytes, dict]:
    """Send ``record`` to a keeper and read its answer. The keeper is a process of the
    sandbox's: one that closes, resets or never answers was killed or stopped there (a
    trial's `kill -STOP $PPID` in a session), so that is a ``Conflict`` (409), not a 502."""
    out: list[bytes] = []
    kv: dict[str, str] = {}
    try:
        for frame in channel.frames(
            sock, record, read_timeout_s=timeout_s, max_bytes=_MAX_REPLY, what=what
        ):
            if frame.kind in (FRAME_STDOUT, FRAME_STDERR):
                out.append(frame.payload)
            elif frame.kind == FRAME_ERROR:
                _raise(frame.payload)
            elif frame.kind == FRAME_RESULT:
                kv = parse_kv(frame.payload)
    except HandlerLost as e:
        raise Conflict(
            f"{e.detail}: the process's keeper did not answer (stopped or killed in the sandbox)"
        ) from e
    return b"".join(out), kv


def spawn(
    runtime: KeeperRuntime,
    container_id: str,
    request: ExecRequest,
    *,
    pty: bool = False,
    rows: int = 24,
    cols: int = 80,
    marks: bool = False,
    sandbox_id: str | None = None,
) -> tuple[int, int]:
    """Start ``request`` kept (``max_output_bytes`` = ring bytes per stream); returns
    ``(handle, pid)``. Raises ``Conflict`` (no channel, or ``MAX_KEPT`` kept already),
    ``InvalidRequest`` (bad cwd/user/fields; a command that cannot be executed: field
    ``cmd``), ``SandboxError``. ``sandbox_id`` names the sandbox in errors."""
    control, user = runtime.keeper_channel(container_id)
    record = with_identity(
        encode_spawn(request, pty=pty, rows=rows, cols=cols, marks=marks), request.user or user
    )
    where = f"sandbox {sandbox_id}" if sandbox_id else container_id
    try:
        sock = control.open_keeper()
    except channel.Full:
        raise Conflict(
            f"{where} keeps {MAX_KEPT} processes and sessions already, the most it may: one "
            "that ended still counts until it is released (DELETE "
            ".../processes/{handle} or .../sessions/{session_id})"
        ) from None
    except channel.Unavailable as e:
        raise Conflict(f"cannot keep another process in {where}: {e}") from None
    _, kv = _exchange(sock, record, timeout_s=OP_TIMEOUT_S, what=f"spawn in {container_id}")
    try:
        return int(kv["handle"]), int(kv["pid"])
    except (KeyError, ValueError) as e:
        raise SandboxError(f"spawn in {container_id}: malformed answer {kv!r}") from e


def _op(
    runtime: KeeperRuntime,
    container_id: str,
    handle: int,
    op: str,
    *,
    wait_s: float = 0.0,
    answer_s: float = OP_TIMEOUT_S,
    **fields: Any,
) -> tuple[bytes, dict[str, str]]:
    if not 0 <= wait_s <= MAX_WAIT_S:
        raise InvalidRequest(f"wait_s must be 0..{MAX_WAIT_S:g}", field="wait_s")
    control, _ = runtime.keeper_channel(container_id)
    if not 1 < handle < 1 << 31:
        raise NotFound(f"no process {handle} in this sandbox", field="handle")
    try:
        sock = control.attach(handle)
    except channel.Unavailable:
        raise NotFound(f"no process {handle} in this sandbox", field="handle") from None
    record = encode_keeper_op(op, wait_ms=round(wait_s * 1000) if wait_s else None, **fields)
    return _exchange(sock, record, timeout_s=answer_s + wait_s, what=f"{op} on process {handle}")


def status(
    runtime: KeeperRuntime, container_id: str, handle: int, *, answer_s: float = OP_TIMEOUT_S
) -> KeptStatus:
    """The process's state. ``NotFound`` for an unknown (or released) handle; ``Conflict``
    when its keeper does not answer within ``answer_s`` seconds (stopped in the sandbox)."""
    return _status(_op(runtime, container_id, handle, "pstatus", answer_s=answer_s)[1])


def _output(data: bytes, kv: dict[str, str]) -> KeptOutput:
    return KeptOutput(
        data=data,
        offset=int(kv["offset"]),
        next=int(kv["next"]),
        dropped=int(kv.get("dropped", "0")),
        timed_out=kv.get("timed_out") == "1",
        done=kv.get("done") == "1",
        status=_status(kv),
    )


def read(
    runtime: KeeperRuntime,
    container_id: str,
    handle: int,
    *,
    stream: str = "stdout",
    offset: int = 0,
    wait_s: float = 0.0,
) -> KeptOutput:
    """The stream's kept bytes from ``offset`` on. With ``wait_s`` > 0, waits (seconds) until
    there is a byte past ``offset`` or the process exited. A pty's output is ``stdout``."""
    if stream not in ("stdout", "stderr"):
        raise InvalidRequest("stream must be stdout or stderr", field="stream")
    if offset < 0:
        raise InvalidRequest("offset must be >= 0", field="offset")
    data, kv = _op(
        runtime, container_id, handle, "pread", wait_s=wait_s, stream=stream, offset=offset
    )
    return _output(data, kv)


def write(
    runtime: KeeperRuntime, container_id: str, handle: int, data: bytes, *, close: bool = False
) -> KeptStatus:
    """Queue ``data`` for the process's stdin (``close``: then close it; on a terminal, send
    ^D). ``Conflict`` when stdin is closed or 1 MiB is still unread; ``ShellState``
    (``exited <code>``) for a session whose shell exited. In a session, keys that end a
    line make ``run_line`` wait until the shell prompts again with nothing left unread."""
    return _status(_op(runtime, container_id, handle, "pwrite", data=data, close_stdin=close)[1])


def run_line(
    runtime: KeeperRuntime, container_id: str, handle: int, line: bytes, *, wait_s: float
) -> KeptOutput:
    """Write ``line`` to a session's shell once it is idle at its prompt, and answer when its
    next prompt is reported (``done``), the shell exited, or after ``wait_s`` seconds
    (``timed_out``); the output is everything the terminal showed meanwhile (the echo
    included), ``status.last_rc`` the exit code. Raises ``ShellState`` (nothing written)
    when the shell exited, or is still busy after 1 s (at most ``wait_s``): an earlier
    run's command runs, keys ended a line it has not prompted after, another process group
    holds the terminal; or (pipes) keys left a partly typed line."""
    data, kv = _op(runtime, container_id, handle, "prun", wait_s=wait_s, data=line)
    return _output(data, kv)


def signal(
    runtime: KeeperRuntime, container_id: str, handle: int, signo: int, *, grace_ms: int = 500
) -> KeptStatus:
    """Send ``signo`` to the whole tree (the process group and every descendant, however it
    detached). SIGTERM: then SIGKILL whatever is left after ``grace_ms``; SIGKILL: until
    nothing is left."""
    return _status(
        _op(runtime, container_id, handle, "psignal", signal=signo, grace_ms=grace_ms)[1]
    )


def resize(runtime: KeeperRuntime, container_id: str, handle: int, rows: int, cols: int) -> None:
    """Set a pty's size (the kernel sends SIGWINCH to its foreground job)."""
    _op(runtime, container_id, handle, "presize", rows=rows, cols=cols)


def release(runtime: KeeperRuntime, container_id: str, handle: int, *, grace_ms: int = 500) -> None:
    """Stop the tree (SIGTERM, SIGHUP on a pty; SIGKILL after ``grace_ms``) and forget the
    handle. Releasing an unknown handle is a no-op."""
    with contextlib.suppress(NotFound):
        _op(runtime, container_id, handle, "prelease", grace_ms=grace_ms)
