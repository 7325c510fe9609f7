"""The exec channel (``service.runtime.channel``): fast, and closed to everyone but the
control plane. Transport parity (every runtime test over both the channel and ``docker
exec``) lives in test_runtime.py."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from service.runtime.base import ExecRequest, ExecResult
from service.runtime.docker import DockerRuntime

pytestmark = pytest.mark.docker


def run(
    runtime: DockerRuntime, container_id: str, cmd: str | list[str], **kw: object
) -> ExecResult:
    return runtime.exec(container_id, ExecRequest(cmd=cmd, **kw))  # type: ignore[arg-type]


def test_channel_is_used_and_beats_docker_exec(
    docker_runtime: DockerRuntime, make_sandbox: Callable[..., str]
) -> None:
    box = make_sandbox()
    plain = DockerRuntime(client=docker_runtime._client)

    def p50(runtime: DockerRuntime) -> float:
        times = []
        for _ in range(15):
            t0 = time.perf_counter()
            run(runtime, box, ["true"])
            times.append(time.perf_counter() - t0)
        return statistics.median(times)

    run(docker_runtime, box, ["true"])  # the socket exists once the sandbox has started
    # Not a speed target (bench/ holds those): only that the channel really carries execs.
    assert p50(docker_runtime) * 3 < p50(plain)


def test_nothing_in_the_sandbox_can_reach_or_replace_the_channel(
    docker_runtime: DockerRuntime, make_sandbox: Callable[..., str]
) -> None:
    # A new-user trial replaced a listening socket with its own server (and forked it past
    # the peer check); now nothing listens anywhere, and the mount is read-only.
    box = make_sandbox()
    assert box in docker_runtime._channels
    host_side = Path(docker_runtime._container_meta(box).channel_dir)
    assert host_side.parent.parent == docker_runtime._channel_dir
    assert list(host_side.iterdir()) == []  # the socket is gone; nothing listens
    probe = "\n".join(
        [
            "import socket",
            "s = socket.socket(socket.AF_UNIX)",
            "try:",
            "    s.connect('/opt/crucible-ctl/ctl.sock')",
            "    print('connected')",
            "except OSError as e:",
            "    print(type(e).__name__)",
        ]
    )
    out = run(docker_runtime, box, ["python3", "-c", probe], user="0")
    assert out.stdout == b"FileNotFoundError\n", out
    for cmd in (
        "touch /opt/crucible-ctl/x",
        "mkdir /opt/crucible-ctl/d",
        "ln -s / /opt/crucible-ctl/l",
    ):
        written = run(docker_runtime, box, cmd, user="0")
        assert written.exit_code != 0 and b"Read-only" in written.stderr, (cmd, written)
    assert list(host_side.iterdir()) == []
    assert run(docker_runtime, box, ["true"]).exit_code == 0
    docker_runtime.destroy(box)
    assert not host_side.exists()


_IDLE_PID = (
    "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null "
    "| grep -q '^/opt/crucible/crucible-exec --idle' && grep -q '^PPid:.1$' $p/status "
    "&& echo ${p#/proc/}; done"
)


def test_a_stopped_supervisor_means_docker_exec_and_no_late_run(
    docker_runtime: DockerRuntime, make_sandbox: Callable[..., str]
) -> None:
    # A new-user trial SIGSTOPped the supervisor: an exec waited 15 s, failed, and then ran
    # when the supervisor resumed. Now the request is only sent once a handler exists.
    box = make_sandbox()
    pid = run(docker_runtime, box, _IDLE_PID, user="0").stdout.strip().decode()
    assert pid.isdigit(), pid
    assert run(docker_runtime, box, f"kill -STOP {pid}", user="0").exit_code == 0
    t0 = time.perf_counter()
    # The first may run on the spare handler the channel already holds (forked before the
    # stop, so it runs now, not late); the next finds no handler: docker exec.
    for _ in range(2):
        assert run(docker_runtime, box, "echo x >> /tmp/count").exit_code == 0
    assert time.perf_counter() - t0 < 10
    assert box not in docker_runtime._channels  # dropped for good
    assert run(docker_runtime, box, f"kill -CONT {pid}", user="0").exit_code == 0
    time.sleep(0.5)
    assert run(docker_runtime, box, "wc -l < /tmp/count").stdout == b"2\n"


def test_an_engine_that_cannot_see_the_directory_means_no_channel(
    docker_runtime: DockerRuntime,
    runtime_deployment: str,
    sandbox_image: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A control plane in a container of its own (the engine's socket mounted in) makes its
    # directories where the engine cannot see them: sandboxes must still start.
    from service.runtime import channel
    from service.runtime.base import SandboxSpec

    class Elsewhere(channel.Listener):
        def __init__(self, root: Path, sandbox_id: str) -> None:
            super().__init__(root, sandbox_id)
            self.directory = tmp_path / "not-on-the-engine-host" / sandbox_id

    monkeypatch.setattr(channel, "Listener", Elsewhere)
    runtime = DockerRuntime(client=docker_runtime._client, channel_dir=tmp_path / "channels")
    spec = SandboxSpec(
        sandbox_id="sb-elsewhere",
        template="test",
        deployment=runtime_deployment,
        image=sandbox_image,
        cpus=1.0,
        memory_bytes=256 << 20,
        pids_limit=64,
    )
    box = runtime.create(spec)
    try:
        assert runtime._channel_dir is None and box not in runtime._channels
        assert run(runtime, box, "echo ok").stdout == b"ok\n"
    finally:
        runtime.destroy(box)


def test_limits_the_agent_forces_on_the_supervisor_mean_docker_exec(
    docker_runtime: DockerRuntime, make_sandbox: Callable[..., str]
) -> None:
    # Found by a new-user trial: root in the sandbox may prlimit the supervisor (same uid);
    # its handlers inherit the limit and could not even make a pipe, with no way back.
    box = make_sandbox()
    pid = run(docker_runtime, box, _IDLE_PID, user="0").stdout.strip().decode()
    squeeze = f"import resource; resource.prlimit({pid}, resource.RLIMIT_NOFILE, (8, 8))"
    assert run(docker_runtime, box, ["python3", "-c", squeeze], user="0").exit_code == 0
    # The first may run on the spare handler forked before the squeeze; the next handler
    # inherits it, cannot start the command, and docker exec serves it.
    for _ in range(2):
        assert run(docker_runtime, box, "echo hi; ulimit -n").stdout == b"hi\n1024\n"
    assert box not in docker_runtime._channels  # served by docker exec from now on


def test_channel_directories_of_vanished_sandboxes_are_pruned(
    docker_runtime: DockerRuntime, make_sandbox: Callable[..., str], runtime_deployment: str
) -> None:
    box = make_sandbox()
    mine = Path(docker_runtime._container_meta(box).channel_dir)
    stale = mine.parent / "sb-vanished"
    stale.mkdir()
    live = {c.sandbox_id for c in docker_runtime.list(deployment=runtime_deployment)}
    assert (
        docker_runtime.prune_host_state(deployment=runtime_deployment, live_sandbox_ids=live) == 1
    )
    assert mine.exists() and not stale.exists()
    assert run(docker_runtime, box, "echo still").stdout == b"still\n"


def test_a_spare_handler_is_held_and_a_killed_one_is_replaced(
    docker_runtime: DockerRuntime, make_sandbox: Callable[..., str]
) -> None:
    # The fork and hand-over of a handler leave the request path: each open asks for the
    # next one ahead. A spare killed meanwhile (a fork-bomb reclaim kills all but init and
    # the supervisor) must be dropped unused, not take the next request and fail it.
    box = make_sandbox()
    sup = run(docker_runtime, box, _IDLE_PID, user="0").stdout.strip().decode()
    spares = (
        f"for p in /proc/[0-9]*; do grep -q '^PPid:.{sup}$' $p/status 2>/dev/null "
        "&& [ ${p#/proc/} != $PPID ] && echo ${p#/proc/}; done"
    )
    # In one command: the spare waiting now is the one asked for when this exec took its own.
    held = run(docker_runtime, box, f"s=$({spares}); echo $s; kill -9 $s", user="0")
    assert held.exit_code == 0 and len(held.stdout.split()) == 1, held  # exactly one spare
    for i in range(3):
        assert run(docker_runtime, box, f"echo {i}").stdout == f"{i}\n".encode()
    assert box in docker_runtime._channels  # still over the channel
