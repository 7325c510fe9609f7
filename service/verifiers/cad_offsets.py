"""The grown and shrunk references the CAD verifier's depth measure needs
(``geometry.offset``), computed once per reference and level and kept.

A Minkowski sum costs seconds (about 2 ms per reference triangle each way: 7 s for
``pin-grid``'s 3,868 triangles), so it never runs per verification: the first verification
of a reference computes its offsets in a bounded worker (``service.verifiers.bounded``, not
in the control plane's process), later ones take them from memory, and a restarted control
plane from disk (``cache_dir()``). An entry is named by the SHA-256 of the reference's
vertices and faces, the level, the ball and ``ALGORITHM``: a changed reference or method
never reads a stale one. The cache holds only what the verifier computed from the task's
own reference; no agent reaches it.
"""

from __future__ import annotations

import hashlib
import io
import os
import threading
import zipfile
from pathlib import Path

import numpy as np
import trimesh

from service.verifiers import geometry
from service.verifiers.bounded import BoundExceeded, WorkerUnavailable, run_bounded

#: Bumped whenever ``geometry.offset`` would compute something else for the same input.
ALGORITHM = "2"
#: Wall clock and memory of the worker that computes one reference's offsets (a task's
#: reference, not the agent's part: past these the task is broken, never the agent).
OFFSET_TIMEOUT_S = 600.0
OFFSET_MEMORY_MB = 4096

_memory: dict[str, geometry.Offset] = {}
_locks: dict[str, threading.Lock] = {}
_guard = threading.Lock()


class OffsetsUnavailable(RuntimeError):
    """The reference's offsets could not be computed (a broken or oversized reference, or
    no worker process): the verification is an error, never the agent's 0."""


def cache_dir() -> Path:
    """Where offsets are kept: ``$CRUCIBLE_CACHE_DIR/cad-offsets``, else
    ``$XDG_CACHE_HOME/crucible/cad-offsets``, else ``~/.cache/crucible/cad-offsets``."""
    root = os.environ.get("CRUCIBLE_CACHE_DIR")
    if root:
        return Path(root) / "cad-offsets"
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "crucible" / "cad-offsets"


def _key(reference: trimesh.Trimesh, level: float) -> str:
    digest = hashlib.sha256()
    digest.update(np.ascontiguousarray(reference.vertices, dtype=np.float64).tobytes())
    digest.update(np.ascontiguousarray(reference.faces, dtype=np.int64).tobytes())
    digest.update(f"|{level!r}|{geometry.BALL_SEGMENTS}|{ALGORITHM}".encode())
    return digest.hexdigest()


def compute_offset(vertices: np.ndarray, faces: np.ndarray, level: float) -> geometry.Offset:
    """``geometry.offset`` of the reference given as arrays (runs in a bounded worker)."""
    return geometry.offset(trimesh.Trimesh(vertices=vertices, faces=faces, process=False), level)


def _read(path: Path, level: float) -> geometry.Offset | None:
    try:
        with np.load(path) as z:
            return geometry.Offset(
                level=level,
                grown=(z["grown_v"], z["grown_f"]),
                shrunk=(z["shrunk_v"], z["shrunk_f"]),
            )
    except (OSError, KeyError, ValueError, EOFError, zipfile.BadZipFile):
        return None  # absent, or torn by a crash mid-write before the rename: recompute


def _write(path: Path, at: geometry.Offset) -> None:
    buf = io.BytesIO()
    np.savez(
        buf, grown_v=at.grown[0], grown_f=at.grown[1], shrunk_v=at.shrunk[0], shrunk_f=at.shrunk[1]
    )
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}")
        tmp.write_bytes(buf.getvalue())
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only or full cache only costs the next control plane a recompute


def reference_offsets(
    reference: trimesh.Trimesh, levels: tuple[float, ...]
) -> list[geometry.Offset]:
    """The ``reference`` mesh grown and shrunk by each of ``levels`` (mesh units), from
    memory, disk or a bounded worker (module docstring). Thread-safe: concurrent
    verifications of one reference compute it once.

    Raises ``OffsetsUnavailable`` when the worker fails or runs past its bounds.
    """
    out = []
    for level in levels:
        key = _key(reference, level)
        with _guard:
            lock = _locks.setdefault(key, threading.Lock())
        with lock:
            at = _memory.get(key)
            if at is None:
                path = cache_dir() / f"{key}.npz"
                at = _read(path, level)
                if at is None:
                    at = _compute(reference, level)
                    _write(path, at)
                _memory[key] = at
        out.append(at)
    return out


def _compute(reference: trimesh.Trimesh, level: float) -> geometry.Offset:
    try:
        return run_bounded(
            compute_offset,
            np.asarray(reference.vertices, dtype=np.float64),
            np.asarray(reference.faces, dtype=np.int64),
            level,
            timeout_s=OFFSET_TIMEOUT_S,
            memory_mb=OFFSET_MEMORY_MB,
            what="growing and shrinking the reference",
        )
    except (BoundExceeded, WorkerUnavailable) as e:
        raise OffsetsUnavailable(f"the reference's offsets at {level} mm: {e}") from None
    except Exception as e:  # noqa: BLE001 (the task's reference, never the agent's part)
        raise OffsetsUnavailable(
            f"the reference's offsets at {level} mm failed: {type(e).__name__}: {e}"
        ) from None
