"""A token bucket in memory: the in-process rate limiter (and Redis's fallback).

The bucket holds at most ``burst`` tokens and gains ``rate_per_s`` per second; a request
takes one. The same arithmetic runs in Redis as a Lua script (``redis._TAKE``).
"""

from __future__ import annotations

import threading
import time


class TokenBuckets:
    """Named token buckets of one process (thread-safe; O(1) per take)."""

    def __init__(self) -> None:
        self._state: dict[str, tuple[float, float]] = {}  # name -> (tokens, monotonic s)
        self._lock = threading.Lock()

    def take(
        self, bucket: str, *, rate_per_s: float, burst: int, now: float | None = None
    ) -> float:
        """Take one token; 0.0 when taken, else the seconds until one is there."""
        t = time.monotonic() if now is None else now
        with self._lock:
            tokens, last = self._state.get(bucket, (float(burst), t))
            tokens = min(float(burst), tokens + max(0.0, t - last) * rate_per_s)
            if tokens >= 1.0:
                self._state[bucket] = (tokens - 1.0, t)
                return 0.0
            self._state[bucket] = (tokens, t)
            return (1.0 - tokens) / rate_per_s
