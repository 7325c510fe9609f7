"""Wire format between the control plane and ``crucible-exec``, the in-sandbox supervisor.

Engine-agnostic: this module turns requests into bytes and the supervisor's output frames
back into ``ExecChunk`` / ``ExecResult``; how the bytes travel (``docker exec``, or the
channel socket of the sandbox's idle supervisor: ``service.runtime.channel``) is the
runtime's business.

Request record (integers big-endian)::

    b"CRX1" | u32 body_len | field*        field = u8 tag | u32 len | len bytes

    tag  meaning                                   tag  meaning
    o    op: exec | resolve | mkdir | kill          i    stdin bytes
    a    argv element (repeatable)                  t    timeout_ms (u64; 0 = none)
    s    shell command, run by /bin/sh -c           m    max_output_bytes per stream (u64)
    c    cwd                                        g    kill grace_ms (u64)
    e    env entry NAME=VALUE, raw bytes            p    path (resolve, mkdir)
         (repeatable; NAME alone unsets NAME)       P    create parents (u8 0/1)
    k    process group to kill (u64)                w    mkdir owner: name | uid[:gid]
    u    identity (channel only): user[:group]      C    observation cap (u64; > 0: the
                                                         command's fd 3 is an observation
                                                         pipe, kept up to this many bytes)

Kept processes (channel only; ``service.runtime.keeper``): op ``spawn`` takes the exec
fields plus ``y`` (u8: on a pseudo-terminal), ``r``/``l`` (u64 rows/cols), ``M`` (u8: fd 63
is the mark pipe, one ``$?`` line per prompt) and answers ``R`` with ``handle=`` (the
keeper's pid). Ops on a handle: ``pstatus``, ``pread`` (``n`` stream, ``f`` offset, ``t``
wait ms), ``pwrite`` (``i`` bytes, ``x`` u8 close stdin), ``prun`` (``i`` command line,
``t`` wait ms: answered at the next mark), ``psignal`` (``z`` signal, ``g`` grace ms),
``presize`` (``r``, ``l``), ``prelease``.

The record travels base64-encoded as one argv argument (``--request <b64>``) when it is
small, else on the supervisor's stdin (``--request-stdin``); on the channel it is written
to the connection, with the identity ``docker exec -u`` would otherwise set.

Response: frames ``u8 type | u32 len | payload`` on the supervisor's stdout::

    O / E  stdout / stderr bytes, raw. Head bytes are sent live as the command writes them;
           the kept tail follows at the end. Per stream, concatenated frames = kept output.
    C      observation bytes the command wrote to its fd 3 (``observe_bytes`` requests);
           kept like an output stream, and never drained after the command exits
    S      started: ``pid=N``, the command's pid, which is also its process group id
    P      resolved path (resolve op)
    R      result: ASCII ``key=value`` lines; the last frame of a successful request
    X      error: ``kind\\nmessage`` (kind: request, cwd, path, spawn, internal); last frame

Output cap: each stream keeps at most ``max_output_bytes``: the first
``max - max // 2`` bytes (head) and the last ``max // 2`` bytes (tail), so exactly
``max_output_bytes`` bytes when ``total > max_output_bytes`` (then ``truncated``).
"""

from __future__ import annotations

import base64
import contextlib
import os
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from service.errors import InvalidRequest, SandboxError
from service.runtime.base import ExecChunk, ExecRequest, ExecResult

MAGIC = b"CRX1"
# Above this many base64 characters the record goes through stdin, far below the kernel's
# MAX_ARG_STRLEN (128 KiB per argument) and ARG_MAX.
ARGV_LIMIT_CHARS = 64 * 1024
DEFAULT_GRACE_MS = 500

FRAME_STDOUT = ord("O")
FRAME_STDERR = ord("E")
FRAME_OBSERVED = ord("C")
FRAME_STARTED = ord("S")
FRAME_PATH = ord("P")
FRAME_RESULT = ord("R")
FRAME_ERROR = ord("X")
_FRAME_HEADER = struct.Struct(">BI")
_MAX_FRAME_BYTES = 64 << 20  # a sane bound: the supervisor sends chunks of at most 64 KiB


# ----------------------------------------------------------------------------- requests


def _field(tag: str, value: bytes) -> bytes:
    return tag.encode() + struct.pack(">I", len(value)) + value


def _u64(tag: str, value: int) -> bytes:
    return _field(tag, struct.pack(">Q", value))


def _record(fields: Iterable[bytes]) -> bytes:
    body = b"".join(fields)
    return MAGIC + struct.pack(">I", len(body)) + body


def _text(value: str | bytes, *, field: str) -> bytes:
    raw = os.fsencode(value) if isinstance(value, str) else bytes(value)
    if b"\0" in raw:
        raise InvalidRequest(f"{field} must not contain NUL bytes", field=field)
    return raw


def _env_entries(env: Mapping[str, bytes | str]) -> list[bytes]:
    entries = []
    for name, value in env.items():
        raw_name = _text(name, field="env")
        if not raw_name or b"=" in raw_name:
            raise InvalidRequest(f"invalid environment variable name {name!r}", field="env")
        entries.append(_field("e", raw_name + b"=" + _text(value, field="env")))
    return entries


def encode_exec(request: ExecRequest, *, grace_ms: int = DEFAULT_GRACE_MS) -> bytes:
    """The record for an exec request.

    ``timeout_s`` must be > 0 (seconds), ``max_output_bytes`` >= 0; strings and env values
    must not contain NUL. Raises ``InvalidRequest`` (with ``field``) otherwise.
    """
    if not request.timeout_s > 0:
        raise InvalidRequest("timeout_s must be > 0", field="timeout_s")
    if request.max_output_bytes < 0:
        raise InvalidRequest("max_output_bytes must be >= 0", field="max_output_bytes")
    fields = [_field("o", b"exec")]
    if isinstance(request.cmd, str):
        fields.append(_field("s", _text(request.cmd, field="cmd")))
    else:
        if not request.cmd:
            raise InvalidRequest("cmd must not be empty", field="cmd")
        fields += [_field("a", _text(arg, field="cmd")) for arg in request.cmd]
    if request.cwd is not None:
        fields.append(_field("c", _text(request.cwd, field="cwd")))
    fields += _env_entries(request.env)
    if request.stdin:
        fields.append(_field("i", bytes(request.stdin)))
    fields.append(_u64("t", max(1, round(request.timeout_s * 1000))))
    fields.append(_u64("m", request.max_output_bytes))
    fields.append(_u64("g", grace_ms))
    if request.observe_bytes > 0:
        fields.append(_u64("C", request.observe_bytes))
    return _record(fields)


def encode_resolve(path: str, *, create_parents: bool = False) -> bytes:
    """The record that resolves ``path`` (absolute) inside the sandbox, like ``realpath -m``."""
    raw = _text(path, field="path")
    return _record(
        [_field("o", b"resolve"), _field("p", raw), _field("P", bytes([create_parents]))]
    )


def encode_mkdir(path: str, *, owner: str | None = None) -> bytes:
    """The record that runs ``mkdir -p path`` and, with ``owner``, chowns the leaf to it."""
    fields = [_field("o", b"mkdir"), _field("p", _text(path, field="path"))]
    if owner:
        fields.append(_field("w", _text(owner, field="user")))
    return _record(fields)


def encode_kill(pgid: int, *, grace_ms: int = DEFAULT_GRACE_MS) -> bytes:
    """The record that stops process group ``pgid``: SIGTERM, SIGKILL after ``grace_ms``."""
    if pgid <= 1:
        raise InvalidRequest("process group id must be > 1", field="pgid")
    return _record([_field("o", b"kill"), _u64("k", pgid), _u64("g", grace_ms)])


def encode_spawn(
    request: ExecRequest, *, pty: bool = False, rows: int = 24, cols: int = 80, marks: bool = False
) -> bytes:
    """The record that starts ``request`` as a kept process (``service.runtime.keeper``).

    ``request.max_output_bytes`` is the size of each stream's ring (bytes kept, the newest);
    ``timeout_s`` is not used (a kept process runs until signalled or released). Raises
    ``InvalidRequest`` like ``encode_exec``.
    """
    base = encode_exec(request)
    body = base[8:] + _field("y", bytes([pty])) + _u64("r", rows) + _u64("l", cols)
    body += _field("M", bytes([marks]))
    body = body.replace(_field("o", b"exec"), _field("o", b"spawn"), 1)
    return MAGIC + struct.pack(">I", len(body)) + body


def encode_keeper_op(
    op: str,
    *,
    stream: str | None = None,
    offset: int | None = None,
    wait_ms: int | None = None,
    data: bytes | None = None,
    close_stdin: bool = False,
    signal: int | None = None,
    grace_ms: int | None = None,
    rows: int | None = None,
    cols: int | None = None,
) -> bytes:
    """The record of one op on a kept process (module docstring: ``p*`` ops)."""
    fields = [_field("o", op.encode())]
    if stream is not None:
        fields.append(_field("n", stream.encode()))
    if offset is not None:
        fields.append(_u64("f", offset))
    if wait_ms is not None:
        fields.append(_u64("t", wait_ms))
    if data:
        fields.append(_field("i", data))
    if close_stdin:
        fields.append(_field("x", b"\x01"))
    if signal is not None:
        fields.append(_u64("z", signal))
    if grace_ms is not None:
        fields.append(_u64("g", grace_ms))
    if rows is not None:
        fields.append(_u64("r", rows))
    if cols is not None:
        fields.append(_u64("l", cols))
    return _record(fields)


def with_identity(record: bytes, user: str) -> bytes:
    """``record`` plus the identity to run as (``u`` field; ``""`` is root), for the channel,
    where no ``docker exec -u`` sets it."""
    body = record[8:] + _field("u", _text(user, field="user"))
    return MAGIC + struct.pack(">I", len(body)) + body


def supervisor_args(record: bytes) -> tuple[list[str], bytes | None]:
    """The supervisor's argv suffix, and the bytes to send on its stdin (None: no stdin)."""
    encoded = base64.b64encode(record).decode("ascii")
    if len(encoded) <= ARGV_LIMIT_CHARS:
        return ["--request", encoded], None
    return ["--request-stdin"], record


# ------------------------------------------------------------------------------ frames


@dataclass(frozen=True, slots=True)
class Frame:
    """One supervisor frame: ``kind`` is the type byte (``FRAME_*``)."""

    kind: int
    payload: bytes


class FrameDecoder:
    """Incremental frame parser: ``feed`` bytes in any pieces, get whole frames out."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[Frame]:
        """Append ``data``; return the frames completed by it. ``SandboxError`` on garbage."""
        self._buf += data
        frames = []
        while len(self._buf) >= _FRAME_HEADER.size:
            kind, length = _FRAME_HEADER.unpack_from(self._buf)
            if kind not in b"OESPRXC" or length > _MAX_FRAME_BYTES:
                preview = bytes(self._buf[:64])
                raise SandboxError(f"exec supervisor sent an invalid frame: {preview!r}")
            end = _FRAME_HEADER.size + length
            if len(self._buf) < end:
                break
            frames.append(Frame(kind, bytes(self._buf[_FRAME_HEADER.size : end])))
            del self._buf[:end]
        return frames

    @property
    def pending_bytes(self) -> int:
        """Bytes received that do not yet form a whole frame."""
        return len(self._buf)


def parse_kv(payload: bytes) -> dict[str, str]:
    """Parse an ``R`` frame's ``key=value`` lines."""
    out = {}
    for line in payload.decode("ascii", "replace").splitlines():
        key, sep, value = line.partition("=")
        if sep:
            out[key] = value
    return out


def raise_for_error(frame: Frame) -> None:
    """Raise the error an ``X`` frame stands for.

    ``cwd`` -> ``InvalidRequest`` (field cwd); ``path`` -> ``InvalidRequest`` (field path);
    ``user`` (the channel could not take the identity) -> ``InvalidRequest`` (field user);
    anything else (request, spawn, internal) -> ``SandboxError``.
    """
    kind, _, message = frame.payload.decode("utf-8", "replace").partition("\n")
    if kind == "cwd":
        raise InvalidRequest(message, field="cwd")
    if kind == "user":
        raise InvalidRequest(message, field="user")
    if kind == "path":
        raise InvalidRequest(message, field="path")
    raise SandboxError(f"exec supervisor failed ({kind}): {message}")


class ExecCollector:
    """Turns an exec's frames into live ``ExecChunk``s and the final ``ExecResult``."""

    def __init__(self) -> None:
        self._out: list[bytes] = []
        self._err: list[bytes] = []
        self._obs: list[bytes] = []
        self.result: ExecResult | None = None
        self.oom_known = True  # False when the sandbox's OOM counter was not readable
        self.pid: int | None = None  # the command's pid (= process group) once started

    def add(self, frame: Frame) -> ExecChunk | ExecResult | None:
        """Consume one frame; return what it means for a caller (None: nothing to show)."""
        if frame.kind == FRAME_STDOUT:
            self._out.append(frame.payload)
            return ExecChunk("stdout", frame.payload)
        if frame.kind == FRAME_STDERR:
            self._err.append(frame.payload)
            return ExecChunk("stderr", frame.payload)
        if frame.kind == FRAME_OBSERVED:
            self._obs.append(frame.payload)
            return None
        if frame.kind == FRAME_STARTED:
            with contextlib.suppress(KeyError, ValueError):
                self.pid = int(parse_kv(frame.payload)["pid"])
            return None
        if frame.kind == FRAME_ERROR:
            raise_for_error(frame)
        if frame.kind == FRAME_RESULT:
            self.result = self._result(parse_kv(frame.payload))
            return self.result
        raise SandboxError(f"exec supervisor sent an unexpected frame {chr(frame.kind)!r}")

    def lost(self, duration_ms: float) -> ExecResult:
        """The result of a command whose handler was killed before its ``R`` frame: exit
        137 (SIGKILL), the output that arrived, ``handler_lost`` (see ``ExecResult``)."""
        out, err = b"".join(self._out), b"".join(self._err)
        self.result = ExecResult(
            exit_code=137,
            signal=9,
            stdout=out,
            stderr=err,
            stdout_total_bytes=len(out),
            stderr_total_bytes=len(err),
            duration_ms=duration_ms,
            observed=b"".join(self._obs),
            handler_lost=True,
        )
        return self.result

    def _result(self, kv: Mapping[str, str]) -> ExecResult:
        self.oom_known = kv.get("oom_killed") != "-1"
        try:
            signal = int(kv["signal"])
            return ExecResult(
                exit_code=int(kv["exit_code"]),
                signal=signal or None,
                timed_out=kv["timed_out"] == "1",
                oom_killed=kv["oom_killed"] == "1",
                pids_limit_hit=kv.get("pids_limit_hit") == "1",
                stdout=b"".join(self._out),
                stderr=b"".join(self._err),
                stdout_total_bytes=int(kv["stdout_total"]),
                stderr_total_bytes=int(kv["stderr_total"]),
                stdout_truncated=kv["stdout_truncated"] == "1",
                stderr_truncated=kv["stderr_truncated"] == "1",
                duration_ms=float(kv["duration_ms"]),
                observed=b"".join(self._obs),
                observed_truncated=kv.get("observed_truncated") == "1",
            )
        except (KeyError, ValueError) as e:
            raise SandboxError(f"exec supervisor sent a malformed result: {dict(kv)!r}") from e
