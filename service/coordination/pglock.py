"""Refill locks on PostgreSQL advisory locks: the fallback while Redis cannot be reached.

Session-level ``pg_try_advisory_lock`` on one dedicated connection: the server drops every
lock when that connection ends (the process died), so a dead replica holds nothing. On SQLite
(one server per database, ``service.serverlock``) every lock is granted.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import threading
from typing import Any

from sqlalchemy import create_engine, text
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.pool import NullPool

log = logging.getLogger("crucible.coordination")


def advisory_key(name: str) -> int:
    """A signed 64-bit advisory-lock key for ``name`` (sha256, first 8 bytes)."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big", signed=True)


class AdvisoryLocks:
    """Per-template refill locks of one deployment on one PostgreSQL connection.

    Args:
        url: the SQLAlchemy database URL. deployment: namespaces the lock keys.
    """

    def __init__(self, url: str, deployment: str) -> None:
        self.enabled = not url.startswith("sqlite")
        self.url, self.deployment = url, deployment
        self._engine: Any = create_engine(url, poolclass=NullPool) if self.enabled else None
        self._conn: Any = None
        self._held: set[str] = set()
        self._lock = threading.Lock()

    def _key(self, template: str) -> int:
        return advisory_key(f"{self.deployment}/refill/{template}")

    def hold(self, template: str) -> bool:
        """Take or keep ``template``'s lock; False when another session holds it or the
        database cannot be reached (then no lock is held: the connection is dropped)."""
        if not self.enabled:
            return True
        with self._lock:
            try:
                if self._conn is None:
                    self._conn = self._engine.connect()
                    self._held.clear()
                if template in self._held:
                    self._conn.execute(text("SELECT 1"))
                    return True
                got = self._conn.execute(
                    text("SELECT pg_try_advisory_lock(:k)"), {"k": self._key(template)}
                ).scalar()
                self._conn.commit()
                if got:
                    self._held.add(template)
                return bool(got)
            except SQLAlchemyError as e:
                log.warning("advisory refill lock of %s failed: %s", template, e)
                self._reset()
                return False

    def release(self, template: str) -> None:
        """Give up ``template``'s lock if held."""
        with self._lock:
            if template not in self._held or self._conn is None:
                return
            try:
                self._conn.execute(
                    text("SELECT pg_advisory_unlock(:k)"), {"k": self._key(template)}
                )
                self._conn.commit()
                self._held.discard(template)
            except SQLAlchemyError:
                self._reset()

    def held(self) -> set[str]:
        """Templates whose lock this process holds."""
        with self._lock:
            return set(self._held)

    def _reset(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(SQLAlchemyError):
                self._conn.close()
        self._conn = None
        self._held.clear()

    def close(self) -> None:
        """Drop the connection (and with it every lock)."""
        with self._lock:
            self._reset()
        if self._engine is not None:
            self._engine.dispose()
