"""Fair shares of the bounded verifier workers: one tenant's queue of slow work never holds
another tenant's verification up (a trial's slow mesh gates kept another tenant waiting
169 s behind one semaphore)."""

from __future__ import annotations

import threading
import time

import pytest

from service.verifiers import bounded, fairslots
from service.verifiers.fairslots import FairSlots


def hold(slots: FairSlots, tenant: str, order: list[str], release: threading.Event) -> None:
    with slots.slot(tenant):
        order.append(tenant)
        release.wait(10)


def start(slots: FairSlots, tenant: str, order: list[str], release: threading.Event):
    t = threading.Thread(target=hold, args=(slots, tenant, order, release), daemon=True)
    t.start()
    return t


def wait_for(cond, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_a_tenant_holds_at_most_its_share_and_another_gets_the_spare() -> None:
    slots, order, release = FairSlots(total=2, per_tenant=1), [], threading.Event()
    threads = [start(slots, "a", order, release) for _ in range(3)]
    wait_for(lambda: order == ["a"])
    threads.append(start(slots, "b", order, release))
    wait_for(lambda: order == ["a", "b"])  # b does not queue behind a's other two
    assert slots.held() == {"a": 1, "b": 1}
    release.set()
    for t in threads:
        t.join(5)
    assert order == ["a", "b", "a", "a"] and slots.held() == {}


def test_a_free_slot_goes_to_the_tenant_with_fewest_held() -> None:
    slots, order = FairSlots(total=2, per_tenant=2), []
    first, rest = threading.Event(), threading.Event()
    a1 = start(slots, "a", order, first)
    a2 = start(slots, "a", order, rest)
    wait_for(lambda: order == ["a", "a"])
    queued = [start(slots, "a", order, rest)]
    wait_for(lambda: len(slots._waiting) == 1)
    queued.append(start(slots, "c", order, rest))  # asks later, but holds none
    wait_for(lambda: len(slots._waiting) == 2)
    first.set()  # one of a's ends: c is next, not a's third
    wait_for(lambda: len(order) == 3)
    assert order[2] == "c"
    rest.set()
    for t in (a1, a2, *queued):
        t.join(5)
    assert order.count("a") == 3


def test_shares_must_fit() -> None:
    with pytest.raises(ValueError):
        FairSlots(total=1, per_tenant=2)


def nap(seconds: float) -> float:
    time.sleep(seconds)
    return time.monotonic()


def test_bounded_work_of_one_tenant_does_not_queue_another_behind_it() -> None:
    # More slow calls from tenant a than it may run at once, then one quick call from b:
    # b's answer comes back before a's first call ends (a plain semaphore queued it).
    done: dict[str, list[float]] = {"a": [], "b": []}

    def call(tenant: str, seconds: float) -> None:
        with fairslots.on_behalf_of(tenant):
            done[tenant].append(bounded.run_bounded(nap, seconds, timeout_s=30, memory_mb=512))

    slow = [
        threading.Thread(target=call, args=("a", 3.0)) for _ in range(bounded.MAX_CONCURRENT + 1)
    ]
    for t in slow:
        t.start()
    wait_for(lambda: bounded._slots.held().get("a") == bounded.MAX_CONCURRENT, timeout=10)
    quick = threading.Thread(target=call, args=("b", 0.0))
    quick.start()
    quick.join(20)
    for t in slow:
        t.join(30)
    assert done["b"] and done["b"][0] < min(done["a"])
