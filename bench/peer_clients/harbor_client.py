"""Harbor's Docker environment (``docker compose`` per call), run by Harbor's interpreter.

    python harbor_client.py WORK_DIR BASE_IMAGE N

Builds the environment from a Dockerfile ``FROM BASE_IMAGE`` (a local image: no registry),
starts it, times N one-shot ``exec("echo hi")`` calls, then stops it with ``delete=True``
(containers, network and the built image). Prints one JSON line: ``{"start_s",
"one_shot": [ms...]}`` or ``{"error", ...}``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time
from pathlib import Path

from harbor.environments.docker.docker import DockerEnvironment
from harbor.models.task.config import EnvironmentConfig
from harbor.models.trial.paths import TrialPaths

NAME = "crucible-bench-harbor"


async def main(work: Path, base_image: str, n: int) -> dict:
    env_dir = work / "environment"
    env_dir.mkdir(parents=True, exist_ok=True)
    (env_dir / "Dockerfile").write_text(f"FROM {base_image}\nWORKDIR /app\n")
    trial = TrialPaths(trial_dir=work / "trial")
    trial.mkdir()
    env = DockerEnvironment(
        environment_dir=env_dir,
        environment_name=NAME,
        session_id=NAME,
        trial_paths=trial,
        task_env_config=EnvironmentConfig(),
        logger=logging.getLogger("harbor-bench"),
    )
    out: dict = {}
    t0 = time.perf_counter()
    try:
        await env.start(force_build=False)
        out["start_s"] = time.perf_counter() - t0
        ms = []
        for i in range(n + 5):
            t = time.perf_counter()
            r = await env.exec("echo hi")
            if i >= 5:
                ms.append((time.perf_counter() - t) * 1e3)
            assert r.return_code == 0 and (r.stdout or "").strip() == "hi", r
        out["one_shot"] = ms
    except Exception as e:  # reported as the row's status
        out["error"] = f"{type(e).__name__}: {e}".strip()
    finally:
        try:
            await env.stop(delete=True)
        except Exception as e:  # reported beside the result
            out["stop_error"] = f"{type(e).__name__}: {e}".strip()
    return out


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])))))
