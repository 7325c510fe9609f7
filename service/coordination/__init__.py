"""Coordination between control-plane replicas, behind one seam (``base.Coordinator``).

``build(settings)`` picks Redis when ``CRUCIBLE_REDIS_URL`` is set, in-process otherwise.
"""

from __future__ import annotations

from service.config import Settings
from service.coordination.base import LABEL_REPLICA, Coordinator, DemandKey, new_replica_id
from service.coordination.inprocess import InProcessCoordinator

__all__ = [
    "LABEL_REPLICA",
    "Coordinator",
    "DemandKey",
    "InProcessCoordinator",
    "build",
    "new_replica_id",
]


def build(settings: Settings) -> Coordinator:
    """The coordinator for ``settings``: Redis when ``redis_url`` is set, else in-process."""
    if settings.redis_url:
        from service.coordination.redis import RedisCoordinator

        return RedisCoordinator(
            settings.redis_url, deployment=settings.deployment, db_url=settings.sqlalchemy_url
        )
    return InProcessCoordinator()
