"""ROCK (PyPI ``rl-rock``) as a peer: installed into its own venv, asked for one sandbox of a
local image through its own Docker deployment, and reported as it went.

ROCK's local deployment runs ``docker create --privileged ...`` then ``docker start``
(``rock.deployments.docker.DockerDeployment``); this engine refuses privileged containers
("unable to apply caps": the VM lacks CAP_SYS_RESOURCE). The client tries exactly that
first, and on that refusal starts it again with every capability the engine grants instead
(``peer_clients/rock_client.py``); the row's status says so, with the engine's message.

The rocklet (ROCK's in-sandbox server) comes from the host, as ROCK's default ``local``
worker env does it: ``ROCK_PROJECT_ROOT`` is a directory laid out like ROCK's checkout
(``.venv`` and ``rock/rocklet/local_files``), here the venv itself, bind-mounted read-only
at the same path with the interpreter the venv points at (``sys.base_prefix``).
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import Any

import docker
from harness import Series
from peer_env import ensure_venv, error_text, last_json_line

ROOT = Path(__file__).resolve().parents[1]
VENV = ROOT / "build" / "rock-venv"
CLIENT = Path(__file__).resolve().parent / "peer_clients" / "rock_client.py"
LABEL = "crucible.deployment=bench-peers-rock"
# rl-rock 1.11 imports these at module level without declaring them for the rocklet extra.
PACKAGES = [
    "rl-rock[rocklet]",
    "nacos-sdk-python==2.0.9",
    "sqlalchemy",
    "redis==7.2.0",
    "apscheduler",
    "sqlmodel",
    "aiosqlite",
    "websockets",
    "aiohttp",
    "aiolimiter",
]


def _cleanup() -> None:
    engine = docker.from_env()
    for c in engine.containers.list(all=True, filters={"label": LABEL}):
        c.remove(force=True)
    engine.close()


def _project_root() -> None:
    """Lay the venv out as the ROCK checkout its ``local`` worker env mounts: ``.venv`` (its
    ``bin/rocklet``, mounted at /tmp/miniforge) and ``rock/rocklet/local_files``."""
    site = next((VENV / "lib").glob("python3*/site-packages"))
    for link, target in ((VENV / ".venv", VENV), (VENV / "rock", site / "rock")):
        if not link.is_symlink():
            link.symlink_to(target)


def rock(image: str, n: int) -> dict[str, Any]:
    """``{"one_shot": Series, "session": Series, "setup_s", "start_s"}`` if a ROCK sandbox ran,
    else ``{"error": what happened, "setup_s", ...}``. Never raises for ROCK's own failures."""
    t0 = time.monotonic()
    try:
        py = ensure_venv(VENV, PACKAGES)
    except (subprocess.CalledProcessError, OSError) as e:
        return {"error": f"install failed: {error_text(e)}"}
    setup_s = round(time.monotonic() - t0, 1)
    try:
        _project_root()
        r = subprocess.run(
            [str(py), str(CLIENT), image, LABEL, str(n)],
            capture_output=True,
            text=True,
            timeout=600,
            cwd=VENV,
            env={**os.environ, "ROCK_WORKER_ENV_TYPE": "local", "ROCK_PROJECT_ROOT": str(VENV)},
        )
        got = last_json_line(r.stdout)
    except (subprocess.TimeoutExpired, ValueError, OSError) as e:
        return {"error": error_text(e), "setup_s": setup_s}
    finally:
        _cleanup()
    version = subprocess.run(
        [str(py), "-c", "import importlib.metadata as m; print(m.version('rl-rock'))"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    out: dict[str, Any] = {"version": version, "setup_s": setup_s}
    if "shim" in got:  # ran only with --privileged replaced: said in the status
        out["note"] = f"{got['shim']}, since the engine refused it as shipped: " + " ".join(
            got["privileged_error"].split()
        )
    if "error" in got:
        out["error"] = " ".join(got["error"].split())  # one line, as the engine said it
        out["failed_after_s"] = round(got["after_s"], 1)
        return out
    out["start_s"] = round(got["start_s"], 2)
    out["one_shot"] = Series("ROCK execute", got["one_shot"])
    if got.get("session"):
        out["session"] = Series("ROCK run_in_session", got["session"])
    if "session_error" in got:
        out["session_error"] = " ".join(got["session_error"].split())
    return out
