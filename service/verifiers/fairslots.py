"""Fair shares of the bounded verifier workers between tenants.

The workers are few (``bounded.MAX_CONCURRENT``: one less than the cores), and one tenant's
verifications could hold every one of them: a trial's slow mesh gates (each within its
limit) kept another tenant's verification waiting 169 s. So a tenant runs at most
``per_tenant`` at once, the pool holds one more than that (``total``), and a free slot goes
to the waiting tenant with the fewest running, the one that asked first among equals. A
tenant arriving while another holds every slot it may waits at most for one of that
tenant's calls to end, never for its queue. The tenant of the calling thread is set by the
code that verifies on its behalf (``on_behalf_of``; ``service.episodes``); work without one
(a benchmark, a test) shares the tenant ``""``.
"""

from __future__ import annotations

import contextlib
import contextvars
import itertools
import threading
from collections import Counter
from collections.abc import Iterator

_tenant: contextvars.ContextVar[str] = contextvars.ContextVar("crucible_bounded_tenant", default="")


@contextlib.contextmanager
def on_behalf_of(tenant_id: str) -> Iterator[None]:
    """Bounded work started in this context counts against ``tenant_id``'s share."""
    token = _tenant.set(tenant_id)
    try:
        yield
    finally:
        _tenant.reset(token)


def current_tenant() -> str:
    """The tenant bounded work started here counts against (``""`` when none is set)."""
    return _tenant.get()


class FairSlots:
    """``total`` slots, at most ``per_tenant`` of them held by one tenant at once, granted
    to the waiting tenant with the fewest held (first come among equals; module docstring).
    Thread-safe."""

    def __init__(self, *, total: int, per_tenant: int) -> None:
        if not 0 < per_tenant <= total:
            raise ValueError(f"need 0 < per_tenant <= total, not {per_tenant} and {total}")
        self.total, self.per_tenant = total, per_tenant
        self._cond = threading.Condition()
        self._held: Counter[str] = Counter()
        self._waiting: list[tuple[int, str]] = []  # (ticket, tenant), oldest first
        self._tickets = itertools.count()

    def held(self) -> dict[str, int]:
        """Slots held now, by tenant."""
        with self._cond:
            return dict(self._held)

    def _admissible(self) -> int | None:
        if sum(self._held.values()) >= self.total:
            return None
        best: tuple[tuple[int, int], int] | None = None
        for ticket, tenant in self._waiting:
            if self._held[tenant] >= self.per_tenant:
                continue
            key = (self._held[tenant], ticket)
            if best is None or key < best[0]:
                best = (key, ticket)
        return None if best is None else best[1]

    @contextlib.contextmanager
    def slot(self, tenant_id: str | None = None) -> Iterator[None]:
        """Hold one slot for ``tenant_id`` (default ``current_tenant()``), waiting for it."""
        tenant = current_tenant() if tenant_id is None else tenant_id
        with self._cond:
            entry = (next(self._tickets), tenant)
            self._waiting.append(entry)
            try:
                while self._admissible() != entry[0]:
                    self._cond.wait()
            finally:
                self._waiting.remove(entry)
                self._cond.notify_all()  # the next in line may be another
            self._held[tenant] += 1
        try:
            yield
        finally:
            with self._cond:
                self._held[tenant] -= 1
                if self._held[tenant] <= 0:
                    del self._held[tenant]  # no entry per tenant that ever verified
                self._cond.notify_all()
