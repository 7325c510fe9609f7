"""ROCK's own Docker deployment, started against a local image; run by ROCK's venv.

    python rock_client.py IMAGE LABEL N

Prints one JSON line: ``{"start_s", "one_shot": [ms...]}`` when a sandbox starts, else
``{"error", "after_s"}`` with what ROCK and the engine said. ROCK asks Docker for
``--privileged`` (``DockerDeployment._build_runtime_args``); ``LABEL`` (``k=v``) is added to
its container so the bench can remove it whatever happens.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

from rock.actions import Command
from rock.deployments.docker import DockerDeployment


async def main(image: str, label: str, n: int) -> dict:
    dep = DockerDeployment(
        image=image,
        pull="never",
        python_standalone_dir=None,
        docker_args=["--label", label],
        startup_timeout=60,
        memory="1g",
        cpus=1,
    )
    t0 = time.perf_counter()
    try:
        await dep.start()
    except Exception as e:  # what ROCK raised is the result: reported, not retried
        return {"error": f"{type(e).__name__}: {e}".strip(), "after_s": time.perf_counter() - t0}
    out: dict = {"start_s": time.perf_counter() - t0, "one_shot": []}
    try:
        for i in range(n + 5):
            t = time.perf_counter()
            r = await dep.runtime.execute(Command(command=["sh", "-c", "echo hi"]))
            if i >= 5:
                out["one_shot"].append((time.perf_counter() - t) * 1e3)
            assert r.stdout == "hi\n", r
    finally:
        await dep.stop()
    return out


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))))
