"""The exec hot path's view of leased sandboxes, served from memory.

An exec needs four facts of its sandbox row (owner, state, lease expiry, container) and
they change only when the row is written. ``LeaseCache`` keeps them per sandbox and forgets
**every** entry whenever any sandbox row is written through a SQLAlchemy session on the
same database in this process, whoever writes it (release, expiry, snapshot, failure,
reclaim, verification, heartbeat):

- an ``UPDATE``/``DELETE`` statement on ``sandboxes`` (``do_orm_execute``) and a flush of a
  changed or deleted ``Sandbox`` object (``after_flush``) clear it at once, and the commit
  (or rollback) of that session clears it again;
- an entry is stored only when no clear happened since its read began (a generation
  count), so a read that raced a write never outlives it;
- entries live at most ``ttl_s`` (a backstop for writers this process cannot see: another
  process on the same database), and the lease's own expiry is checked at every use.

Other replicas write rows this process never sees, so on replicas (``CRUCIBLE_REPLICA``) the
cache is off and every exec reads the row (one primary-key SELECT).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import event
from sqlalchemy.orm import ORMExecuteState, Session

from service.db.models import Sandbox

_CACHES: dict[str, LeaseCache] = {}  # by database URL (every engine on it)
_TOUCHED = "crucible_sandbox_written"
MAX_ENTRIES = 100_000


@dataclass(frozen=True)
class LeaseView:
    """The sandbox columns an exec checks (a copy: changing it changes nothing stored)."""

    id: str
    tenant_id: str | None
    state: str
    expires_at: datetime | None
    container_id: str | None
    template: str


class LeaseCache:
    """Sandbox views of one process (module docstring).

    Args:
        enabled: False keeps nothing (every ``get`` misses). ttl_s: longest life of an entry.
    """

    def __init__(self, *, enabled: bool, ttl_s: float = 2.0) -> None:
        self.enabled, self._ttl_s = enabled, ttl_s
        self._entries: dict[str, tuple[LeaseView, float]] = {}
        self._lock = threading.Lock()
        self._generation = 0

    def install(self, url: str) -> None:
        """Clear on every sandbox write through a session on database ``url``."""
        _CACHES[url] = self

    @property
    def generation(self) -> int:
        """Bumped by every clear; pass the value read before the row to ``put``."""
        return self._generation

    def get(self, sandbox_id: str) -> LeaseView | None:
        """The cached view, or None (not cached, too old, or the cache is off)."""
        hit = self._entries.get(sandbox_id)
        if hit is None or hit[1] < time.monotonic():
            return None
        return hit[0]

    def put(self, view: LeaseView, generation: int) -> None:
        """Keep ``view`` unless a clear happened since ``generation`` was read."""
        if not self.enabled:
            return
        with self._lock:
            if generation != self._generation:
                return
            if len(self._entries) >= MAX_ENTRIES:
                self._entries.clear()
            self._entries[view.id] = (view, time.monotonic() + self._ttl_s)

    def clear(self) -> None:
        """Forget every entry."""
        with self._lock:
            self._generation += 1
            self._entries.clear()


def _cache_of(session: Session) -> LeaseCache | None:
    bind = session.bind
    url = getattr(bind, "url", None)
    return _CACHES.get(str(url)) if url is not None and _CACHES else None


def _written(session: Session) -> None:
    cache = _cache_of(session)
    if cache is not None:
        session.info[_TOUCHED] = True
        cache.clear()


@event.listens_for(Session, "do_orm_execute")
def _on_execute(state: ORMExecuteState) -> None:
    if (state.is_update or state.is_delete) and _targets_sandboxes(state.statement):
        _written(state.session)


def _targets_sandboxes(statement: Any) -> bool:
    table = getattr(statement, "table", None)
    return table is not None and getattr(table, "name", None) == Sandbox.__tablename__


@event.listens_for(Session, "after_flush")
def _on_flush(session: Session, _ctx: object) -> None:
    if any(isinstance(o, Sandbox) for o in (*session.dirty, *session.deleted)):
        _written(session)


@event.listens_for(Session, "after_commit")
@event.listens_for(Session, "after_rollback")
def _on_end(session: Session) -> None:
    if session.info.pop(_TOUCHED, False):
        cache = _cache_of(session)
        if cache is not None:
            cache.clear()
