"""ROCK (PyPI ``rl-rock``) as a peer: installed into its own venv, asked for one sandbox of a
local image through its own Docker deployment, and reported as it went.

ROCK's local deployment runs ``docker create --privileged ...`` then ``docker start``
(``rock.deployments.docker.DockerDeployment``); this engine refuses privileged containers
("unable to apply caps": the VM lacks CAP_SYS_RESOURCE), so here the row's status is the
engine's own message. If a sandbox does start (another machine), one-shot exec is timed.
"""

from __future__ import annotations

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


def rock(image: str, n: int) -> dict[str, Any]:
    """``{"one_shot": Series, "setup_s", "start_s"}`` if a ROCK sandbox ran, else
    ``{"error": what happened, "setup_s", ...}``. Never raises for ROCK's own failures."""
    t0 = time.monotonic()
    try:
        py = ensure_venv(VENV, PACKAGES)
    except (subprocess.CalledProcessError, OSError) as e:
        return {"error": f"install failed: {error_text(e)}"}
    setup_s = round(time.monotonic() - t0, 1)
    try:
        r = subprocess.run(
            [str(py), str(CLIENT), image, LABEL, str(n)],
            capture_output=True,
            text=True,
            timeout=300,
            cwd=VENV,
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
    if "error" in got:
        out["error"] = " ".join(got["error"].split())  # one line, as the engine said it
        out["failed_after_s"] = round(got["after_s"], 1)
        return out
    out["start_s"] = round(got["start_s"], 2)
    out["one_shot"] = Series("ROCK execute", got["one_shot"])
    return out
