"""One control plane per deployment: a lock taken before start-up touches anything.

A second ``crucible serve`` on the same database would reconcile (adopt, destroy, fail)
the live server's sandboxes and, exiting on the busy port, drain its warm pool. So the
lifespan takes this lock first and refuses to start without it:

- SQLite: an exclusive ``flock`` on ``<database file>.serve.lock`` next to the database
  file's real path (symlinks resolved), and, once the file exists, one on a lock named by
  its device and inode in the temporary directory (a hard link elsewhere is the same
  database: a crash trial's second server got past the path lock through a symlink), each
  held by an open file for the process's life; the kernel drops them when the process
  dies, ``kill -9`` included.
- PostgreSQL: a session-level advisory lock (``pg_try_advisory_lock``) on a key derived
  from the deployment name, held by one dedicated connection; the server drops it when
  that connection ends.

``CRUCIBLE_REPLICA=1`` (``Settings.replica``) skips the lock for replicas (multi-replica
coordination is the stack's concern, not this module's).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import tempfile
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, text
from sqlalchemy.pool import NullPool

from service.errors import CrucibleError


class AlreadyServing(CrucibleError):
    """Another control plane holds this deployment's lock."""


def _key(deployment: str) -> int:
    """A signed 64-bit advisory-lock key from the deployment name (sha256, first 8 bytes)."""
    return int.from_bytes(hashlib.sha256(deployment.encode()).digest()[:8], "big", signed=True)


class ServerLock:
    """The deployment's serve lock; ``acquire`` takes it or raises ``AlreadyServing``.

    Args:
        url: the SQLAlchemy database URL. deployment: the deployment name (PostgreSQL key).
    """

    def __init__(self, url: str, deployment: str) -> None:
        self.url, self.deployment = url, deployment
        self._fds: list[int] = []
        self._conn: Any = None
        self._engine: Any = None

    @property
    def path(self) -> Path | None:
        """The lock file of an SQLite database (None for PostgreSQL or in-memory)."""
        if not self.url.startswith("sqlite"):
            return None
        db_path = self.url.split("///", 1)[1] if "///" in self.url else ""
        if not db_path or db_path == ":memory:":
            return None
        return Path(os.path.realpath(db_path) + ".serve.lock")

    def _paths(self) -> list[Path]:
        """Every lock file this database needs (``path``, and its inode's once it exists)."""
        path = self.path
        if path is None:
            return []
        out = [path]
        db = Path(str(path)[: -len(".serve.lock")])
        try:
            st = db.stat()
        except FileNotFoundError:
            return out
        out.append(Path(tempfile.gettempdir()) / f"crucible-serve-{st.st_dev}-{st.st_ino}.lock")
        return out

    def acquire(self) -> None:
        """Take the lock without waiting.

        Raises:
            AlreadyServing: another process holds it (its pid is named for SQLite).
        """
        if self.url.startswith("sqlite"):
            self._acquire_file()
        else:
            self._acquire_advisory()

    def _acquire_file(self) -> None:
        try:
            for path in self._paths():
                self._fds.append(self._lock_one(path))
        except AlreadyServing:
            self.release()
            raise

    def _lock_one(self, path: Path) -> int:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise AlreadyServing(
                f"another crucible serve (pid {holder}) holds {path}; one server per "
                "database (set CRUCIBLE_REPLICA=1 for a replica)"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        return fd

    def _acquire_advisory(self) -> None:
        self._engine = create_engine(self.url, poolclass=NullPool)
        conn = self._engine.connect()
        got = conn.execute(
            text("SELECT pg_try_advisory_lock(:k)"), {"k": _key(self.deployment)}
        ).scalar()
        conn.commit()
        if not got:
            conn.close()
            self._engine.dispose()
            raise AlreadyServing(
                f"another crucible serve holds the lock of deployment {self.deployment} on "
                "this database; one server per database (set CRUCIBLE_REPLICA=1 for a replica)"
            )
        self._conn = conn

    def release(self) -> None:
        """Drop the lock (idempotent)."""
        while self._fds:
            fd = self._fds.pop()
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
        if self._conn is not None:
            self._conn.close()
            self._engine.dispose()
            self._conn = None
