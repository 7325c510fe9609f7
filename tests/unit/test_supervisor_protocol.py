"""The supervisor wire format (``service.runtime.protocol``) and ``crucible-exec`` itself.

The second half compiles ``crucible-exec.c`` with the host's C compiler and runs it as a
plain subprocess (no Docker), so the process semantics are checked in seconds.
"""

from __future__ import annotations

import base64
import shutil
import struct
import subprocess
import time
from pathlib import Path

import pytest

from service.errors import InvalidRequest, SandboxError
from service.runtime.base import ExecChunk, ExecRequest, ExecResult
from service.runtime.docker import SUPERVISOR_DIR
from service.runtime.protocol import (
    ARGV_LIMIT_CHARS,
    ExecCollector,
    Frame,
    FrameDecoder,
    encode_exec,
    encode_kill,
    encode_resolve,
    supervisor_args,
)


def parse_record(record: bytes) -> list[tuple[str, bytes]]:
    """Decode a request record into (tag, value) pairs, checking magic and lengths."""
    assert record[:4] == b"CRX1"
    (body_len,) = struct.unpack(">I", record[4:8])
    assert body_len == len(record) - 8
    fields, pos = [], 8
    while pos < len(record):
        tag, length = (
            record[pos : pos + 1].decode(),
            struct.unpack(">I", record[pos + 1 : pos + 5])[0],
        )
        fields.append((tag, record[pos + 5 : pos + 5 + length]))
        pos += 5 + length
    assert pos == len(record)
    return fields


def frame(kind: str, payload: bytes) -> bytes:
    return kind.encode() + struct.pack(">I", len(payload)) + payload


RESULT = (
    b"exit_code=3\nsignal=0\ntimed_out=0\noom_killed=0\nstdout_total=5\nstderr_total=0\n"
    b"stdout_truncated=0\nstderr_truncated=0\nduration_ms=1.500\n"
)


# ---------------------------------------------------------------------------- encoding


def test_encode_exec_shell_fields() -> None:
    request = ExecRequest(
        cmd="echo hi",
        timeout_s=1.5,
        cwd="/tmp",
        env={"A": b"\xff", "B": b""},
        stdin=b"\x00in",
        max_output_bytes=1000,
    )
    fields = parse_record(encode_exec(request, grace_ms=250))
    assert fields == [
        ("o", b"exec"),
        ("s", b"echo hi"),
        ("c", b"/tmp"),
        ("e", b"A=\xff"),
        ("e", b"B="),
        ("i", b"\x00in"),
        ("t", struct.pack(">Q", 1500)),
        ("m", struct.pack(">Q", 1000)),
        ("g", struct.pack(">Q", 250)),
    ]


def test_encode_exec_argv_keeps_order() -> None:
    fields = parse_record(encode_exec(ExecRequest(cmd=["printf", "%s", "a b"])))
    assert [v for t, v in fields if t == "a"] == [b"printf", b"%s", b"a b"]
    assert not [t for t, _ in fields if t == "s"]


@pytest.mark.parametrize(
    ("request_kw", "field"),
    [
        ({"cmd": "x", "env": {"A": b"a\x00b"}}, "env"),
        ({"cmd": "x", "env": {"A=B": b"v"}}, "env"),
        ({"cmd": "x", "env": {"": b"v"}}, "env"),
        ({"cmd": "x\x00y"}, "cmd"),
        ({"cmd": []}, "cmd"),
        ({"cmd": "x", "cwd": "/a\x00"}, "cwd"),
        ({"cmd": "x", "timeout_s": 0}, "timeout_s"),
        ({"cmd": "x", "max_output_bytes": -1}, "max_output_bytes"),
    ],
)
def test_encode_exec_rejects_bad_input(request_kw: dict, field: str) -> None:
    with pytest.raises(InvalidRequest) as err:
        encode_exec(ExecRequest(**request_kw))
    assert err.value.field == field


def test_small_records_travel_in_argv_large_on_stdin() -> None:
    small = encode_exec(ExecRequest(cmd="true"))
    args, stdin = supervisor_args(small)
    assert args[0] == "--request" and stdin is None
    assert base64.b64decode(args[1]) == small
    large = encode_exec(ExecRequest(cmd="cat", stdin=b"x" * ARGV_LIMIT_CHARS))
    assert supervisor_args(large) == (["--request-stdin"], large)


def test_encode_resolve_and_kill() -> None:
    assert parse_record(encode_resolve("/a/b", create_parents=True)) == [
        ("o", b"resolve"),
        ("p", b"/a/b"),
        ("P", b"\x01"),
    ]
    assert parse_record(encode_kill(42, grace_ms=7))[1] == ("k", struct.pack(">Q", 42))
    with pytest.raises(InvalidRequest):
        encode_kill(1)


# ---------------------------------------------------------------------------- decoding


def test_frame_decoder_is_incremental() -> None:
    stream = frame("O", b"hello") + frame("E", b"") + frame("R", RESULT)
    decoder, frames = FrameDecoder(), []
    for i in range(len(stream)):
        frames += decoder.feed(stream[i : i + 1])
    assert [(f.kind, f.payload) for f in frames] == [
        (ord("O"), b"hello"),
        (ord("E"), b""),
        (ord("R"), RESULT),
    ]
    assert decoder.pending_bytes == 0


def test_frame_decoder_rejects_garbage() -> None:
    with pytest.raises(SandboxError, match="invalid frame"):
        FrameDecoder().feed(b"OCI runtime exec failed: exec failed")


def test_collector_builds_result_and_chunks() -> None:
    collector = ExecCollector()
    items = [
        collector.add(Frame(ord("S"), b"pid=17\n")),
        collector.add(Frame(ord("O"), b"hel")),
        collector.add(Frame(ord("O"), b"lo")),
        collector.add(Frame(ord("R"), RESULT)),
    ]
    assert items[0] is None and collector.pid == 17
    assert items[1] == ExecChunk("stdout", b"hel")
    result = items[3]
    assert isinstance(result, ExecResult)
    assert (result.exit_code, result.signal, result.stdout, result.duration_ms) == (
        3,
        None,
        b"hello",
        1.5,
    )
    assert collector.oom_known is True


@pytest.mark.parametrize(
    ("payload", "error", "field"),
    [
        (b"cwd\ncwd /x: No such file or directory", InvalidRequest, "cwd"),
        (b"path\n/x: Permission denied", InvalidRequest, "path"),
        (b"spawn\nfork: Resource temporarily unavailable", SandboxError, None),
    ],
)
def test_collector_maps_error_frames(payload: bytes, error: type, field: str | None) -> None:
    with pytest.raises(error) as err:
        ExecCollector().add(Frame(ord("X"), payload))
    assert err.value.field == field


def test_collector_rejects_malformed_result() -> None:
    with pytest.raises(SandboxError, match="malformed"):
        ExecCollector().add(Frame(ord("R"), b"exit_code=zero\n"))


# ------------------------------------------------------------ the binary, run locally


@pytest.fixture(scope="module")
def supervisor(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.fail("no C compiler (cc or gcc) on this host: install gcc to test the supervisor")
    out = tmp_path_factory.mktemp("supervisor") / "crucible-exec"
    src = SUPERVISOR_DIR / "crucible-exec.c"
    subprocess.run([cc, "-O2", "-Wall", "-Wextra", "-Werror", "-o", str(out), str(src)], check=True)
    return out


def run_local(binary: Path, record: bytes) -> tuple[list[Frame], float]:
    args, stdin = supervisor_args(record)
    start = time.monotonic()
    proc = subprocess.run([str(binary), *args], input=stdin, capture_output=True, timeout=30)
    return FrameDecoder().feed(proc.stdout), time.monotonic() - start


def exec_local(binary: Path, **kw: object) -> tuple[ExecResult, float]:
    frames, elapsed = run_local(binary, encode_exec(ExecRequest(**kw)))
    collector = ExecCollector()
    for f in frames:
        collector.add(f)
    assert collector.result is not None
    return collector.result, elapsed


def test_local_exit_codes(supervisor: Path) -> None:
    assert exec_local(supervisor, cmd="exit 3")[0].exit_code == 3
    assert exec_local(supervisor, cmd="nonexistent-cmd-xyz")[0].exit_code == 127
    assert exec_local(supervisor, cmd=["nonexistent-cmd-xyz"])[0].exit_code == 127
    killed = exec_local(supervisor, cmd="kill -9 $$")[0]
    assert (killed.exit_code, killed.signal) == (137, 9)


def test_local_cap_head_and_tail(supervisor: Path) -> None:
    result, _ = exec_local(supervisor, cmd="seq 1 1000", max_output_bytes=9)
    full = b"".join(b"%d\n" % i for i in range(1, 1001))
    assert result.stdout == full[:5] + full[-4:]  # head 9 - 9 // 2 = 5, tail 9 // 2 = 4
    assert (result.stdout_total_bytes, result.stdout_truncated) == (len(full), True)
    empty, _ = exec_local(supervisor, cmd="echo x", max_output_bytes=0)
    assert (empty.stdout, empty.stdout_truncated, empty.stdout_total_bytes) == (b"", True, 2)


def test_local_timeout_and_background(supervisor: Path) -> None:
    result, elapsed = exec_local(supervisor, cmd="echo a; sleep 20", timeout_s=0.3)
    assert (result.timed_out, result.stdout, result.exit_code) == (True, b"a\n", 143)
    assert elapsed < 2.0
    result, elapsed = exec_local(supervisor, cmd="sleep 2 & echo hi")
    assert (result.stdout, result.exit_code) == (b"hi\n", 0)
    assert elapsed < 1.5


def test_local_stdin_and_env(supervisor: Path) -> None:
    data = bytes(range(256)) * 2000
    assert exec_local(supervisor, cmd="cat", stdin=data)[0].stdout == data
    result, _ = exec_local(supervisor, cmd='printf %s "$V"; cd; pwd', env={"V": b"\xfe\x01"})
    assert result.stdout.startswith(b"\xfe\x01")


def test_local_resolve(supervisor: Path, tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    frames, _ = run_local(
        supervisor, encode_resolve(f"{tmp_path}/link/x/../y/z", create_parents=True)
    )
    assert frames[0].payload == f"{tmp_path}/real/y/z".encode()
    assert (tmp_path / "real" / "y").is_dir()
    frames, _ = run_local(supervisor, encode_resolve("relative"))
    assert frames[0].kind == ord("X") and frames[0].payload.startswith(b"path\n")


def test_local_resolve_missing_top_level_dir(supervisor: Path) -> None:
    # Regression: a path whose first component is missing resolved to "/<last component>".
    missing = "/crucible-no-such-dir-5f1c/sub/file"
    frames, _ = run_local(supervisor, encode_resolve(missing))
    assert frames[0].payload == missing.encode()


def test_local_rejects_bad_records(supervisor: Path) -> None:
    proc = subprocess.run([str(supervisor), "--request", "!!!"], capture_output=True)
    frames = FrameDecoder().feed(proc.stdout)
    assert proc.returncode == 2
    assert frames[0].kind == ord("X") and frames[0].payload.startswith(b"request\n")
    version = subprocess.run([str(supervisor), "--version"], capture_output=True, text=True)
    assert version.stdout == "crucible-exec dev\n"
