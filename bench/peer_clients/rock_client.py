"""ROCK's own Docker deployment, started against a local image; run by ROCK's venv.

    python rock_client.py IMAGE LABEL N

ROCK asks Docker for ``--privileged`` (``DockerDeployment._build_runtime_args``). It is
started exactly so first; if the engine refuses (this one does: "unable to apply caps", the
VM lacks CAP_SYS_RESOURCE), it is started again with ``--privileged`` replaced by every
capability the engine can grant plus unconfined seccomp and AppArmor (``SHIM_ARGS``), and
that is said in the answer (``shim`` and ``privileged_error``). Everything else (its
``docker create`` line, the rocklet it mounts from the host: ROCK's ``local`` worker env,
its remote runtime client) is ROCK's own. ``LABEL`` (``k=v``) is added to its container so
the bench can remove it whatever happens.

Prints one JSON line: ``{"start_s", "one_shot": [ms...], ...}`` when a sandbox starts, else
``{"error", "after_s", ...}`` with what ROCK and the engine said.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

from rock.admin.proto.request import (
    SandboxBashAction,
    SandboxCommand,
    SandboxCreateBashSessionRequest,
)
from rock.deployments.docker import DockerDeployment

# The nearest to --privileged this engine grants: all capabilities but the one its VM lacks.
SHIM_ARGS = [
    "--cap-add=ALL",
    "--cap-drop=SYS_RESOURCE",
    "--security-opt",
    "seccomp=unconfined",
    "--security-opt",
    "apparmor=unconfined",
]


class _CapShimDeployment(DockerDeployment):
    def _build_runtime_args(self) -> list[str]:
        return list(SHIM_ARGS)


async def _start(cls: type[DockerDeployment], image: str, label: str) -> DockerDeployment:
    dep = cls(
        image=image,
        pull="never",
        python_standalone_dir=None,
        docker_args=["--label", label],
        startup_timeout=120,
        memory="1g",
        cpus=1,
    )
    await dep.start()
    return dep


async def main(image: str, label: str, n: int) -> dict:
    out: dict = {}
    t0 = time.perf_counter()
    try:
        dep = await _start(DockerDeployment, image, label)
    except Exception as e:  # what ROCK raised as shipped: reported
        out["privileged_error"] = f"{type(e).__name__}: {e}".strip()
        out["privileged_after_s"] = time.perf_counter() - t0
        if "unable to apply caps" not in out["privileged_error"]:
            return {"error": out.pop("privileged_error"), "after_s": out.pop("privileged_after_s")}
        out["shim"] = "--privileged replaced by " + " ".join(SHIM_ARGS)
        t0 = time.perf_counter()
        try:
            dep = await _start(_CapShimDeployment, image, label)
        except Exception as e2:  # the shim did not help either: reported, not retried
            return {
                **out,
                "error": f"{type(e2).__name__}: {e2}".strip(),
                "after_s": time.perf_counter() - t0,
            }
    out.update(start_s=time.perf_counter() - t0, one_shot=[], session=[])
    sid = dep.container_name  # the rocklet's requests name their sandbox (as ROCK's own do)
    try:
        for i in range(n + 5):
            t = time.perf_counter()
            r = await dep.runtime.execute(
                SandboxCommand(sandbox_id=sid, command=["sh", "-c", "echo hi"])
            )
            if i >= 5:
                out["one_shot"].append((time.perf_counter() - t) * 1e3)
            assert r.stdout == "hi\n", r
        try:
            await dep.runtime.create_session(SandboxCreateBashSessionRequest(sandbox_id=sid))
            for i in range(n + 5):
                t = time.perf_counter()
                r = await dep.runtime.run_in_session(
                    SandboxBashAction(sandbox_id=sid, command="echo hi")
                )
                if i >= 5:
                    out["session"].append((time.perf_counter() - t) * 1e3)
                assert "hi" in r.output, r
        except Exception as e:  # one-shot figures stand; the session's failure is said
            out["session"] = []
            out["session_error"] = f"{type(e).__name__}: {e}".strip()
    finally:
        await dep.stop()
    return out


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))))
