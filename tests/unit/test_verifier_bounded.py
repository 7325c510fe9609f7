"""Bounded verifier work: a child process per call, killed at its wall-clock limit, refused
memory past its limit, a crash reported as such, the caller's exceptions re-raised."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

from service.verifiers.bounded import BoundExceeded, run_bounded


def double(x: int) -> tuple[int, int]:
    return 2 * x, os.getpid()


def sleep_forever() -> None:
    time.sleep(3600)


def allocate(n_bytes: int) -> int:
    return int(np.ones(n_bytes, dtype=np.uint8).sum())


def fail() -> None:
    raise KeyError("from the child")


def abort() -> None:
    os.abort()


def test_result_comes_back_from_another_process() -> None:
    value, pid = run_bounded(double, 21, timeout_s=30, memory_mb=2048)
    assert value == 42 and pid != os.getpid()


def test_wall_clock_limit_kills_the_work() -> None:
    t0 = time.monotonic()
    with pytest.raises(BoundExceeded) as e:
        run_bounded(sleep_forever, timeout_s=0.5, memory_mb=2048)
    assert e.value.cause == "timeout" and time.monotonic() - t0 < 5


def test_memory_limit_refuses_allocations() -> None:
    with pytest.raises(BoundExceeded) as e:
        run_bounded(allocate, 4 << 30, timeout_s=30, memory_mb=1024)
    assert e.value.cause == "memory"
    assert run_bounded(allocate, 1 << 20, timeout_s=30, memory_mb=1024) == 1 << 20


def test_exceptions_are_re_raised_and_crashes_reported() -> None:
    with pytest.raises(KeyError, match="from the child"):
        run_bounded(fail, timeout_s=30, memory_mb=1024)
    with pytest.raises(BoundExceeded) as e:
        run_bounded(abort, timeout_s=30, memory_mb=1024)
    assert e.value.cause == "crashed"


def test_the_worker_answers_when_descriptors_above_1024_are_in_use() -> None:
    """A full suite (or a control plane with many sandboxes) holds more than FD_SETSIZE
    descriptors; the worker's reply was waited on with select(), which refuses them."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 1200:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    try:
        assert run_bounded(double, 21, timeout_s=30, memory_mb=2048)[0] == 42
    finally:
        for fd in held:
            os.close(fd)
