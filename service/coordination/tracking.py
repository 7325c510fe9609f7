"""A runtime proxy that tells the coordinator what this replica is in the middle of.

``create`` is tracked as ``sb:<sandbox id>`` and ``disk_usage_bytes`` / ``snapshot`` (the
measuring and the commit of a snapshot) as ``c:<container id>`` while they run, so another
replica can tell a dead replica's half-done start or snapshot from a live one's
(``service.recovery.DeadReplicaWork``). Everything else is forwarded unchanged.
"""

from __future__ import annotations

from typing import Any

from service.coordination.base import Coordinator


class TrackingRuntime:
    """Forwards to ``inner``; tracks starts and snapshots in ``coordinator``."""

    def __init__(self, inner: Any, coordinator: Coordinator) -> None:
        self._inner, self._coord = inner, coordinator

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

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)
