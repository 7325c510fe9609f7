"""``DockerRuntime`` against the real engine: one test per rule of DESIGN.md section 5.

Every container carries the session's unique deployment label and is removed at the end
(``tests/conftest.py``); snapshot images use a unique repository and are removed too.
"""

from __future__ import annotations

import io
import secrets
import tarfile
import threading
import time
from collections.abc import Callable, Iterator

import docker
import pytest

from service.errors import Conflict, InvalidRequest, NotFound
from service.runtime.base import ROOT, ExecChunk, ExecRequest, ExecResult
from service.runtime.docker import SUPERVISOR_MOUNT, DockerRuntime
from tests.runtimeutil import deployment_of, sandbox_factory

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module", params=["channel", "docker-exec"])
def docker_runtime(request: pytest.FixtureRequest, docker_runtime: DockerRuntime) -> DockerRuntime:
    """Every test here runs over both transports: the exec channel (the default) and
    ``docker exec`` (its fallback, and the only one for an engine on another host)."""
    if request.param == "channel":
        return docker_runtime
    runtime = DockerRuntime(client=docker_runtime._client)
    runtime.ensure_ready()
    return runtime


@pytest.fixture(scope="module")
def runtime_deployment(docker_runtime: DockerRuntime) -> Iterator[str]:
    """This module's deployment label (per transport)."""
    yield from deployment_of(docker_runtime)


@pytest.fixture(scope="module")
def make_sandbox(
    docker_runtime: DockerRuntime, runtime_deployment: str, sandbox_image: str
) -> Callable[..., str]:
    """Sandboxes made by this module's runtime (with a channel, or without one)."""
    return sandbox_factory(docker_runtime, runtime_deployment, sandbox_image)


@pytest.fixture(scope="module")
def sandbox(make_sandbox: Callable[..., str]) -> str:
    """One shared sandbox for the tests that do not break their sandbox."""
    return make_sandbox()


def run(
    runtime: DockerRuntime, container_id: str, cmd: str | list[str], **kw: object
) -> ExecResult:
    return runtime.exec(container_id, ExecRequest(cmd=cmd, **kw))


# ------------------------------------------------------------------------ exit codes


def test_exit_status_is_exact(docker_runtime: DockerRuntime, sandbox: str) -> None:
    result = run(docker_runtime, sandbox, "exit 3")
    assert (result.exit_code, result.signal, result.timed_out) == (3, None, False)


def test_command_not_found_is_127(docker_runtime: DockerRuntime, sandbox: str) -> None:
    assert run(docker_runtime, sandbox, "nonexistent-cmd").exit_code == 127
    argv = run(docker_runtime, sandbox, ["nonexistent-cmd", "x"])
    assert argv.exit_code == 127
    assert b"nonexistent-cmd" in argv.stderr


def test_a_command_that_kills_its_own_handler_counts_as_killed(
    docker_runtime: DockerRuntime, make_sandbox: Callable[..., str]
) -> None:
    # Regression: `kill -9 -1` kills every process the sandbox's root may signal, the
    # command's handler too, and the exec was a SandboxError (502 through the API, and a
    # rollout runner's "infrastructure": the sample re-rolled instead of scored). Not as
    # root: that kills the sandbox's main process as well, and the container stops.
    box = make_sandbox()
    for stream in (False, True):
        req = ExecRequest(cmd="kill -9 -1; sleep 5", timeout_s=30, user="1000:1000")
        if stream:
            items = list(docker_runtime.exec_stream(box, req))
            result = items[-1]
            assert isinstance(result, ExecResult)
        else:
            result = docker_runtime.exec(box, req)
        assert (result.handler_lost, result.exit_code, result.signal) == (True, 137, 9)
        assert not result.timed_out
        assert run(docker_runtime, box, "echo after").stdout == b"after\n"  # still usable
    assert not run(docker_runtime, box, "true").handler_lost


def test_a_command_that_stops_its_own_handler_counts_as_killed(
    docker_runtime: DockerRuntime, make_sandbox: Callable[..., str]
) -> None:
    # Regression: a handler stopped by its own command (SIGSTOP) never replied, and past
    # the read timeout the exec was a SandboxError (502: to a runner, infrastructure).
    box = make_sandbox()
    # (the first second: the handler has told the command's pid before it is stopped)
    cmd = "sleep 1; kill -STOP $PPID; sleep 300"
    result = docker_runtime.exec(box, ExecRequest(cmd=cmd, timeout_s=2, user="1000:1000"))
    assert (result.handler_lost, result.exit_code) == (True, 137)
    assert run(docker_runtime, box, "echo after").stdout == b"after\n"
    left = run(docker_runtime, box, "pgrep -c -x sleep || true").stdout.strip()
    assert left == b"0", left  # the command was ended with its lost handler


def test_killed_by_signal_is_128_plus_n(docker_runtime: DockerRuntime, sandbox: str) -> None:
    result = run(docker_runtime, sandbox, "kill -9 $$")
    assert (result.exit_code, result.signal, result.oom_killed) == (137, 9, False)


# ------------------------------------------------------------------ timeout, background


def test_timeout_kills_group_and_keeps_output(docker_runtime: DockerRuntime, sandbox: str) -> None:
    start = time.monotonic()
    result = run(docker_runtime, sandbox, "echo before; sleep 30", timeout_s=1)
    elapsed = time.monotonic() - start
    assert result.timed_out is True
    assert result.stdout == b"before\n"
    assert (result.exit_code, result.signal) == (143, 15)  # sh died of the SIGTERM
    assert elapsed < 3.0
    # The whole group died: no `sleep 30` is left.
    left = run(docker_runtime, sandbox, "for p in /proc/[0-9]*; do cat $p/cmdline; echo; done")
    assert b"sleep\x0030" not in left.stdout


def test_timeout_escalates_to_sigkill(docker_runtime: DockerRuntime, sandbox: str) -> None:
    start = time.monotonic()
    result = run(docker_runtime, sandbox, "trap '' TERM; while :; do :; done", timeout_s=0.5)
    assert time.monotonic() - start < 2.5
    assert (result.timed_out, result.exit_code, result.signal) == (True, 137, 9)


@pytest.mark.parametrize("cmd", ["sleep 30 & echo hi", "(sleep 30 &) ; echo hi"])
def test_returns_when_background_child_holds_stdout(
    docker_runtime: DockerRuntime, sandbox: str, cmd: str
) -> None:
    start = time.monotonic()
    result = run(docker_runtime, sandbox, cmd)
    assert time.monotonic() - start < 2.0
    assert (result.exit_code, result.stdout, result.timed_out) == (0, b"hi\n", False)


def test_background_server_survives_later_execs(
    docker_runtime: DockerRuntime, sandbox: str
) -> None:
    # The server writes to the exec's stdout forever: it must not die of SIGPIPE.
    started = run(
        docker_runtime,
        sandbox,
        "while :; do echo tick; sleep 0.05; done & echo $! > /tmp/server.pid; echo started",
    )
    assert b"started\n" in started.stdout
    time.sleep(1.0)
    alive = run(docker_runtime, sandbox, 'kill -0 "$(cat /tmp/server.pid)" && echo alive')
    assert (alive.exit_code, alive.stdout) == (0, b"alive\n")
    run(docker_runtime, sandbox, 'kill "$(cat /tmp/server.pid)"')


# -------------------------------------------------------------------------- stdin, bytes


def test_stdin_is_empty_by_default(docker_runtime: DockerRuntime, sandbox: str) -> None:
    start = time.monotonic()
    result = run(docker_runtime, sandbox, "cat", timeout_s=10)
    assert time.monotonic() - start < 2.0
    assert (result.exit_code, result.stdout, result.timed_out) == (0, b"", False)


@pytest.mark.parametrize("size", [6, 300_000])  # argv-borne and stdin-borne request records
def test_stdin_bytes_round_trip(docker_runtime: DockerRuntime, sandbox: str, size: int) -> None:
    data = (b"\x00\xff\xfeab\n" * size)[:size]
    result = run(docker_runtime, sandbox, "cat", stdin=data)
    assert result.stdout == data
    assert result.stdout_total_bytes == size


def test_output_cap_keeps_head_and_tail(docker_runtime: DockerRuntime, sandbox: str) -> None:
    zeros = run(docker_runtime, sandbox, "head -c 3000000 /dev/zero", max_output_bytes=1000)
    assert len(zeros.stdout) == 1000
    assert zeros.stdout_truncated is True
    assert zeros.stdout_total_bytes == 3_000_000
    full = b"".join(b"%d\n" % i for i in range(1, 100_001))
    seq = run(docker_runtime, sandbox, "seq 1 100000", max_output_bytes=21)
    # head = 21 - 21 // 2 = 11 bytes, tail = 21 // 2 = 10 bytes
    assert seq.stdout == full[:11] + full[-10:]
    assert (seq.stdout_total_bytes, seq.stdout_truncated) == (len(full), True)
    exact = run(docker_runtime, sandbox, "printf 0123456789", max_output_bytes=10)
    assert (exact.stdout, exact.stdout_truncated) == (b"0123456789", False)


def test_stderr_is_capped_separately(docker_runtime: DockerRuntime, sandbox: str) -> None:
    result = run(
        docker_runtime, sandbox, "head -c 5000 /dev/zero >&2; echo out", max_output_bytes=100
    )
    assert (result.stdout, result.stdout_truncated) == (b"out\n", False)
    assert (len(result.stderr), result.stderr_truncated, result.stderr_total_bytes) == (
        100,
        True,
        5000,
    )


def test_raw_bytes_round_trip(docker_runtime: DockerRuntime, sandbox: str) -> None:
    result = run(docker_runtime, sandbox, r"printf '\377\376\000abc'")
    assert result.stdout == b"\xff\xfe\x00abc"


def test_env_value_arrives_byte_for_byte(docker_runtime: DockerRuntime, sandbox: str) -> None:
    value = b"\xff\xfe caf\xc3\xa9 \x01$HOME 'q'"
    result = run(docker_runtime, sandbox, 'printf %s "$X"', env={"X": value})
    assert result.stdout == value


def test_cwd_and_env_are_honoured(docker_runtime: DockerRuntime, sandbox: str) -> None:
    assert run(docker_runtime, sandbox, "pwd").stdout == b"/workspace\n"
    result = run(
        docker_runtime, sandbox, 'pwd; echo "$GREETING"', cwd="/tmp", env={"GREETING": b"hi"}
    )
    assert result.stdout == b"/tmp\nhi\n"
    with pytest.raises(InvalidRequest) as err:
        run(docker_runtime, sandbox, "pwd", cwd="/does/not/exist")
    assert err.value.field == "cwd"


def test_concurrent_execs_do_not_mix(docker_runtime: DockerRuntime, sandbox: str) -> None:
    results: dict[str, ExecResult] = {}

    def worker(marker: str) -> None:
        cmd = f"i=0; while [ $i -lt 3000 ]; do echo {marker}; i=$((i+1)); done"
        results[marker] = run(docker_runtime, sandbox, cmd)

    threads = [threading.Thread(target=worker, args=(m,)) for m in ("AAAA", "BBBB", "CCCC")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for marker, result in results.items():
        assert result.stdout == f"{marker}\n".encode() * 3000


def test_exec_stream_yields_chunks_then_result(docker_runtime: DockerRuntime, sandbox: str) -> None:
    items = list(
        docker_runtime.exec_stream(
            sandbox, ExecRequest(cmd="echo one; sleep 0.3; echo two >&2; echo three")
        )
    )
    assert isinstance(items[-1], ExecResult)
    assert sum(isinstance(i, ExecResult) for i in items) == 1
    chunks = [i for i in items if isinstance(i, ExecChunk)]
    assert b"".join(c.data for c in chunks if c.stream == "stdout") == b"one\nthree\n"
    assert b"".join(c.data for c in chunks if c.stream == "stderr") == b"two\n"
    assert items[-1].stdout == b"one\nthree\n"


def test_closing_a_stream_early_stops_the_command(
    docker_runtime: DockerRuntime, sandbox: str
) -> None:
    stream = docker_runtime.exec_stream(
        sandbox, ExecRequest(cmd="echo start; exec sleep 77", timeout_s=60)
    )
    assert next(stream) == ExecChunk("stdout", b"start\n")
    stream.close()
    procs = run(docker_runtime, sandbox, "cat /proc/[0-9]*/cmdline | tr '\\0' ' '")
    assert b"sleep 77" not in procs.stdout


# ---------------------------------------------------------------------------- limits


def test_fork_bomb_is_contained(
    docker_runtime: DockerRuntime, make_sandbox: Callable[..., str]
) -> None:
    box = make_sandbox(pids_limit=64)
    start = time.monotonic()
    # bash retries a failed fork (for ~30 s) where dash gives up: the bomb stays in the
    # foreground until the timeout kills its process group.
    bomb = ["bash", "-c", "bomb() { bomb | bomb; }; bomb"]
    result = run(docker_runtime, box, bomb, timeout_s=3)
    assert result.timed_out is True
    assert time.monotonic() - start < 10.0
    assert docker_runtime.ping()
    after = run(docker_runtime, box, "echo ok")
    assert (after.exit_code, after.stdout) == (0, b"ok\n")


def test_memory_bomb_is_oom_killed(
    docker_runtime: DockerRuntime, make_sandbox: Callable[..., str]
) -> None:
    box = make_sandbox(memory_bytes=128 << 20)
    result = run(docker_runtime, box, "head -c 400m /dev/zero | tail", timeout_s=60)
    assert (result.exit_code, result.oom_killed, result.timed_out) == (137, True, False)
    after = run(docker_runtime, box, "echo ok")
    assert (after.stdout, after.oom_killed) == (b"ok\n", False)


def test_container_limits_are_applied(
    docker_runtime: DockerRuntime, make_sandbox: Callable[..., str]
) -> None:
    box = make_sandbox(
        cpus=0.5, memory_bytes=256 << 20, pids_limit=100, nofile=512, tmpfs={"/scratch": 8 << 20}
    )
    host = docker.from_env().api.inspect_container(box)["HostConfig"]
    assert host["NanoCpus"] == 500_000_000
    assert host["Memory"] == host["MemorySwap"] == 256 << 20
    assert host["PidsLimit"] == 100
    assert host["NetworkMode"] == "none"
    assert host["CapDrop"] == ["ALL"]
    assert "no-new-privileges" in host["SecurityOpt"]
    assert host["Init"] is True
    assert run(docker_runtime, box, "ulimit -n").stdout == b"512\n"
    filled = run(docker_runtime, box, "head -c 20m /dev/zero > /scratch/f")
    assert filled.exit_code != 0  # the 8 MiB tmpfs is full
    assert run(docker_runtime, box, "wc -c < /scratch/f").stdout == b"8388608\n"


def test_supervisor_volume_is_read_only(docker_runtime: DockerRuntime, sandbox: str) -> None:
    for cmd in (
        f"echo x > {SUPERVISOR_MOUNT}/x",
        f"rm -f {SUPERVISOR_MOUNT}/crucible-exec",
        f"cp /bin/sh {SUPERVISOR_MOUNT}/crucible-exec",
        f"mv {SUPERVISOR_MOUNT} /opt/elsewhere",
        f"chmod 777 {SUPERVISOR_MOUNT}/crucible-exec",
    ):
        assert run(docker_runtime, sandbox, cmd).exit_code != 0, cmd
    assert run(docker_runtime, sandbox, "echo still").stdout == b"still\n"


def test_non_root_user_owns_its_workdir(
    docker_runtime: DockerRuntime, make_sandbox: Callable[..., str]
) -> None:
    box = make_sandbox(user="nobody", workdir="/home/agent")
    result = run(docker_runtime, box, "id -u; pwd; touch mine && ls -n mine | cut -d' ' -f3")
    assert result.stdout == b"65534\n/home/agent\n65534\n"
    assert run(docker_runtime, box, "id -u", user="root").stdout == b"0\n"


# ----------------------------------------------------------------- files, snapshots


def test_resolve_path(docker_runtime: DockerRuntime, sandbox: str) -> None:
    run(
        docker_runtime,
        sandbox,
        "mkdir -p /workspace/real && ln -sfn /workspace/real /workspace/link",
    )
    assert docker_runtime.resolve_path(sandbox, "/workspace/link/a/../b") == "/workspace/real/b"
    resolved = docker_runtime.resolve_path(
        sandbox, "/workspace/link/new/dir/f.txt", create_parents=True
    )
    assert resolved == "/workspace/real/new/dir/f.txt"
    assert run(docker_runtime, sandbox, "test -d /workspace/real/new/dir").exit_code == 0
    with pytest.raises(InvalidRequest):
        docker_runtime.resolve_path(sandbox, "relative/path")


def test_put_and_get_archive(docker_runtime: DockerRuntime, sandbox: str) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("hello.bin")
        info.size = 4
        tar.addfile(info, io.BytesIO(b"\x00\x01\xff\n"))
    docker_runtime.put_archive(sandbox, "/workspace", buf.getvalue())
    assert run(docker_runtime, sandbox, "od -An -tx1 /workspace/hello.bin").stdout.split() == [
        b"00",
        b"01",
        b"ff",
        b"0a",
    ]
    data = b"".join(docker_runtime.get_archive(sandbox, "/workspace/hello.bin"))
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        assert tar.extractfile("hello.bin").read() == b"\x00\x01\xff\n"
    with pytest.raises(NotFound):
        docker_runtime.get_archive(sandbox, "/workspace/missing")


def test_a_pristine_sandboxs_own_tar_extracts_owners_and_modes_as_the_engine(
    docker_runtime: DockerRuntime, make_sandbox: Callable[..., str]
) -> None:
    # The verifier's replay extracts with the sandbox's tar (pristine_tar): the same
    # numeric owners, modes, links and times as the engine's untar (one quirk apart: the
    # engine drops the setuid bit of a hard-linked file, tar keeps it); an image without
    # tar falls back to the engine.
    def archive() -> bytes:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
            d = tarfile.TarInfo("r/d")
            d.type, d.mode, d.uid, d.gid, d.uname = tarfile.DIRTYPE, 0o750, 1234, 4321, "root"
            tar.addfile(d)
            f = tarfile.TarInfo("r/d/f")
            f.size, f.mode, f.uid, f.gid, f.mtime = 3, 0o754, 1234, 0, 1_000_000_000
            tar.addfile(f, io.BytesIO(b"abc"))
            link = tarfile.TarInfo("r/l")
            link.type, link.linkname = tarfile.SYMTYPE, "d/f"
            tar.addfile(link)
            hard = tarfile.TarInfo("r/h")  # as export_entries writes one: its inode's stat
            hard.type, hard.linkname, hard.mode, hard.uid = tarfile.LNKTYPE, "r/d/f", 0o754, 1234
            hard.mtime = f.mtime
            tar.addfile(hard)
        return buf.getvalue()

    fmt = "stat -c '%n %u %g %a %Y %h %F' /x/r/d /x/r/d/f /x/r/l /x/r/h"
    seen = []
    for pristine in (False, True):
        box = make_sandbox()
        run(docker_runtime, box, "mkdir /x", user=ROOT)
        docker_runtime.put_archive(box, "/x", archive(), pristine_tar=pristine)
        seen.append(run(docker_runtime, box, fmt, user=ROOT).stdout)
    assert seen[0] == seen[1] and b"/x/r/d/f 1234 0 754 1000000000 2 regular" in seen[1]
    box = make_sandbox()
    run(docker_runtime, box, "mkdir /x && rm -f $(command -v tar)", user=ROOT)
    docker_runtime.put_archive(box, "/x", archive(), pristine_tar=True)
    assert run(docker_runtime, box, fmt, user=ROOT).stdout == seen[0]


def test_a_pristine_tar_failure_is_named_behind_any_warnings(
    docker_runtime: DockerRuntime, make_sandbox: Callable[..., str]
) -> None:
    # Trial 25: a member the filesystem refused, then 40 members dated in the future: only
    # the last 2 KB of tar's complaints were read, the refusal was not among them, and the
    # verdict became an error instead of the end state's 0.
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        f = tarfile.TarInfo("r/f")
        f.size = 1
        tar.addfile(f, io.BytesIO(b"x"))
        inside = tarfile.TarInfo("r/f/g")  # through a file: Not a directory
        tar.addfile(inside)
        for i in range(40):
            late = tarfile.TarInfo(f"r/late-{i:02d}-{'n' * 60}")
            late.mtime = 99_999_999_999
            tar.addfile(late)
    box = make_sandbox()
    run(docker_runtime, box, "mkdir /x", user=ROOT)
    assert docker_runtime.marks_type_changes(box)  # this host reads its layers
    with pytest.raises(Conflict, match="r/f/g"):
        docker_runtime.put_archive(box, "/x", buf.getvalue(), pristine_tar=True)


def test_archives_reach_tmpfs_mounts(
    docker_runtime: DockerRuntime, make_sandbox: Callable[..., str]
) -> None:
    # The engine's archive API does not see tmpfs mounts; the runtime goes through tar.
    box = make_sandbox(tmpfs={"/scratch": 8 << 20})
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("in.txt")
        info.size = 2
        tar.addfile(info, io.BytesIO(b"hi"))
    docker_runtime.put_archive(box, "/scratch", buf.getvalue())
    assert run(docker_runtime, box, "cat /scratch/in.txt").stdout == b"hi"
    run(docker_runtime, box, "mkdir /scratch/d && printf out > /scratch/d/out.txt")
    data = b"".join(docker_runtime.get_archive(box, "/scratch/d"))
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        assert tar.extractfile("d/out.txt").read() == b"out"
    with pytest.raises(NotFound):
        docker_runtime.get_archive(box, "/scratch/missing")


def test_unknown_exec_user_is_invalid(docker_runtime: DockerRuntime, sandbox: str) -> None:
    with pytest.raises(InvalidRequest) as err:
        run(docker_runtime, sandbox, "id", user="no-such-user")
    assert err.value.field == "user"


def test_disk_usage_grows(docker_runtime: DockerRuntime, make_sandbox: Callable[..., str]) -> None:
    box = make_sandbox()
    before = docker_runtime.disk_usage_bytes(box)
    run(docker_runtime, box, "head -c 5m /dev/zero > /workspace/blob")
    assert docker_runtime.disk_usage_bytes(box) >= before + (5 << 20)


def test_removing_a_snapshot_in_use_untags_it_then_prune_deletes_it(
    docker_runtime: DockerRuntime, make_sandbox: Callable[..., str], runtime_deployment: str
) -> None:
    box = make_sandbox()
    repository = f"crucible-test/snap-{secrets.token_hex(4)}"
    image_id = docker_runtime.snapshot(box, repository=repository, tag="t1")
    fork = make_sandbox(image=f"{repository}:t1")
    docker_runtime.remove_image(f"{repository}:t1")
    with pytest.raises(NotFound):
        docker_runtime.image_digest(f"{repository}:t1")
    assert run(docker_runtime, fork, "echo ok").stdout == b"ok\n"  # the fork keeps running
    docker_runtime.prune_snapshots(deployment=runtime_deployment)
    assert docker_runtime.image_digest(image_id) == image_id  # still in use: kept
    docker_runtime.destroy(fork)
    assert docker_runtime.prune_snapshots(deployment=runtime_deployment) >= 1
    with pytest.raises(NotFound):
        docker_runtime.image_digest(image_id)


def test_snapshot_then_fork_sees_files(
    docker_runtime: DockerRuntime, make_sandbox: Callable[..., str], sandbox_image: str
) -> None:
    box = make_sandbox()
    run(docker_runtime, box, "echo state > /workspace/state.txt")
    repository = f"crucible-test/snap-{secrets.token_hex(4)}"
    image_id = docker_runtime.snapshot(box, repository=repository, tag="t1")
    try:
        assert image_id.startswith("sha256:")
        assert docker_runtime.image_digest(f"{repository}:t1") == image_id
        # The source sandbox was unpaused and keeps working.
        assert run(docker_runtime, box, "echo alive").stdout == b"alive\n"
        fork = make_sandbox(image=f"{repository}:t1")
        assert run(docker_runtime, fork, "cat /workspace/state.txt").stdout == b"state\n"
        docker_runtime.destroy(fork)
    finally:
        docker_runtime.remove_image(f"{repository}:t1")
    docker_runtime.remove_image(f"{repository}:t1")  # missing is fine
    with pytest.raises(NotFound):
        docker_runtime.image_digest(f"{repository}:t1")


# --------------------------------------------------------------------- list, destroy


def test_list_by_deployment(
    docker_runtime: DockerRuntime, make_sandbox: Callable[..., str], runtime_deployment: str
) -> None:
    box = make_sandbox(sandbox_id="sb-listed", extra_labels={"crucible.test": "list"})
    listed = {
        info.container_id: info for info in docker_runtime.list(deployment=runtime_deployment)
    }
    assert box in listed
    info = listed[box]
    assert (info.sandbox_id, info.template, info.deployment, info.status) == (
        "sb-listed",
        "test",
        runtime_deployment,
        "running",
    )
    assert info.labels["crucible.test"] == "list"
    assert docker_runtime.list(deployment=f"test-none-{secrets.token_hex(4)}") == []


def test_destroy_missing_is_fine_and_exec_then_not_found(
    docker_runtime: DockerRuntime, make_sandbox: Callable[..., str]
) -> None:
    box = make_sandbox()
    docker_runtime.destroy(box)
    docker_runtime.destroy(box)
    docker_runtime.destroy("0" * 64)
    with pytest.raises(NotFound):
        run(docker_runtime, box, "true")
    with pytest.raises(NotFound):  # raised at the call, before any iteration
        docker_runtime.exec_stream(box, ExecRequest(cmd="true"))
    with pytest.raises(InvalidRequest):
        docker_runtime.exec_stream(box, ExecRequest(cmd="true", timeout_s=0))


def test_create_from_missing_image_is_not_found(
    docker_runtime: DockerRuntime, make_sandbox: Callable[..., str]
) -> None:
    with pytest.raises(NotFound):
        make_sandbox(image=f"crucible-test/missing-{secrets.token_hex(4)}:latest")


def test_transport_is_the_one_asked_for(docker_runtime: DockerRuntime, sandbox: str) -> None:
    assert (sandbox in docker_runtime._channels) == (docker_runtime._channel_dir is not None)
