"""The verifier's replay: a pristine sandbox plus the episode's changes (outside protected
paths) must hold the same files as the episode's end state, byte for byte, with owners,
modes and link targets, both from host-read layers and through the engine's archive API."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from service.errors import Conflict, CrucibleError
from service.runtime.base import ExecRequest
from service.runtime.docker import DockerRuntime
from service.verifiers.isolation import plan_changes
from service.verifiers.terminal import TerminalCheck, _replay

pytestmark = pytest.mark.docker

# Every kind of change an agent makes, inside and outside the workdir, as root.
CHANGES = r"""
set -e
mkdir -p /app/src/pkg /app/empty /data
echo 'print(1)' > /app/src/pkg/mod.py
printf '' > /app/src/blank
echo 'x' > /app/exec.sh && chmod 751 /app/exec.sh
ln -s pkg/mod.py /app/src/rel-link
ln -s /etc/passwd /app/abs-link
echo shared > /app/hard1 && ln /app/hard1 /app/hard2
echo owned > /app/owned && chown 1234:4321 /app/owned
chmod 700 /app/src
echo appended >> /etc/motd
rm -f /etc/issue
rm -rf /var/cache/debconf
rm -rf /etc/skel && mkdir /etc/skel && echo fresh > /etc/skel/only
rm -f /etc/debian_version && mkdir /etc/debian_version && echo inside > /etc/debian_version/f
rm -rf /etc/cron.daily && echo now-a-file > /etc/cron.daily
mkfifo /app/fifo
echo gone > /app/tmpfile && rm /app/tmpfile
echo tool > /usr/local/bin/agent-tool
"""

MANIFEST = (
    "find /app /data /etc /var/cache -xdev -printf '%p %y %m %U %G %s %l\\n' | sort; "
    "find /app /data /etc -xdev -type f -exec sha256sum {} + | sort"
)


# Bind mounts the engine makes per container: never part of an end state.
ENGINE_FILES = ("/etc/hostname", "/etc/hosts", "/etc/resolv.conf")


def _manifest(runtime: Any, cid: str) -> set[str]:
    out = runtime.exec(cid, ExecRequest(cmd=["bash", "-c", MANIFEST], user="0", timeout_s=60))
    assert out.exit_code == 0, out.stderr
    return {
        line
        for line in out.stdout.decode().splitlines()
        if not any(f" {f}" in line or line.startswith(f"{f} ") for f in ENGINE_FILES)
    }


@pytest.mark.parametrize("host_layers", [True, False], ids=["host-layers", "engine-api"])
def test_replay_reproduces_the_end_state(
    docker_runtime: Any, make_sandbox: Callable[..., str], host_layers: bool
) -> None:
    runtime = DockerRuntime(client=docker_runtime._client, read_host_layers=host_layers)
    episode = make_sandbox()
    done = runtime.exec(episode, ExecRequest(cmd=["bash", "-c", CHANGES], user="0"))
    assert done.exit_code == 0, done.stderr
    expected = _manifest(runtime, episode)
    runtime.freeze(episode)
    changes = runtime.diff(episode)
    if host_layers:  # only the layers can tell a type change; the engine's diff cannot
        replaced = {c.path for c in changes if c.replaced}
        assert replaced == {"/etc/debian_version", "/etc/cron.daily"}
    plan = plan_changes(changes)
    assert plan.tampered == ("/usr/local/bin/agent-tool",)
    fresh = make_sandbox()
    check = TerminalCheck(test_command="true", tests_dir=None, workdir="/app", timeout_s=60)
    if not host_layers:
        # The engine's diff cannot mark type changes: the archive then meets a directory
        # where a file must go, and the engine refuses (an error record, never a score).
        with pytest.raises(CrucibleError, match="directory"):
            _replay(runtime, plan, check, source=episode, into=fresh)
        return
    _replay(runtime, plan, check, source=episode, into=fresh)
    got = _manifest(runtime, fresh)
    assert (got - expected, expected - got) == (set(), set())
    tool = runtime.exec(fresh, ExecRequest(cmd=["test", "-e", "/usr/local/bin/agent-tool"]))
    assert tool.exit_code == 1  # a protected path is never replayed


def test_engine_replay_without_type_changes_matches(
    docker_runtime: Any, make_sandbox: Callable[..., str]
) -> None:
    runtime = DockerRuntime(client=docker_runtime._client, read_host_layers=False)
    episode = make_sandbox()
    script = "\n".join(
        line
        for line in CHANGES.splitlines()
        if "debian_version" not in line and "cron.daily" not in line
    )
    assert runtime.exec(episode, ExecRequest(cmd=["bash", "-c", script], user="0")).exit_code == 0
    expected = _manifest(runtime, episode)
    runtime.freeze(episode)
    plan = plan_changes(runtime.diff(episode))
    fresh = make_sandbox()
    check = TerminalCheck(test_command="true", tests_dir=None, workdir="/app", timeout_s=60)
    _replay(runtime, plan, check, source=episode, into=fresh)
    got = _manifest(runtime, fresh)
    assert (got - expected, expected - got) == (set(), set())


def test_a_frozen_sandbox_refuses_exec_and_thaws(
    docker_runtime: Any, make_sandbox: Callable[..., str]
) -> None:
    cid = make_sandbox()
    docker_runtime.freeze(cid)
    docker_runtime.freeze(cid)  # idempotent
    with pytest.raises(Conflict, match="frozen"):
        docker_runtime.exec(cid, ExecRequest(cmd=["true"]))
    docker_runtime.thaw(cid)
    docker_runtime.thaw(cid)  # idempotent
    assert docker_runtime.exec(cid, ExecRequest(cmd=["true"])).exit_code == 0
