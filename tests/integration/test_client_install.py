"""The client-only install: ``clients/python`` builds a ``crucible-client`` wheel holding
``policy_client`` alone; installed into a brand-new venv it pulls in httpx and pydantic (from
the package index) and nothing of the server, and drives a real server from there."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from email.parser import Parser
from pathlib import Path

import pytest

from tests.integration.api.conftest import Stack, start_stack

pytestmark = pytest.mark.docker

REPO = Path(__file__).resolve().parents[2]
SERVER_ONLY = ("service", "fastapi", "sqlalchemy", "docker", "scipy", "uvicorn", "pyarrow")

# Runs inside the new venv (``python -I``: no cwd, no PYTHONPATH, so only what was installed).
PROGRAM = """
import importlib.util, json, sys
import policy_client
from policy_client import Client, OraclePolicy

url, key, server_only = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
with Client(url, key) as client, client.sandbox("terminal") as sb:
    result = sb.exec("echo hi")
    sandbox_id = sb.id
try:
    OraclePolicy("tasks/terminal")
    oracle = "constructed"
except ImportError as e:
    oracle = str(e)
print(json.dumps({
    "file": policy_client.__file__,
    "importable": [m for m in server_only if importlib.util.find_spec(m) is not None],
    "loaded": sorted({m.split(".")[0] for m in sys.modules} & set(server_only)),
    "stdout": result.stdout,
    "exit_code": result.exit_code,
    "sandbox_id": sandbox_id,
    "oracle": oracle,
}))
"""


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    yield from start_stack(tmp_path_factory.mktemp("stack"))


def _run(cmd: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PYTHONNOUSERSITE": "1"}
    env.pop("PYTHONPATH", None)
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600, **kw)
    assert done.returncode == 0, f"{cmd}\n{done.stdout}\n{done.stderr}"
    return done


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel, built from a copy of ``clients/python`` and ``policy_client`` laid out as in
    the repository (the build's ``build/`` and egg-info stay out of the working tree)."""
    src = tmp_path_factory.mktemp("client-src")
    shutil.copytree(REPO / "clients" / "python", src / "clients" / "python")
    shutil.copytree(
        REPO / "policy_client", src / "policy_client", ignore=shutil.ignore_patterns("__pycache__")
    )
    dist = tmp_path_factory.mktemp("dist")
    _run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation"]
        + ["-w", str(dist), str(src / "clients" / "python")]
    )
    (built,) = dist.glob("crucible_client-*.whl")
    return built


def test_the_wheel_holds_policy_client_and_needs_only_httpx_and_pydantic(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        (meta,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        metadata = Parser().parsestr(zf.read(meta).decode())
    shipped = {n for n in names if ".dist-info/" not in n}
    source = {
        p.relative_to(REPO).as_posix()
        for p in (REPO / "policy_client").rglob("*.py")
        if "__pycache__" not in p.parts
    }
    assert shipped == source  # every module of the package, and nothing else
    assert metadata["Name"] == "crucible-client"
    required = [r for r in metadata.get_all("Requires-Dist") or [] if "extra ==" not in r]
    assert sorted(r.split(">")[0].split("=")[0].strip() for r in required) == ["httpx", "pydantic"]


def test_a_fresh_venv_with_the_wheel_drives_a_real_server(
    wheel: Path, stack: Stack, tmp_path: Path
) -> None:
    env_dir = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(env_dir)])
    python = env_dir / "bin" / "python"
    _run([str(python), "-m", "pip", "install", "-q", str(wheel)])
    installed = json.loads(_run([str(python), "-m", "pip", "list", "--format", "json"]).stdout)
    names = {d["name"].lower().replace("_", "-") for d in installed}
    assert {"crucible-client", "httpx", "pydantic"} <= names
    assert not names & {"crucible", "fastapi", "sqlalchemy", "docker", "scipy", "uvicorn"}

    key = stack.alice.headers["authorization"].split(" ", 1)[1]
    done = _run(
        [str(python), "-I", "-c", PROGRAM, stack.url, key, ",".join(SERVER_ONLY)], cwd=tmp_path
    )
    out = json.loads(done.stdout)
    assert Path(out["file"]).is_relative_to(env_dir)  # the installed copy, not the repo's
    assert out["importable"] == [] and out["loaded"] == []
    assert (out["stdout"], out["exit_code"]) == ("hi\n", 0)
    # The context manager released the sandbox on the server.
    state = stack.alice.get(f"/v1/sandboxes/{out['sandbox_id']}").json()["state"]
    assert state == "released"
    # The one policy that needs the server's code says so rather than failing obscurely.
    assert "install the crucible distribution" in out["oracle"]
