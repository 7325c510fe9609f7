"""The fast overlay diff agrees with the engine's own diff API."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from service.runtime.base import ExecRequest

pytestmark = pytest.mark.docker

CHANGES = (
    "echo new > /workspace/added.txt; mkdir -p /workspace/newdir/sub; echo x > "
    "/workspace/newdir/sub/f; echo more >> /etc/motd; rm -f /etc/issue; "
    "rm -rf /usr/share/doc/bash && mkdir /usr/share/doc/bash && echo o > /usr/share/doc/bash/o; "
    "ln -s /etc/passwd /workspace/link; chmod 600 /etc/debian_version"
)


def test_overlay_diff_matches_engine_diff(
    docker_runtime: Any, make_sandbox: Callable[..., str]
) -> None:
    cid = make_sandbox()
    assert docker_runtime.exec(cid, ExecRequest(cmd=CHANGES)).exit_code == 0
    fast = {(c.path, c.kind) for c in docker_runtime.diff(cid)}
    rows = docker_runtime._api.diff(cid)
    kinds = {0: "modified", 1: "added", 2: "deleted"}
    engine = {(r["Path"], kinds[r["Kind"]]) for r in rows}
    # The engine also reports the mount points it made in the init layer; the upper dir
    # holds only what processes in the container did.
    engine_only = {p for p, _ in engine - fast}
    assert engine_only <= {"/opt", "/opt/crucible", "/usr/sbin/docker-init", "/usr/sbin", "/usr"}, (
        engine - fast
    )
    assert fast - engine == set(), fast - engine
    for expected in [
        ("/workspace/added.txt", "added"),
        ("/workspace/newdir", "added"),
        ("/etc/motd", "modified"),
        ("/etc/issue", "deleted"),
        ("/workspace/link", "added"),
        ("/etc/debian_version", "modified"),
        (
            "/usr/share/doc/bash",
            "added" if ("/usr/share/doc/bash", "added") in engine else "modified",
        ),
    ]:
        assert expected in fast


def test_a_listed_change_the_end_state_no_longer_has_is_unreadable_not_an_engine_error(
    docker_runtime: Any, make_sandbox: Callable[..., str]
) -> None:
    # A fourth trial replaced /workspace with a file between the verifier's diff and its
    # read of the changes: the engine's 500 ("not a directory", naming the host's storage
    # path) made the verdict an error. A change that is not there is the end state's.
    from service.errors import NotFound
    from service.runtime.base import EndStateUnreadable

    cid = make_sandbox()
    assert docker_runtime.exec(cid, ExecRequest(cmd="echo x > /workspace/f")).exit_code == 0
    for path in ("/workspace/f/below", "/workspace/missing"):
        with pytest.raises(NotFound) as e:
            list(docker_runtime.get_archive(cid, path))
        assert "overlay2" not in e.value.detail and "/var/lib" not in e.value.detail
        with pytest.raises(EndStateUnreadable):
            list(docker_runtime._engine_entries(cid, path, None))


@pytest.mark.parametrize("read_host_layers", [True, False])
def test_a_diff_reads_no_more_than_it_is_asked_for(
    docker_runtime: Any, make_sandbox: Callable[..., str], read_host_layers: bool
) -> None:
    """The engine's diff answer was read whole (a list of every change, then the verifier
    counted them): an end state with millions of entries would be held in the control
    plane's memory at once. With ``max_entries`` both paths stop after one more than that."""
    from service.runtime.docker import DockerRuntime

    runtime = DockerRuntime(client=docker_runtime._client, read_host_layers=read_host_layers)
    cid = make_sandbox()
    make = "mkdir -p /workspace/many && cd /workspace/many && seq 1 3000 | xargs touch"
    assert runtime.exec(cid, ExecRequest(cmd=["bash", "-c", make], user="0")).exit_code == 0
    everything = runtime.diff(cid)
    assert len(everything) > 3000
    some = runtime.diff(cid, max_entries=100)
    assert len(some) == 101, len(some)
    assert {c.path for c in some} <= {c.path for c in everything}
    assert len(runtime.diff(cid, max_entries=10_000)) == len(everything)
