"""A runtime proxy that tells the coordinator what this replica is in the middle of.

``create`` is tracked as ``sb:<sandbox id>`` and ``disk_usage_bytes`` / ``snapshot`` (the
measuring and the commit of a snapshot) as ``c:<container id>`` while they run; a container
this replica ``freeze``s (an episode's end state under verification) stays ``c:<id>`` until
it is thawed or destroyed. So another replica can tell a dead replica's half-done start,
snapshot or verification from a live one's (``service.recovery.DeadReplicaWork``).
Everything else is forwarded unchanged.
"""

from __future__ import annotations

import threading
from contextlib import AbstractContextManager
from typing import Any

from service.coordination.base import Coordinator


class TrackingRuntime:
    """Forwards to ``inner``; tracks starts and snapshots in ``coordinator``."""

    def __init__(self, inner: Any, coordinator: Coordinator) -> None:
        self._inner, self._coord = inner, coordinator
        self._frozen: dict[str, AbstractContextManager[None]] = {}
        self._lock = threading.Lock()

    def create(self, spec: Any) -> str:
        """``inner.create`` while ``sb:<spec.sandbox_id>`` is in flight."""
        with self._coord.track(f"sb:{spec.sandbox_id}"):
            return self._inner.create(spec)

    def disk_usage_bytes(self, container_id: str) -> int:
        """``inner.disk_usage_bytes`` while ``c:<container_id>`` is in flight."""
        with self._coord.track(f"c:{container_id}"):
            return self._inner.disk_usage_bytes(container_id)

    def snapshot(self, container_id: str, **kwargs: Any) -> str:
        """``inner.snapshot`` while ``c:<container_id>`` is in flight."""
        with self._coord.track(f"c:{container_id}"):
            return self._inner.snapshot(container_id, **kwargs)

    def freeze(self, container_id: str) -> None:
        """``inner.freeze``; ``c:<container_id>`` stays in flight until thaw or destroy."""
        held = self._coord.track(f"c:{container_id}")
        held.__enter__()
        try:
            self._inner.freeze(container_id)
        except BaseException:
            held.__exit__(None, None, None)
            raise
        with self._lock:
            old = self._frozen.pop(container_id, None)
            self._frozen[container_id] = held
        if old is not None:
            old.__exit__(None, None, None)

    def _unfreeze(self, container_id: str) -> None:
        with self._lock:
            held = self._frozen.pop(container_id, None)
        if held is not None:
            held.__exit__(None, None, None)

    def thaw(self, container_id: str) -> None:
        """``inner.thaw``; the container is no longer in flight."""
        try:
            self._inner.thaw(container_id)
        finally:
            self._unfreeze(container_id)

    def destroy(self, container_id: str) -> None:
        """``inner.destroy``; the container is no longer in flight."""
        try:
            self._inner.destroy(container_id)
        finally:
            self._unfreeze(container_id)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)
