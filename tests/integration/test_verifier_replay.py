"""The verifier's replay: a pristine sandbox plus the episode's changes (outside protected
paths) must hold the same files as the episode's end state, byte for byte, with owners,
modes and link targets, both from host-read layers and through the engine's archive API."""

from __future__ import annotations

import secrets
from collections.abc import Callable
from typing import Any

import docker.errors
import pytest
import requests

from service.errors import Conflict, CrucibleError
from service.runtime.base import EndStateUnreadable, ExecRequest
from service.runtime.docker import FREEZE_ATTEMPTS, DockerRuntime
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
        # where a file must go, and the engine refuses. The end state made it so: it is
        # unreadable (a 0), not Crucible's failure (a fourth trial's error record).
        with pytest.raises(EndStateUnreadable, match="directory"):
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


class _PauseRefused:
    """The engine's API client, except that ``pause`` answers the way the engine did in CI
    under load ("OCI runtime pause failed: unable to freeze") the first ``refusals`` times."""

    def __init__(self, api: Any, refusals: int) -> None:
        self._api, self.refusals, self.pauses = api, refusals, 0

    def pause(self, container: str) -> None:
        self.pauses += 1
        if self.pauses <= self.refusals:
            response = requests.Response()
            response.status_code = 500
            text = f"Cannot pause container {container}: OCI runtime pause failed: unable to freeze"
            raise docker.errors.APIError("500 Server Error", response, explanation=text)
        self._api.pause(container)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._api, name)


@pytest.mark.parametrize("refusals", [1, FREEZE_ATTEMPTS])
def test_a_freezer_that_refuses_never_turns_an_end_state_unreadable(
    docker_runtime: Any, make_sandbox: Callable[..., str], refusals: int
) -> None:
    """CI finding: runc refused to freeze a verifier sandbox under load, and two oracle
    episodes that had passed every test scored 0 (``report_unreadable``). The freeze now
    retries, and kills the container when the freezer keeps refusing: nothing runs while
    the report is read either way, and the report is read."""
    runtime = DockerRuntime(client=docker_runtime._client)
    cid = make_sandbox()
    script = "mkdir -p /logs/verifier && echo 7 > /logs/verifier/reward.txt && sleep 600 &"
    assert runtime.exec(cid, ExecRequest(cmd=["bash", "-c", script], user="0")).exit_code == 0
    refusing = _PauseRefused(runtime._api, refusals)
    runtime._api = refusing
    runtime.freeze(cid)
    state = docker_runtime._client.api.inspect_container(cid)["State"]
    if refusals < FREEZE_ATTEMPTS:
        assert (refusing.pauses, state["Paused"], state["Running"]) == (refusals + 1, True, True)
    else:  # killed: nothing runs in it any more
        assert (refusing.pauses, state["Running"]) == (FREEZE_ATTEMPTS, False)
    files = runtime.read_files(cid, "/logs/verifier", ["reward.txt"], max_bytes=1 << 10)
    assert files == {"reward.txt": b"7\n"}
    runtime.thaw(cid)


@pytest.mark.parametrize("read_host_layers", [True, False])
def test_the_report_is_read_without_what_lies_beside_it(
    docker_runtime: Any, make_sandbox: Callable[..., str], read_host_layers: bool
) -> None:
    """A terabyte-long sparse file beside the report (the tests' children own what pytest
    writes there, ``junit.xml``): the engine path archived the whole directory into memory.
    Each report file is read alone now, no further than its limit; one over the limit is
    None, as on the host-layer path."""
    runtime = DockerRuntime(client=docker_runtime._client, read_host_layers=read_host_layers)
    cid = make_sandbox()
    script = (
        "mkdir -p /logs/verifier && cd /logs/verifier && echo 7 > reward.txt && "
        "truncate -s 1T junit.xml && truncate -s 1T reward.json && ln -s junit.xml big"
    )
    assert runtime.exec(cid, ExecRequest(cmd=["bash", "-c", script], user="0")).exit_code == 0
    runtime.freeze(cid)
    files = runtime.read_files(
        cid, "/logs/verifier", ["reward.txt", "reward.json", "big", "gone"], max_bytes=1 << 20
    )
    assert files == {"reward.txt": b"7\n", "reward.json": None, "big": None, "gone": None}
    runtime.thaw(cid)


RESUMED_CHANGES = r"""
set -e
echo two > /app/work/c
rm /app/work/b
echo more >> /app/work/a
rm -rf /app/work/dir
"""


def test_a_sandbox_resumed_from_a_snapshot_is_diffed_against_the_pristine_image(
    docker_runtime: Any, make_sandbox: Callable[..., str], sandbox_image: str
) -> None:
    """Trial finding: a sandbox resumed from a checkpoint runs the checkpoint's image, so
    its own writable layer holds only what changed since; diffed against its image, the
    agent's work before the checkpoint was never replayed (a solved task could score 0).
    Diffed against the pristine image, the layers between count as the agent's too."""
    runtime = DockerRuntime(client=docker_runtime._client, read_host_layers=True)
    first = make_sandbox()
    before = (
        "set -e; mkdir -p /app/work/dir/sub; echo one > /app/work/a; echo gone > /app/work/b; "
        "echo deep > /app/work/dir/sub/f; echo kept > /app/work/kept; rm -f /etc/issue; "
        "echo tool > /usr/local/bin/zz-tool"
    )
    assert runtime.exec(first, ExecRequest(cmd=["bash", "-c", before], user="0")).exit_code == 0
    tag = f"resume-{secrets.token_hex(4)}"
    snapshot = runtime.snapshot(first, repository="crucible-test-snapshots", tag=tag)
    resumed = None
    try:
        resumed = make_sandbox(image=snapshot)
        done = runtime.exec(resumed, ExecRequest(cmd=["bash", "-c", RESUMED_CHANGES], user="0"))
        assert done.exit_code == 0, done.stderr
        expected = _manifest(runtime, resumed)
        runtime.freeze(resumed)
        own = {c.path for c in runtime.diff(resumed)}
        assert "/app/work/kept" not in own  # its image holds it: the old blind spot
        changes = runtime.diff(resumed, base_image=sandbox_image)
        kinds = {c.path: c.kind for c in changes}
        assert kinds["/app/work"] == "added" and kinds["/etc/issue"] == "deleted"
        assert kinds["/app/work/kept"] == kinds["/app/work/a"] == "added"
        assert not any(p.startswith("/app/work/dir") or p == "/app/work/b" for p in kinds)
        plan = plan_changes(changes)
        assert plan.tampered == ("/usr/local/bin/zz-tool",)
        fresh = make_sandbox()
        check = TerminalCheck(test_command="true", tests_dir=None, workdir="/app", timeout_s=60)
        _replay(runtime, plan, check, source=resumed, into=fresh, base_image=sandbox_image)
        got = _manifest(runtime, fresh)
        assert (got - expected, expected - got) == (set(), set())
        # the engine's diff knows only the container's own image: refused, never partial
        engine = DockerRuntime(client=docker_runtime._client, read_host_layers=False)
        with pytest.raises(CrucibleError, match="snapshot"):
            engine.diff(resumed, base_image=sandbox_image)
    finally:
        if resumed is not None:
            runtime.destroy(resumed)
        docker_runtime._client.images.remove(snapshot, force=True)
