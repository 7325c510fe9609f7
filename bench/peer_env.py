"""Plumbing shared by the peer benches: a peer's own venv, its client's JSON answer, and a
one-line account of what went wrong (a peer's failure is a result to print, never a crash)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any


def last_json_line(stdout: str) -> dict[str, Any]:
    """The last line of ``stdout`` that is a JSON object (peers log to stdout too).

    Raises ``ValueError`` naming the tail of the output when there is none."""
    for line in reversed(stdout.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                got = json.loads(line)
            except ValueError:
                continue
            if isinstance(got, dict):
                return got
    raise ValueError(f"no JSON object in the client's output: {stdout.strip()[-300:]!r}")


def error_text(e: BaseException, limit: int = 400) -> str:
    """``Type: detail`` on one line; for a failed subprocess, the last lines of its stderr."""
    detail = getattr(e, "stderr", None) or str(e)
    if isinstance(detail, bytes):
        detail = detail.decode(errors="replace")
    lines = [ln.strip() for ln in str(detail).strip().splitlines() if ln.strip()]
    return f"{type(e).__name__}: {' | '.join(lines[-3:])}"[:limit]


def ensure_venv(venv: Path, packages: list[str]) -> Path:
    """Create ``venv`` with this interpreter if missing and pip-install ``packages`` into it
    (quietly; a no-op when they are there). Returns its python. Raises
    ``subprocess.CalledProcessError`` with pip's stderr."""
    py = venv / "bin" / "python"
    if not py.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run(
        [str(py), "-m", "pip", "install", "-q", *packages],
        check=True,
        capture_output=True,
        text=True,
    )
    return py
