"""Disk budgets of sandboxes on an engine that cannot cap a writable layer.

overlay2 caps a container's writable layer only on XFS with project quotas
(``--storage-opt size=``); on ext4, the common case and this project's machines, the engine
refuses. So Crucible holds a sandbox's ``disk_bytes`` with two mechanisms that work on any
overlay2 host where the control plane sees the engine's storage:

1. ``RLIMIT_FSIZE`` = the budget for every process of the container (the runtime sets it at
   create): no single file grows past the budget, whatever writes it (``write``,
   ``fallocate``, ``truncate`` + ``mmap``); the writer gets ``EFBIG`` / ``SIGXFSZ``.
2. ``DiskWatcher``: a thread that measures each sandbox's overlay upper directory (the
   writable layer, as ``service.runtime.overlay`` finds it) every ``interval_s`` and, when it
   is over the budget and still growing, stops the sandbox's writers (the runtime kills its
   processes other than init and the supervisor) and counts a hit, which the exec results of
   that time report (``disk_limit_hit``). The sandbox stays usable: an exec that removes
   files is not stopped, since the layer then shrinks.

Overshoot: what a writer adds between two measurements, that is the host's write rate times
``interval_s`` plus the time one measurement takes; about 1.5 GB/s x 50 ms here. A layer far
below its budget is measured less often (when it could have reached the budget at
``MAX_WRITE_BYTES_PER_S``, at most every ``MAX_WAIT_S``), so idle sandboxes cost little.
``tests/integration/test_limits.py`` measures it and pins the stated margin
(``OVERSHOOT_MARGIN_BYTES``). Usage counts allocated blocks (``st_blocks``; a sparse file
costs what it holds), at least one 4 KiB block per entry (so floods of empty files count),
hard links once.

Host reserve: when the filesystem under the layers has less than ``reserve_bytes`` free,
any watched sandbox whose layer grew since the last measurement is stopped too.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger("crucible.runtime.disk")

OVERSHOOT_MARGIN_BYTES = 256 << 20  # what a sandbox may write past its budget (stated)
MIN_ENTRY_BYTES = 4096
DEFAULT_INTERVAL_S = 0.05
DEFAULT_RESERVE_BYTES = 2 << 30
# The fastest a sandbox is assumed to write (measured here: about 1.5 GB/s): a layer far
# below its budget is looked at again only when it could have reached the budget.
MAX_WRITE_BYTES_PER_S = 2 << 30
MAX_WAIT_S = 2.0


def usage_bytes(upper: str) -> int:
    """Bytes the writable layer at ``upper`` holds on disk: allocated blocks, at least
    ``MIN_ENTRY_BYTES`` per entry, each inode once. Symlinks are never followed; entries
    that vanish meanwhile count 0. Raises ``OSError`` when ``upper`` itself is unreadable."""
    total = 0
    seen: set[int] = set()
    stack = [upper]
    first = True
    while stack:
        path = stack.pop()
        try:
            it = os.scandir(path)
        except OSError:
            if first:
                raise
            continue
        first = False
        with it:
            for entry in it:
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                if st.st_nlink > 1:
                    if st.st_ino in seen:
                        continue
                    seen.add(st.st_ino)
                total += max(st.st_blocks * 512, MIN_ENTRY_BYTES)
                if stat.S_ISDIR(st.st_mode):
                    stack.append(entry.path)
    return total


@dataclass
class _Watched:
    upper: str
    limit_bytes: int
    last_bytes: int = 0
    hits: int = 0
    due: float = 0.0


class DiskWatcher:
    """Measures watched writable layers and calls ``on_over(container_id)`` to stop a
    sandbox's writers (see the module docstring). Thread-safe; the thread starts with the
    first ``watch`` and is a daemon."""

    def __init__(
        self,
        *,
        on_over: Callable[[str], None],
        interval_s: float = DEFAULT_INTERVAL_S,
        reserve_bytes: int = DEFAULT_RESERVE_BYTES,
    ) -> None:
        self._on_over = on_over
        self._interval_s = interval_s
        self._reserve_bytes = reserve_bytes
        self._watched: dict[str, _Watched] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def watch(self, container_id: str, *, upper: str, limit_bytes: int) -> None:
        """Hold the layer at ``upper`` to ``limit_bytes`` (idempotent)."""
        with self._lock:
            if container_id not in self._watched:
                self._watched[container_id] = _Watched(upper=upper, limit_bytes=limit_bytes)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._loop, name="crucible-diskwatch", daemon=True
                )
                self._thread.start()

    def watching(self, container_id: str) -> bool:
        """True when the container's layer is watched."""
        with self._lock:
            return container_id in self._watched

    def forget(self, container_id: str) -> None:
        """Stop watching (the container is gone); missing is fine."""
        with self._lock:
            self._watched.pop(container_id, None)

    def hits(self, container_id: str) -> int:
        """How often the sandbox's writers were stopped so far (0 when not watched)."""
        with self._lock:
            w = self._watched.get(container_id)
            return w.hits if w is not None else 0

    def _loop(self) -> None:
        while True:
            with self._lock:
                items = list(self._watched.items())
            now = time.monotonic()
            low = self._host_low(items)
            for container_id, w in items:
                if w.due <= now:
                    self._check(container_id, w, host_low=low)
            time.sleep(self._interval_s)

    def _host_low(self, items: list[tuple[str, _Watched]]) -> bool:
        if not items:
            return False
        try:
            st = os.statvfs(items[0][1].upper)
        except OSError:
            return False
        return st.f_bavail * st.f_frsize < self._reserve_bytes

    def _check(self, container_id: str, w: _Watched, *, host_low: bool) -> None:
        t0 = time.monotonic()
        try:
            used = usage_bytes(w.upper)
        except OSError:
            self.forget(container_id)  # the layer is gone: so is the container
            return
        cost = time.monotonic() - t0
        headroom_s = max(0, w.limit_bytes - used) / MAX_WRITE_BYTES_PER_S
        # walks cost at most a quarter of the time; far from its budget, a layer waits
        w.due = time.monotonic() + max(3 * cost, min(MAX_WAIT_S, headroom_s)) - self._interval_s
        grew = used > w.last_bytes
        w.last_bytes = used
        if grew and (used > w.limit_bytes or host_low):
            with self._lock:
                w.hits += 1  # counted before the kill: an exec's result must see it
            log.warning(
                "sandbox container %s: writable layer %d bytes over its budget %d%s; "
                "stopping its writers",
                container_id,
                used,
                w.limit_bytes,
                " (host below its disk reserve)" if host_low else "",
            )
            try:
                self._on_over(container_id)
            except Exception:
                log.exception("stopping the writers of container %s failed", container_id)
            with contextlib.suppress(OSError):
                w.last_bytes = usage_bytes(w.upper)
