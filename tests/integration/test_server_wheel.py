"""The server's wheel carries every file the control plane reads at run time: an installed
``crucible serve`` once failed to start because the verifier's in-sandbox Python
(``runtime/supervisor/py/``) was not package data (found bringing up the compose stack)."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_tracked_data_file_is_in_the_wheel(tmp_path: Path) -> None:
    tracked = subprocess.run(
        ["git", "ls-files", "service", "migrations"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    data = {p for p in tracked if not p.endswith(".py") and not Path(p).name.startswith(".")}
    data |= {p for p in tracked if p.startswith("service/runtime/supervisor/py/")}
    # Alembic's env and versions are modules of no package: an installed ``crucible db
    # upgrade`` needs every one of them (issue 14: migrations/ still shipped in the wheel)
    data |= {p for p in tracked if p.startswith("migrations/")}
    assert "migrations/env.py" in data and "migrations/versions/0001_initial_schema.py" in data
    assert "service/runtime/supervisor/py/crucible-verifier.pth" in data
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = tmp_path.glob("crucible-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = sorted(p for p in data if p not in names)
    assert not missing, f"not in the wheel: {missing}"
