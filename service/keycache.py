"""Cached API-key lookups, invalidated on revoke across replicas.

``KeyCache.authenticate`` answers from memory when the key was read within
``key_cache_ttl_s`` (the secret's hash is still compared on every request), else reads the
row (``tenants.authenticate``). A revoke's ``key.revoke`` audit event is published on the
``events`` channel after it commits (``service.events``); every replica drops that key at
once, and a lookup that raced the revoke is not cached (a generation count). While this
replica is not listening (Redis unreachable, or the subscription being re-made) nothing is
served from the cache, and every (re)subscription empties it. Bound: a key revoked by a
control plane is refused everywhere within the pub/sub delivery time (milliseconds); one
revoked any other way (``crucible keys revoke``, SQL) within ``key_cache_ttl_s``.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager

from sqlalchemy.orm import Session

from service import tenants
from service.coordination.base import Coordinator
from service.errors import AuthError
from service.events import CHANNEL
from service.tenants import Principal

MAX_ENTRIES = 10_000


class KeyCache:
    """API-key lookups of one process.

    Args:
        coordinator: carries revocations between replicas. ttl_s: how long an entry is
        trusted (0: never cached). read: opens a read session on the database.
    """

    def __init__(
        self,
        coordinator: Coordinator,
        *,
        ttl_s: float,
        read: Callable[[], AbstractContextManager[Session]],
    ) -> None:
        self._coord, self._ttl_s, self._read = coordinator, ttl_s, read
        self._entries: dict[str, tuple[str, Principal, float]] = {}  # id -> (sha, who, until)
        self._lock = threading.Lock()
        self._generation = 0  # bumped by every invalidation
        if ttl_s > 0:
            coordinator.subscribe(CHANNEL, self._on_message, self.clear)

    def _on_message(self, message: str) -> None:
        if '"key.' not in message:  # most events are not about keys: skip the parse
            return
        try:
            event = json.loads(message)
            key_id = event["key_id"] if event["action"] == "key.revoke" else None
        except (ValueError, KeyError, TypeError):
            self.clear()  # an unreadable message: assume any key may have changed
            return
        if key_id is not None:
            self.drop(key_id)

    def drop(self, key_id: str) -> None:
        """Forget ``key_id`` (its next request reads the row)."""
        with self._lock:
            self._generation += 1
            self._entries.pop(key_id, None)

    def clear(self) -> None:
        """Forget every entry."""
        with self._lock:
            self._generation += 1
            self._entries.clear()

    def authenticate(self, raw_key: str | None) -> Principal:
        """The principal of ``raw_key`` (cached, see the module docstring).

        Raises:
            AuthError: missing, malformed, unknown or revoked key.
        """
        if self._ttl_s <= 0 or not raw_key or not self._coord.listening():
            return self._lookup(raw_key, cache=False)
        parts = raw_key.split("_", 2)
        if len(parts) != 3 or parts[0] != "cr":
            raise AuthError("malformed API key")
        with self._lock:
            hit = self._entries.get(parts[1])
        if hit is not None and hit[2] > time.monotonic():
            digest = hashlib.sha256(parts[2].encode()).hexdigest()
            if hmac.compare_digest(hit[0], digest):
                return hit[1]
        return self._lookup(raw_key, cache=True)

    def _lookup(self, raw_key: str | None, *, cache: bool) -> Principal:
        with self._lock:
            generation = self._generation
        with self._read() as s:
            who = tenants.authenticate(s, raw_key)
        if cache and raw_key is not None:
            # authenticate compared sha256(secret) with the stored hash: it is that hash
            sha = hashlib.sha256(raw_key.split("_", 2)[2].encode()).hexdigest()
            with self._lock:
                if generation == self._generation:  # no revoke arrived meanwhile
                    if len(self._entries) >= MAX_ENTRIES:
                        self._entries.clear()
                    self._entries[who.key_id] = (sha, who, time.monotonic() + self._ttl_s)
        return who
