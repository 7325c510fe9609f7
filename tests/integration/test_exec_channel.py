"""The exec channel (``service.runtime.channel``): fast, and closed to everyone but the
control plane. Transport parity (every runtime test over both the channel and ``docker
exec``) lives in test_runtime.py."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import pytest

from service.runtime.base import ExecRequest, ExecResult
from service.runtime.docker import DockerRuntime
from service.runtime.protocol import encode_exec, with_identity

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


def test_the_channel_refuses_peers_inside_the_sandbox(
    docker_runtime: DockerRuntime, make_sandbox: Callable[..., str]
) -> None:
    sandbox = make_sandbox()
    record = with_identity(encode_exec(ExecRequest(cmd="touch /tmp/served")), "0")
    probe = "\n".join(
        [
            "import socket, sys",
            "s = socket.socket(socket.AF_UNIX)",
            "s.connect('/opt/crucible-ctl/ctl.sock')",
            "try:",
            "    s.sendall(sys.stdin.buffer.read())",
            "    print(len(s.recv(100)))",
            "except (BrokenPipeError, ConnectionResetError):",
            "    print(0)",
        ]
    )
    out = run(docker_runtime, sandbox, ["python3", "-c", probe], user="0", stdin=record)
    assert (out.exit_code, out.stdout) == (0, b"0\n"), out.stderr  # closed, nothing served
    assert run(docker_runtime, sandbox, "test -e /tmp/served").exit_code == 1


def test_a_planted_socket_is_never_spoken_to(
    docker_runtime: DockerRuntime, make_sandbox: Callable[..., str]
) -> None:
    box = make_sandbox()
    # The agent (root in its sandbox) replaces the supervisor's socket with its own server,
    # which would record whatever the control plane sends.
    server = (
        "import os, socket; p = '/opt/crucible-ctl/ctl.sock'; os.unlink(p); "
        "s = socket.socket(socket.AF_UNIX); s.bind(p); s.listen(5); "
        "c, _ = s.accept(); open('/tmp/heard', 'wb').write(c.recv(1 << 16))"
    )
    run(docker_runtime, box, f'nohup python3 -c "{server}" >/dev/null 2>&1 &', user="0")
    time.sleep(0.5)
    # The peer check refuses the impostor before anything is sent; docker exec serves.
    assert run(docker_runtime, box, "echo via-fallback").stdout == b"via-fallback\n"
    assert run(docker_runtime, box, "cat /tmp/heard 2>/dev/null | wc -c").stdout == b"0\n"
