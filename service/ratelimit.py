"""Per-tenant request rate limits: a token bucket per tenant behind the coordination seam.

A tenant's limit is ``Settings.rate_limits[tenant]`` when named there (None exempts it),
else ``Settings.rate_limit``; with neither, ``check`` returns at once (no bucket is touched).
The bucket lives in Redis when configured (one Lua script: every replica draws from it),
in memory otherwise (``service.coordination.bucket``). Over the limit is a 429
(``RateLimited``, a ``QuotaExceeded``) with ``Retry-After`` in whole seconds.
"""

from __future__ import annotations

import math

from service.config import RateLimit, Settings
from service.coordination.base import Coordinator
from service.errors import QuotaExceeded


class RateLimited(QuotaExceeded):
    """The tenant sent requests faster than its rate limit allows (429, ``Retry-After``)."""

    title = "Rate limit exceeded"


class RateLimiter:
    """Checks one request of a tenant against its limit.

    Args:
        settings: where the limits are configured. coordinator: holds the buckets.
    """

    def __init__(self, settings: Settings, coordinator: Coordinator) -> None:
        self._default = settings.rate_limit
        self._per_tenant = dict(settings.rate_limits)
        self._coord = coordinator
        self.enabled = self._default is not None or any(self._per_tenant.values())

    def limit_of(self, tenant_id: str) -> RateLimit | None:
        """The limit that applies to ``tenant_id`` (None: unlimited)."""
        if tenant_id in self._per_tenant:
            return self._per_tenant[tenant_id]
        return self._default

    def check(self, tenant_id: str) -> None:
        """Count one request of ``tenant_id``. O(1): one dict lookup when unlimited, one
        bucket take (one Redis round trip, or a lock in memory) otherwise.

        Raises:
            RateLimited: no token is left; ``retry_after_s`` says when one will be.
        """
        if not self.enabled:
            return
        limit = self.limit_of(tenant_id)
        if limit is None:
            return
        wait_s = self._coord.take(f"tenant:{tenant_id}", rate_per_s=limit.rps, burst=limit.burst)
        if wait_s > 0:
            raise RateLimited(
                f"tenant {tenant_id} is over its rate limit of {limit.rps:g} requests/s "
                f"(burst {limit.burst}); retry in {wait_s:.3f} s",
                field="rate_limit",
                retry_after_s=max(1, math.ceil(wait_s)),
            )
