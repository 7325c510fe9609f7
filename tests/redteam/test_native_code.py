"""Red team: the agent's native code in a process with the verifier's rights (issue 9).

A second trial put a shared object in the end state and a config file naming it (libc's
``nsswitch.conf``); the test command's privileged shell loaded it before pytest started,
read the session keys and forged a passing session on every bundled task. Protecting each
config that can name a library is a list, and a task's own ``LD_PRELOAD`` or
``LD_LIBRARY_PATH`` is a route no list holds. So the loader itself refuses:
``crucible-audit.so`` (``LD_AUDIT``, see ``service/runtime/supervisor/crucible-audit.c``)
loads no agent-written shared object into a process holding ``CAP_DAC_OVERRIDE``, and runs
an agent-written program there only after dropping the capabilities the tests' children
lose. Processes without those rights (the agent's programs the tests run) load the agent's
libraries as they should.
"""

from __future__ import annotations

import io
import tarfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from service.runtime.base import ExecRequest
from service.tasks.loader import load_suite
from service.verifiers.terminal import AUDIT_LIBRARY
from tests.integration.api.conftest import Stack
from tests.redteam import episodes
from tests.redteam.episodes import upload, verify
from tests.redteam.native import STEAL_TOKEN, compile_shared
from tests.runtimeutil import deployment_of, sandbox_factory

pytestmark = [pytest.mark.docker, pytest.mark.redteam]

SUITE = Path(__file__).resolve().parents[1] / "fixtures" / "tasks" / "native-code"
DAC_OVERRIDE = 1 << 1


def test_a_preloaded_agent_library_never_runs_with_the_verifiers_rights(stack: Stack) -> None:
    """The task preloads the project's shim into every program of the test run; the
    agent's shim reads the hidden token in any process that can (the shell, the judge).
    Before the audit library it scored 1.0 without the agent knowing the token."""
    stack.ctx.tasks.add_suite(load_suite(SUITE))
    ep = episodes.start(stack, "preload-shim", "native-code")
    upload(stack, ep, "/app/lib/libshim.so", compile_shared(STEAL_TOKEN))
    rec = verify(stack, ep)
    v = rec["verifier"]
    assert (rec["reward"], v["status"]) == (0.0, "ok"), v
    assert rec["reward_components"]["tests_total"] == 1


@pytest.fixture(scope="module")
def make_sandbox(docker_runtime: Any, sandbox_image: str) -> Iterator[Callable[..., str]]:
    for deployment in deployment_of(docker_runtime):
        yield sandbox_factory(docker_runtime, deployment, sandbox_image)


def _put(runtime: Any, cid: str, path: str, data: bytes, mode: int = 0o755) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        info = tarfile.TarInfo(path.lstrip("/"))
        info.size, info.mode = len(data), mode
        t.addfile(info, io.BytesIO(data))
    runtime.put_archive(cid, "/", buf.getvalue())


def _run(runtime: Any, cid: str, script: str, user: str, window: tuple[int, int] | None) -> str:
    env = {"LD_AUDIT": AUDIT_LIBRARY.encode()}
    if window is not None:
        env["CRUCIBLE_PRISTINE_BEFORE"] = str(window[0]).encode()
        env["CRUCIBLE_AGENT_WRITTEN_UNTIL"] = str(window[1]).encode()
    res = runtime.exec(cid, ExecRequest(cmd=["bash", "-c", script], user=user, env=env))
    return (res.stdout + res.stderr).decode()


def _cap_eff(out: str) -> int:
    line = next(ln for ln in out.splitlines() if ln.startswith("CapEff:"))
    return int(line.split()[1], 16)


def test_the_audit_library_refuses_only_the_agents_code_in_privileged_processes(
    docker_runtime: Any, make_sandbox: Callable[..., str]
) -> None:
    cid = make_sandbox()
    _put(docker_runtime, cid, "/tmp/shim.so", compile_shared(STEAL_TOKEN))
    docker_runtime.exec(cid, ExecRequest(cmd=["cp", "/usr/bin/cat", "/tmp/agent-cat"], user="0"))
    now = time.time_ns()
    # the shim and the copied program arrived "with the end state": inside the window
    window = (now - 600 * 10**9, now + 600 * 10**9)
    preload = "LD_PRELOAD=/tmp/shim.so /bin/true"

    out = _run(docker_runtime, cid, preload, "0", window)
    assert "refused an agent-written shared object in a privileged process: /tmp/shim.so" in out
    assert "shim: loaded" not in out
    # the agent's programs that the tests run have no such rights: the shim loads there
    out = _run(docker_runtime, cid, preload, "1000", window)
    assert "shim: loaded in /usr/bin/true" in out and "refused" not in out
    # outside a verification nothing is refused
    assert "shim: loaded in /usr/bin/true" in _run(docker_runtime, cid, preload, "0", None)

    # an agent-written program runs, without the rights that reach the tests and the keys
    cap = _cap_eff(_run(docker_runtime, cid, "/tmp/agent-cat /proc/self/status", "0", window))
    assert cap & DAC_OVERRIDE == 0
    assert _cap_eff(_run(docker_runtime, cid, "cat /proc/self/status", "0", window)) & DAC_OVERRIDE

    # trial finding: a bare soname was checked against the working directory, so an agent's
    # file named libc.so.6 there made every privileged process lose libc (a 0 for honest work)
    docker_runtime.exec(cid, ExecRequest(cmd=["cp", "/usr/bin/cat", "/tmp/libc.so.6"], user="0"))
    out = _run(docker_runtime, cid, "cd /tmp && /bin/echo fine", "0", window)
    assert out == "fine\n", out

    # a library test.sh installed before the tests began (after the window) loads; once the
    # judge has marked its start, one changed after that mark is the agent's
    past = (now - 600 * 10**9, now - 300 * 10**9)
    out = _run(docker_runtime, cid, preload, "0", past)
    assert "shim: loaded in /usr/bin/true" in out
    mark = f"mkdir -p /logs && echo {now - 60 * 10**9} > /logs/.crucible-judge-since && "
    out = _run(docker_runtime, cid, mark + preload, "0", past)
    assert "refused an agent-written shared object" in out, out
