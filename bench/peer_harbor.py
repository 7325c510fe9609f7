"""Harbor (PyPI ``harbor``) as a peer: its Docker environment, one-shot exec timed.

Harbor 0.26 needs Python >= 3.12 and Docker Compose v2; this host has Python 3.11 and
Debian 12's compose 1.29, and neither may be replaced system-wide. So Harbor runs in a
Debian 13 ("trixie") root filesystem under ``build/harbor-root`` made once with
``debootstrap`` (python3.13, python3-venv, docker-cli, and the ``docker-compose`` 2.26
package, which provides the compose v2 plugin), with Harbor in a venv inside it. Each run
enters it with ``unshare -m`` + ``chroot``: the engine's socket and a work directory are
bind-mounted in a private mount namespace (gone when the process exits; the work directory
has the same absolute path inside and out, since compose's bind mounts are resolved by the
engine on the host). Telemetry is off (``HARBOR_TELEMETRY=0``). The environment is built
``FROM`` our local base image (no registry here).
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import docker
from harness import Series
from peer_env import error_text, last_json_line

ROOT = Path(__file__).resolve().parents[1]
ROOTFS = ROOT / "build" / "harbor-root"
WORK = ROOT / "build" / "harbor-work"
CLIENT = Path(__file__).resolve().parent / "peer_clients" / "harbor_client.py"
MIRROR = "http://deb.debian.org/debian"
INCLUDE = "python3,python3-venv,ca-certificates,docker-cli,docker-compose"
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
SOCK_IN = "/run/crucible-bench/docker.sock"
PROJECT = "crucible-bench-harbor"
_VERSION_PY = "import importlib.metadata as m; print(m.version('harbor'))"


def _in_root(cmd: str, *, timeout_s: float, env: dict[str, str] | None = None) -> str:
    """Run ``cmd`` (sh) inside the rootfs with a clean environment; its stdout. Raises
    ``subprocess.CalledProcessError`` / ``TimeoutExpired``."""
    base = {"PATH": "/usr/bin:/bin", "HOME": "/root", "SSL_CERT_FILE": str(CA_BUNDLE)}
    envs = " ".join(f"{k}={shlex.quote(v)}" for k, v in {**base, **(env or {})}.items())
    mounts = (
        "mount --make-rprivate / && "
        f"mount --bind /var/run/docker.sock {ROOTFS}{SOCK_IN} && "
        f"mount --bind {WORK} {ROOTFS}{WORK} && "
    )
    inner = f"exec chroot {ROOTFS} /usr/bin/env -i {envs} /bin/sh -c {shlex.quote(cmd)}"
    return subprocess.run(
        ["unshare", "-m", "sh", "-c", mounts + inner],
        check=True,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    ).stdout


def ensure_rootfs() -> None:
    """Make the trixie rootfs and Harbor's venv in it, once. Raises on any failed step."""
    if not (ROOTFS / "usr" / "libexec" / "docker" / "cli-plugins" / "docker-compose").exists():
        if shutil.which("debootstrap") is None:
            raise FileNotFoundError("debootstrap is not installed (apt-get install debootstrap)")
        shutil.rmtree(ROOTFS, ignore_errors=True)
        subprocess.run(
            [
                "debootstrap",
                "--variant=minbase",
                f"--include={INCLUDE}",
                "trixie",
                str(ROOTFS),
                MIRROR,
            ],
            check=True,
            capture_output=True,
            text=True,
            timeout=900,
        )
    # The host's resolver and CA bundle (PyPI is reached through the host's trusted CAs).
    shutil.copy("/etc/resolv.conf", ROOTFS / "etc" / "resolv.conf")
    shutil.copy(CA_BUNDLE, ROOTFS / CA_BUNDLE.relative_to("/"))
    (ROOTFS / SOCK_IN.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
    (ROOTFS / SOCK_IN.lstrip("/")).touch()
    WORK.mkdir(parents=True, exist_ok=True)
    (ROOTFS / str(WORK).lstrip("/")).mkdir(parents=True, exist_ok=True)
    if not (ROOTFS / "opt" / "harbor" / "bin" / "harbor").exists():
        _in_root(
            "python3 -m venv /opt/harbor && /opt/harbor/bin/pip install -q harbor",
            timeout_s=900,
            env={"PIP_CERT": str(CA_BUNDLE)},
        )


def _cleanup() -> None:
    """Whatever Harbor's own ``stop(delete=True)`` left of this bench's compose project."""
    engine = docker.from_env()
    label = f"com.docker.compose.project={PROJECT}"
    for c in engine.containers.list(all=True, filters={"label": label}):
        c.remove(force=True)
    for net in engine.networks.list(filters={"label": label}):
        net.remove()
    engine.close()


def harbor(base_image: str, n: int) -> dict[str, Any]:
    """``{"one_shot": Series, "setup_s", "start_s", "version", "compose"}`` when Harbor ran,
    else ``{"error": what happened, ...}``. Never raises for Harbor's own failures."""
    t0 = time.monotonic()
    try:
        ensure_rootfs()
        version = _in_root(
            f"/opt/harbor/bin/python -c {shlex.quote(_VERSION_PY)}"
            " && docker compose version --short",
            timeout_s=60,
            env={"DOCKER_HOST": f"unix://{SOCK_IN}"},
        ).split()
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as e:
        return {"error": f"setup failed: {error_text(e)}"}
    setup_s = round(time.monotonic() - t0, 1)
    shutil.copy(CLIENT, WORK / CLIENT.name)
    try:
        stdout = _in_root(
            f"/opt/harbor/bin/python {WORK / CLIENT.name} {WORK} {shlex.quote(base_image)} {n}",
            timeout_s=600,
            env={"DOCKER_HOST": f"unix://{SOCK_IN}", "HARBOR_TELEMETRY": "0"},
        )
        got = last_json_line(stdout)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, ValueError) as e:
        return {"error": error_text(e), "setup_s": setup_s}
    finally:
        _cleanup()
    out: dict[str, Any] = {"version": version[0], "compose": version[-1], "setup_s": setup_s}
    if "stop_error" in got:
        out["stop_error"] = got["stop_error"]
    if "error" in got:
        out["error"] = " ".join(got["error"].split())
        return out
    out["start_s"] = round(got["start_s"], 2)
    out["one_shot"] = Series("Harbor exec (compose exec)", got["one_shot"])
    return out
